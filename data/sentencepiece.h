// SentencePiece BPE tokenizers (LLaMA-1/2, Mistral, Gemma): from a `tokenizer.model` protobuf (ModelProto) or
// from the LLaMA-style tokenizer.json Hugging Face writes for it. Encodes and decodes exactly as
// transformers' LlamaTokenizerFast does for the flavor chosen (see docs/tokenizers.md, "SentencePiece").
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "data/tokenizer.h"

namespace llmt {

// The two Hugging Face pipelines a tokenizer.model can become. They differ on runs of spaces (the merge
// order) and on leading spaces (the "▁" prefix); see docs/tokenizers.md.
enum class SentencePieceFlavor {
  // transformers 5 (LlamaTokenizerFast from tokenizer.model, legacy=False): merges ranked by the merged
  // piece's id; "▁" before the text's first segment only (Metaspace, prepend_scheme "first").
  kTransformers,
  // The tokenizer.json transformers 4 wrote for LLaMA (legacy=True; the form of the LLaMA-2 files on the
  // Hub): merges ranked by piece score; "▁" before every segment (Prepend normalizer). On LLaMA-2 its ids
  // are the sentencepiece library's, except that <s>, </s>, <unk> written in the text become their ids.
  kScoreMerges,
};

// A SentencePiece `tokenizer.model` (serialized sentencepiece.ModelProto, BPE model type) in the given
// flavor. The one-argument form is kScoreMerges: the sentencepiece library's tokenization, the one LLaMA-2
// was trained with; load_tokenizer uses it for a tokenizer.model. kTransformers must be asked for.
std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path, SentencePieceFlavor flavor);
std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path);

// A LLaMA-style tokenizer.json (model.type "BPE" with byte_fallback, "▁" normalizer or Metaspace
// pre-tokenizer; Gemma's: Replace(" ", "▁") normalizer, Split(" ", MergedWithPrevious) or no pre-tokenizer).
// `path` names the file in error messages.
std::unique_ptr<Tokenizer> load_sentencepiece_json(const nlohmann::json& tokenizer_json,
                                                   const std::string& path);

// True when `path` parses as a protobuf ModelProto with pieces and a trainer_spec (false for e.g. a
// tiktoken base64 rank file, or a missing file).
bool is_sentencepiece_model_file(const std::string& path);

}  // namespace llmt
