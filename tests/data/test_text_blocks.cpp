#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "data/text_blocks.h"
#include "engine/core/error.h"

using namespace llmt;

TEST(TextBlocks, GroupsShiftsAndShufflesByEpoch) {
  std::string path = "/tmp/llmt_text_blocks_test.txt";
  std::string text;
  for (int i = 0; i < 103; i++) text += (char)('a' + i % 26);
  std::ofstream(path) << text;
  TextBlocks d(path, 10);  // 10 blocks, 3 bytes dropped
  EXPECT_EQ(d.num_blocks(), 10);
  EXPECT_EQ(d.steps_per_epoch(3), 3);
  std::vector<int32_t> tok(30), tgt(30);
  std::set<int> first_bytes;
  for (int step = 0; step < 3; step++) {
    EXPECT_EQ(d.batch(step, 3, 7, tok.data(), tgt.data()), 0);
    for (int b = 0; b < 3; b++) {
      for (int t = 0; t < 9; t++) EXPECT_EQ(tgt[b * 10 + t], tok[b * 10 + t + 1]);
      EXPECT_EQ(tgt[b * 10 + 9], -100);
      first_bytes.insert(tok[b * 10]);
    }
  }
  EXPECT_EQ(d.batch(3, 3, 7, tok.data(), tgt.data()), 1);  // next epoch
  EXPECT_NE(shuffled_order(10, 7, 0), shuffled_order(10, 7, 1));
  EXPECT_EQ(shuffled_order(10, 7, 0), shuffled_order(10, 7, 0));
  EXPECT_THROW(TextBlocks("/nonexistent/file.txt", 10), Error);
  EXPECT_THROW(TextBlocks(path, 200), Error);
}
