// Packing for supervised fine-tuning (--packing, TRL's SFTConfig name): whole examples placed into
// rows of at most `row_len` tokens, so a step computes on examples rather than on the padding that
// pads every example of a batch to its longest. An example is never split: rows are filled best
// fit decreasing (TRL's default "bfd"): longest example first, each into the fullest row it still
// fits. Inside a row each example keeps its own positions (restarting at 0) and attends only to
// itself (the model's document mask), and its last token predicts nothing, so the loss is the
// unpacked run's, example by example.
#pragma once
#include <cstdint>
#include <vector>

#include "data/dataset.h"

namespace llmt {

struct PackedRows {
  int row_len = 0;                          // tokens a row holds at most
  std::vector<std::vector<int64_t>> rows;   // each row's examples, in the order they sit in it
  std::vector<int64_t> row_tokens;          // each row's examples' tokens
  int64_t tokens = 0;                       // the examples' tokens over every row
  int64_t longest = 0;                      // the fullest row's tokens
};

// Packs every example of ds (none longer than row_len) into rows; deterministic.
PackedRows pack_examples(const TokenDataset& ds, int row_len);

// The padding the steps of one epoch compute on, as a fraction of their tokens: unpacked, each
// batch of `batch` examples (in `order`) padded to its longest; packed, each batch of `batch` rows
// padded to its longest row.
double padding_fraction_unpacked(const TokenDataset& ds, const std::vector<int64_t>& order, int batch);
double padding_fraction_packed(const PackedRows& p, const std::vector<int64_t>& order, int batch);

// collate() for packed rows: rows `idx` of p, each padded (right) to the longest of them; returns
// T. tokens and targets as collate fills them, each example's targets shifted inside it (its last
// token predicts nothing); doc_start[b*T + t] the position in its row where token t's example
// begins (the padding after the last example counts as one more document).
int collate_packed(const TokenDataset& ds, const PackedRows& p, const std::vector<int64_t>& idx, int pad_id,
                   std::vector<int32_t>& tokens, std::vector<int32_t>& targets, std::vector<int32_t>& doc_start);

}  // namespace llmt
