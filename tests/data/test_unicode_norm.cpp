// NFC (data/unicode_norm.h) against Hugging Face tokenizers' NFC normalizer on every case of
// tests/reference/tokenizers/nfc_cases.json (made by tests/reference/make_nfc_fixtures.py), and the
// byte-level BPE loader with an NFC normalizer against the ids tokenizers gives.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"
#include "data/unicode_norm.h"
#include "engine/core/error.h"
#include "tests/test_util.h"

using namespace llmt;
using Ids = std::vector<int32_t>;

namespace {

const nlohmann::json& fixture() {
  static const nlohmann::json* fx = [] {
    std::ifstream f(llmt_test::reference_dir() + "/tokenizers/nfc_cases.json", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return new nlohmann::json(nlohmann::json::parse(ss.str()));
  }();
  return *fx;
}

// A JSON string with every non-ASCII character as \uXXXX: marks readable in a failure message.
std::string escaped(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', true); }

std::string json_path(const std::string& name) {
  return "/tmp/llmt_nfc_" + std::to_string(getpid()) + "_" + name + ".json";
}

// `j` loaded as a tokenizer.json file (written, loaded, removed).
std::unique_ptr<Tokenizer> load_json(const nlohmann::json& j, const std::string& name) {
  std::string path = json_path(name);
  std::ofstream(path, std::ios::binary) << j.dump();
  struct Remove {
    std::string p;
    ~Remove() { std::remove(p.c_str()); }
  } remove{path};
  return load_tokenizer(path);
}

}  // namespace

TEST(UnicodeNfc, MatchesHfTokenizersOnEveryFixtureCase) {
  const nlohmann::json& fx = fixture();
  ASSERT_TRUE(fx.contains("groups"));
  size_t total = 0;
  for (const char* group : {"codepoints", "hangul", "random", "nfc_text"}) {
    const nlohmann::json& cases = fx["groups"][group];
    ASSERT_GT(cases.size(), 30u) << group;
    int bad = 0;
    for (const auto& c : cases) {
      std::string in = c[0].get<std::string>(), want = c[1].get<std::string>();
      std::string got = utf8_nfc(in);
      if (got != want && bad++ < 5)
        ADD_FAILURE() << group << ": " << escaped(in) << "\n  llmt     " << escaped(got) << "\n  expected "
                      << escaped(want);
      total++;
    }
    EXPECT_EQ(bad, 0) << group;
  }
  EXPECT_GT(total, 10000u);
}

TEST(UnicodeNfc, FollowsTokenizersWhereItDiffersFromUnicode16) {
  // tokenizers' NFC has Unicode 9.0 tables: the fixture lists where that differs from Unicode 16.0,
  // and llmt gives tokenizers' answer (never Unicode 16.0's) on each
  const nlohmann::json& d = fixture()["disagreements"];
  ASSERT_GT(d.size(), 0u);
  for (const auto& e : d) {
    std::string in = e["input"].get<std::string>();
    EXPECT_EQ(utf8_nfc(in), e["tokenizers"].get<std::string>()) << escaped(in);
  }
  // U+11935 U+11930 (Dives Akuru, Unicode 13) composes to U+11938 in Unicode 16.0, not in tokenizers
  EXPECT_EQ(utf8_nfc("\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0"), "\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0");
}

TEST(UnicodeNfc, FastPathAndInvalidUtf8) {
  // nothing below U+0300 changes: text made of those comes back as it is
  std::string low;
  for (uint32_t cp = 1; cp < 0x300; cp++) {
    if (cp < 0x80) low += (char)cp;
    else low += (char)(0xC0 | (cp >> 6)), low += (char)(0x80 | (cp & 0x3F));
  }
  EXPECT_EQ(utf8_nfc(low), low);
  EXPECT_EQ(utf8_nfc(""), "");
  EXPECT_EQ(utf8_nfc("Caf\xC3\xA9 na\xC3\xAFve"), "Caf\xC3\xA9 na\xC3\xAFve");
  // the slow path composes and reorders: e U+0301 -> U+00E9; a U+0301 U+0323 -> U+1EA1 U+0301
  EXPECT_EQ(utf8_nfc("e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(utf8_nfc("a\xCC\x81\xCC\xA3"), "\xE1\xBA\xA1\xCC\x81");
  // invalid UTF-8 passes through byte for byte and blocks: no composition across a bad byte
  EXPECT_EQ(utf8_nfc("e\xFF\xCC\x81"), "e\xFF\xCC\x81");
  EXPECT_EQ(utf8_nfc("e\xCC"), "e\xCC");                  // a truncated U+0301
  EXPECT_EQ(utf8_nfc("\xCC\x81\x80\xC0\xAF"), "\xCC\x81\x80\xC0\xAF");  // stray continuation, overlong
  EXPECT_EQ(utf8_nfc("\xED\xA0\x80" "e\xCC\x81"), "\xED\xA0\x80\xC3\xA9");  // a surrogate stays; é composes
  // a mark after a bad byte is not reordered across it: U+0323 stays after the byte, U+0301 before
  EXPECT_EQ(utf8_nfc("a\xCC\x81\xFE\xCC\xA3"), "\xC3\xA1\xFE\xCC\xA3");
  // invalid bytes between valid text that does change
  EXPECT_EQ(utf8_nfc("\xFF" "A\xCC\x8A\xFF"), "\xFF\xC3\x85\xFF");
}

TEST(UnicodeNfc, BytelevelTokenizerJsonWithNfcMatchesHfIds) {
  const nlohmann::json& t = fixture()["tokenizer"];
  auto tok = load_json(t["tokenizer_json"], "qwen2like");
  for (const auto& e : t["encode"]) {
    std::string text = e["text"].get<std::string>();
    EXPECT_EQ(tok->encode(text), e["ids"].get<Ids>()) << escaped(text);
  }
  // a decomposed é (e U+0301) and the composed one are the same ids; decoding gives the composed one
  Ids composed = tok->encode("caf\xC3\xA9"), decomposed = tok->encode("cafe\xCC\x81");
  EXPECT_EQ(decomposed, composed);
  EXPECT_EQ(tok->decode(decomposed), "caf\xC3\xA9");

  // a Sequence of NFCs is NFC too
  nlohmann::json j = t["tokenizer_json"];
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFC"}}}}};
  EXPECT_EQ(load_json(j, "seq")->encode("cafe\xCC\x81"), composed);
  // without the normalizer, the decomposed é is other ids
  j["normalizer"] = nullptr;
  EXPECT_NE(load_json(j, "none")->encode("cafe\xCC\x81"), composed);
}

TEST(UnicodeNfc, OtherNormalizersAreRefusedByName) {
  nlohmann::json j = fixture()["tokenizer"]["tokenizer_json"];
  for (const char* name : {"NFKC", "NFD", "Lowercase", "Strip"}) {
    j["normalizer"] = {{"type", name}};
    llmt_test::expect_error([&] { load_json(j, name); },
                            {json_path(name), std::string("normalizer \"") + name + "\" is not supported"});
  }
  // one that is not NFC inside a Sequence is named
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  llmt_test::expect_error([&] { load_json(j, "seq_bad"); }, {"normalizer \"Lowercase\" is not supported"});
}
