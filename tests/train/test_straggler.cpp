// The slow-rank rule (train/straggler.h): compute more than the threshold above the median.
#include <gtest/gtest.h>

#include "train/straggler.h"

namespace llmt {
namespace {

std::vector<RankStepTimes> computing(const std::vector<double>& ms) {
  std::vector<RankStepTimes> r;
  for (double c : ms) r.push_back({c + 5, c, 5});
  return r;
}

TEST(Straggler, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(median_of({}), 0.0);
  EXPECT_EQ(median_of({3, 1, 2}), 2.0);
  EXPECT_EQ(median_of({4, 1, 3, 2}), 2.5);
}

TEST(Straggler, NamesTheRanksAboveTheThresholdSlowestFirst) {
  // median 100, the limit 115: 114 is not above it, 117 and 150 are
  EXPECT_EQ(slow_ranks(computing({100, 150, 100, 117, 100, 114, 100}), 0.15), (std::vector<int>{1, 3}));
  EXPECT_TRUE(slow_ranks(computing({100, 104, 98, 101}), 0.15).empty());
}

TEST(Straggler, OffWithAZeroThresholdOrOneRank) {
  EXPECT_TRUE(slow_ranks(computing({100, 300}), 0.0).empty());
  EXPECT_TRUE(slow_ranks(computing({100}), 0.15).empty());
}

TEST(Straggler, NamedOnlyWhenSlowForTwoWindowsInARow) {
  EXPECT_EQ(persistently_slow({3, 1}, {1, 2, 3}), (std::vector<int>{3, 1}));
  EXPECT_TRUE(persistently_slow({1}, {}).empty());
  EXPECT_TRUE(persistently_slow({}, {1}).empty());
}

TEST(Straggler, TheLineNamesRankHostTimeAndMedian) {
  const auto ranks = computing({100, 210, 100});
  const std::string s = describe_slow_ranks({1}, ranks, {"a", "b", "c"}, 5, 8, 0.15);
  EXPECT_NE(s.find("slow rank 1 (host b): 210 ms of compute a step over steps 5-8, 2.10x the median 100 ms"),
            std::string::npos) << s;
  EXPECT_NE(s.find("--straggler_threshold 0.15"), std::string::npos) << s;
}

}  // namespace
}  // namespace llmt
