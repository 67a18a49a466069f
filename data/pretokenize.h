// Pre-tokenization: the regex that cuts text into pieces before byte-level BPE, written out as
// a hand-made scanner (no regex engine). Each pattern below is matched exactly as Oniguruma (Hugging
// Face tokenizers) and Rust's regex crate (tiktoken) match it: leftmost alternative first, greedy
// runs, and the backtracking of `\s+(?!\S)` and `\s*[\r\n]+` spelled out. Character classes come
// from data/unicode_tables.h (Unicode 16.0, as both peers use). A byte that is not part of valid
// UTF-8 counts as one character of class "other" (neither \s, \p{L} nor \p{N}).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace llmt {

enum class PretokPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // as kLlama3 with \p{N} (one digit a piece) in place of \p{N}{1,3}: Qwen2's pattern
  kQwen2,
  // no splitting: the whole text is one piece (ByteLevel with use_regex=false and no Split)
  kNone,
};

// The pattern a regex string spells (as written in a tokenizer.json Split pre-tokenizer or
// tiktoken's pat_str); throws naming the regex when it is none of the known ones.
PretokPattern pretok_pattern_from_regex(const std::string& regex);
const char* pretok_pattern_regex(PretokPattern p);
const char* pretok_pattern_name(PretokPattern p);

// End (exclusive) of the piece that starts at text[i], i < n. Pieces tile the text: the next one
// starts where this one ends.
size_t pretok_next(const char* text, size_t n, size_t i, PretokPattern p);

// Class of the character at s[i] (i < n): 0 other, 1 letter \p{L}, 2 number \p{N}, 3 space \s;
// its length in bytes goes to *len (1 for a byte that is not valid UTF-8).
enum { kUniOther = 0, kUniLetter = 1, kUniNumber = 2, kUniSpace = 3 };
int uni_class_at(const uint8_t* s, size_t n, size_t i, int* len);

}  // namespace llmt
