// llmt bench --sweep: the points are every combination, outermost sweep first, and a setting that
// cannot apply is an error naming it, before any point runs.
#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "tests/test_util.h"
#include "train/bench.h"

using namespace llmt;

TEST(BenchSweep, PointsAreEveryCombinationInOrder) {
  auto p = bench_points({"per_device_train_batch_size=1,2", "seq_len=64,128,256"});
  ASSERT_EQ(p.size(), 6u);
  EXPECT_EQ(p[0], (std::vector<std::pair<std::string, std::string>>{{"per_device_train_batch_size", "1"},
                                                                   {"seq_len", "64"}}));
  EXPECT_EQ(p[1][1].second, "128");
  EXPECT_EQ(p[3][0].second, "2");
  EXPECT_EQ(p[5][1].second, "256");
  EXPECT_EQ(bench_points({}).size(), 1u);  // no sweep: the one configuration
  auto f = bench_points({"fsdp=full_shard auto_wrap,no_shard"});
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0][0].second, "full_shard auto_wrap");
}

TEST(BenchSweep, SettingsApplyOrAreRefusedByName) {
  BenchArgs a;
  apply_bench_setting(a, "per_device_train_batch_size", "16");
  apply_bench_setting(a, "bf16", "True");
  apply_bench_setting(a, "model", "llama-tiny");
  apply_bench_setting(a, "fsdp", "hybrid_shard");
  EXPECT_EQ(a.batch, 16);
  EXPECT_TRUE(a.bf16);
  EXPECT_EQ(a.model, "llama-tiny");
  EXPECT_EQ(a.fsdp, "hybrid_shard");
  apply_bench_setting(a, "use_peft", "True");
  apply_bench_setting(a, "lora_r", "8");
  EXPECT_TRUE(a.use_peft);
  EXPECT_EQ(a.lora_r, 8);
  llmt_test::expect_error([&] { apply_bench_setting(a, "lora_r", "0"); }, {"out of range"});
  llmt_test::expect_error([&] { apply_bench_setting(a, "learning_rate", "1"); }, {"--sweep learning_rate", "not a sweepable"});
  llmt_test::expect_error([&] { apply_bench_setting(a, "seq_len", "long"); }, {"seq_len"});
  llmt_test::expect_error([&] { apply_bench_setting(a, "per_device_train_batch_size", "0"); }, {"out of range"});
  llmt_test::expect_error([&] { bench_points({"seq_len"}); }, {"expected KEY=V1,V2"});
  llmt_test::expect_error([&] { bench_points({"seq_len=64,,128"}); }, {"an empty value"});
}

// --dropout is every dropout of the run, the adapters' input dropout too (PEFT's peer runs
// lora_dropout 0 beside the model's 0), unless --lora_dropout says otherwise.
TEST(BenchSweep, DropoutCoversTheAdaptersUnlessLoraDropoutIsGiven) {
  Flags f("bench", {"--use_peft", "True", "--dropout", "0"});
  BenchArgs a = parse_bench_args(f);
  EXPECT_EQ(a.lora_dropout, 0.0);
  Flags g("bench", {"--use_peft", "True", "--dropout", "0", "--lora_dropout", "0.1"});
  EXPECT_EQ(parse_bench_args(g).lora_dropout, 0.1);
  Flags h("bench", {"--use_peft", "True"});
  EXPECT_EQ(parse_bench_args(h).lora_dropout, 0.05);  // TRL's default without --dropout
}
