// What a run reports as it trains: the step line on rank 0's log, the records of metrics.jsonl and
// their history (for trainer_state.json), TensorBoard scalars (--report_to tensorboard), the
// logging window the figures are averaged over, and a warning when training diverges.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/dist/communicator.h"
#include "train/step.h"
#include "train/tensorboard.h"

namespace llmt {

// An output file of lines (metrics.jsonl), each written and flushed at once. A failed write, flush or
// close is an error naming the file: a full disk or an unwritable file gave exit 0 and no metrics.
class LineFile {
 public:
  ~LineFile();
  void open(const std::string& path);
  void write(const std::string& line);
  void close();

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

struct MetricsSettings {
  std::string output_dir;
  bool tensorboard = false;              // --report_to tensorboard
  std::string logging_dir;               // TensorBoard's ("" = output_dir/runs/<date>_<host>)
  std::string logging_strategy = "steps";  // steps, epoch, no
  int logging_steps = 500;
  bool logging_first_step = false;
  bool live = false;                     // a progress line on a terminal (rank 0, single process)
  int world = 1;                         // ranks, for the per-rank throughput
  std::string host;                      // this rank's, for the slow-rank report
  double straggler_threshold = 0.15;     // name a rank whose compute is this far above the median (0: off)
  int64_t first_step = 0, total_steps = 0, steps_per_epoch = 1;
};

class MetricsLogger {
 public:
  MetricsLogger(ControlComm& world, const MetricsSettings& s) : world_(world), s_(s) {}
  // Rank 0: opens metrics.jsonl with `history` (a resumed checkpoint's records) first, and the
  // TensorBoard file (this run's records only).
  void open(std::vector<nlohmann::json> history);
  // The logging window starts now (the first step).
  void start();
  // `seconds` of the current window were spent outside the steps (an evaluation, timed on its own as
  // the Trainer's eval_runtime): the window's time and throughput leave them out.
  void leave_out(double seconds) { window_left_out_s_ += seconds; }
  // One step's figures into the window: its loss, the tokens of every rank, rank 0's FLOPs, and
  // this rank's wall time for the step and the part of it spent waiting in collectives.
  void add_step(double loss, int64_t tokens, double flops, double step_s, double wait_s);
  // This rank's step computed on `computed` tokens of which `real` are examples' (the rest padding).
  void add_padding(int64_t computed, int64_t real) { window_computed_ += computed, window_real_ += real; }
  // What rank 0 sent in the run's first step and what the plan predicted: in the first record.
  void set_first_step_comm(double sent, double planned) { comm_first_step_ = sent, planned_comm_ = planned; }
  // After step `s`: the live line, the divergence warning, and every logging_steps (and at the last
  // step) a line on rank 0 and a record.
  void after_step(int64_t s, const StepResult& r, double lr);
  // A record: to metrics.jsonl, the history and TensorBoard (rank 0 only); a list of numbers under a
  // key ending in _per_rank becomes one TensorBoard scalar per rank (train/<key>/rank_<r>).
  void record(const nlohmann::json& j);
  const std::vector<nlohmann::json>& history() const { return history_; }
  // metrics.jsonl and the TensorBoard file, closed with their errors reported.
  void close();

 private:
  ControlComm& world_;
  const MetricsSettings s_;
  LineFile metrics_;                        // output_dir/metrics.jsonl (rank 0)
  std::unique_ptr<TensorBoardWriter> tb_;   // rank 0, with --report_to tensorboard
  std::vector<nlohmann::json> history_;     // what was logged, for trainer_state.json (rank 0)
  // Every rank's step, compute and wait means over the window (train/straggler.h), named on rank 0.
  // Collective: every rank logs at the same steps.
  void report_rank_times(int64_t s, nlohmann::json& record);
  double window_start_ = 0.0, window_loss_ = 0.0, window_flops_ = 0.0, window_left_out_s_ = 0.0;
  // this rank's over the window, leaving out the run's first step (one-time work: kernel JIT, first
  // touches of memory, which differ between ranks by more than a slow node's threshold)
  double window_step_s_ = 0.0, window_wait_s_ = 0.0;
  int64_t window_timed_steps_ = 0;
  bool first_step_seen_ = false;
  std::vector<std::string> hosts_;  // every rank's host, gathered at the first report
  std::vector<int> above_before_;   // ranks above the threshold in the previous window (rank 0)
  int64_t window_tokens_ = 0, window_steps_ = 0;
  int64_t window_computed_ = 0, window_real_ = 0;  // this rank's tokens computed and not padding
  double window_loss_tokens_ = 0.0;                // tokens with a target, every rank's
  double comm_first_step_ = 0.0, planned_comm_ = 0.0;
  bool comm_recorded_ = false;
  double first_loss_ = 0.0, first_grad_norm_ = 0.0;  // this run's first step, for the divergence warning
  bool warned_explosion_ = false;
};

double now_s();          // a steady clock, in seconds
double peak_rss_gib();   // this process's peak resident memory

}  // namespace llmt
