// Plain-text language-modelling data as transformers' run_clm.py prepares it: `--train_file` /
// `--validation_file` (datasets' "text" loader) and `--dataset_name wikitext --dataset_config_name ...`
// (the Hugging Face wikitext dataset, read here from local files under --dataset_dir).
//
// Lines: universal newlines become "\n" and each line keeps its "\n" (run_clm's keep_linebreaks=True);
// the wikitext dataset further turns a line of only whitespace into "" (its loading script's
// `if row.strip(): text = row else: text = ""`). Each line is tokenized with the tokenizer's defaults
// (run_clm calls tokenizer(examples["text"]), so LLaMA puts BOS before every line), then
// group_texts under datasets.map(batched=True, batch_size=1000): the ids of each run of 1000 lines are
// concatenated and cut into block_size blocks, and that run's remainder is dropped. Labels equal ids.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"

namespace llmt {

enum class LineRule {
  kTextLoader,  // datasets' text loader with keep_linebreaks=True (run_clm --train_file)
  kWikitext,    // the wikitext dataset: as the text loader, but whitespace-only lines become ""
};

// Lines of one text, flat: line i is buf[begin[i], end[i]).
struct TextLines {
  std::string buf;
  std::vector<int64_t> begin, end;
  int64_t size() const { return (int64_t)begin.size(); }
  std::string_view line(int64_t i) const { return std::string_view(buf).substr(begin[i], end[i] - begin[i]); }
};

// Splits text as the rule says. Invalid UTF-8 is an error naming `what`, line and column (Python's
// strict UTF-8 decoding fails on such a file too).
// keep_linebreaks false (run_clm's --keep_linebreaks False): a text-loader line without its "\n".
TextLines split_lines(std::string text, LineRule rule, const std::string& what, bool keep_linebreaks = true);
TextLines read_lines(const std::string& path, LineRule rule, bool keep_linebreaks = true);

// Python's str.isspace() over the whole of s (true for ""): the wikitext script's `not row.strip()`.
// False where s is not valid UTF-8.
bool is_python_whitespace(std::string_view s);

// The file of `split` ("train", "validation", "test") for wikitext config `config`
// (wikitext-2-raw-v1, wikitext-103-raw-v1: wiki.<s>.raw; wikitext-2-v1, wikitext-103-v1: wiki.<s>.tokens;
// any: <s>.txt; s = train / valid / test), looked for in dir, dir/<config>, and the directory the
// original zip unpacks to (wikitext-2-raw, wikitext-103, ...). Throws listing every path tried.
std::string wikitext_split_file(const std::string& dir, const std::string& config, const std::string& split);

// Tokenizes lines and groups them (see above). group is 1000 (datasets.map's batch_size) in run_clm.
// *dropped_tokens gets the tokens left over in the groups' remainders.
TokenDataset group_texts(const TextLines& lines, const Tokenizer& tok, int block_size, int group,
                         int64_t* dropped_tokens);

// Part of a file's lines, as datasets' percent slicing takes it (run_clm's --validation_split_percentage):
// pct 0 is the whole file; else the first pct% of the lines (head) or the rest, the cut at
// round(n * pct / 100) with ties to even (Python's round).
struct PercentSplit {
  int pct = 0;
  bool head = false;
};
int64_t percent_cut(int64_t n, int pct);

// The grouped dataset of one text file (or part of it), through the token cache; `what` names it in logs.
// *key (when given) gets the token cache key, the dataset's identity (DataIdentity).
TokenDataset load_text_dataset(const std::string& path, LineRule rule, const DataArgs& args, const Tokenizer& tok,
                               int rank, const std::string& what, PercentSplit part = {}, std::string* key = nullptr);

}  // namespace llmt
