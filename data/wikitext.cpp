#include "data/wikitext.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "data/text_files.h"
#include "data/token_cache.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/core/stop.h"

namespace llmt {

// Python's str.isspace code points (Unicode White_Space plus the ASCII separators U+001C..U+001F).
static bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool is_python_whitespace(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    uint32_t c;
    int bad;
    const int n = utf8_decode((const uint8_t*)s.data() + i, s.size() - i, &c, &bad);
    if (n == 0 || !py_space(c)) return false;
    i += (size_t)n;
  }
  return true;
}

TextLines split_lines(std::string text, LineRule rule, const std::string& what, bool keep_linebreaks) {
  const int64_t bad = find_invalid_utf8(text);
  if (bad >= 0) {
    int64_t line, col;
    line_and_column(text, bad, &line, &col);
    fail("%s: invalid UTF-8 at line %lld, column %lld (byte 0x%02x at offset %lld): the text must be UTF-8",
         what.c_str(), (long long)line, (long long)col, (unsigned)(uint8_t)text[bad], (long long)bad);
  }
  // Universal newlines: "\r\n" and a lone "\r" become "\n", as Python's text mode reads them.
  size_t w = 0;
  for (size_t r = 0; r < text.size(); r++) {
    if (text[r] == '\r') {
      text[w++] = '\n';
      if (r + 1 < text.size() && text[r + 1] == '\n') r++;
    } else {
      text[w++] = text[r];
    }
  }
  text.resize(w);
  TextLines out;
  out.buf = std::move(text);
  const int64_t n = (int64_t)out.buf.size();
  for (int64_t s = 0; s < n;) {
    const void* nl = std::memchr(out.buf.data() + s, '\n', (size_t)(n - s));
    const int64_t e = nl ? (int64_t)((const char*)nl - out.buf.data()) + 1 : n;  // keeps its "\n"
    out.begin.push_back(s);
    const bool blank = rule == LineRule::kWikitext && is_python_whitespace(std::string_view(out.buf).substr(s, e - s));
    const bool drop_break = !keep_linebreaks && rule == LineRule::kTextLoader && nl;
    out.end.push_back(blank ? s : drop_break ? e - 1 : e);
    s = e;
  }
  return out;
}

TextLines read_lines(const std::string& path, LineRule rule, bool keep_linebreaks) {
  return split_lines(read_data_file(path, "text file"), rule, path, keep_linebreaks);
}

static bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string wikitext_split_file(const std::string& dir, const std::string& config, const std::string& split) {
  static const char* configs[] = {"wikitext-2-raw-v1", "wikitext-103-raw-v1", "wikitext-2-v1", "wikitext-103-v1"};
  LLMT_CHECK(std::find(std::begin(configs), std::end(configs), config) != std::end(configs),
             "--dataset_config_name %s is not a wikitext configuration (wikitext-2-raw-v1, wikitext-103-raw-v1, "
             "wikitext-2-v1, wikitext-103-v1)",
             config.c_str());
  LLMT_CHECK(!dir.empty(), "--dataset_name wikitext needs --dataset_dir: llmt reads WikiText from local files "
                           "(wiki.train.raw, ... or train.txt, ...) and downloads nothing");
  const bool raw = config.find("-raw-") != std::string::npos;
  const std::string s = split == "validation" ? "valid" : split;
  // the original archives unpack to wikitext-2-raw/, wikitext-103-raw/, wikitext-2/, wikitext-103/
  const std::string zipdir = config.substr(0, config.size() - 3);  // drop "-v1"
  const std::string dirs[] = {dir, dir + "/" + config, dir + "/" + zipdir};
  const std::string names[] = {"wiki." + s + (raw ? ".raw" : ".tokens"), s + ".txt"};
  std::string tried;
  for (const std::string& d : dirs)
    for (const std::string& n : names) {
      const std::string p = d + "/" + n;
      if (file_exists(p)) return p;
      tried += "\n  " + p;
    }
  fail("no %s split of %s under --dataset_dir %s; looked for:%s", split.c_str(), config.c_str(), dir.c_str(),
       tried.c_str());
}

TokenDataset group_texts(const TextLines& lines, const Tokenizer& tok, int block_size, int group,
                         int64_t* dropped_tokens) {
  LLMT_CHECK(block_size >= 1, "block_size %d: the caller must choose it (run_clm: min(1024, model context))",
             block_size);
  LLMT_CHECK(group >= 1, "group_texts: group %d", group);
  const int64_t n = lines.size();
  const bool parallel = tokenizer_thread_safe(tok);
  const int64_t chunk = (int64_t)group * 64;  // lines tokenized together (bounded memory, enough for threads)
  std::vector<std::vector<int32_t>> enc;
  std::vector<int32_t> ids, cat;
  int64_t dropped = 0;
  auto t0 = std::chrono::steady_clock::now(), last = t0;
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c1 = std::min(n, c0 + chunk);
    enc.assign((size_t)(c1 - c0), {});
    std::string err;
#pragma omp parallel for schedule(dynamic, 16) if (parallel)
    for (int64_t i = c0; i < c1; i++) {
      if (stop_now()) continue;  // a signal: finish no more lines
      try {
        enc[(size_t)(i - c0)] = tok.encode_with_specials(lines.line(i));
      } catch (const std::exception& e) {
#pragma omp critical(llmt_group_texts_err)
        if (err.empty()) err = strformat("line %lld: %s", (long long)(i + 1), e.what());
      }
    }
    LLMT_CHECK(err.empty(), "tokenizing %s", err.c_str());
    throw_if_stopped("tokenizing");
    for (int64_t g0 = c0; g0 < c1; g0 += group) {  // one datasets.map batch: concatenate, cut, drop the rest
      cat.clear();
      for (int64_t i = g0; i < std::min(c1, g0 + group); i++)
        cat.insert(cat.end(), enc[(size_t)(i - c0)].begin(), enc[(size_t)(i - c0)].end());
      const int64_t keep = (int64_t)cat.size() / block_size * block_size;
      ids.insert(ids.end(), cat.begin(), cat.begin() + keep);
      dropped += (int64_t)cat.size() - keep;
    }
    auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last).count() > 10.0) {
      log_info("data   tokenized %lld / %lld lines (%.0f s)", (long long)c1, (long long)n,
               std::chrono::duration<double>(now - t0).count());
      last = now;
    }
  }
  const int64_t nb = (int64_t)ids.size() / block_size;
  std::vector<int64_t> offsets((size_t)nb + 1);
  for (int64_t b = 0; b <= nb; b++) offsets[(size_t)b] = b * block_size;
  if (dropped_tokens) *dropped_tokens = dropped;
  return TokenDataset(std::move(offsets), std::move(ids), {});
}

int64_t percent_cut(int64_t n, int pct) { return (int64_t)std::nearbyint((double)n * pct / 100.0); }

TokenDataset load_text_dataset(const std::string& path, LineRule rule, const DataArgs& args, const Tokenizer& tok,
                               int rank, const std::string& what, PercentSplit part, std::string* key) {
  LLMT_CHECK(args.block_size >= 1, "%s: block_size %d; the caller must choose it (run_clm: min(1024, model context))",
             what.c_str(), args.block_size);
  constexpr int kGroup = 1000;  // datasets.map's default batch_size, which run_clm keeps
  check_regular_file(path, what);  // first: opening a pipe would wait for a writer
  if (FILE* f = std::fopen(path.c_str(), "rb")) std::fclose(f);
  else fail("%s: cannot open text file %s: %s", what.c_str(), path.c_str(), std::strerror(errno));
  // run_clm's file types (text_files.h); the wikitext files are text whatever their extension
  const TextFileKind kind =
      rule == LineRule::kWikitext
          ? TextFileKind::text
          : text_file_kind(path, !args.validation_file.empty() && path == args.validation_file ? "--validation_file"
                                                                                                : "--train_file");
  KeyHasher h;
  h.add("llmt-text-v1").add(rule == LineRule::kWikitext ? "wikitext-lines" : "text-loader-lines");
  if (kind != TextFileKind::text) h.add(kind == TextFileKind::json ? "json-records" : "csv-records");
  if (!args.keep_linebreaks && kind == TextFileKind::text) h.add("no-linebreaks");
  h.add_int(args.block_size).add_int(kGroup).add_file(path);
  add_tokenizer_to_key(h, tok, args.tokenizer_path);
  if (part.pct > 0) h.add("percent-split").add_int(part.pct).add_int(part.head);
  if (key) *key = h.hex();
  std::string base = cache_entry_name("", path);
  if (part.pct > 0) base += strformat("-%s%d", part.head ? "first" : "after", part.pct);
  const std::string dir = resolve_cache_dir(args.cache_dir);
  overwrite_cache_entry(args.overwrite_cache, rank, dir, "text-" + base, h.hex(), what);
  CacheStats st;
  CacheUse use = CacheUse::off;
  auto t0 = std::chrono::steady_clock::now();
  TokenDataset ds = cached_dataset(
      dir, "text-" + base, h.hex(),
      [&](CacheStats* s) {
        TextLines lines = kind == TextFileKind::json  ? read_json_texts(path)
                          : kind == TextFileKind::csv ? read_csv_texts(path)
                                                      : read_lines(path, rule, args.keep_linebreaks);
        if (part.pct > 0) {  // keep the first pct% of the lines, or the rest
          const int64_t cut = percent_cut(lines.size(), part.pct);
          const int64_t from = part.head ? 0 : cut, to = part.head ? cut : lines.size();
          lines.begin = std::vector<int64_t>(lines.begin.begin() + from, lines.begin.begin() + to);
          lines.end = std::vector<int64_t>(lines.end.begin() + from, lines.end.begin() + to);
        }
        TokenizeThreads threads(args.preprocessing_num_workers);
        log_info("data   %s: tokenizing %lld lines of %s (%s)", what.c_str(), (long long)lines.size(), path.c_str(),
                 threads.describe(tokenizer_thread_safe(tok)).c_str());
        int64_t dropped = 0;
        TokenDataset d = group_texts(lines, tok, args.block_size, kGroup, &dropped);
        s->v[0] = lines.size();
        s->v[1] = dropped;
        return d;
      },
      &st, &use, rank, 60.0, tok.vocab_size());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  LLMT_CHECK(ds.size() > 0,
             "%s: %s gives no block of %d tokens (%lld lines; run_clm drops each 1000-line group's remainder, "
             "%lld tokens here)",
             what.c_str(), path.c_str(), args.block_size, (long long)st.v[0], (long long)st.v[1]);
  log_info("data   %s: %lld lines -> %lld blocks of %d tokens (%lld tokens dropped as group remainders); %s (%.1f s)",
           what.c_str(), (long long)st.v[0], (long long)ds.size(), args.block_size, (long long)st.v[1],
           describe_cache_use(use, token_cache_path(dir, "text-" + base, h.hex())).c_str(), secs);
  return ds;
}

}  // namespace llmt
