// LoRA under mpirun (ctest: 2 ranks): the PEFT fixtures' run (tests/reference/lora, 5 AdamW steps on
// a global batch of two sequences) with the base model in a frozen FsdpStore and the adapter in a
// trainable one, both full_shard (and the adapter shard_grad_op), must give a single process's
// losses and final adapter within the reorder bounds of tests/tolerances.h; and the frozen base moves
// gathers only: its bytes in a step are the same model's trainable store's less its reduce-scatters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/dist/launch.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/hf_checkpoint.h"
#include "models/lora.h"
#include "models/transformer.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"
#include "train/plan.h"
#include "train/step.h"

using namespace llmt;

namespace {

ControlComm* g_world = nullptr;
namespace tol = llmt_test::tol;
const int kSteps = 5;
const float kLr = 1e-2f;

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> adapter, grads;  // full units at the end; step 1's (one process only)
  double base_bytes = 0.0;                         // the base store's bytes sent in step 1
  // what a trainable base would send beyond the gathers in a step of one micro-batch: one f32
  // reduce-scatter of every unit and the gradient norm's f64 all-reduce
  double reduce_bytes = 0.0;
  // what llmt plan predicts: step 1's bytes sent (both stores and the step's scalars), the stores'
  // persistent bytes and their gathered buffers' peaks
  double step1_bytes = 0.0, persistent = 0.0, peak_gathered = 0.0;
  int micro_batches = 0;
};

// The case's 5 steps on `comm`: rank r takes sequences r, r + W, ... of the global batch of B, as the
// sampler slices it, accumulating the rest.
Outcome run_case(const std::string& name, const std::string& base_name, ControlComm& comm, Strategy adapter_strategy,
                 bool frozen = true, Strategy base_strategy = Strategy::full_shard) {
  const std::string dir = llmt_test::reference_dir() + "/lora/" + name;
  const std::string base_dir = llmt_test::reference_dir() + "/" + base_name;
  SafetensorsFile ref(dir + "/reference.safetensors");
  const StTensor* ids_t = ref.find("input_ids");
  const int B = (int)ids_t->shape[0], T = (int)ids_t->shape[1];
  std::vector<int32_t> ids((size_t)B * T), labels(ids.size()), targets(ids.size(), kIgnoreIndex);
  std::memcpy(ids.data(), ref.data(*ids_t), ids.size() * 4);
  std::memcpy(labels.data(), ref.data(*ref.find("labels")), labels.size() * 4);
  for (int b = 0; b < B; b++)
    for (int t = 0; t + 1 < T; t++) targets[(size_t)(b * T + t)] = labels[(size_t)(b * T + t + 1)];

  ModelConfig cfg = config_from_json_file(base_dir + "/config.json");
  LoraConfig lora = read_adapter_config(dir + "/adapter_init/adapter_config.json");
  LoraLayout AL = make_lora_layout(cfg, lora);
  auto be = make_cpu_backend(1, DType::f32);
  std::unique_ptr<DataComm> data = make_mpi_data_comm(comm);
  Transformer model(cfg, *be, 1, T);
  const ModelLayout& L = model.layout();
  FsdpStore base(*be, L, base_strategy, *data, 1, DType::f32, frozen);
  SafetensorsCheckpoint ckpt(base_dir);
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> host((size_t)L.units[u].numel);
    load_hf_unit(ckpt, cfg, L, (int)u, host.data());
    base.set_unit((int)u, host.data());
  }
  FsdpStore adapter(*be, AL, adapter_strategy, *data, 1);
  SafetensorsFile init(dir + "/adapter_init/adapter_model.safetensors");
  for (size_t u = 0; u < AL.units.size(); u++) {
    std::vector<float> host((size_t)AL.units[u].numel);
    load_adapter_unit(init, AL, (int)u, host.data());
    adapter.set_unit((int)u, host.data());
  }
  LoraAdapters hook(cfg, lora, AL, *be, adapter, 1, T);
  model.set_adapters(&hook);

  const int W = comm.size(), r = comm.rank();
  Outcome out;
  out.reduce_bytes = 8.0;
  for (size_t u = 0; u < L.units.size(); u++) {  // each rank sends all but its own shard
    const int64_t padded = (L.units[u].numel + W - 1) / W * W;
    out.reduce_bytes += 4.0 * (double)(padded - padded / W);
  }
  std::vector<MicroBatch> micro;
  for (int b = r; b < B; b += W) micro.push_back({ids.data() + (size_t)b * T, targets.data() + (size_t)b * T, T, b});
  StepScalars scalars(*be);
  StepSettings s;
  s.lr = kLr;
  s.max_grad_norm = 0.0;
  for (int step = 0; step < kSteps; step++) {
    s.step = step;
    const double before = base.comm_bytes();
    StepResult res = frozen ? train_step(model, base, comm, *data, scalars, micro, s, &adapter)
                            : train_step(model, base, comm, *data, scalars, micro, s);
    out.losses.push_back(res.loss);
    if (step == 0) out.base_bytes = base.comm_bytes() - before;
    if (step == 0) out.step1_bytes = base.comm_bytes() + adapter.comm_bytes() + data->stats().total();
    if (step == 0 && W == 1)
      for (size_t u = 0; u < AL.units.size(); u++) {
        out.grads.emplace_back((size_t)AL.units[u].numel);
        if (AL.units[u].numel) be->copy_to_host(out.grads.back().data(), adapter.shard_state((int)u).grad.data,
                                                (size_t)AL.units[u].numel * 4);
      }
    if (!frozen) break;
  }
  out.micro_batches = (int)micro.size();
  out.persistent = (double)(base.persistent_bytes() + adapter.persistent_bytes());
  out.peak_gathered = (double)(base.peak_gathered_bytes() + adapter.peak_gathered_bytes());
  for (size_t u = 0; u < AL.units.size(); u++) {
    out.adapter.emplace_back((size_t)AL.units[u].numel);
    if (AL.units[u].numel) adapter.get_unit((int)u, out.adapter.back().data());
  }
  return out;
}

void check_case(const std::string& name, const std::string& base_name) {
  SCOPED_TRACE(name);
  const int r = g_world->rank();
  std::unique_ptr<ControlComm> self = g_world->split(r, 0);
  const Outcome want = run_case(name, base_name, *self, Strategy::full_shard);
  const bool margins = std::getenv("LLMT_TEST_MARGINS") && r == 0;
  // hybrid_shard with a shard group of one rank (local size 1): both stores replicated, the adapter's
  // gradients all-reduced over the replicas, the frozen base's not at all
  for (Strategy s : {Strategy::full_shard, Strategy::shard_grad_op, Strategy::hybrid_shard}) {
    const std::string what = std::string("adapter ") + strategy_name(s);
    const Outcome got = run_case(name, base_name, *g_world, s, true,
                                 s == Strategy::hybrid_shard ? Strategy::hybrid_shard : Strategy::full_shard);
    for (int i = 0; i < kSteps; i++) {
      EXPECT_NEAR(got.losses[(size_t)i], want.losses[(size_t)i], tol::kF32Loss * std::fabs(want.losses[(size_t)i]))
          << what << " step " << i + 1;
      if (margins)
        std::printf("margin %s %s loss %d %.3g of %.3g\n", name.c_str(), what.c_str(), i + 1,
                    std::fabs(got.losses[(size_t)i] / want.losses[(size_t)i] - 1), tol::kF32Loss);
    }
    for (size_t u = 0; u < want.adapter.size(); u++) {
      double ratio = 0.0;
      EXPECT_EQ(tol::check_adam_params(got.adapter[u].data(), want.adapter[u].data(), want.grads[u].data(),
                                       (int64_t)want.adapter[u].size(), tol::kF32ReorderGrad, kLr, kSteps,
                                       tol::kUnitF32, &ratio),
                "")
          << what << " adapter unit " << u;
      if (margins) std::printf("margin %s %s unit %zu %.3g of its bound\n", name.c_str(), what.c_str(), u, ratio);
    }
  }
  if (g_world->size() > 1) {  // the frozen base's collectives: gathers only
    const Outcome frozen = run_case(name, base_name, *g_world, Strategy::full_shard, true);
    const Outcome trained = run_case(name, base_name, *g_world, Strategy::full_shard, false);
    EXPECT_GT(frozen.base_bytes, 0.0);
    EXPECT_DOUBLE_EQ(frozen.base_bytes, trained.base_bytes - frozen.reduce_bytes)
        << "frozen " << frozen.base_bytes << " bytes, trainable " << trained.base_bytes << ", its reduce-scatters "
        << frozen.reduce_bytes;
  }
}

// llmt plan under --use_peft: the frozen base's gathers and the adapter's collectives are the bytes
// step 1 sends, both stores' shards its persistent bytes, and the two stores' gathered peaks stay
// within its bound.
void check_plan(const std::string& name, const std::string& base_name) {
  SCOPED_TRACE(name);
  const Outcome got = run_case(name, base_name, *g_world, Strategy::full_shard);
  const std::string dir = llmt_test::reference_dir() + "/lora/" + name;
  const ModelConfig cfg = config_from_json_file(llmt_test::reference_dir() + "/" + base_name + "/config.json");
  PlanArgs pa;
  pa.world = pa.ranks_per_node = g_world->size();
  pa.fsdp = "full_shard";
  pa.batch = 1;
  SafetensorsFile ref(dir + "/reference.safetensors");
  pa.seq_len = (int)ref.find("input_ids")->shape[1];
  pa.accum = got.micro_batches;
  pa.lora = read_adapter_config(dir + "/adapter_init/adapter_config.json");
  const Plan plan = plan_run(cfg, pa);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  EXPECT_NEAR(got.step1_bytes, plan.comm_total_bytes, 1e-9 * plan.comm_total_bytes + 1e-6);
  EXPECT_NEAR(got.persistent, plan.persistent_gib * gib, 1e-9 * got.persistent);
  EXPECT_LE(got.peak_gathered, plan.gathered_peak_gib * gib * (1 + 1e-9));
  EXPECT_GT(plan.adapter_params, 0);
}

}  // namespace

TEST(LoraEquivalence, PlanCountsTheFrozenBaseAndTheAdapter) {
  check_plan("gpt2_c_attn_c_proj", "gpt2_tiny");
  check_plan("qwen2_all_linear_lm_head", "qwen2_tiny");
}
TEST(LoraEquivalence, Gpt2ShardedEqualsOneProcess) { check_case("gpt2_c_attn_c_proj", "gpt2_tiny"); }
TEST(LoraEquivalence, Qwen2LmHeadShardedEqualsOneProcess) { check_case("qwen2_all_linear_lm_head", "qwen2_tiny"); }
TEST(LoraEquivalence, TiedEmbedTokensShardedEqualsOneProcess) {
  check_case("llama_tied_q_v_embed_tokens", "llama_tied_tiny");
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<ControlComm> world;
  init_launch(&argc, &argv, &world);
  g_world = world.get();
  int rc = RUN_ALL_TESTS();
  double failed = world->all_reduce_sum(rc != 0 ? 1.0 : 0.0);  // a failure on any rank fails every rank
  world.reset();
  finalize_launch();
  return failed > 0 ? 1 : 0;
}
