// The records of a JSON data file, one loop for every reader of them (Alpaca and chat data's
// --data_path, run_clm's .json/.jsonl --train_file): the file is one JSON array of records when its
// first character that is not whitespace (after a UTF-8 byte order mark) is '[', else JSON Lines (a
// record a line, blank lines skipped). The text is checked to be UTF-8 and for depth (json_text.h)
// before it is parsed. What the loop finds wrong it describes in a JsonRecordError; each reader words
// the message (its own, which its tests check) and the loop throws it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace llmt {

// Where a record is: its index among the records (from 0) and, in JSON Lines, its line (from 1).
struct JsonRecordPlace {
  size_t index = 0;
  int64_t line = 0;  // 0: an element of the array
  std::string where() const;  // "line 12" or "record 3"
};

struct JsonRecordError {
  enum Kind {
    invalid_utf8,   // line, column, byte
    empty_file,     // nothing but whitespace
    bad_json,       // line, column (of the file, or of the JSON line), parser (nlohmann's words)
    out_of_range,   // a number beyond double (1e309): line (JSON Lines), parser
    no_records,     // an empty array, or JSON Lines of blank lines only
  } kind;
  bool array = false;  // the file is one JSON array
  int64_t line = 0, column = 0;
  unsigned byte = 0;
  std::string parser;
};
using JsonRecordMessage = std::function<std::string(const JsonRecordError&)>;

// Calls fn on each record (a parsed value, which fn may move from) of `text`, with its place; `what`
// (the file) names it in the depth check's message, `message` words every other error. Returns
// whether the file is one array.
template <class Json>
bool for_each_json_record(const std::string& text, const std::string& what, const JsonRecordMessage& message,
                          const std::function<void(Json&, const JsonRecordPlace&)>& fn);

extern template bool for_each_json_record<nlohmann::json>(
    const std::string&, const std::string&, const JsonRecordMessage&,
    const std::function<void(nlohmann::json&, const JsonRecordPlace&)>&);
extern template bool for_each_json_record<nlohmann::ordered_json>(
    const std::string&, const std::string&, const JsonRecordMessage&,
    const std::function<void(nlohmann::ordered_json&, const JsonRecordPlace&)>&);

}  // namespace llmt
