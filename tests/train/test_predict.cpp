// llmt plan --predict (train/predict.h): the step-time model's structure, checked on cases whose
// answer follows from the model's definition: parts add up, faster links or GPUs only help, a
// communication-bound run exposes its communication, and MFU is the plan's FLOPs at the predicted
// rate. Its agreement with published figures is in docs/performance.md, not asserted here.
#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "models/config.h"
#include "tests/test_util.h"
#include "train/predict.h"

using namespace llmt;

namespace {

PlanArgs llama_run(int world) {
  PlanArgs a;
  a.model = "llama2-7b";
  a.world = world;
  a.ranks_per_node = 8;
  a.fsdp = "full_shard auto_wrap";
  a.batch = 2;
  a.seq_len = 4096;
  a.bf16 = true;
  return a;
}

}  // namespace

TEST(Predict, PartsAddUpAndMfuIsThePlansFlopsAtThePredictedRate) {
  const ModelConfig cfg = config_from_preset("llama2-7b");
  const nlohmann::json p = predict_step(cfg, llama_run(8), cluster_preset("h100"));
  const double step = p["step_s"], compute = p["compute_s"], opt = p["optimizer_s"], exposed = p["comm_exposed_s"];
  EXPECT_NEAR(step, compute + opt + exposed, 1e-12 * step);
  EXPECT_LE(exposed, p["comm_total_s"].get<double>());
  EXPECT_LT(p["matmul_s"].get<double>() + p["attention_s"].get<double>(), compute);  // elementwise time remains
  EXPECT_NEAR(p["tokens_per_s_per_gpu"].get<double>(), 2.0 * 4096 / step, 1e-9 * step);
  const double fpt = p["plan"]["flops_per_token"];
  EXPECT_NEAR(p["mfu"].get<double>(), fpt * p["tokens_per_s_per_gpu"].get<double>() / 989.4e12, 1e-12);
  // within one node, NVLink hides every gather but the first and the last reductions
  EXPECT_LT(exposed, 0.1 * p["comm_total_s"].get<double>());
}

TEST(Predict, ASlowNetworkExposesCommunicationAndFasterPartsOnlyHelp) {
  const ModelConfig cfg = config_from_preset("llama2-7b");
  ClusterSpec slow = cluster_preset("h100");
  slow.nic_gbits_per_gpu = 1.0;  // 1 Gb/s a GPU: the shard group over 2 nodes is communication-bound
  const nlohmann::json p = predict_step(cfg, llama_run(16), slow);
  EXPECT_TRUE(p["shard_group_crosses_nodes"].get<bool>());
  EXPECT_GT(p["comm_exposed_s"].get<double>(), 0.8 * p["comm_total_s"].get<double>());
  EXPECT_GT(p["comm_exposed_s"].get<double>(), p["compute_s"].get<double>());
  const nlohmann::json fast = predict_step(cfg, llama_run(16), cluster_preset("h100"));
  EXPECT_LT(fast["step_s"].get<double>(), p["step_s"].get<double>());
  ClusterSpec twice = cluster_preset("h100");
  twice.peak_tflops *= 2;
  const nlohmann::json q = predict_step(cfg, llama_run(16), twice);
  EXPECT_NEAR(q["matmul_s"].get<double>(), 0.5 * fast["matmul_s"].get<double>(), 1e-9);
  EXPECT_LT(q["step_s"].get<double>(), fast["step_s"].get<double>());
  // hybrid_shard keeps the gathers on NVLink; only the replicas' all_reduce crosses the network
  PlanArgs h = llama_run(16);
  h.fsdp = "hybrid_shard";
  const nlohmann::json hy = predict_step(cfg, h, slow);
  EXPECT_FALSE(hy["shard_group_crosses_nodes"].get<bool>());
  EXPECT_LT(hy["comm_exposed_s"].get<double>(), p["comm_exposed_s"].get<double>());
}

TEST(Predict, RecomputationCostsForwardWorkAndBadSettingsAreRefused) {
  const ModelConfig cfg = config_from_preset("llama2-7b");
  ClusterSpec c = cluster_preset("a100");
  const double none = predict_step(cfg, llama_run(8), c)["compute_s"];
  c.recompute = "selective";
  const double selective = predict_step(cfg, llama_run(8), c)["compute_s"];
  c.recompute = "full";
  const double full = predict_step(cfg, llama_run(8), c)["compute_s"];
  EXPECT_LT(none, selective);
  EXPECT_LT(selective, full);
  EXPECT_LT(full, none * 4.0 / 3.0 * 1.001);  // at most the whole forward again
  c.recompute = "some";
  llmt_test::expect_error([&] { predict_step(cfg, llama_run(8), c); }, {"--recompute"});
  llmt_test::expect_error([&] { cluster_preset("tpu"); }, {"--gpu tpu", "a100, h100"});
  ClusterSpec bad = cluster_preset("h100");
  bad.matmul_efficiency = 1.5;
  llmt_test::expect_error([&] { predict_step(cfg, llama_run(8), bad); }, {"efficiencies"});
}
