#include "data/json_records.h"

#include <string_view>

#include "data/dataset.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"

namespace llmt {

std::string JsonRecordPlace::where() const {
  return line > 0 ? strformat("line %lld", (long long)line) : strformat("record %zu", index);
}

// nlohmann's message without its own position (which would count lines within one JSON line)
static std::string parser_words(const std::exception& e) {
  std::string m = e.what();
  const size_t c = m.find(", column ");
  const size_t colon = c == std::string::npos ? std::string::npos : m.find(": ", c);
  return colon == std::string::npos ? m : m.substr(colon + 2);
}

template <class Json>
bool for_each_json_record(const std::string& text, const std::string& what, const JsonRecordMessage& message,
                          const std::function<void(Json&, const JsonRecordPlace&)>& fn) {
  JsonRecordError err{};
  auto raise = [&](JsonRecordError::Kind kind) {
    err.kind = kind;
    fail("%s", message(err).c_str());
  };
  const int64_t bad = find_invalid_utf8(text);
  if (bad >= 0) {
    line_and_column(text, bad, &err.line, &err.column);
    err.byte = (unsigned)(uint8_t)text[(size_t)bad];
    raise(JsonRecordError::invalid_utf8);
  }
  const size_t bom = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  const size_t first = text.find_first_not_of(" \t\r\n\v\f", bom);
  if (first == std::string::npos) raise(JsonRecordError::empty_file);
  err.array = text[first] == '[';
  JsonRecordPlace place;
  if (err.array) {
    check_json_depth(text, what);
    Json all;
    try {
      all = Json::parse(text);
    } catch (const typename Json::out_of_range& e) {  // a number beyond double (1e309)
      err.parser = e.what();
      raise(JsonRecordError::out_of_range);
    } catch (const typename Json::parse_error& e) {
      line_and_column(text, e.byte > 0 ? (int64_t)e.byte - 1 : 0, &err.line, &err.column);
      err.parser = parser_words(e);
      raise(JsonRecordError::bad_json);
    }
    if (!all.is_array() || all.empty()) raise(JsonRecordError::no_records);
    for (place.index = 0; place.index < all.size(); place.index++) fn(all[place.index], place);
    return true;
  }
  for (size_t s = 0; s < text.size();) {
    size_t e = text.find('\n', s);
    if (e == std::string::npos) e = text.size();
    place.line++;
    const std::string_view line(text.data() + s, e - s);
    s = e + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    check_json_depth(line.data(), line.data() + line.size(), what + ": " + place.where());
    Json j;
    try {
      j = Json::parse(line);
    } catch (const typename Json::out_of_range& x) {
      err.line = place.line;
      err.parser = x.what();
      raise(JsonRecordError::out_of_range);
    } catch (const typename Json::parse_error& x) {
      err.line = place.line;
      err.column = x.byte > 0 ? (int64_t)x.byte : 1;
      err.parser = parser_words(x);
      raise(JsonRecordError::bad_json);
    }
    fn(j, place);
    place.index++;
  }
  if (place.index == 0) raise(JsonRecordError::no_records);
  return false;
}

template bool for_each_json_record<nlohmann::json>(const std::string&, const std::string&, const JsonRecordMessage&,
                                                   const std::function<void(nlohmann::json&, const JsonRecordPlace&)>&);
template bool for_each_json_record<nlohmann::ordered_json>(
    const std::string&, const std::string&, const JsonRecordMessage&,
    const std::function<void(nlohmann::ordered_json&, const JsonRecordPlace&)>&);

}  // namespace llmt
