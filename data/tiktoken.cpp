#include "data/tiktoken.h"

#include <climits>
#include <fstream>
#include <string_view>
#include <unordered_map>

#include "data/bpe_bytelevel.h"
#include "engine/core/error.h"

namespace llmt {

static int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 (padded to a multiple of 4); false on anything else.
static bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4], pad = 0;
    for (int k = 0; k < 4; k++) {
      char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        pad++;
      } else {
        if (pad) return false;  // data after '='
        v[k] = base64_value(c);
        if (v[k] < 0) return false;
      }
    }
    uint32_t w = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    *out += (char)(w >> 16);
    if (pad < 2) *out += (char)((w >> 8) & 0xFF);
    if (pad < 1) *out += (char)(w & 0xFF);
  }
  return true;
}

bool is_tiktoken_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) return false;
  char buf[1024];
  f.read(buf, sizeof(buf));
  std::string_view s(buf, (size_t)f.gcount());
  size_t i = 0;
  while (i < s.size() && (base64_value(s[i]) >= 0 || s[i] == '=')) i++;
  if (i == 0 || i >= s.size() || s[i] != ' ') return false;
  size_t j = ++i;
  while (j < s.size() && s[j] >= '0' && s[j] <= '9') j++;
  return j > i && (j == s.size() || s[j] == '\n' || s[j] == '\r');
}

// Meta's llama3 tokenizer.py: 256 special tokens after the 128000 ranks, as each release names them.
static std::vector<std::string> llama3_specials(Llama3Release release) {
  std::vector<std::string> s;
  if (release == Llama3Release::k3_0)
    s = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
         "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
         "<|reserved_special_token_4|>", "<|eot_id|>"};
  else
    s = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
         "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
         "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"};
  // the rest are reserved, numbered on from the last reserved name above
  for (int i = release == Llama3Release::k3_0 ? 5 : 3; s.size() < 256; i++)
    s.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return s;
}

// The ranks as tokens and merges; the pattern and special tokens are left to the caller.
static BpeSpec read_ranks(const std::string& path) {
  BpeSpec spec;
  spec.kind = "tiktoken";
  spec.ignore_merges = true;  // tiktoken: a piece that is a token is that token
  std::string text = read_file(path, "tiktoken rank file");
  std::vector<std::pair<std::string, int64_t>> entries;
  size_t line_no = 0;
  int64_t max_rank = -1;
  std::string bytes;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    line_no++;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // tiktoken skips empty lines
    size_t sp = line.find(' ');
    std::string_view b64 = line.substr(0, sp), num = sp == std::string_view::npos ? "" : line.substr(sp + 1);
    bool num_ok = !num.empty() && num.size() <= 9;
    for (char c : num) num_ok = num_ok && c >= '0' && c <= '9';
    LLMT_CHECK(sp != std::string_view::npos && num_ok && base64_decode(b64, &bytes),
               "%s line %zu: expected `base64 rank` (standard base64 of the token's bytes, a space, a "
               "non-negative integer), got \"%.*s\"",
               path.c_str(), line_no, (int)std::min<size_t>(line.size(), 200), line.data());
    int64_t rank = std::stoll(std::string(num));
    entries.emplace_back(bytes, rank);
    max_rank = std::max(max_rank, rank);
  }
  LLMT_CHECK(!entries.empty(), "%s: the tiktoken rank file has no ranks", path.c_str());
  spec.tokens.assign(max_rank + 1, std::string());
  std::vector<uint8_t> seen(max_rank + 1, 0);
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(entries.size() * 2);
  for (size_t k = 0; k < entries.size(); k++) {
    int64_t r = entries[k].second;
    LLMT_CHECK(!seen[r], "%s: rank %lld appears twice", path.c_str(), (long long)r);
    seen[r] = 1;
    spec.tokens[r] = std::move(entries[k].first);
  }
  for (int64_t r = 0; r <= max_rank; r++) {
    if (!seen[r]) continue;
    bool fresh = ids.emplace(std::string_view(spec.tokens[r]), (int32_t)r).second;
    LLMT_CHECK(fresh, "%s: the bytes of rank %lld are also given another rank", path.c_str(), (long long)r);
  }
  for (int b = 0; b < 256; b++) {
    char c = (char)b;
    LLMT_CHECK(ids.count(std::string_view(&c, 1)), "%s: no rank for the single byte 0x%02x (tiktoken needs all 256)",
               path.c_str(), b);
  }
  // tiktoken merges two adjacent parts when their concatenation is a token, lowest rank first: every
  // split of a token into two tokens is such a merge, ranked by the token
  for (int64_t r = 0; r <= max_rank; r++) {
    const std::string& t = spec.tokens[r];
    for (size_t k = 1; k < t.size(); k++) {
      auto l = ids.find(std::string_view(t.data(), k));
      if (l == ids.end()) continue;
      auto rr = ids.find(std::string_view(t.data() + k, t.size() - k));
      if (rr == ids.end()) continue;
      spec.merges.push_back(BpeMerge{l->second, rr->second, (int32_t)r, (int32_t)r});
    }
  }
  return spec;
}

// Special tokens after the ranks, by their number (see tiktoken.h).
static std::unique_ptr<Tokenizer> finish(BpeSpec spec, PretokPattern pattern, Llama3Release release) {
  spec.pattern = pattern;
  std::vector<std::string> specials;
  int32_t n_ranks = (int32_t)spec.tokens.size();
  if (n_ranks == 50256) specials = {"<|endoftext|>"};
  if (n_ranks == 128000) specials = llama3_specials(release);
  for (size_t k = 0; k < specials.size(); k++) {
    BpeAddedToken a;
    a.content = specials[k];
    a.id = n_ranks + (int32_t)k;
    spec.tokens.push_back(a.content);
    spec.opaque_ids.push_back(a.id);
    spec.added.push_back(a);
  }
  if (n_ranks == 50256) spec.bos_id = spec.eos_id = 50256;
  if (n_ranks == 128000) {
    spec.bos_id = 128000;
    spec.eos_id = 128001;
    spec.add_bos = true;
  }
  return make_bpe_tokenizer(std::move(spec));
}

std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, PretokPattern pattern, Llama3Release release) {
  return finish(read_ranks(path), pattern, release);
}

std::unique_ptr<Tokenizer> load_tiktoken(const std::string& path, Llama3Release release) {
  BpeSpec spec = read_ranks(path);
  LLMT_CHECK(spec.tokens.size() != 200000, "%s: 200000 ranks: this is Llama 4's tokenizer.model, which llmt does not "
             "read (its pre-tokenizer pattern, o200k's, needs Unicode case classes llmt's scanners lack, and it has "
             "1135 special tokens of its own)", path.c_str());
  PretokPattern p = spec.tokens.size() == 128000 ? PretokPattern::kLlama3 : PretokPattern::kGpt2;
  return finish(std::move(spec), p, release);
}

}  // namespace llmt
