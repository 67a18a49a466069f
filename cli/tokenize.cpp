// llmt tokenize: text to ids (one output line per input line) or back, and a one-thread speed
// measurement of encoding a file (scripts/bench_tokenizers.py runs it beside tiktoken and HF).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"
#include "cli/commands.h"
#include "engine/core/error.h"
#include "train/flags.h"
#include "train/plan.h"

namespace llmt {

static double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if ((unsigned char)c < 0x20) o += strformat("\\u%04x", c);
    else o += c;
  }
  return o;
}

// Encodes the file as one text and then line by line (each line without its newline, as
// `llmt tokenize` reads stdin), `repeats` times each after one warm-up run; one JSON line.
static void bench(const Tokenizer& tok, const std::string& path, const std::string& tok_path, double load_s,
                  int repeats) {
  // A directory opens as a stream and reads as nothing: that would be measured as 0 bytes. The file is
  // read whole, so it must have a size: /dev/zero grew without bound (3.5 GiB in 6 s).
  struct stat st;
  LLMT_CHECK(::stat(path.c_str(), &st) == 0, "llmt tokenize --bench %s: %s", path.c_str(), std::strerror(errno));
  LLMT_CHECK(!S_ISDIR(st.st_mode), "llmt tokenize --bench %s: is a directory; give a text file to encode", path.c_str());
  LLMT_CHECK(S_ISREG(st.st_mode), "llmt tokenize --bench %s: is %s, not a regular file: the text is read whole, so "
             "give a file of a known size", path.c_str(), S_ISCHR(st.st_mode) ? "a character device"
                                                          : S_ISFIFO(st.st_mode) ? "a pipe" : "not a regular file");
  std::string where;  // the text, its lines' views and the ids: about twice the file (a 64 GB sparse file)
  const double gib = (double)st.st_size / (1024.0 * 1024.0 * 1024.0), have = memory_per_rank_gib(nullptr, 0, 1, &where);
  LLMT_CHECK(have <= 0 || 2 * gib <= have, "llmt tokenize --bench %s: %.2f GiB, read whole, needs about %.2f GiB, and "
             "%s; measure a part of it", path.c_str(), gib, 2 * gib, where.c_str());
  std::ifstream f(path, std::ios::binary);
  LLMT_CHECK(f.good(), "llmt tokenize --bench: cannot open %s", path.c_str());
  std::string text;
  char buf[1 << 16];
  while (f.read(buf, sizeof(buf)) || f.gcount() > 0) text.append(buf, (size_t)f.gcount());
  LLMT_CHECK(!f.bad(), "llmt tokenize --bench %s: read error after %zu bytes: %s", path.c_str(), text.size(),
             std::strerror(errno));
  LLMT_CHECK(!text.empty(), "llmt tokenize --bench %s: the file is empty; there is nothing to measure", path.c_str());
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t e = text.find('\n', pos);
    if (e == std::string::npos) e = text.size();
    lines.push_back(std::string_view(text).substr(pos, e - pos));
    pos = e + 1;
  }
  auto whole = [&] { return tok.encode(text).size(); };
  auto by_line = [&] {
    size_t n = 0;
    for (std::string_view l : lines) n += tok.encode(l).size();
    return n;
  };
  double cold = 0;
  auto median = [&](auto&& fn, size_t* tokens) {
    double t0 = now_s();
    *tokens = fn();
    if (cold == 0) cold = now_s() - t0;
    std::vector<double> times;
    for (int r = 0; r < repeats; r++) {
      t0 = now_s();
      size_t n = fn();
      times.push_back(now_s() - t0);
      LLMT_CHECK(n == *tokens, "llmt tokenize --bench: run %d gave %zu tokens, the first %zu", r, n, *tokens);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  size_t tokens, line_tokens;
  double med = median(whole, &tokens);
  double line_med = median(by_line, &line_tokens);
  std::printf(
      "{\"impl\": \"llmt\", \"tokenizer\": \"%s\", \"kind\": \"%s\", \"file\": \"%s\", \"bytes\": %zu, "
      "\"tokens\": %zu, \"threads\": 1, \"repeats\": %d, \"load_s\": %.4f, \"cold_s\": %.6f, \"median_s\": %.6f, "
      "\"mb_per_s\": %.2f, \"tokens_per_s\": %.0f, \"lines\": %zu, \"line_tokens\": %zu, \"lines_median_s\": %.6f, "
      "\"lines_mb_per_s\": %.2f}\n",
      json_escape(tok_path).c_str(), tok.kind().c_str(), json_escape(path).c_str(), text.size(), tokens, repeats,
      load_s, cold, med, text.size() / med / 1e6, tokens / med, lines.size(), line_tokens, line_med,
      text.size() / line_med / 1e6);
}

// Longest stdin line `llmt tokenize` takes: the input is a stream of unknown length (from /dev/zero,
// one endless line, it grew to 5 GB in 12 s), so a line is bounded; a longer one is an error.
constexpr size_t kMaxLineBytes = 16u << 20;

// The next line of `in` without its "\n" into *line; false at the end of the input.
static bool read_bounded_line(FILE* in, std::string* line, size_t line_no) {
  line->clear();
  int c;
  while ((c = getc_unlocked(in)) != EOF) {
    if (c == '\n') return true;
    LLMT_CHECK(line->size() < kMaxLineBytes, "llmt tokenize: stdin line %zu is longer than %zu MiB: it encodes one "
               "line at a time, so split the text into lines", line_no, kMaxLineBytes >> 20);
    line->push_back((char)c);
  }
  LLMT_CHECK(!std::ferror(in), "llmt tokenize: reading standard input failed after line %zu: %s", line_no,
             std::strerror(errno));
  return !line->empty();
}

int cli_tokenize(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "llmt tokenize: text on stdin to token ids on stdout, one output line per input line\n\n"
        "  --tokenizer_name_or_path P  a directory (tokenizer.json, vocab.json + merges.txt, or tokenizer.model)\n"
        "                              or one of those files (also a *.tiktoken rank file), or bytes (ids 0..255)\n"
        "  --llama3_special_tokens V   auto|3.0|3.1: names of a bare Llama 3 tokenizer.model's special tokens\n"
        "                              (auto: as params.json, config.json or generation_config.json beside it show)\n"
        "  --no_special_tokens         leave out the BOS/EOS the tokenizer adds by default\n"
        "  --decode                    read lines of space-separated ids, print their text\n"
        "  --skip_special_tokens       with --decode: leave special tokens out of the text\n"
        "  --bench FILE                encode FILE on one thread, as one text and line by line, --bench_repeats N\n"
        "                              (5) times after a warm-up; print one JSON line with MB/s and tokens/s\n");
    return 0;
  }
  Flags flags("tokenize", args);
  std::string path = flags.get_string("tokenizer_name_or_path", "");
  std::string llama3 = flags.get_string("llama3_special_tokens", "auto");
  bool no_special = flags.get_bool("no_special_tokens", false);
  bool decode = flags.get_bool("decode", false);
  bool skip_special = flags.get_bool("skip_special_tokens", false);
  std::string bench_file = flags.get_string("bench", "");
  int repeats = flags.get_int("bench_repeats", 5);
  flags.finish();
  LLMT_CHECK(!path.empty(), "llmt tokenize: --tokenizer_name_or_path is required");
  LLMT_CHECK(repeats >= 1, "llmt tokenize: --bench_repeats must be at least 1");
  LLMT_CHECK(!skip_special || decode, "llmt tokenize: --skip_special_tokens goes with --decode");

  double t0 = now_s();
  std::unique_ptr<Tokenizer> tok = load_tokenizer(path, llama3);
  double load_s = now_s() - t0;
  if (!bench_file.empty()) {
    bench(*tok, bench_file, path, load_s, repeats);
    return 0;
  }
  std::string line, out;
  size_t line_no = 0;
  while (read_bounded_line(stdin, &line, line_no + 1)) {
    line_no++;
    out.clear();
    if (decode) {
      std::vector<int32_t> ids;
      const char* s = line.c_str();
      while (*s) {
        if (*s == ' ' || *s == '\t' || *s == '\r') {
          s++;
          continue;
        }
        char* end = nullptr;
        long v = std::strtol(s, &end, 10);
        LLMT_CHECK(end != s && (*end == 0 || *end == ' ' || *end == '\t' || *end == '\r') && v >= 0 && v < (1L << 31),
                   "llmt tokenize --decode: stdin line %zu: expected token ids separated by spaces, got \"%s\"",
                   line_no, line.c_str());
        ids.push_back((int32_t)v);
        s = end;
      }
      out = tok->decode(ids, skip_special);
    } else {
      std::vector<int32_t> ids = no_special ? tok->encode(line) : tok->encode_with_specials(line);
      for (size_t i = 0; i < ids.size(); i++) {
        if (i) out += ' ';
        out += std::to_string(ids[i]);
      }
    }
    out += '\n';
    // a closed pipe or a full disk ends the run with an error (it exited 0 with nothing written)
    LLMT_CHECK(std::fwrite(out.data(), 1, out.size(), stdout) == out.size(),
               "llmt tokenize: writing standard output failed at input line %zu: %s", line_no, std::strerror(errno));
  }
  LLMT_CHECK(std::fflush(stdout) == 0, "llmt tokenize: writing standard output failed: %s", std::strerror(errno));
  return 0;
}

}  // namespace llmt
