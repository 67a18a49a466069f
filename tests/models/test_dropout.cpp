// Dropout at the model level: backward differentiates the forward that ran, masks and all (finite
// differences with the masks held fixed), evaluation applies none, and the masks follow the step.
// Mask statistics and the split-independence of masks are tests/kernels/test_ops.cpp's; the same
// losses and weights at 1-4 ranks with dropout are tests/mpi/fsdp_equivalence.cpp's; bitwise resume
// with dropout is tests/mpi/ckpt_resume.cpp's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/transformer.h"
#include "tests/mpi/tiny_models.h"

using namespace llmt;

namespace {

const int kB = 3, kT = 8;

// A tiny model with dropout p everywhere transformers applies it, unsharded in one process.
struct Fixture {
  ModelConfig cfg;
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::unique_ptr<Transformer> model;
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  std::unique_ptr<FsdpStore> store;
  std::vector<std::vector<float>> units;  // the initial parameters, host
  std::vector<int32_t> tokens, targets;
  int counted = 0;

  Fixture(Arch arch, float p) : cfg(tiny_model(arch)) {
    cfg.attn_pdrop = p;
    if (arch == Arch::gpt2) cfg.embd_pdrop = cfg.resid_pdrop = p;
    model = std::make_unique<Transformer>(cfg, *be, kB, kT);
    store = std::make_unique<FsdpStore>(*be, model->layout(), Strategy::no_shard, *solo, 1);
    const ModelLayout& L = model->layout();
    for (size_t u = 0; u < L.units.size(); u++) {
      units.emplace_back((size_t)L.units[u].numel);
      init_unit_params(cfg, L.units[u], (int)u, 3, units.back().data());
      store->set_unit((int)u, units.back().data());
    }
    tiny_global_batch(0, kB, kT, tokens, targets);
    for (int32_t t : targets) counted += t != kIgnoreIndex;
  }
  // The mean loss of a forward pass; `pass` (training) applies its dropout masks, none evaluates.
  double loss(const TrainPass* pass) {
    BackendBuffer sum(*be, DType::f64, {1});
    model->forward(*store, tokens.data(), targets.data(), kT, sum.tensor(), pass);
    double s = 0.0;
    be->copy_to_host(&s, sum.tensor().data, sizeof(s));
    return s / counted;
  }
  TrainPass pass(int64_t step) const {
    TrainPass p;
    p.grad_scale = 1.0f / counted;
    p.dropout = {1234, step, 5};
    return p;
  }
};

void check_gradients(Arch arch) {
  Fixture f(arch, 0.2f);
  TrainPass pass = f.pass(7);
  f.store->zero_grads();
  f.loss(&pass);
  f.model->backward(*f.store);
  const ModelLayout& L = f.model->layout();
  int checked = 0;
  for (size_t u = 0; u < L.units.size(); u++) {
    std::vector<float> grad((size_t)L.units[u].numel);
    f.be->copy_to_host(grad.data(), f.store->shard_state((int)u).grad.data, grad.size() * sizeof(float));
    for (const ParamSpec& p : L.units[u].params) {
      // the three elements with the largest gradients: the signal stands well above fp32's noise
      std::vector<int64_t> idx((size_t)p.numel());
      for (int64_t i = 0; i < p.numel(); i++) idx[(size_t)i] = p.offset + i;
      std::partial_sort(idx.begin(), idx.begin() + std::min<int64_t>(3, p.numel()), idx.end(),
                        [&](int64_t a, int64_t b) { return std::fabs(grad[(size_t)a]) > std::fabs(grad[(size_t)b]); });
      for (int k = 0; k < std::min<int64_t>(3, p.numel()); k++) {
        const int64_t i = idx[(size_t)k];
        const float w = f.units[u][(size_t)i], eps = 1e-3f;
        std::vector<float> unit = f.units[u];
        unit[(size_t)i] = w + eps;
        f.store->set_unit((int)u, unit.data());
        double up = f.loss(&pass);
        unit[(size_t)i] = w - eps;
        f.store->set_unit((int)u, unit.data());
        double down = f.loss(&pass);
        f.store->set_unit((int)u, f.units[u].data());
        double fd = (up - down) / (2.0 * eps), g = grad[(size_t)i];
        // fp32 losses carry ~5e-7 of noise: ~3e-4 after dividing by 2 eps
        EXPECT_NEAR(g, fd, 0.02 * std::fabs(fd) + 5e-4) << p.hf_name << " element " << i - p.offset;
        checked++;
      }
    }
  }
  EXPECT_GT(checked, 30);
}

}  // namespace

TEST(ModelDropout, Gpt2GradientsMatchFiniteDifferencesWithTheMasksFixed) { check_gradients(Arch::gpt2); }
TEST(ModelDropout, LlamaGradientsMatchFiniteDifferencesWithTheMasksFixed) { check_gradients(Arch::llama); }

TEST(ModelDropout, EvaluationAppliesNoneAndTrainingDoes) {
  for (Arch arch : {Arch::gpt2, Arch::llama}) {
    Fixture with(arch, 0.3f), without(arch, 0.0f);
    EXPECT_EQ(with.loss(nullptr), without.loss(nullptr)) << "evaluation must not drop anything";
    TrainPass p = with.pass(0);
    const double train_loss = with.loss(&p), eval_loss = with.loss(nullptr);
    EXPECT_GT(std::fabs(train_loss - eval_loss), 1e-4) << "a training pass with p = 0.3 must differ";
    TrainPass q = without.pass(0);
    EXPECT_EQ(without.loss(&q), eval_loss) << "p = 0: a training pass equals evaluation";
    // the same step draws the same masks; the next step others
    TrainPass again = with.pass(0), next = with.pass(1);
    EXPECT_EQ(with.loss(&again), train_loss);
    EXPECT_NE(with.loss(&next), train_loss);
  }
}
