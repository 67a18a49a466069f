// The byte-level tokenizer: every byte of UTF-8 text is one id (0..255), no special tokens.
// For models trained from scratch on raw text (the quickstart); `--tokenizer_name_or_path bytes`.
#pragma once
#include <memory>

#include "data/tokenizer.h"

namespace llmt {

std::unique_ptr<Tokenizer> make_byte_tokenizer();

}  // namespace llmt
