// Preference data for DPO, read, tokenized and cut as TRL's DPOTrainer does (trl 1.16: _prepare_dataset,
// DataCollatorForPreference): records with "prompt", "chosen" and "rejected", all strings or all lists of
// messages (rendered by the chat template), or with "chosen" and "rejected" only (the implicit prompt:
// their common beginning, TRL's extract_prompt). docs/data.md ("Preference data") gives the rules, and
// the records llmt refuses where TRL trains on something no one meant.
//
// The result is a TokenDataset of 2n sequences: 2i is pair i's prompt + chosen completion, 2i + 1 its
// prompt + rejected completion, each cut to max_length, labels -100 on the prompt and the ids on the
// completion. collate() over [2i..] and [2i+1..] then gives TRL's batch, and its targets != -100 are
// TRL's shifted completion mask: the tokens whose log-probabilities a DPO step sums.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/token_cache.h"

namespace llmt {

class Tokenizer;

struct PreferenceRecord {
  bool conversational = false;
  bool implicit_prompt = false;  // the file gives chosen and rejected only; prompt is what they share
  std::string prompt_text, chosen_text, rejected_text;  // standard records
  nlohmann::ordered_json prompt, chosen, rejected;      // conversational records: lists of messages
  nlohmann::ordered_json tools, template_kwargs;        // "tools" and "chat_template_kwargs"; null when absent
  std::string where;                                    // "line 3" (JSON Lines) or "record 2" (an array)
};

// The records of a .json (one array) or .jsonl file, implicit prompts extracted. One file holds one form
// (standard or conversational; explicit or implicit prompt). Refused, naming the file, the record and
// what was expected: a record without chosen or rejected, a field of another type than the others (a
// string prompt with message-list completions), null, an empty message list, a message without role or
// content, a completion that does not start with an assistant message, and in the implicit form chosen
// and rejected that share nothing, are equal, or where one is the beginning of the other.
std::vector<PreferenceRecord> read_preference_records(const std::string& path);

// TRL's extract_prompt on one record (chosen_text/rejected_text, or chosen/rejected, hold the whole
// texts or conversations): the prompt is their common beginning, characters (code points) or whole
// messages; for strings a space just before the first difference goes to the completions. Throws (no
// file or record named: the caller adds them) where read_preference_records says.
void extract_implicit_prompt(PreferenceRecord& r);

// The ids TRL's _prepare_dataset gives a record, before any cut. Standard: the EOS text appended to
// each completion unless it ends with it, and prompt, prompt + chosen, prompt + rejected encoded with the
// tokenizer's default special tokens (Llama 3's BOS). Conversational: the prompt rendered with
// add_generation_prompt, prompt + chosen and prompt + rejected without, encoded with no specials added.
// The prompt is the common prefix of the three encodings, so ids merged across the boundary belong to
// both completions.
struct PreferenceIds {
  std::vector<int32_t> prompt, chosen, rejected;
};
// `specials`: special_token_vars (bos_token, eos_token, ...); tmpl may be null for standard records.
PreferenceIds tokenize_preference(const PreferenceRecord& r, const ChatTemplate* tmpl, const Tokenizer& tok,
                                  const nlohmann::ordered_json& specials);

enum class TruncationMode { keep_start, keep_end };
// "keep_start" or "keep_end" (DPOConfig.truncation_mode); anything else is an error naming both.
TruncationMode parse_truncation_mode(const std::string& s);
const char* truncation_mode_name(TruncationMode m);

// One sequence as DataCollatorForPreference makes it: prompt + completion, and with max_length > 0 the
// first max_length ids (keep_start) or the last (keep_end); its first prompt_len ids are prompt.
struct PreferenceSequence {
  std::vector<int32_t> ids;
  size_t prompt_len = 0;
};
PreferenceSequence preference_sequence(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                                       int max_length, TruncationMode mode);

struct PreferenceOptions {
  int max_length = 1024;  // DPOConfig.max_length; <= 0: no limit (TRL's None)
  TruncationMode truncation_mode = TruncationMode::keep_start;
  std::string chat_template;  // --chat_template (empty: the tokenizer directory's), for conversational records
};

// The dataset (the header's comment). Under keep_start a pair whose prompt alone has max_length ids or
// more is dropped, as TRL drops it (it would have no completion token left): st->v[1] counts them and
// v[3] is the first one's record index; v[0] counts pairs with a sequence cut, v[2] the first. `pairs`,
// when given, gets each kept pair's record index.
TokenDataset tokenize_preferences(const std::vector<PreferenceRecord>& recs, const ChatTemplate* tmpl,
                                  const Tokenizer& tok, const nlohmann::ordered_json& specials,
                                  const PreferenceOptions& opt, CacheStats* st, const std::string& what,
                                  std::vector<int64_t>* pairs = nullptr);

// --data_path read, tokenized and cut through the token cache, with the log lines (rank 0 warns of cut
// and dropped pairs, naming the first); no pair left is an error. *key gets the cache key.
TokenDataset load_preference_dataset(const DataArgs& args, const PreferenceOptions& opt, const Tokenizer& tok,
                                     int rank, std::string* key = nullptr);

}  // namespace llmt
