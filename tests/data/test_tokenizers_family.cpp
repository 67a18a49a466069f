// The tokenizers of Llama 3.x, Qwen2/Qwen2.5, Qwen3, Mistral and Gemma 2/3 checkpoints, exact to Hugging Face's
// AutoTokenizer: tiny vocabularies in those families' file layouts (tests/reference/tokenizers_family/,
// made by tests/reference/make_family_tokenizers.py), their BOS/EOS as tokenizer_config.json sets them,
// hard strings, and the shared corpora (skipped when the shared data folder is absent).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "data/bpe_bytelevel.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"
#include "tests/data/tokenizer_corpus.h"
#include "tests/test_util.h"

using namespace llmt;
using Ids = std::vector<int32_t>;
using json = nlohmann::json;

namespace {

std::string family_dir(const std::string& name) { return llmt_test::reference_dir() + "/tokenizers_family/" + name; }

const json& cases() {
  static json* j = new json(json::parse(llmt_test::slurp(family_dir("cases.json"))));
  return *j;
}

std::string ids_str(const Ids& ids) { return json(ids).dump(); }

// The family's directory copied into `tmp`, with tokenizer_config.json replaced; returns tmp.path.
std::string with_config(const llmt_test::TempDir& tmp, const std::string& name, const std::string& config) {
  std::string cmd = "cp -r '" + family_dir(name) + "/.' '" + tmp.path + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  std::ofstream(tmp.path + "/tokenizer_config.json") << config;
  return tmp.path;
}

}  // namespace

class Family : public ::testing::TestWithParam<std::string> {};

TEST_P(Family, SpecialsAreAutoTokenizers) {
  const json& fx = cases()["families"][GetParam()];
  auto t = load_tokenizer(family_dir(GetParam()));
  EXPECT_EQ(t->vocab_size(), fx["vocab_size"].get<int>());
  EXPECT_EQ(t->bos_id(), fx["bos_id"].is_null() ? -1 : fx["bos_id"].get<int>());
  EXPECT_EQ(t->eos_id(), fx["eos_id"].is_null() ? -1 : fx["eos_id"].get<int>());
}

TEST_P(Family, HardStringsMatchAutoTokenizer) {
  const json& fx = cases()["families"][GetParam()];
  auto t = load_tokenizer(family_dir(GetParam()));
  int mismatches = 0;
  for (const json& rec : fx["hard"]) {
    std::string text = rec["text"];
    Ids ids = t->encode(text), with = t->encode_with_specials(text);
    if (ids != rec["ids"].get<Ids>() && mismatches++ < 5)
      ADD_FAILURE() << json(text).dump() << "\n  llmt     " << ids_str(ids) << "\n  expected " << rec["ids"].dump();
    if (with != rec["ids_specials"].get<Ids>() && mismatches++ < 5)
      ADD_FAILURE() << "with specials " << json(text).dump() << "\n  llmt     " << ids_str(with) << "\n  expected "
                    << rec["ids_specials"].dump();
    std::string decoded = t->decode(rec["ids"].get<Ids>());
    if (decoded != rec["decoded"].get<std::string>() && mismatches++ < 5)
      ADD_FAILURE() << "decode of " << rec["ids"].dump() << "\n  llmt     " << json(decoded).dump()
                    << "\n  expected " << rec["decoded"].dump();
    if (!rec.contains("decoded_skip_special")) continue;  // the family's own strings with its special tokens
    std::string skipped = t->decode(rec["ids"].get<Ids>(), /*skip_special=*/true);
    if (skipped != rec["decoded_skip_special"].get<std::string>() && mismatches++ < 5)
      ADD_FAILURE() << "decode skipping specials of " << rec["ids"].dump() << "\n  llmt     " << json(skipped).dump()
                    << "\n  expected " << rec["decoded_skip_special"].dump();
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(Family, CorporaMatchAutoTokenizer) {
  const json& fx = cases()["families"][GetParam()];
  auto t = load_tokenizer(family_dir(GetParam()));
  for (const json& c : fx["corpora"]) {
    std::string rel = c["corpus"];
    if (!std::ifstream(llmt_test::shared_data_dir() + "/" + rel).good()) {
      std::printf("[ SKIPPED  ] %s: not in the shared data folder\n", rel.c_str());
      continue;
    }
    std::vector<std::string> texts = llmt_test::corpus_strings(rel, c["unit"]);
    ASSERT_EQ(texts.size(), c["count"].get<size_t>()) << rel;
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t tokens = 0;
    const int32_t sep = -1;
    for (const std::string& s : texts) {
      Ids ids = t->encode(s);
      tokens += ids.size();
      h = fnv1a_ids(&sep, 1, fnv1a_ids(ids.data(), ids.size(), h));
    }
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)h);
    std::printf("[ CORPUS   ] %-8s %-32s %6zu strings %7zu tokens\n", GetParam().c_str(), rel.c_str(), texts.size(),
                tokens);
    EXPECT_EQ(tokens, c["tokens"].get<size_t>()) << rel;
    EXPECT_EQ(std::string(hex), c["fnv64"].get<std::string>()) << rel;
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Family, ::testing::Values("llama3", "qwen2", "mistral", "qwen3", "gemma"));

// Mistral ships tokenizer.model beside tokenizer.json; the .model alone tokenizes as the
// sentencepiece library does (the two differ only around leading and repeated spaces).
TEST(FamilyMistral, TokenizerModelIsSentencepieces) {
  const json& fx = cases()["families"]["mistral"];
  auto t = load_tokenizer(family_dir("mistral") + "/tokenizer.model");
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  int mismatches = 0, differ_from_json = 0;
  for (const json& rec : fx["hard"]) {
    Ids ids = t->encode(rec["text"].get<std::string>());
    if (ids != rec["sentencepiece"].get<Ids>() && mismatches++ < 5)
      ADD_FAILURE() << rec["text"].dump() << "\n  llmt     " << ids_str(ids) << "\n  expected "
                    << rec["sentencepiece"].dump();
    differ_from_json += ids != rec["ids"].get<Ids>();
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(differ_from_json, 0);  // the fixture does tell the two apart
}

// Gemma ships tokenizer.model too (no dummy prefix, <pad> <eos> <bos> <unk> = 0 1 2 3). Alone it tokenizes
// as the sentencepiece library, except that control pieces written in the text (<bos>, <eos>, <pad>, <unk>,
// <mask>) become their ids, as in Hugging Face (docs/tokenizers.md); without a dummy prefix that is also
// the only place where the library and tokenizer.json differ.
TEST(FamilyGemma, TokenizerModelIsSentencepieces) {
  const json& fx = cases()["families"]["gemma"];
  auto t = load_tokenizer(family_dir("gemma") + "/tokenizer.model");
  EXPECT_EQ(t->bos_id(), 2);
  EXPECT_EQ(t->eos_id(), 1);
  EXPECT_TRUE(t->adds_bos());
  EXPECT_FALSE(t->adds_eos());
  int mismatches = 0, with_control = 0;
  for (const json& rec : fx["hard"]) {
    const std::string text = rec["text"];
    bool control = false;
    for (const char* piece : {"<bos>", "<eos>", "<pad>", "<unk>", "<mask>"})
      control = control || text.find(piece) != std::string::npos;
    with_control += control;
    const json& want = control ? rec["ids"] : rec["sentencepiece"];
    Ids ids = t->encode(text);
    if (ids != want.get<Ids>() && mismatches++ < 5)
      ADD_FAILURE() << rec["text"].dump() << "\n  llmt     " << ids_str(ids) << "\n  expected " << want.dump();
    if (!control && rec["ids"] != rec["sentencepiece"] && mismatches++ < 5)
      ADD_FAILURE() << rec["text"].dump() << ": tokenizer.json and the sentencepiece library differ";
    std::string decoded = t->decode(rec["ids"].get<Ids>());  // the same decoder as tokenizer.json's
    if (decoded != rec["decoded"].get<std::string>() && mismatches++ < 5)
      ADD_FAILURE() << "decode of " << rec["ids"].dump() << "\n  llmt     " << json(decoded).dump();
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(with_control, 0);  // the fixture has such strings, where the library's ids differ
}

// Gemma's tokenizer.json edited, against tokenizers: without the pre-tokenizer (as transformers 4 converted
// Gemma's) the ids are the file's; without the normalizer, spaces stay (as <0x20> bytes); and with "▁"
// written as " " in every piece and merge, the Split (a word ends after each space) keeps " x" pieces
// from forming: there the fixture's ids differ from those without the Split (make_family_tokenizers.py).
TEST(FamilyGemma, SplitPreTokenizerIsTokenizers) {
  const json& fx = cases()["families"]["gemma"];
  const json file = json::parse(llmt_test::slurp(family_dir("gemma") + "/tokenizer.json"));
  llmt_test::TempDir tmp("family_gemma_split");
  auto spaced = [](const std::string& piece) {
    std::string out = piece;
    for (size_t at; (at = out.find("\xe2\x96\x81")) != std::string::npos;) out.replace(at, 3, " ");
    return out;
  };
  for (const std::string variant : {"pre_tokenizer_null", "normalizer_null", "spaces_in_pieces"}) {
    SCOPED_TRACE(variant);
    json edited = file;
    edited[variant == "pre_tokenizer_null" ? "pre_tokenizer" : "normalizer"] = nullptr;
    if (variant == "spaces_in_pieces") {
      json vocab = json::object(), merges = json::array();
      for (auto it = file["model"]["vocab"].begin(); it != file["model"]["vocab"].end(); ++it)
        vocab[spaced(it.key())] = it.value();
      for (const json& m : file["model"]["merges"]) merges.push_back({spaced(m[0]), spaced(m[1])});
      edited["model"]["vocab"] = vocab;
      edited["model"]["merges"] = merges;
    }
    const std::string path = tmp.path + "/" + variant + ".json";
    std::ofstream(path) << edited.dump();
    auto t = load_tokenizer(path);
    int same_as_file = 0;
    for (const json& rec : fx["variants"][variant]) {
      Ids ids = t->encode(rec["text"].get<std::string>());
      EXPECT_EQ(ids_str(ids), rec["ids"].dump()) << rec["text"].dump();
      for (const json& h : fx["hard"])
        if (h["text"] == rec["text"]) same_as_file += h["ids"] == rec["ids"];
    }
    if (variant == "pre_tokenizer_null") EXPECT_EQ(same_as_file, 8);
    else EXPECT_LT(same_as_file, 5);  // the variant does tokenize differently
  }
  // any other Split is refused, naming what is read
  json other = file;
  other["pre_tokenizer"]["behavior"] = "Isolated";
  std::ofstream(tmp.path + "/isolated.json") << other.dump();
  try {
    load_tokenizer(tmp.path + "/isolated.json");
    ADD_FAILURE() << "a Split with behavior Isolated was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported Split pre-tokenizer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("MergedWithPrevious"), std::string::npos) << e.what();
  }
}

// Instruct checkpoints name another EOS in tokenizer_config.json: Alpaca targets end in it.
TEST(FamilyConfig, InstructEosAndAddFlagsComeFromTokenizerConfig) {
  llmt_test::TempDir llama_dir("family_llama3"), qwen_dir("family_qwen2"), mistral_dir("family_mistral");
  auto llama = load_tokenizer(with_config(llama_dir, "llama3", R"({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
      "tokenizer_class": "PreTrainedTokenizerFast"})"));
  EXPECT_EQ(llama->eos_id(), 1009);  // <|eot_id|>, 128009 in the real vocabulary
  EXPECT_EQ(llama->bos_id(), 1000);
  EXPECT_TRUE(llama->adds_bos());
  EXPECT_FALSE(llama->adds_eos());
  auto qwen = load_tokenizer(with_config(qwen_dir, "qwen2", R"({"bos_token": null, "eos_token": "<|im_end|>"})"));
  EXPECT_EQ(qwen->eos_id(), 1002);
  EXPECT_EQ(qwen->bos_id(), -1);
  EXPECT_FALSE(qwen->adds_bos());
  auto mistral = load_tokenizer(with_config(mistral_dir, "mistral", R"({"add_bos_token": false, "add_eos_token": true,
      "bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "LlamaTokenizer"})"));
  EXPECT_FALSE(mistral->adds_bos());
  EXPECT_TRUE(mistral->adds_eos());
  Ids with = mistral->encode_with_specials("Hello");
  ASSERT_FALSE(with.empty());
  EXPECT_NE(with.front(), 1);
  EXPECT_EQ(with.back(), 2);
}

// Qwen3: the fixture is the post-trained checkpoint's (eos <|im_end|>); -Base ones name <|endoftext|>.
// Gemma's instruct checkpoints stop at <end_of_turn> (generation_config.json) while tokenizer_config.json
// keeps <eos>; one that names <end_of_turn> gets its id.
TEST(FamilyConfig, Qwen3AndGemmaEosComeFromTokenizerConfig) {
  auto qwen3 = load_tokenizer(family_dir("qwen3"));
  EXPECT_EQ(qwen3->eos_id(), 1002);  // <|im_end|>, 151645 in the real vocabulary
  EXPECT_EQ(qwen3->bos_id(), -1);
  EXPECT_FALSE(qwen3->adds_bos());
  EXPECT_FALSE(qwen3->adds_eos());
  llmt_test::TempDir base_dir("family_qwen3_base"), gemma_dir("family_gemma_it");
  auto base = load_tokenizer(with_config(base_dir, "qwen3", R"({"bos_token": null, "eos_token": "<|endoftext|>",
      "tokenizer_class": "Qwen2Tokenizer"})"));
  EXPECT_EQ(base->eos_id(), 1000);
  auto gemma = load_tokenizer(with_config(gemma_dir, "gemma", R"({"add_bos_token": true, "add_eos_token": true,
      "bos_token": "<bos>", "eos_token": "<end_of_turn>", "tokenizer_class": "GemmaTokenizer"})"));
  EXPECT_EQ(gemma->bos_id(), 2);
  EXPECT_EQ(gemma->eos_id(), 6);  // <end_of_turn>, 107 in Gemma 2, 106 in Gemma 3
  Ids with = gemma->encode_with_specials("Hello");
  ASSERT_GE(with.size(), 3u);
  EXPECT_EQ(with.front(), 2);
  EXPECT_EQ(with.back(), 6);
}
