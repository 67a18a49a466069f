// Alpaca instruction data (--data_path), prepared as Stanford Alpaca's train.py prepares it: the
// PROMPT_DICT templates to the byte, target = output + EOS, loss only on the target, truncation at
// model_max_length. One difference, on purpose: the prompt and the target are tokenized separately
// (prompt with the tokenizer's default specials, target without, then the EOS id), so no merge crosses
// the prompt/response boundary and the mask is exact; Stanford tokenizes prompt + target jointly and
// masks as many tokens as the prompt alone has. docs/data.md shows where the two differ.
//
// Records: a JSON array of objects, or JSON Lines (one object a line). Fields instruction / input /
// output, renamed by --alpaca_{instruction,input,output}_field; with the default names, a record
// without "output" may name it "response" (GPTeacher, Dolly) and one without "input" may name it
// "context" (Dolly). A missing or null input is "". Extra fields are ignored.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/token_cache.h"

namespace llmt {

struct AlpacaRecord {
  std::string instruction, input, output;
};

// Stanford's PROMPT_DICT["prompt_input"] and ["prompt_no_input"], with {instruction} and {input} marks.
extern const char* const kAlpacaPromptInput;
extern const char* const kAlpacaPromptNoInput;

// Parses records from `text` (the content of `what`, named in errors with line and column, or record
// index). Errors: malformed JSON, invalid UTF-8, a record that is not an object, no instruction, no
// output, a field that is not a string, no records at all.
std::vector<AlpacaRecord> parse_alpaca(const std::string& text, const std::string& what, const DataArgs& fields);
std::vector<AlpacaRecord> read_alpaca(const std::string& path, const DataArgs& fields);

// The prompt: prompt_input when input is not "", else prompt_no_input (Stanford's format_map).
std::string alpaca_prompt(const AlpacaRecord& r);

// One example per record: ids = [BOS if the tokenizer adds one] + encode(prompt) + encode(output) + [EOS],
// labels -100 over the prompt part; cut to model_max_length. A record whose prompt alone fills
// model_max_length keeps no response token and is dropped. st->v[0] counts truncated records, v[1]
// dropped ones, v[2] the first truncated record's index, v[3] the first dropped one's (-1: none).
TokenDataset tokenize_alpaca(const std::vector<AlpacaRecord>& recs, const Tokenizer& tok, int model_max_length,
                             CacheStats* st);

// read + tokenize through the token cache, with logs. *key (when given) gets the token cache key, the
// dataset's identity (DataIdentity).
TokenDataset load_alpaca_dataset(const DataArgs& args, const Tokenizer& tok, int rank, std::string* key = nullptr);

}  // namespace llmt
