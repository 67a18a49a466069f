// `llmt bench`: whole training steps (forward, backward, gradient norm, AdamW) on synthetic tokens,
// timed one by one after warm-up; prints one JSON line. Speed is measured here, never in a test.
#pragma once
#include <string>

#include "engine/train/flags.h"

namespace llmt {

struct BenchArgs {
  std::string model = "gpt2";   // preset or config.json
  std::string device = "cpu";
  int batch = 4;
  int seq_len = 64;
  int steps = 10;
  int warmup = 2;
  int threads = 0;
};

BenchArgs parse_bench_args(Flags& flags);
void run_bench(const BenchArgs& args);

}  // namespace llmt
