// Which kernel runs a bf16 matmul on the CPU: oneDNN's bf16 primitive, or the bf16 operands widened
// to fp32 and the fp32 matmul (the output rounded to bf16 as the bf16 path rounds it). Both are the
// same arithmetic up to the order of the fp32 sums (bf16 products are exact in fp32); which is faster
// depends on the CPU (AMX: bf16 2x faster; AVX512-BF16 without AMX: often slower, docs/performance.md).
//
// The choice is made per shape class (transposition, accumulation, output dtype and each of M, N, K
// bucketed small / medium / large) by timing both kernels on the class's probe shape the first time
// the class is seen, and cached in a small file per CPU model, matmul library and thread count, so
// later runs skip the measurement. LLMT_CPU_BF16_MATMUL=auto|bf16|fp32 forces one (default auto).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace llmt {

enum class Bf16Kernel { bf16, fp32 };
const char* bf16_kernel_name(Bf16Kernel k);

struct MatmulShape {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false, accumulate = false;
  DType out = DType::bf16;
};

// "NT s.m.m" (+= when accumulating, ->f32 for an fp32 output): s < 512 <= m < 4096 <= l
std::string matmul_shape_class(const MatmulShape& s);
// The shape a class is timed on: small dimensions as they are, medium ones at most 1024, large ones
// 4096 (still in the class; bounds a measurement at 2 x 4096 x 1024 x 4096 FLOP, a few tens of ms).
MatmulShape matmul_class_probe(const MatmulShape& s);

// What a process's bf16 matmuls ran, per class: the kernel, how it was decided ("measured", "cache"
// or "forced"), and the measured medians (0 when forced).
struct Bf16ClassChoice {
  std::string shape_class;
  Bf16Kernel kernel = Bf16Kernel::bf16;
  std::string source;
  double fp32_ms = 0.0, bf16_ms = 0.0;
};

// LLMT_CPU_BF16_MATMUL: "auto" (unset or empty), "bf16" or "fp32"; anything else is an error.
std::string bf16_matmul_mode_from_env();
// The directory the cache file goes in, as the token cache picks it without --cache_dir:
// $LLMT_CACHE ("none": no cache file), else $XDG_CACHE_HOME/llmt, else ~/.cache/llmt.
std::string default_matmul_cache_dir();
// "model name" from /proc/cpuinfo
std::string cpu_model_name();
// What the cache is keyed by: "AMD EPYC, family 25 model 17 stepping 1, avx512f avx512_bf16" (the
// model name alone can be as vague as "AMD EPYC")
std::string cpu_identity();

class Bf16MatmulChoice {
 public:
  // mode: auto, bf16 or fp32. cache_dir "" keeps choices in memory only. key names what the timings
  // hold for (CPU model, library version, threads); a cache file with another key is ignored.
  // forced_by: why a forced mode holds (default "forced by LLMT_CPU_BF16_MATMUL=<mode>").
  Bf16MatmulChoice(const std::string& mode, const std::string& cache_dir, const std::string& key,
                   const std::string& forced_by = "");

  // One call of the kernel on operands of the probe shape (bf16 a [M,K] or [K,M], b likewise, out
  // of the probe's dtype); pick() times it.
  using RunOnce = std::function<void(Bf16Kernel, Tensor out, Tensor a, Tensor b, const MatmulShape& probe)>;
  // The kernel for this shape: forced, cached, or measured now (its class's first sight).
  Bf16Kernel pick(const MatmulShape& s, const RunOnce& run);

  std::string cache_path() const { return path_; }
  const std::vector<std::string>& notes() const { return notes_; }  // what was ignored or failed
  const std::map<std::string, Bf16ClassChoice>& choices() const { return choices_; }

 private:
  void note(const std::string& text);
  void read_cache();
  void write_cache();
  bool make_dirs() const;  // the cache file's directory, made if missing
  Bf16ClassChoice measure(const std::string& cls, const MatmulShape& s, const RunOnce& run);

  std::string mode_, key_, path_, forced_by_;
  bool cache_read_ = false;
  std::map<std::string, Bf16ClassChoice> choices_;  // every class known: from the cache or measured
  std::set<std::string> ran_;                        // the classes pick() was asked for
  std::vector<std::string> notes_;
};

// The classes this process's most recent bf16 CPU backend ran, and their kernels (for the layout
// line and llmt bench's JSON); cleared when a bf16 CPU backend is made.
std::vector<Bf16ClassChoice> cpu_bf16_matmul_choices();
void clear_cpu_bf16_matmul_choices();
// "NT s.m.m: fp32 (measured 2.1 / 3.0 ms fp32 / bf16); ..." or "" when none ran
std::string describe_cpu_bf16_matmul_choices();

}  // namespace llmt
