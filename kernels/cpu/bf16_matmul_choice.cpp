#include "kernels/cpu/bf16_matmul_choice.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/log.h"

namespace llmt {

const char* bf16_kernel_name(Bf16Kernel k) { return k == Bf16Kernel::bf16 ? "bf16" : "fp32"; }

namespace {

const char kHeader[] = "llmt cpu bf16 matmul choices v1";

char bucket(int64_t d) { return d < 512 ? 's' : d < 4096 ? 'm' : 'l'; }
int64_t probe_dim(int64_t d) { return d < 512 ? d : d < 4096 ? std::min<int64_t>(d, 1024) : 4096; }

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::mutex g_mutex;
std::map<std::string, Bf16ClassChoice> g_ran;  // what this process's latest bf16 CPU backend ran

}  // namespace

std::string matmul_shape_class(const MatmulShape& s) {
  return strformat("%c%c%s %c.%c.%c%s", s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.accumulate ? "+=" : "",
                   bucket(s.M), bucket(s.N), bucket(s.K), s.out == DType::f32 ? " ->f32" : "");
}

MatmulShape matmul_class_probe(const MatmulShape& s) {
  MatmulShape p = s;
  p.M = probe_dim(s.M);
  p.N = probe_dim(s.N);
  p.K = probe_dim(s.K);
  return p;
}

std::string bf16_matmul_mode_from_env() {
  const char* v = std::getenv("LLMT_CPU_BF16_MATMUL");
  const std::string mode = v && *v ? v : "auto";
  LLMT_CHECK(mode == "auto" || mode == "bf16" || mode == "fp32",
             "LLMT_CPU_BF16_MATMUL=%s: expected auto (time both kernels per shape class), bf16 (oneDNN's bf16 "
             "matmul) or fp32 (widen the operands to fp32)", mode.c_str());
  return mode;
}

std::string default_matmul_cache_dir() {
  const char* env = std::getenv("LLMT_CACHE");
  if (env && *env) return std::string(env) == "none" ? std::string() : std::string(env);
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg) return std::string(xdg) + "/llmt";
  const char* home = std::getenv("HOME");
  return home && *home ? std::string(home) + "/.cache/llmt" : std::string();
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string cpu_identity() {
  std::ifstream f("/proc/cpuinfo");
  std::map<std::string, std::string> v;
  for (std::string line; std::getline(f, line) && !line.empty();) {  // the first CPU's block
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(name.find_last_not_of(" \t") + 1);
    v[name] = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  std::string isa;
  const std::string flags = " " + v["flags"] + " ";
  for (const std::string flag : {"avx512f", "avx512_bf16", "amx_bf16"})
    if (flags.find(" " + flag + " ") != std::string::npos) isa += " " + flag;
  const std::string name = v.count("model name") ? v["model name"] : "unknown CPU";
  return strformat("%s, family %s model %s stepping %s,%s", name.c_str(), v["cpu family"].c_str(), v["model"].c_str(),
                   v["stepping"].c_str(), isa.empty() ? " no avx512" : isa.c_str());
}

Bf16MatmulChoice::Bf16MatmulChoice(const std::string& mode, const std::string& cache_dir, const std::string& key,
                                   const std::string& forced_by)
    : mode_(mode), key_(key), forced_by_(forced_by.empty() ? "forced by LLMT_CPU_BF16_MATMUL=" + mode : forced_by) {
  LLMT_CHECK(mode == "auto" || mode == "bf16" || mode == "fp32", "bf16 matmul choice: mode %s, expected auto, bf16 "
             "or fp32", mode.c_str());
  LLMT_CHECK(key.find('\n') == std::string::npos, "bf16 matmul choice: the key holds a newline");
  if (!cache_dir.empty()) path_ = strformat("%s/cpu-bf16-matmul-%016llx.txt", cache_dir.c_str(),
                                            (unsigned long long)fnv1a(key));
}

void Bf16MatmulChoice::note(const std::string& text) {  // once (the file is read again under the lock)
  if (std::find(notes_.begin(), notes_.end(), text) != notes_.end()) return;
  notes_.push_back(text);
  log_info("note   cpu bf16 matmul: %s", text.c_str());
}

// The file: the header line, "key <key>", then "class<TAB>kernel<TAB>fp32 ms<TAB>bf16 ms" per class.
// Anything else (another key, a line that does not parse) and the whole file is ignored, with a note.
void Bf16MatmulChoice::read_cache() {
  cache_read_ = true;
  if (path_.empty()) return;
  std::ifstream f(path_);
  if (!f) return;  // not measured yet
  std::string line;
  if (!std::getline(f, line) || line != kHeader) {
    note(strformat("ignoring %s: its first line is not \"%s\"; measuring again", path_.c_str(), kHeader));
    return;
  }
  if (!std::getline(f, line) || line != "key " + key_) {
    note(strformat("ignoring %s: it holds timings for \"%s\", not \"%s\"; measuring again", path_.c_str(),
                   line.c_str(), ("key " + key_).c_str()));
    return;
  }
  std::map<std::string, Bf16ClassChoice> read;
  for (int n = 3; std::getline(f, line); n++) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string field; std::getline(ss, field, '\t');) fields.push_back(field);
    Bf16ClassChoice c;
    char* end1 = nullptr;
    char* end2 = nullptr;
    bool ok = fields.size() == 4 && !fields[0].empty() && (fields[1] == "bf16" || fields[1] == "fp32");
    if (ok) {
      c.fp32_ms = std::strtod(fields[2].c_str(), &end1);
      c.bf16_ms = std::strtod(fields[3].c_str(), &end2);
      ok = !fields[2].empty() && !fields[3].empty() && *end1 == 0 && *end2 == 0 && c.fp32_ms >= 0 && c.bf16_ms >= 0;
    }
    if (!ok) {
      note(strformat("ignoring %s: line %d is not \"class<TAB>bf16|fp32<TAB>fp32 ms<TAB>bf16 ms\"; measuring again",
                     path_.c_str(), n));
      return;
    }
    c.shape_class = fields[0];
    c.kernel = fields[1] == "bf16" ? Bf16Kernel::bf16 : Bf16Kernel::fp32;
    c.source = "cache";
    read[c.shape_class] = c;
  }
  choices_ = read;
}

bool Bf16MatmulChoice::make_dirs() const {
  const std::string dir = path_.substr(0, path_.rfind('/'));
  for (size_t pos = 1; pos != std::string::npos;) {
    pos = dir.find('/', pos + 1);
    ::mkdir(dir.substr(0, pos).c_str(), 0755);
  }
  struct stat st;
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Written whole to a temporary file and renamed over the old one, so that a reader never sees half.
void Bf16MatmulChoice::write_cache() {
  if (path_.empty()) return;
  make_dirs();  // errors show in the open below
  const std::string tmp = strformat("%s.%ld.tmp", path_.c_str(), (long)::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    note(strformat("cannot write %s (%s): the choices hold for this run only", tmp.c_str(), std::strerror(errno)));
    path_.clear();
    return;
  }
  std::fprintf(f, "%s\nkey %s\n", kHeader, key_.c_str());
  for (const auto& [cls, c] : choices_)
    std::fprintf(f, "%s\t%s\t%.4f\t%.4f\n", cls.c_str(), bf16_kernel_name(c.kernel), c.fp32_ms, c.bf16_ms);
  const bool ok = std::fclose(f) == 0 && std::rename(tmp.c_str(), path_.c_str()) == 0;
  if (!ok) {
    note(strformat("cannot write %s (%s): the choices hold for this run only", path_.c_str(), std::strerror(errno)));
    ::unlink(tmp.c_str());
    path_.clear();
  }
}

// Both kernels on the probe shape: one call each to warm up (oneDNN compiles its kernel), then up to
// three alternating rounds, fewer once the class has taken 150 ms; the medians decide, bf16 only
// where it is faster.
Bf16ClassChoice Bf16MatmulChoice::measure(const std::string& cls, const MatmulShape& s, const RunOnce& run) {
  const MatmulShape p = matmul_class_probe(s);
  std::vector<uint16_t> a((size_t)(p.M * p.K)), b((size_t)(p.K * p.N));
  uint64_t r = 0x9e3779b97f4a7c15ull;
  auto next = [&] {  // values in [-1, 1) exact in bf16
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    return f32_to_bf16((float)((int)(r >> 40) % 256) / 128.0f - 1.0f);
  };
  for (auto& v : a) v = next();
  for (auto& v : b) v = next();
  std::vector<char> out((size_t)(p.M * p.N) * dtype_size(p.out), 0);
  Tensor ta(a.data(), DType::bf16, {p.M * p.K}), tb(b.data(), DType::bf16, {p.K * p.N});
  Tensor to(out.data(), p.out, {p.M * p.N});
  auto time_one = [&](Bf16Kernel k) {
    if (p.accumulate) std::memset(out.data(), 0, out.size());  // keep sums small
    auto t0 = std::chrono::steady_clock::now();
    run(k, to, ta, tb, p);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  auto start = std::chrono::steady_clock::now();
  time_one(Bf16Kernel::fp32);
  time_one(Bf16Kernel::bf16);
  std::vector<double> f32, b16;
  for (int round = 0; round < 3; round++) {
    f32.push_back(time_one(Bf16Kernel::fp32));
    b16.push_back(time_one(Bf16Kernel::bf16));
    if (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() > 150.0) break;
  }
  Bf16ClassChoice c;
  c.shape_class = cls;
  c.fp32_ms = median(f32);
  c.bf16_ms = median(b16);
  c.kernel = c.bf16_ms < c.fp32_ms ? Bf16Kernel::bf16 : Bf16Kernel::fp32;
  c.source = "measured";
  return c;
}

Bf16Kernel Bf16MatmulChoice::pick(const MatmulShape& s, const RunOnce& run) {
  const std::string cls = matmul_shape_class(s);
  auto it = choices_.find(cls);
  if (it != choices_.end() && ran_.count(cls)) return it->second.kernel;
  if (mode_ != "auto") {
    Bf16ClassChoice c;
    c.shape_class = cls;
    c.kernel = mode_ == "bf16" ? Bf16Kernel::bf16 : Bf16Kernel::fp32;
    c.source = forced_by_;
    it = choices_.emplace(cls, c).first;
  } else {
    if (!cache_read_) read_cache();
    it = choices_.find(cls);
    if (it == choices_.end()) {
      // One process at a time measures and writes (a node's ranks share the file): one that waited
      // reads what the first measured, so that the ranks run the same kernels.
      const int lock = path_.empty() || !make_dirs() ? -1 : ::open((path_ + ".lock").c_str(), O_CREAT | O_RDWR, 0644);
      if (lock >= 0 && ::flock(lock, LOCK_EX) == 0) {
        read_cache();
        it = choices_.find(cls);
      }
      if (it == choices_.end()) {
        it = choices_.emplace(cls, measure(cls, s, run)).first;
        write_cache();
      }
      if (lock >= 0) ::close(lock);  // and with it the lock
    }
  }
  ran_.insert(cls);  // the class's first run here: what the layout line and the bench report
  std::lock_guard<std::mutex> lock(g_mutex);
  g_ran[cls] = it->second;
  return it->second.kernel;
}

std::vector<Bf16ClassChoice> cpu_bf16_matmul_choices() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<Bf16ClassChoice> v;
  for (const auto& [cls, c] : g_ran) v.push_back(c);
  return v;
}

void clear_cpu_bf16_matmul_choices() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_ran.clear();
}

std::string describe_cpu_bf16_matmul_choices() {
  std::string s;
  for (const Bf16ClassChoice& c : cpu_bf16_matmul_choices()) {
    s += strformat("%s%s: %s", s.empty() ? "" : "; ", c.shape_class.c_str(), bf16_kernel_name(c.kernel));
    if (c.source == "measured" || c.source == "cache")
      s += strformat(" (%s: fp32 %.2f ms, bf16 %.2f ms)", c.source.c_str(), c.fp32_ms, c.bf16_ms);
    else
      s += " (" + c.source + ")";
  }
  return s;
}

}  // namespace llmt
