#include "data/bpe_bytelevel.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/unicode_norm.h"
#include "data/utf8.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"

namespace llmt {

// ---- byte <-> unicode (GPT-2's bytes_to_unicode) and UTF-8 helpers ----

const std::vector<uint32_t>& byte_to_unicode() {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256);
    int n = 0;
    for (int b = 0; b < 256; b++) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    return t;
  }();
  return table;
}

bool bytelevel_to_bytes(std::string_view s, std::string* out) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(324, -1);
    for (int b = 0; b < 256; b++) inv[byte_to_unicode()[b]] = b;
    return inv;
  }();
  out->clear();
  const uint8_t* p = (const uint8_t*)s.data();
  size_t n = s.size();
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    int bad;
    const int len = utf8_decode(p + i, n - i, &cp, &bad);
    if (len == 0 || cp >= inverse.size() || inverse[cp] < 0) return false;
    i += (size_t)len;
    *out += (char)inverse[cp];
  }
  return true;
}

uint64_t fnv1a_ids(const int32_t* ids, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; i++) {
    uint32_t v = (uint32_t)ids[i];
    for (int b = 0; b < 4; b++) {
      h ^= (v >> (8 * b)) & 0xFF;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

static inline uint64_t hash_bytes(const uint8_t* s, size_t n) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xff51afd7ed558ccdULL);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, s, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdULL;
    h ^= h >> 32;
    s += 8;
    n -= 8;
  }
  uint64_t w = 0;
  for (size_t i = 0; i < n; i++) w |= (uint64_t)s[i] << (8 * i);
  h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
  return h ^ (h >> 29);
}

static inline bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) {
  if (n > 16) return std::memcmp(a, b, n) == 0;
  for (size_t i = 0; i < n; i++)  // pieces are short: a loop beats calling memcmp
    if (a[i] != b[i]) return false;
  return true;
}

static inline uint64_t hash_pair(uint64_t key) {
  key *= 0x9E3779B97F4A7C15ULL;
  return key ^ (key >> 31);
}

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c <<= 1;
  return c;
}

// ---- the tokenizer ----

namespace {

struct PairSlot {
  uint64_t key;  // left << 32 | right; kEmpty when free
  int32_t rank, merged;
};
constexpr uint64_t kEmpty = ~0ULL;

struct TokenSlot {
  uint32_t hash;  // high bits of the hash, to skip most byte compares
  int32_t id;     // -1 when free
  uint32_t off, len;  // the token's bytes in pool_ (one memory access less than spec_.tokens[id])
};

constexpr int kSmallWord = 64;        // symbols merged by a linear scan; longer words use a heap
constexpr size_t kCacheMaxPiece = 64; // longer pieces are not cached
constexpr size_t kCacheMaxEntries = 1 << 16;

std::atomic<uint64_t> g_serial{1};

// Words already merged, per thread (encode is const and may run on many threads at once). The
// cache belongs to the last tokenizer the thread used: `owner` is that tokenizer's serial number.
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> map;
};
thread_local WordCache t_cache;

class BpeTokenizer : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode_prefix(std::string_view text, size_t max_tokens) const override;
  size_t min_ids_for_bytes(size_t bytes) const override { return bytes_per_id_ ? bytes / bytes_per_id_ : 0; }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;
  std::string token_bytes(int32_t id) const override {
    return id >= 0 && id < (int32_t)spec_.tokens.size() ? spec_.tokens[(size_t)id] : std::string();
  }
  int vocab_size() const override { return (int)spec_.tokens.size(); }
  int bos_id() const override { return spec_.bos_id; }
  int eos_id() const override { return spec_.eos_id; }
  bool adds_bos() const override { return spec_.add_bos; }
  bool adds_eos() const override { return spec_.add_eos; }
  std::string kind() const override { return spec_.kind; }

 private:
  // both stop once out holds `limit` ids (the pieces after are never merged)
  void split_added(const char* s, size_t n, int pass, std::vector<int32_t>& out, size_t limit) const;
  void encode_segment(const char* s, size_t n, std::vector<int32_t>& out, size_t limit) const;
  void encode_piece(const uint8_t* s, size_t n, std::vector<int32_t>& out) const;
  void merge(const uint8_t* s, size_t n, std::vector<int32_t>& out) const;
  void merge_small(int32_t* ids, int m, std::vector<int32_t>& out) const;
  void merge_large(const std::vector<int32_t>& ids, std::vector<int32_t>& out) const;
  int32_t find_token(const uint8_t* s, size_t n) const;
  void insert_token(int32_t id);
  // rank of merging the adjacent pair (a, b), INT_MAX when there is none; its result in *merged
  inline int32_t pair_rank(int32_t a, int32_t b, int32_t* merged) const {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (size_t i = hash_pair(key) & pair_mask_;; i = (i + 1) & pair_mask_) {
      const PairSlot& p = pairs_[i];
      if (p.key == key) {
        *merged = p.merged;
        return p.rank;
      }
      if (p.key == kEmpty) return INT_MAX;
    }
  }
  // Added tokens split out in one pass: [0] those with normalized=false, in the raw text; [1] those
  // with normalized=true, in each piece of the text between [0]'s, normalized.
  struct AddedSet {
    bool first[256] = {};   // bytes that begin some token of the set
    int only_first = -1;    // that byte when all begin with the same one (memchr finds it)
    std::vector<int> by_len;  // spec_.added indices, longest content first
  };
  // the longest added token of `set` that matches at text[i], or -1
  int match_added(const AddedSet& set, const char* s, size_t n, size_t i, size_t seg_start) const;

  BpeSpec spec_;
  uint64_t serial_;
  // the most text bytes one id stands for (min_ids_for_bytes), 0 when unbounded: ids partition the
  // (normalized) text into tokens, so the longest token bounds it; NFC shrinks text at most 3x (three
  // Hangul jamo, 9 bytes, to one syllable of 3; 4 is used); an added token that strips whitespace
  // around it, or a byte with no token and no unk (dropped), stands for any number of bytes
  size_t bytes_per_id_ = 0;
  int32_t byte_id_[256];
  std::vector<PairSlot> pairs_;
  size_t pair_mask_ = 0;
  std::vector<TokenSlot> token_slots_;  // whole pieces that are one token (the shortcut before merging)
  size_t token_mask_ = 0;
  std::string pool_;                    // their bytes, back to back
  std::vector<uint8_t> is_special_;
  AddedSet added_[2];
};

BpeTokenizer::BpeTokenizer(BpeSpec spec) : spec_(std::move(spec)), serial_(g_serial++) {
  const int V = (int)spec_.tokens.size();
  // single bytes
  for (int b = 0; b < 256; b++) byte_id_[b] = -1;
  std::vector<uint8_t> opaque(V, 0);
  for (int32_t id : spec_.opaque_ids) opaque[id] = 1;
  for (int id = 0; id < V; id++)
    if (spec_.tokens[id].size() == 1 && !opaque[id]) {
      uint8_t b = (uint8_t)spec_.tokens[id][0];
      if (byte_id_[b] < 0) byte_id_[b] = id;
    }
  // merges: a later duplicate of a pair replaces the earlier one, as HF's merge map does
  pairs_.assign(pow2_at_least(spec_.merges.size() * 2 + 1), PairSlot{kEmpty, 0, 0});
  pair_mask_ = pairs_.size() - 1;
  for (const BpeMerge& m : spec_.merges) {
    uint64_t key = ((uint64_t)(uint32_t)m.left << 32) | (uint32_t)m.right;
    size_t i = hash_pair(key) & pair_mask_;
    while (pairs_[i].key != kEmpty && pairs_[i].key != key) i = (i + 1) & pair_mask_;
    pairs_[i] = PairSlot{key, m.rank, m.merged};
  }
  // whole-piece shortcut: with ignore_merges every token; otherwise only tokens that merging their
  // own bytes gives back (then the shortcut cannot change a result)
  token_slots_.assign(pow2_at_least((size_t)V * 2 + 1), TokenSlot{0, -1, 0, 0});
  token_mask_ = token_slots_.size() - 1;
  std::vector<int32_t> tmp;
  for (int id = 0; id < V; id++) {
    const std::string& t = spec_.tokens[id];
    if (t.size() < 2 || opaque[id]) continue;
    if (!spec_.ignore_merges) {
      tmp.clear();
      merge((const uint8_t*)t.data(), t.size(), tmp);
      if (tmp.size() != 1 || tmp[0] != id) continue;
    }
    if (find_token((const uint8_t*)t.data(), t.size()) < 0) insert_token(id);
  }
  // added tokens
  is_special_.assign(V, 0);
  for (size_t k = 0; k < spec_.added.size(); k++) {
    BpeAddedToken& a = spec_.added[k];
    LLMT_CHECK(a.id >= 0 && a.id < V, "added token \"%s\" has id %d outside the vocabulary [0, %d)", a.content.c_str(),
               a.id, V);
    if (a.special) is_special_[a.id] = 1;
    // HF matches a normalized token by its content normalized too (decoding uses spec_.tokens, not this)
    if (a.normalized && spec_.nfc) a.content = utf8_nfc(a.content);
    if (a.content.empty()) continue;
    AddedSet& set = added_[a.normalized ? 1 : 0];
    set.first[(uint8_t)a.content[0]] = true;
    set.by_len.push_back((int)k);
  }
  size_t longest = 1;
  bool unbounded = false;
  for (const std::string& t : spec_.tokens) longest = std::max(longest, t.size());
  for (const BpeAddedToken& a : spec_.added) {
    longest = std::max(longest, a.content.size());
    unbounded = unbounded || a.lstrip || a.rstrip;
  }
  for (int b = 0; b < 256; b++) unbounded = unbounded || (byte_id_[b] < 0 && spec_.unk_id < 0);
  bytes_per_id_ = unbounded ? 0 : longest * (spec_.nfc ? 4 : 1);
  for (AddedSet& set : added_) {
    for (int b = 0; b < 256; b++)
      if (set.first[b]) set.only_first = set.only_first == -1 ? b : -2;
    std::stable_sort(set.by_len.begin(), set.by_len.end(),
                     [&](int a, int b) { return spec_.added[a].content.size() > spec_.added[b].content.size(); });
  }
}

int32_t BpeTokenizer::find_token(const uint8_t* s, size_t n) const {
  uint64_t h = hash_bytes(s, n);
  uint32_t hi = (uint32_t)(h >> 32);
  for (size_t i = h & token_mask_;; i = (i + 1) & token_mask_) {
    const TokenSlot& t = token_slots_[i];
    if (t.id < 0) return -1;
    if (t.hash == hi && t.len == n && same_bytes((const uint8_t*)pool_.data() + t.off, s, n)) return t.id;
  }
}

void BpeTokenizer::insert_token(int32_t id) {
  const std::string& tok = spec_.tokens[id];
  uint64_t h = hash_bytes((const uint8_t*)tok.data(), tok.size());
  size_t i = h & token_mask_;
  while (token_slots_[i].id >= 0) i = (i + 1) & token_mask_;
  token_slots_[i] = TokenSlot{(uint32_t)(h >> 32), id, (uint32_t)pool_.size(), (uint32_t)tok.size()};
  pool_ += tok;
}

// Lowest rank first, leftmost on ties: a linear scan over a short word, ranks of unchanged pairs kept.
void BpeTokenizer::merge_small(int32_t* ids, int m, std::vector<int32_t>& out) const {
  int32_t rank[kSmallWord], merged[kSmallWord];
  for (int k = 0; k + 1 < m; k++) rank[k] = pair_rank(ids[k], ids[k + 1], &merged[k]);
  while (m > 1) {
    int best = -1;
    int32_t best_rank = INT_MAX;
    for (int k = 0; k + 1 < m; k++)
      if (rank[k] < best_rank) best_rank = rank[k], best = k;
    if (best < 0) break;
    ids[best] = merged[best];
    for (int k = best + 1; k + 1 < m; k++) {
      ids[k] = ids[k + 1];
      rank[k] = rank[k + 1];
      merged[k] = merged[k + 1];
    }
    m--;
    if (best > 0) rank[best - 1] = pair_rank(ids[best - 1], ids[best], &merged[best - 1]);
    if (best + 1 < m) rank[best] = pair_rank(ids[best], ids[best + 1], &merged[best]);
  }
  out.insert(out.end(), ids, ids + m);
}

// The same order with a heap over a linked list: O(n log n) for long words (a long run of spaces,
// a text without pre-tokenization).
void BpeTokenizer::merge_large(const std::vector<int32_t>& start, std::vector<int32_t>& out) const {
  struct Cand {
    int32_t rank, pos, left, right;  // pos: index of the left symbol; left/right: the ids it saw
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const int n = (int)start.size();
  std::vector<int32_t> id(start), next(n), prev(n);
  for (int i = 0; i < n; i++) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  int32_t mg = -1;
  for (int i = 0; i + 1 < n; i++) {
    int32_t r = pair_rank(id[i], id[i + 1], &mg);
    if (r != INT_MAX) heap.push(Cand{r, i, id[i], id[i + 1]});
  }
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int i = c.pos, j = next[i];
    if (id[i] != c.left || j < 0 || id[j] != c.right) continue;  // stale: a neighbour merged first
    pair_rank(id[i], id[j], &mg);
    id[i] = mg;
    id[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) {
      int32_t r = pair_rank(id[prev[i]], id[i], &mg);
      if (r != INT_MAX) heap.push(Cand{r, prev[i], id[prev[i]], id[i]});
    }
    if (next[i] >= 0) {
      int32_t r = pair_rank(id[i], id[next[i]], &mg);
      if (r != INT_MAX) heap.push(Cand{r, i, id[i], id[next[i]]});
    }
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

void BpeTokenizer::merge(const uint8_t* s, size_t n, std::vector<int32_t>& out) const {
  int32_t small[kSmallWord];
  std::vector<int32_t> big;
  int m = 0;
  for (size_t i = 0; i < n; i++) {
    int32_t id = byte_id_[s[i]];
    if (id < 0) id = spec_.unk_id;  // a byte with no token: unk, or dropped as HF BPE does without one
    if (id < 0) continue;
    if (m < kSmallWord) {
      small[m++] = id;
    } else {
      if (big.empty()) big.assign(small, small + m);
      big.push_back(id);
    }
  }
  if (m == 0) return;
  if (big.empty()) merge_small(small, m, out);
  else merge_large(big, out);
}

void BpeTokenizer::encode_piece(const uint8_t* s, size_t n, std::vector<int32_t>& out) const {
  if (n == 1 && byte_id_[s[0]] >= 0) {
    out.push_back(byte_id_[s[0]]);
    return;
  }
  int32_t id = find_token(s, n);
  if (id >= 0) {
    out.push_back(id);
    return;
  }
  if (n > kCacheMaxPiece) {
    merge(s, n, out);
    return;
  }
  WordCache& c = t_cache;
  if (c.owner != serial_) {
    c.map.clear();
    c.owner = serial_;
  }
  std::string key((const char*)s, n);
  auto it = c.map.find(key);
  if (it != c.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  size_t before = out.size();
  merge(s, n, out);
  if (c.map.size() >= kCacheMaxEntries) c.map.clear();
  c.map.emplace(std::move(key), std::vector<int32_t>(out.begin() + before, out.end()));
}

void BpeTokenizer::encode_segment(const char* s, size_t n, std::vector<int32_t>& out, size_t limit) const {
  if (n == 0 || out.size() >= limit) return;
  std::string prefixed;
  if (spec_.add_prefix_space && s[0] != ' ') {  // HF ByteLevel(add_prefix_space=True)
    prefixed = " " + std::string(s, n);
    s = prefixed.data();
    n = prefixed.size();
  }
  for (size_t i = 0; i < n && out.size() < limit;) {
    size_t j = pretok_next(s, n, i, spec_.pattern);
    encode_piece((const uint8_t*)s + i, j - i, out);
    i = j;
  }
}

static bool is_word_char_before(const char* s, size_t start, size_t i) {
  if (i == start) return false;
  size_t k = i - 1;  // back to the start of the previous character
  while (k > start && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
  int len;
  int cls = uni_class_at((const uint8_t*)s, i, k, &len);
  return cls == kUniLetter || cls == kUniNumber || s[k] == '_';
}

static bool is_word_char_at(const char* s, size_t n, size_t i) {
  if (i >= n) return false;
  int len;
  int cls = uni_class_at((const uint8_t*)s, n, i, &len);
  return cls == kUniLetter || cls == kUniNumber || s[i] == '_';
}

int BpeTokenizer::match_added(const AddedSet& set, const char* s, size_t n, size_t i, size_t seg_start) const {
  for (int k : set.by_len) {
    const BpeAddedToken& a = spec_.added[k];
    size_t len = a.content.size();
    if (len > n - i || std::memcmp(s + i, a.content.data(), len) != 0) continue;
    if (a.single_word && (is_word_char_before(s, seg_start, i) || is_word_char_at(s, n, i + len))) continue;
    return k;
  }
  return -1;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  split_added(text.data(), text.size(), 0, out, SIZE_MAX);
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_prefix(std::string_view text, size_t max_tokens) const {
  std::vector<int32_t> out;
  out.reserve(std::min(text.size() / 3, max_tokens) + 4);
  split_added(text.data(), text.size(), 0, out, max_tokens);
  if (out.size() > max_tokens) out.resize(max_tokens);  // the last piece may pass it
  return out;
}

// Hugging Face's order: the added tokens with normalized=false are split out of the raw text (pass
// 0); each piece between them is normalized, then the added tokens with normalized=true are split
// out of it (pass 1); each piece left is pre-tokenized and merged. Without a normalizer the two
// passes still differ from one over all tokens: a normalized=false token inside a normalized=true
// one wins.
void BpeTokenizer::split_added(const char* s, size_t n, int pass, std::vector<int32_t>& out, size_t limit) const {
  auto text = [&](size_t begin, size_t end) {  // a piece between added tokens
    if (out.size() >= limit) return;
    if (pass == 1) return encode_segment(s + begin, end - begin, out, limit);
    if (!spec_.nfc) return split_added(s + begin, end - begin, 1, out, limit);
    std::string normal = utf8_nfc(std::string_view(s + begin, end - begin));
    split_added(normal.data(), normal.size(), 1, out, limit);
  };
  const AddedSet& set = added_[pass];
  size_t seg = 0;  // start of the text not yet encoded
  for (size_t i = 0; i < n && !set.by_len.empty() && out.size() < limit; i++) {
    if (set.only_first >= 0) {  // skip to the next possible start
      const void* p = std::memchr(s + i, set.only_first, n - i);
      if (!p) break;
      i = (const char*)p - s;
    } else if (!set.first[(uint8_t)s[i]]) {
      continue;
    }
    int k = match_added(set, s, n, i, seg);
    if (k < 0) continue;
    const BpeAddedToken& a = spec_.added[k];
    size_t begin = i, end = i + a.content.size();
    auto space_at = [&](size_t p) {
      int len;
      return uni_class_at((const uint8_t*)s, n, p, &len) == kUniSpace;
    };
    if (a.lstrip)
      while (begin > seg && space_at(begin - 1)) begin--;  // (multi-byte spaces stay in the text)
    if (a.rstrip)
      while (end < n && space_at(end)) {
        int len;
        uni_class_at((const uint8_t*)s, n, end, &len);
        end += len;
      }
    text(seg, begin);
    out.push_back(a.id);
    seg = end;
    i = end - 1;
  }
  text(seg, n);
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    LLMT_CHECK(id >= 0 && id < (int32_t)spec_.tokens.size(), "decode: token id %d is outside the vocabulary [0, %d)",
               id, (int)spec_.tokens.size());
    if (skip_special && is_special_[id]) continue;
    bytes += spec_.tokens[id];
  }
  return utf8_replace_invalid(bytes);
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(BpeSpec spec) { return std::make_unique<BpeTokenizer>(std::move(spec)); }

// ---- loaders: vocab.json + merges.txt, tokenizer.json ----

constexpr int64_t kIdSlack = 65536;  // ids allowed beyond a file's token count (holes, added tokens)

// vocab (byte-level strings -> ids) into spec.tokens; returns the string -> id map for the merges.
static std::unordered_map<std::string, int32_t> read_vocab(const nlohmann::json& vocab, const std::string& where,
                                                           BpeSpec& spec) {
  LLMT_CHECK(vocab.is_object(), "%s: the vocabulary must be a JSON object of token -> id", where.c_str());
  std::unordered_map<std::string, int32_t> ids;
  ids.reserve(vocab.size() * 2);
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    LLMT_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 && it.value().get<int64_t>() < INT_MAX,
               "%s: token \"%s\" has id %s, expected a non-negative integer", where.c_str(), it.key().c_str(),
               clip_for_message(it.value().dump()).c_str());
    int32_t id = it.value().get<int32_t>();
    ids[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  // Bound the id space by what the file holds before allocating it: one mistyped id (411891192 for
  // 41189) made llmt allocate 13 GB for half a minute, 10^9 ended in bad_alloc. Real vocabularies
  // are dense; the slack leaves room for holes and ids that added tokens fill.
  const int64_t id_limit = (int64_t)vocab.size() + kIdSlack;
  if (max_id >= id_limit) {
    for (auto& [key, id] : ids)
      LLMT_CHECK(id < id_limit, "%s: token \"%s\" has id %d, but the vocabulary holds %zu tokens: ids beyond %lld "
                 "cannot be right", where.c_str(), clip_for_message(key).c_str(), id, vocab.size(),
                 (long long)id_limit - 1);
  }
  spec.tokens.assign(max_id + 1, std::string());
  std::vector<uint8_t> seen(max_id + 1, 0);
  for (auto& [key, id] : ids) {
    LLMT_CHECK(!seen[id], "%s: id %d is given to two tokens (one is \"%s\")", where.c_str(), id, key.c_str());
    seen[id] = 1;
    // a key that is not byte-level text (it can only be an added token) decodes as its own UTF-8
    if (!bytelevel_to_bytes(key, &spec.tokens[id])) {
      spec.tokens[id] = key;
      spec.opaque_ids.push_back(id);
    }
  }
  return ids;
}

static void add_merge(BpeSpec& spec, const std::unordered_map<std::string, int32_t>& ids, const std::string& a,
                      const std::string& b, const std::string& where) {
  auto ia = ids.find(a), ib = ids.find(b), im = ids.find(a + b);
  LLMT_CHECK(ia != ids.end(), "%s: merge token \"%s\" is not in the vocabulary", where.c_str(), a.c_str());
  LLMT_CHECK(ib != ids.end(), "%s: merge token \"%s\" is not in the vocabulary", where.c_str(), b.c_str());
  LLMT_CHECK(im != ids.end(), "%s: the merged token \"%s\" is not in the vocabulary", where.c_str(), (a + b).c_str());
  spec.merges.push_back(BpeMerge{ia->second, ib->second, im->second, (int32_t)spec.merges.size()});
}

static void set_added(BpeSpec& spec, const BpeAddedToken& a, const std::string& where) {
  LLMT_CHECK(a.id < (int64_t)spec.tokens.size() + kIdSlack, "%s: added token \"%s\" has id %d, but the vocabulary "
             "holds %zu tokens", where.c_str(), clip_for_message(a.content).c_str(), a.id, spec.tokens.size());
  if (a.id >= (int32_t)spec.tokens.size()) spec.tokens.resize(a.id + 1);
  std::string bytes;
  if (spec.tokens[a.id].empty()) {
    // HF's ByteLevel decoder maps an added token's characters back to bytes when all are byte-level
    if (bytelevel_to_bytes(a.content, &bytes)) spec.tokens[a.id] = bytes;
    else spec.tokens[a.id] = a.content;
  }
  spec.opaque_ids.push_back(a.id);  // found in the text by its content, never by merging
  spec.added.push_back(a);
}

static int32_t added_id(const BpeSpec& spec, const std::string& content) {
  for (const BpeAddedToken& a : spec.added)
    if (a.content == content) return a.id;
  return -1;
}

std::unique_ptr<Tokenizer> load_bytelevel_bpe_files(const std::string& vocab_json, const std::string& merges_txt) {
  BpeSpec spec;
  spec.kind = "gpt2-bpe";
  nlohmann::json vocab = read_json(vocab_json, "vocabulary");
  auto ids = read_vocab(vocab, vocab_json, spec);
  std::string text = read_file(merges_txt, "merges file");
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    line_no++;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.compare(0, 8, "#version") == 0) continue;
    size_t sp = line.find(' ');
    LLMT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
               "%s line %zu: expected two tokens separated by one space, got \"%s\"", merges_txt.c_str(), line_no,
               line.c_str());
    add_merge(spec, ids, line.substr(0, sp), line.substr(sp + 1),
              strformat("%s line %zu", merges_txt.c_str(), line_no));
  }
  // GPT2TokenizerFast: unk = bos = eos = <|endoftext|>, split out of the text, nothing added
  auto eot = ids.find("<|endoftext|>");
  if (eot != ids.end()) {
    BpeAddedToken a;
    a.content = "<|endoftext|>";
    a.id = eot->second;
    set_added(spec, a, vocab_json);
    spec.bos_id = spec.eos_id = a.id;
  }
  return make_bpe_tokenizer(std::move(spec));
}

// Typed members of a tokenizer.json value, checked: a missing member or a wrong type is an error naming
// the file and the field ("model.merges", "added_tokens[3].special"), never nlohmann's own exception.
static const nlohmann::json& member(const nlohmann::json& obj, const char* key, const std::string& path,
                                    const std::string& where) {
  LLMT_CHECK(obj.is_object(), "%s: %s: expected an object, got %s", path.c_str(), where.c_str(),
             clip_for_message(obj.dump()).c_str());
  auto it = obj.find(key);
  LLMT_CHECK(it != obj.end(), "%s: %s: missing \"%s\"", path.c_str(), where.c_str(), key);
  return *it;
}

static const nlohmann::json& array_member(const nlohmann::json& obj, const char* key, const std::string& path,
                                          const std::string& where) {
  const nlohmann::json& v = member(obj, key, path, where);
  LLMT_CHECK(v.is_array(), "%s: %s.%s: expected an array, got %s", path.c_str(), where.c_str(), key,
             clip_for_message(v.dump()).c_str());
  return v;
}

static std::string string_member(const nlohmann::json& obj, const char* key, const std::string& path,
                                 const std::string& where) {
  const nlohmann::json& v = member(obj, key, path, where);
  LLMT_CHECK(v.is_string(), "%s: %s.%s: expected a string, got %s", path.c_str(), where.c_str(), key,
             clip_for_message(v.dump()).c_str());
  return v.get<std::string>();
}

// absent or null: `def`
static bool bool_member(const nlohmann::json& obj, const char* key, bool def, const std::string& path,
                        const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  LLMT_CHECK(it->is_boolean(), "%s: %s.%s: expected true or false, got %s", path.c_str(), where.c_str(), key,
             clip_for_message(it->dump()).c_str());
  return it->get<bool>();
}

static int32_t token_id(const nlohmann::json& v, const std::string& path, const std::string& where) {
  LLMT_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < INT_MAX,
             "%s: %s: expected a token id (a non-negative integer), got %s", path.c_str(), where.c_str(),
             clip_for_message(v.dump()).c_str());
  return (int32_t)v.get<int64_t>();
}

static std::string jtype(const nlohmann::json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

bool is_bytelevel_bpe_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("model") || jtype(j["model"]) != "BPE") return false;
  const nlohmann::json& m = j["model"];
  if (m.contains("byte_fallback") && m["byte_fallback"].is_boolean() && m["byte_fallback"].get<bool>()) return false;
  if (!j.contains("pre_tokenizer")) return false;
  const nlohmann::json& pt = j["pre_tokenizer"];
  if (jtype(pt) == "ByteLevel") return true;
  if (jtype(pt) == "Sequence" && pt.contains("pretokenizers") && pt["pretokenizers"].is_array())
    for (const auto& p : pt["pretokenizers"])
      if (jtype(p) == "ByteLevel") return true;
  return false;
}

std::unique_ptr<Tokenizer> load_bytelevel_bpe_json(const nlohmann::json& j, const std::string& path) {
  BpeSpec spec;
  spec.kind = "gpt2-bpe";
  try {
    const nlohmann::json& m = member(j, "model", path, "top level");
    LLMT_CHECK(jtype(m) == "BPE", "%s: model.type is \"%s\", expected \"BPE\"", path.c_str(), jtype(m).c_str());
    auto is_off = [&](const char* key, bool empty_string_ok) {
      if (!m.contains(key) || m[key].is_null()) return true;
      if (empty_string_ok && m[key].is_string() && m[key].get<std::string>().empty()) return true;
      if (m[key].is_number() && m[key].get<double>() == 0.0) return true;
      return m[key].is_boolean() && !m[key].get<bool>();
    };
    LLMT_CHECK(is_off("dropout", false), "%s: BPE dropout %s is not supported", path.c_str(), clip_for_message(m["dropout"].dump()).c_str());
    LLMT_CHECK(is_off("continuing_subword_prefix", true) && is_off("end_of_word_suffix", true),
               "%s: continuing_subword_prefix / end_of_word_suffix are not supported with byte-level BPE", path.c_str());
    spec.ignore_merges = m.contains("ignore_merges") && m["ignore_merges"].is_boolean() && m["ignore_merges"].get<bool>();
    auto ids = read_vocab(member(m, "vocab", path, "model"), path + " model.vocab", spec);
    const nlohmann::json& merges = array_member(m, "merges", path, "model");
    for (size_t k = 0; k < merges.size(); k++) {
      const nlohmann::json& e = merges[k];
      std::string where = strformat("%s model.merges[%zu]", path.c_str(), k);
      if (e.is_string()) {  // "a b"
        std::string s = e.get<std::string>();
        size_t sp = s.find(' ');
        LLMT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
                   "%s: expected two tokens separated by one space, got \"%s\"", where.c_str(), s.c_str());
        add_merge(spec, ids, s.substr(0, sp), s.substr(sp + 1), where);
      } else {  // ["a", "b"]
        LLMT_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                   "%s: expected \"a b\" or [\"a\", \"b\"], got %s", where.c_str(), clip_for_message(e.dump()).c_str());
        add_merge(spec, ids, e[0].get<std::string>(), e[1].get<std::string>(), where);
      }
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto u = ids.find(m["unk_token"].get<std::string>());
      if (u != ids.end()) spec.unk_id = u->second;
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      const nlohmann::json& list = j["added_tokens"];
      for (size_t k = 0; k < list.size(); k++) {
        const nlohmann::json& t = list[k];
        const std::string w = strformat("added_tokens[%zu]", k);
        BpeAddedToken a;
        a.id = token_id(member(t, "id", path, w), path, w + ".id");
        a.content = string_member(t, "content", path, w);
        a.special = bool_member(t, "special", false, path, w);
        a.lstrip = bool_member(t, "lstrip", false, path, w);
        a.rstrip = bool_member(t, "rstrip", false, path, w);
        a.single_word = bool_member(t, "single_word", false, path, w);
        a.normalized = bool_member(t, "normalized", !a.special, path, w);  // (HF's AddedToken default)
        set_added(spec, a, path);
      }
    }
    // normalizer: none, NFC (Qwen2), or a Sequence of NFCs
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const nlohmann::json& nz = j["normalizer"];
      std::vector<nlohmann::json> parts;
      if (jtype(nz) == "Sequence") {
        const nlohmann::json& list = array_member(nz, "normalizers", path, "normalizer");
        parts.assign(list.begin(), list.end());
      }
      else parts.push_back(nz);
      for (const auto& p : parts) {
        if (jtype(p) != "NFC")
          fail("%s: normalizer \"%s\" is not supported with byte-level BPE (llmt supports NFC)", path.c_str(),
               jtype(p).c_str());
        spec.nfc = true;
      }
    }
    // pre-tokenizer: ByteLevel(use_regex) alone, or Sequence[Split(regex, Isolated), ByteLevel(use_regex=false)]
    const nlohmann::json& pt = member(j, "pre_tokenizer", path, "top level");
    std::vector<nlohmann::json> steps;
    if (jtype(pt) == "Sequence") {
      const nlohmann::json& list = array_member(pt, "pretokenizers", path, "pre_tokenizer");
      steps.assign(list.begin(), list.end());
    }
    else steps.push_back(pt);
    bool have_split = false;
    for (const auto& p : steps) {
      std::string t = jtype(p);
      if (t == "Split") {
        LLMT_CHECK(!have_split, "%s: more than one Split pre-tokenizer is not supported", path.c_str());
        LLMT_CHECK(p.contains("pattern") && p["pattern"].contains("Regex"),
                   "%s: a Split pre-tokenizer needs a Regex pattern", path.c_str());
        const std::string behavior =
            p.contains("behavior") ? string_member(p, "behavior", path, "pre_tokenizer Split") : "Isolated";
        LLMT_CHECK(behavior == "Isolated" && !bool_member(p, "invert", false, path, "pre_tokenizer Split"),
                   "%s: only Split with behavior Isolated and invert false is supported", path.c_str());
        spec.pattern = pretok_pattern_from_regex(string_member(p["pattern"], "Regex", path, "pre_tokenizer Split.pattern"));
        have_split = true;
      } else if (t == "ByteLevel") {
        spec.add_prefix_space = bool_member(p, "add_prefix_space", false, path, "pre_tokenizer ByteLevel");
        bool use_regex = bool_member(p, "use_regex", true, path, "pre_tokenizer ByteLevel");
        LLMT_CHECK(!(use_regex && have_split), "%s: a Split followed by ByteLevel(use_regex=true) is not supported",
                   path.c_str());
        if (!have_split) spec.pattern = use_regex ? PretokPattern::kGpt2 : PretokPattern::kNone;
      } else {
        fail("%s: pre-tokenizer \"%s\" is not supported with byte-level BPE", path.c_str(), t.c_str());
      }
    }
    // specials the post-processor adds (TemplateProcessing, RobertaProcessing, or a Sequence of them)
    std::vector<nlohmann::json> posts;
    if (j.contains("post_processor") && !j["post_processor"].is_null()) {
      const nlohmann::json& pp = j["post_processor"];
      if (jtype(pp) == "Sequence") {
        const nlohmann::json& list = array_member(pp, "processors", path, "post_processor");
        posts.assign(list.begin(), list.end());
      }
      else posts.push_back(pp);
    }
    for (const auto& p : posts) {
      std::string t = jtype(p);
      if (t == "TemplateProcessing") {
        bool after = false;
        for (const auto& item : array_member(p, "single", path, "post_processor TemplateProcessing")) {
          if (item.contains("Sequence")) {
            after = true;
            continue;
          }
          const std::string w = "post_processor TemplateProcessing.single";
          std::string name = string_member(member(item, "SpecialToken", path, w), "id", path, w + ".SpecialToken");
          int32_t id = added_id(spec, name);
          if (p.contains("special_tokens") && p["special_tokens"].contains(name)) {
            const std::string ws = "post_processor TemplateProcessing.special_tokens." + name;
            const nlohmann::json& ids = array_member(p["special_tokens"][name], "ids", path, ws);
            LLMT_CHECK(!ids.empty(), "%s: %s.ids is empty", path.c_str(), ws.c_str());
            id = token_id(ids[0], path, ws + ".ids[0]");
          }
          LLMT_CHECK(id >= 0, "%s: post_processor names special token \"%s\", which is not an added token",
                     path.c_str(), name.c_str());
          if (!after) spec.bos_id = id, spec.add_bos = true;
          else spec.eos_id = id, spec.add_eos = true;
        }
      } else if (t == "RobertaProcessing" || t == "BertProcessing") {
        for (const char* key : {"cls", "sep"}) {  // ["<s>", 0]
          const nlohmann::json& pair = array_member(p, key, path, "post_processor " + t);
          LLMT_CHECK(pair.size() == 2, "%s: post_processor %s.%s: expected [token, id], got %s", path.c_str(),
                     t.c_str(), key, clip_for_message(pair.dump()).c_str());
          (key[0] == 'c' ? spec.bos_id : spec.eos_id) = token_id(pair[1], path, "post_processor " + t + "." + key);
        }
        spec.add_bos = spec.add_eos = true;
      } else if (t != "ByteLevel") {
        fail("%s: post-processor \"%s\" is not supported", path.c_str(), t.c_str());
      }
    }
    // BOS / EOS where no post-processor named them (tokenizer_config.json may still override)
    if (spec.bos_id < 0) spec.bos_id = added_id(spec, "<|begin_of_text|>");
    if (spec.eos_id < 0) spec.eos_id = added_id(spec, "<|end_of_text|>");
    if (spec.bos_id < 0) spec.bos_id = added_id(spec, "<|endoftext|>");
    if (spec.eos_id < 0) spec.eos_id = added_id(spec, "<|endoftext|>");
  } catch (const nlohmann::json::exception& e) {  // a net under the checked accesses above
    fail("%s: unexpected tokenizer.json layout: %s", path.c_str(), e.what());
  }
  return make_bpe_tokenizer(std::move(spec));
}

}  // namespace llmt
