// Packing's data side (data/packing.h): every example in exactly one row, no row over its length,
// the rows best fit decreasing; packed batches' targets shifted inside each example only, and their
// document starts; a sampler epoch over the rows covers each example once.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "data/packing.h"
#include "data/sampler.h"

using namespace llmt;

namespace {

TokenDataset make_dataset(const std::vector<int>& lengths) {
  std::vector<int64_t> offsets = {0};
  std::vector<int32_t> ids, labels;
  for (size_t e = 0; e < lengths.size(); e++)
    for (int t = 0; t < lengths[e]; t++) {
      ids.push_back((int32_t)(1000 * e + t));
      labels.push_back(t < 2 ? kIgnoreIndex : (int32_t)(1000 * e + t));  // a 2-token "prompt" masked
    }
  for (int n : lengths) offsets.push_back(offsets.back() + n);
  return TokenDataset(offsets, ids, labels);
}

TEST(PackingData, EveryExampleOnceInRowsThatFit) {
  std::mt19937 rng(3);
  std::vector<int> lengths;
  for (int i = 0; i < 500; i++) lengths.push_back(1 + (int)(rng() % 100));
  lengths.push_back(100);  // exactly a row
  const TokenDataset ds = make_dataset(lengths);
  const PackedRows p = pack_examples(ds, 100);
  std::vector<int> seen(lengths.size(), 0);
  int64_t tokens = 0;
  for (const auto& row : p.rows) {
    int64_t n = 0;
    for (int64_t e : row) seen[(size_t)e]++, n += lengths[(size_t)e];
    EXPECT_LE(n, 100);
    tokens += n;
  }
  for (size_t e = 0; e < seen.size(); e++) ASSERT_EQ(seen[e], 1) << "example " << e;
  EXPECT_EQ(tokens, ds.total_tokens());
  EXPECT_EQ(p.tokens, ds.total_tokens());
  // best fit decreasing packs 500 random lengths of mean ~50 nearly full: at most 2% more rows than the bound
  const int64_t bound = (ds.total_tokens() + 99) / 100;
  EXPECT_LE((int64_t)p.rows.size(), bound + bound / 50 + 1) << "rows " << p.rows.size() << ", at least " << bound;
  EXPECT_EQ(pack_examples(ds, 100).rows, p.rows) << "deterministic";
  EXPECT_THROW(pack_examples(ds, 99), Error) << "an example longer than a row";
}

TEST(PackingData, CollateShiftsInsideEachExampleAndMarksDocuments) {
  const TokenDataset ds = make_dataset({4, 1, 3, 5});
  PackedRows p;
  p.row_len = 8;
  p.rows = {{0, 1, 2}, {3}};
  p.row_tokens = {8, 5};
  std::vector<int32_t> tok, tgt, doc;
  const int T = collate_packed(ds, p, {0, 1}, 7, tok, tgt, doc);
  ASSERT_EQ(T, 8);  // the longer row: 4 + 1 + 3
  const int32_t I = kIgnoreIndex;
  EXPECT_EQ(tok, (std::vector<int32_t>{0, 1, 2, 3, 1000, 2000, 2001, 2002, 3000, 3001, 3002, 3003, 3004, 7, 7, 7}));
  // example 0's labels are [-, -, 2, 3]: position t predicts label t+1; each example's last predicts nothing
  EXPECT_EQ(tgt, (std::vector<int32_t>{I, 2, 3, I, I, I, 2002, I, I, 3002, 3003, 3004, I, I, I, I}));
  EXPECT_EQ(doc, (std::vector<int32_t>{0, 0, 0, 0, 4, 5, 5, 5, 0, 0, 0, 0, 0, 5, 5, 5}));
}

TEST(PackingData, AnEpochOfRowsCoversEveryExampleOnce) {
  std::vector<int> lengths;
  for (int i = 0; i < 97; i++) lengths.push_back(1 + (i * 37) % 30);
  const TokenDataset ds = make_dataset(lengths);
  const PackedRows p = pack_examples(ds, 32);
  const int world = 2, batch = 1, accum = 1;
  std::vector<int> seen(lengths.size(), 0);
  for (int rank = 0; rank < world; rank++) {
    Sampler s((int64_t)p.rows.size(), world, rank, batch, accum, 42);
    for (int64_t step = 0; step < s.steps_per_epoch(); step++)
      for (int64_t r : s.indices(step, 0))
        for (int64_t e : p.rows[(size_t)r]) seen[(size_t)e]++;
  }
  const int64_t dropped = (int64_t)p.rows.size() % (world * batch * accum);  // the last partial global batch
  int64_t missing = 0;
  for (int c : seen) {
    ASSERT_LE(c, 1);
    missing += c == 0;
  }
  EXPECT_LE(missing, dropped * 32) << "only the dropped partial batch's rows' examples are missing";
  if (dropped == 0) {
    EXPECT_EQ(missing, 0);
  }
}

TEST(PackingData, PaddingFractions) {
  const TokenDataset ds = make_dataset({10, 2, 8, 8});
  // unpacked, batches of 2 in this order: (10, 2) -> 20 computed, 12 real; (8, 8) -> 16, 16
  EXPECT_DOUBLE_EQ(padding_fraction_unpacked(ds, {0, 1, 2, 3}, 2), 1.0 - 28.0 / 36.0);
  const PackedRows p = pack_examples(ds, 12);  // rows {10, 2} and {8}, {8}
  ASSERT_EQ(p.rows.size(), 3u);
  EXPECT_DOUBLE_EQ(padding_fraction_packed(p, {0, 1, 2}, 1), 0.0);
  EXPECT_DOUBLE_EQ(padding_fraction_packed(p, {0, 1}, 2), 1.0 - 20.0 / 24.0);
}

}  // namespace
