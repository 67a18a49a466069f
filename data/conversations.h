// Chat data for --data_path: records in TRL's conversational format (`messages`: role/content, an
// optional record-level `system` and `tools`), ShareGPT's (`conversations`: from/value), and
// prompt-completion (`prompt` and `completion`, both strings or both lists of messages), rendered
// with the model's chat template (data/chat_template.h) and tokenized as transformers'
// apply_chat_template does (no special tokens added: the template writes them).
//
// Loss (TRL's SFTConfig): --assistant_only_loss True (the default here) trains on the assistant turns:
// the text the template's `{% generation %}` blocks produce, as return_assistant_tokens_mask marks
// it, or, for a template without such blocks (every stock one), the text each assistant message adds
// to the rendering of the messages before it (assistant_spans_by_prefix). --completion_only_loss True (the default, TRL's for
// prompt-completion data) trains on the completion: the ids after the common prefix of the prompt's
// ids (rendered with add_generation_prompt) and the whole record's. Examples are cut at
// model_max_length; one left without a loss token is dropped.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/token_cache.h"

namespace llmt {

enum class RecordFormat { alpaca, messages, sharegpt, prompt_completion };
const char* record_format_name(RecordFormat f);

// One parsed record: `messages` (role/content objects; a prompt-completion record's prompt when
// `completion` is set), its `tools` (null when none); prompt-completion as plain strings in
// prompt_text / completion_text.
struct ChatRecord {
  nlohmann::ordered_json messages, completion, tools;
  std::string prompt_text, completion_text;
  bool conversational = true;
  std::string where;  // "line 3" / "record 2", for errors
};

// The format of the records of `path` (--data_path): Alpaca's instruction/output fields, messages,
// conversations, prompt/completion. Mixed formats and records of none are refused, naming the record
// and the keys it has.
RecordFormat detect_record_format(const std::string& path, const DataArgs& args);

std::vector<ChatRecord> read_chat_records(const std::string& path, RecordFormat format);

// The chat template: --chat_template (a Jinja file, or a JSON file with "chat_template", such as a
// tokenizer_config.json), else the tokenizer directory's chat_template.jinja, else its
// tokenizer_config.json's chat_template. *origin says where it came from. None found: an error
// saying to pass --chat_template.
std::string find_chat_template(const std::string& flag_value, const std::string& tokenizer_path, std::string* origin);

// The template variables transformers adds: bos_token, eos_token, unk_token, pad_token as the
// tokenizer's tokenizer_config.json names them (else decoded from the tokenizer's ids).
nlohmann::ordered_json special_token_vars(const Tokenizer& tok, const std::string& tokenizer_path);

// Byte ranges of `text` each id stands for (Tokenizer::token_bytes, lining up with the text; the
// space a SentencePiece prepends covers nothing). Errors when the ids do not spell the text.
std::vector<std::pair<size_t, size_t>> token_offsets(const Tokenizer& tok, const std::string& text,
                                                     const std::vector<int32_t>& ids);
// transformers' assistant mask: a token is in it when it overlaps one of the spans
std::vector<char> span_mask(const std::vector<std::pair<size_t, size_t>>& offsets,
                            const std::vector<std::pair<size_t, size_t>>& spans);

// The assistant turns of a template without {% generation %} blocks: for each assistant message i,
// P = the messages before it rendered with add_generation_prompt=True, Q = the messages up to it
// rendered without; the turn is Q's text after P (Llama 3: the answer and <|eot_id|>; Qwen2.5: the
// answer, <|im_end|> and "\n"). `vars` are the variables the whole rendering `full` was made with. The
// template must be prefix-consistent: Q starts with P and `full` with Q; where it is not (a template
// that renders earlier turns differently once later ones follow, or raises on a prefix) this throws
// naming the message, why, and the fixes. Byte ranges of `full`, in order.
std::vector<std::pair<size_t, size_t>> assistant_spans_by_prefix(const ChatTemplate& tmpl,
                                                                 const nlohmann::ordered_json& vars,
                                                                 const std::string& full);
// How --assistant_only_loss finds the turns with this template, for the log: "{% generation %} blocks"
// or "rendering each turn's prefix".
const char* assistant_turns_method(const ChatTemplate& tmpl);

struct ChatTokenizeOptions {
  int model_max_length = 512;
  bool assistant_only_loss = true, completion_only_loss = true;
  nlohmann::ordered_json specials;  // special_token_vars
};
// One example per record (labels -100 outside the trained tokens), cut at model_max_length; records
// without a loss token are dropped. st->v as tokenize_alpaca's: truncated, dropped, first of each.
TokenDataset tokenize_chat(const std::vector<ChatRecord>& recs, const ChatTemplate& tmpl, const Tokenizer& tok,
                           const ChatTokenizeOptions& opt, CacheStats* st, const std::string& what);

// read + render + tokenize through the token cache, with logs; *key gets the cache key.
TokenDataset load_chat_dataset(const DataArgs& args, RecordFormat format, const Tokenizer& tok, int rank,
                               std::string* key = nullptr);

}  // namespace llmt
