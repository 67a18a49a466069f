#include "train/straggler.h"

#include <algorithm>

#include "engine/core/error.h"

namespace llmt {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int> slow_ranks(const std::vector<RankStepTimes>& ranks, double threshold) {
  std::vector<int> slow;
  if (threshold <= 0.0 || ranks.size() < 2) return slow;
  std::vector<double> compute;
  for (const RankStepTimes& r : ranks) compute.push_back(r.compute_ms);
  const double limit = median_of(compute) * (1.0 + threshold);
  for (size_t r = 0; r < ranks.size(); r++)
    if (ranks[r].compute_ms > limit) slow.push_back((int)r);
  std::sort(slow.begin(), slow.end(), [&](int a, int b) { return ranks[a].compute_ms > ranks[b].compute_ms; });
  return slow;
}

std::vector<int> persistently_slow(const std::vector<int>& now, const std::vector<int>& before) {
  std::vector<int> both;
  for (int r : now)
    if (std::find(before.begin(), before.end(), r) != before.end()) both.push_back(r);
  return both;
}

std::string describe_slow_ranks(const std::vector<int>& slow, const std::vector<RankStepTimes>& ranks,
                                const std::vector<std::string>& hosts, long long first_step, long long last_step,
                                double threshold) {
  std::vector<double> compute;
  for (const RankStepTimes& r : ranks) compute.push_back(r.compute_ms);
  const double med = median_of(compute);
  std::string s;
  for (int r : slow) {
    if (!s.empty()) s += "; ";
    s += strformat("slow rank %d (host %s): %.0f ms of compute a step over steps %lld-%lld, %.2fx the median %.0f ms",
                   r, r < (int)hosts.size() ? hosts[r].c_str() : "?", ranks[r].compute_ms, first_step, last_step,
                   med > 0 ? ranks[r].compute_ms / med : 0.0, med);
  }
  if (!s.empty()) s += strformat(" (a second logging window in a row; --straggler_threshold %g)", threshold);
  return s;
}

}  // namespace llmt
