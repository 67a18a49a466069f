#include "data/unicode_norm.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

#include "data/unicode_norm_tables.h"
#include "data/utf8.h"

namespace llmt {

namespace {

// A byte that is not part of valid UTF-8 travels through the code point arrays as this bit plus the
// byte: above U+10FFFF, so it has ccc 0, no decomposition and no composite (a starter that blocks).
constexpr uint32_t kRawByte = 0x80000000u;

// Hangul syllables decompose and compose by arithmetic (Unicode chapter 3.12), not by table.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kSCount = kLCount * kVCount * kTCount;

// The code point at s[i], or a raw byte (kRawByte | b) where s[i] starts no valid UTF-8 sequence.
// Returns the length.
int decode_at(const uint8_t* s, size_t n, size_t i, uint32_t* cp) {
  int bad;
  const int len = utf8_decode(s + i, n - i, cp, &bad);
  if (len > 0) return len;
  *cp = kRawByte | s[i];
  return 1;
}

void encode(uint32_t cp, std::string& out) {
  if (cp & kRawByte) {
    out += (char)(cp & 0xFF);
  } else if (cp < 0x80) {
    out += (char)cp;
  } else if (cp < 0x800) {
    out += (char)(0xC0 | (cp >> 6));
    out += (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += (char)(0xE0 | (cp >> 12));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  } else {
    out += (char)(0xF0 | (cp >> 18));
    out += (char)(0x80 | ((cp >> 12) & 0x3F));
    out += (char)(0x80 | ((cp >> 6) & 0x3F));
    out += (char)(0x80 | (cp & 0x3F));
  }
}

int ccc(uint32_t cp) {
  if (cp < 0x300 || cp >= 0x110000) return 0;
  // the last range that starts at or before cp
  const CccRange* r = std::upper_bound(std::begin(kCccRanges), std::end(kCccRanges), cp,
                                       [](uint32_t v, const CccRange& x) { return v < x.first; });
  if (r == std::begin(kCccRanges)) return 0;
  --r;
  return cp <= r->last ? r->ccc : 0;
}

// The full canonical decomposition of cp appended to out (cp itself when it has none).
void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp - kSBase < kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / (kVCount * kTCount));
    out.push_back(kVBase + s % (kVCount * kTCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0 && cp < 0x110000) {  // U+00C0 is the first code point with a decomposition
    const uint32_t* p = std::lower_bound(std::begin(kNfdCp), std::end(kNfdCp), cp);
    if (p != std::end(kNfdCp) && *p == cp) {
      size_t k = p - kNfdCp;
      out.insert(out.end(), kNfdPool + kNfdStart[k], kNfdPool + kNfdStart[k + 1]);
      return;
    }
  }
  out.push_back(cp);
}

// The primary composite of the pair (a, b), or 0 when there is none.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a - kLBase < kLCount && b - kVBase < kVCount) return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a - kSBase < kSCount && (a - kSBase) % kTCount == 0 && b - (kTBase + 1) < kTCount - 1) return a + (b - kTBase);
  if (b < 0x300 || a >= 0x110000 || b >= 0x110000) return 0;  // every second of a pair is >= U+0300
  uint64_t key = (uint64_t)a << 21 | b;
  const uint64_t* p = std::lower_bound(std::begin(kNfcPairs), std::end(kNfcPairs), key);
  return p != std::end(kNfcPairs) && *p == key ? kNfcComposite[p - kNfcPairs] : 0;
}

}  // namespace

std::string utf8_nfc(std::string_view text) {
  // Fast path: no code point below U+0300 has a nonzero combining class or is the second of a
  // composable pair (the generator asserts both), so such text is NFC already. U+0300 is CC 80 in
  // UTF-8: a code point at or above it has a lead byte >= 0xCC, one below it never has such a byte.
  const uint8_t* s = (const uint8_t*)text.data();
  const size_t n = text.size();
  if (std::none_of(s, s + n, [](uint8_t b) { return b >= 0xCC; })) return std::string(text);

  // 1. canonical decomposition
  std::vector<uint32_t> d;
  d.reserve(n + 8);
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    i += decode_at(s, n, i, &cp);
    decompose(cp, d);
  }
  // 2. canonical ordering: each run of marks (ccc != 0) sorted by ccc, stably (insertion sort: the
  //    runs are short)
  std::vector<uint8_t> cc(d.size());
  for (size_t k = 0; k < d.size(); k++) cc[k] = (uint8_t)ccc(d[k]);
  for (size_t k = 1; k < d.size(); k++)
    for (size_t j = k; j > 0 && cc[j] != 0 && cc[j - 1] > cc[j]; j--) {
      std::swap(d[j - 1], d[j]);
      std::swap(cc[j - 1], cc[j]);
    }
  // 3. canonical composition, in place: each character joins the last starter when a composite of
  //    the two exists and nothing between them blocks it (a character between them blocks unless
  //    its class is nonzero and below this one's; with no character between, nothing blocks)
  size_t m = 0;            // characters kept so far
  size_t starter = SIZE_MAX;  // index of the last starter kept
  int last = 0;            // class of the last character kept (0: that was the starter itself)
  for (size_t k = 0; k < d.size(); k++) {
    uint32_t c = d[k];
    if (starter != SIZE_MAX && (last == 0 || last < cc[k])) {
      uint32_t composite = compose(d[starter], c);
      if (composite) {
        d[starter] = composite;
        continue;
      }
    }
    if (cc[k] == 0) starter = m;
    last = cc[k];
    d[m++] = c;
  }
  std::string out;
  out.reserve(n + 8);
  for (size_t k = 0; k < m; k++) encode(d[k], out);
  return out;
}

}  // namespace llmt
