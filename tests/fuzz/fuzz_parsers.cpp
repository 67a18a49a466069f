// A deterministic mutation fuzzer for every file format llmt reads (issue 11): seeds from the
// project's fixtures, mutated (bit flips, interesting bytes and tokens, deletions, duplications,
// truncation) and handed to the parser. A parser may accept the input or throw llmt::Error; any
// other exception (std::bad_alloc from an unbounded allocation, nlohmann's own errors), a crash or
// a memory blow-up past the address-space limit is a finding. The input being tried is always on
// disk (<out>/<target>.current), so a crash leaves it behind; a finding is copied to
// <out>/<target>-<n>.crash. Inputs under tests/fuzz/regressions/<target>/ run first, every time.
//
//   llmt_fuzz TARGET [--seconds S] [--iterations N] [--seed K] [--out DIR]
//   TARGET: safetensors config bpe tokenizer_json sp_model alpaca manifest token_cache hostfile
//           chat_template
// ctest runs each target for a bounded time (tests/CMakeLists: fuzz.*).
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <random>
#include <string>
#include <vector>

#include "data/alpaca.h"
#include "data/bpe_bytelevel.h"
#include "data/chat_template.h"
#include "data/dataset.h"
#include "data/sentencepiece.h"
#include "data/token_cache.h"
#include "data/tokenizer.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/core/error.h"
#include "engine/formats/safetensors.h"
#include "models/config.h"

using namespace llmt;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "llmt_fuzz: cannot read seed %s\n", path.c_str());
    std::exit(2);
  }
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

// One target: its seeds and how to feed one input (already written to `path`) to the parser.
struct Target {
  std::vector<std::string> seeds;
  std::string file_name;  // what the input file is called (parsers look at names)
  std::function<void(const std::string& path, const std::string& dir)> run;
  size_t hot_bytes = 0;  // > 0: mutate only the first hot_bytes (a safetensors header, not its data)
};

const char* const kTokens[] = {"1e309", "-1", "99999999999999999999", "2147483648", "[[[[[[[[", "]]]]",
                               "{{{{", "null", "\"\"", ":", ",", "true", "0.5", "\"\\u0000\"", "\\\"",
                               "NaN", "\xff\xfe", "\r\n", "#", "=", "slots=", "\n\n",
                               // chat templates
                               "{{", "}}", "{%", "%}", "{% for x in messages %}", "{% endfor %}", "{% if 1 %}",
                               "{% endif %}", "{% set x %}", "{% endset %}", "{% break %}", "(((((", "|first",
                               ".0", "[::-1]", "* 99999999999", "not not", " < 1 < ", "\\x4", "\\U0011",
                               "-%}", "+%}", "range(9223372036854775806)"};

std::string mutate(std::string s, size_t hot_bytes, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n ? (size_t)(rng() % n) : 0; };
  const int rounds = 1 + (int)pick(4);
  for (int r = 0; r < rounds; r++) {
    const size_t at = pick((hot_bytes ? std::min(hot_bytes, s.size()) : s.size()) + 1);
    switch (pick(7)) {
      case 0:  // flip a bit
        if (at < s.size()) s[at] ^= (char)(1u << pick(8));
        break;
      case 1: {  // an interesting byte
        const char bytes[] = {'[', '{', '"', '9', '-', '\0', (char)0xff, '\\', ' ', '.'};
        if (at < s.size()) s[at] = bytes[pick(sizeof(bytes))];
        break;
      }
      case 2:  // an interesting token
        s.insert(at, kTokens[pick(sizeof(kTokens) / sizeof(kTokens[0]))]);
        break;
      case 3:  // delete a range
        if (at < s.size()) s.erase(at, 1 + pick(std::min<size_t>(64, s.size() - at)));
        break;
      case 4: {  // duplicate a range
        if (at < s.size()) s.insert(at, s.substr(at, 1 + pick(std::min<size_t>(256, s.size() - at))));
        break;
      }
      case 5:  // truncate
        s.resize(at);
        break;
      case 6: {  // a digit run made huge
        size_t d = s.find_first_of("0123456789", at);
        if (d != std::string::npos) s.insert(d, std::string(1 + pick(20), '9'));
        break;
      }
    }
  }
  return s;
}

std::map<std::string, Target> make_targets(const std::string& src, const std::string& work) {
  std::map<std::string, Target> t;
  const std::string ref = src + "/tests/reference";
  t["safetensors"] = {{read_all(ref + "/gpt2_tiny/model.safetensors"), read_all(ref + "/llama_tiny/model.safetensors")},
                      "model.safetensors", [](const std::string& p, const std::string&) {
                        SafetensorsFile f(p);
                        std::vector<float> buf;
                        for (const StTensor& x : f.tensors()) {
                          if (x.numel() > (1 << 20)) continue;
                          buf.resize((size_t)x.numel());
                          f.read_f32(x, buf.data());
                        }
                      }, 4096};
  t["config"] = {{read_all(ref + "/gpt2_tiny/config.json"), read_all(ref + "/llama_tiny/config.json")},
                 "config.json", [](const std::string& p, const std::string&) { config_from_json_file(p); }};
  const std::string vocab = R"({"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "\u0120": 5, "<|endoftext|>": 6})";
  const std::string merges = "#version: 0.2\na b\nab c\n";
  t["bpe"] = {{vocab + "\n---\n" + merges}, "bpe.txt", [](const std::string& p, const std::string& dir) {
                const std::string both = read_all(p);
                const size_t cut = both.find("\n---\n");
                write_all(dir + "/vocab.json", both.substr(0, cut));
                write_all(dir + "/merges.txt", cut == std::string::npos ? "" : both.substr(cut + 5));
                auto tok = load_bytelevel_bpe_files(dir + "/vocab.json", dir + "/merges.txt");
                tok->encode("abc ab a");
              }};
  // a byte-level BPE tokenizer.json as transformers writes one, small
  const std::string tokenizer_json = R"({"version": "1.0", "added_tokens": [{"id": 6, "content": "<|endoftext|>",
 "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}], "normalizer": null,
 "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
 "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
 "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
 "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
 "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3,
 "abc": 4, "\u0120": 5, "<|endoftext|>": 6}, "merges": ["a b", "ab c"]}})";
  t["tokenizer_json"] = {{tokenizer_json}, "tokenizer.json",
                         [](const std::string& p, const std::string&) {
                           auto tok = load_tokenizer(p);
                           tok->encode("Hello world, it's a test");
                         }};
  t["sp_model"] = {{read_all(ref + "/tokenizers_sp/tiny.model")}, "tokenizer.model",
                   [](const std::string& p, const std::string&) {
                     auto tok = load_tokenizer(p);
                     tok->encode("Hello world, it's a test");
                   }};
  t["alpaca"] = {{R"([{"instruction": "Give three tips.", "input": "", "output": "1. Eat. 2. Sleep."},
 {"instruction": "Translate", "input": "bonjour", "output": "hello"}])",
                  "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"instruction\": \"c\", \"input\": \"d\", \"output\": \"e\"}\n"},
                 "alpaca.json", [](const std::string& p, const std::string&) {
                   DataArgs f;
                   parse_alpaca(read_all(p), p, f);
                 }};
  t["manifest"] = {{R"({"format": "llmt-checkpoint", "version": 1, "step": 7, "checksum": "crc32c",
 "files": {"a.bin": {"size": 5, "crc32c": "00000000"}}})"},
                   "checkpoint-7/manifest.json", [](const std::string&, const std::string& dir) {
                     checkpoint_problem(dir + "/checkpoint-7", true);
                   }};
  {  // a real token cache file, from the writer
    TokenDataset ds({0, 3, 5}, {1, 2, 3, 4, 5}, {-100, 2, 3, -100, 5});
    const std::string p = work + "/seed.tokens";
    write_token_cache(p, "fuzzkey", ds, CacheStats());
    t["token_cache"] = {{read_all(p)}, "t-fuzzkey.tokens", [](const std::string& p, const std::string&) {
                          TokenDataset ds;
                          CacheStats st;
                          if (map_token_cache(p, "fuzzkey", &ds, &st, 6))
                            for (int64_t i = 0; i < ds.size(); i++)
                              for (int64_t k = 0; k < ds.length(i); k++) (void)(ds.ids(i)[k] + ds.labels(i)[k]);
                        }};
    std::remove(p.c_str());
  }
  // scripts/launch.sh's hostfile reader (bash): a clean refusal is exit status 2 with one
  // "launch.sh: error: <hostfile> line N: ..." message; a bash error (an unbound variable, an octal
  // or overflowing number, set -e tripping) or anything else is a finding.
  t["hostfile"] = {{read_all(src + "/hostfiles/localhost"), read_all(src + "/hostfiles/two-nodes.example"),
                    "node1 slots=4 max_slots=8\r\nnode2 slots=4 # a comment\r\n\n# the end\n"},
                   "hostfile", [src](const std::string& p, const std::string& dir) {
                     const std::string err = dir + "/launch.err";
                     const std::string cmd = "LLMT_GPUS_PER_NODE=0 timeout 20 bash '" + src +
                                             "/scripts/launch.sh' --hostfile '" + p + "' --check > /dev/null 2> '" +
                                             err + "'";
                     const int status = std::system(cmd.c_str());
                     const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                     const std::string msg = read_all(err);
                     if (rc == 0) return;
                     const std::string prefix = "launch.sh: error: " + p;
                     const bool one_line = msg.find('\n') == msg.size() - 1;
                     if (rc == 2 && msg.compare(0, prefix.size(), prefix) == 0 && one_line &&
                         (msg.find(" line ") != std::string::npos || msg.find("names no host") != std::string::npos))
                       throw Error(msg);
                     throw std::runtime_error(strformat("launch.sh --check exited %d: %s", rc, msg.c_str()));
                   }};
  // a chat template: parsed, then rendered over a fixture conversation (a clean llmt::Error is fine;
  // a crash, an overflow under UBSan, a hang past ctest's timeout or another exception is a finding)
  {
    std::vector<std::string> seeds;
    for (const char* f : {"constructs.jinja", "llama3_1.jinja", "qwen2_5.jinja", "mistral_v0_3.jinja"})
      seeds.push_back(read_all(ref + "/chat/templates/" + f));
    t["chat_template"] = {seeds, "template.jinja", [](const std::string& p, const std::string&) {
                            static const nlohmann::ordered_json vars = {
                                {"messages", {{{"role", "system"}, {"content", "Be brief."}},
                                              {{"role", "user"}, {"content", "Hi \u00e9"}},
                                              {{"role", "assistant"}, {"content", "Yo."}}}},
                                {"add_generation_prompt", true}, {"bos_token", "<s>"}, {"eos_token", "</s>"},
                                {"tools", nullptr}};
                            ChatTemplate tmpl(read_all(p), "template.jinja");
                            tmpl.set_now(1796601600);
                            tmpl.render(vars);
                          }};
  }
  return t;
}

std::vector<std::string> regression_inputs(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(read_all(dir + "/" + e->d_name));
    closedir(d);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: llmt_fuzz TARGET [--seconds S] [--iterations N] [--seed K] [--out DIR]\n");
    return 2;
  }
  const std::string name = argv[1];
  double seconds = 20;
  long long iterations = -1;
  uint64_t seed = 1;
  std::string out = "fuzz-out";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--seconds") seconds = std::atof(v.c_str());
    else if (k == "--iterations") iterations = std::atoll(v.c_str());
    else if (k == "--seed") seed = std::strtoull(v.c_str(), nullptr, 10);
    else if (k == "--out") out = v;
  }
  // An unbounded allocation must fail as bad_alloc (a finding), not take the machine.
  struct rlimit lim = {(rlim_t)6 << 30, (rlim_t)6 << 30};
  setrlimit(RLIMIT_AS, &lim);

  ::mkdir(out.c_str(), 0755);
  const std::string work = out + "/" + name + ".work";
  ::mkdir(work.c_str(), 0755);
  ::mkdir((work + "/checkpoint-7").c_str(), 0755);
  write_all(work + "/checkpoint-7/a.bin", "hello");
  auto targets = make_targets(LLMT_SOURCE_DIR, work);
  auto it = targets.find(name);
  if (it == targets.end()) {
    std::fprintf(stderr, "llmt_fuzz: unknown target %s\n", name.c_str());
    return 2;
  }
  const Target& t = it->second;
  const std::string input = work + "/" + t.file_name, current = out + "/" + name + ".current";
  std::printf("llmt_fuzz %s: seeds %zu, seed %llu, up to %.0f s; the input being tried is %s\n", name.c_str(),
              t.seeds.size(), (unsigned long long)seed, seconds, current.c_str());
  std::fflush(stdout);

  std::mt19937_64 rng(seed);
  std::vector<std::string> queue = regression_inputs(std::string(LLMT_SOURCE_DIR) + "/tests/fuzz/regressions/" + name);
  const size_t regressions = queue.size();
  for (const std::string& s : t.seeds) queue.push_back(s);
  const auto start = std::chrono::steady_clock::now();
  long long n = 0, accepted = 0, findings = 0;
  for (;; n++) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if ((size_t)n >= queue.size() && (elapsed > seconds || (iterations >= 0 && n >= iterations))) break;
    const std::string bytes =
        (size_t)n < queue.size() ? queue[(size_t)n] : mutate(t.seeds[(size_t)rng() % t.seeds.size()], t.hot_bytes, rng);
    write_all(current, bytes);
    write_all(input, bytes);
    std::string finding;
    try {
      t.run(input, work);
      accepted++;
    } catch (const Error&) {
      // a clear error: what bad input should get
    } catch (const std::exception& e) {
      finding = std::string("an exception that is not llmt::Error: ") + e.what();
    }
    if (!finding.empty()) {
      const std::string keep = out + "/" + name + "-" + std::to_string(findings++) + ".crash";
      write_all(keep, bytes);
      std::printf("FINDING (input %lld%s): %s; input kept as %s\n", n, (size_t)n < regressions ? ", a regression" : "",
                  finding.c_str(), keep.c_str());
      std::fflush(stdout);
    }
  }
  std::remove(current.c_str());
  std::printf("llmt_fuzz %s: %lld inputs (%zu regression, %zu seed), %lld accepted, %lld findings\n", name.c_str(), n,
              regressions, t.seeds.size(), accepted, findings);
  return findings ? 1 : 0;
}
