// A transformers fixture of tests/reference/<name>/ (made by tests/reference/make_fixtures.py): the
// config, the batch as llmt's shifted targets, the reference tensors, and the limits to hold them
// to. Shared by the single-process comparison (tests/models/test_hf_reference.cpp) and the sharded
// one (tests/mpi/fsdp_equivalence.cpp).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "engine/formats/safetensors.h"
#include "models/config.h"
#include "models/layout.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"

namespace llmt_test {

constexpr float kFixtureLr = 1e-2f;  // the fixture's AdamW: lr 1e-2, weight decay 0.1, 3 steps
constexpr float kFixtureWeightDecay = 0.1f;
constexpr int kFixtureSteps = 3;

inline std::vector<float> read_all(const llmt::SafetensorsFile& f, const std::string& name) {
  const llmt::StTensor* t = f.find(name);
  EXPECT_TRUE(t) << "fixture lacks " << name;
  if (!t) return {};
  std::vector<float> v((size_t)t->numel());
  f.read_f32(*t, v.data());
  return v;
}

inline std::vector<int32_t> read_ids(const llmt::SafetensorsFile& f, const std::string& name) {
  const llmt::StTensor* t = f.find(name);
  EXPECT_TRUE(t && t->dtype == "I32");
  if (!t) return {};
  std::vector<int32_t> v((size_t)t->numel());
  std::memcpy(v.data(), f.data(*t), v.size() * 4);
  return v;
}

// A unit's tensor in Hugging Face layout (transposed back for Conv1D weights).
inline std::vector<float> hf_view(const float* unit, const llmt::ParamSpec& p) {
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

// The limits for one precision: fp32 against fp32, or bf16 against bf16 autocast.
struct Limits {
  double logits, loss, grad;
  double unit;  // for the weights' rounding in the Adam bound
};
inline Limits limits_for(llmt::DType t) {
  if (t == llmt::DType::f32) return {tol::kF32Logits, tol::kF32Loss, tol::kF32Grad, tol::kUnitF32};
  return {tol::kBf16ModelLogits, tol::kBf16ModelLoss, tol::kBf16ModelGrad, tol::kUnitF32};
}

// The fixture's batch: input_ids [B, T] and, since Hugging Face shifts labels inside the model
// (position t predicts labels[t + 1]), llmt's targets; n_valid counts the targets not ignored.
struct HfBatch {
  int B = 0, T = 0, n_valid = 0;
  std::vector<int32_t> ids, targets;
};
inline HfBatch read_hf_batch(const llmt::SafetensorsFile& ref32) {
  HfBatch b;
  b.ids = read_ids(ref32, "input_ids");
  const std::vector<int32_t> labels = read_ids(ref32, "labels");
  const llmt::StTensor* t = ref32.find("input_ids");
  if (!t) return b;
  b.B = (int)t->shape[0], b.T = (int)t->shape[1];
  b.targets.assign(b.ids.size(), llmt::kIgnoreIndex);
  for (int s = 0; s < b.B; s++)
    for (int i = 0; i + 1 < b.T; i++) {
      b.targets[(size_t)(s * b.T + i)] = labels[(size_t)(s * b.T + i + 1)];
      b.n_valid += b.targets[(size_t)(s * b.T + i)] != llmt::kIgnoreIndex;
    }
  return b;
}

}  // namespace llmt_test
