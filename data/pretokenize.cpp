#include "data/pretokenize.h"

#include "data/unicode_tables.h"
#include "data/utf8.h"
#include "engine/core/error.h"

namespace llmt {

static const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
static const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
static const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

PretokPattern pretok_pattern_from_regex(const std::string& regex) {
  if (regex == kGpt2Regex) return PretokPattern::kGpt2;
  if (regex == kLlama3Regex) return PretokPattern::kLlama3;
  if (regex == kQwen2Regex) return PretokPattern::kQwen2;
  fail("unsupported pre-tokenizer regex %s: llmt knows the GPT-2 pattern %s, the LLaMA-3 pattern %s and "
       "Qwen2's %s", regex.c_str(), kGpt2Regex, kLlama3Regex, kQwen2Regex);
}

const char* pretok_pattern_regex(PretokPattern p) {
  switch (p) {
    case PretokPattern::kGpt2: return kGpt2Regex;
    case PretokPattern::kLlama3: return kLlama3Regex;
    case PretokPattern::kQwen2: return kQwen2Regex;
    case PretokPattern::kNone: return "";
  }
  return "";
}

const char* pretok_pattern_name(PretokPattern p) {
  switch (p) {
    case PretokPattern::kGpt2: return "gpt2";
    case PretokPattern::kLlama3: return "llama3";
    case PretokPattern::kQwen2: return "qwen2";
    case PretokPattern::kNone: return "none";
  }
  return "?";
}

// ASCII classes, the common case, without the two-stage lookup.
struct AsciiClasses {
  uint8_t c[128];
  AsciiClasses() {
    for (int i = 0; i < 128; i++) {
      bool letter = (i >= 'a' && i <= 'z') || (i >= 'A' && i <= 'Z');
      bool digit = i >= '0' && i <= '9';
      bool space = i == ' ' || (i >= 9 && i <= 13);
      c[i] = letter ? kUniLetter : digit ? kUniNumber : space ? kUniSpace : kUniOther;
    }
  }
};
static const AsciiClasses kAscii;

static inline int table_class(uint32_t cp) {
  return (kUniBlocks[kUniStage1[cp >> 8]][(cp & 255) >> 2] >> ((cp & 3) * 2)) & 3;
}

static inline __attribute__((always_inline)) int class_at(const uint8_t* s, size_t n, size_t i, int* len) {
  uint8_t b0 = s[i];
  if (b0 < 0x80) {
    *len = 1;
    return kAscii.c[b0];
  }
  // A byte that starts no valid UTF-8 sequence is one character of class "other".
  uint32_t cp;
  int bad;
  const int l = utf8_decode(s + i, n - i, &cp, &bad);
  *len = l > 0 ? l : 1;
  return l > 0 ? table_class(cp) : kUniOther;
}

int uni_class_at(const uint8_t* s, size_t n, size_t i, int* len) { return class_at(s, n, i, len); }

// End of the run of characters of class `cls` that starts at i.
static inline size_t run_of(const uint8_t* s, size_t n, size_t i, int cls) {
  while (i < n) {
    int len;
    if (class_at(s, n, i, &len) != cls) break;
    i += len;
  }
  return i;
}

// \s+(?!\S)|\s+ at a whitespace character i: the whole run when it ends the text; else the run
// less its last character (which the next piece takes as its ` ?` or lead character), unless the
// run is that one character.
static inline size_t space_run(const uint8_t* s, size_t n, size_t i) {
  size_t j = i, last = i;
  while (j < n) {
    int len;
    if (class_at(s, n, j, &len) != kUniSpace) break;
    last = j;
    j += len;
  }
  if (j == n) return n;
  return last > i ? last : j;
}

static inline bool is_s(const uint8_t* s, size_t n, size_t i, bool ci) {
  if (i >= n) return false;
  if (s[i] == 's') return true;
  if (!ci) return false;
  return s[i] == 'S' || (s[i] == 0xC5 && i + 1 < n && s[i + 1] == 0xBF);  // U+017F LONG S folds to s
}

// 's|'t|'re|'ve|'m|'ll|'d (case-insensitive when ci) at an apostrophe i: the end, or 0.
static inline size_t contraction(const uint8_t* s, size_t n, size_t i, bool ci) {
  if (i + 1 >= n) return 0;
  auto is = [&](size_t k, char c) {
    return k < n && (s[k] == (uint8_t)c || (ci && s[k] == (uint8_t)(c - 'a' + 'A')));
  };
  if (is_s(s, n, i + 1, ci)) return i + (s[i + 1] == 0xC5 ? 3 : 2);
  if (is(i + 1, 't') || is(i + 1, 'm') || is(i + 1, 'd')) return i + 2;
  if ((is(i + 1, 'r') && is(i + 2, 'e')) || (is(i + 1, 'v') && is(i + 2, 'e')) || (is(i + 1, 'l') && is(i + 2, 'l')))
    return i + 3;
  return 0;
}

static size_t next_gpt2(const uint8_t* s, size_t n, size_t i) {
  if (s[i] == '\'') {
    size_t e = contraction(s, n, i, false);
    if (e) return e;
  }
  int l0;
  int k0 = class_at(s, n, i, &l0);
  if (s[i] == ' ' && i + 1 < n) {  // ` ?` before a letter, number or other run
    int l1;
    int k1 = class_at(s, n, i + 1, &l1);
    if (k1 != kUniSpace) return run_of(s, n, i + 1 + l1, k1);
  }
  if (k0 != kUniSpace) return run_of(s, n, i + l0, k0);
  return space_run(s, n, i);
}

static size_t next_llama3(const uint8_t* s, size_t n, size_t i, int max_digits) {
  if (s[i] == '\'') {
    size_t e = contraction(s, n, i, true);
    if (e) return e;
  }
  int l0;
  int k0 = class_at(s, n, i, &l0);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (k0 == kUniLetter) return run_of(s, n, i + l0, kUniLetter);
  if (k0 != kUniNumber && s[i] != '\r' && s[i] != '\n' && i + l0 < n) {
    int l1;
    if (class_at(s, n, i + l0, &l1) == kUniLetter) return run_of(s, n, i + l0 + l1, kUniLetter);
  }
  // \p{N}{1,3}
  if (k0 == kUniNumber) {
    size_t j = i + l0;
    for (int d = 1; d < max_digits && j < n; d++) {
      int len;
      if (class_at(s, n, j, &len) != kUniNumber) break;
      j += len;
    }
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*  (s[i] is now other or whitespace)
  size_t start = n;
  if (k0 == kUniOther) {
    start = i;
  } else if (s[i] == ' ' && i + 1 < n) {
    int l1;
    if (class_at(s, n, i + 1, &l1) == kUniOther) start = i + 1;
  }
  if (start != n) {
    size_t j = run_of(s, n, start, kUniOther);
    while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
    return j;
  }
  // here s[i] is whitespace. \s*[\r\n]+: through the last \r or \n of the whitespace run
  size_t j = i, nl = n;
  while (j < n) {
    int len;
    if (class_at(s, n, j, &len) != kUniSpace) break;
    if (s[j] == '\r' || s[j] == '\n') nl = j;
    j += len;
  }
  if (nl != n) return nl + 1;
  return space_run(s, n, i);
}

size_t pretok_next(const char* text, size_t n, size_t i, PretokPattern p) {
  const uint8_t* s = (const uint8_t*)text;
  switch (p) {
    case PretokPattern::kGpt2: return next_gpt2(s, n, i);
    case PretokPattern::kLlama3: return next_llama3(s, n, i, 3);
    case PretokPattern::kQwen2: return next_llama3(s, n, i, 1);
    case PretokPattern::kNone: return n;
  }
  return n;
}

}  // namespace llmt
