// UTF-8 as Python and Hugging Face read it: strict (no overlong forms, no surrogates, nothing past
// U+10FFFF). The tokenizers, the pre-tokenizer, NFC and the dataset readers decode, check and repair
// text through these, so every part of data/ draws the line between valid and invalid in one place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace llmt {

// Decodes the UTF-8 sequence at s[0, n) (n >= 1). Returns its length (1 to 4) and sets *cp, or returns
// 0 when it is invalid and sets *bad to the length of its maximal subpart: the bytes one U+FFFD
// replaces, as Python's bytes.decode(errors="replace") and Rust's String::from_utf8_lossy do. Inline:
// the pre-tokenizer and NFC call it for every character of the corpus.
inline int utf8_decode(const uint8_t* s, size_t n, uint32_t* cp, int* bad) {
  const uint8_t c = s[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  int len;
  uint32_t v;
  uint8_t lo = 0x80, hi = 0xbf;  // the range of the second byte; later bytes are 80..BF
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2, v = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3, v = c & 0x0f;
    if (c == 0xe0) lo = 0xa0;  // no overlong forms
    if (c == 0xed) hi = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4, v = c & 0x07;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
  } else {
    *bad = 1;  // 80..C1 and F5..FF never start a character
    return 0;
  }
  for (int i = 1; i < len; i++) {
    if ((size_t)i >= n || s[i] < lo || s[i] > hi) {
      *bad = i;
      return 0;
    }
    v = v << 6 | (s[i] & 0x3f);
    lo = 0x80, hi = 0xbf;
  }
  *cp = v;
  return len;
}

// Byte offset of the first invalid UTF-8 sequence in s, or -1 when s is valid.
int64_t find_invalid_utf8(std::string_view s);
inline bool valid_utf8(std::string_view s) { return find_invalid_utf8(s) < 0; }

// s with each maximal invalid subpart replaced by one U+FFFD, as Python's bytes.decode("utf-8",
// errors="replace") and Rust's String::from_utf8_lossy do it ("\xe2\x82" is one U+FFFD, "\xc0\x80" two):
// the text Hugging Face is given.
std::string utf8_replace_invalid(std::string_view s);

}  // namespace llmt
