// Which examples each rank reads at each step: the distributed sampler.
//
// Step s draws a global batch of G = world * per_rank_batch * accum examples: epoch e = s / steps_per_epoch
// visits the dataset in a permutation shuffled by (seed, e), and step s takes the next G entries of it.
// Micro-batch m of rank r is the contiguous slice [(m * world + r) * per_rank_batch, + per_rank_batch) of
// that global batch, so what a step trains on does not depend on how it is split over ranks and
// micro-batches (8 ranks x 1, 4 x 2 and 2 ranks x 2 micro x 2 see the same examples). A last partial
// global batch of an epoch is dropped. Everything follows from the step number, so a resumed run only
// needs the step.
#pragma once
#include <cstdint>
#include <vector>

namespace llmt {

class Sampler {
 public:
  Sampler(int64_t n, int world, int rank, int per_rank_batch, int accum, uint64_t seed);
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t global_batch() const { return global_; }
  // The per_rank_batch dataset indices of micro-batch `micro` (0 <= micro < accum) of this rank at `step`.
  std::vector<int64_t> indices(int64_t step, int micro) const;
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch_; }

 private:
  const std::vector<int64_t>& order(int64_t epoch) const;
  int64_t n_, global_, steps_per_epoch_;
  int world_, rank_, batch_, accum_;
  uint64_t seed_;
  mutable std::vector<int64_t> order_;  // the permutation of epoch order_epoch_ (not thread-safe)
  mutable int64_t order_epoch_ = -1;
};

// A permutation of 0..n-1 for (seed, epoch): Fisher-Yates driven by splitmix64, the same on every platform.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace llmt
