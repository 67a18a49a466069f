// `llmt bench`: whole training steps (forward, backward, gradient norm, AdamW) on synthetic tokens,
// timed one by one after warm-up, on every rank of the job through FSDP; rank 0 prints one JSON
// line per configuration. --sweep KEY=V1,V2 (repeatable) runs every combination in turn, and
// --results FILE appends each point's line to FILE. A point that cannot fit the memory (llmt plan's
// total against the node's or the GPU's) is recorded as such and the sweep goes on. Speed is
// measured here, never in a test.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/dist/launch.h"
#include "train/flags.h"
#include "train/train_args.h"

namespace llmt {

// The parallelism, precision and LoRA parts are llmt train's, read by its flag table (train_args.h):
// with --use_peft True a step trains a fresh adapter on the randomly initialised, frozen model.
struct BenchArgs : ParallelismConfig, PrecisionConfig, LoraArgs {
  std::string model = "gpt2";   // preset or config.json
  int batch = 4;
  int seq_len = 64;
  int steps = 10;
  int warmup = 2;
  double dropout = -1.0;        // >= 0: every dropout probability of the model set to this
  bool ops = false;             // the step's main ops alone (train/op_bench.cpp) instead of whole steps
  std::vector<std::string> sweeps;  // "KEY=V1,V2,...", outermost first
  std::string results;              // append each point's JSON line here ("" = stdout only)
};

// One sweep setting applied to args (KEY as the flag's name); throws naming the key or the value.
void apply_bench_setting(BenchArgs& args, const std::string& key, const std::string& value);
// Every combination of the sweeps, as (key, value) lists in run order; one empty list without sweeps.
std::vector<std::vector<std::pair<std::string, std::string>>> bench_points(const std::vector<std::string>& sweeps);

// Reads and checks the flags, and every point of the sweeps (check_bench_point) before any runs.
BenchArgs parse_bench_args(Flags& flags);
// A point's model resolves and holds its sequence length; `where` names the sweep point in errors.
void check_bench_point(const BenchArgs& args, const std::string& where);
void run_bench(const BenchArgs& args, ControlComm& world, const LaunchInfo& launch);
// --ops: every matmul of a block and the LM head (forward and both backward products) and attention
// forward and backward at the model's shapes for --per_device_train_batch_size and --seq_len, each
// timed alone (median of --steps after --warmup); one JSON line per op with TFLOP/s and the fraction
// of the device's peak. Every rank runs them on its own device; rank 0 prints.
void run_op_bench(const BenchArgs& args, ControlComm& world, const LaunchInfo& launch);
// The matmul library's measured peak in `be`'s compute dtype: the median GFLOP/s of 2048^3 products
// (every rank of `world` at once, so ranks sharing a node share its cores).
double measured_matmul_peak_gflops(Backend& be, ControlComm& world);

}  // namespace llmt
