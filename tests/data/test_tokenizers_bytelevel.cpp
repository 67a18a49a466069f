// Byte-level BPE (GPT-2 files, tokenizer.json, tiktoken ranks): exactness against Hugging Face
// tokenizers and tiktoken on real corpora (tests/reference/tokenizers/gpt2_fixtures.json, made by
// tests/reference/make_tokenizer_fixtures.py), the loader's choices, and clear errors on bad files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/bpe_bytelevel.h"
#include "data/pretokenize.h"
#include "data/tiktoken.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"
#include "tests/data/tokenizer_corpus.h"
#include "tests/test_util.h"

using namespace llmt;
using Ids = std::vector<int32_t>;
using llmt_test::corpus_strings;
using llmt_test::slurp;

namespace {

using llmt_test::error_of;

std::string gpt2_dir() { return llmt_test::shared_data_dir() + "/tokenizers/gpt2"; }

bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

bool have_gpt2() {
  return exists(gpt2_dir() + "/vocab.json") && exists(gpt2_dir() + "/merges.txt") &&
         exists(gpt2_dir() + "/gpt2.tiktoken");
}

#define SKIP_WITHOUT_GPT2()                                                                          \
  if (!have_gpt2())                                                                                  \
  GTEST_SKIP() << "the GPT-2 tokenizer files are not under " << gpt2_dir()                           \
               << " (set LLMT_TEST_DATA to the shared data folder)"

void spit(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string ids_str(const Ids& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); i++) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + "]";
}

// tokenizer.json for the GPT-2 files, as Hugging Face writes it; merges as "a b" or ["a", "b"];
// `split_regex` non-empty: Sequence[Split(regex), ByteLevel(use_regex=false)] as LLaMA-3 has it.
std::string make_tokenizer_json(bool pair_merges, const std::string& split_regex, bool add_prefix_space = false) {
  nlohmann::json vocab = nlohmann::json::parse(slurp(gpt2_dir() + "/vocab.json"));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream ms(slurp(gpt2_dir() + "/merges.txt"));
  std::string line;
  while (std::getline(ms, line)) {
    if (line.rfind("#version", 0) == 0 || line.empty()) continue;
    size_t sp = line.find(' ');
    if (pair_merges) merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
    else merges.push_back(line);
  }
  nlohmann::json bl = {
      {"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::json pre = bl;
  if (!split_regex.empty()) {
    bl["use_regex"] = false;
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"}, {"pattern", {{"Regex", split_regex}}}, {"behavior", "Isolated"}, {"invert", false}},
             bl}}};
  }
  nlohmann::json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       {{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
         {"normalized", false}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}}};
  return j.dump();
}

struct Named {
  std::string name;
  const Tokenizer* tok;
};

// The GPT-2 tokenizer through every loader, loaded once for all tests.
struct Gpt2Set {
  std::unique_ptr<Tokenizer> files, tiktoken, json_str, json_pairs, tiktoken_llama3, json_llama3;
  Gpt2Set() {
    files = load_tokenizer(gpt2_dir());
    tiktoken = load_tokenizer(gpt2_dir() + "/gpt2.tiktoken");
    llmt_test::TempDir tmp("tok_json");  // the files are read before it goes
    const std::string& d = tmp.path;
    spit(d + "/str.json", make_tokenizer_json(false, ""));
    spit(d + "/pairs.json", make_tokenizer_json(true, ""));
    spit(d + "/llama3.json", make_tokenizer_json(false, pretok_pattern_regex(PretokPattern::kLlama3)));
    json_str = load_tokenizer(d + "/str.json");
    json_pairs = load_tokenizer(d + "/pairs.json");
    json_llama3 = load_tokenizer(d + "/llama3.json");
    tiktoken_llama3 = load_tiktoken(gpt2_dir() + "/gpt2.tiktoken", PretokPattern::kLlama3);
  }
  // the tokenizers that should reproduce a fixture configuration
  std::vector<Named> for_config(const std::string& config) const {
    if (config == "gpt2")
      return {{"vocab.json+merges.txt", files.get()}, {"gpt2.tiktoken", tiktoken.get()},
              {"tokenizer.json (\"a b\" merges)", json_str.get()}, {"tokenizer.json ([a, b] merges)", json_pairs.get()}};
    return {{"gpt2.tiktoken with the LLaMA-3 pattern", tiktoken_llama3.get()},
            {"tokenizer.json Split(LLaMA-3)+ByteLevel", json_llama3.get()}};
  }
};

const Gpt2Set& gpt2() {
  static Gpt2Set* s = new Gpt2Set();
  return *s;
}

nlohmann::json fixtures() {
  return nlohmann::json::parse(slurp(llmt_test::reference_dir() + "/tokenizers/gpt2_fixtures.json"));
}

}  // namespace

// ---- data-free: UTF-8 replacement, the pre-tokenizer, the merge loop ----

TEST(BytelevelBpe, Utf8ReplacementIsPythons) {
  // one U+FFFD per maximal subpart, as bytes.decode("utf-8", "replace")
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_replace_invalid("abc"), "abc");
  EXPECT_EQ(utf8_replace_invalid("\xff"), R);
  EXPECT_EQ(utf8_replace_invalid("\xe2\x82"), R);
  EXPECT_EQ(utf8_replace_invalid("\xe2\x82" "a"), R + "a");
  EXPECT_EQ(utf8_replace_invalid("\xc0\x80"), R + R);
  EXPECT_EQ(utf8_replace_invalid("\xed\xa0\x80"), R + R + R);
  EXPECT_EQ(utf8_replace_invalid("\xf0\x9f\x98"), R);
  EXPECT_EQ(utf8_replace_invalid("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(utf8_replace_invalid("\xf4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(utf8_replace_invalid("\xe1\x80\xe1\x80\x80"), R + "\xe1\x80\x80");
}

static std::vector<std::string> pieces(const std::string& s, PretokPattern p) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t j = pretok_next(s.data(), s.size(), i, p);
    EXPECT_GT(j, i);
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

TEST(BytelevelBpe, PretokenizerMatchesTheRegexes) {
  // expectations from HF tokenizers' pre_tokenize_str
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world's  test\n\nok", PretokPattern::kGpt2),
            (V{"Hello", " world", "'s", " ", " test", "\n", "\n", "ok"}));
  EXPECT_EQ(pieces("Hello world's  test\n\nok", PretokPattern::kLlama3),
            (V{"Hello", " world", "'s", " ", " test", "\n\n", "ok"}));
  EXPECT_EQ(pieces("I'M 12345 x!!\n\n  y\t\tz", PretokPattern::kGpt2),
            (V{"I", "'", "M", " 12345", " x", "!!", "\n\n ", " y", "\t", "\t", "z"}));
  EXPECT_EQ(pieces("I'M 12345 x!!\n\n  y\t\tz", PretokPattern::kLlama3),
            (V{"I", "'M", " ", "123", "45", " x", "!!\n\n", " ", " y", "\t", "\tz"}));
  EXPECT_EQ(pieces(" \u3000a\r\n", PretokPattern::kGpt2), (V{" ", "\u3000", "a", "\r\n"}));
  EXPECT_EQ(pieces(" \u3000a\r\n", PretokPattern::kLlama3), (V{" ", "\u3000a", "\r\n"}));
  EXPECT_EQ(pieces("x\xff\xfe y", PretokPattern::kGpt2), (V{"x", "\xff\xfe", " y"}));  // invalid bytes: "other"
  EXPECT_EQ(pretok_pattern_from_regex(pretok_pattern_regex(PretokPattern::kLlama3)), PretokPattern::kLlama3);
  EXPECT_ERROR_HAS(pretok_pattern_from_regex("\\w+"), "unsupported pre-tokenizer regex");
}

// The merge rule written the slow, obvious way: merge the leftmost lowest-ranked pair until none.
static Ids naive_bpe(const BpeSpec& spec, const std::string& text) {
  Ids ids;
  for (unsigned char c : text) ids.push_back(c);
  for (;;) {
    int best = -1, best_rank = INT_MAX, merged = -1;
    for (size_t k = 0; k + 1 < ids.size(); k++)
      for (const BpeMerge& m : spec.merges)
        if (m.left == ids[k] && m.right == ids[k + 1] && m.rank < best_rank)
          best = (int)k, best_rank = m.rank, merged = m.merged;
    if (best < 0) return ids;
    ids[best] = merged;
    ids.erase(ids.begin() + best + 1);
  }
}

TEST(BytelevelBpe, MergeLoopMatchesTheRuleOnShortAndLongWords) {
  // random merges over a three-letter alphabet; whole texts as one piece (up to 300 bytes: the heap path)
  std::mt19937 rng(7);
  BpeSpec spec;
  spec.pattern = PretokPattern::kNone;
  for (int b = 0; b < 256; b++) spec.tokens.push_back(std::string(1, (char)b));
  std::vector<int> alphabet = {'a', 'b', 'c'};
  for (int k = 0; k < 60; k++) {
    int l = alphabet[rng() % alphabet.size()], r = alphabet[rng() % alphabet.size()];
    std::string cat = spec.tokens[l] + spec.tokens[r];
    int id = -1;
    for (size_t t = 256; t < spec.tokens.size(); t++)
      if (spec.tokens[t] == cat) id = (int)t;
    if (id < 0) {
      id = (int)spec.tokens.size();
      spec.tokens.push_back(cat);
      alphabet.push_back(id);
    }
    spec.merges.push_back(BpeMerge{l, r, id, k});
  }
  BpeSpec copy = spec;
  std::unique_ptr<Tokenizer> tok = make_bpe_tokenizer(std::move(copy));
  for (int trial = 0; trial < 300; trial++) {
    std::string text;
    int n = 1 + (int)(rng() % (trial < 200 ? 40 : 300));
    for (int i = 0; i < n; i++) text += "abc"[rng() % 3];
    ASSERT_EQ(tok->encode(text), naive_bpe(spec, text)) << text;
    ASSERT_EQ(tok->encode(text), tok->encode(text)) << "second encode (the word cache) differs";
    ASSERT_EQ(tok->decode(tok->encode(text)), text);
  }
}

// ---- the real GPT-2 tokenizer against the fixtures ----

TEST(BytelevelBpe, Gpt2KnownFacts) {
  SKIP_WITHOUT_GPT2();
  for (const Named& t : gpt2().for_config("gpt2")) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.tok->encode("Hello world"), (Ids{15496, 995}));
    EXPECT_EQ(t.tok->encode_with_specials("Hello world"), (Ids{15496, 995}));  // GPT-2 adds nothing
    EXPECT_EQ(t.tok->encode("a<|endoftext|>b"), (Ids{64, 50256, 65}));
    EXPECT_EQ(t.tok->vocab_size(), 50257);
    EXPECT_EQ(t.tok->bos_id(), 50256);
    EXPECT_EQ(t.tok->eos_id(), 50256);
    EXPECT_FALSE(t.tok->adds_bos());
    EXPECT_FALSE(t.tok->adds_eos());
    EXPECT_EQ(t.tok->decode({15496, 50256, 995}), "Hello<|endoftext|> world");
    EXPECT_EQ(t.tok->decode({15496, 50256, 995}, true), "Hello world");
    EXPECT_ERROR_HAS(t.tok->decode({50257}), "outside the vocabulary");
  }
  EXPECT_EQ(gpt2().files->kind(), "gpt2-bpe");
  // ByteLevel(add_prefix_space=true): a space before each segment between special tokens (as HF does)
  llmt_test::TempDir tmp("tok_prefix");
  const std::string& d = tmp.path;
  spit(d + "/tokenizer.json", make_tokenizer_json(false, "", true));
  EXPECT_EQ(load_tokenizer(d)->encode("a<|endoftext|>b"), (Ids{257, 50256, 275}));
  EXPECT_EQ(load_tokenizer(d)->encode(" a"), (Ids{257}));
  EXPECT_EQ(gpt2().tiktoken->kind(), "tiktoken");
  // invalid UTF-8 in the input: each bad byte is its own "other" character and round-trips as U+FFFD
  Ids bad = gpt2().files->encode("a\xff" "b");
  EXPECT_EQ(gpt2().files->decode(bad), "a\xEF\xBF\xBD" "b");
}

TEST(BytelevelBpe, HardStringsMatchHfAndTiktoken) {
  SKIP_WITHOUT_GPT2();
  nlohmann::json fx = fixtures();
  int mismatches = 0;
  for (const auto& rec : fx["hard"]) {
    std::string text = rec["text"].get<std::string>();
    for (const char* config : {"gpt2", "gpt2_llama3"}) {
      Ids want = rec[config].get<Ids>();
      for (const Named& t : gpt2().for_config(config)) {
        Ids got = t.tok->encode(text);
        if (got != want && mismatches++ < 5)
          ADD_FAILURE() << config << " / " << t.name << ": " << nlohmann::json(text).dump() << "\n  llmt     "
                        << ids_str(got) << "\n  expected " << ids_str(want);
        EXPECT_EQ(t.tok->decode(got), text) << t.name << " round trip of " << nlohmann::json(text).dump();
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(BytelevelBpe, CorporaMatchHfAndTiktoken) {
  SKIP_WITHOUT_GPT2();
  nlohmann::json fx = fixtures();
  for (const auto& c : fx["corpora"]) {
    std::string rel = c["corpus"], unit = c["unit"], config = c["config"], low8 = c["low8"];
    if (!exists(llmt_test::shared_data_dir() + "/" + rel)) {
      std::printf("[ SKIPPED  ] %s: not in the shared data folder\n", rel.c_str());
      continue;
    }
    std::vector<std::string> texts = corpus_strings(rel, unit);
    ASSERT_EQ(texts.size(), c["count"].get<size_t>()) << rel;
    for (const Named& t : gpt2().for_config(config)) {
      uint64_t h = 0xcbf29ce484222325ULL;
      size_t tokens = 0, mismatches = 0, bad_round_trips = 0;
      const int32_t sep = -1;
      for (size_t i = 0; i < texts.size(); i++) {
        Ids ids = t.tok->encode(texts[i]);
        tokens += ids.size();
        h = fnv1a_ids(&sep, 1, fnv1a_ids(ids.data(), ids.size(), h));
        unsigned want = std::stoul(low8.substr(2 * i, 2), nullptr, 16);
        unsigned got = fnv1a_ids(ids.data(), ids.size()) & 0xFF;
        if (got != want && mismatches++ == 0)
          ADD_FAILURE() << config << " / " << t.name << " / " << rel << ": first mismatch at string " << i + 1
                        << ": " << nlohmann::json(texts[i]).dump() << "\n  llmt ids " << ids_str(ids)
                        << "\n  expected: run python3 tests/reference/make_tokenizer_fixtures.py --show " << config
                        << " " << rel << " " << i + 1;
        if (t.tok->decode(ids) != texts[i]) bad_round_trips++;
      }
      std::printf("[ CORPUS   ] %-12s %-32s %-42s %6zu strings %7zu tokens, %zu mismatches\n", config.c_str(),
                  rel.c_str(), t.name.c_str(), texts.size(), tokens, mismatches);
      EXPECT_EQ(mismatches, 0u) << config << " / " << t.name << " / " << rel;
      EXPECT_EQ(tokens, c["tokens"].get<size_t>()) << config << " / " << t.name << " / " << rel;
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
      EXPECT_EQ(std::string(hex), c["fnv64"].get<std::string>()) << config << " / " << t.name << " / " << rel;
      EXPECT_EQ(bad_round_trips, 0u) << "decode(encode(s)) != s, " << t.name << " / " << rel;
    }
  }
}

TEST(BytelevelBpe, DecodeMatchesHfAndTiktoken) {
  SKIP_WITHOUT_GPT2();
  nlohmann::json fx = fixtures();
  for (const auto& rec : fx["decode"]) {
    Ids ids = rec["ids"].get<Ids>();
    for (const Named& t : gpt2().for_config("gpt2")) {
      EXPECT_EQ(t.tok->decode(ids), rec["text"].get<std::string>()) << t.name << " " << ids_str(ids);
      EXPECT_EQ(t.tok->decode(ids, true), rec["skip_special"].get<std::string>()) << t.name << " " << ids_str(ids);
    }
  }
}

TEST(BytelevelBpe, ConfigFilesSetBosEos) {
  SKIP_WITHOUT_GPT2();
  llmt_test::TempDir tmp("tok_config");
  const std::string& d = tmp.path;
  ASSERT_EQ(symlink((gpt2_dir() + "/vocab.json").c_str(), (d + "/vocab.json").c_str()), 0);
  ASSERT_EQ(symlink((gpt2_dir() + "/merges.txt").c_str(), (d + "/merges.txt").c_str()), 0);
  spit(d + "/tokenizer_config.json",
       R"({"add_bos_token": true, "add_eos_token": true, "bos_token": {"content": "<|endoftext|>"}})");
  spit(d + "/special_tokens_map.json", R"({"eos_token": "<|endoftext|>"})");
  auto t = load_tokenizer(d);
  EXPECT_TRUE(t->adds_bos());
  EXPECT_EQ(t->encode_with_specials("Hello world"), (Ids{50256, 15496, 995, 50256}));
  spit(d + "/tokenizer_config.json", R"({"bos_token": "Hello world"})");
  EXPECT_ERROR_HAS(load_tokenizer(d), "not a single token");
  // a directory picks tokenizer.json before vocab.json + merges.txt
  spit(d + "/tokenizer.json", "{\"model\": {\"type\": \"WordPiece\"}}");
  EXPECT_ERROR_HAS(load_tokenizer(d), "model type \"WordPiece\" is not supported");
}

// ---- bad input: clear errors, never a crash (a tiny synthetic vocabulary, no shared data) ----

static std::string tiny_vocab_json() {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; b++) {
    std::string s;
    uint32_t cp = byte_to_unicode()[b];
    if (cp < 0x80) s += (char)cp;
    else s += (char)(0xC0 | (cp >> 6)), s += (char)(0x80 | (cp & 0x3F));
    v[s] = b;
  }
  v["he"] = 256;
  v["ll"] = 257;
  v["hell"] = 258;
  return v.dump();
}

TEST(BytelevelBpe, TinyVocabularyLoadsAndMerges) {
  llmt_test::TempDir tmp("tok_tiny");
  const std::string& d = tmp.path;
  spit(d + "/vocab.json", tiny_vocab_json());
  spit(d + "/merges.txt", "#version: 0.2\nh e\nl l\nhe ll\n");
  auto t = load_tokenizer(d);
  EXPECT_EQ(t->encode("hello"), (Ids{258, 'o'}));
  EXPECT_EQ(t->bos_id(), -1);  // no <|endoftext|> in this vocabulary
  auto t2 = load_tokenizer(d + "/merges.txt");  // a path to one of the files
  EXPECT_EQ(t2->encode("hello"), (Ids{258, 'o'}));
}

TEST(BytelevelBpe, BadInputsGiveClearErrors) {
  llmt_test::TempDir tmp("tok_bad");
  const std::string& d = tmp.path;
  EXPECT_ERROR_HAS(load_tokenizer(d), "looked for tokenizer.json, vocab.json + merges.txt, and tokenizer.model");
  EXPECT_ERROR_HAS(load_tokenizer(d + "/nope"), "does not exist");

  // corrupt vocab.json: line and column
  spit(d + "/vocab.json", "{\"a\": 0,\n \"b\": }\n");
  spit(d + "/merges.txt", "#version: 0.2\n");
  {
    std::string m = error_of([&] { load_tokenizer(d); });
    EXPECT_NE(m.find("vocab.json is not valid JSON"), std::string::npos) << m;
    EXPECT_NE(m.find("line 2, column 7"), std::string::npos) << m;
  }
  spit(d + "/vocab.json", "{\"a\": \"zero\"}");
  EXPECT_ERROR_HAS(load_tokenizer(d), "token \"a\" has id \"zero\"");

  // merges.txt: the bad line by number
  spit(d + "/vocab.json", tiny_vocab_json());
  spit(d + "/merges.txt", "#version: 0.2\nh e\nl l x\n");
  EXPECT_ERROR_HAS(load_tokenizer(d), "merges.txt line 3: expected two tokens separated by one space");
  spit(d + "/merges.txt", "#version: 0.2\nh e\nq z\n");
  EXPECT_ERROR_HAS(load_tokenizer(d), "merges.txt line 3: the merged token \"qz\" is not in the vocabulary");

  // tokenizer.json: line and column; unsupported parts named
  spit(d + "/tokenizer.json", "{\n  \"model\": {\"type\": \"BPE\",\n  \"vocab\": [}\n}");
  EXPECT_ERROR_HAS(load_tokenizer(d), "line 3, column");
  spit(d + "/tokenizer.json", "[1, 2]");
  EXPECT_ERROR_HAS(load_tokenizer(d), "expected a Hugging Face tokenizer.json");
  spit(d + "/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
      "pre_tokenizer": {"type": "ByteLevel"}, "normalizer": {"type": "NFKC"}})");
  EXPECT_ERROR_HAS(load_tokenizer(d), "normalizer \"NFKC\" is not supported");
  spit(d + "/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a b"]},
      "pre_tokenizer": {"type": "ByteLevel"}})");
  EXPECT_ERROR_HAS(load_tokenizer(d), "model.merges[0]: the merged token \"ab\" is not in the vocabulary");
  spit(d + "/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]},
      "pre_tokenizer": {"type": "ByteLevel"}})");
  EXPECT_ERROR_HAS(load_tokenizer(d), "model.merges[0]: expected \"a b\" or [\"a\", \"b\"], got 7");
  spit(d + "/tokenizer.json", R"({"model": {"type": "BPE", "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}})");
  EXPECT_ERROR_HAS(load_tokenizer(d), "tokenizer.json: model: missing \"vocab\"");
  std::remove((d + "/tokenizer.json").c_str());
  std::remove((d + "/vocab.json").c_str());
  std::remove((d + "/merges.txt").c_str());

  // rank files: the bad line by number
  std::string ranks;
  for (int b = 0; b < 256; b++) {
    static const char* A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    ranks += std::string{A[b >> 2], A[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  spit(d + "/tokenizer.model", ranks + "aGk= 256\n");
  EXPECT_EQ(load_tokenizer(d)->encode("hi hi"), (Ids{256, ' ', 256}));
  spit(d + "/tokenizer.model", "IQ== 0\nIg== 1\nIw==  x\n");
  EXPECT_ERROR_HAS(load_tokenizer(d), "tokenizer.model line 3: expected `base64 rank`");
  spit(d + "/tokenizer.model", "IQ== 0\nIg== 1\n!!!! 2\n");
  EXPECT_ERROR_HAS(load_tokenizer(d), "tokenizer.model line 3: expected `base64 rank`");
  spit(d + "/tokenizer.model", "IQ== 0\nIg== 0\n");
  EXPECT_ERROR_HAS(load_tokenizer(d), "rank 0 appears twice");
  spit(d + "/tokenizer.model", "IQ== 0\nIg== 1\n");
  EXPECT_ERROR_HAS(load_tokenizer(d), "no rank for the single byte 0x00");
  spit(d + "/tokenizer.model", std::string("\xff\xfe garbage\x01\x02", 12));
  EXPECT_THROW(load_tokenizer(d), Error);
}

// A rank file with LLaMA-3's 128000 ranks gets its pattern and its 256 special tokens.
TEST(BytelevelBpe, Llama3RankFileLayout) {
  llmt_test::TempDir tmp("tok_llama3");
  const std::string& d = tmp.path;
  std::string text;
  auto b64 = [](const std::string& s) {
    static const char* A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string o;
    for (size_t i = 0; i < s.size(); i += 3) {
      uint32_t w = (uint8_t)s[i] << 16;
      if (i + 1 < s.size()) w |= (uint8_t)s[i + 1] << 8;
      if (i + 2 < s.size()) w |= (uint8_t)s[i + 2];
      o += A[w >> 18];
      o += A[(w >> 12) & 63];
      o += i + 1 < s.size() ? A[(w >> 6) & 63] : '=';
      o += i + 2 < s.size() ? A[w & 63] : '=';
    }
    return o;
  };
  for (int r = 0; r < 128000; r++) {
    std::string tok;
    if (r < 256) tok = std::string(1, (char)r);
    else if (r == 256) tok = " world";
    else tok = std::string{'\x01', (char)(r & 0xFF), (char)((r >> 8) & 0xFF), (char)(r >> 16)};  // filler
    text += b64(tok) + " " + std::to_string(r) + "\n";
  }
  spit(d + "/tokenizer.model", text);
  auto t = load_tokenizer(d);
  EXPECT_EQ(t->vocab_size(), 128256);
  EXPECT_EQ(t->bos_id(), 128000);
  EXPECT_EQ(t->eos_id(), 128001);
  EXPECT_TRUE(t->adds_bos());
  EXPECT_FALSE(t->adds_eos());
  EXPECT_EQ(t->encode_with_specials("<|eot_id|> world"), (Ids{128000, 128009, 256}));
  EXPECT_EQ(t->encode("<|reserved_special_token_250|>"), (Ids{128255}));
  EXPECT_EQ(t->encode("<|start_header_id|>"), (Ids{128006}));
  EXPECT_EQ(t->encode("12345"), (Ids{'1', '2', '3', '4', '5'}));
  EXPECT_EQ(t->decode({128000, 256}), "<|begin_of_text|> world");
  EXPECT_EQ(t->decode({128000, 256}, true), " world");

  // Llama 3.1's names (also 3.2's and 3.3's, as Meta's 3.1 tokenizer.py and the Hub's tokenizer.json
  // have them), by the flag or by the files beside the rank file
  auto expect_31 = [](const Tokenizer& t, const std::string& why) {
    SCOPED_TRACE(why);
    EXPECT_EQ(t.vocab_size(), 128256);
    EXPECT_EQ(t.encode("<|finetune_right_pad_id|><|reserved_special_token_2|><|eom_id|><|eot_id|><|python_tag|>"),
              (Ids{128004, 128005, 128008, 128009, 128010}));
    EXPECT_EQ(t.encode("<|reserved_special_token_3|>"), (Ids{128011}));
    EXPECT_EQ(t.encode("<|reserved_special_token_247|>"), (Ids{128255}));
    EXPECT_EQ(t.encode("<|start_header_id|>"), (Ids{128006}));
    EXPECT_EQ(t.decode({128008, 128010}), "<|eom_id|><|python_tag|>");
    EXPECT_NE(t.encode("<|reserved_special_token_248|>").size(), 1u);  // text: 3.1 has no 248
    EXPECT_EQ(t.encode_with_specials(" world"), (Ids{128000, 256}));
    EXPECT_EQ(t.eos_id(), 128001);
  };
  auto expect_30 = [](const Tokenizer& t, const std::string& why) {
    SCOPED_TRACE(why);
    EXPECT_EQ(t.encode("<|reserved_special_token_3|><|reserved_special_token_4|><|reserved_special_token_5|>"),
              (Ids{128005, 128008, 128010}));
    EXPECT_NE(t.encode("<|eom_id|>").size(), 1u);
  };
  expect_30(*load_tokenizer(d, "3.0"), "--llama3_special_tokens 3.0");
  expect_31(*load_tokenizer(d, "3.1"), "--llama3_special_tokens 3.1");
  expect_31(*load_tokenizer(d + "/tokenizer.model", "3.1"), "the file, 3.1");
  spit(d + "/params.json", R"({"dim": 2048, "n_layers": 16, "vocab_size": 128256, "use_scaled_rope": true})");
  expect_31(*load_tokenizer(d), "Meta's params.json with use_scaled_rope");
  expect_31(*load_tokenizer(d + "/tokenizer.model"), "the file beside params.json");
  expect_30(*load_tokenizer(d, "3.0"), "the flag over params.json");
  spit(d + "/params.json", R"({"dim": 4096, "n_layers": 32, "vocab_size": 128256, "rope_theta": 500000.0})");
  expect_30(*load_tokenizer(d), "Meta's Llama 3.0 params.json");
  std::remove((d + "/params.json").c_str());
  spit(d + "/config.json", R"({"model_type": "llama", "vocab_size": 128256, "rope_scaling": {"factor": 32.0,
      "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192,
      "rope_type": "llama3"}})");
  expect_31(*load_tokenizer(d), "config.json with llama3 rope scaling");
  spit(d + "/config.json", R"({"model_type": "llama", "vocab_size": 128256, "rope_parameters": {"rope_type": "llama3",
      "factor": 8.0, "rope_theta": 500000.0}})");
  expect_31(*load_tokenizer(d), "transformers 5's rope_parameters");
  spit(d + "/config.json", R"({"model_type": "llama", "vocab_size": 128256, "rope_scaling": null})");
  expect_30(*load_tokenizer(d), "a Llama 3.0 config.json");
  std::remove((d + "/config.json").c_str());
  spit(d + "/generation_config.json", R"({"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]})");
  expect_31(*load_tokenizer(d), "generation_config.json stopping at <|eom_id|>");
  // files that disagree, and the flag with another tokenizer, are errors
  spit(d + "/params.json", R"({"vocab_size": 128256, "rope_theta": 500000.0})");
  EXPECT_ERROR_HAS(load_tokenizer(d), "generation_config.json stops at <|eom_id|> (128008) (3.1), but");
  EXPECT_ERROR_HAS(load_tokenizer(d), "params.json is a Llama 3 model's without \"use_scaled_rope\" (3.0): give "
                                      "--llama3_special_tokens 3.0 or 3.1");
  expect_31(*load_tokenizer(d, "3.1"), "the flag settles a disagreement");
  spit(d + "/params.json", R"({"vocab_size": "many"})");  // a mistyped field tells nothing, and throws nothing foreign
  expect_31(*load_tokenizer(d), "a mistyped params.json field");
  EXPECT_ERROR_HAS(load_tokenizer(d, "3.2"), "--llama3_special_tokens must be auto, 3.0 or 3.1, got \"3.2\"");
  std::string bytes_only;  // a rank file of the 256 bytes alone
  for (int b = 0; b < 256; b++) bytes_only += b64(std::string(1, (char)b)) + " " + std::to_string(b) + "\n";
  ::mkdir((d + "/small").c_str(), 0755);
  spit(d + "/small/tokenizer.model", bytes_only);
  EXPECT_EQ(load_tokenizer(d + "/small")->vocab_size(), 256);
  EXPECT_ERROR_HAS(load_tokenizer(d + "/small", "3.1"), "--llama3_special_tokens 3.1 names the special tokens of "
                                                        "Llama 3's tokenizer.model");
}

// Llama 4's tokenizer.model (200000 ranks) and Mistral's tekken.json are refused, naming the format.
TEST(BytelevelBpe, Llama4AndTekkenAreRefused) {
  llmt_test::TempDir tmp("tok_refused");
  const std::string& d = tmp.path;
  std::string text;
  for (int r = 0; r < 200000; r++) {
    std::string tok = r < 256 ? std::string(1, (char)r) : std::string{'\x01', (char)(r & 0xFF), (char)((r >> 8) & 0xFF),
                                                                       (char)(r >> 16)};
    static const char* A = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string o;
    for (size_t i = 0; i < tok.size(); i += 3) {
      uint32_t w = (uint8_t)tok[i] << 16;
      if (i + 1 < tok.size()) w |= (uint8_t)tok[i + 1] << 8;
      if (i + 2 < tok.size()) w |= (uint8_t)tok[i + 2];
      o += A[w >> 18];
      o += A[(w >> 12) & 63];
      o += i + 1 < tok.size() ? A[(w >> 6) & 63] : '=';
      o += i + 2 < tok.size() ? A[w & 63] : '=';
    }
    text += o + " " + std::to_string(r) + "\n";
  }
  spit(d + "/tokenizer.model", text);
  EXPECT_ERROR_HAS(load_tokenizer(d), "200000 ranks: this is Llama 4's tokenizer.model, which llmt does not read");
  std::remove((d + "/tokenizer.model").c_str());
  const std::string tekken = R"({"config": {"pattern": "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}]+", "num_vocab_tokens": 2,
      "default_vocab_size": 1002, "default_num_special_tokens": 1000, "version": "v3"},
      "vocab": [{"rank": 0, "token_bytes": "AA==", "token_str": null}]})";
  spit(d + "/tekken.json", tekken);
  EXPECT_ERROR_HAS(load_tokenizer(d), "tekken.json is Mistral's tekken tokenizer (tekken.json, version \"v3\"), a "
                                      "format llmt does not read");
  EXPECT_ERROR_HAS(load_tokenizer(d + "/tekken.json"), "is Mistral's tekken tokenizer");
  spit(d + "/tokenizer.json", tekken);  // whatever the name
  EXPECT_ERROR_HAS(load_tokenizer(d), "tokenizer.json is Mistral's tekken tokenizer");
}
