// run_clm's --train_file / --validation_file types, as datasets.load_dataset reads them by extension
// (run_clm.py: the extension picks the builder, "txt" meaning "text"):
//   .txt          the text loader: a record a line (wikitext.h says how lines are split);
//   .json, .jsonl JSON Lines, or one JSON array of objects: a record an object;
//   .csv          a header row, then a record a row (RFC 4180 quoting: quoted fields may hold commas,
//                 newlines and doubled quotes), as pandas reads it.
// A record's text is its "text" column, else its first (in the file's order), as run_clm takes it.
// Each text is then tokenized and grouped as the text loader's lines are (group_texts). Anything else
// (.parquet, .arrow, .tsv, a name with no extension) is refused with the one-line datasets command
// that writes it as JSON Lines.
#pragma once
#include <string>

#include "data/wikitext.h"

namespace llmt {

enum class TextFileKind { text, json, csv };

// The kind of `path` by its extension; `flag` ("--train_file") names it in the refusal.
TextFileKind text_file_kind(const std::string& path, const std::string& flag);
// Every record's text, in order, as TextLines (one "line" a record). Errors name the file, the record
// (JSON: its line, or its index in the array; CSV: its row) and what was expected.
TextLines read_json_texts(const std::string& path);
TextLines read_csv_texts(const std::string& path);
// The column run_clm takes from records whose columns are `columns` (in the file's order).
std::string text_column(const std::vector<std::string>& columns);

}  // namespace llmt
