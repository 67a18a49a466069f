#include "data/conversations.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>

#include "data/json_records.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/log.h"
#include "engine/core/stop.h"

namespace llmt {

using ojson = nlohmann::ordered_json;

const char* record_format_name(RecordFormat f) {
  switch (f) {
    case RecordFormat::alpaca: return "Alpaca (instruction/output)";
    case RecordFormat::messages: return "conversational (messages)";
    case RecordFormat::sharegpt: return "ShareGPT (conversations)";
    case RecordFormat::prompt_completion: return "prompt-completion";
  }
  return "?";
}

static std::string keys_of(const ojson& j) {
  if (!j.is_object()) return std::string("a JSON ") + j.type_name();
  std::string k;
  for (auto it = j.begin(); it != j.end(); ++it) k += (k.empty() ? "" : ", ") + ("\"" + it.key() + "\"");
  return k.empty() ? "no keys" : "keys " + k;
}

// the records of a .json (one array) or .jsonl file (data/json_records.h), each given to fn with where it is
static void for_each_record(const std::string& text, const std::string& what,
                            const std::function<void(ojson&, const std::string&)>& fn) {
  auto message = [&](const JsonRecordError& e) -> std::string {
    switch (e.kind) {
      case JsonRecordError::invalid_utf8:
        return strformat("%s: invalid UTF-8 at line %lld, column %lld: the file must be UTF-8 JSON", what.c_str(),
                         (long long)e.line, (long long)e.column);
      case JsonRecordError::empty_file: return strformat("%s: the file is empty: no records", what.c_str());
      case JsonRecordError::bad_json:
      case JsonRecordError::out_of_range:
        return e.array ? strformat("%s: not valid JSON (a file starting with '[' is read as one array of records)",
                                   what.c_str())
                       : strformat("%s: line %lld is not valid JSON (JSON Lines: an object a line, or one array of "
                                   "objects)", what.c_str(), (long long)e.line);
      case JsonRecordError::no_records:
        return strformat("%s: no records%s", what.c_str(), e.array ? " (an empty JSON array)" : "");
    }
    return what;
  };
  for_each_json_record<ojson>(text, what, message, [&](ojson& j, const JsonRecordPlace& at) { fn(j, at.where()); });
}

static RecordFormat format_of(const ojson& j, const DataArgs& a, const std::string& what, const std::string& where) {
  LLMT_CHECK(j.is_object(), "%s: %s is a JSON %s, expected an object (a record)", what.c_str(), where.c_str(),
             j.type_name());
  if (j.contains("messages")) return RecordFormat::messages;
  if (j.contains("conversations")) return RecordFormat::sharegpt;
  if (j.contains("prompt") && j.contains("completion")) return RecordFormat::prompt_completion;
  if (j.contains(a.instruction_field)) return RecordFormat::alpaca;
  fail("%s: %s has %s: expected \"messages\" (TRL's conversational records), \"conversations\" (ShareGPT), "
       "\"prompt\" and \"completion\", or Alpaca's \"%s\" and \"%s\"",
       what.c_str(), where.c_str(), keys_of(j).c_str(), a.instruction_field.c_str(), a.output_field.c_str());
}

RecordFormat detect_record_format(const std::string& path, const DataArgs& args) {
  const std::string text = read_data_file(path, "--data_path");
  bool have = false;
  RecordFormat f = RecordFormat::alpaca;
  std::string first_where;
  for_each_record(text, path, [&](ojson& j, const std::string& where) {
    const RecordFormat g = format_of(j, args, path, where);
    if (!have) have = true, f = g, first_where = where;
    else
      LLMT_CHECK(g == f, "%s: %s is %s (%s) but %s is %s: one file holds one format", path.c_str(), where.c_str(),
                 record_format_name(g), keys_of(j).c_str(), first_where.c_str(), record_format_name(f));
  });
  return f;
}

// a message list checked: objects with a string role and a content (string, or anything the template
// takes: a list of parts, null with tool_calls)
static void check_messages(const ojson& m, const std::string& what, const std::string& where, const char* field) {
  LLMT_CHECK(m.is_array() && !m.empty(), "%s: %s: \"%s\" is %s, expected a non-empty list of messages", what.c_str(),
             where.c_str(), field, m.is_array() ? "empty" : (std::string("a JSON ") + m.type_name()).c_str());
  for (size_t i = 0; i < m.size(); i++) {
    LLMT_CHECK(m[i].is_object() && m[i].contains("role") && m[i]["role"].is_string() && m[i].contains("content"),
               "%s: %s: message %zu of \"%s\" has %s, expected \"role\" (a string) and \"content\"", what.c_str(),
               where.c_str(), i, field, keys_of(m[i]).c_str());
  }
}

std::vector<ChatRecord> read_chat_records(const std::string& path, RecordFormat format) {
  const std::string text = read_data_file(path, "--data_path");
  std::vector<ChatRecord> out;
  for_each_record(text, path, [&](ojson& j, const std::string& where) {
    ChatRecord r;
    r.where = where;
    LLMT_CHECK(j.is_object(), "%s: %s is a JSON %s, expected an object", path.c_str(), where.c_str(), j.type_name());
    if (j.contains("tools") && !j["tools"].is_null()) {
      r.tools = j["tools"];
      if (r.tools.is_string()) {  // TRL: tools given as a JSON string
        r.tools = ojson::parse(r.tools.get<std::string>(), nullptr, false);
        LLMT_CHECK(!r.tools.is_discarded(), "%s: %s: \"tools\" is a string that is not JSON", path.c_str(), where.c_str());
      }
    }
    if (format == RecordFormat::prompt_completion) {
      ojson& p = j["prompt"];
      ojson& c = j["completion"];
      if (p.is_string() && c.is_string()) {
        r.conversational = false;
        r.prompt_text = p.get<std::string>();
        r.completion_text = c.get<std::string>();
      } else {
        check_messages(p, path, where, "prompt");
        check_messages(c, path, where, "completion");
        r.messages = std::move(p);
        r.completion = std::move(c);
      }
      LLMT_CHECK(!j.contains("messages") && !j.contains("conversations"),
                 "%s: %s has %s: a prompt-completion file holds no \"messages\"", path.c_str(), where.c_str(),
                 keys_of(j).c_str());
    } else if (format == RecordFormat::messages) {
      LLMT_CHECK(j.contains("messages"), "%s: %s has %s, no \"messages\" (the file's first record has them)",
                 path.c_str(), where.c_str(), keys_of(j).c_str());
      check_messages(j["messages"], path, where, "messages");
      r.messages = std::move(j["messages"]);
    } else {
      LLMT_CHECK(j.contains("conversations"), "%s: %s has %s, no \"conversations\" (the file's first record has them)",
                 path.c_str(), where.c_str(), keys_of(j).c_str());
      const ojson& conv = j["conversations"];
      LLMT_CHECK(conv.is_array() && !conv.empty(), "%s: %s: \"conversations\" must be a non-empty list", path.c_str(),
                 where.c_str());
      r.messages = ojson::array();
      for (size_t i = 0; i < conv.size(); i++) {
        const ojson& t = conv[i];
        LLMT_CHECK(t.is_object() && t.contains("from") && t["from"].is_string() && t.contains("value") &&
                       t["value"].is_string(),
                   "%s: %s: turn %zu has %s, expected ShareGPT's \"from\" and \"value\" (strings)", path.c_str(),
                   where.c_str(), i, keys_of(t).c_str());
        const std::string from = t["from"].get<std::string>();
        std::string role;
        if (from == "human" || from == "user") role = "user";
        else if (from == "gpt" || from == "assistant" || from == "model" || from == "chatgpt") role = "assistant";
        else if (from == "system") role = "system";
        else if (from == "tool" || from == "function_response" || from == "observation") role = "tool";
        else
          fail("%s: %s: turn %zu is from \"%s\"; ShareGPT's speakers are human/user, gpt/assistant/model, system, "
               "tool/observation", path.c_str(), where.c_str(), i, from.c_str());
        r.messages.push_back({{"role", role}, {"content", t["value"]}});
      }
    }
    // a record-level system prompt (TRL's conversational records may carry one) before the messages
    if (format != RecordFormat::prompt_completion && j.contains("system") && j["system"].is_string() &&
        !(r.messages[0]["role"] == "system"))
      r.messages.insert(r.messages.begin(), ojson{{"role", "system"}, {"content", j["system"]}});
    out.push_back(std::move(r));
  });
  return out;
}

static bool is_file(const std::string& p) {
  struct stat s;
  return ::stat(p.c_str(), &s) == 0 && S_ISREG(s.st_mode);
}

// chat_template from a parsed tokenizer_config.json-like object: a string, or a list of named ones
static std::string template_of_config(const ojson& cfg, const std::string& path) {
  auto it = cfg.find("chat_template");
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& t : *it)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
    fail("%s: chat_template is a list without a \"default\" template", path.c_str());
  }
  fail("%s: chat_template is a JSON %s, expected a string", path.c_str(), it->type_name());
}

std::string find_chat_template(const std::string& flag_value, const std::string& tokenizer_path, std::string* origin) {
  if (!flag_value.empty()) {
    const std::string text = read_data_file(flag_value, "--chat_template");
    const size_t first = text.find_first_not_of(" \t\r\n");
    const bool json_file = flag_value.size() > 5 && flag_value.compare(flag_value.size() - 5, 5, ".json") == 0;
    if (json_file || (first != std::string::npos && text[first] == '{' && text.compare(first, 2, "{{") != 0 &&
                      text.compare(first, 2, "{%") != 0 && text.compare(first, 2, "{#") != 0)) {
      check_json_depth(text, flag_value);
      ojson cfg = ojson::parse(text, nullptr, false);
      LLMT_CHECK(!cfg.is_discarded() && cfg.is_object(), "--chat_template %s: not a JSON object (give a Jinja file, or "
                 "a tokenizer_config.json with a \"chat_template\")", flag_value.c_str());
      std::string t = template_of_config(cfg, flag_value);
      LLMT_CHECK(!t.empty(), "--chat_template %s: the JSON file has no \"chat_template\"", flag_value.c_str());
      *origin = flag_value + " (its chat_template)";
      return t;
    }
    *origin = flag_value;
    return text;
  }
  std::string dir = tokenizer_path;
  if (is_file(dir)) dir = dir.find('/') == std::string::npos ? "." : dir.substr(0, dir.find_last_of('/'));
  if (!dir.empty()) {
    if (is_file(dir + "/chat_template.jinja")) {  // transformers >= 4.43 saves it beside the config
      *origin = dir + "/chat_template.jinja";
      return read_data_file(*origin, "chat template");
    }
    const std::string cfg_path = dir + "/tokenizer_config.json";
    if (is_file(cfg_path)) {
      std::string t = template_of_config(read_json(cfg_path, "tokenizer config"), cfg_path);
      if (!t.empty()) {
        *origin = cfg_path;
        return t;
      }
    }
  }
  fail("chat data needs a chat template, and the tokenizer%s has none (no chat_template.jinja, no \"chat_template\" "
       "in tokenizer_config.json): pass --chat_template FILE (a Jinja file, or an instruct model's "
       "tokenizer_config.json)", dir.empty() ? "" : (" at " + dir).c_str());
}

ojson special_token_vars(const Tokenizer& tok, const std::string& tokenizer_path) {
  ojson v = ojson::object();
  std::string dir = tokenizer_path;
  if (is_file(dir)) dir = dir.find('/') == std::string::npos ? "." : dir.substr(0, dir.find_last_of('/'));
  const std::string cfg_path = dir + "/tokenizer_config.json";
  if (!dir.empty() && is_file(cfg_path)) {
    ojson cfg = read_json(cfg_path, "tokenizer config");
    for (const char* name : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      auto it = cfg.find(name);
      if (it == cfg.end()) continue;
      if (it->is_string()) v[name] = *it;
      else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) v[name] = (*it)["content"];
    }
    return v;
  }
  if (tok.bos_id() >= 0) v["bos_token"] = tok.decode({tok.bos_id()});
  if (tok.eos_id() >= 0) v["eos_token"] = tok.decode({tok.eos_id()});
  return v;
}

std::vector<std::pair<size_t, size_t>> token_offsets(const Tokenizer& tok, const std::string& text,
                                                     const std::vector<int32_t>& ids) {
  std::vector<std::pair<size_t, size_t>> off;
  off.reserve(ids.size());
  size_t p = 0;
  for (int32_t id : ids) {
    const std::string t = tok.token_bytes(id);
    if (text.compare(p, t.size(), t) == 0) {
      off.emplace_back(p, p + t.size());
      p += t.size();
    } else if (!t.empty() && t[0] == ' ' && text.compare(p, t.size() - 1, t, 1, std::string::npos) == 0) {
      off.emplace_back(p, p + t.size() - 1);  // the word-start space SentencePiece adds
      p += t.size() - 1;
    } else {
      fail("cannot line the %s tokenizer's ids up with the rendered chat at byte %zu (token %d): the assistant "
           "mask needs each token's place in the text", tok.kind().c_str(), p, (int)id);
    }
  }
  return off;
}

std::vector<char> span_mask(const std::vector<std::pair<size_t, size_t>>& offsets,
                            const std::vector<std::pair<size_t, size_t>>& spans) {
  std::vector<char> mask(offsets.size(), 0);
  size_t s = 0;
  for (size_t t = 0; t < offsets.size(); t++) {  // transformers' loop over the tokens' offsets
    while (s < spans.size() && offsets[t].first >= spans[s].second) s++;
    if (s == spans.size()) break;
    if (offsets[t].second > spans[s].first) mask[t] = 1;
  }
  return mask;
}

const char* assistant_turns_method(const ChatTemplate& tmpl) {
  return tmpl.has_generation_blocks() ? "{% generation %} blocks" : "rendering each turn's prefix";
}

// a few bytes of s from `at`, quoted as JSON, for a message
static std::string quote_at(const std::string& s, size_t at) {
  const size_t from = at > 16 ? at - 16 : 0;
  return ojson(s.substr(from, 48)).dump(-1, ' ', false, ojson::error_handler_t::replace) +
         (from > 0 ? strformat(" (from byte %zu)", from) : "");
}

std::vector<std::pair<size_t, size_t>> assistant_spans_by_prefix(const ChatTemplate& tmpl, const ojson& vars,
                                                                 const std::string& full) {
  static const char* fixes =
      "--assistant_only_loss True finds the assistant turns of a template without {% generation %} blocks by "
      "rendering each turn's prefix, which needs a template that renders every earlier turn the same whatever "
      "follows; pass --chat_template FILE with a template that marks the assistant's turns with {% generation %} ... "
      "{% endgeneration %} (TRL ships such training variants: trl/chat_templates/*_training.jinja), or "
      "--assistant_only_loss False to train on every token";
  const ojson& msgs = vars.at("messages");
  std::vector<std::pair<size_t, size_t>> spans;
  ojson v = vars, prefix = ojson::array();
  for (size_t i = 0; i < msgs.size(); i++) {
    if (!(msgs[i].is_object() && msgs[i].value("role", "") == "assistant")) {
      prefix.push_back(msgs[i]);
      continue;
    }
    std::string p, q;
    v["messages"] = prefix;
    v["add_generation_prompt"] = true;
    try {
      p = tmpl.render(v).text;
    } catch (const Error& e) {
      fail("assistant message %zu: the template fails on the %zu message%s before it (rendered with "
           "add_generation_prompt=True): %s. %s", i, i, i == 1 ? "" : "s", e.what(), fixes);
    }
    prefix.push_back(msgs[i]);
    v["messages"] = prefix;
    v["add_generation_prompt"] = false;
    try {
      q = tmpl.render(v).text;
    } catch (const Error& e) {
      fail("assistant message %zu: the template fails on the messages up to it: %s. %s", i, e.what(), fixes);
    }
    size_t d = 0;
    while (d < p.size() && d < q.size() && p[d] == q[d]) d++;
    LLMT_CHECK(d == p.size(),
               "assistant message %zu: the messages up to it render as %s at byte %zu, not as the messages before it "
               "with add_generation_prompt=True do (%s), so the turn's text cannot be told from the prompt. %s",
               i, quote_at(q, d).c_str(), d, quote_at(p, d).c_str(), fixes);
    d = 0;
    while (d < q.size() && d < full.size() && q[d] == full[d]) d++;
    LLMT_CHECK(d == q.size(),
               "assistant message %zu: the whole conversation renders as %s at byte %zu, not as the messages up to "
               "it do (%s): the template renders an earlier turn differently once later ones follow (it may drop "
               "earlier turns' reasoning). %s",
               i, quote_at(full, d).c_str(), d, quote_at(q, d).c_str(), fixes);
    if (q.size() > p.size()) spans.emplace_back(p.size(), q.size());
  }
  return spans;
}

TokenDataset tokenize_chat(const std::vector<ChatRecord>& recs, const ChatTemplate& tmpl, const Tokenizer& tok,
                           const ChatTokenizeOptions& opt, CacheStats* st, const std::string& what) {
  const int64_t n = (int64_t)recs.size();
  LLMT_CHECK(opt.model_max_length >= 1, "model_max_length %d must be >= 1", opt.model_max_length);
  std::vector<std::vector<int32_t>> ids((size_t)n), labels((size_t)n);
  std::vector<char> cut((size_t)n, 0);  // cut at model_max_length
  const bool parallel = tokenizer_thread_safe(tok);
  const bool generation = tmpl.has_generation_blocks();
  std::string eos_text = opt.specials.value("eos_token", std::string());
  if (eos_text.empty() && tok.eos_id() >= 0) eos_text = tok.decode({tok.eos_id()});
  std::string err;
#pragma omp parallel for schedule(dynamic, 8) if (parallel)
  for (int64_t i = 0; i < n; i++) {
    if (stop_now()) continue;
    const ChatRecord& r = recs[(size_t)i];
    try {
      std::vector<int32_t>& x = ids[(size_t)i];
      std::vector<int32_t>& y = labels[(size_t)i];
      auto vars = [&](const ojson& messages, bool gen) {
        ojson v = opt.specials;
        v["messages"] = messages;
        v["tools"] = r.tools;
        v["documents"] = nullptr;
        v["add_generation_prompt"] = gen;
        return v;
      };
      std::vector<char> mask;
      if (!r.conversational) {  // TRL: prompt + completion + EOS text, tokenized with the default specials
        std::string full = r.prompt_text + r.completion_text;
        if (eos_text.empty() || full.size() < eos_text.size() ||
            full.compare(full.size() - eos_text.size(), eos_text.size(), eos_text) != 0)
          full += eos_text;
        x = tok.encode_with_specials(full);
        std::vector<int32_t> p = tok.encode_with_specials(r.prompt_text);
        size_t k = 0;
        while (k < p.size() && k < x.size() && p[k] == x[k]) k++;
        mask.assign(x.size(), 1);
        if (opt.completion_only_loss) std::fill(mask.begin(), mask.begin() + (long)k, 0);
      } else if (!r.completion.is_null()) {  // conversational prompt-completion
        ojson all = r.messages;
        for (const auto& m : r.completion) all.push_back(m);
        ChatRender full = tmpl.render(vars(all, false));
        x = tok.encode(full.text);
        std::vector<int32_t> p = tok.encode(tmpl.render(vars(r.messages, true)).text);
        size_t k = 0;
        while (k < p.size() && k < x.size() && p[k] == x[k]) k++;
        mask.assign(x.size(), 1);
        if (opt.completion_only_loss) std::fill(mask.begin(), mask.begin() + (long)k, 0);
      } else {
        ChatRender full = tmpl.render(vars(r.messages, false));
        x = tok.encode(full.text);
        if (opt.assistant_only_loss) {
          const auto spans = generation ? full.generation
                                        : assistant_spans_by_prefix(tmpl, vars(r.messages, false), full.text);
          mask = span_mask(token_offsets(tok, full.text, x), spans);
          LLMT_CHECK(std::count(mask.begin(), mask.end(), 1) > 0, "no assistant tokens: the record has no assistant "
                     "message (--assistant_only_loss True trains on them alone)");
        } else {
          mask.assign(x.size(), 1);
        }
      }
      cut[(size_t)i] = (int64_t)x.size() > opt.model_max_length;
      if (cut[(size_t)i]) x.resize((size_t)opt.model_max_length);
      y.resize(x.size());
      for (size_t t = 0; t < x.size(); t++) y[t] = mask[t] ? x[t] : kIgnoreIndex;
    } catch (const std::exception& e) {
#pragma omp critical(llmt_chat_err)
      if (err.empty()) err = strformat("%s: %s: %s", what.c_str(), r.where.c_str(), e.what());
    }
  }
  LLMT_CHECK(err.empty(), "%s", err.c_str());
  throw_if_stopped("rendering chat records");
  std::vector<int64_t> offsets(1, 0);
  std::vector<int32_t> all_ids, all_labels;
  int64_t truncated = 0, dropped = 0, first_truncated = -1, first_dropped = -1;
  for (int64_t i = 0; i < n; i++) {
    const auto& x = ids[(size_t)i];
    const auto& y = labels[(size_t)i];
    if (cut[(size_t)i] && truncated++ == 0) first_truncated = i;
    if (std::all_of(y.begin(), y.end(), [](int32_t v) { return v == kIgnoreIndex; })) {
      if (dropped++ == 0) first_dropped = i;
      continue;
    }
    all_ids.insert(all_ids.end(), x.begin(), x.end());
    all_labels.insert(all_labels.end(), y.begin(), y.end());
    offsets.push_back((int64_t)all_ids.size());
  }
  if (st) {
    st->v[0] = truncated;
    st->v[1] = dropped;
    st->v[2] = first_truncated;
    st->v[3] = first_dropped;
  }
  return TokenDataset(std::move(offsets), std::move(all_ids), std::move(all_labels));
}

TokenDataset load_chat_dataset(const DataArgs& args, RecordFormat format, const Tokenizer& tok, int rank,
                               std::string* key) {
  const std::string& path = args.data_path;
  std::string origin;
  ChatTemplate tmpl(find_chat_template(args.chat_template, args.tokenizer_path, &origin), origin);
  const bool conv = format == RecordFormat::messages || format == RecordFormat::sharegpt;
  ChatTokenizeOptions opt;
  opt.model_max_length = args.model_max_length;
  opt.assistant_only_loss = conv && args.assistant_only_loss;
  opt.completion_only_loss = args.completion_only_loss;
  opt.specials = special_token_vars(tok, args.tokenizer_path);
  KeyHasher h;
  h.add("llmt-chat-v1").add(record_format_name(format)).add(tmpl.source()).add(opt.specials.dump());
  h.add_int(opt.assistant_only_loss).add_int(opt.completion_only_loss).add_int(args.model_max_length);
  if (tmpl.uses_strftime_now()) {  // the rendering depends on the day
    char day[16];
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    std::strftime(day, sizeof day, "%Y-%m-%d", &tm);
    h.add(day);
  }
  h.add_file(path);
  add_tokenizer_to_key(h, tok, args.tokenizer_path);
  if (key) *key = h.hex();
  log_info("data   chat %s: %s records, the chat template of %s; loss on %s", path.c_str(), record_format_name(format),
           origin.c_str(),
           format == RecordFormat::prompt_completion
               ? (opt.completion_only_loss ? "the completions" : "every token")
               : (opt.assistant_only_loss
                      ? (std::string("the assistant turns, found by ") + assistant_turns_method(tmpl)).c_str()
                      : "every token"));
  const std::string dir = resolve_cache_dir(args.cache_dir), name = cache_entry_name("chat-", path);
  overwrite_cache_entry(args.overwrite_cache, rank, dir, name, h.hex(), path);  // it was ignored for chat data
  CacheStats st;
  CacheUse use = CacheUse::off;
  auto t0 = std::chrono::steady_clock::now();
  TokenDataset ds = cached_dataset(
      dir, name, h.hex(),
      [&](CacheStats* s) {
        std::vector<ChatRecord> recs = read_chat_records(path, format);
        TokenizeThreads threads(args.preprocessing_num_workers);
        log_info("data   rendering and tokenizing %zu records of %s (%s)", recs.size(), path.c_str(),
                 threads.describe(tokenizer_thread_safe(tok)).c_str());
        return tokenize_chat(recs, tmpl, tok, opt, s, path);
      },
      &st, &use, rank, 60.0, tok.vocab_size());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t loss_tokens = 0;
  for (int64_t i = 0; i < ds.total_tokens(); i++) loss_tokens += ds.labels_data()[i] != kIgnoreIndex;
  log_info("data   chat %s: %lld examples, %lld tokens (%lld with loss: %s), longest %lld; %s (%.1f s)", path.c_str(),
           (long long)ds.size(), (long long)ds.total_tokens(), (long long)loss_tokens,
           format == RecordFormat::prompt_completion
               ? (opt.completion_only_loss ? "completions" : "every token")
               : (opt.assistant_only_loss ? "assistant turns" : "every token"),
           (long long)ds.max_length(), describe_cache_use(use, token_cache_path(dir, name, h.hex())).c_str(), secs);
  if (rank == 0 && st.v[0] > 0)
    log_warn("%s: %lld records were cut at model_max_length %d (the first: record %lld)", path.c_str(),
             (long long)st.v[0], args.model_max_length, (long long)st.v[2]);
  if (rank == 0 && st.v[1] > 0)
    log_warn("%s: %lld records keep no token with loss within model_max_length %d and were dropped (the first: "
             "record %lld)", path.c_str(), (long long)st.v[1], args.model_max_length, (long long)st.v[3]);
  LLMT_CHECK(ds.size() > 0, "%s: no record keeps a token with loss within --model_max_length %d", path.c_str(),
             args.model_max_length);
  return ds;
}

}  // namespace llmt
