// Tokenizers: text to token ids and back, exactly as Hugging Face tokenizers / transformers
// (and tiktoken for rank files) produce them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace llmt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text` with no BOS/EOS added. Special tokens written in the text (e.g.
  // "<|endoftext|>") become their ids, as Hugging Face does by default.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Text of `ids`; bytes that do not form valid UTF-8 become U+FFFD as Hugging Face decodes them.
  // skip_special leaves special tokens (BOS, EOS, <|endoftext|>, ...) out.
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const = 0;
  virtual int vocab_size() const = 0;   // ids lie in [0, vocab_size)
  virtual int bos_id() const = 0;       // -1 when the tokenizer has none
  virtual int eos_id() const = 0;       // -1 when none
  virtual bool adds_bos() const = 0;    // Hugging Face default for add_special_tokens=True (LLaMA: BOS)
  virtual bool adds_eos() const = 0;    // (LLaMA: no EOS by default)
  virtual std::string kind() const = 0; // "gpt2-bpe", "sentencepiece-bpe", "tiktoken", ...

  // The first max_tokens ids of encode(text) (all of them when fewer), exactly. Byte-level BPE and
  // tiktoken stop after the pre-tokenizer piece that reaches max_tokens (pieces are merged
  // independently, so the ids before are the same), bounding the work and memory of a 50 MB text
  // that is cut at model_max_length anyway; other kinds encode the whole text and cut it.
  virtual std::vector<int32_t> encode_prefix(std::string_view text, size_t max_tokens) const;
  // A lower bound on encode(text).size() for any text of `bytes` bytes (0 when none is known): the most
  // bytes one id can stand for bounds it. A 50 MB instruction is then known to fill model_max_length
  // without being tokenized. Byte-level BPE and bytes give one; SentencePiece (whose normalizer may
  // fold a run of spaces into one piece) does not.
  virtual size_t min_ids_for_bytes(size_t /*bytes*/) const { return 0; }
  // The bytes of the text that token `id` stands for, to align ids with the text they were encoded from
  // (chat data's assistant spans, data/conversations.h): byte-level BPE and tiktoken its bytes,
  // SentencePiece its piece with "▁" as a space and <0xNN> as that byte; others decode({id}).
  virtual std::string token_bytes(int32_t id) const { return decode({id}); }
  // encode() plus the special tokens the tokenizer adds by default (add_special_tokens=True).
  std::vector<int32_t> encode_with_specials(std::string_view text) const;
};

// Picks the tokenizer as AutoTokenizer.from_pretrained would from a directory: tokenizer.json,
// else vocab.json + merges.txt, else tokenizer.model (SentencePiece, or a tiktoken rank file);
// also accepts the path of one of those files, and "bytes" (byte-level ids 0..255, byte_tokenizer.h),
// as every command takes it. A directory with none of them is an error naming
// the directory and the files looked for. Mistral's tekken.json is refused, naming the format.
// llama3_special_tokens: the names a bare Llama 3 tokenizer.model (128000 tiktoken ranks) gives its
// special tokens (data/tiktoken.h): "3.0", "3.1" (also 3.2's and 3.3's), or "auto": the release the
// files beside it show (params.json's use_scaled_rope, config.json's llama3 rope scaling,
// generation_config.json's <|eom_id|>), else 3.0's with a warning. "3.0" / "3.1" with any other
// tokenizer is an error.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir_or_file,
                                          const std::string& llama3_special_tokens = "auto");

// The whole of a tokenizer's file (vocab.json, merges.txt, tokenizer.model, a tiktoken rank file,
// tokenizer.json); errors name `what` ("merges file") and the path.
std::string read_file(const std::string& path, const std::string& what);
// A tokenizer's JSON file (tokenizer.json, vocab.json, tokenizer_config.json), parsed after the
// depth check (engine/core/json_text.h); errors name `what`, the path, and where the JSON breaks.
nlohmann::json read_json(const std::string& path, const std::string& what);

}  // namespace llmt
