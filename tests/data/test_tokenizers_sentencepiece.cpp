// SentencePiece BPE (data/sentencepiece.cpp) against Hugging Face on the real LLaMA-2 tokenizer.model:
// the ids of tests/reference/make_sentencepiece_fixtures.py (hard strings in full, every line of
// WikiText-2 valid, Tiny Shakespeare and the Alpaca strings as hashes), the tokenizer.json forms, a
// hand-made model whose piece ids and scores disagree, and bad input: clear llmt::Error, never a crash.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "data/sentencepiece.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"
#include "tests/test_util.h"

using namespace llmt;
using json = nlohmann::json;

namespace {

using llmt_test::error_of;

std::string fixtures() { return llmt_test::reference_dir() + "/tokenizers_sp"; }
std::string llama2_model() { return llmt_test::shared_data_dir() + "/tokenizers/llama2/tokenizer.model"; }

bool exists(const std::string& path) { return std::ifstream(path).good(); }

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_all(const std::string& path, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  f << data;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/llmt_sp_" + std::to_string(::getpid()) + "_" + name;
}

const json& load_json(const std::string& path) {  // parsed once per file
  static std::map<std::string, json> cache;
  auto it = cache.find(path);
  if (it == cache.end()) it = cache.emplace(path, json::parse(read_all(path))).first;
  return it->second;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += (char)std::stoi(hex.substr(i, 2), nullptr, 16);
  return out;
}

std::vector<int32_t> ids_of(const json& a) { return a.get<std::vector<int32_t>>(); }

uint32_t fnv1a32(const std::vector<int32_t>& ids) {
  uint32_t h = 0x811c9dc5u;
  for (int32_t id : ids) {
    for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)id >> (8 * k)) & 0xff)) * 0x01000193u;
  }
  return h;
}

struct Fnv64 {  // all lines, each followed by -1, as the fixture script hashes them
  uint64_t h = 0xcbf29ce484222325ull;
  void add(int32_t id) {
    for (int k = 0; k < 4; k++) h = (h ^ (((uint32_t)id >> (8 * k)) & 0xff)) * 0x100000001b3ull;
  }
  void line(const std::vector<int32_t>& ids) {
    for (int32_t id : ids) add(id);
    add(-1);
  }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
    return buf;
  }
};

// The strings of each corpus, as the fixture script splits them.
std::vector<std::string> file_lines(const std::string& path) {
  std::string all = read_all(path);
  std::vector<std::string> lines;
  size_t pos = 0;
  for (size_t nl; (nl = all.find('\n', pos)) != std::string::npos; pos = nl + 1) lines.push_back(all.substr(pos, nl - pos));
  if (pos < all.size()) lines.push_back(all.substr(pos));
  return lines;
}

std::vector<std::string> alpaca_strings(const std::string& dir) {
  std::vector<std::string> out;
  for (const char* name : {"alpaca_seed_tasks.json", "gpteacher-codegen.json"}) {
    json records = json::parse(read_all(dir + "/" + name));
    for (const json& rec : records) {
      for (const char* key : {"instruction", "input", "output", "response"}) {
        if (rec.contains(key) && rec[key].is_string()) out.push_back(rec[key].get<std::string>());
      }
    }
  }
  return out;
}

// The LLaMA-2 tokenizer.json transformers writes. It is derived from the LLaMA-2 tokenizer (shared data,
// under its own licence), so it is not committed: make_sentencepiece_fixtures.py writes it locally and
// the checks of that form run where it exists.
bool have_llama_json() { return exists(fixtures() + "/tokenizer.json"); }

// The fixture tokenizer.json with one of variants.json's replacements applied ("" for none).
json tokenizer_json(const std::string& variant) {
  json j = load_json(fixtures() + "/tokenizer.json");
  if (!variant.empty()) {
    for (auto& kv : load_json(fixtures() + "/variants.json").at(variant).items()) j[kv.key()] = kv.value();
  }
  return j;
}

#define REQUIRE_LLAMA2()                                                                              \
  if (!exists(llama2_model())) GTEST_SKIP() << "no " << llama2_model() << " (set LLMT_TEST_DATA to the " \
                                               "shared data folder)"

#define EXPECT_ERROR(stmt, substr)                                                  \
  do {                                                                              \
    std::string msg_ = error_of([&]() { stmt; });                                   \
    EXPECT_NE(msg_.find(substr), std::string::npos) << "error was: " << msg_;       \
  } while (0)

// ---- a few bytes of protobuf, to build models by hand
std::string pb_varint(uint64_t v) {
  std::string s;
  for (; v >= 0x80; v >>= 7) s += (char)(0x80 | (v & 0x7f));
  return s + (char)v;
}
std::string pb_bytes(int field, const std::string& v) { return pb_varint((uint64_t)field << 3 | 2) + pb_varint(v.size()) + v; }
std::string pb_int(int field, int64_t v) { return pb_varint((uint64_t)field << 3) + pb_varint((uint64_t)v); }
std::string pb_float(int field, float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  std::string s = pb_varint((uint64_t)field << 3 | 5);
  for (int k = 0; k < 4; k++) s += (char)(bits >> (8 * k));
  return s;
}
std::string pb_piece(const std::string& text, float score, int type) {
  return pb_bytes(1, pb_bytes(1, text) + pb_float(2, score) + pb_int(3, type));
}
// <unk> <s> </s>, 256 byte pieces, "▁", "a", "b", "▁a", "ab", then `extra`; a BPE trainer spec; LLaMA's normalizer.
std::string small_model(const std::string& extra = "", int model_type = 2, const std::string& normalizer = "") {
  std::string m = pb_piece("<unk>", 0, 2) + pb_piece("<s>", 0, 3) + pb_piece("</s>", 0, 3);
  char buf[8];
  for (int b = 0; b < 256; b++) std::snprintf(buf, sizeof buf, "<0x%02X>", b), m += pb_piece(buf, 0, 6);
  m += pb_piece("\xe2\x96\x81", -10, 1) + pb_piece("a", -11, 1) + pb_piece("b", -12, 1) +
       pb_piece("\xe2\x96\x81" "a", -1, 1) + pb_piece("ab", -2, 1) + extra;
  m += pb_bytes(2, pb_int(3, model_type) + pb_int(35, 1));
  m += pb_bytes(3, normalizer.empty() ? pb_bytes(1, "identity") + pb_int(3, 1) + pb_int(4, 0) + pb_int(5, 1) : normalizer);
  return m;
}

}  // namespace

TEST(SentencePiece, KnownFactsLlama2) {
  REQUIRE_LLAMA2();
  // the default (score merges) flavor; the facts hold for the transformers 5 flavor too
  EXPECT_EQ(load_sentencepiece_model(llama2_model(), SentencePieceFlavor::kTransformers)
                ->encode_with_specials("I believe the meaning of life is"),
            (std::vector<int32_t>{1, 306, 4658, 278, 6593, 310, 2834, 338}));
  std::unique_ptr<Tokenizer> tok = load_sentencepiece_model(llama2_model());
  EXPECT_EQ(tok->encode_with_specials("I believe the meaning of life is"),
            (std::vector<int32_t>{1, 306, 4658, 278, 6593, 310, 2834, 338}));
  EXPECT_EQ(tok->encode_with_specials("Hello world!"), (std::vector<int32_t>{1, 15043, 3186, 29991}));
  EXPECT_EQ(tok->encode_with_specials(""), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->adds_bos());
  EXPECT_FALSE(tok->adds_eos());
  EXPECT_EQ(tok->kind(), "sentencepiece-bpe");
  EXPECT_EQ(tok->decode({1, 15043, 3186, 29991, 2}), "<s> Hello world!</s>");
  EXPECT_EQ(tok->decode({1, 15043, 3186, 29991, 2}, true), "Hello world!");
  EXPECT_TRUE(is_sentencepiece_model_file(llama2_model()));

  // The same through load_tokenizer (file and directory) and from the tokenizer.json
  EXPECT_EQ(load_tokenizer(llama2_model())->encode_with_specials("Hello world!"), (std::vector<int32_t>{1, 15043, 3186, 29991}));
  if (!have_llama_json()) return;
  std::unique_ptr<Tokenizer> tj = load_sentencepiece_json(tokenizer_json(""), "tokenizer.json");
  EXPECT_EQ(tj->encode_with_specials("Hello world!"), (std::vector<int32_t>{1, 15043, 3186, 29991}));
  EXPECT_EQ(tj->vocab_size(), 32000);
  EXPECT_EQ(tj->bos_id(), 1);
  EXPECT_EQ(tj->eos_id(), 2);
  EXPECT_TRUE(tj->adds_bos());
  EXPECT_FALSE(tj->adds_eos());
}

// The tokenizer.json forms need the locally generated tokenizer.json; the tokenizer.model checks the shared data.
TEST(SentencePiece, HardStrings) {
  bool have_model = exists(llama2_model()), have_json = have_llama_json();
  if (!have_model && !have_json) GTEST_SKIP() << "neither " << llama2_model() << " nor the generated tokenizer.json";
  if (!have_model) std::printf("[ sentencepiece ] no %s: tokenizer.json forms only\n", llama2_model().c_str());
  std::unique_ptr<Tokenizer> model, model_score, model_default, loaded;
  if (have_model) {
    model = load_sentencepiece_model(llama2_model(), SentencePieceFlavor::kTransformers);
    model_score = load_sentencepiece_model(llama2_model(), SentencePieceFlavor::kScoreMerges);
    model_default = load_sentencepiece_model(llama2_model());  // the default flavor: score merges
    loaded = load_tokenizer(llama2_model());                   // as llmt loads a tokenizer.model
  }
  std::unique_ptr<Tokenizer> js, js_legacy, js_norm;
  if (have_json) {
    js = load_sentencepiece_json(tokenizer_json(""), "tokenizer.json");
    js_legacy = load_sentencepiece_json(tokenizer_json("legacy"), "legacy");
    js_norm = load_sentencepiece_json(tokenizer_json("legacy_normalizer"), "legacy_normalizer");
  }
  const json& hard = load_json(fixtures() + "/hard.json");
  int n = 0, flavors_differ = 0;
  for (const json& rec : hard.at("encode")) {
    std::string text = from_hex(rec.at("hex").get<std::string>());
    std::vector<int32_t> want = ids_of(rec.at("ids"));
    SCOPED_TRACE("text hex " + rec.at("hex").get<std::string>());
    if (have_json) {
      EXPECT_EQ(js->encode(text), want);
      EXPECT_EQ(js_legacy->encode(text), ids_of(rec.at("ids_legacy")));
      EXPECT_EQ(js_norm->encode(text), ids_of(rec.at("ids_legacy_normalizer")));
      EXPECT_EQ(js->decode(want), rec.at("decoded").get<std::string>());
      EXPECT_EQ(js->decode(want, true), rec.at("decoded_skip").get<std::string>());
    }
    if (have_model) {
      EXPECT_EQ(model->encode(text), want);
      EXPECT_EQ(model_score->encode(text), ids_of(rec.at("ids_score_merges")));
      EXPECT_EQ(model_default->encode(text), ids_of(rec.at("ids_score_merges")));
      EXPECT_EQ(loaded->encode(text), ids_of(rec.at("ids_score_merges")));
      if (ids_of(rec.at("ids_score_merges")) != want) flavors_differ++;
      EXPECT_EQ(model->decode(want), rec.at("decoded").get<std::string>());
      EXPECT_EQ(model->decode(want, true), rec.at("decoded_skip").get<std::string>());
    }
    n++;
  }
  EXPECT_GT(n, 100);
  if (have_model) {
    EXPECT_GT(flavors_differ, 10);  // so the default-flavor checks above mean something
  }
  for (const json& rec : hard.at("decode")) {
    std::vector<int32_t> ids = ids_of(rec.at("ids"));
    SCOPED_TRACE("ids " + rec.at("ids").dump());
    if (have_json) {
      EXPECT_EQ(js->decode(ids), rec.at("decoded").get<std::string>());
      EXPECT_EQ(js_norm->decode(ids, true), rec.at("decoded_skip").get<std::string>());
    }
    if (have_model) {
      EXPECT_EQ(model->decode(ids), rec.at("decoded").get<std::string>());
      EXPECT_EQ(model->decode(ids, true), rec.at("decoded_skip").get<std::string>());
    }
  }
}

// Every line of the three corpora, for the tokenizer.model (both flavors) and the tokenizer.json forms.
// The hashes' first column is kTransformers' ids (Hugging Face's LlamaTokenizerFast from tokenizer.model),
// the second kScoreMerges' (the default flavor).
TEST(SentencePiece, CorporaMatchHuggingFace) {
  REQUIRE_LLAMA2();
  std::string data = llmt_test::shared_data_dir();
  std::unique_ptr<Tokenizer> model = load_sentencepiece_model(llama2_model(), SentencePieceFlavor::kTransformers);
  std::unique_ptr<Tokenizer> model_score = load_sentencepiece_model(llama2_model(), SentencePieceFlavor::kScoreMerges);
  std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> forms;
  if (have_llama_json()) {
    forms.emplace_back("default", load_sentencepiece_json(tokenizer_json(""), "tokenizer.json"));
    for (const char* v : {"legacy", "legacy_normalizer"}) forms.emplace_back(v, load_sentencepiece_json(tokenizer_json(v), v));
  }
  const json& summary = load_json(fixtures() + "/corpora.json");
  struct Corpus {
    const char* name;
    std::vector<std::string> lines;
  };
  std::vector<Corpus> corpora = {{"wikitext2_valid", file_lines(data + "/wikitext-2/valid.txt")},
                                 {"tinyshakespeare", file_lines(data + "/tinyshakespeare/input.txt")},
                                 {"alpaca", alpaca_strings(data + "/alpaca")}};
  for (const Corpus& c : corpora) {
    std::vector<std::string> want = file_lines(fixtures() + "/" + c.name + ".hashes");
    ASSERT_EQ(c.lines.size(), want.size()) << c.name;
    ASSERT_EQ(summary.at(c.name).at("lines").get<size_t>(), c.lines.size());
    int bad_model = 0, bad_score = 0, bad_roundtrip = 0;
    std::vector<Fnv64> fnv(forms.size());
    for (size_t i = 0; i < c.lines.size(); i++) {
      const std::string& line = c.lines[i];
      std::vector<int32_t> ids = model->encode(line);
      char h[20];
      std::snprintf(h, sizeof h, "%08x %08x", fnv1a32(ids), fnv1a32(model_score->encode(line)));
      if (want[i].substr(0, 8) != std::string(h, 8)) {
        if (bad_model++ < 5) ADD_FAILURE() << c.name << " line " << i + 1 << ": ids differ from Hugging Face: " << line;
      }
      if (want[i].substr(9) != std::string(h + 9)) {
        if (bad_score++ < 5) ADD_FAILURE() << c.name << " line " << i + 1 << ": score-merges ids differ: " << line;
      }
      for (size_t f = 0; f < forms.size(); f++) fnv[f].line(forms[f].second->encode(line));
      // decode(encode(line)) is the line less one leading space (the Strip decoder), as in Hugging Face
      std::string back = model->decode(ids);
      if (back != (line.size() && line[0] == ' ' ? line.substr(1) : line)) {
        if (bad_roundtrip++ < 5) ADD_FAILURE() << c.name << " line " << i + 1 << ": decodes to " << back;
      }
    }
    EXPECT_EQ(bad_model, 0) << c.name;
    EXPECT_EQ(bad_score, 0) << c.name;
    EXPECT_EQ(bad_roundtrip, 0) << c.name;
    for (size_t f = 0; f < forms.size(); f++) {
      EXPECT_EQ(fnv[f].hex(), summary.at(c.name).at("fnv64").at(forms[f].first).get<std::string>())
          << c.name << ", tokenizer.json form " << forms[f].first;
    }
    std::printf("[ sentencepiece ] %s: %zu strings, %d mismatches (kTransformers), %d (kScoreMerges)\n", c.name,
                c.lines.size(), bad_model, bad_score);
  }

  // Speed: Tiny Shakespeare line by line, one thread (compare: the sentencepiece library, docs/tokenizers.md)
  const std::vector<std::string>& lines = corpora[1].lines;
  for (int flavor = 0; flavor < 2; flavor++) {
    const Tokenizer& tok = flavor ? *model_score : *model;
    double best = 1e30;
    size_t ntok = 0;
    for (int rep = 0; rep < 3; rep++) {
      auto t0 = std::chrono::steady_clock::now();
      ntok = 0;
      for (const std::string& line : lines) ntok += tok.encode(line).size();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("[ sentencepiece ] encode Tiny Shakespeare (%s): %.3f s, %.2f MB/s, %zu tokens\n",
                flavor ? "kScoreMerges" : "kTransformers", best, 1115394 / best / 1e6, ntok);
  }
}

// A hand-made model where piece ids and scores disagree, with ties, whitespace pieces and a
// user-defined piece: both flavors against Hugging Face.
TEST(SentencePiece, TinyModelMergeOrder) {
  std::string path = fixtures() + "/tiny.model";
  std::unique_ptr<Tokenizer> tok = load_sentencepiece_model(path, SentencePieceFlavor::kTransformers);
  std::unique_ptr<Tokenizer> score = load_sentencepiece_model(path, SentencePieceFlavor::kScoreMerges);
  for (const json& rec : load_json(fixtures() + "/tiny.json")) {
    std::string text = rec.at("text").get<std::string>();
    SCOPED_TRACE("text '" + text + "'");
    EXPECT_EQ(tok->encode(text), ids_of(rec.at("ids")));
    EXPECT_EQ(score->encode(text), ids_of(rec.at("ids_score_merges")));
    EXPECT_EQ(tok->decode(ids_of(rec.at("ids"))), rec.at("decoded").get<std::string>());
  }
  EXPECT_EQ(tok->vocab_size(), 281);
}

// Pipeline pieces the LLaMA files do not use: Metaspace split, unknown pieces fused, normalized added
// tokens, no decoder (expected values from tokenizers 0.23).
TEST(SentencePiece, JsonPipelineVariants) {
  json j = {{"model", {{"type", "BPE"}, {"vocab", {{"<unk>", 0}, {"\xe2\x96\x81", 1}, {"a", 2}, {"b", 3}, {"\xe2\x96\x81" "a", 4}, {"ab", 5}}},
                       {"merges", {"\xe2\x96\x81 a", "a b"}}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", false}}},
            {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}}},
            {"decoder", {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}}}};
  std::unique_ptr<Tokenizer> t = load_sentencepiece_json(j, "split.json");
  EXPECT_EQ(t->encode("ab ab"), (std::vector<int32_t>{4, 3, 4, 3}));   // "▁a" "b" | "▁a" "b"
  EXPECT_EQ(t->encode("abxyb"), (std::vector<int32_t>{4, 3, 0, 3}));   // x y: one fused <unk>
  EXPECT_EQ(t->decode({4, 3, 4, 3}), "ab ab");
  EXPECT_EQ(t->bos_id(), -1);
  EXPECT_FALSE(t->adds_bos());
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(load_sentencepiece_json(j, "nofuse.json")->encode("abxyb"), (std::vector<int32_t>{4, 3, 0, 0, 3}));
  j["decoder"] = nullptr;
  EXPECT_EQ(load_sentencepiece_json(j, "nodecoder.json")->decode({4, 3, 1}), "\xe2\x96\x81" "a b \xe2\x96\x81");
  j["added_tokens"] = {{{"id", 6}, {"content", "\xe2\x96\x81" "b"}, {"special", false}, {"normalized", true}}};
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xe2\x96\x81"}};
  std::unique_ptr<Tokenizer> t2 = load_sentencepiece_json(j, "added.json");
  EXPECT_EQ(t2->encode("a b"), (std::vector<int32_t>{4, 6}));
  EXPECT_EQ(t2->vocab_size(), 7);
}

TEST(SentencePiece, SmallModelsByHand) {
  std::string path = temp_path("small.model");
  write_all(path, small_model());
  std::unique_ptr<Tokenizer> t = load_sentencepiece_model(path, SentencePieceFlavor::kTransformers);
  EXPECT_EQ(t->vocab_size(), 264);
  EXPECT_EQ(t->encode("ab a"), (std::vector<int32_t>{262, 261, 262}));  // "▁a" "b" "▁a" ("▁a" ranks first)
  EXPECT_EQ(t->encode("c"), (std::vector<int32_t>{259, 3 + 'c'}));      // byte fallback
  EXPECT_EQ(t->decode({259, 3 + 0xe4, 3 + 0xb8, 3 + 0xad}), "\xe4\xb8\xad");
  EXPECT_EQ(t->decode({3 + 0xe4, 3 + 0xb8}), "\xef\xbf\xbd\xef\xbf\xbd");  // one U+FFFD per byte, as HF
  EXPECT_TRUE(is_sentencepiece_model_file(path));
  std::remove(path.c_str());
}

TEST(SentencePiece, BadModelFiles) {
  std::string path = temp_path("bad.model");
  auto load = [&](const std::string& bytes) {
    write_all(path, bytes);
    return load_sentencepiece_model(path);
  };
  EXPECT_ERROR(load_sentencepiece_model(temp_path("does_not_exist.model")), "cannot open");
  EXPECT_FALSE(is_sentencepiece_model_file(temp_path("does_not_exist.model")));
  EXPECT_ERROR(load(""), "empty file");
  EXPECT_ERROR(load(small_model("", 1)), "model_type 1");
  EXPECT_ERROR(load(small_model("", 2, pb_bytes(1, "nmt_nfkc") + pb_bytes(2, "xyz"))), "unsupported SentencePiece normalization");
  EXPECT_ERROR(load(small_model(pb_piece("a", 0, 1))), "duplicates piece");
  EXPECT_ERROR(load(small_model(pb_piece("q", 0, 9))), "unknown piece type 9");
  EXPECT_ERROR(load(small_model(pb_bytes(1, pb_float(2, 1.0f)))), "no piece text");
  EXPECT_ERROR(load(small_model(pb_piece("\xff", 0, 1))), "not valid UTF-8");
  EXPECT_ERROR(load(small_model(pb_int(1, 5))), "wire type 0, expected 2");
  EXPECT_ERROR(load(pb_piece("<unk>", 0, 2)), "no trainer_spec");
  EXPECT_ERROR(load(small_model() + pb_bytes(2, pb_int(40, 999))), "unk_id 999");
  EXPECT_ERROR(load(std::string("\x0b\x01", 2)), "wire type 3");
  EXPECT_ERROR(load("IQ== 0\nIg== 1\n"), path);  // a tiktoken rank file
  EXPECT_FALSE(is_sentencepiece_model_file(path));
  std::string tiktoken = llmt_test::shared_data_dir() + "/tokenizers/gpt2/gpt2.tiktoken";
  if (exists(tiktoken)) {
    EXPECT_FALSE(is_sentencepiece_model_file(tiktoken));
    EXPECT_ERROR(load_sentencepiece_model(tiktoken), tiktoken);
  }

  // Truncations and corruptions of a real model: an Error naming the file, or (a changed piece) a
  // model that still works; never a crash.
  std::string good = exists(llama2_model()) ? read_all(llama2_model()) : small_model();
  std::mt19937 rng(7);
  for (int i = 0; i < 60; i++) {
    size_t cut = i < 10 ? (size_t)i : rng() % good.size();
    std::string msg = error_of([&]() { load(good.substr(0, cut)); });
    EXPECT_NE(msg.find(path), std::string::npos) << "cut at " << cut << ": " << msg;
    EXPECT_FALSE(is_sentencepiece_model_file(path)) << "cut at " << cut;
  }
  int loaded = 0;
  for (int i = 0; i < 60; i++) {
    std::string bad = good;
    for (int k = 0; k < 4; k++) bad[rng() % bad.size()] = (char)rng();
    try {
      std::unique_ptr<Tokenizer> t = load(bad);
      std::vector<int32_t> ids = t->encode("Hello world, <s> \xe4\xb8\xad!");
      t->decode(ids);
      loaded++;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  std::printf("[ sentencepiece ] %d of 60 corrupted models still loaded (changed pieces); the rest: errors\n", loaded);
  std::remove(path.c_str());
}

TEST(SentencePiece, BadTokenizerJson) {
  json good = {{"model", {{"type", "BPE"}, {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"ab", 3}}}, {"merges", {"a b"}}}}};
  ASSERT_EQ(load_sentencepiece_json(good, "ok.json")->encode("ab"), (std::vector<int32_t>{3}));
  auto with = [&](const std::string& ptr, const json& v) {
    json j = good;
    j[json::json_pointer(ptr)] = v;
    return j;
  };
  auto without = [&](const std::string& parent, const std::string& key) {
    json j = good;
    j[json::json_pointer(parent)].erase(key);
    return j;
  };
  EXPECT_ERROR(load_sentencepiece_json(json::array(), "t.json"), "expected a tokenizer.json object");
  EXPECT_ERROR(load_sentencepiece_json(json::object(), "t.json"), "missing \"model\"");
  EXPECT_ERROR(load_sentencepiece_json(with("/model", "BPE"), "t.json"), "model: expected an object");
  EXPECT_ERROR(load_sentencepiece_json(without("/model", "vocab"), "t.json"), "model: missing \"vocab\"");
  EXPECT_ERROR(load_sentencepiece_json(without("/model", "merges"), "t.json"), "model: missing \"merges\"");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/vocab", json::array({"a"})), "t.json"), "model.vocab: expected an object");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/vocab", json::object()), "t.json"), "model.vocab: is empty");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/vocab/a", "1"), "t.json"), "expected a token id");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/vocab/a", -1), "t.json"), "expected a token id");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/vocab/a", 2), "t.json"), "is also piece");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/vocab/a", 7), "t.json"), "id 7, but the file holds 4 tokens");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/merges", "a b"), "t.json"), "model.merges: expected an array");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/merges/0", "ab"), "t.json"), "model.merges[0]: expected \"left right\"");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/merges/0", 5), "t.json"), "model.merges[0]");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/merges/0", "a c"), "t.json"), "\"c\" is not in model.vocab");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/merges/0", "b a"), "t.json"), "\"ba\" is not in model.vocab");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/type", "Unigram"), "t.json"), "expected \"BPE\"");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/byte_fallback", "yes"), "t.json"), "expected a boolean");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/unk_token", "<pad>"), "t.json"), "\"<pad>\" is not in model.vocab");
  EXPECT_ERROR(load_sentencepiece_json(with("/model/dropout", 0.1), "t.json"), "dropout");
  EXPECT_ERROR(load_sentencepiece_json(with("/added_tokens", json::object()), "t.json"), "added_tokens: expected an array");
  EXPECT_ERROR(load_sentencepiece_json(with("/added_tokens", json::parse(R"([{"content": "<s>"}])")), "t.json"),
               "added_tokens[0]: missing \"id\"");
  EXPECT_ERROR(load_sentencepiece_json(with("/added_tokens", json::parse(R"([{"id": 4, "content": 5}])")), "t.json"),
               "added_tokens[0].content: expected a string");
  EXPECT_ERROR(load_sentencepiece_json(with("/normalizer", json::parse(R"({"type": "NFKC"})")), "t.json"),
               "unsupported normalizer type \"NFKC\"");
  EXPECT_ERROR(load_sentencepiece_json(with("/normalizer", json::parse(R"({"type": "Replace", "pattern": {"Regex": " "}, "content": "x"})")), "t.json"),
               "Regex patterns are not supported");
  EXPECT_ERROR(load_sentencepiece_json(with("/pre_tokenizer", json::parse(R"({"type": "ByteLevel"})")), "t.json"),
               "unsupported pre_tokenizer type \"ByteLevel\"");
  EXPECT_ERROR(load_sentencepiece_json(with("/pre_tokenizer", json::parse(R"({"type": "Metaspace", "replacement": "ab"})")), "t.json"),
               "expected one character");
  EXPECT_ERROR(load_sentencepiece_json(with("/pre_tokenizer", json::parse(R"({"type": "Metaspace", "replacement": "_", "prepend_scheme": "sometimes"})")), "t.json"),
               "prepend_scheme");
  EXPECT_ERROR(load_sentencepiece_json(with("/decoder", json::parse(R"({"type": "WordPiece"})")), "t.json"),
               "unsupported decoder type \"WordPiece\"");
  EXPECT_ERROR(load_sentencepiece_json(with("/decoder", json::parse(R"({"type": "Strip", "content": " ", "start": -1, "stop": 0})")), "t.json"),
               "decoder.start: expected a non-negative integer");
  EXPECT_ERROR(load_sentencepiece_json(with("/post_processor", json::parse(R"({"type": "BertProcessing"})")), "t.json"),
               "unsupported post_processor type");
  EXPECT_ERROR(load_sentencepiece_json(with("/post_processor", json::parse(R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}], "special_tokens": {}})")), "t.json"),
               "post_processor.special_tokens: missing \"<s>\"");
  // Decoding ids outside the vocabulary is an error naming the id.
  EXPECT_ERROR(load_sentencepiece_json(good, "ok.json")->decode({1, 99}), "token id 99");
}
