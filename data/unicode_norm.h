// Unicode normalization form C (NFC, UAX #15, Unicode 16.0): the `NFC` normalizer of a Hugging Face
// tokenizer.json (Qwen2's), which byte-level BPE applies before pre-tokenization.
#pragma once
#include <string>
#include <string_view>

namespace llmt {

// NFC of UTF-8 text: canonical decomposition, canonical ordering of combining marks, canonical
// composition. A byte that is not part of valid UTF-8 passes through unchanged and acts as a
// starter that composes with nothing (it blocks marks on either side from each other). Text with
// no code point at or above U+0300 is already NFC and comes back as it is.
std::string utf8_nfc(std::string_view text);

}  // namespace llmt
