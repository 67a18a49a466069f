// Flags in the Hugging Face style, train argument checks, and LR schedules.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/core/error.h"
#include "engine/optim/schedule.h"
#include "train/flags.h"
#include "train/trainer.h"
#include "tests/test_util.h"

#include <fstream>
#include <nlohmann/json.hpp>

using namespace llmt;

TEST(Flags, ParsesValuesBooleansAndEquals) {
  Flags f("train", {"--bf16", "True", "--tf32", "--learning_rate=2e-5", "--fsdp-x", "a b", "--do_eval", "false"});
  EXPECT_TRUE(f.get_bool("bf16", false));
  EXPECT_TRUE(f.get_bool("tf32", false));
  EXPECT_DOUBLE_EQ(f.get_double("learning_rate", 0), 2e-5);
  EXPECT_EQ(f.get_string("fsdp_x", ""), "a b");
  EXPECT_FALSE(f.get_bool("do_eval", true));
  EXPECT_EQ(f.get_int("absent", 7), 7);
  EXPECT_NO_THROW(f.finish());
}

TEST(Flags, UnknownBadAndRepeatedFlagsAreNamed) {
  Flags f("train", {"--learning_rate", "1e-3", "--deepspeed", "ds.json"});
  f.get_double("learning_rate", 0);
  try {
    f.finish();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--deepspeed"), std::string::npos) << e.what();
  }
  Flags g("train", {"--max_steps", "ten", "--bf16", "maybe"});
  EXPECT_THROW(g.get_int("max_steps", 0), Error);
  EXPECT_THROW(g.get_bool("bf16", false), Error);
  EXPECT_THROW(Flags("train", {"positional"}), Error);
}

// Wrapper scripts append overrides: as in argparse, the last value of a repeated flag wins (it used
// to be an error).
TEST(Flags, TheLastOfARepeatedFlagWins) {
  Flags f("train", {"--seed", "1", "--bf16", "--seed=2", "--bf16", "False"});
  EXPECT_EQ(f.get_int("seed", 0), 2);
  EXPECT_FALSE(f.get_bool("bf16", true));
  EXPECT_NO_THROW(f.finish());
}

// The Hugging Face examples' flags that were refused: each parses with its meaning, or is refused
// with the reason.
TEST(TrainArgs, TheTrainerFlagsPeoplePaste) {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model_config", "gpt2-tiny", "--train_file", "t.txt", "--output_dir", "o"};
    args.insert(args.end(), extra.begin(), extra.end());
    Flags f("train", args);
    TrainArgs a = parse_train_args(f);
    f.finish();
    return a;
  };
  TrainArgs a = parse({"--optim", "adamw_torch_fused", "--logging_strategy", "epoch", "--logging_first_step",
                       "--dataloader_drop_last", "True", "--dataloader_num_workers", "4",
                       "--preprocessing_num_workers", "1", "--validation_split_percentage", "5", "--torch_dtype",
                       "bfloat16", "--ddp_find_unused_parameters", "False", "--save_safetensors", "True",
                       "--save_only_model", "True", "--overwrite_cache", "True", "--lr_scheduler_type", "polynomial",
                       "--lr_scheduler_kwargs", "{\"lr_end\": 1e-7, \"power\": 2}", "--learning_rate", "1e-4",
                       "--fp16", "False"});
  EXPECT_EQ(a.optim, "adamw_torch_fused");
  EXPECT_EQ(a.logging_strategy, "epoch");
  EXPECT_TRUE(a.logging_first_step && a.save_only_model && a.data.overwrite_cache);
  EXPECT_EQ(a.data.preprocessing_num_workers, 1);  // (at most the CPUs: this machine may have two)
  EXPECT_EQ(a.data.validation_split_percentage, 5);
  const std::vector<std::pair<std::vector<std::string>, std::string>> bad = {
      {{"--optim", "adafactor"}, "--optim adafactor: llmt implements AdamW"},
      {{"--fp16"}, "use --bf16 True"},
      {{"--fp16", "True"}, "needs loss scaling"},
      {{"--dataloader_drop_last", "False"}, "always drops the last incomplete global batch"},
      {{"--save_safetensors", "False"}, "safetensors only"},
      {{"--logging_strategy", "sometimes"}, "--logging_strategy must be steps, epoch or no"},
      {{"--validation_split_percentage", "100"}, "[0, 100)"},
      {{"--torch_dtype", "int8"}, "--torch_dtype"},
      {{"--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", "{\"power\": 2}"}, "cosine takes no \"power\""},
      {{"--lr_scheduler_type", "polynomial", "--lr_scheduler_kwargs", "{\"lr_end\": 1}"}, "lr_end (1) must be below"},
      {{"--lr_scheduler_kwargs", "{num_cycles: 2}"}, "not JSON"},
  };
  for (const auto& [flags, message] : bad) llmt_test::expect_error([&] { parse(flags); }, {message});
}

TEST(TrainArgs, RejectsNonsense) {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model_config", "gpt2-tiny", "--train_file", "x.txt", "--output_dir", "o"};
    args.insert(args.end(), extra.begin(), extra.end());
    Flags f("train", args);
    return parse_train_args(f);
  };
  EXPECT_NO_THROW(parse({}));
  EXPECT_THROW(parse({"--per_device_train_batch_size", "0"}), Error);
  EXPECT_THROW(parse({"--gradient_accumulation_steps", "0"}), Error);
  EXPECT_THROW(parse({"--learning_rate", "-1"}), Error);
  EXPECT_THROW(parse({"--device", "tpu"}), Error);
  EXPECT_THROW(parse({"--model_name_or_path", "dir"}), Error);  // two model sources
  // optimizer settings that trained to NaN or to nothing were accepted; now each names its range
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"--learning_rate", "inf"}, "--learning_rate inf: expected a value in [0, 10]"},
      {{"--learning_rate", "1e308"}, "--learning_rate 1e+308"},
      {{"--adam_beta1", "1.0"}, "--adam_beta1 1: expected a value in [0, 1)"},
      {{"--adam_beta2", "2"}, "--adam_beta2 2"},
      {{"--adam_epsilon", "0"}, "--adam_epsilon 0: expected a value in (0, 1]"},
      {{"--weight_decay", "nan"}, "--weight_decay nan"},
      {{"--ddp_timeout", "0"}, "--ddp_timeout"},
      {{"--ddp_backend", "gloo"}, "--ddp_backend"},
      {{"--ddp_backend", "nccl"}, "needs --device cuda"},
  };
  for (const auto& [flags, message] : bad) llmt_test::expect_error([&] { parse(flags); }, {message});
  EXPECT_NO_THROW(parse({"--adam_beta2", "0.95", "--adam_epsilon", "1e-6", "--weight_decay", "0.1"}));
}

// Issue 23: counts from flags are range-checked. --threads -1 was silently 0, --preprocessing_num_workers
// 100000 crashed inside OpenMP, --block_size -1 was the default, and --num_train_epochs 1e15 overflowed
// the step count to -9223372036854775808 (the run trained nothing and exited 0).
TEST(TrainArgs, CountsFromFlagsAreRangeChecked) {
  auto parse = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model_config", "gpt2-tiny", "--train_file", "x.txt", "--output_dir", "o"};
    args.insert(args.end(), extra.begin(), extra.end());
    Flags f("train", args);
    return parse_train_args(f);
  };
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"--threads", "-1"}, "--threads -1: expected 0"},
      {{"--threads", "100000"}, "--threads 100000: expected 0"},
      {{"--preprocessing_num_workers", "100000"}, "--preprocessing_num_workers 100000: expected 0 (the rank's threads) to"},
      {{"--preprocessing_num_workers", "-1"}, "--preprocessing_num_workers -1"},
      {{"--block_size", "-1"}, "--block_size -1: expected a positive number of tokens"},
      {{"--block_size", "0"}, "--block_size 0: expected a positive number of tokens"},
      {{"--hybrid_shard_group_size", "-2"}, "--hybrid_shard_group_size -2"},
      {{"--eval_steps", "-5"}, "--eval_steps -5"},
      {{"--warmup_steps", "-1"}, "--warmup_steps must not be negative"},
      {{"--num_train_epochs", "inf"}, "--num_train_epochs inf: expected a finite number"},
      {{"--ddp_timeout", "inf"}, "--ddp_timeout must be a positive number of seconds"},
  };
  for (const auto& [flags, message] : bad) llmt_test::expect_error([&] { parse(flags); }, {message});
  EXPECT_EQ(parse({}).data.block_size, 0);  // unset: the trainer takes min(1024, the model's context)
  EXPECT_EQ(parse({"--block_size", "64"}).data.block_size, 64);
  EXPECT_EQ(parse({"--threads", "1", "--preprocessing_num_workers", "1"}).threads, 1);

  TrainArgs a = parse({"--num_train_epochs", "1e15"});
  llmt_test::expect_error([&] { total_train_steps(a, 134, 2); },
                          {"--num_train_epochs 1e+15 x 134 steps per epoch", "beyond what llmt can count"});
  a.num_train_epochs = 2.5;
  EXPECT_EQ(total_train_steps(a, 134, 2), 335);
  a.max_steps = 10;
  EXPECT_EQ(total_train_steps(a, 134, 2), 10);
  a.max_steps = (int64_t)1 << 62;
  llmt_test::expect_error([&] { total_train_steps(a, 134, 2); }, {"--max_steps 4611686018427387904"});
}

TEST(Schedule, MatchesTransformersFormulas) {
  // transformers get_scheduler: 10 steps, 2 warmup (values worked by hand from its lr_lambda definitions)
  Schedule lin = make_schedule("linear", 10, 2, 0.0);
  EXPECT_DOUBLE_EQ(lin.multiplier(0), 0.0);
  EXPECT_DOUBLE_EQ(lin.multiplier(1), 0.5);
  EXPECT_DOUBLE_EQ(lin.multiplier(2), 1.0);
  EXPECT_DOUBLE_EQ(lin.multiplier(6), 0.5);
  EXPECT_DOUBLE_EQ(lin.multiplier(10), 0.0);
  Schedule cos = make_schedule("cosine", 10, 0, 0.2);  // ratio 0.2 -> 2 warmup steps
  EXPECT_EQ(cos.warmup_steps, 2);
  EXPECT_DOUBLE_EQ(cos.multiplier(1), 0.5);
  EXPECT_NEAR(cos.multiplier(6), 0.5, 1e-12);
  EXPECT_NEAR(cos.multiplier(4), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-12);
  EXPECT_DOUBLE_EQ(make_schedule("constant", 10, 5, 0.0).multiplier(0), 1.0);
  EXPECT_DOUBLE_EQ(make_schedule("constant_with_warmup", 10, 4, 0.0).multiplier(1), 0.25);
  EXPECT_THROW(make_schedule("polynomial_decay", 10, 0, 0.0), Error);
  EXPECT_THROW(make_schedule("cosine", 10, 0, 1.5), Error);
}

TEST(Schedule, EqualsTransformersGetSchedulerStepForStep) {
  // fixture: tests/reference/make_schedule_fixtures.py (torch optimizer + transformers get_scheduler)
  std::ifstream f(llmt_test::reference_dir() + "/schedules.json");
  ASSERT_TRUE(f.good());
  nlohmann::json cases;
  f >> cases;
  ASSERT_GE(cases.size(), 14u);
  for (const auto& c : cases) {
    Schedule s = make_schedule(c["type"], c["total"], c["warmup"], 0.0, c["kwargs"].dump(), c["base_lr"]);
    const auto& want = c["lr"];
    for (size_t step = 0; step < want.size(); step++)
      EXPECT_NEAR(s.multiplier((int64_t)step), want[step].get<double>(), 1e-12)
          << c["type"] << " total " << c["total"] << " warmup " << c["warmup"] << " step " << step;
  }
}

TEST(TrainArgs, StanfordAlpacaAndOptimumHabanaCommandsParseUnchanged) {
  std::vector<std::string> alpaca = {
      "--model_name_or_path", "/models/llama-7b", "--data_path", "./alpaca_data.json", "--bf16", "True",
      "--output_dir", "./out", "--num_train_epochs", "3", "--per_device_train_batch_size", "4",
      "--per_device_eval_batch_size", "4", "--gradient_accumulation_steps", "8", "--evaluation_strategy", "no",
      "--save_strategy", "steps", "--save_steps", "2000", "--save_total_limit", "1", "--learning_rate", "2e-5",
      "--weight_decay", "0.", "--warmup_ratio", "0.03", "--lr_scheduler_type", "cosine", "--logging_steps", "1",
      "--fsdp", "full_shard auto_wrap", "--fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer", "--tf32", "True"};
  Flags f("train", alpaca);
  TrainArgs a = parse_train_args(f);
  EXPECT_NO_THROW(f.finish());
  EXPECT_EQ(a.fsdp, "full_shard auto_wrap");
  EXPECT_EQ(a.gradient_accumulation_steps, 8);
  EXPECT_EQ(a.save_total_limit, 1);
  EXPECT_TRUE(a.bf16 && a.tf32);
  EXPECT_DOUBLE_EQ(a.warmup_ratio, 0.03);

  std::vector<std::string> habana = {
      "--model_name_or_path", "gpt2-xl", "--dataset_name", "wikitext", "--dataset_config_name", "wikitext-2-raw-v1",
      "--dataset_dir", "/data", "--do_train", "--do_eval", "--per_device_train_batch_size", "4",
      "--gradient_checkpointing", "--num_train_epochs", "2", "--learning_rate", "5e-5", "--throughput_warmup_steps", "3",
      "--output_dir", "./out", "--use_habana", "--use_lazy_mode", "--gaudi_config_name", "Habana/gpt2",
      "--use_hpu_graphs_for_inference"};
  Flags g("train", habana);
  TrainArgs b = parse_train_args(g);
  EXPECT_NO_THROW(g.finish());
  EXPECT_TRUE(b.do_eval && b.gradient_checkpointing);
  EXPECT_EQ(b.throughput_warmup_steps, 3);
  EXPECT_EQ(b.data.dataset_config_name, "wikitext-2-raw-v1");
}
