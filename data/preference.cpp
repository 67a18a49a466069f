#include "data/preference.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <memory>

#include "data/conversations.h"
#include "data/json_records.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/stop.h"

namespace llmt {

using ojson = nlohmann::ordered_json;

static std::string keys_of(const ojson& j) {
  std::string k;
  for (auto it = j.begin(); it != j.end(); ++it) k += (k.empty() ? "" : ", ") + ("\"" + it.key() + "\"");
  return k.empty() ? "no keys" : "keys " + k;
}

static const char* kind_of(const ojson& v) {
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return v.type_name();
}

// Python's == on two JSON values: objects equal whatever the order of their keys
static bool same_value(const ojson& a, const ojson& b) { return nlohmann::json(a) == nlohmann::json(b); }

static void check_messages(const ojson& m, const char* field) {
  LLMT_CHECK(!m.empty(), "\"%s\" is an empty list: expected messages", field);
  for (size_t i = 0; i < m.size(); i++)
    LLMT_CHECK(m[i].is_object() && m[i].contains("role") && m[i]["role"].is_string() && m[i].contains("content"),
               "message %zu of \"%s\" has %s, expected \"role\" (a string) and \"content\"", i, field,
               m[i].is_object() ? keys_of(m[i]).c_str() : (std::string("a JSON ") + m[i].type_name()).c_str());
}

// a completion is the model's answer: it starts with an assistant message (else the prompts of chosen and
// rejected differ, and TRL would train on the user's words)
static void check_completion_role(const ojson& m, const char* field) {
  const std::string role = m[0]["role"].get<std::string>();
  LLMT_CHECK(role == "assistant", "\"%s\" starts with a \"%s\" message, expected \"assistant\": the completion is "
             "the answer to the prompt", field, role.c_str());
}

void extract_implicit_prompt(PreferenceRecord& r) {
  if (!r.conversational) {
    const std::string &c = r.chosen_text, &j = r.rejected_text;
    const size_t n = std::min(c.size(), j.size());
    size_t i = 0;
    while (i < n && c[i] == j[i]) i++;
    LLMT_CHECK(!(i == c.size() && i == j.size()), "chosen and rejected are the same text: a pair must differ");
    // TRL's extract_prompt never finds the difference here and moves the prompt's last character into both
    // completions; the pair is refused instead
    LLMT_CHECK(i < n, "%s is the beginning of %s: the implicit prompt needs them to differ after it (give "
               "\"prompt\")", c.size() < j.size() ? "chosen" : "rejected", c.size() < j.size() ? "rejected" : "chosen");
    while (i > 0 && (static_cast<unsigned char>(c[i]) & 0xC0) == 0x80) i--;  // to the first character that differs
    LLMT_CHECK(i > 0, "chosen and rejected differ from their first character: they share no prompt (give "
               "\"prompt\", or include it in both)");
    if (c[i - 1] == ' ') i--;  // TRL: the space before the difference belongs to the completions
    r.prompt_text = c.substr(0, i);
    r.chosen_text = c.substr(i);
    r.rejected_text = j.substr(i);
    return;
  }
  const ojson &c = r.chosen, &j = r.rejected;
  const size_t n = std::min(c.size(), j.size());
  size_t i = 0;
  while (i < n && same_value(c[i], j[i])) i++;
  LLMT_CHECK(!(i == c.size() && i == j.size()), "chosen and rejected are the same messages: a pair must differ");
  LLMT_CHECK(i < n, "%s is the beginning of %s: the implicit prompt needs them to differ after it (give "
             "\"prompt\")", c.size() < j.size() ? "chosen" : "rejected", c.size() < j.size() ? "rejected" : "chosen");
  LLMT_CHECK(i > 0, "chosen and rejected differ from their first message: they share no prompt");
  r.prompt = ojson(c.begin(), c.begin() + (long)i);
  r.chosen = ojson(c.begin() + (long)i, c.end());
  r.rejected = ojson(j.begin() + (long)i, j.end());
}

std::vector<PreferenceRecord> read_preference_records(const std::string& path) {
  const std::string text = read_data_file(path, "--data_path");
  auto message = [&](const JsonRecordError& e) -> std::string {
    switch (e.kind) {
      case JsonRecordError::invalid_utf8:
        return strformat("%s: invalid UTF-8 at line %lld, column %lld: the file must be UTF-8 JSON", path.c_str(),
                         (long long)e.line, (long long)e.column);
      case JsonRecordError::empty_file: return strformat("%s: the file is empty: no records", path.c_str());
      case JsonRecordError::bad_json:
      case JsonRecordError::out_of_range:
        return e.array ? strformat("%s: not valid JSON (a file starting with '[' is read as one array of records)",
                                   path.c_str())
                       : strformat("%s: line %lld is not valid JSON (JSON Lines: an object a line, or one array of "
                                   "objects)", path.c_str(), (long long)e.line);
      case JsonRecordError::no_records:
        return strformat("%s: no records%s", path.c_str(), e.array ? " (an empty JSON array)" : "");
    }
    return path;
  };
  std::vector<PreferenceRecord> out;
  std::string first_where;
  bool first_conv = false, first_implicit = false;
  for_each_json_record<ojson>(text, path, message, [&](ojson& j, const JsonRecordPlace& at) {
    PreferenceRecord r;
    r.where = at.where();
    try {
      LLMT_CHECK(j.is_object(), "a JSON %s, expected an object (a record)", j.type_name());
      LLMT_CHECK(j.contains("chosen") && j.contains("rejected"), "%s: expected \"prompt\", \"chosen\" and "
                 "\"rejected\" (TRL's preference records), or \"chosen\" and \"rejected\" (the implicit prompt)",
                 keys_of(j).c_str());
      r.implicit_prompt = !j.contains("prompt");
      std::vector<const char*> fields = {"chosen", "rejected"};
      if (!r.implicit_prompt) fields.insert(fields.begin(), "prompt");
      for (const char* f : fields)
        LLMT_CHECK(j[f].is_string() || j[f].is_array(), "\"%s\" is %s, expected a string or a list of messages", f,
                   j[f].is_null() ? "null" : (std::string("a JSON ") + j[f].type_name()).c_str());
      r.conversational = j["chosen"].is_array();
      for (const char* f : fields)
        LLMT_CHECK(j[f].is_array() == r.conversational, "\"%s\" is %s but \"chosen\" is %s: a record's fields are "
                   "all strings or all lists of messages", f, kind_of(j[f]), kind_of(j["chosen"]));
      if (out.empty()) {
        first_where = r.where, first_conv = r.conversational, first_implicit = r.implicit_prompt;
      } else {
        LLMT_CHECK(r.conversational == first_conv, "%s, but %s %s: one file holds one kind",
                   r.conversational ? "lists of messages" : "strings", first_where.c_str(),
                   first_conv ? "holds lists of messages" : "holds strings");
        LLMT_CHECK(r.implicit_prompt == first_implicit, "%s, but %s %s: one file holds one form",
                   r.implicit_prompt ? "no \"prompt\" (the implicit form)" : "a \"prompt\"", first_where.c_str(),
                   first_implicit ? "has none (the implicit form)" : "has one");
      }
      if (j.contains("tools") && !j["tools"].is_null()) {
        r.tools = j["tools"];
        if (r.tools.is_string()) {  // TRL: tools given as a JSON string
          r.tools = ojson::parse(r.tools.get<std::string>(), nullptr, false);
          LLMT_CHECK(!r.tools.is_discarded(), "\"tools\" is a string that is not JSON");
        }
      }
      if (j.contains("chat_template_kwargs") && !j["chat_template_kwargs"].is_null()) {
        LLMT_CHECK(j["chat_template_kwargs"].is_object(), "\"chat_template_kwargs\" is a JSON %s, expected an object",
                   j["chat_template_kwargs"].type_name());
        r.template_kwargs = std::move(j["chat_template_kwargs"]);
      }
      if (r.conversational) {
        for (const char* f : fields) check_messages(j[f], f);
        if (!r.implicit_prompt) r.prompt = std::move(j["prompt"]);
        r.chosen = std::move(j["chosen"]);
        r.rejected = std::move(j["rejected"]);
      } else {
        if (!r.implicit_prompt) r.prompt_text = j["prompt"].get<std::string>();
        r.chosen_text = j["chosen"].get<std::string>();
        r.rejected_text = j["rejected"].get<std::string>();
      }
      if (r.implicit_prompt) extract_implicit_prompt(r);
      if (r.conversational) {
        check_completion_role(r.chosen, "chosen");
        check_completion_role(r.rejected, "rejected");
      }
    } catch (const Error& e) {
      fail("%s: %s: %s", path.c_str(), r.where.c_str(), e.what());
    }
    out.push_back(std::move(r));
  });
  return out;
}

static size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t k = 0;
  while (k < a.size() && k < b.size() && a[k] == b[k]) k++;
  return k;
}

PreferenceIds tokenize_preference(const PreferenceRecord& r, const ChatTemplate* tmpl, const Tokenizer& tok,
                                  const ojson& specials) {
  std::vector<int32_t> p, pc, pr;
  if (!r.conversational) {
    std::string eos = specials.value("eos_token", std::string());
    if (eos.empty() && tok.eos_id() >= 0) eos = tok.decode({tok.eos_id()});
    LLMT_CHECK(!eos.empty(), "the tokenizer has no EOS token, which TRL appends to string completions");
    auto with_eos = [&](const std::string& s) {
      const bool ends = s.size() >= eos.size() && s.compare(s.size() - eos.size(), eos.size(), eos) == 0;
      return ends ? s : s + eos;
    };
    p = tok.encode_with_specials(r.prompt_text);
    pc = tok.encode_with_specials(r.prompt_text + with_eos(r.chosen_text));
    pr = tok.encode_with_specials(r.prompt_text + with_eos(r.rejected_text));
  } else {
    LLMT_CHECK(tmpl != nullptr, "conversational records need a chat template");
    auto render = [&](const ojson& completion, bool gen) {
      ojson v = specials;
      ojson messages = r.prompt;
      for (const auto& m : completion) messages.push_back(m);
      v["messages"] = std::move(messages);
      v["tools"] = r.tools;
      v["documents"] = nullptr;
      v["add_generation_prompt"] = gen;
      if (r.template_kwargs.is_object())
        for (auto it = r.template_kwargs.begin(); it != r.template_kwargs.end(); ++it) v[it.key()] = it.value();
      return tmpl->render(v).text;
    };
    p = tok.encode(render(ojson::array(), true));
    pc = tok.encode(render(r.chosen, false));
    pr = tok.encode(render(r.rejected, false));
  }
  const size_t k = std::min(common_prefix(p, pc), common_prefix(p, pr));
  PreferenceIds out;
  out.prompt.assign(p.begin(), p.begin() + (long)k);
  out.chosen.assign(pc.begin() + (long)k, pc.end());
  out.rejected.assign(pr.begin() + (long)k, pr.end());
  return out;
}

TruncationMode parse_truncation_mode(const std::string& s) {
  if (s == "keep_start") return TruncationMode::keep_start;
  if (s == "keep_end") return TruncationMode::keep_end;
  fail("--truncation_mode %s: expected keep_start or keep_end", s.c_str());
}

const char* truncation_mode_name(TruncationMode m) {
  return m == TruncationMode::keep_start ? "keep_start" : "keep_end";
}

PreferenceSequence preference_sequence(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                                       int max_length, TruncationMode mode) {
  PreferenceSequence s;
  s.ids = prompt;
  s.ids.insert(s.ids.end(), completion.begin(), completion.end());
  s.prompt_len = prompt.size();
  if (max_length > 0 && s.ids.size() > (size_t)max_length) {
    const size_t cut = s.ids.size() - (size_t)max_length;
    if (mode == TruncationMode::keep_start) {
      s.ids.resize((size_t)max_length);
      s.prompt_len = std::min(s.prompt_len, (size_t)max_length);
    } else {
      s.ids.erase(s.ids.begin(), s.ids.begin() + (long)cut);
      s.prompt_len = s.prompt_len > cut ? s.prompt_len - cut : 0;
    }
  }
  return s;
}

TokenDataset tokenize_preferences(const std::vector<PreferenceRecord>& recs, const ChatTemplate* tmpl,
                                  const Tokenizer& tok, const ojson& specials, const PreferenceOptions& opt,
                                  CacheStats* st, const std::string& what, std::vector<int64_t>* pairs) {
  const int64_t n = (int64_t)recs.size();
  std::vector<PreferenceIds> ids((size_t)n);
  std::string err;
#pragma omp parallel for schedule(dynamic, 8) if (tokenizer_thread_safe(tok))
  for (int64_t i = 0; i < n; i++) {
    if (stop_now()) continue;
    try {
      ids[(size_t)i] = tokenize_preference(recs[(size_t)i], tmpl, tok, specials);
    } catch (const std::exception& e) {
#pragma omp critical(llmt_preference_err)
      if (err.empty()) err = strformat("%s: %s: %s", what.c_str(), recs[(size_t)i].where.c_str(), e.what());
    }
  }
  LLMT_CHECK(err.empty(), "%s", err.c_str());
  throw_if_stopped("tokenizing preference records");
  std::vector<int64_t> offsets(1, 0);
  std::vector<int32_t> all_ids, all_labels;
  int64_t cut = 0, dropped = 0, first_cut = -1, first_dropped = -1;
  if (pairs) pairs->clear();
  for (int64_t i = 0; i < n; i++) {
    const PreferenceIds& x = ids[(size_t)i];
    // TRL drops a pair whose prompt alone fills max_length under keep_start: no completion token would remain
    if (opt.max_length > 0 && opt.truncation_mode == TruncationMode::keep_start &&
        x.prompt.size() >= (size_t)opt.max_length) {
      if (dropped++ == 0) first_dropped = i;
      continue;
    }
    bool was_cut = false;
    for (const auto* completion : {&x.chosen, &x.rejected}) {
      const PreferenceSequence s = preference_sequence(x.prompt, *completion, opt.max_length, opt.truncation_mode);
      was_cut |= s.ids.size() < x.prompt.size() + completion->size();
      all_ids.insert(all_ids.end(), s.ids.begin(), s.ids.end());
      for (size_t t = 0; t < s.ids.size(); t++) all_labels.push_back(t < s.prompt_len ? kIgnoreIndex : s.ids[t]);
      offsets.push_back((int64_t)all_ids.size());
    }
    if (was_cut && cut++ == 0) first_cut = i;
    if (pairs) pairs->push_back(i);
  }
  if (st) {
    st->v[0] = cut;
    st->v[1] = dropped;
    st->v[2] = first_cut;
    st->v[3] = first_dropped;
  }
  return TokenDataset(std::move(offsets), std::move(all_ids), std::move(all_labels));
}

TokenDataset load_preference_dataset(const DataArgs& args, const PreferenceOptions& opt, const Tokenizer& tok,
                                     int rank, std::string* key) {
  const std::string& path = args.data_path;
  std::vector<PreferenceRecord> recs = read_preference_records(path);
  const bool conv = recs.front().conversational;
  std::unique_ptr<ChatTemplate> tmpl;
  std::string origin;
  if (conv)
    tmpl = std::make_unique<ChatTemplate>(find_chat_template(opt.chat_template, args.tokenizer_path, &origin),
                                          origin);
  const ojson specials = special_token_vars(tok, args.tokenizer_path);
  KeyHasher h;
  h.add("llmt-preference-v1").add_int(conv).add_int(recs.front().implicit_prompt).add(specials.dump());
  h.add_int(opt.max_length).add(truncation_mode_name(opt.truncation_mode));
  if (tmpl) {
    h.add(tmpl->source());
    if (tmpl->uses_strftime_now()) {  // the rendering depends on the day
      char day[16];
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      std::strftime(day, sizeof day, "%Y-%m-%d", &tm);
      h.add(day);
    }
  }
  h.add_file(path);
  add_tokenizer_to_key(h, tok, args.tokenizer_path);
  if (key) *key = h.hex();
  log_info("data   preference pairs %s: %zu records, %s%s%s; max_length %d (%s)", path.c_str(), recs.size(),
           conv ? "lists of messages through the chat template of " : "strings",
           conv ? origin.c_str() : "",
           recs.front().implicit_prompt ? ", the prompt extracted (implicit form)" : "", opt.max_length,
           truncation_mode_name(opt.truncation_mode));
  const std::string dir = resolve_cache_dir(args.cache_dir), name = cache_entry_name("preference-", path);
  overwrite_cache_entry(args.overwrite_cache, rank, dir, name, h.hex(), path);
  CacheStats st;
  CacheUse use = CacheUse::off;
  auto t0 = std::chrono::steady_clock::now();
  TokenDataset ds = cached_dataset(
      dir, name, h.hex(),
      [&](CacheStats* s) {
        TokenizeThreads threads(args.preprocessing_num_workers);
        return tokenize_preferences(recs, tmpl.get(), tok, specials, opt, s, path);
      },
      &st, &use, rank, 60.0, tok.vocab_size());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("data   preference pairs %s: %lld pairs, %lld tokens, longest %lld; %s (%.1f s)", path.c_str(),
           (long long)ds.size() / 2, (long long)ds.total_tokens(), (long long)ds.max_length(),
           describe_cache_use(use, token_cache_path(dir, name, h.hex())).c_str(), secs);
  if (rank == 0 && st.v[0] > 0)
    log_warn("%s: %lld pair%s cut at max_length %d (%s; the first: %s)", path.c_str(), (long long)st.v[0],
             st.v[0] == 1 ? " was" : "s were", opt.max_length, truncation_mode_name(opt.truncation_mode),
             recs[(size_t)st.v[2]].where.c_str());
  if (rank == 0 && st.v[1] > 0)
    log_warn("%s: %lld pair%s dropped: the prompt alone has max_length %d tokens or more, so keep_start leaves "
             "no completion token (TRL drops them too; the first: %s)", path.c_str(), (long long)st.v[1],
             st.v[1] == 1 ? " was" : "s were", opt.max_length, recs[(size_t)st.v[3]].where.c_str());
  LLMT_CHECK(ds.size() > 0, "%s: no pair keeps a completion token within max_length %d", path.c_str(),
             opt.max_length);
  return ds;
}

}  // namespace llmt
