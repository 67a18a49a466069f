// SentencePiece BPE (LLaMA-1/2) as Hugging Face's tokenizers library runs it. One engine, two loaders:
// - tokenizer.model: our own protobuf reader, then the pipeline transformers 5 builds for LlamaTokenizer
//   from it (kTransformers: no normalizer, Metaspace "▁" pre-tokenizer with prepend_scheme "first", BPE
//   whose merges are every split of every piece into two pieces ranked by the merged piece's id, byte
//   fallback), or the one of transformers 4's legacy tokenizer.json (kScoreMerges, the default: Prepend
//   "▁" + Replace normalizer, merges ranked by piece score; the sentencepiece library's ids on LLaMA-2).
// - tokenizer.json: the pipeline the file describes (legacy Prepend+Replace normalizer or Metaspace;
//   Gemma's Replace normalizer with Split(" ", MergedWithPrevious) and no "▁" put in front).
// Encoding: special tokens in the raw text are split out first; each remaining segment is normalized,
// "▁"-prefixed and BPE-merged as one word (lowest merge rank first, leftmost on ties). Decoding runs the
// decoder steps (LLaMA: Replace "▁"->" ", ByteFallback, Fuse, Strip one leading space).
// docs/tokenizers.md ("SentencePiece") lists what is matched and where the sentencepiece library differs.
#include "data/sentencepiece.h"

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/protobuf_reader.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"

namespace llmt {
namespace {

const char* const kMetaspace = "\xe2\x96\x81";  // "▁" U+2581, SentencePiece's visible space

// ---------------------------------------------------------------------------------------------
// UTF-8

int utf8_length(std::string_view s) {  // code points in valid UTF-8
  int n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

void replace_all(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty() || s->find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s->size() + s->size() / 2);
  size_t pos = 0;
  for (size_t at; (at = s->find(from, pos)) != std::string::npos; pos = at + from.size()) {
    out.append(*s, pos, at - pos);
    out.append(to);
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

// ---------------------------------------------------------------------------------------------
// The tokenizer

enum Prepend { kPrependNever, kPrependFirst, kPrependAlways };

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;     // skipped by decode(skip_special=true)
  bool normalized;  // matched in the normalized text instead of the raw text
};

struct NormalizerStep {  // tokenizers' Prepend (prepend non-empty text with `a`) or Replace (a -> b)
  bool prepend;
  std::string a, b;
};

struct DecoderStep {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string a, b;          // Replace a -> b; Strip/Metaspace: a = the character
  int start = 0, stop = 0;   // Strip: characters removed at the start and at the end of each token
  Prepend prepend = kPrependAlways;  // Metaspace
};

struct MergeRule {
  uint32_t rank;  // lower merges first
  int32_t id;     // the merged piece
};

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

// (left id, right id) -> MergeRule: open addressing in one flat array (std::unordered_map's node
// lookups were 60% of encoding time).
class MergeMap {
 public:
  void insert(int32_t left, int32_t right, MergeRule rule) {  // replaces an existing rule, as tokenizers does
    if ((size_ + 1) * 2 > slots_.size()) grow();
    Slot* s = probe(pair_key(left, right));
    if (s->key == kEmpty) s->key = pair_key(left, right), size_++;
    s->rule = rule;
  }
  const MergeRule* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const Slot* s = probe(pair_key(left, right));
    return s->key == kEmpty ? nullptr : &s->rule;
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;  // ids are below 2^30, so no pair has this key
  struct Slot {
    uint64_t key;
    MergeRule rule;
  };
  Slot* probe(uint64_t key) const {
    size_t mask = slots_.size() - 1;
    size_t i = (size_t)((key * 0x9e3779b97f4a7c15ull) >> shift_);  // the product's top bits
    while (slots_[i].key != key && slots_[i].key != kEmpty) i = (i + 1) & mask;
    return const_cast<Slot*>(&slots_[i]);
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{kEmpty, {0, 0}});
    shift_ = 64;
    for (size_t n = slots_.size(); n > 1; n >>= 1) shift_--;
    for (const Slot& s : old) {
      if (s.key != kEmpty) *probe(s.key) = s;
    }
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
  int shift_ = 64;
};

struct Symbol {  // one piece of a word being merged, in a doubly linked list
  int32_t id;
  int32_t prev, next;
  bool alive;
};

struct Candidate {  // a pair of adjacent symbols that a merge rule joins
  uint32_t rank;
  int32_t pos;          // the left symbol
  int32_t left, right;  // the pair's ids when pushed: it is stale once either symbol has changed
  int32_t id;           // the merged piece
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

class SentencePieceBpe final : public Tokenizer {
 public:
  // Filled by the loaders, then finish() builds the lookup tables.
  std::string path;                                 // for error messages
  std::vector<std::string> tokens;                  // id -> text for decoding ("" where no token)
  std::vector<uint8_t> has_token, special;          // id -> defined; special added token
  std::unordered_map<std::string, int32_t> vocab;   // the BPE model's pieces
  MergeMap merges;
  bool byte_fallback = true, fuse_unk = true, ignore_merges = false;
  int32_t unk = -1;                                 // the BPE model's unknown piece, -1: none (chars dropped)
  std::vector<AddedToken> added;
  std::vector<NormalizerStep> normalizer;
  bool metaspace = false;                           // the Metaspace pre-tokenizer
  std::string replacement = kMetaspace;
  Prepend prepend = kPrependFirst;
  bool split = false;                               // Metaspace split: one word per "▁"
  bool split_after_space = false;                   // Split(" ", MergedWithPrevious) (Gemma): words end at " "
  bool has_decoder = true;
  std::vector<DecoderStep> decoder;
  int32_t bos = -1, eos = -1;
  bool add_bos = false, add_eos = false;

  void finish() {
    for (int i = 0; i < 256; i++) {
      auto it = vocab.find(strformat("<0x%02X>", i));
      byte_ids_[i] = it == vocab.end() ? -1 : it->second;
    }
    for (int i = 0; i < 128; i++) ascii_ids_[i] = -1;
    for (const auto& kv : vocab) {
      uint32_t cp;
      int bad;
      const std::string& s = kv.first;
      if (s.empty() || utf8_decode((const unsigned char*)s.data(), s.size(), &cp, &bad) != (int)s.size()) continue;
      if (cp < 128) ascii_ids_[cp] = kv.second;
      else char_ids_[cp] = kv.second;
    }
    for (int i = 0; i < 256; i++) raw_first_[i] = norm_first_[i] = false;
    for (const AddedToken& t : added) {
      if (t.content.empty()) continue;
      (t.normalized ? norm_first_ : raw_first_)[(unsigned char)t.content[0]] = true;
      (t.normalized ? has_norm_added_ : has_raw_added_) = true;
    }
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::string fixed;
    if (!valid_utf8(text)) {
      fixed = utf8_replace_invalid(text);
      text = fixed;
    }
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    Scratch scratch;
    // 1. Added tokens that match the raw text (LLaMA: <unk>, <s>, </s>) split the text into segments.
    size_t pos = 0;
    while (pos < text.size()) {
      size_t at = text.size(), len = 0;
      int32_t id = has_raw_added_ ? find_added(text, pos, false, &at, &len) : -1;
      if (at > pos) encode_segment(text.substr(pos, at - pos), pos == 0, &scratch, &out);
      if (id < 0) break;
      out.push_back(id);
      pos = at + len;
    }
    return out;
  }

  std::string token_bytes(int32_t id) const override {
    if (id < 0 || id >= (int32_t)tokens.size()) return "";
    const std::string& t = tokens[(size_t)id];
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>')
      return std::string(1, (char)std::strtol(t.substr(3, 2).c_str(), nullptr, 16));
    std::string out;
    for (size_t i = 0; i < t.size();) {
      if (t.compare(i, 3, "\xE2\x96\x81") == 0) out += ' ', i += 3;
      else out += t[i++];
    }
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::vector<std::string> toks;
    toks.reserve(ids.size());
    for (int32_t id : ids) {
      LLMT_CHECK(id >= 0 && id < (int32_t)tokens.size() && has_token[(size_t)id],
                 "%s: cannot decode token id %d: not in the vocabulary (%zu ids)", path.c_str(), (int)id,
                 tokens.size());
      if (skip_special && special[(size_t)id]) continue;
      toks.push_back(tokens[(size_t)id]);
    }
    if (!has_decoder) {  // tokenizers joins the tokens with spaces when there is no decoder
      std::string out;
      for (size_t i = 0; i < toks.size(); i++) out += (i ? " " : "") + toks[i];
      return out;
    }
    for (const DecoderStep& step : decoder) run_decoder_step(step, &toks);
    std::string out;
    for (const std::string& t : toks) out += t;
    return out;
  }

  int vocab_size() const override { return (int)tokens.size(); }
  int bos_id() const override { return bos; }
  int eos_id() const override { return eos; }
  bool adds_bos() const override { return add_bos; }
  bool adds_eos() const override { return add_eos; }
  std::string kind() const override { return kind_name; }
  // tells the flavors apart (for the token cache's key): the same file tokenizes differently in each
  std::string kind_name = "sentencepiece-bpe";

 private:
  struct Scratch {  // buffers reused across the words of one encode() call
    std::string text;
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  int32_t byte_ids_[256];
  int32_t ascii_ids_[128];
  std::unordered_map<uint32_t, int32_t> char_ids_;  // single-code-point pieces above ASCII
  bool raw_first_[256], norm_first_[256];            // first bytes of the added tokens
  bool has_raw_added_ = false, has_norm_added_ = false;

  // The leftmost, then longest, added token (of the raw or the normalized kind) in text[pos, ...):
  // its id, offset and length; -1 when none.
  int32_t find_added(std::string_view text, size_t pos, bool normalized, size_t* at, size_t* len) const {
    const bool* first = normalized ? norm_first_ : raw_first_;
    for (size_t i = pos; i < text.size(); i++) {
      if (!first[(unsigned char)text[i]]) continue;
      int32_t best = -1;
      size_t best_len = 0;
      for (const AddedToken& t : added) {
        if (t.normalized != normalized || t.content.size() <= best_len) continue;
        if (text.compare(i, t.content.size(), t.content) == 0) best = t.id, best_len = t.content.size();
      }
      if (best >= 0) {
        *at = i, *len = best_len;
        return best;
      }
    }
    return -1;
  }

  // A segment between added tokens: normalizer, added tokens of the normalized kind, pre-tokenizer, BPE.
  // `at_start`: the segment begins the text (Metaspace prepend_scheme "first").
  void encode_segment(std::string_view seg, bool at_start, Scratch* s, std::vector<int32_t>* out) const {
    if (normalizer.empty() && !has_norm_added_) {
      pretokenize(seg, at_start, s, out);
      return;
    }
    std::string norm(seg);
    for (const NormalizerStep& step : normalizer) {
      if (step.prepend) {
        if (!norm.empty()) norm.insert(0, step.a);
      } else {
        replace_all(&norm, step.a, step.b);
      }
    }
    std::string_view text = norm;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t at = text.size(), len = 0;
      int32_t id = has_norm_added_ ? find_added(text, pos, true, &at, &len) : -1;
      if (at > pos) pretokenize(text.substr(pos, at - pos), at_start && pos == 0, s, out);
      if (id < 0) break;
      out->push_back(id);
      pos = at + len;
    }
  }

  // Metaspace: spaces become "▁", a "▁" is prepended (scheme), optionally split before each "▁".
  void pretokenize(std::string_view seg, bool at_start, Scratch* s, std::vector<int32_t>* out) const {
    if (seg.empty()) return;
    if (split_after_space) {  // each word runs up to and including a " " (after Gemma's normalizer, none is left)
      size_t begin = 0;
      for (size_t at = seg.find(' '); at != std::string_view::npos; at = seg.find(' ', begin)) {
        bpe(seg.substr(begin, at + 1 - begin), s, out);
        begin = at + 1;
      }
      if (begin < seg.size()) bpe(seg.substr(begin), s, out);
      return;
    }
    if (!metaspace) {
      bpe(seg, s, out);
      return;
    }
    std::string& t = s->text;
    t.clear();
    bool pre = (prepend == kPrependAlways || (prepend == kPrependFirst && at_start));
    if (pre && !(seg[0] == ' ' || starts_with(seg, replacement))) t = replacement;
    for (char c : seg) {
      if (c == ' ') t += replacement;
      else t += c;
    }
    if (!split) {
      bpe(t, s, out);  // bpe() uses the other scratch buffers only
      return;
    }
    // tokenizers' split(replacement, MergedWithNext): each "▁" starts a new word
    std::string_view text = t;
    size_t begin = 0;
    for (size_t at = text.find(replacement, 1); at != std::string::npos; at = text.find(replacement, at + 1)) {
      bpe(text.substr(begin, at - begin), s, out);
      begin = at;
    }
    bpe(text.substr(begin), s, out);
  }

  // One word: characters (or their UTF-8 bytes as <0xXX> pieces) merged pair by pair.
  void bpe(std::string_view word, Scratch* s, std::vector<int32_t>* out) const {
    if (word.empty()) return;
    if (ignore_merges) {
      auto it = vocab.find(std::string(word));
      if (it != vocab.end()) {
        out->push_back(it->second);
        return;
      }
    }
    std::vector<Symbol>& sym = s->symbols;
    sym.clear();
    auto add = [&sym](int32_t id) { sym.push_back({id, (int32_t)sym.size() - 1, (int32_t)sym.size() + 1, true}); };
    const unsigned char* p = (const unsigned char*)word.data();
    bool pending_unk = false;  // tokenizers adds an unknown piece lazily, fusing runs of them
    for (size_t i = 0; i < word.size();) {
      uint32_t cp = 0;
      int bad;
      int len = utf8_decode(p + i, word.size() - i, &cp, &bad);  // valid: the text was repaired
      int32_t id = cp < 128 ? ascii_ids_[cp] : -1;
      if (cp >= 128) {
        auto it = char_ids_.find(cp);
        if (it != char_ids_.end()) id = it->second;
      }
      if (id >= 0) {
        if (pending_unk) add(unk), pending_unk = false;
        add(id);
      } else {
        bool bytes_ok = byte_fallback;
        for (int k = 0; k < len && bytes_ok; k++) bytes_ok = byte_ids_[p[i + (size_t)k]] >= 0;
        if (bytes_ok) {
          for (int k = 0; k < len; k++) add(byte_ids_[p[i + (size_t)k]]);
        } else if (unk >= 0) {
          if (pending_unk && !fuse_unk) add(unk);
          pending_unk = true;
        }
      }
      i += (size_t)len;
    }
    if (pending_unk) add(unk);
    if (sym.empty()) return;
    sym.back().next = -1;

    // Merge the lowest-ranked pair, leftmost first, until no pair has a rule (tokenizers' Word::merge_all).
    std::vector<Candidate>& heap = s->heap;
    heap.clear();
    auto push = [&](int32_t pos) {
      int32_t next = sym[(size_t)pos].next;
      if (next < 0) return;
      int32_t left = sym[(size_t)pos].id, right = sym[(size_t)next].id;
      const MergeRule* rule = merges.find(left, right);
      if (!rule) return;
      heap.push_back({rule->rank, pos, left, right, rule->id});
      std::push_heap(heap.begin(), heap.end(), std::greater<Candidate>());
    };
    for (int32_t i = 0; i + 1 < (int32_t)sym.size(); i++) push(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<Candidate>());
      Candidate c = heap.back();
      heap.pop_back();
      Symbol& left = sym[(size_t)c.pos];
      // Stale: a symbol changed since the push. (A changed symbol is a longer string, so it has another
      // id; this is tokenizers' check that the pair still merges into the same piece.)
      if (!left.alive || left.next < 0 || left.id != c.left || sym[(size_t)left.next].id != c.right) continue;
      Symbol& right = sym[(size_t)left.next];
      left.id = c.id;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) sym[(size_t)right.next].prev = c.pos;
      if (left.prev >= 0) push(left.prev);
      push(c.pos);
    }
    for (int32_t i = 0; i >= 0; i = sym[(size_t)i].next) out->push_back(sym[(size_t)i].id);
  }

  static void run_decoder_step(const DecoderStep& step, std::vector<std::string>* toks) {
    switch (step.kind) {
      case DecoderStep::kReplace:
        for (std::string& t : *toks) replace_all(&t, step.a, step.b);
        break;
      case DecoderStep::kByteFallback: {
        // Runs of <0xXX> tokens become their bytes when those form valid UTF-8, else one U+FFFD per byte.
        std::vector<std::string> res;
        std::string bytes;
        int nbytes = 0;
        auto flush = [&]() {
          if (nbytes == 0) return;
          if (valid_utf8(bytes)) {
            res.push_back(bytes);
          } else {
            for (int k = 0; k < nbytes; k++) res.push_back("\xef\xbf\xbd");
          }
          bytes.clear();
          nbytes = 0;
        };
        for (std::string& t : *toks) {
          int hi, lo;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && (hi = hex_digit(t[3])) >= 0 &&
              (lo = hex_digit(t[4])) >= 0) {
            bytes += (char)(hi * 16 + lo);
            nbytes++;
          } else {
            flush();
            res.push_back(std::move(t));
          }
        }
        flush();
        *toks = std::move(res);
        break;
      }
      case DecoderStep::kFuse: {
        std::string all;
        for (const std::string& t : *toks) all += t;
        toks->assign(1, std::move(all));
        break;
      }
      case DecoderStep::kStrip:
        for (std::string& t : *toks) strip(&t, step.a, step.start, step.stop);
        break;
      case DecoderStep::kMetaspace:
        // "▁" -> " ", except that the first token loses its "▁"s (unless the scheme is "never").
        for (size_t i = 0; i < toks->size(); i++) {
          replace_all(&(*toks)[i], step.a, i == 0 && step.prepend != kPrependNever ? "" : " ");
        }
        break;
    }
  }

  static int hex_digit(char c) {  // Rust's from_str_radix(.., 16): either case
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // tokenizers' Strip: up to `start` leading and `stop` trailing copies of the character `ch`.
  static void strip(std::string* t, const std::string& ch, int start, int stop) {
    size_t b = 0, e = t->size();
    for (int k = 0; k < start && e - b >= ch.size() && t->compare(b, ch.size(), ch) == 0; k++) b += ch.size();
    for (int k = 0; k < stop && e - b >= ch.size() && t->compare(e - ch.size(), ch.size(), ch) == 0; k++) {
      e -= ch.size();
    }
    *t = t->substr(b, e - b);
  }
};

// ---------------------------------------------------------------------------------------------
// Shared by both loaders

// Defines token `id` as `text` (growing the id space as needed).
void set_token(SentencePieceBpe* tk, int32_t id, const std::string& text) {
  if ((size_t)id >= tk->tokens.size()) {
    tk->tokens.resize((size_t)id + 1);
    tk->has_token.resize((size_t)id + 1, 0);
    tk->special.resize((size_t)id + 1, 0);
  }
  tk->tokens[(size_t)id] = text;
  tk->has_token[(size_t)id] = 1;
}

// The decoder transformers attaches to LLaMA: Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0).
std::vector<DecoderStep> llama_decoder(bool strip_leading_space) {
  std::vector<DecoderStep> d(3);
  d[0].kind = DecoderStep::kReplace, d[0].a = kMetaspace, d[0].b = " ";
  d[1].kind = DecoderStep::kByteFallback;
  d[2].kind = DecoderStep::kFuse;
  if (strip_leading_space) {
    DecoderStep s;
    s.kind = DecoderStep::kStrip, s.a = " ", s.start = 1, s.stop = 0;
    d.push_back(s);
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// tokenizer.model (sentencepiece.ModelProto; field numbers from sentencepiece_model.proto)

enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct ModelProto {
  struct Piece {
    std::string text;
    float score = 0.0f;
    int type = kNormal;
  };
  std::vector<Piece> pieces;
  bool has_trainer_spec = false;
  int model_type = 1;  // UNIGRAM=1 BPE=2 WORD=3 CHAR=4
  bool byte_fallback = false, treat_whitespace_as_suffix = false;
  int unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  std::string normalizer_name;
  size_t charsmap_size = 0;
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

int32_t as_int32(uint64_t v) { return (int32_t)(uint32_t)v; }  // protobuf int32: two's complement varint

ModelProto parse_model_proto(const std::string& data, const std::string& path) {
  ModelProto m;
  ProtoReader r((const uint8_t*)data.data(), data.size(), path);
  uint32_t field, wire;
  while (r.next(&field, &wire)) {
    if (field == 1) {  // repeated SentencePiece pieces
      r.expect(field, wire, kWireBytes, "pieces");
      ProtoReader pr = r.message(strformat("%s: piece %zu", path.c_str(), m.pieces.size()));
      ModelProto::Piece piece;
      bool has_text = false;
      while (pr.next(&field, &wire)) {
        if (field == 1) {
          pr.expect(field, wire, kWireBytes, "piece");
          piece.text = std::string(pr.bytes());
          has_text = true;
        } else if (field == 2) {
          pr.expect(field, wire, kWireFixed32, "score");
          piece.score = pr.float32();
        } else if (field == 3) {
          pr.expect(field, wire, kWireVarint, "type");
          piece.type = as_int32(pr.varint());
        } else {
          pr.skip(wire);
        }
      }
      LLMT_CHECK(has_text && !piece.text.empty(), "%s: has no piece text (expected a non-empty string)",
                 pr.what().c_str());
      LLMT_CHECK(valid_utf8(piece.text), "%s: piece text is not valid UTF-8", pr.what().c_str());
      LLMT_CHECK(piece.type >= kNormal && piece.type <= kByte, "%s (\"%s\"): unknown piece type %d (expected 1..6)",
                 pr.what().c_str(), piece.text.c_str(), piece.type);
      m.pieces.push_back(std::move(piece));
    } else if (field == 2) {  // TrainerSpec trainer_spec
      r.expect(field, wire, kWireBytes, "trainer_spec");
      ProtoReader tr = r.message(path + ": trainer_spec");
      m.has_trainer_spec = true;
      while (tr.next(&field, &wire)) {
        int* int_field = field == 3 ? &m.model_type : field == 40 ? &m.unk_id : field == 41 ? &m.bos_id
                         : field == 42 ? &m.eos_id : field == 43 ? &m.pad_id : nullptr;
        bool* bool_field = field == 35 ? &m.byte_fallback : field == 24 ? &m.treat_whitespace_as_suffix : nullptr;
        if (int_field) {
          tr.expect(field, wire, kWireVarint, "an int32 field");
          *int_field = as_int32(tr.varint());
        } else if (bool_field) {
          tr.expect(field, wire, kWireVarint, "a bool field");
          *bool_field = tr.varint() != 0;
        } else {
          tr.skip(wire);
        }
      }
    } else if (field == 3) {  // NormalizerSpec normalizer_spec
      r.expect(field, wire, kWireBytes, "normalizer_spec");
      ProtoReader nr = r.message(path + ": normalizer_spec");
      while (nr.next(&field, &wire)) {
        bool* bool_field = field == 3 ? &m.add_dummy_prefix : field == 4 ? &m.remove_extra_whitespaces
                           : field == 5 ? &m.escape_whitespaces : nullptr;
        if (field == 1 || field == 2) {
          nr.expect(field, wire, kWireBytes, field == 1 ? "name" : "precompiled_charsmap");
          std::string_view v = nr.bytes();
          if (field == 1) m.normalizer_name = std::string(v);
          else m.charsmap_size = v.size();
        } else if (bool_field) {
          nr.expect(field, wire, kWireVarint, "a bool field");
          *bool_field = nr.varint() != 0;
        } else {
          nr.skip(wire);
        }
      }
    } else {
      r.skip(wire);  // self_test_data, denormalizer_spec (decoding needs neither), unknown fields
    }
  }
  return m;
}

}  // namespace

bool is_sentencepiece_model_file(const std::string& path) {
  try {
    std::string data = read_file(path, "SentencePiece model file");
    ModelProto m = parse_model_proto(data, path);
    return !m.pieces.empty() && m.has_trainer_spec;
  } catch (const Error&) {
    return false;
  }
}

std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path) {
  return load_sentencepiece_model(path, SentencePieceFlavor::kScoreMerges);
}

std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path, SentencePieceFlavor flavor) {
  std::string data = read_file(path, "SentencePiece model file");
  LLMT_CHECK(!data.empty(), "%s: empty file (expected a SentencePiece ModelProto)", path.c_str());
  ModelProto m = parse_model_proto(data, path);
  const char* p = path.c_str();
  int n = (int)m.pieces.size();
  LLMT_CHECK(n > 0, "%s: no pieces (not a SentencePiece model, or truncated)", p);
  LLMT_CHECK(m.has_trainer_spec, "%s: no trainer_spec (not a SentencePiece model, or truncated)", p);
  LLMT_CHECK(m.model_type == 2, "%s: model_type %d; only BPE (2) SentencePiece models are supported "
             "(1 = unigram, 3 = word, 4 = char)", p, m.model_type);
  // transformers' LlamaTokenizer ignores the normalizer spec; we refuse the settings under which that
  // (and so our ids) would differ from the model's own tokenization instead of tokenizing differently.
  LLMT_CHECK(m.charsmap_size == 0 && !m.remove_extra_whitespaces && m.escape_whitespaces &&
             !m.treat_whitespace_as_suffix,
             "%s: unsupported SentencePiece normalization (normalizer '%s': precompiled_charsmap of %zu bytes, "
             "remove_extra_whitespaces %d, escape_whitespaces %d, treat_whitespace_as_suffix %d); expected the "
             "LLaMA settings (identity, 0 bytes, 0, 1, 0): use the model's tokenizer.json instead", p,
             m.normalizer_name.c_str(), m.charsmap_size, (int)m.remove_extra_whitespaces,
             (int)m.escape_whitespaces, (int)m.treat_whitespace_as_suffix);
  auto check_id = [&](int id, const char* name, bool optional) {
    LLMT_CHECK((optional && id == -1) || (id >= 0 && id < n), "%s: trainer_spec %s %d is outside the %d pieces",
               p, name, id, n);
  };
  check_id(m.unk_id, "unk_id", false);
  check_id(m.bos_id, "bos_id", true);
  check_id(m.eos_id, "eos_id", true);
  LLMT_CHECK(m.pieces[(size_t)m.unk_id].type == kUnknown, "%s: unk_id %d is piece \"%s\" of type %d, expected "
             "the UNKNOWN type (2)", p, m.unk_id, m.pieces[(size_t)m.unk_id].text.c_str(),
             m.pieces[(size_t)m.unk_id].type);

  auto tk = std::make_unique<SentencePieceBpe>();
  tk->path = path;
  for (int i = 0; i < n; i++) {
    const ModelProto::Piece& piece = m.pieces[(size_t)i];
    auto ins = tk->vocab.emplace(piece.text, i);
    LLMT_CHECK(ins.second, "%s: piece %d \"%s\" duplicates piece %d", p, i, piece.text.c_str(), ins.first->second);
    set_token(tk.get(), i, piece.text);
    // Unknown and control pieces are special tokens, user-defined pieces plain added tokens; all of them
    // are matched in the raw text (transformers: AddedToken(normalized=False)).
    if (piece.type == kUnknown || piece.type == kControl || piece.type == kUserDefined) {
      bool special = piece.type != kUserDefined;
      tk->added.push_back({piece.text, i, special, false});
      tk->special[(size_t)i] = special;
    }
  }
  // The merges transformers derives (generate_merges): every split of every piece into two pieces.
  // kTransformers ranks them by the merged piece's id, then by the left part's length in characters:
  // the order in which the loops below meet them. kScoreMerges ranks them by the merged piece's score
  // (highest first), then longer left part, longer right part, then that order (a stable sort).
  struct Split {
    int32_t left, right, id;
    int len_left, len_right;
  };
  std::vector<Split> splits;
  for (int i = 0; i < n; i++) {
    const std::string& s = m.pieces[(size_t)i].text;
    for (size_t cut = 1; cut < s.size(); cut++) {
      if (((unsigned char)s[cut] & 0xc0) == 0x80) continue;  // not a character boundary
      auto l = tk->vocab.find(s.substr(0, cut));
      if (l == tk->vocab.end()) continue;
      auto r = tk->vocab.find(s.substr(cut));
      if (r == tk->vocab.end()) continue;
      splits.push_back({l->second, r->second, i, utf8_length(l->first), utf8_length(r->first)});
    }
  }
  if (flavor == SentencePieceFlavor::kScoreMerges) {
    std::stable_sort(splits.begin(), splits.end(), [&m](const Split& a, const Split& b) {
      float sa = m.pieces[(size_t)a.id].score, sb = m.pieces[(size_t)b.id].score;
      if (sa != sb) return sa > sb;
      if (a.len_left != b.len_left) return a.len_left > b.len_left;
      return a.len_right > b.len_right;
    });
  }
  for (size_t k = 0; k < splits.size(); k++) {
    tk->merges.insert(splits[k].left, splits[k].right, {(uint32_t)k, splits[k].id});
  }
  tk->byte_fallback = m.byte_fallback;
  tk->unk = m.unk_id;  // (transformers sets none and drops such characters; SentencePiece emits <unk>)
  if (flavor == SentencePieceFlavor::kTransformers) {
    tk->kind_name = "sentencepiece-bpe (transformers 5 merge order)";
    tk->metaspace = true;
    tk->prepend = m.add_dummy_prefix ? kPrependFirst : kPrependNever;
    tk->split = false;
  } else {
    if (m.add_dummy_prefix) tk->normalizer.push_back({true, kMetaspace, ""});
    tk->normalizer.push_back({false, " ", kMetaspace});
  }
  tk->decoder = llama_decoder(m.add_dummy_prefix);
  tk->bos = m.bos_id;
  tk->eos = m.eos_id;
  tk->add_bos = m.bos_id >= 0;  // LLaMA: BOS, no EOS (transformers' add_bos_token=True, add_eos_token=False)
  tk->add_eos = false;
  tk->finish();
  return tk;
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json

namespace {

struct JsonCtx {
  const std::string& path;
  [[noreturn]] void bad(const std::string& where, const std::string& msg) const {
    fail("%s: %s: %s", path.c_str(), where.c_str(), msg.c_str());
  }
  const nlohmann::json& member(const nlohmann::json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) bad(where, strformat("expected an object, got %s", obj.type_name()));
    auto it = obj.find(key);
    if (it == obj.end()) bad(where, strformat("missing \"%s\"", key));
    return *it;
  }
  std::string str(const nlohmann::json& obj, const char* key, const std::string& where) const {
    const nlohmann::json& v = member(obj, key, where);
    if (!v.is_string()) bad(where + "." + key, strformat("expected a string, got %s", v.type_name()));
    return v.get<std::string>();
  }
  // An optional boolean (absent or null: `def`).
  bool flag(const nlohmann::json& obj, const char* key, bool def, const std::string& where) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return def;
    if (!it->is_boolean()) bad(where + "." + key, strformat("expected a boolean, got %s", it->type_name()));
    return it->get<bool>();
  }
  int32_t id(const nlohmann::json& v, const std::string& where) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= (1 << 30)) {
      bad(where, strformat("expected a token id (an integer in [0, 2^30)), got %s", clip_for_message(v.dump()).c_str()));
    }
    return (int32_t)v.get<int64_t>();
  }
  std::string type(const nlohmann::json& obj, const std::string& where) const { return str(obj, "type", where); }
};

// Replace's pattern: {"String": s} (a Regex pattern is not supported).
std::string replace_pattern(const JsonCtx& c, const nlohmann::json& obj, const std::string& where) {
  const nlohmann::json& pat = c.member(obj, "pattern", where);
  if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string()) {
    c.bad(where + ".pattern", "expected {\"String\": ...} (Regex patterns are not supported)");
  }
  return pat["String"].get<std::string>();
}

std::string one_char(const JsonCtx& c, const nlohmann::json& obj, const char* key, const std::string& where) {
  std::string s = c.str(obj, key, where);
  if (!valid_utf8(s) || utf8_length(s) != 1) c.bad(where + "." + key, "expected one character");
  return s;
}

// Metaspace's prepend scheme, from prepend_scheme or the older add_prefix_space.
Prepend prepend_scheme(const JsonCtx& c, const nlohmann::json& obj, const std::string& where) {
  Prepend scheme = kPrependAlways;
  if (obj.contains("prepend_scheme") && !obj["prepend_scheme"].is_null()) {
    std::string s = c.str(obj, "prepend_scheme", where);
    if (s == "always") scheme = kPrependAlways;
    else if (s == "first") scheme = kPrependFirst;
    else if (s == "never") scheme = kPrependNever;
    else c.bad(where + ".prepend_scheme", "expected \"always\", \"first\" or \"never\", got \"" + s + "\"");
  }
  if (!c.flag(obj, "add_prefix_space", true, where)) scheme = kPrependNever;
  return scheme;
}

void parse_normalizer(const JsonCtx& c, const nlohmann::json& n, const std::string& where, SentencePieceBpe* tk) {
  if (n.is_null()) return;
  std::string t = c.type(n, where);
  if (t == "Sequence") {
    const nlohmann::json& list = c.member(n, "normalizers", where);
    if (!list.is_array()) c.bad(where + ".normalizers", "expected an array");
    for (size_t i = 0; i < list.size(); i++) parse_normalizer(c, list[i], strformat("%s.normalizers[%zu]", where.c_str(), i), tk);
  } else if (t == "Prepend") {
    tk->normalizer.push_back({true, c.str(n, "prepend", where), ""});
  } else if (t == "Replace") {
    tk->normalizer.push_back({false, replace_pattern(c, n, where), c.str(n, "content", where)});
  } else {
    c.bad(where, "unsupported normalizer type \"" + t + "\" (supported: Sequence, Prepend, Replace)");
  }
}

void parse_pre_tokenizer(const JsonCtx& c, const nlohmann::json& pt, const std::string& where, SentencePieceBpe* tk) {
  if (pt.is_null()) return;
  std::string t = c.type(pt, where);
  if (t == "Sequence") {
    const nlohmann::json& list = c.member(pt, "pretokenizers", where);
    if (!list.is_array()) c.bad(where + ".pretokenizers", "expected an array");
    if (list.size() > 1) c.bad(where, "expected at most one pre-tokenizer (Metaspace, or Gemma's Split)");
    for (size_t i = 0; i < list.size(); i++) parse_pre_tokenizer(c, list[i], where + ".pretokenizers[0]", tk);
  } else if (t == "Split") {
    // Gemma's: Split(" ", MergedWithPrevious, invert false), the only Split a SentencePiece-style file has
    const nlohmann::json& pat = c.member(pt, "pattern", where);
    const std::string behavior = c.str(pt, "behavior", where);
    if (!pat.is_object() || !pat.contains("String") || !pat["String"].is_string() || pat["String"] != " " ||
        behavior != "MergedWithPrevious" || c.flag(pt, "invert", false, where)) {
      c.bad(where, "unsupported Split pre-tokenizer (pattern " + clip_for_message(pat.dump()) + ", behavior \"" +
                       behavior + "\"): a SentencePiece-style tokenizer.json may split only as Gemma's does, "
                       "{\"String\": \" \"} with behavior \"MergedWithPrevious\" and invert false");
    }
    tk->split_after_space = true;
  } else if (t == "Metaspace") {
    tk->metaspace = true;
    tk->replacement = one_char(c, pt, "replacement", where);
    tk->prepend = prepend_scheme(c, pt, where);
    tk->split = c.flag(pt, "split", true, where);
  } else {
    c.bad(where, "unsupported pre_tokenizer type \"" + t + "\" (a SentencePiece tokenizer.json has Metaspace, "
          "Gemma's Split(\" \", MergedWithPrevious), or none)");
  }
}

void parse_decoder(const JsonCtx& c, const nlohmann::json& d, const std::string& where, SentencePieceBpe* tk) {
  std::string t = c.type(d, where);
  DecoderStep step;
  if (t == "Sequence") {
    const nlohmann::json& list = c.member(d, "decoders", where);
    if (!list.is_array()) c.bad(where + ".decoders", "expected an array");
    for (size_t i = 0; i < list.size(); i++) parse_decoder(c, list[i], strformat("%s.decoders[%zu]", where.c_str(), i), tk);
    return;
  } else if (t == "Replace") {
    step.kind = DecoderStep::kReplace, step.a = replace_pattern(c, d, where), step.b = c.str(d, "content", where);
  } else if (t == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (t == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (t == "Strip") {
    step.kind = DecoderStep::kStrip, step.a = one_char(c, d, "content", where);
    auto count = [&](const char* key) {
      const nlohmann::json& v = c.member(d, key, where);
      if (!v.is_number_integer() || v.get<int64_t>() < 0) c.bad(where + "." + key, "expected a non-negative integer");
      return (int)std::min<int64_t>(v.get<int64_t>(), 1 << 20);
    };
    step.start = count("start");
    step.stop = count("stop");
  } else if (t == "Metaspace") {
    step.kind = DecoderStep::kMetaspace, step.a = one_char(c, d, "replacement", where);
    step.prepend = prepend_scheme(c, d, where);
  } else {
    c.bad(where, "unsupported decoder type \"" + t + "\" (supported: Sequence, Replace, ByteFallback, Fuse, Strip, "
          "Metaspace)");
  }
  tk->decoder.push_back(step);
}

// TemplateProcessing's "single" template: special tokens before $A are added at the start, after it at the end.
void parse_post_processor(const JsonCtx& c, const nlohmann::json& pp, SentencePieceBpe* tk) {
  if (pp.is_null()) return;
  const std::string where = "post_processor";
  std::string t = c.type(pp, where);
  if (t != "TemplateProcessing") c.bad(where, "unsupported post_processor type \"" + t + "\" (expected TemplateProcessing)");
  const nlohmann::json& single = c.member(pp, "single", where);
  const nlohmann::json& specials = c.member(pp, "special_tokens", where);
  if (!single.is_array()) c.bad(where + ".single", "expected an array");
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); i++) {
    std::string w = strformat("%s.single[%zu]", where.c_str(), i);
    const nlohmann::json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    const nlohmann::json& st = c.member(item, "SpecialToken", w);
    std::string name = c.str(st, "id", w + ".SpecialToken");
    const nlohmann::json& entry = c.member(specials, name.c_str(), where + ".special_tokens");
    const nlohmann::json& ids = c.member(entry, "ids", where + ".special_tokens." + name);
    if (!ids.is_array() || ids.size() != 1) c.bad(where + ".special_tokens." + name + ".ids", "expected one id");
    int32_t id = c.id(ids[0], where + ".special_tokens." + name + ".ids[0]");
    if (seen_sequence) {
      if (tk->add_eos) c.bad(w, "expected at most one special token after $A");
      tk->add_eos = true, tk->eos = id;
    } else {
      if (tk->add_bos) c.bad(w, "expected at most one special token before $A");
      tk->add_bos = true, tk->bos = id;
    }
  }
  if (!seen_sequence) c.bad(where + ".single", "has no {\"Sequence\": {\"id\": \"A\"}} entry");
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_json(const nlohmann::json& j, const std::string& path) {
  JsonCtx c{path};
  if (!j.is_object()) c.bad("top level", strformat("expected a tokenizer.json object, got %s", j.type_name()));
  auto tk = std::make_unique<SentencePieceBpe>();
  tk->path = path;

  // The BPE model
  const nlohmann::json& model = c.member(j, "model", "top level");
  if (!model.is_object()) c.bad("model", strformat("expected an object, got %s", model.type_name()));
  if (model.contains("type") && !(model["type"].is_string() && model["type"] == "BPE")) {
    c.bad("model.type", "expected \"BPE\" (SentencePiece BPE), got " + clip_for_message(model["type"].dump()));
  }
  const nlohmann::json& vocab = c.member(model, "vocab", "model");
  if (!vocab.is_object()) c.bad("model.vocab", strformat("expected an object {piece: id}, got %s", vocab.type_name()));
  if (vocab.empty()) c.bad("model.vocab", "is empty");
  // Ids run 0..N-1 without gaps (checked at the end); bound them by what the file holds before the
  // id space grows to the largest one (an id of 10^9 would allocate tens of GB first).
  const size_t added_count = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"].size() : 0;
  const int64_t id_limit = (int64_t)(vocab.size() + added_count);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    int32_t id = c.id(it.value(), "model.vocab[\"" + it.key() + "\"]");
    if (id >= id_limit)
      c.bad("model.vocab[\"" + it.key() + "\"]", strformat("id %d, but the file holds %lld tokens (ids run 0..%lld)", id,
                                                          (long long)id_limit, (long long)id_limit - 1));
    if (!valid_utf8(it.key())) c.bad("model.vocab", "a piece is not valid UTF-8");
    if ((size_t)id < tk->has_token.size() && tk->has_token[(size_t)id]) {
      c.bad("model.vocab[\"" + it.key() + "\"]", strformat("id %d is also piece \"%s\"", id, tk->tokens[(size_t)id].c_str()));
    }
    tk->vocab[it.key()] = id;
    set_token(tk.get(), id, it.key());
  }
  const nlohmann::json& merges = c.member(model, "merges", "model");
  if (!merges.is_array()) c.bad("model.merges", strformat("expected an array, got %s", merges.type_name()));
  for (size_t i = 0; i < merges.size(); i++) {
    const nlohmann::json& m = merges[i];
    std::string w = strformat("model.merges[%zu]", i), a, b;
    if (m.is_string()) {  // older files: "left right"
      std::string s = m.get<std::string>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) c.bad(w, "expected \"left right\", got \"" + s + "\"");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      c.bad(w, "expected [\"left\", \"right\"] or \"left right\", got " + clip_for_message(m.dump()));
    }
    auto l = tk->vocab.find(a), r = tk->vocab.find(b), lr = tk->vocab.find(a + b);
    if (l == tk->vocab.end() || r == tk->vocab.end() || lr == tk->vocab.end()) {
      c.bad(w, "merge \"" + a + "\" + \"" + b + "\": \"" +
               (l == tk->vocab.end() ? a : r == tk->vocab.end() ? b : a + b) + "\" is not in model.vocab");
    }
    tk->merges.insert(l->second, r->second, {(uint32_t)i, lr->second});
  }
  tk->byte_fallback = c.flag(model, "byte_fallback", false, "model");
  tk->fuse_unk = c.flag(model, "fuse_unk", false, "model");
  tk->ignore_merges = c.flag(model, "ignore_merges", false, "model");
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    std::string unk = c.str(model, "unk_token", "model");
    auto it = tk->vocab.find(unk);
    if (it == tk->vocab.end()) c.bad("model.unk_token", "\"" + unk + "\" is not in model.vocab");
    tk->unk = it->second;
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    c.bad("model.dropout", "BPE dropout is not supported (expected null)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && !(model[key].is_string() && model[key].get<std::string>().empty())) {
      c.bad(std::string("model.") + key, "not supported in a SentencePiece BPE (expected null)");
    }
  }

  // Added tokens
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    const nlohmann::json& list = j["added_tokens"];
    if (!list.is_array()) c.bad("added_tokens", strformat("expected an array, got %s", list.type_name()));
    for (size_t i = 0; i < list.size(); i++) {
      std::string w = strformat("added_tokens[%zu]", i);
      const nlohmann::json& t = list[i];
      AddedToken a;
      a.id = c.id(c.member(t, "id", w), w + ".id");
      if ((int64_t)a.id >= id_limit)
        c.bad(w + ".id", strformat("id %d, but the file holds %lld tokens (ids run 0..%lld)", a.id, (long long)id_limit,
                                   (long long)id_limit - 1));
      a.content = c.str(t, "content", w);
      if (a.content.empty() || !valid_utf8(a.content)) c.bad(w + ".content", "expected non-empty UTF-8 text");
      a.special = c.flag(t, "special", false, w);
      a.normalized = c.flag(t, "normalized", !a.special, w);
      for (const char* key : {"single_word", "lstrip", "rstrip"}) {
        if (c.flag(t, key, false, w)) c.bad(w + "." + key, "true is not supported for a SentencePiece tokenizer");
      }
      tk->added.push_back(a);
    }
    // Set ids after reading all of them; an added token may rename a model piece's id for decoding.
    for (const AddedToken& a : tk->added) {
      set_token(tk.get(), a.id, a.content);
      tk->special[(size_t)a.id] = a.special;
    }
  }

  // Pipeline
  if (j.contains("normalizer")) parse_normalizer(c, j["normalizer"], "normalizer", tk.get());
  if (j.contains("pre_tokenizer")) parse_pre_tokenizer(c, j["pre_tokenizer"], "pre_tokenizer", tk.get());
  tk->has_decoder = j.contains("decoder") && !j["decoder"].is_null();
  if (tk->has_decoder) parse_decoder(c, j["decoder"], "decoder", tk.get());
  if (j.contains("post_processor")) parse_post_processor(c, j["post_processor"], tk.get());
  // Without a template the BOS/EOS ids still come from the conventional LLaMA names, if present.
  auto named = [&](const char* name) {
    for (const AddedToken& a : tk->added) if (a.content == name) return a.id;
    auto it = tk->vocab.find(name);
    return it == tk->vocab.end() ? -1 : it->second;
  };
  if (tk->bos < 0) tk->bos = named("<s>");
  if (tk->eos < 0) tk->eos = named("</s>");
  for (size_t id = 0; id < tk->tokens.size(); id++) {
    if (!tk->has_token[id]) c.bad("model.vocab", strformat("no token has id %zu (ids must be 0..%zu without gaps)", id, tk->tokens.size() - 1));
  }
  tk->finish();
  return tk;
}

}  // namespace llmt
