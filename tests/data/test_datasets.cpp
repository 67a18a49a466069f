// Datasets, token cache, sampler and collate: unit tests on a toy tokenizer, and exact comparisons
// with the reference datasets of tests/reference/make_dataset_fixtures.py (Hugging Face tokenizers,
// run_clm.py and Stanford Alpaca preprocessing) on the real data in ../shared/data.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "data/alpaca.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/token_cache.h"
#include "data/tokenizer.h"
#include "data/wikitext.h"
#include "engine/core/error.h"
#include "tests/test_util.h"

using namespace llmt;
using json = nlohmann::json;

namespace {

// One id per byte (byte + 3); "<s>" and "</s>" written in the text are BOS (1) and EOS (2). Counts
// encode calls so the cache tests can tell whether tokenization ran.
class ToyTokenizer : public Tokenizer {
 public:
  explicit ToyTokenizer(bool adds_bos = false) : bos_(adds_bos) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    calls++;
    std::vector<int32_t> out;
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, 3, "<s>") == 0) out.push_back(1), i += 3;
      else if (text.compare(i, 4, "</s>") == 0) out.push_back(2), i += 4;
      else out.push_back((uint8_t)text[i++] + 3);
    }
    return out;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id == 1 || id == 2) {
        if (!skip_special) s += id == 1 ? "<s>" : "</s>";
      } else if (id >= 3) {
        s += (char)(id - 3);
      }
    }
    return s;
  }
  int vocab_size() const override { return 259; }
  int bos_id() const override { return 1; }
  int eos_id() const override { return 2; }
  bool adds_bos() const override { return bos_; }
  bool adds_eos() const override { return false; }
  std::string kind() const override { return "toy"; }
  mutable std::atomic<int> calls{0};

 private:
  bool bos_;
};

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c + 3);
  return v;
}

using llmt_test::TempDir;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

// FNV-1a 64 over little-endian int32 bytes, as the fixture script computes it.
std::string fnv1a64(const int32_t* p, int64_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < n; i++) {
    uint32_t v = (uint32_t)p[i];
    for (int k = 0; k < 4; k++) {
      h ^= (v >> (8 * k)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

}  // namespace

// ---- TokenDataset and collate ----

TEST(TokenDataset, FlatStorageAndValidation) {
  TokenDataset d({0, 3, 3, 5}, {10, 11, 12, 13, 14}, {-100, 11, 12, -100, 14});
  EXPECT_EQ(d.size(), 3);
  EXPECT_EQ(d.total_tokens(), 5);
  EXPECT_EQ(d.length(0), 3);
  EXPECT_EQ(d.length(1), 0);
  EXPECT_EQ(d.ids(2)[1], 14);
  EXPECT_EQ(d.labels(0)[0], -100);
  EXPECT_FALSE(d.labels_are_ids());
  EXPECT_EQ(d.max_length(), 3);
  TokenDataset copy = d;  // shares the storage
  EXPECT_EQ(copy.ids(0), d.ids(0));
  TokenDataset lm({0, 2, 4}, {1, 2, 3, 4}, {});
  EXPECT_TRUE(lm.labels_are_ids());
  EXPECT_EQ(lm.labels(1)[1], 4);
  EXPECT_TRUE(TokenDataset().empty());
  EXPECT_THROW(TokenDataset({0, 3}, {1, 2}, {}), Error);
  EXPECT_THROW(TokenDataset({0, 2, 1, 2}, {1, 2}, {}), Error);
  EXPECT_THROW(TokenDataset({0, 2}, {1, 2}, {1}), Error);
}

TEST(Collate, PadsRightAndShiftsLabels) {
  TokenDataset d({0, 4, 6}, {10, 11, 12, 13, 20, 21}, {-100, -100, 12, 13, -100, 21});
  std::vector<int32_t> tok, tgt;
  int T = collate(d, {1, 0}, 7, tok, tgt);
  ASSERT_EQ(T, 4);
  EXPECT_EQ(tok, (std::vector<int32_t>{20, 21, 7, 7, 10, 11, 12, 13}));
  // targets[t] = labels[t + 1]; -100 at t = len - 1 and on the padding
  EXPECT_EQ(tgt, (std::vector<int32_t>{21, -100, -100, -100, -100, 12, 13, -100}));
  T = collate(d, {1}, 0, tok, tgt);
  EXPECT_EQ(T, 2);
  EXPECT_EQ(tgt, (std::vector<int32_t>{21, -100}));
  EXPECT_THROW(collate(d, {2}, 0, tok, tgt), Error);
  EXPECT_THROW(collate(d, {}, 0, tok, tgt), Error);
  ToyTokenizer toy;
  EXPECT_EQ(default_pad_id(toy), 2);
}

// ---- sampler ----

TEST(Sampler, GlobalBatchIndependentOfTheSplit) {
  const int64_t n = 101;  // 12 steps of 8, 5 examples dropped per epoch
  struct Split {
    int world, batch, accum;
  };
  const Split splits[] = {{8, 1, 1}, {4, 2, 1}, {4, 1, 2}, {2, 2, 2}, {1, 8, 1}, {1, 1, 8}, {2, 1, 4}};
  for (int64_t step : {0, 5, 11, 12, 30}) {
    std::vector<int64_t> ref;
    for (const Split& s : splits) {
      std::vector<int64_t> all;  // in (micro, rank) order: the global batch as one sequence
      for (int m = 0; m < s.accum; m++)
        for (int r = 0; r < s.world; r++) {
          Sampler smp(n, s.world, r, s.batch, s.accum, 1234);
          EXPECT_EQ(smp.steps_per_epoch(), 12);
          std::vector<int64_t> idx = smp.indices(step, m);
          ASSERT_EQ((int)idx.size(), s.batch);
          all.insert(all.end(), idx.begin(), idx.end());
        }
      if (ref.empty()) ref = all;
      EXPECT_EQ(all, ref) << "world " << s.world << " batch " << s.batch << " accum " << s.accum << " step " << step;
      std::vector<int64_t> sorted = all;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end()) << "an example twice in one step";
    }
  }
}

TEST(Sampler, RanksDisjointEpochsCoverDeterministicAndResumable) {
  const int64_t n = 50;
  const int world = 3, B = 2, accum = 2;  // global batch 12: 4 steps per epoch, 2 examples dropped
  std::vector<Sampler> ranks;
  for (int r = 0; r < world; r++) ranks.emplace_back(n, world, r, B, accum, 7);
  EXPECT_EQ(ranks[0].steps_per_epoch(), 4);
  for (int epoch = 0; epoch < 3; epoch++) {
    std::vector<int> seen(n, 0);
    for (int64_t s = epoch * 4; s < epoch * 4 + 4; s++) {
      EXPECT_EQ(ranks[0].epoch_of(s), epoch);
      for (int r = 0; r < world; r++)
        for (int m = 0; m < accum; m++)
          for (int64_t i : ranks[(size_t)r].indices(s, m)) seen[(size_t)i]++;
    }
    int once = 0;
    for (int c : seen) {
      EXPECT_LE(c, 1);  // disjoint across ranks, micro-batches and steps of an epoch
      once += c;
    }
    EXPECT_EQ(once, 48);
  }
  // determinism, seed and epoch dependence
  Sampler a(n, world, 1, B, accum, 7), b(n, world, 1, B, accum, 7), c(n, world, 1, B, accum, 8);
  EXPECT_EQ(a.indices(2, 1), b.indices(2, 1));
  EXPECT_NE(a.indices(2, 1), c.indices(2, 1));
  EXPECT_NE(epoch_permutation(n, 7, 0), epoch_permutation(n, 7, 1));
  // resumable: a fresh sampler at step s gives what one that walked 0..s-1 gives
  Sampler walked(n, world, 2, B, accum, 7);
  std::vector<int64_t> last;
  for (int64_t s = 0; s <= 9; s++) last = walked.indices(s, 1);
  Sampler fresh(n, world, 2, B, accum, 7);
  EXPECT_EQ(fresh.indices(9, 1), last);
  EXPECT_EQ(fresh.epoch_of(9), 2);
  // errors
  EXPECT_ERROR_HAS(Sampler(10, 4, 0, 2, 2, 0), "fewer than one global batch of 16");
  EXPECT_THROW(Sampler(100, 2, 2, 1, 1, 0), Error);
  EXPECT_THROW(Sampler(100, 2, 0, 0, 1, 0), Error);
  EXPECT_THROW(a.indices(0, 2), Error);
}

// ---- Alpaca ----

TEST(Alpaca, StanfordTemplatesToTheByte) {
  AlpacaRecord with{"Add.", "1 2", "3"}, without{"Say hi.", "", "hi"};
  EXPECT_EQ(alpaca_prompt(with),
            "Below is an instruction that describes a task, paired with an input that provides further context. "
            "Write a response that appropriately completes the request.\n\n### Instruction:\nAdd.\n\n### Input:\n1 "
            "2\n\n### Response:");
  EXPECT_EQ(alpaca_prompt(without),
            "Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n### Instruction:\nSay hi.\n\n### Response:");
  AlpacaRecord braces{"{input} {instruction}", "", "x"};  // values are not templates
  EXPECT_NE(alpaca_prompt(braces).find("### Instruction:\n{input} {instruction}\n\n"), std::string::npos);
}

TEST(Alpaca, MasksThePromptAppendsEosAndTruncates) {
  std::vector<AlpacaRecord> recs = {{"Say hi.", "", "hi"}, {"Add.", "1 2", "3"}};
  for (bool bos : {false, true}) {
    ToyTokenizer tok(bos);
    CacheStats st;
    TokenDataset d = tokenize_alpaca(recs, tok, 512, &st);
    ASSERT_EQ(d.size(), 2);
    for (int64_t i = 0; i < 2; i++) {
      std::vector<int32_t> want;
      if (bos) want.push_back(1);
      std::vector<int32_t> p = bytes_of(alpaca_prompt(recs[(size_t)i]));
      want.insert(want.end(), p.begin(), p.end());
      const size_t plen = want.size();
      std::vector<int32_t> t = bytes_of(recs[(size_t)i].output);
      want.insert(want.end(), t.begin(), t.end());
      want.push_back(2);
      ASSERT_EQ(d.length(i), (int64_t)want.size());
      EXPECT_EQ(std::vector<int32_t>(d.ids(i), d.ids(i) + d.length(i)), want);
      for (int64_t k = 0; k < d.length(i); k++)
        EXPECT_EQ(d.labels(i)[k], k < (int64_t)plen ? -100 : want[(size_t)k]) << "example " << i << " pos " << k;
    }
    EXPECT_EQ(st.v[0], 0);
  }
  // truncation: counted; a prompt that fills the limit leaves no loss
  ToyTokenizer tok;
  std::vector<AlpacaRecord> three = {{"a", "", "hello"}, {"b", "", "x"}, {"c", "", std::string(300, 'y')}};
  const int plen = (int)alpaca_prompt(three[0]).size();
  CacheStats st;
  TokenDataset d = tokenize_alpaca(three, tok, plen + 3, &st);
  EXPECT_EQ(d.length(0), plen + 3);  // "hel", no EOS
  EXPECT_EQ(d.labels(0)[plen + 2], 'l' + 3);
  EXPECT_EQ(d.length(1), plen + 2);  // "x" + EOS fits
  EXPECT_EQ(st.v[0], 2);
  EXPECT_EQ(st.v[1], 0);
  EXPECT_EQ(st.v[2], 0);
  EXPECT_EQ(st.v[3], -1);
  // a prompt that fills the limit leaves no response token: the record is dropped, counted and named
  // (before, it stayed with every label masked, and a global batch of such examples stopped the run
  // at the same step on every resume)
  d = tokenize_alpaca(three, tok, plen, &st);
  EXPECT_EQ(st.v[0], 3);
  EXPECT_EQ(st.v[1], 3);
  EXPECT_EQ(d.size(), 0);
  std::vector<AlpacaRecord> mixed = {{"a", "", "hello"}, {std::string(400, 'p'), "", "x"}, {"b", "", "x"}};
  d = tokenize_alpaca(mixed, tok, plen + 3, &st);
  ASSERT_EQ(d.size(), 2);
  EXPECT_EQ(st.v[1], 1);
  EXPECT_EQ(st.v[3], 1);  // record 1
  EXPECT_EQ(d.length(1), plen + 2);  // record 2, "x" + EOS
  for (int64_t i = 0; i < d.size(); i++) {
    int64_t targets = 0;
    for (int64_t k = 0; k < d.length(i); k++) targets += d.labels(i)[k] != -100;
    EXPECT_GT(targets, 0) << "example " << i;
  }
}

TEST(Alpaca, ParsesArraysLinesAndFieldVariants) {
  DataArgs f;
  auto recs = parse_alpaca(R"([{"instruction": "i1", "input": "x", "output": "o1"},
                                {"instruction": "i2", "output": "o2", "extra": 5}])",
                           "a.json", f);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].input, "x");
  EXPECT_EQ(recs[1].input, "");
  EXPECT_EQ(recs[1].output, "o2");
  recs = parse_alpaca("{\"instruction\": \"i\", \"input\": null, \"response\": \"r\"}\n\n"
                      "{\"instruction\": \"d\", \"context\": \"c\", \"response\": \"dr\", \"category\": \"qa\"}\n",
                      "a.jsonl", f);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].output, "r");  // GPTeacher
  EXPECT_EQ(recs[0].input, "");
  EXPECT_EQ(recs[1].input, "c");  // Dolly
  EXPECT_EQ(recs[1].output, "dr");
  DataArgs named;
  named.instruction_field = "q";
  named.input_field = "ctx";
  named.output_field = "a";
  recs = parse_alpaca(R"([{"q": "Q", "ctx": "C", "a": "A", "output": "ignored"}])", "n.json", named);
  EXPECT_EQ(recs[0].instruction, "Q");
  EXPECT_EQ(recs[0].input, "C");
  EXPECT_EQ(recs[0].output, "A");
  // a field named by flag is required as named: no "response" stand-in
  EXPECT_ERROR_HAS(parse_alpaca(R"([{"q": "Q", "response": "R"}])", "n.json", named), "no \"a\" field");
  // flags naming the same key share its text: each field gets it (the second of two moves read "")
  DataArgs same;
  same.input_field = "instruction";
  same.output_field = "instruction";
  recs = parse_alpaca(R"([{"instruction": "echo me"}])", "s.json", same);
  EXPECT_EQ(recs[0].instruction, "echo me");
  EXPECT_EQ(recs[0].input, "echo me");
  EXPECT_EQ(recs[0].output, "echo me");
}

TEST(Alpaca, BadInputsAreClearErrors) {
  DataArgs f;
  EXPECT_ERROR_HAS(parse_alpaca("[\n {\"instruction\": \"i\",\n  \"output\": oops}\n]", "bad.json", f),
                   "bad.json: malformed JSON at line 3, column 13");
  EXPECT_ERROR_HAS(parse_alpaca("{\"instruction\": \"i\", \"output\": \"o\"}\n{\"instruction\": \"i\" \"output\": 1}\n",
                                "bad.jsonl", f),
                   "bad.jsonl: malformed JSON at line 2, column 28");
  EXPECT_ERROR_HAS(parse_alpaca(R"([{"instruction": "i", "output": "o"}, {"input": "x", "output": "o"}])", "m.json", f),
                   "m.json: record 1 has no \"instruction\" field");
  EXPECT_ERROR_HAS(parse_alpaca(R"([{"instruction": "i", "input": "x"}])", "m.json", f),
                   "record 0 has no \"output\" field (nor \"response\")");
  EXPECT_ERROR_HAS(parse_alpaca("\n{\"instruction\": \"i\", \"output\": [1, 2]}\n", "t.jsonl", f),
                   "t.jsonl: line 2 (record 0): field \"output\" is a JSON array, expected a string");
  EXPECT_ERROR_HAS(parse_alpaca(R"([{"instruction": 5, "output": "o"}])", "t.json", f),
                   "field \"instruction\" is a JSON number");
  EXPECT_ERROR_HAS(parse_alpaca(R"([{"instruction": null, "output": "o"}])", "t.json", f),
                   "field \"instruction\" is a JSON null");
  EXPECT_ERROR_HAS(parse_alpaca(R"([["i", "o"]])", "t.json", f), "record 0 is a JSON array, expected an object");
  EXPECT_ERROR_HAS(parse_alpaca("[]", "e.json", f), "e.json: no Alpaca records (an empty JSON array)");
  EXPECT_ERROR_HAS(parse_alpaca(" \n\n", "e.json", f), "e.json: the file is empty");
  EXPECT_ERROR_HAS(parse_alpaca("{\"instruction\": \"ok\", \"output\": \"o\"}\n"
                                "{\"instruction\": \"b\xff\", \"output\": \"o\"}",
                                "u.jsonl", f),
                   "u.jsonl: invalid UTF-8 at line 2, column 19 (byte 0xff)");
  EXPECT_ERROR_HAS(read_alpaca("/nonexistent/alpaca.json", f), "cannot open --data_path /nonexistent/alpaca.json");
}

// ---- text lines and grouping ----

TEST(Text, LinesAsDatasetsReadsThem) {
  TextLines t = split_lines("a\r\nb\rc\n\n  \nlast", LineRule::kTextLoader, "t");
  ASSERT_EQ(t.size(), 6);
  const char* want[] = {"a\n", "b\n", "c\n", "\n", "  \n", "last"};
  for (int i = 0; i < 6; i++) EXPECT_EQ(t.line(i), want[i]);
  TextLines w = split_lines(" = T = \n \n\xe3\x80\x80\n x \n", LineRule::kWikitext, "w");
  ASSERT_EQ(w.size(), 4);
  EXPECT_EQ(w.line(0), " = T = \n");
  EXPECT_EQ(w.line(1), "");  // whitespace only, U+3000 too (str.strip)
  EXPECT_EQ(w.line(2), "");
  EXPECT_EQ(w.line(3), " x \n");
  EXPECT_EQ(split_lines("", LineRule::kTextLoader, "e").size(), 0);
  EXPECT_TRUE(is_python_whitespace(" \t\x0b\x0c\x1c\xc2\x85\xc2\xa0\xe2\x80\xa8"));
  EXPECT_FALSE(is_python_whitespace(" \xe2\x80\x8b"));  // U+200B is not whitespace to Python
  EXPECT_ERROR_HAS(split_lines("ok\nfine\nbad \xc3\x28 here\n", LineRule::kTextLoader, "x.txt"),
                   "x.txt: invalid UTF-8 at line 3, column 5");
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0);      // a surrogate
  EXPECT_EQ(find_invalid_utf8("ab\xc0\xaf"), 2);        // overlong
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0);  // past U+10FFFF
  EXPECT_EQ(find_invalid_utf8("h\xc3\xa9\xf0\x9f\x99\x82"), -1);
}

TEST(Text, GroupsPerThousandLinesAsRunClm) {
  // group = 2 lines here: each pair is concatenated and cut on its own, remainders dropped
  TextLines t = split_lines("abc\nde\nfghij\nk\n", LineRule::kTextLoader, "t");
  ToyTokenizer tok;
  int64_t dropped = -1;
  TokenDataset d = group_texts(t, tok, 3, 2, &dropped);
  // pair 1: "abc\nde\n" = 7 tokens -> 2 blocks, 1 dropped; pair 2: "fghij\nk\n" = 8 -> 2 blocks, 2 dropped
  ASSERT_EQ(d.size(), 4);
  EXPECT_EQ(dropped, 3);
  EXPECT_TRUE(d.labels_are_ids());
  EXPECT_EQ(std::vector<int32_t>(d.ids(1), d.ids(1) + 3), bytes_of("\nde"));
  EXPECT_EQ(std::vector<int32_t>(d.ids(2), d.ids(2) + 3), bytes_of("fgh"));
  // with a BOS tokenizer every line starts with BOS (run_clm tokenizes lines with the defaults)
  ToyTokenizer btok(true);
  d = group_texts(t, btok, 4, 1000, &dropped);
  EXPECT_EQ(d.total_tokens(), 16);  // 4 BOS + 15 bytes = 19 tokens -> 4 blocks of 4, 3 dropped
  EXPECT_EQ(dropped, 3);
  EXPECT_EQ(std::vector<int32_t>(d.ids(0), d.ids(0) + 4), (std::vector<int32_t>{1, 'a' + 3, 'b' + 3, 'c' + 3}));
  EXPECT_THROW(group_texts(t, tok, 0, 1000, nullptr), Error);
}

TEST(Text, WikitextFilesAndSources) {
  TempDir tmp_("test_datasets_wikitext");
  std::string dir = tmp_.path;
  EXPECT_ERROR_HAS(wikitext_split_file(dir, "wikitext-2-raw-v1", "train"),
                   "no train split of wikitext-2-raw-v1 under --dataset_dir");
  EXPECT_ERROR_HAS(wikitext_split_file(dir, "wikitext-2-raw-v1", "train"), dir + "/wikitext-2-raw/wiki.train.raw");
  EXPECT_ERROR_HAS(wikitext_split_file(dir, "wikitext-5", "train"), "not a wikitext configuration");
  EXPECT_ERROR_HAS(wikitext_split_file("", "wikitext-2-v1", "train"), "needs --dataset_dir");
  ASSERT_EQ(::mkdir((dir + "/wikitext-103-raw").c_str(), 0755), 0);
  write_file(dir + "/wikitext-103-raw/wiki.valid.raw", "x\n");
  write_file(dir + "/wiki.valid.tokens", "y\n");
  write_file(dir + "/test.txt", "z\n");
  EXPECT_EQ(wikitext_split_file(dir, "wikitext-103-raw-v1", "validation"), dir + "/wikitext-103-raw/wiki.valid.raw");
  EXPECT_EQ(wikitext_split_file(dir, "wikitext-103-v1", "validation"), dir + "/wiki.valid.tokens");
  EXPECT_EQ(wikitext_split_file(dir, "wikitext-2-raw-v1", "test"), dir + "/test.txt");

  // which data the args name
  ToyTokenizer tok;
  DataArgs a;
  EXPECT_ERROR_HAS(load_train_dataset(a, tok, 0, 1), "no training data");
  a.data_path = "x.json";
  a.train_file = "y.txt";
  EXPECT_ERROR_HAS(load_train_dataset(a, tok, 0, 1), "not several");
  DataArgs b;
  b.dataset_name = "openwebtext";
  EXPECT_ERROR_HAS(load_train_dataset(b, tok, 0, 1), "reads only wikitext");
  DataArgs c;
  c.data_path = "x.json";
  c.validation_file = "v.txt";
  EXPECT_ERROR_HAS(load_eval_dataset(c, tok, 0, 1), "--validation_file goes with --train_file");
  DataArgs e;
  e.train_file = dir + "/test.txt";
  EXPECT_TRUE(load_eval_dataset(e, tok, 0, 1).empty());
  EXPECT_ERROR_HAS(load_train_dataset(e, tok, 0, 1), "block_size 0");
  DataArgs missing;
  missing.train_file = dir + "/absent.txt";
  missing.block_size = 8;
  EXPECT_ERROR_HAS(load_train_dataset(missing, tok, 0, 1), "train: cannot open text file " + dir + "/absent.txt");
  missing.train_file.clear();
  missing.data_path = dir + "/absent.json";
  EXPECT_ERROR_HAS(load_train_dataset(missing, tok, 0, 1), "cannot open --data_path " + dir + "/absent.json");
  e.block_size = 64;
  EXPECT_ERROR_HAS(load_train_dataset(e, tok, 0, 1), "gives no block of 64 tokens");
}

// ---- token cache ----

TEST(TokenCache, SecondLoadSkipsTokenizationAndKeysChange) {
  TempDir tmp_("test_datasets_cache");
  std::string dir = tmp_.path;
  std::string text;
  for (int i = 0; i < 300; i++) text += "line number " + std::to_string(i) + " of the text\n";
  write_file(dir + "/train.txt", text);
  write_file(dir + "/tok.model", "toy tokenizer v1");
  ToyTokenizer tok;
  DataArgs a;
  a.train_file = dir + "/train.txt";
  a.block_size = 16;
  a.cache_dir = dir + "/cache/nested";
  a.tokenizer_path = dir + "/tok.model";
  TokenDataset first = load_train_dataset(a, tok, 0, 1);
  EXPECT_EQ(tok.calls.load(), 300);
  TokenDataset second = load_train_dataset(a, tok, 0, 1);
  EXPECT_EQ(tok.calls.load(), 300) << "the second load tokenized again";
  ASSERT_EQ(second.size(), first.size());
  ASSERT_EQ(second.total_tokens(), first.total_tokens());
  EXPECT_TRUE(std::equal(first.ids_data(), first.ids_data() + first.total_tokens(), second.ids_data()));
  EXPECT_TRUE(second.labels_are_ids());
  // a setting, the data, or the tokenizer's files change the key
  a.block_size = 32;
  load_train_dataset(a, tok, 0, 1);
  EXPECT_EQ(tok.calls.load(), 600);
  write_file(dir + "/train.txt", text + "one more line\n");
  load_train_dataset(a, tok, 0, 1);
  EXPECT_EQ(tok.calls.load(), 901);
  write_file(dir + "/tok.model", "toy tokenizer v2");
  load_train_dataset(a, tok, 0, 1);
  EXPECT_EQ(tok.calls.load(), 1202);
  load_train_dataset(a, tok, 0, 1);
  EXPECT_EQ(tok.calls.load(), 1202);

  // Alpaca too, with its stats kept in the file
  write_file(dir + "/a.json",
             R"([{"instruction": "i", "output": "a long answer"}, {"instruction": "j", "output": "o"}])");
  DataArgs al;
  al.data_path = dir + "/a.json";
  al.cache_dir = a.cache_dir;
  al.tokenizer_path = a.tokenizer_path;
  al.model_max_length = 300;  // the prompts fit (a record whose prompt fills it is dropped)
  TokenDataset x = load_train_dataset(al, tok, 0, 1);
  const int calls = tok.calls.load();
  TokenDataset y = load_train_dataset(al, tok, 0, 1);
  EXPECT_EQ(tok.calls.load(), calls);
  ASSERT_EQ(y.size(), 2);
  EXPECT_FALSE(y.labels_are_ids());
  EXPECT_TRUE(std::equal(x.labels_data(), x.labels_data() + x.total_tokens(), y.labels_data()));
  al.output_field = "answer";  // settings are in the key: re-read, and now an error
  EXPECT_ERROR_HAS(load_train_dataset(al, tok, 0, 1), "no \"answer\" field");
}

TEST(TokenCache, DamagedFilesAreRebuiltAndNoDirMeansNoCache) {
  TempDir tmp_("test_datasets_damaged");
  std::string dir = tmp_.path;
  int builds = 0;
  auto build = [&](CacheStats* st) {
    builds++;
    st->v[0] = 42;
    return TokenDataset({0, 2, 5}, {1, 2, 3, 4, 5}, {-100, 2, -100, 4, 5});
  };
  CacheStats st;
  CacheUse use = CacheUse::hit;
  TokenDataset d = cached_dataset(dir, "t", "k1", build, &st, &use);
  EXPECT_EQ(use, CacheUse::written);
  d = cached_dataset(dir, "t", "k1", build, &st, &use);
  EXPECT_EQ(use, CacheUse::hit);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(st.v[0], 42);
  EXPECT_EQ(d.labels(1)[0], -100);
  EXPECT_EQ(d.ids(1)[2], 5);
  const std::string path = token_cache_path(dir, "t", "k1");
  {  // truncate the file: it must be noticed, removed and rebuilt
    std::ifstream f(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    write_file(path, bytes.substr(0, bytes.size() - 4));
  }
  d = cached_dataset(dir, "t", "k1", build, &st, &use);
  EXPECT_NE(use, CacheUse::hit);
  EXPECT_EQ(builds, 2);
  EXPECT_EQ(d.total_tokens(), 5);
  {  // flip a token id, keeping the size: the checksum catches it (before, it loaded and trained on it)
    std::ifstream f(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    bytes[bytes.size() - 5 * 4 * 2 + 1] ^= 0x10;  // a byte of ids[0]
    write_file(path, bytes);
  }
  d = cached_dataset(dir, "t", "k1", build, &st, &use);
  EXPECT_NE(use, CacheUse::hit);
  EXPECT_EQ(builds, 3);
  EXPECT_EQ(d.ids(0)[0], 1);
  d = cached_dataset(dir, "t", "k1", build, &st, &use);  // rebuilt and rewritten: a hit again
  EXPECT_EQ(use, CacheUse::hit);
  EXPECT_EQ(d.ids(0)[0], 1);
  builds--;  // (the count below is of the damage cases)
  write_file(path, std::string(200, 'x'));  // not a cache file at all
  d = cached_dataset(dir, "t", "k1", build, &st, &use);
  EXPECT_EQ(builds, 3);
  TokenDataset m;
  EXPECT_FALSE(map_token_cache(dir + "/absent.tokens", "k", &m, nullptr));
  d = cached_dataset("", "t", "k1", build, &st, &use);  // no cache directory
  EXPECT_EQ(use, CacheUse::off);
  EXPECT_EQ(builds, 4);
  // hashing
  EXPECT_EQ(KeyHasher().add("ab").add("c").hex(), KeyHasher().add("ab").add("c").hex());
  EXPECT_NE(KeyHasher().add("ab").add("c").hex(), KeyHasher().add("a").add("bc").hex());
  EXPECT_EQ(KeyHasher().hex().size(), 32u);
  EXPECT_THROW(KeyHasher().add_file(dir + "/nope"), Error);
}

// A cache directory that cannot be made (under a file, a read-only mount) tokenizes from memory and
// says so: the data line said "token cache written <path>" of a file that did not exist.
TEST(TokenCache, ADirectoryThatCannotBeMadeIsNotReportedAsWritten) {
  TempDir tmp_("test_datasets_unusable");
  write_file(tmp_.path + "/file", "x");
  const std::string dir = tmp_.path + "/file/cache";
  CacheStats st;
  CacheUse use = CacheUse::written;
  testing::internal::CaptureStderr();
  TokenDataset d = cached_dataset(dir, "t", "k1", [](CacheStats*) { return TokenDataset({0, 2}, {1, 2}, {}); }, &st,
                                  &use);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(d.total_tokens(), 2);
  EXPECT_EQ(use, CacheUse::unusable);
  EXPECT_NE(err.find("tokenizing without a cache"), std::string::npos) << err;
  const std::string line = describe_cache_use(use, token_cache_path(dir, "t", "k1"));
  EXPECT_EQ(line.find("written " + dir), std::string::npos) << line;
  EXPECT_NE(line.find("could not be written"), std::string::npos) << line;
  EXPECT_EQ(describe_cache_use(CacheUse::written, "/c/f"), "token cache written /c/f");
  EXPECT_EQ(describe_cache_use(CacheUse::hit, "/c/f"), "from the token cache /c/f");
}

// A cache whose checksum holds but whose ids do not fit the tokenizer (written by hand, or by a
// tokenizer that changed in a way its files do not show) used to load, and stopped training at the
// embedding with a message that named no file.
TEST(TokenCache, IdsOutsideTheVocabularyMakeTheFileUnusableAndNameIt) {
  TempDir tmp_("test_datasets_vocab");
  const std::string path = token_cache_path(tmp_.path, "t", "k1");
  TokenDataset ds({0, 2, 5}, {1, 2, 3, 4, 7}, {-100, 2, -100, 4, 7});  // id 7 at example 1, position 2
  write_token_cache(path, "k1", ds, CacheStats());
  TokenDataset m;
  EXPECT_TRUE(map_token_cache(path, "k1", &m, nullptr, 8));  // fits a vocabulary of 8
  m = TokenDataset();
  testing::internal::CaptureStderr();
  EXPECT_FALSE(map_token_cache(path, "k1", &m, nullptr, 7));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("token cache " + path + " is unusable (token id 7 of example 1, position 2, is outside the "
                     "tokenizer's vocabulary [0, 7))"),
            std::string::npos)
      << err;
  EXPECT_FALSE(std::ifstream(path).good()) << "removed, to be tokenized again";
  // a label out of range (ids fine) is caught the same way; -100 is not a label out of range
  write_token_cache(path, "k1", TokenDataset({0, 3}, {1, 2, 3}, {-100, 9, 3}), CacheStats());
  testing::internal::CaptureStderr();
  EXPECT_FALSE(map_token_cache(path, "k1", &m, nullptr, 7));
  EXPECT_NE(testing::internal::GetCapturedStderr().find("label 9 of example 0, position 1"), std::string::npos);
}

TEST(TokenCache, ConcurrentStartsTokenizeOnceAndStaleLocksAreTakenOver) {
  TempDir tmp_("test_datasets_concurrent");
  std::string dir = tmp_.path;
  std::atomic<int> builds{0};
  auto slow_build = [&](CacheStats*) {
    builds++;
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // > one heartbeat
    return TokenDataset({0, 3}, {7, 8, 9}, {});
  };
  std::vector<TokenDataset> got(4);
  std::vector<std::thread> th;
  for (int r = 0; r < 4; r++)
    th.emplace_back([&, r] {
      CacheStats st;
      CacheUse use;
      got[(size_t)r] = cached_dataset(dir, "c", "key", slow_build, &st, &use, r, 3.0);
    });
  for (std::thread& t : th) t.join();
  EXPECT_EQ(builds.load(), 1);
  for (const TokenDataset& d : got) {
    ASSERT_EQ(d.total_tokens(), 3);
    EXPECT_EQ(d.ids(0)[2], 9);
  }
  // a lock left by a writer that died: taken over once its mtime stops moving
  const std::string lock = token_cache_path(dir, "c", "key2") + ".lock";
  write_file(lock, "ghost pid 1\n");
  CacheStats st;
  CacheUse use = CacheUse::hit;
  TokenDataset d = cached_dataset(dir, "c", "key2", slow_build, &st, &use, 0, 0.5);
  EXPECT_NE(use, CacheUse::hit);
  EXPECT_EQ(builds.load(), 2);
  struct stat sb;
  EXPECT_NE(::stat(lock.c_str(), &sb), 0) << "the lock was left behind";
  // a build that throws releases the lock and the error reaches the caller
  auto bad = [](CacheStats*) -> TokenDataset { fail("bad data"); };
  EXPECT_THROW(cached_dataset(dir, "c", "key3", bad, &st, &use), Error);
  EXPECT_NE(::stat((token_cache_path(dir, "c", "key3") + ".lock").c_str(), &sb), 0);
}

TEST(TokenCache, SeveralProcessesWriteOnce) {
  TempDir tmp_("test_datasets_processes");
  std::string dir = tmp_.path;
  const std::string tally = dir + "/builds";
  std::vector<pid_t> kids;
  for (int r = 0; r < 3; r++) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // child: no gtest macros here, the exit code tells
      int code = 0;
      try {
        CacheStats st;
        CacheUse use;
        TokenDataset d = cached_dataset(
            dir, "p", "key",
            [&](CacheStats*) {
              FILE* f = std::fopen(tally.c_str(), "a");  // one line per build, any process
              std::fputs("built\n", f);
              std::fclose(f);
              std::this_thread::sleep_for(std::chrono::milliseconds(500));
              return TokenDataset({0, 2, 4}, {5, 6, 7, 8}, {});
            },
            &st, &use, r);
        code = d.total_tokens() == 4 && d.ids(1)[1] == 8 ? 0 : 2;
      } catch (...) {
        code = 3;
      }
      std::fflush(stdout);
      ::_exit(code);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  std::ifstream f(tally);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(all, "built\n") << "tokenized by more than one process";
}

// ---- against Hugging Face (tests/reference/make_dataset_fixtures.py) ----

namespace {

// gpt2, llama2: the real tokenizers of the shared data folder (nullptr without it); llama3, qwen2,
// mistral, qwen3, gemma: the tiny ones in those families' layouts (tests/reference/make_family_tokenizers.py). The
// corpora come from the shared data folder either way: the tests skip without it.
std::unique_ptr<Tokenizer> real_tokenizer(const std::string& name) {
  const std::string data = llmt_test::shared_data_dir();
  struct stat sb;
  if (::stat((data + "/alpaca").c_str(), &sb) != 0) return nullptr;
  if (name != "gpt2" && name != "llama2") return load_tokenizer(llmt_test::reference_dir() + "/tokenizers_family/" + name);
  if (::stat((data + "/tokenizers/" + name).c_str(), &sb) != 0) return nullptr;
  return load_tokenizer(data + "/tokenizers/" + name);
}

json fixture(const std::string& name) {
  std::ifstream f(llmt_test::reference_dir() + "/datasets/" + name);
  EXPECT_TRUE(f.good()) << "missing fixture " << name << ": run tests/reference/make_dataset_fixtures.py";
  return f.good() ? json::parse(f) : json();
}

}  // namespace

class Reference : public ::testing::TestWithParam<std::string> {};

TEST_P(Reference, WikiText2ValidGroupedAsRunClm) {
  const std::string tname = GetParam();
  std::unique_ptr<Tokenizer> tok = real_tokenizer(tname);
  if (!tok) GTEST_SKIP() << "no " << llmt_test::shared_data_dir() << " (tokenizer " << tname << " or the corpora)";
  for (const char* rule : {"text", "wikitext"}) {
    json fx = fixture(std::string("wikitext2_valid_") + rule + "_" + tname + "_b128.json");
    ASSERT_FALSE(fx.is_null());
    DataArgs a;  // no cache dir: tokenize here
    a.block_size = fx["block_size"];
    TokenDataset d;
    if (std::string(rule) == "text") {
      a.train_file = llmt_test::shared_data_dir() + "/wikitext-2/valid.txt";
      d = load_train_dataset(a, *tok, 0, 1);
    } else {  // --dataset_name wikitext: the real folder has valid.txt and test.txt, so the validation split
      a.dataset_name = "wikitext";
      a.dataset_config_name = "wikitext-2-v1";
      a.dataset_dir = llmt_test::shared_data_dir() + "/wikitext-2";
      d = load_eval_dataset(a, *tok, 0, 1);
    }
    SCOPED_TRACE(std::string(rule) + " " + tname);
    ASSERT_EQ(d.size(), fx["n_blocks"].get<int64_t>());
    const int64_t T = a.block_size;
    const std::vector<std::string> bh = fx["block_hashes"];
    for (size_t b = 0; b < bh.size(); b++) EXPECT_EQ(fnv1a64(d.ids((int64_t)b), T), bh[b]) << "block " << b;
    const std::vector<std::vector<int32_t>> full = fx["first_blocks"];
    for (size_t b = 0; b < full.size(); b++)
      EXPECT_EQ(std::vector<int32_t>(d.ids((int64_t)b), d.ids((int64_t)b) + T), full[b]) << "block " << b;
    EXPECT_EQ(fnv1a64(d.ids_data(), d.total_tokens()), fx["hash_all"].get<std::string>());
    EXPECT_TRUE(d.labels_are_ids());
  }
}

TEST_P(Reference, AlpacaAsStanfordWithSeparateTargets) {
  const std::string tname = GetParam();
  std::unique_ptr<Tokenizer> tok = real_tokenizer(tname);
  if (!tok) GTEST_SKIP() << "no " << llmt_test::shared_data_dir() << " (tokenizer " << tname << " or the corpora)";
  struct Case {
    const char* fixture;
    const char* file;
  };
  const Case cases[] = {{"alpaca_seed_tasks", "alpaca/alpaca_seed_tasks.json"},
                        {"alpaca_seed_tasks", "alpaca/alpaca_seed_tasks.jsonl"},
                        {"gpteacher_codegen", "alpaca/gpteacher-codegen.json"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + " " + tname);
    json fx = fixture(std::string(c.fixture) + "_" + tname + ".json");
    ASSERT_FALSE(fx.is_null());
    DataArgs a;
    std::vector<AlpacaRecord> recs = read_alpaca(llmt_test::shared_data_dir() + "/" + c.file, a);
    const size_t n = fx["n"];
    ASSERT_GE(recs.size(), n);
    recs.resize(n);
    CacheStats st;
    TokenDataset d = tokenize_alpaca(recs, *tok, fx["model_max_length"], &st);
    ASSERT_EQ(d.size(), (int64_t)n);
    for (size_t i = 0; i < n; i++) {
      const int64_t len = d.length((int64_t)i);
      EXPECT_EQ(len, fx["lengths"][i].get<int64_t>()) << "example " << i;
      EXPECT_EQ(std::count(d.labels((int64_t)i), d.labels((int64_t)i) + len, -100),
                fx["prompt_lengths"][i].get<int64_t>())
          << "example " << i;
      EXPECT_EQ(fnv1a64(d.ids((int64_t)i), len), fx["ids_hashes"][i].get<std::string>()) << "example " << i;
      EXPECT_EQ(fnv1a64(d.labels((int64_t)i), len), fx["labels_hashes"][i].get<std::string>()) << "example " << i;
    }
    for (size_t i = 0; i < fx["examples"].size(); i++) {
      const int64_t len = d.length((int64_t)i);
      EXPECT_EQ(std::vector<int32_t>(d.ids((int64_t)i), d.ids((int64_t)i) + len),
                fx["examples"][i]["input_ids"].get<std::vector<int32_t>>());
      EXPECT_EQ(std::vector<int32_t>(d.labels((int64_t)i), d.labels((int64_t)i) + len),
                fx["examples"][i]["labels"].get<std::vector<int32_t>>());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Reference,
                         ::testing::Values("gpt2", "llama2", "llama3", "qwen2", "mistral", "qwen3", "gemma"));

// Issue 23: Alpaca examples are tokenized only up to model_max_length (encode_prefix). The result must
// be what the whole encoding cut there gives, for every record and cut: the former algorithm, written
// out here, against tokenize_alpaca on the real files, at lengths that cut prompts, targets and EOS.
TEST_P(Reference, AlpacaCutEarlyEqualsTheWholeEncodingCut) {
  const std::string tname = GetParam();
  std::unique_ptr<Tokenizer> tok = real_tokenizer(tname);
  if (!tok) GTEST_SKIP() << "no " << llmt_test::shared_data_dir() << " (tokenizer " << tname << " or the corpora)";
  for (const char* file : {"alpaca/alpaca_seed_tasks.json", "alpaca/gpteacher-codegen.json"}) {
    DataArgs a;
    std::vector<AlpacaRecord> recs = read_alpaca(llmt_test::shared_data_dir() + "/" + file, a);
    if (recs.size() > 120) recs.resize(120);
    // whole encodings, once
    std::vector<std::vector<int32_t>> prompt(recs.size()), target(recs.size());
    for (size_t i = 0; i < recs.size(); i++) {
      if (tok->adds_bos()) prompt[i].push_back(tok->bos_id());
      for (int32_t id : tok->encode(alpaca_prompt(recs[i]))) prompt[i].push_back(id);
      target[i] = tok->encode(recs[i].output);
      target[i].push_back(tok->eos_id());
      // and the prefixes themselves, at every cut of a short text
      if (i < 3)
        for (size_t k = 0; k <= target[i].size(); k++) {
          std::vector<int32_t> want(target[i].begin(), target[i].begin() + std::min(k, target[i].size() - 1));
          ASSERT_EQ(tok->encode_prefix(recs[i].output, k), want) << file << " record " << i << " cut " << k;
        }
    }
    for (int M : {1, 2, 16, 40, 64, 100, 128, 256, 512, 4096}) {
      SCOPED_TRACE(strformat("%s %s model_max_length %d", file, tname.c_str(), M));
      std::vector<int64_t> offsets(1, 0);
      std::vector<int32_t> ids, labels;
      int64_t truncated = 0, dropped = 0;
      for (size_t i = 0; i < recs.size(); i++) {
        const std::vector<int32_t>&p = prompt[i], &t = target[i];
        if ((int64_t)(p.size() + t.size()) > M) truncated++;
        if ((int64_t)p.size() >= M) {
          dropped++;
          continue;
        }
        for (int64_t k = 0; k < std::min<int64_t>((int64_t)(p.size() + t.size()), M); k++) {
          const bool in_prompt = k < (int64_t)p.size();
          ids.push_back(in_prompt ? p[(size_t)k] : t[(size_t)k - p.size()]);
          labels.push_back(in_prompt ? -100 : ids.back());
        }
        offsets.push_back((int64_t)ids.size());
      }
      CacheStats st;
      TokenDataset d = tokenize_alpaca(recs, *tok, M, &st);
      EXPECT_EQ(st.v[0], truncated);
      EXPECT_EQ(st.v[1], dropped);
      ASSERT_EQ(d.size(), (int64_t)offsets.size() - 1);
      EXPECT_EQ(std::vector<int64_t>(d.offsets_data(), d.offsets_data() + offsets.size()), offsets);
      EXPECT_EQ(std::vector<int32_t>(d.ids_data(), d.ids_data() + d.total_tokens()), ids);
      EXPECT_EQ(std::vector<int32_t>(d.labels_data(), d.labels_data() + d.total_tokens()), labels);
    }
  }
}

// One 50 MB instruction peaked at 2.2 GB: tokenized whole before the cut at model_max_length. Then
// the work stopped at the cut, but one pre-tokenizer piece (50 MB of letters without a space) was
// still merged whole (1.3 GB). Now an instruction whose length alone fills model_max_length is
// dropped untokenized (Tokenizer::min_ids_for_bytes); the instruction's own string remains.
// Measured in a process of its own (this test binary again, running this test alone,
// LLMT_TEST_HUGE_ALPACA naming the tokenizer and the text): its peak RSS over its RSS before the
// record. Not a fork: a forked child of a process that has run OpenMP deadlocks in its first parallel
// region (libgomp's threads do not survive fork), which hung the sanitizer run, where every test
// shares one process.
TEST(Alpaca, HugeInstructionKeepsMemoryBounded) {
  if (const char* spec = std::getenv("LLMT_TEST_HUGE_ALPACA")) {  // the measuring process: "llama3 words"
    const std::string name = std::string(spec).substr(0, std::string(spec).find(' '));
    const bool words = std::string(spec).find(" words") != std::string::npos;
    std::unique_ptr<Tokenizer> tok = load_tokenizer(llmt_test::reference_dir() + "/tokenizers_family/" + name);
    tok->encode("warm up the word cache");
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    std::vector<AlpacaRecord> recs(1);
    recs[0].output = "short answer";
    recs[0].instruction.reserve((50u << 20) + 256);  // the last piece appended fits: no reallocation
    for (int i = 0; recs[0].instruction.size() < (50u << 20); i++)
      recs[0].instruction += words ? "Words of an instruction, number " + std::to_string(i) + ", go on and on. "
                                   : std::string("abcdefghijklmnopqrstuvwxyz");
    CacheStats st;
    TokenDataset d = tokenize_alpaca(recs, *tok, 512, &st);
    getrusage(RUSAGE_SELF, &after);
    std::printf("llmt-huge-alpaca grew_kib=%ld dropped=%d\n", after.ru_maxrss - before.ru_maxrss,
                d.size() == 0 && st.v[1] == 1 ? 1 : 0);  // the prompt fills 512: dropped
    return;
  }
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(n, 0);
  exe[n] = 0;
  for (const char* name : {"llama3 words", "qwen2 words", "llama3 letters", "qwen2 letters"}) {
    const std::string cmd = std::string("LLMT_TEST_HUGE_ALPACA='") + name + "' timeout 600 '" + exe +
                            "' --gtest_filter=Alpaca.HugeInstructionKeepsMemoryBounded 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    for (size_t k; (k = std::fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, k);
    const int status = pclose(p);
    long grew_kib = -1;
    int dropped = 0;
    const size_t at = out.find("llmt-huge-alpaca ");
    ASSERT_TRUE(status == 0 && at != std::string::npos &&
                std::sscanf(out.c_str() + at, "llmt-huge-alpaca grew_kib=%ld dropped=%d", &grew_kib, &dropped) == 2)
        << name << ": the measuring process failed (status " << status << "):\n" << out;
    EXPECT_EQ(dropped, 1) << name << ": the record was not dropped";
    // the instruction (50 MB) and room for the rest; the prompt made from it and tokenized up to the
    // cut took 151 MiB, the whole encoding 244 (llama3) and 285 MiB (qwen2) of the words, the letters
    // (one piece, merged whole) 1.3 GB
    std::printf("%s: a 50 MB instruction grew the peak RSS by %.0f MiB\n", name, grew_kib / 1024.0);
#if defined(__SANITIZE_ADDRESS__)
    std::printf("%s: not compared with the bound: AddressSanitizer keeps freed memory in quarantine\n", name);
#else
    EXPECT_LT(grew_kib, 80L << 10) << name;
#endif
  }
}
