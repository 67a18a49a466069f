// GPT-2 and LLaMA against Hugging Face transformers: logits, loss, every gradient and the
// parameters after 3 AdamW steps, from fixtures made by tests/reference/make_fixtures.py.
#include <gtest/gtest.h>

#include <vector>

#include "engine/ckpt/safetensors.h"
#include "engine/dist/communicator.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"

using namespace llmt;
using llmt_test::rel_error;

namespace {

namespace tol = llmt_test::tol;
const float kLr = 1e-2f;  // the fixture's AdamW: lr 1e-2, weight decay 0.1, 3 steps
const int kSteps = 3;

std::vector<float> read_all(const SafetensorsFile& f, const std::string& name) {
  const StTensor* t = f.find(name);
  EXPECT_TRUE(t) << "fixture lacks " << name;
  if (!t) return {};
  std::vector<float> v((size_t)t->numel());
  f.read_f32(*t, v.data());
  return v;
}

std::vector<int32_t> read_ids(const SafetensorsFile& f, const std::string& name) {
  const StTensor* t = f.find(name);
  EXPECT_TRUE(t && t->dtype == "I32");
  std::vector<int32_t> v((size_t)t->numel());
  std::memcpy(v.data(), f.data(*t), v.size() * 4);
  return v;
}

// A unit's tensor in Hugging Face layout (transposed back for Conv1D weights).
std::vector<float> hf_view(const float* unit, const ParamSpec& p) {
  std::vector<float> out((size_t)p.numel());
  if (!p.hf_transposed) {
    std::copy(unit + p.offset, unit + p.offset + p.numel(), out.begin());
  } else {
    int64_t rows = p.shape[0], cols = p.shape[1];
    for (int64_t r = 0; r < rows; r++)
      for (int64_t c = 0; c < cols; c++) out[(size_t)(c * rows + r)] = unit[p.offset + r * cols + c];
  }
  return out;
}

void check_model(const std::string& name) {
  std::string dir = llmt_test::reference_dir() + "/" + name;
  ModelConfig cfg = config_from_json_file(dir + "/config.json");
  SafetensorsFile ref(dir + "/reference.safetensors");
  std::vector<int32_t> ids = read_ids(ref, "input_ids"), labels = read_ids(ref, "labels");
  const StTensor* ids_t = ref.find("input_ids");
  const int B = (int)ids_t->shape[0], T = (int)ids_t->shape[1];

  // Hugging Face shifts labels inside the model: position t predicts labels[t + 1].
  std::vector<int32_t> targets(ids.size(), kIgnoreIndex);
  int n_valid = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t + 1 < T; t++) {
      targets[b * T + t] = labels[b * T + t + 1];
      n_valid += targets[b * T + t] != kIgnoreIndex;
    }

  // one process, unsharded: the trainer's store with a shard group of one
  auto be = make_cpu_backend(2);
  Transformer model(cfg, *be, B, T);
  const ModelLayout& L = model.layout();
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  FsdpStore store(*be, L, Strategy::no_shard, *solo, 1);
  SafetensorsCheckpoint ckpt(dir);
  check_hf_tensors(ckpt, cfg, L, dir);
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> host((size_t)L.units[u].numel);
    load_hf_unit(ckpt, cfg, L, (int)u, host.data());
    store.set_unit((int)u, host.data());
  }
  BackendBuffer loss(*be, DType::f64, {1});
  auto loss_mean = [&] {  // the loss sum so far over the counted tokens, then reset
    double s = 0.0;
    be->copy_to_host(&s, loss.tensor().data, sizeof(s));
    be->zero(loss.tensor().data, sizeof(s));
    return s / n_valid;
  };
  TrainPass pass;
  pass.grad_scale = 1.0f / n_valid;

  // forward: logits and loss
  model.forward(store, ids.data(), targets.data(), 0, loss.tensor());
  std::vector<float> ref_logits = read_all(ref, "logits");
  Tensor lg = model.logits();
  EXPECT_LT(rel_error(lg.f32(), ref_logits.data(), lg.numel()), tol::kF32Logits) << name << " logits";
  float ref_loss = read_all(ref, "loss")[0];
  EXPECT_NEAR(loss_mean(), ref_loss, tol::kF32Loss * std::fabs(ref_loss)) << name << " loss";

  // backward: every parameter's gradient
  store.zero_grads();
  model.forward(store, ids.data(), targets.data(), 0, loss.tensor(), &pass);
  model.backward(store);
  loss_mean();
  int checked = 0;
  for (size_t u = 0; u < L.units.size(); u++) {
    const float* grad = store.shard_state((int)u).grad.f32();  // the whole unit: one shard
    for (const ParamSpec& p : L.units[u].params) {
      std::vector<float> g = hf_view(grad, p), want = read_all(ref, "grad." + p.hf_name);
      ASSERT_EQ(g.size(), want.size()) << p.hf_name;
      EXPECT_LT(rel_error(g.data(), want.data(), p.numel()), tol::kF32Grad) << name << " grad of " << p.hf_name;
      checked++;
    }
  }
  // the fixture holds input_ids, labels, logits, loss, losses, and grad. and step3. per parameter
  EXPECT_EQ((size_t)(5 + 2 * checked), ref.tensors().size()) << "every fixture gradient compared";

  // 3 AdamW steps on the same batch, lr 1e-2, weight decay 0.1 except biases and norm weights
  std::vector<float> losses = read_all(ref, "losses");
  AdamWConfig oc;
  oc.weight_decay = 0.1f;
  for (int step = 0; step < kSteps; step++) {
    store.zero_grads();
    model.forward(store, ids.data(), targets.data(), 0, loss.tensor(), &pass);
    EXPECT_NEAR(loss_mean(), losses[step], tol::kF32Loss * std::fabs(losses[step])) << name << " loss before step " << step;
    model.backward(store);
    store.optimizer_step(kLr, oc, 1.0f);
  }
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> unit((size_t)L.units[u].numel);
    store.get_unit((int)u, unit.data());
    for (const ParamSpec& p : L.units[u].params) {
      std::vector<float> w = hf_view(unit.data(), p), want = read_all(ref, "step3." + p.hf_name);
      std::vector<float> g0 = read_all(ref, "grad." + p.hf_name);
      double ratio = 0.0;
      std::string bad = tol::check_adam_params(w.data(), want.data(), g0.data(), p.numel(), tol::kF32Grad, kLr, kSteps,
                                               tol::kUnitF32, &ratio);
      EXPECT_EQ(bad, "") << name << " after " << kSteps << " steps: " << p.hf_name;
      if (std::getenv("LLMT_TEST_MARGINS")) std::printf("margin %s %s %.3g\n", name.c_str(), p.hf_name.c_str(), ratio);
    }
  }
}

}  // namespace

TEST(HfReference, Gpt2Tiny) { check_model("gpt2_tiny"); }
TEST(HfReference, LlamaTinyGqa) { check_model("llama_tiny"); }
TEST(HfReference, LlamaTiedTiny) { check_model("llama_tied_tiny"); }
