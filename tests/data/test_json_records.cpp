// The one loop over a JSON data file's records (data/json_records.h) that Alpaca, chat data and
// run_clm's .json/.jsonl files share: array or JSON Lines, each record's place, and what it reports
// to the reader's own wording of each error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/json_records.h"
#include "engine/core/error.h"

namespace llmt {
namespace {

using ojson = nlohmann::ordered_json;

struct Seen {
  std::vector<std::string> where, keys;
  bool array = false;
};
Seen read(const std::string& text) {
  Seen s;
  auto message = [](const JsonRecordError& e) {
    return strformat("kind %d array %d line %lld column %lld byte %02x: %s", (int)e.kind, (int)e.array,
                     (long long)e.line, (long long)e.column, e.byte, e.parser.c_str());
  };
  s.array = for_each_json_record<ojson>(text, "f.json", message, [&](ojson& j, const JsonRecordPlace& at) {
    s.where.push_back(at.where() + "#" + std::to_string(at.index));
    s.keys.push_back(j.empty() ? "" : j.begin().key());
  });
  return s;
}
std::string error_of(const std::string& text) {
  try {
    read(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(JsonRecords, ArrayOrLinesWithEachRecordsPlace) {
  Seen a = read("\xEF\xBB\xBF \n[{\"b\": 1, \"a\": 2}, {\"c\": 3}]");  // a byte order mark, then the array
  EXPECT_TRUE(a.array);
  EXPECT_EQ(a.where, (std::vector<std::string>{"record 0#0", "record 1#1"}));
  EXPECT_EQ(a.keys, (std::vector<std::string>{"b", "c"}));  // ordered_json keeps the file's order
  Seen l = read("\n{\"x\": 1}\r\n  \t\n{\"y\": 2}");  // blank lines skipped, counted
  EXPECT_FALSE(l.array);
  EXPECT_EQ(l.where, (std::vector<std::string>{"line 2#0", "line 4#1"}));
  // nlohmann::json (Alpaca's) too
  int n = 0;
  for_each_json_record<nlohmann::json>("[{}, {}]", "f", [](const JsonRecordError&) { return std::string("?"); },
                                       [&](nlohmann::json&, const JsonRecordPlace&) { n++; });
  EXPECT_EQ(n, 2);
}

TEST(JsonRecords, EachProblemReachesTheReadersWords) {
  EXPECT_EQ(error_of("{\"a\": 1}\n{\"a\": \"\xff\"}"), "kind 0 array 0 line 2 column 8 byte ff: ");
  EXPECT_EQ(error_of(" \n\v\f\r\n"), "kind 1 array 0 line 0 column 0 byte 00: ");
  EXPECT_EQ(error_of("[\n {\"a\": oops}\n]").substr(0, 42), "kind 2 array 1 line 2 column 8 byte 00: sy");
  EXPECT_EQ(error_of("{\"a\": 1}\n{\"a\" 1}").substr(0, 42), "kind 2 array 0 line 2 column 6 byte 00: sy");
  EXPECT_NE(error_of("{\"a\": 1e999}").find("kind 3 array 0 line 1"), std::string::npos);
  EXPECT_EQ(error_of("[]"), "kind 4 array 1 line 0 column 0 byte 00: ");
  EXPECT_EQ(error_of("\n \n"), "kind 1 array 0 line 0 column 0 byte 00: ");
  // nesting is refused before the parser sees it, in the array and in a line, naming the file and line
  EXPECT_NE(error_of(std::string(500, '[')).find("f.json"), std::string::npos);
  EXPECT_NE(error_of("{}\n{\"a\": " + std::string(500, '[') + "}").find("f.json: line 2"), std::string::npos);
}

}  // namespace
}  // namespace llmt
