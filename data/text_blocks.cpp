#include "data/text_blocks.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "engine/core/error.h"

namespace llmt {

TextBlocks::TextBlocks(const std::string& path, int block_size) : path_(path), block_size_(block_size) {
  LLMT_CHECK(block_size >= 2, "block size %d is too small (at least 2 tokens)", block_size);
  std::ifstream f(path, std::ios::binary);
  LLMT_CHECK(f.good(), "cannot open training text %s: %s", path.c_str(), std::strerror(errno));
  tokens_.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  LLMT_CHECK(num_blocks() > 0, "%s: %zu bytes make no block of %d tokens", path.c_str(), tokens_.size(), block_size);
}

std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order((size_t)n);
  for (int64_t i = 0; i < n; i++) order[(size_t)i] = i;
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)epoch + 1;
  for (int64_t i = n - 1; i > 0; i--) {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::swap(order[(size_t)i], order[(size_t)(z % (uint64_t)(i + 1))]);
  }
  return order;
}

int64_t TextBlocks::batch(int64_t step, int batch, uint64_t seed, int32_t* tokens, int32_t* targets) const {
  const int64_t per_epoch = steps_per_epoch(batch);
  LLMT_CHECK(per_epoch > 0, "%s: %lld blocks of %d tokens are fewer than one batch of %d", path_.c_str(),
             (long long)num_blocks(), block_size_, batch);
  const int64_t epoch = step / per_epoch, first = (step % per_epoch) * batch;
  std::vector<int64_t> order = shuffled_order(num_blocks(), seed, epoch);
  const int T = block_size_;
  for (int b = 0; b < batch; b++) {
    const uint8_t* src = tokens_.data() + order[(size_t)(first + b)] * T;
    for (int t = 0; t < T; t++) {
      tokens[(int64_t)b * T + t] = src[t];
      targets[(int64_t)b * T + t] = t + 1 < T ? src[t + 1] : -100;
    }
  }
  return epoch;
}

}  // namespace llmt
