// run_clm's --train_file types (data/text_files.h) against what the `datasets` loaders that run_clm
// calls give for the same files (tests/reference/make_text_file_fixtures.py wrote the files and
// expected.json), and the refusals of what run_clm's loaders would not read as text.
#include <gtest/gtest.h>

#include <fstream>
#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "data/text_files.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"
#include "tests/test_util.h"

namespace llmt {
namespace {

using llmt_test::error_of;

std::vector<std::string> texts_of(const TextLines& t) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < t.size(); i++) out.emplace_back(t.line(i));
  return out;
}

std::string write(const std::string& dir, const std::string& name, const std::string& content) {
  const std::string p = dir + "/" + name;
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

TEST(TextFiles, EachTypeGivesTheTextsDatasetsLoadersGive) {
  const std::string dir = llmt_test::reference_dir() + "/text_files";
  std::ifstream f(dir + "/expected.json");
  ASSERT_TRUE(f.good()) << dir << "/expected.json";
  const nlohmann::json expected = nlohmann::json::parse(f)["files"];
  ASSERT_EQ(expected.size(), 5u);
  for (auto& [name, want] : expected.items()) {
    SCOPED_TRACE(name);
    const std::string path = dir + "/" + name;
    switch (text_file_kind(path, "--train_file")) {
      case TextFileKind::json:
        EXPECT_EQ(texts_of(read_json_texts(path)), want.get<std::vector<std::string>>());
        break;
      case TextFileKind::csv:
        EXPECT_EQ(texts_of(read_csv_texts(path)), want.get<std::vector<std::string>>());
        break;
      case TextFileKind::text:
        EXPECT_EQ(texts_of(read_lines(path, LineRule::kTextLoader, true)),
                  want["keep_linebreaks"].get<std::vector<std::string>>());
        EXPECT_EQ(texts_of(read_lines(path, LineRule::kTextLoader, false)),
                  want["no_linebreaks"].get<std::vector<std::string>>());
        break;
    }
  }
}

TEST(TextFiles, WhatRunClmWouldNotReadAsTextIsRefusedSayingHowToConvertIt) {
  EXPECT_NE(error_of([] { text_file_kind("/d/data.parquet", "--train_file"); })
                .find("datasets.load_dataset('parquet', data_files='/d/data.parquet', split='train')"
                      ".to_json('/d/data.jsonl')"),
            std::string::npos);
  EXPECT_NE(error_of([] { text_file_kind("/d/data.tsv", "--validation_file"); }).find("delimiter='\\t'"),
            std::string::npos);
  EXPECT_NE(error_of([] { text_file_kind("/d/corpus", "--train_file"); }).find("not a name without one"),
            std::string::npos);
  EXPECT_NE(error_of([] { text_file_kind("/d/notes.md", "--train_file"); }).find("not .md; rename"),
            std::string::npos);
}

TEST(TextFiles, BadRecordsAreNamed) {
  llmt_test::TempDir tmp("text_files");
  const std::string& d = tmp.path;
  EXPECT_NE(error_of([&] { read_json_texts(write(d, "a.jsonl", "{\"text\": \"ok\"}\n{\"text\": 5}\n")); })
                .find("line 2: field \"text\" is number, expected a string"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_json_texts(write(d, "b.jsonl", "{\"text\": \"ok\"}\n{\"other\": \"x\"}\n")); })
                .find("line 2: field \"text\" is missing"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_json_texts(write(d, "c.jsonl", "{\"text\": \"ok\"}\nnot json\n")); })
                .find("line 2 is not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_json_texts(write(d, "d.json", "[{\"text\": \"ok\"}, [1]]")); })
                .find("record 1 is a JSON array, expected an object"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_csv_texts(write(d, "e.csv", "text,n\nfine,1\ntoo,many,2\n")); })
                .find("line 3 has 3 fields, the header 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_csv_texts(write(d, "f.csv", "text,n\n,1\n")); }).find("column \"text\" is empty"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_csv_texts(write(d, "g.csv", "text\n\"never closed\n")); })
                .find("opened at line 2 is never closed"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_csv_texts(write(d, "h.csv", "text\n")); }).find("a header row and no rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_json_texts(write(d, "i.jsonl", "{\"text\": \"caf\xc3\"}\n")); }).find("invalid UTF-8"),
            std::string::npos);
}

// End to end: the records of a .jsonl and a .csv holding a .txt file's lines (each with its "\n")
// give the .txt file's blocks, token for token: the same texts, tokenized and grouped alike. And
// --keep_linebreaks False drops the breaks, as datasets' text loader does.
TEST(TextFiles, RecordsHoldingATextsLinesGiveItsBlocks) {
  llmt_test::TempDir tmp("text_blocks");
  std::string txt, jsonl, csv = "text\n";
  for (int i = 0; i < 1500; i++) {
    const std::string line = "line " + std::to_string(i) + ": the quick brown fox, \"quoted\"";
    txt += line + "\n";
    jsonl += nlohmann::json{{"n", i}, {"text", line + "\n"}}.dump() + "\n";
    std::string q = line;
    for (size_t at = q.find('"'); at != std::string::npos; at = q.find('"', at + 2)) q.insert(at, "\"");
    csv += "\"" + q + "\n\"\n";
  }
  std::unique_ptr<Tokenizer> tok = load_tokenizer("bytes");
  DataArgs a;
  a.block_size = 32;
  a.cache_dir = "none";
  auto blocks = [&](const std::string& name, const std::string& content, bool keep = true) {
    a.keep_linebreaks = keep;
    const TokenDataset d = load_text_dataset(write(tmp.path, name, content), LineRule::kTextLoader, a, *tok, 0, name);
    return std::vector<int32_t>(d.ids_data(), d.ids_data() + d.total_tokens());
  };
  const std::vector<int32_t> want = blocks("lines.txt", txt);
  ASSERT_GT(want.size(), 32u * 100);
  EXPECT_EQ(blocks("lines.jsonl", jsonl), want);
  EXPECT_EQ(blocks("lines.csv", csv), want);
  const std::vector<int32_t> no_breaks = blocks("lines.txt", txt, false);
  EXPECT_LT(no_breaks.size(), want.size());
  EXPECT_EQ(std::count(no_breaks.begin(), no_breaks.end(), (int32_t)'\n'), 0);
}

}  // namespace
}  // namespace llmt
