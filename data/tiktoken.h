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

// Which names the 256 special tokens after Llama 3's 128000 ranks get. The rank files of every
// Llama 3.x release are the same; Meta's tokenizer.py named the specials anew in 3.1 (3.2 and 3.3
// keep 3.1's, as their tokenizer.json files do):
//   3.0: <|begin_of_text|> 128000, <|end_of_text|> 128001, <|start_header_id|> 128006,
//        <|end_header_id|> 128007, <|eot_id|> 128009, the others <|reserved_special_token_0..250|>
//   3.1: as 3.0, and <|finetune_right_pad_id|> 128004, <|eom_id|> 128008, <|python_tag|> 128010, so
//        the others are <|reserved_special_token_0..247|> (128005 is _2, 128011 is _3)
enum class Llama3Release { k3_0, k3_1 };

// The rank file with the given pattern. Special tokens by the number of ranks: 50256 (GPT-2:
// <|endoftext|> = 50256, BOS = EOS, nothing added), 128000 (Llama 3: the release's 256 special
// tokens above, <|begin_of_text|> = BOS added by default as transformers does, <|end_of_text|> = EOS),
// otherwise none.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, PretokPattern pattern,
                                         Llama3Release release = Llama3Release::k3_0);
// As above with the pattern by the number of ranks: Llama 3's for 128000, else GPT-2's. 200000 ranks
// (Llama 4's tokenizer.model: another pattern and 1135 specials) are refused, naming the format.
std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, Llama3Release release = Llama3Release::k3_0);

// True when the file starts like a rank file (`base64 integer` on its first line); a SentencePiece
// protobuf never does (its first byte is a field tag, not a base64 character followed by a space).
bool is_tiktoken_file(const std::string& path);

}  // namespace llmt
