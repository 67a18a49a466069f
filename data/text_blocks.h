// A plain text file as training blocks, byte-level: every byte is one token id (0..255).
// (Real tokenizers arrive with the data issue; this is what `llmt train --train_file` and the
// quickstart use today.) Blocks are grouped as transformers' run_clm.py groups texts: the token
// stream is cut into non-overlapping blocks of block_size, the remainder dropped, and within a
// block token t predicts token t + 1 (the last position has no target, -100).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace llmt {

class TextBlocks {
 public:
  TextBlocks(const std::string& path, int block_size);
  int64_t num_blocks() const { return (int64_t)tokens_.size() / block_size_; }
  int64_t num_tokens() const { return (int64_t)tokens_.size(); }
  // The batch of `batch` blocks for step `step` (0-based) of the run: blocks are visited in an order
  // shuffled by (seed, epoch); a last partial batch of an epoch is dropped. Writes batch*block_size
  // tokens and targets; returns the epoch the batch belongs to.
  int64_t batch(int64_t step, int batch, uint64_t seed, int32_t* tokens, int32_t* targets) const;
  int64_t steps_per_epoch(int batch) const { return num_blocks() / batch; }

 private:
  std::string path_;
  int block_size_;
  std::vector<uint8_t> tokens_;
};

// A deterministic permutation of 0..n-1 for (seed, epoch) (Fisher-Yates over splitmix64; the same on every platform).
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace llmt
