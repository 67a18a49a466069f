#include "train/metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "models/transformer.h"
#include "train/straggler.h"

namespace llmt {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peak_rss_gib() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}

LineFile::~LineFile() {
  if (f_) std::fclose(f_);
}

void LineFile::open(const std::string& path) {
  path_ = path;
  f_ = std::fopen(path.c_str(), "w");
  LLMT_CHECK(f_, "cannot create %s: %s", path.c_str(), std::strerror(errno));
}

void LineFile::write(const std::string& line) {
  if (!f_) return;
  const std::string text = line + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f_) == text.size() && std::fflush(f_) == 0;
  LLMT_CHECK(ok, "writing %s failed: %s", path_.c_str(), std::strerror(errno));
}

void LineFile::close() {
  if (!f_) return;
  const int rc = std::fclose(f_);
  f_ = nullptr;
  LLMT_CHECK(rc == 0, "closing %s failed: %s", path_.c_str(), std::strerror(errno));
}

void MetricsLogger::open(std::vector<nlohmann::json> history) {
  if (world_.rank() != 0) return;
  history_ = std::move(history);
  metrics_.open(s_.output_dir + "/metrics.jsonl");
  for (const auto& rec : history_) metrics_.write(rec.dump());
  if (s_.tensorboard) {  // this run's records only: a resumed run's history is in its own files
    tb_ = std::make_unique<TensorBoardWriter>(s_.logging_dir.empty() ? default_logging_dir(s_.output_dir)
                                                                     : s_.logging_dir);
    log_info("report tensorboard: %s (tensorboard --logdir %s)", tb_->path().c_str(),
             (s_.logging_dir.empty() ? s_.output_dir + "/runs" : s_.logging_dir).c_str());
  }
}

void MetricsLogger::start() { window_start_ = now_s(); }

void MetricsLogger::add_step(double loss, int64_t tokens, double flops, double step_s, double wait_s) {
  if (first_step_seen_) {
    window_step_s_ += step_s;
    window_wait_s_ += wait_s;
    window_timed_steps_++;
  }
  first_step_seen_ = true;
  window_loss_ += loss;
  window_tokens_ += tokens;
  window_flops_ += flops;
  window_steps_++;
}

void MetricsLogger::after_step(int64_t s, const StepResult& r, double lr) {
  if (s_.live) {
    std::printf("\r  step %lld/%lld  loss %.4f  ", (long long)s + 1, (long long)s_.total_steps, r.loss);
    std::fflush(stdout);
  }
  // A loss or gradient norm 1000x its first value keeps training silently: say so once, with the step.
  if (s == s_.first_step) first_loss_ = r.loss, first_grad_norm_ = r.grad_norm;
  if (!warned_explosion_ && (r.loss > 1e3 * first_loss_ || r.grad_norm > 1e3 * std::max(first_grad_norm_, 1e-3))) {
    warned_explosion_ = true;
    log_info("warning step %lld: the loss (%g) or gradient norm (%g) is over 1000 times its first value (%g, %g): training "
             "is diverging; lower --learning_rate or set --max_grad_norm", (long long)s + 1, r.loss, r.grad_norm,
             first_loss_, first_grad_norm_);
  }
  window_loss_tokens_ += r.counted;
  // --logging_strategy as the Trainer's: every logging_steps, or at each epoch's end; and the last step
  const bool last = s + 1 == s_.total_steps;
  const bool epoch_end = (s + 1) % s_.steps_per_epoch == 0;
  bool now = s_.logging_strategy == "steps"   ? (s + 1) % s_.logging_steps == 0 || last
             : s_.logging_strategy == "epoch" ? epoch_end || last
                                              : false;
  if (s_.logging_first_step && s == 0) now = true;
  if (!now) return;
  const double dt = now_s() - window_start_ - window_left_out_s_, tps = window_tokens_ / dt;
  const double mean_loss = window_loss_ / window_steps_;
  const double epoch = (double)(s + 1) / s_.steps_per_epoch;
  const int W = s_.world;
  if (s_.live) std::printf("\r");
  const double loss_tps = window_loss_tokens_ / dt;
  const double padding = window_computed_ > 0 ? 1.0 - (double)window_real_ / (double)window_computed_ : 0.0;
  log_info("step %6lld/%lld | epoch %.2f | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s (%.0f per rank, %.0f "
           "with loss) | %.0f ms/step | rss %.2f GiB",
           (long long)s + 1, (long long)s_.total_steps, epoch, mean_loss, lr, r.grad_norm, tps, tps / W, loss_tps,
           1000.0 * dt / window_steps_, peak_rss_gib());
  nlohmann::json j = {{"step", s + 1},
                      {"epoch", epoch},
                      {"loss", mean_loss},
                      {"learning_rate", lr},
                      {"grad_norm", r.grad_norm},
                      {"tokens_per_s", tps},
                      {"tokens_per_s_per_rank", tps / W},
                      {"loss_tokens_per_s", loss_tps},
                      {"padding_fraction_rank0", padding},
                      {"gflops_rank0", window_flops_ / dt / 1e9},
                      {"flops_convention", Transformer::kFlopsConvention},
                      {"peak_rss_gib", peak_rss_gib()}};
  if (!comm_recorded_) {  // the first record of the run: what rank 0 sent in its first step, and the plan
    j["comm_bytes_first_step_rank0"] = comm_first_step_;
    j["comm_bytes_planned_per_step"] = planned_comm_;
    comm_recorded_ = true;
  }
  report_rank_times(s, j);
  record(j);
  window_start_ = now_s();
  window_loss_ = window_flops_ = window_step_s_ = window_wait_s_ = window_left_out_s_ = 0.0;
  window_tokens_ = window_steps_ = window_timed_steps_ = 0;
  window_computed_ = window_real_ = 0;
  window_loss_tokens_ = 0.0;
}

void MetricsLogger::report_rank_times(int64_t s, nlohmann::json& j) {
  const int W = world_.size();
  if (W < 2 || window_timed_steps_ == 0) return;  // every rank alike: they count the same steps
  if (hosts_.empty()) {  // once: every rank's host, 64 bytes each
    char mine[64] = {0};
    std::snprintf(mine, sizeof(mine), "%s", s_.host.c_str());
    std::vector<char> all((size_t)W * sizeof(mine));
    world_.all_gather(mine, all.data(), sizeof(mine) / 4, DType::i32);
    for (int r = 0; r < W; r++) {
      const char* h = all.data() + (size_t)r * sizeof(mine);
      hosts_.push_back(std::string(h, strnlen(h, sizeof(mine) - 1)));
    }
  }
  const double n = (double)window_timed_steps_;
  const double mine[3] = {1e3 * window_step_s_ / n, 1e3 * (window_step_s_ - window_wait_s_) / n,
                          1e3 * window_wait_s_ / n};  // step, compute, wait
  std::vector<double> all((size_t)W * 3);
  world_.all_gather(mine, all.data(), 3, DType::f64);
  if (world_.rank() != 0) return;
  std::vector<RankStepTimes> ranks((size_t)W);
  nlohmann::json step_ms = nlohmann::json::array(), compute_ms = nlohmann::json::array();
  nlohmann::json wait_ms = nlohmann::json::array();
  for (int r = 0; r < W; r++) {
    ranks[r] = {all[3 * r], all[3 * r + 1], all[3 * r + 2]};
    step_ms.push_back(ranks[r].step_ms);
    compute_ms.push_back(ranks[r].compute_ms);
    wait_ms.push_back(ranks[r].wait_ms);
  }
  const std::vector<int> above = slow_ranks(ranks, s_.straggler_threshold);
  const std::vector<int> slow = persistently_slow(above, above_before_);
  above_before_ = above;
  j["step_ms_per_rank"] = step_ms;
  j["compute_ms_per_rank"] = compute_ms;
  j["comm_wait_ms_per_rank"] = wait_ms;
  j["slow_ranks"] = slow;
  if (!slow.empty())
    log_info("warning %s", describe_slow_ranks(slow, ranks, hosts_, (long long)(s + 2 - window_timed_steps_),
                                               (long long)s + 1, s_.straggler_threshold).c_str());
}

void MetricsLogger::record(const nlohmann::json& j) {
  if (world_.rank() != 0) return;
  history_.push_back(j);
  metrics_.write(j.dump());
  if (!tb_) return;
  // every number but the step, under the Trainer's tag names; an eval record's perplexity is eval/
  std::vector<std::pair<std::string, double>> scalars;
  const bool eval = j.contains("eval_loss");
  const std::string per_rank = "_per_rank";
  for (const auto& [key, value] : j.items()) {
    if (key != "step" && value.is_number())
      scalars.push_back({eval && key == "perplexity" ? "eval/perplexity" : tensorboard_tag(key), value.get<double>()});
    const bool ranked =
        key.size() > per_rank.size() && key.compare(key.size() - per_rank.size(), per_rank.size(), per_rank) == 0;
    if (ranked && value.is_array())
      for (size_t r = 0; r < value.size(); r++)
        if (value[r].is_number())
          scalars.push_back({tensorboard_tag(key) + "/rank_" + std::to_string(r), value[r].get<double>()});
  }
  tb_->add_scalars(j.value("step", (int64_t)0), scalars);
}

void MetricsLogger::close() {
  metrics_.close();
  if (tb_) tb_->close();
}

}  // namespace llmt
