// Byte-level BPE: GPT-2's tokenizer (vocab.json + merges.txt, or a tokenizer.json whose model is BPE
// behind a ByteLevel pre-tokenizer) and, through data/tiktoken.h, tiktoken rank files. Both work on
// raw bytes here: a token is a byte string, a merge turns two adjacent tokens into one, and the
// lowest-ranked adjacent pair is merged first (the leftmost on ties) until no pair has a rank,
// which is what Hugging Face's BPE model and tiktoken's byte_pair_merge both compute.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "data/pretokenize.h"
#include "data/tokenizer.h"
#include "data/utf8.h"  // utf8_replace_invalid: how decode repairs bytes that are not UTF-8

namespace llmt {

// A token split out of the text before pre-tokenization (HF added_tokens, tiktoken special tokens).
struct BpeAddedToken {
  std::string content;
  int32_t id = -1;
  bool special = true;      // decode(skip_special) leaves it out
  bool lstrip = false;      // also takes the whitespace on its left / right (HF AddedToken options)
  bool rstrip = false;
  bool single_word = false; // only where it is not inside a word
  bool normalized = false;  // HF: matched in the normalized text (else in the raw text, before normalizing)
};

struct BpeMerge {
  int32_t left, right, merged, rank;
};

// Everything a byte-level BPE tokenizer is made of, as the loaders fill it.
struct BpeSpec {
  std::string kind;                  // "gpt2-bpe", "tiktoken"
  std::vector<std::string> tokens;   // id -> its bytes (empty for an unused id)
  std::vector<BpeMerge> merges;      // a pair's rank orders the merges (lower first)
  std::vector<BpeAddedToken> added;
  std::vector<int32_t> opaque_ids;   // ids never made by merging (added tokens, keys that are not byte-level)
  bool nfc = false;                  // HF normalizer NFC (Qwen2): text is put in Unicode NFC before pre-tokenizing
  PretokPattern pattern = PretokPattern::kGpt2;
  bool add_prefix_space = false;     // HF ByteLevel(add_prefix_space): a space before each text segment
  bool ignore_merges = false;        // a piece that is itself a token is that token (tiktoken; HF ignore_merges)
  int32_t unk_id = -1;               // for a byte with no token (HF BPE unk_token); dropped when -1
  int32_t bos_id = -1, eos_id = -1;
  bool add_bos = false, add_eos = false;
};

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec);

// GPT2TokenizerFast from vocab.json + merges.txt: <|endoftext|> (when in the vocabulary) is the
// special BOS = EOS token, and nothing is added by default.
std::unique_ptr<Tokenizer> load_bytelevel_bpe_files(const std::string& vocab_json, const std::string& merges_txt);

// True when a parsed tokenizer.json is a byte-level BPE: model BPE without byte_fallback, and a
// ByteLevel pre-tokenizer (alone or after a Split in a Sequence).
bool is_bytelevel_bpe_json(const nlohmann::json& j);
std::unique_ptr<Tokenizer> load_bytelevel_bpe_json(const nlohmann::json& j, const std::string& path);

// GPT-2's bytes_to_unicode: the printable character that stands for each byte in vocab.json.
const std::vector<uint32_t>& byte_to_unicode();
// A byte-level vocabulary string back to bytes; false when a character is not one of the 256.
bool bytelevel_to_bytes(std::string_view s, std::string* out);

// FNV-1a 64 over int32 ids as little-endian bytes: the hash the fixtures record.
uint64_t fnv1a_ids(const int32_t* ids, size_t n, uint64_t h = 0xcbf29ce484222325ULL);

}  // namespace llmt
