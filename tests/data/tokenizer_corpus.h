// Test corpora shared by the tokenizer tests: a file's bytes, and the strings the fixture scripts
// (tests/reference/make_tokenizer_fixtures.py, make_family_tokenizers.py) tokenize from a corpus.
#pragma once
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace llmt_test {

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// `rel` under the shared data folder: unit "lines" splits on "\n" (no final empty string);
// "fields" takes each Alpaca record's instruction, input, output and response, those present.
inline std::vector<std::string> corpus_strings(const std::string& rel, const std::string& unit) {
  std::string text = slurp(shared_data_dir() + "/" + rel);
  std::vector<std::string> out;
  if (unit == "lines") {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t e = text.find('\n', pos);
      if (e == std::string::npos) e = text.size();
      out.push_back(text.substr(pos, e - pos));
      pos = e + 1;
    }
    return out;
  }
  std::vector<nlohmann::json> records;
  if (rel.size() > 6 && rel.compare(rel.size() - 6, 6, ".jsonl") == 0) {
    std::istringstream ls(text);
    std::string line;
    while (std::getline(ls, line))
      if (line.find_first_not_of(" \t\r") != std::string::npos) records.push_back(nlohmann::json::parse(line));
  } else {
    for (auto& r : nlohmann::json::parse(text)) records.push_back(r);
  }
  for (auto& r : records)
    for (const char* k : {"instruction", "input", "output", "response"})
      if (r.contains(k) && r[k].is_string()) out.push_back(r[k].get<std::string>());
  return out;
}


}  // namespace llmt_test
