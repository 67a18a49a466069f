#include "data/text_files.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "data/json_records.h"
#include "data/utf8.h"
#include "engine/core/error.h"

namespace llmt {

namespace {

std::string extension_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = name.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? "" : name.substr(dot + 1);
}

// A record's text appended to out as one "line".
void add_text(TextLines& out, const std::string& text) {
  out.begin.push_back((int64_t)out.buf.size());
  out.buf += text;
  out.end.push_back((int64_t)out.buf.size());
}

void check_utf8(const std::string& text, const std::string& path) {
  const int64_t bad = find_invalid_utf8(text);
  if (bad < 0) return;
  int64_t line, col;
  line_and_column(text, bad, &line, &col);
  fail("%s: invalid UTF-8 at line %lld, column %lld (byte 0x%02x): the file must be UTF-8", path.c_str(),
       (long long)line, (long long)col, (unsigned)(uint8_t)text[bad]);
}

}  // namespace

TextFileKind text_file_kind(const std::string& path, const std::string& flag) {
  const std::string ext = extension_of(path);
  if (ext == "txt") return TextFileKind::text;
  if (ext == "json" || ext == "jsonl") return TextFileKind::json;
  if (ext == "csv") return TextFileKind::csv;
  // the datasets builder that reads it, where there is one, for the command that converts it
  std::string load;
  if (ext == "parquet" || ext == "arrow") load = strformat("'%s', data_files='%s'", ext.c_str(), path.c_str());
  else if (ext == "tsv") load = strformat("'csv', data_files='%s', delimiter='\\t'", path.c_str());
  const std::string out = path.substr(0, path.size() - ext.size() - (ext.empty() ? 0 : 1)) + ".jsonl";
  if (!load.empty())
    fail("%s %s: llmt reads run_clm's file types, .txt, .json/.jsonl and .csv, not .%s; write it as JSON Lines "
         "with: python3 -c \"import datasets; datasets.load_dataset(%s, split='train').to_json('%s')\"",
         flag.c_str(), path.c_str(), ext.c_str(), load.c_str(), out.c_str());
  fail("%s %s: llmt reads run_clm's file types by extension, .txt (a record a line), .json/.jsonl (records with a "
       "\"text\" field) and .csv (a header, then rows), not %s; rename a plain text file to .txt",
       flag.c_str(), path.c_str(), ext.empty() ? "a name without one" : ("." + ext).c_str());
}

std::string text_column(const std::vector<std::string>& columns) {
  if (columns.empty()) return "";
  return std::find(columns.begin(), columns.end(), "text") != columns.end() ? "text" : columns[0];
}

TextLines read_json_texts(const std::string& path) {
  using ojson = nlohmann::ordered_json;
  const std::string text = read_data_file(path, "JSON file");
  std::vector<ojson> records;
  std::vector<std::string> where;  // "line 12" or "record 3", for the errors
  auto message = [&](const JsonRecordError& e) -> std::string {
    switch (e.kind) {
      case JsonRecordError::invalid_utf8:
        return strformat("%s: invalid UTF-8 at line %lld, column %lld (byte 0x%02x): the file must be UTF-8",
                         path.c_str(), (long long)e.line, (long long)e.column, e.byte);
      case JsonRecordError::bad_json:
      case JsonRecordError::out_of_range:
        return e.array ? strformat("%s: not valid JSON (a file starting with '[' is read as one array of records)",
                                   path.c_str())
                       : strformat("%s: line %lld is not valid JSON (a .json/.jsonl file is JSON Lines, an object a "
                                   "line, or one array of objects)", path.c_str(), (long long)e.line);
      case JsonRecordError::empty_file:
      case JsonRecordError::no_records: return strformat("%s: no records with a field", path.c_str());
    }
    return path;
  };
  for_each_json_record<ojson>(text, path, message, [&](ojson& j, const JsonRecordPlace& at) {
    records.push_back(std::move(j));
    where.push_back(at.where());
  });
  // the columns in order of first appearance, as datasets infers them over the records
  std::vector<std::string> columns;
  for (size_t i = 0; i < records.size(); i++) {
    LLMT_CHECK(records[i].is_object(), "%s: %s is a JSON %s, expected an object (a record with a \"text\" field)",
               path.c_str(), where[i].c_str(), records[i].type_name());
    for (auto it = records[i].begin(); it != records[i].end(); ++it)
      if (std::find(columns.begin(), columns.end(), it.key()) == columns.end()) columns.push_back(it.key());
  }
  LLMT_CHECK(!records.empty() && !columns.empty(), "%s: no records with a field", path.c_str());
  const std::string column = text_column(columns);
  TextLines out;
  for (size_t i = 0; i < records.size(); i++) {
    auto it = records[i].find(column);
    LLMT_CHECK(it != records[i].end() && it->is_string(), "%s: %s: field \"%s\" is %s, expected a string (the text "
               "column is \"text\", else the first field)", path.c_str(), where[i].c_str(), column.c_str(),
               it == records[i].end() ? "missing" : it->type_name());
    add_text(out, it->get<std::string>());
  }
  return out;
}

TextLines read_csv_texts(const std::string& path) {
  const std::string text = read_data_file(path, "CSV file");
  check_utf8(text, path);
  // RFC 4180: rows of fields split by ',', a quoted field holding commas, newlines and "" for a quote
  std::vector<std::vector<std::string>> rows;
  std::vector<size_t> row_line;  // the line each row starts at, for the errors
  std::vector<std::string> row;
  std::string field;
  size_t line = 1, start_line = 1;
  bool quoted = false, was_quoted = false, any = false;
  auto end_field = [&] {
    row.push_back(std::move(field));
    field.clear();
    was_quoted = false;
  };
  auto end_row = [&] {
    end_field();
    const bool blank = row.size() == 1 && row[0].empty() && !any;  // pandas skips blank lines
    if (!blank) rows.push_back(std::move(row)), row_line.push_back(start_line);
    row.clear();
    any = false;
  };
  for (size_t i = 0; i < text.size(); i++) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', i++;
      else if (c == '"') quoted = false;
      else field += c, line += c == '\n';
      continue;
    }
    if (c == '"' && field.empty() && !was_quoted) {
      quoted = was_quoted = any = true;
      if (row.empty()) start_line = line;
    } else if (c == ',') {
      if (row.empty() && field.empty()) start_line = line;
      end_field();
      any = true;
    } else if (c == '\r' || c == '\n') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') i++;
      end_row();
      line++;
      start_line = line;
    } else {
      LLMT_CHECK(!was_quoted, "%s: line %zu: text after a quoted field's closing quote", path.c_str(), line);
      field += c;
      any = true;
    }
  }
  LLMT_CHECK(!quoted, "%s: a quoted field opened at line %zu is never closed", path.c_str(), start_line);
  if (!field.empty() || !row.empty() || any) end_row();
  LLMT_CHECK(rows.size() >= 2, "%s: %s", path.c_str(),
             rows.empty() ? "empty: a CSV file needs a header row, then rows" : "a header row and no rows");
  const std::vector<std::string>& header = rows[0];
  const std::string column = text_column(header);
  const size_t at = (size_t)(std::find(header.begin(), header.end(), column) - header.begin());
  TextLines out;
  for (size_t r = 1; r < rows.size(); r++) {
    LLMT_CHECK(rows[r].size() == header.size(), "%s: line %zu has %zu fields, the header %zu", path.c_str(),
               row_line[r], rows[r].size(), header.size());
    LLMT_CHECK(!rows[r][at].empty(), "%s: line %zu: column \"%s\" is empty (pandas reads it as NaN, which is no "
               "text)", path.c_str(), row_line[r], column.c_str());
    add_text(out, rows[r][at]);
  }
  return out;
}

}  // namespace llmt
