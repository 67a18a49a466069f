// The message ranks that disagree on their configuration end with (engine/dist/agree.h): every field
// that differs, each value with the ranks that hold it; nothing when they agree. The collective
// itself runs under mpirun in tests/cli/rank_agreement.sh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/dist/agree.h"

using namespace llmt;

TEST(Agree, RanksThatAgreeGiveNoMessage) {
  ConfigFields a = {{"--learning_rate", "0.001"}, {"--fsdp", "full_shard"}};
  EXPECT_EQ(describe_disagreement("train configuration", {a, a, a}), "");
}

TEST(Agree, EachDifferingFieldNamesItsValuesAndTheirRanks) {
  ConfigFields a = {{"--learning_rate", "0.001"}, {"--fsdp", "full_shard"}, {"--output_dir", "out"}};
  ConfigFields b = {{"--learning_rate", "0.002"}, {"--fsdp", "full_shard"}, {"--output_dir", "out"}};
  ConfigFields c = {{"--learning_rate", "0.001"}, {"--fsdp", ""}, {"--output_dir", "out"}};
  const std::string m = describe_disagreement("train configuration", {a, b, a, c});
  EXPECT_NE(m.find("the ranks disagree on their train configuration"), std::string::npos) << m;
  EXPECT_NE(m.find("--learning_rate: 0.001 on ranks 0, 2, 3; 0.002 on rank 1"), std::string::npos) << m;
  EXPECT_NE(m.find("--fsdp: full_shard on ranks 0, 1, 2; \"\" on rank 3"), std::string::npos) << m;
  EXPECT_EQ(m.find("--output_dir"), std::string::npos) << m;
}

TEST(Agree, AFieldOnlySomeRanksHaveIsSaidToBeMissing) {
  ConfigFields a = {{"command", "llmt train"}};
  ConfigFields b = {{"command", "llmt train"}, {"--new_flag", "1"}};
  const std::string m = describe_disagreement("command", {a, b});
  EXPECT_NE(m.find("--new_flag: (not set on this rank"), std::string::npos) << m;
  EXPECT_NE(m.find("on rank 0; 1 on rank 1"), std::string::npos) << m;
}
