#include "data/sampler.h"

#include "engine/core/error.h"
#include "engine/core/rng.h"

namespace llmt {

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p((size_t)n);
  for (int64_t i = 0; i < n; i++) p[(size_t)i] = i;
  SplitMix64 rng{stream_state(seed, (uint64_t)epoch)};
  for (int64_t i = n - 1; i > 0; i--) std::swap(p[(size_t)i], p[(size_t)(rng.next() % (uint64_t)(i + 1))]);
  return p;
}

Sampler::Sampler(int64_t n, int world, int rank, int per_rank_batch, int accum, uint64_t seed)
    : n_(n), world_(world), rank_(rank), batch_(per_rank_batch), accum_(accum), seed_(seed) {
  LLMT_CHECK(world >= 1 && rank >= 0 && rank < world, "sampler: rank %d of world %d", rank, world);
  LLMT_CHECK(per_rank_batch >= 1 && accum >= 1, "sampler: per-device batch %d and accumulation %d must be >= 1",
             per_rank_batch, accum);
  global_ = (int64_t)world * per_rank_batch * accum;
  steps_per_epoch_ = n / global_;
  LLMT_CHECK(steps_per_epoch_ > 0,
             "the dataset's %lld examples are fewer than one global batch of %lld (%d ranks x %d per device x %d "
             "accumulation steps)",
             (long long)n, (long long)global_, world, per_rank_batch, accum);
}

const std::vector<int64_t>& Sampler::order(int64_t epoch) const {
  if (epoch != order_epoch_) {
    order_ = epoch_permutation(n_, seed_, epoch);
    order_epoch_ = epoch;
  }
  return order_;
}

std::vector<int64_t> Sampler::indices(int64_t step, int micro) const {
  LLMT_CHECK(step >= 0 && micro >= 0 && micro < accum_, "sampler: step %lld micro-batch %d (of %d)", (long long)step,
             micro, accum_);
  const std::vector<int64_t>& p = order(epoch_of(step));
  const int64_t first = (step % steps_per_epoch_) * global_ + ((int64_t)micro * world_ + rank_) * batch_;
  return std::vector<int64_t>(p.begin() + first, p.begin() + first + batch_);
}

}  // namespace llmt
