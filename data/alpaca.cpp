#include "data/alpaca.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "data/json_records.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/stop.h"

namespace llmt {

using json = nlohmann::json;

// tatsu-lab/stanford_alpaca train.py, PROMPT_DICT, byte for byte.
const char* const kAlpacaPromptInput =
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:";
const char* const kAlpacaPromptNoInput =
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:";

// Literal substitution of "{name}" marks (what str.format_map does with these templates: the values
// themselves are never re-read as templates).
static std::string fill(const char* tmpl, const AlpacaRecord& r) {
  std::string out;
  for (const char* p = tmpl; *p;) {
    if (std::strncmp(p, "{instruction}", 13) == 0) out += r.instruction, p += 13;
    else if (std::strncmp(p, "{input}", 7) == 0) out += r.input, p += 7;
    else out += *p++;
  }
  return out;
}

std::string alpaca_prompt(const AlpacaRecord& r) {
  return fill(r.input.empty() ? kAlpacaPromptNoInput : kAlpacaPromptInput, r);
}

// alpaca_prompt(r).size(), without making it
static size_t alpaca_prompt_size(const AlpacaRecord& r) {
  if (r.input.empty()) return std::strlen(kAlpacaPromptNoInput) - std::strlen("{instruction}") + r.instruction.size();
  return std::strlen(kAlpacaPromptInput) - std::strlen("{instruction}") - std::strlen("{input}") + r.instruction.size() +
         r.input.size();
}

// A short, one-line view of a record for error messages.
static std::string snippet(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 100) s = s.substr(0, 97) + "...";
  return s;
}

// `where` is "record 12" or "line 40 (record 39)". Once every field checked out, the strings are
// moved out of j: a 50 MB field is not held twice.
static AlpacaRecord to_record(json& j, const DataArgs& f, const std::string& what, const std::string& where) {
  LLMT_CHECK(j.is_object(), "%s: %s is a JSON %s, expected an object with \"%s\" and \"%s\" fields: %s", what.c_str(),
             where.c_str(), j.type_name(), f.instruction_field.c_str(), f.output_field.c_str(), snippet(j).c_str());
  // The field's string, or nullptr when absent; null counts as absent only where allowed.
  auto field = [&](const std::string& name, bool null_ok) -> std::string* {
    auto it = j.find(name);
    if (it == j.end() || (null_ok && it->is_null())) return nullptr;
    LLMT_CHECK(it->is_string(), "%s: %s: field \"%s\" is a JSON %s, expected a string: %s", what.c_str(),
               where.c_str(), name.c_str(), it->type_name(), snippet(j).c_str());
    return &it->get_ref<std::string&>();
  };
  std::string* instruction = field(f.instruction_field, false);
  LLMT_CHECK(instruction, "%s: %s has no \"%s\" field: %s", what.c_str(), where.c_str(), f.instruction_field.c_str(),
             snippet(j).c_str());
  std::string* input = field(f.input_field, true);
  if (!input && f.input_field == "input") input = field("context", true);  // Dolly
  std::string* output = field(f.output_field, false);
  if (!output && f.output_field == "output") output = field("response", false);  // GPTeacher, Dolly
  LLMT_CHECK(output, "%s: %s has no \"%s\" field%s: %s", what.c_str(), where.c_str(), f.output_field.c_str(),
             f.output_field == "output" ? " (nor \"response\")" : "", snippet(j).c_str());
  // moved out, each once: field flags naming the same key (--alpaca_input_field instruction) share
  // a string, which is then copied, not moved twice
  AlpacaRecord r;
  r.instruction = instruction == input || instruction == output ? *instruction : std::move(*instruction);
  if (input) r.input = input == output ? *input : std::move(*input);
  r.output = std::move(*output);
  return r;
}

std::vector<AlpacaRecord> parse_alpaca(const std::string& text, const std::string& what, const DataArgs& fields) {
  auto message = [&](const JsonRecordError& e) -> std::string {
    switch (e.kind) {
      case JsonRecordError::invalid_utf8:
        return strformat("%s: invalid UTF-8 at line %lld, column %lld (byte 0x%02x): Alpaca data must be UTF-8 JSON",
                         what.c_str(), (long long)e.line, (long long)e.column, e.byte);
      case JsonRecordError::empty_file: return strformat("%s: the file is empty: no Alpaca records", what.c_str());
      case JsonRecordError::bad_json:
        return strformat("%s: malformed JSON at line %lld, column %lld: %s", what.c_str(), (long long)e.line,
                         (long long)e.column, e.parser.c_str());
      case JsonRecordError::out_of_range:
        return e.array ? strformat("%s: a number out of range: %s", what.c_str(), e.parser.c_str())
                       : strformat("%s: line %lld: a number out of range: %s", what.c_str(), (long long)e.line,
                                   e.parser.c_str());
      case JsonRecordError::no_records:
        return strformat("%s: no Alpaca records (an empty %s)", what.c_str(), e.array ? "JSON array" : "JSON Lines file");
    }
    return what;
  };
  std::vector<AlpacaRecord> out;
  for_each_json_record<json>(text, what, message, [&](json& j, const JsonRecordPlace& at) {
    out.push_back(to_record(j, fields, what,
                            at.line > 0 ? strformat("line %lld (record %zu)", (long long)at.line, at.index)
                                        : at.where()));
  });
  return out;
}

std::vector<AlpacaRecord> read_alpaca(const std::string& path, const DataArgs& fields) {
  return parse_alpaca(read_data_file(path, "--data_path"), path, fields);
}

TokenDataset tokenize_alpaca(const std::vector<AlpacaRecord>& recs, const Tokenizer& tok, int model_max_length,
                             CacheStats* st) {
  LLMT_CHECK(model_max_length >= 1, "model_max_length %d must be >= 1", model_max_length);
  const int eos = tok.eos_id();
  LLMT_CHECK(eos >= 0, "Alpaca targets end in EOS, but the %s tokenizer has none", tok.kind().c_str());
  const int64_t n = (int64_t)recs.size();
  std::vector<std::vector<int32_t>> prompt((size_t)n), target((size_t)n);
  const bool parallel = tokenizer_thread_safe(tok);
  std::string err;
#pragma omp parallel for schedule(dynamic, 8) if (parallel)
  for (int64_t i = 0; i < n; i++) {
    if (stop_now()) continue;  // a signal: tokenize no more records
    try {
      // Only the first model_max_length ids are kept, so only they are computed (encode_prefix:
      // exactly encode()'s first ids): one 50 MB instruction peaked at 2.2 GB, tokenized whole.
      // The prompt's ids up to model_max_length tell whether it fills it (dropped); the target needs
      // the rest, and one more id says whether the EOS still fits.
      const size_t M = (size_t)model_max_length;
      std::vector<int32_t>& p = prompt[(size_t)i];
      if (tok.adds_bos()) p.push_back(tok.bos_id());
      // A prompt whose length alone makes it fill model_max_length (min_ids_for_bytes) is dropped
      // below whatever its ids: it is neither made nor tokenized (a 50 MB instruction without spaces
      // is one pre-tokenizer piece, merged whole: 1.3 GB). Its ids are never read.
      if (p.size() + tok.min_ids_for_bytes(alpaca_prompt_size(recs[(size_t)i])) >= M) {
        p.assign(M, -1);
        target[(size_t)i] = {eos};
        continue;
      }
      std::vector<int32_t> body = tok.encode_prefix(alpaca_prompt(recs[(size_t)i]), M - std::min(M, p.size()));
      p.insert(p.end(), body.begin(), body.end());
      // t = the first M - |p| ids of the output, then EOS: when the output fills them the EOS is one
      // past the cut, which is what marks the record as truncated below, as with the whole target.
      std::vector<int32_t>& t = target[(size_t)i];
      if (p.size() < M) t = tok.encode_prefix(recs[(size_t)i].output, M - p.size());
      t.push_back(eos);
    } catch (const std::exception& e) {
#pragma omp critical(llmt_alpaca_err)
      if (err.empty()) err = strformat("record %lld: %s", (long long)i, e.what());
    }
  }
  LLMT_CHECK(err.empty(), "tokenizing Alpaca %s", err.c_str());
  throw_if_stopped("tokenizing Alpaca records");
  std::vector<int64_t> offsets(1, 0);
  std::vector<int32_t> ids, labels;
  int64_t truncated = 0, no_target = 0, first_truncated = -1, first_dropped = -1;
  for (int64_t i = 0; i < n; i++) {
    const std::vector<int32_t>& p = prompt[(size_t)i];
    const std::vector<int32_t>& t = target[(size_t)i];
    const int64_t len = std::min<int64_t>((int64_t)(p.size() + t.size()), model_max_length);
    if ((int64_t)(p.size() + t.size()) > model_max_length) {
      truncated++;
      if (first_truncated < 0) first_truncated = i;
    }
    // A prompt that fills model_max_length leaves no response token: no loss, and a global batch of
    // only such examples would stop the run at the same step on every resume. Dropped.
    if ((int64_t)p.size() >= model_max_length) {
      if (no_target++ == 0) first_dropped = i;
      continue;
    }
    for (int64_t k = 0; k < len; k++) {
      const bool in_prompt = k < (int64_t)p.size();
      ids.push_back(in_prompt ? p[(size_t)k] : t[(size_t)(k - (int64_t)p.size())]);
      labels.push_back(in_prompt ? kIgnoreIndex : ids.back());
    }
    offsets.push_back((int64_t)ids.size());
  }
  if (st) {
    st->v[0] = truncated;
    st->v[1] = no_target;
    st->v[2] = first_truncated;
    st->v[3] = first_dropped;
  }
  return TokenDataset(std::move(offsets), std::move(ids), std::move(labels));
}

TokenDataset load_alpaca_dataset(const DataArgs& args, const Tokenizer& tok, int rank, std::string* key) {
  const std::string& path = args.data_path;
  check_regular_file(path, "--data_path");  // first: opening a pipe would wait for a writer
  if (FILE* f = std::fopen(path.c_str(), "rb")) std::fclose(f);
  else fail("cannot open --data_path %s: %s", path.c_str(), std::strerror(errno));
  KeyHasher h;
  // v2: records without a response token are dropped
  h.add("llmt-alpaca-v2").add(kAlpacaPromptInput).add(kAlpacaPromptNoInput);
  h.add(args.instruction_field).add(args.input_field).add(args.output_field).add_int(args.model_max_length);
  h.add_file(path);
  add_tokenizer_to_key(h, tok, args.tokenizer_path);
  if (key) *key = h.hex();
  const std::string dir = resolve_cache_dir(args.cache_dir), name = cache_entry_name("alpaca-", path);
  overwrite_cache_entry(args.overwrite_cache, rank, dir, name, h.hex(), path);
  CacheStats st;
  CacheUse use = CacheUse::off;
  auto t0 = std::chrono::steady_clock::now();
  TokenDataset ds = cached_dataset(
      dir, name, h.hex(),
      [&](CacheStats* s) {
        std::vector<AlpacaRecord> recs = read_alpaca(path, args);
        TokenizeThreads threads(args.preprocessing_num_workers);
        log_info("data   tokenizing %zu Alpaca records of %s (%s)", recs.size(), path.c_str(),
                 threads.describe(tokenizer_thread_safe(tok)).c_str());
        return tokenize_alpaca(recs, tok, args.model_max_length, s);
      },
      &st, &use, rank, 60.0, tok.vocab_size());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t target_tokens = 0;
  for (int64_t i = 0; i < ds.total_tokens(); i++) target_tokens += ds.labels_data()[i] != kIgnoreIndex;
  log_info("data   alpaca %s: %lld examples, %lld tokens (%lld in responses), longest %lld; %s (%.1f s)",
           path.c_str(), (long long)ds.size(), (long long)ds.total_tokens(), (long long)target_tokens,
           (long long)ds.max_length(), describe_cache_use(use, token_cache_path(dir, name, h.hex())).c_str(), secs);
  const long long records = (long long)ds.size() + st.v[1];
  if (st.v[0] > 0 && rank == 0)  // once, not once per rank
    log_warn("%s: %lld of %lld records are longer than model_max_length %d and were cut (the first: record %lld)%s",
             path.c_str(), (long long)st.v[0], records, args.model_max_length, (long long)st.v[2],
             st.v[1] > 0 ? strformat("; %lld of them keep no response token (the prompt alone fills it) and were "
                                     "dropped (the first: record %lld)", (long long)st.v[1], (long long)st.v[3])
                               .c_str()
                         : "");
  LLMT_CHECK(ds.size() > 0, "%s: none of its %lld records keeps a response token within --model_max_length %d: "
             "nothing to learn from", path.c_str(), records, args.model_max_length);
  return ds;
}

}  // namespace llmt
