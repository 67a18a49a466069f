// tiktoken rank files: one `base64(token bytes) rank` a line, the rank being the token id and the
// merge priority (OpenAI's *.tiktoken files; LLaMA-3's tokenizer.model). Encoded as tiktoken does:
// special tokens split out, the text cut by the pattern, and each piece either a whole token or
// byte pairs merged lowest rank first.
#pragma once
#include <memory>
#include <string>

#include "data/pretokenize.h"
#include "data/tokenizer.h"

namespace llmt {

// The rank file with the given pattern. Special tokens by the number of ranks: 50256 (GPT-2:
// <|endoftext|> = 50256, BOS = EOS, nothing added), 128000 (LLaMA-3: <|begin_of_text|> = 128000,
// <|end_of_text|> = 128001 and the reserved tokens up to 128255 as Meta's tokenizer.py names them;
// BOS added by default as transformers does), otherwise none.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, PretokPattern pattern);
// As above with the pattern by the number of ranks: LLaMA-3's for 128000, else GPT-2's.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path);

// True when the file starts like a rank file (`base64 integer` on its first line); a SentencePiece
// protobuf never does (its first byte is a field tag, not a base64 character followed by a space).
bool is_tiktoken_file(const std::string& path);

}  // namespace llmt
