// The slow rank, named. Each rank splits its steps into compute and the time its host waited in
// collectives (engine/dist/comm_wait.h); at each logging step every rank's means over the window
// are gathered on the control communicator (a host all_gather of three numbers a rank: no data
// collective) and a rank whose compute is more than --straggler_threshold (0.15) above the median
// of every rank's for two logging windows in a row is named with its host (one window above it is
// noise on a shared host: two ranks of the 2-core quickstart differ by up to 38% in single windows;
// the run's first step, one-time work, is left out). A slow rank computes longer while its peers wait for it
// in the next collective, so compute separates it where the step time (the same on every rank)
// cannot.
#pragma once
#include <string>
#include <vector>

namespace llmt {

// One rank's means per step over a logging window, in milliseconds.
struct RankStepTimes {
  double step_ms = 0, compute_ms = 0, wait_ms = 0;
};

// The median (the mean of the middle two for an even count); 0 for none.
double median_of(std::vector<double> v);

// Ranks whose compute_ms exceeds the median of every rank's by more than `threshold` (0.15 = 15%),
// slowest first; none when threshold <= 0 (the report is off) or with one rank.
std::vector<int> slow_ranks(const std::vector<RankStepTimes>& ranks, double threshold);

// The ranks of `now` (slow_ranks of this window) that were also in `before` (the previous
// window's): a slow node stays slow, noise does not. In `now`'s order.
std::vector<int> persistently_slow(const std::vector<int>& now, const std::vector<int>& before);

// The log line naming them: "slow rank 1 (host b): 210 ms of compute a step over steps 5-8, 1.8x
// the median 118 ms (--straggler_threshold 0.15)".
std::string describe_slow_ranks(const std::vector<int>& slow, const std::vector<RankStepTimes>& ranks,
                                const std::vector<std::string>& hosts, long long first_step, long long last_step,
                                double threshold);

}  // namespace llmt
