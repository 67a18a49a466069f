// LoRA (models/lora.h): one adapted projection's forward and backward on the CPU backend against a
// double-precision reference and central differences; PEFT's target matching; PEFT's adapter files of
// tests/reference/lora (make_lora_fixtures.py) read back, refused where llmt cannot train them, and
// written again byte for byte; the final adapters merged into their base models give PEFT's logits.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "engine/formats/safetensors.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/hf_checkpoint.h"
#include "models/lora.h"
#include "models/transformer.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"

using namespace llmt;
using llmt_test::rel_error;
namespace tol = llmt_test::tol;

namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A host vector as a backend tensor in dtype t (bf16 rounded), and back.
struct Dev {
  Backend& be;
  std::vector<std::unique_ptr<BackendBuffer>> bufs;
  Tensor put(const std::vector<float>& v, DType t) {
    bufs.push_back(std::make_unique<BackendBuffer>(be, t, std::vector<int64_t>{(int64_t)v.size()}));
    const Tensor& d = bufs.back()->tensor();
    if (t == DType::f32) {
      be.copy_from_host(d.data, v.data(), v.size() * 4);
    } else {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); i++) h[i] = f32_to_bf16(v[i]);
      be.copy_from_host(d.data, h.data(), h.size() * 2);
    }
    return d;
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<float> out((size_t)t.numel());
    if (t.dtype == DType::f32) {
      be.copy_to_host(out.data(), t.data, t.nbytes());
    } else {
      std::vector<uint16_t> h((size_t)t.numel());
      be.copy_to_host(h.data(), t.data, t.nbytes());
      for (size_t i = 0; i < h.size(); i++) out[i] = bf16_to_f32(h[i]);
    }
    return out;
  }
};
std::vector<float> rounded(std::vector<float> v, DType t) {
  if (t == DType::bf16)
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

// The adapted projection in double: y[n, row0 + o] += s * sum_j B[o, j] sum_i A[j, i] xd[n, i], where
// xd = x * mask (mask: 0 or 1/(1-p) per element, all ones without dropout).
struct Ref {
  int64_t N, rows, row0, out, in, r;
  double s;
  std::vector<double> x, A, B, mask;
  std::vector<double> forward(const std::vector<double>& y0) const {
    std::vector<double> y = y0;
    for (int64_t n = 0; n < N; n++)
      for (int64_t o = 0; o < out; o++) {
        double acc = 0;
        for (int64_t j = 0; j < r; j++) {
          double h = 0;
          for (int64_t i = 0; i < in; i++) h += A[j * in + i] * x[n * in + i] * mask[n * in + i];
          acc += B[o * r + j] * h;
        }
        y[n * rows + row0 + o] += s * acc;
      }
    return y;
  }
  // the loss sum(y * dy): its gradients in A, B and x
  void backward(const std::vector<double>& dy, std::vector<double>& dA, std::vector<double>& dB,
                std::vector<double>& dx) const {
    dA.assign(A.size(), 0), dB.assign(B.size(), 0), dx.assign(x.size(), 0);
    for (int64_t n = 0; n < N; n++)
      for (int64_t j = 0; j < r; j++) {
        double h = 0, g = 0;  // h = (xd A^T)[n, j]; g = (dy_p B)[n, j]
        for (int64_t i = 0; i < in; i++) h += A[j * in + i] * x[n * in + i] * mask[n * in + i];
        for (int64_t o = 0; o < out; o++) g += dy[n * rows + row0 + o] * B[o * r + j];
        for (int64_t o = 0; o < out; o++) dB[o * r + j] += s * dy[n * rows + row0 + o] * h;
        for (int64_t i = 0; i < in; i++) {
          dA[j * in + i] += s * g * x[n * in + i] * mask[n * in + i];
          dx[n * in + i] += s * g * A[j * in + i] * mask[n * in + i];
        }
      }
  }
};
std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Forward and backward of one adapted projection (rows [3, 7) of a fused 10-row matrix, r 3) against Ref,
// with dropout's mask taken from the backend's own dropout op.
void check_projection(DType dt, float p_drop) {
  auto be = make_cpu_backend(2, dt);
  Dev dev{*be, {}};
  const int Bsz = 2, T = 3;
  const int64_t N = Bsz * T, rows = 10, row0 = 3, out = 4, in = 7, r = 3;
  const float s = 1.7f;
  Projection p{"self_attn.k_proj", BlockMatrix::qkv, row0, out, in, rows, false};
  std::vector<float> x = rounded(randn(N * in, 1), dt), A = rounded(randn(r * in, 2, 0.4f), dt),
                     B = rounded(randn(out * r, 3, 0.4f), dt), y0 = rounded(randn(N * rows, 4), dt),
                     dy = rounded(randn(N * rows, 5), dt), dA0 = randn(r * in, 6), dB0 = randn(out * r, 7),
                     dx0 = rounded(randn(N * in, 8), dt);
  LoraDropout drop;
  std::vector<float> mask(N * in, 1.0f);
  if (p_drop > 0) {
    drop.d.p = p_drop, drop.d.key = 12345, drop.d.row0 = 7, drop.B = Bsz, drop.T = T;
    Tensor ones = dev.put(std::vector<float>(N * in, 1.0f), dt);
    be->dropout(ones, Bsz, T, (int)in, drop.d);
    mask = dev.get(ones);
  }
  Tensor tx = dev.put(x, dt), tA = dev.put(A, dt), tB = dev.put(B, dt), ty = dev.put(y0, dt), tdy = dev.put(dy, dt);
  Tensor tdA = dev.put(dA0, DType::f32), tdB = dev.put(dB0, DType::f32), tdx = dev.put(dx0, dt);
  LoraActs acts{dev.put(std::vector<float>(N * r), dt), dev.put(std::vector<float>(N * r), dt),
                p_drop > 0 ? dev.put(std::vector<float>(N * in), dt) : Tensor()};
  lora_forward(*be, p, (int)r, s, ty, tx, tA, tB, acts, N, drop);
  lora_backward(*be, p, (int)r, s, tdy, tx, tA, tB, tdA, tdB, tdx, acts, N, drop);

  Ref ref{N, rows, row0, out, in, r, s, to_double(x), to_double(A), to_double(B), to_double(mask)};
  std::vector<double> y = ref.forward(to_double(y0)), dA, dB, dx;
  ref.backward(to_double(dy), dA, dB, dx);
  for (size_t i = 0; i < dA.size(); i++) dA[i] += dA0[i];
  for (size_t i = 0; i < dB.size(); i++) dB[i] += dB0[i];
  for (size_t i = 0; i < dx.size(); i++) dx[i] += dx0[i];
  auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const double fwd = dt == DType::f32 ? tol::kF32OpForward : tol::kBf16OpForward;
  const double bwd = dt == DType::f32 ? tol::kF32OpForward : tol::kBf16OpBackward;  // products only, no FD here
  std::vector<float> got_y = dev.get(ty), want_y = f(y);
  EXPECT_LT(rel_error(got_y.data(), want_y.data(), (int64_t)y.size()), fwd) << "y";
  for (int64_t n = 0; n < N; n++)  // columns outside [row0, row0 + out) untouched, bit for bit
    for (int64_t c = 0; c < rows; c++)
      if (c < row0 || c >= row0 + out) {
        ASSERT_EQ(got_y[n * rows + c], y0[n * rows + c]) << n << "," << c;
      }
  auto expect_close = [&](const Tensor& got, const std::vector<double>& want, const char* what) {
    std::vector<float> g = dev.get(got);
    EXPECT_LT(rel_error(g.data(), f(want).data(), (int64_t)want.size()), bwd) << what;
  };
  expect_close(tdA, dA, "dA");
  expect_close(tdB, dB, "dB");
  expect_close(tdx, dx, "dx");
  std::vector<float> dy_after = dev.get(tdy);
  EXPECT_EQ(dy_after, dy) << "dy is read only";
}

}  // namespace

TEST(Lora, ProjectionMatchesDoubleReference) { check_projection(DType::f32, 0.0f); }
TEST(Lora, ProjectionWithDropoutMatchesDoubleReference) { check_projection(DType::f32, 0.3f); }
TEST(Lora, ProjectionBf16MatchesDoubleReference) { check_projection(DType::bf16, 0.0f); }

// The reference's gradients against central differences of its own forward (the loss sum(y * dy)), so
// the backend's backward above is checked against the derivative, not only against a formula.
TEST(Lora, ReferenceGradientsMatchCentralDifferences) {
  const int64_t N = 4, rows = 9, row0 = 2, out = 5, in = 6, r = 2;
  auto mask = to_double(randn(N * in, 9));
  for (auto& m : mask) m = m > 0 ? 1.0 / 0.7 : 0.0;
  Ref ref{N, rows, row0, out, in, r, 2.5, to_double(randn(N * in, 1)), to_double(randn(r * in, 2)),
          to_double(randn(out * r, 3)), mask};
  const std::vector<double> dy = to_double(randn(N * rows, 4)), y0(N * rows, 0.0);
  std::vector<double> dA, dB, dx;
  ref.backward(dy, dA, dB, dx);
  auto loss = [&] {
    std::vector<double> y = ref.forward(y0);
    double l = 0;
    for (size_t i = 0; i < y.size(); i++) l += y[i] * dy[i];
    return l;
  };
  const double eps = 1e-5;
  double worst = 0;
  auto fd = [&](std::vector<double>& v, const std::vector<double>& grad) {
    for (size_t i = 0; i < v.size(); i++) {
      double keep = v[i];
      v[i] = keep + eps;
      double lp = loss();
      v[i] = keep - eps;
      double lm = loss();
      v[i] = keep;
      worst = std::max(worst, std::fabs((lp - lm) / (2 * eps) - grad[i]) / (1.0 + std::fabs(grad[i])));
    }
  };
  fd(ref.A, dA), fd(ref.B, dB), fd(ref.x, dx);
  EXPECT_LT(worst, 1e-7);
}

TEST(Lora, TargetsMatchAsPeftMatches) {
  ModelConfig gpt2 = config_from_json_file(llmt_test::reference_dir() + "/gpt2_tiny/config.json");
  ModelConfig llama = config_from_json_file(llmt_test::reference_dir() + "/llama_tiny/config.json");
  auto modules = [](const ModelConfig& m, LoraConfig c) {
    std::vector<std::string> v;
    for (auto& s : make_lora_layout(m, c).slots) v.push_back(s.proj.module);
    return v;
  };
  LoraConfig c;
  c.target_modules = {"c_proj"};  // PEFT: the path's tail after a dot, so attention's and the MLP's
  EXPECT_EQ(modules(gpt2, c), (std::vector<std::string>{"attn.c_proj", "mlp.c_proj"}));
  c.target_modules = {"mlp.c_proj"};
  EXPECT_EQ(modules(gpt2, c), (std::vector<std::string>{"mlp.c_proj"}));
  c.target_modules = {"all-linear"};
  EXPECT_EQ(modules(gpt2, c), (std::vector<std::string>{"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}));
  EXPECT_EQ(modules(llama, c).size(), 7u);
  c.target_modules = {"q_proj", "v_proj"};
  EXPECT_EQ(modules(llama, c), (std::vector<std::string>{"self_attn.q_proj", "self_attn.v_proj"}));
  c.target_modules = {"model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj"};  // all-linear as PEFT saves it
  EXPECT_EQ(modules(llama, c), (std::vector<std::string>{"mlp.up_proj"}));
  c.target_modules.clear();
  c.target_regex = R"(.*\.(q|k)_proj)";  // a string: re.fullmatch on the whole path
  EXPECT_EQ(modules(llama, c), (std::vector<std::string>{"self_attn.q_proj", "self_attn.k_proj"}));
  c.target_regex = "q_proj";  // does not match "model.layers.0.self_attn.q_proj" in full
  llmt_test::expect_error([&] { make_lora_layout(llama, c); }, {"q_proj", "matches no projection"});
  c.target_regex = ".*(q_proj|v_proj|lm_head)";  // PEFT would adapt the head too: refused, not cut down
  llmt_test::expect_error([&] { make_lora_layout(llama, c); }, {"also matches lm_head", "--lora_modules_to_save"});
  c.target_regex = ".*(embed_tokens|q_proj)";
  llmt_test::expect_error([&] { make_lora_layout(llama, c); }, {"also matches model.embed_tokens"});

  // where each projection sits in llmt's fused matrices
  c.target_regex.clear();
  c.target_modules = {"all-linear"};
  LoraLayout L = make_lora_layout(llama, c);
  const int64_t C = 32, q = 32, kv = 16, F = 56;
  ASSERT_TRUE(L.slot(BlockMatrix::qkv, q + kv));
  EXPECT_EQ(L.slot(BlockMatrix::qkv, q + kv)->proj.module, "self_attn.v_proj");
  EXPECT_EQ(L.slot(BlockMatrix::qkv, q + kv)->proj.out, kv);
  EXPECT_EQ(L.slot(BlockMatrix::qkv, q)->proj.rows, q + 2 * kv);
  EXPECT_EQ(L.slot(BlockMatrix::mlp_in, F)->proj.module, "mlp.up_proj");
  EXPECT_EQ(L.slot(BlockMatrix::mlp_out, 0)->proj.in, F);
  EXPECT_EQ(L.units.size(), 3u);  // root (no modules_to_save: empty) and one per block
  EXPECT_EQ(L.units[1].params[0].hf_name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(L.units[1].params[0].shape, (std::vector<int64_t>{16, C}));

  c.target_modules = {"lm_head"};
  llmt_test::expect_error([&] { make_lora_layout(llama, c); }, {"lm_head matches no projection", "modules_to_save"});
  c.target_modules = {"model.layers.0.self_attn.q_proj"};  // one block only: layers_to_transform's effect
  llmt_test::expect_error([&] { make_lora_layout(llama, c); }, {"self_attn.q_proj in 1 of 2 blocks"});
  c.target_modules = {"q_proj"};
  c.modules_to_save = {"norm"};
  llmt_test::expect_error([&] { make_lora_layout(llama, c); }, {"--lora_modules_to_save: norm"});
  c.modules_to_save = {"lm_head", "embed_tokens"};
  L = make_lora_layout(llama, c);
  ASSERT_EQ(L.saved.size(), 2u);
  EXPECT_EQ(L.units[0].params[1].hf_name, "base_model.model.model.embed_tokens.weight");
  c.r = 0;
  llmt_test::expect_error([&] { make_lora_layout(llama, c); }, {"--lora_r"});
  LoraConfig rs;
  rs.r = 16, rs.alpha = 32, rs.rslora = true;
  EXPECT_DOUBLE_EQ(rs.scaling(), 8.0);
  rs.rslora = false;
  EXPECT_DOUBLE_EQ(rs.scaling(), 2.0);
}

namespace {
struct Case {
  std::string name, base;
  size_t tensors;  // in adapter_model.safetensors
  double scaling;
  bool conv1d;
};
const Case kCases[] = {{"gpt2_c_attn_c_proj", "gpt2_tiny", 12, 2.0, true},
                       {"llama_q_v", "llama_tiny", 8, 2.0, false},
                       {"llama_all_linear_rslora", "llama_tiny", 28, 4.0, false},
                       {"qwen2_all_linear_lm_head", "qwen2_tiny", 29, 2.0, false},
                       {"llama_q_v_embed_tokens", "llama_tiny", 9, 2.0, false},
                       {"llama_tied_q_v_embed_tokens", "llama_tied_tiny", 9, 2.0, false}};
std::string case_dir(const Case& c) { return llmt_test::reference_dir() + "/lora/" + c.name; }
std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

// PEFT's files read back: the config's fields, every key and shape the layout expects (and no other),
// and the adapter written again by llmt equal to PEFT's file byte for byte.
TEST(Lora, PeftAdapterFilesReadBackAndWriteAlike) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    ModelConfig cfg = config_from_json_file(llmt_test::reference_dir() + "/" + c.base + "/config.json");
    bool fifo = false;
    LoraConfig lora = read_adapter_config(case_dir(c) + "/adapter_init/adapter_config.json", &fifo);
    EXPECT_EQ(lora.r, 4);
    EXPECT_EQ(lora.alpha, 8.0);
    EXPECT_EQ(lora.dropout, 0.0);
    EXPECT_EQ(fifo, c.conv1d);
    EXPECT_EQ(lora.base_model_name_or_path, c.base);
    EXPECT_DOUBLE_EQ(lora.scaling(), c.scaling);
    LoraLayout L = make_lora_layout(cfg, lora);
    for (const char* which : {"/adapter_init", "/adapter_final"}) {
      SafetensorsFile f(case_dir(c) + which + "/adapter_model.safetensors");
      EXPECT_EQ(f.tensors().size(), c.tensors);
      check_adapter_tensors(f, L);
    }
    SafetensorsFile fin(case_dir(c) + "/adapter_final/adapter_model.safetensors");
    std::vector<std::vector<float>> units;
    std::vector<const float*> ptrs;
    for (size_t u = 0; u < L.units.size(); u++) {
      units.emplace_back((size_t)L.units[u].numel);
      load_adapter_unit(fin, L, (int)u, units.back().data());
    }
    for (auto& u : units) ptrs.push_back(u.data());
    llmt_test::TempDir tmp("lora_save");
    save_adapter(tmp.path + "/adapter", lora, L, ptrs);
    EXPECT_TRUE(read_bytes(tmp.path + "/adapter/adapter_model.safetensors") ==
                read_bytes(case_dir(c) + "/adapter_final/adapter_model.safetensors"))
        << "adapter_model.safetensors differs from PEFT's";
    // llmt's adapter_config.json reads back to the same adapter
    bool fifo2 = !fifo;
    LoraConfig back = read_adapter_config(tmp.path + "/adapter/adapter_config.json", &fifo2);
    EXPECT_EQ(fifo2, fifo);
    EXPECT_EQ(back.r, lora.r);
    EXPECT_EQ(back.alpha, lora.alpha);
    EXPECT_EQ(back.rslora, lora.rslora);
    EXPECT_EQ(back.target_modules, lora.target_modules);
    EXPECT_EQ(back.modules_to_save, lora.modules_to_save);
  }
}

TEST(Lora, AdapterConfigsLlmtCannotTrainAreRefusedByName) {
  const std::string src = read_bytes(case_dir(kCases[1]) + "/adapter_init/adapter_config.json");
  llmt_test::TempDir tmp("lora_cfg");
  auto with = [&](const std::string& key, const nlohmann::json& v) {
    nlohmann::json j = nlohmann::json::parse(src);
    j[key] = v;
    std::string path = tmp.path + "/adapter_config.json";
    std::ofstream(path) << j.dump();
    return path;
  };
  EXPECT_NO_THROW(read_adapter_config(with("some_future_option", nullptr)));  // unknown but unset: PEFT's default
  for (auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"use_dora", true},
           {"lora_bias", true},
           {"rank_pattern", {{"q_proj", 8}}},
           {"alpha_pattern", {{"q_proj", 8}}},
           {"layers_to_transform", {0}},
           {"exclude_modules", {"v_proj"}},
           {"layer_replication", {{0, 1}}},
           {"trainable_token_indices", {1, 2}},
           // tying a modules_to_save copy to its tied twin: llmt trains PEFT's default (the copy alone)
           {"ensure_weight_tying", true},
           {"some_future_option", 3}})
    llmt_test::expect_error([&] { read_adapter_config(with(key, value)); }, {key, "does not implement"});
  llmt_test::expect_error([&] { read_adapter_config(with("bias", "all")); }, {"bias", "\"none\""});
  llmt_test::expect_error([&] { read_adapter_config(with("peft_type", "IA3")); }, {"peft_type IA3", "LoRA"});
  llmt_test::expect_error([&] { read_adapter_config(with("task_type", "SEQ_CLS")); }, {"task_type", "CAUSAL_LM"});
  llmt_test::expect_error([&] { read_adapter_config(with("r", -2)); }, {"r must be a positive integer"});
  // initialisations that rewrite the base weights when PEFT loads the adapter; those of A and B only pass
  for (const char* init : {"pissa", "pissa_niter_4", "olora", "corda", "loftq", "lora_ga"})
    llmt_test::expect_error([&] { read_adapter_config(with("init_lora_weights", init)); },
                            {"init_lora_weights", init, "rewrites the base"});
  for (const nlohmann::json& init : {nlohmann::json(true), nlohmann::json(false), nlohmann::json("gaussian")})
    EXPECT_NO_THROW(read_adapter_config(with("init_lora_weights", init)));
  // PEFT reads the string "all-linear" (any case) as the shorthand, not as a regular expression
  EXPECT_EQ(read_adapter_config(with("target_modules", "ALL-Linear")).target_modules,
            std::vector<std::string>{"all-linear"});
  // a tensor the config does not explain
  ModelConfig cfg = config_from_json_file(llmt_test::reference_dir() + "/llama_tiny/config.json");
  LoraConfig qk;
  qk.r = 4;
  qk.target_modules = {"q_proj"};
  SafetensorsFile f(case_dir(kCases[1]) + "/adapter_init/adapter_model.safetensors");
  llmt_test::expect_error([&] { check_adapter_tensors(f, make_lora_layout(cfg, qk)); },
                          {"v_proj.lora_A.weight is not part of this adapter"});
  qk.r = 8;
  qk.target_modules = {"q_proj", "v_proj"};
  llmt_test::expect_error([&] { check_adapter_tensors(f, make_lora_layout(cfg, qk)); },
                          {"q_proj.lora_A.weight has shape [4,32], expected [8, 32]"});
}

namespace {
// A UnitStore over whole f32 units on the backend, for an evaluation forward (no gradients).
class PlainStore : public UnitStore {
 public:
  PlainStore(Backend& be, const ModelLayout& L, const std::vector<std::vector<float>>& host) {
    for (size_t u = 0; u < L.units.size(); u++) {
      bufs_.push_back(std::make_unique<BackendBuffer>(be, DType::f32, std::vector<int64_t>{L.units[u].numel}));
      be.copy_from_host(bufs_.back()->tensor().data, host[u].data(), host[u].size() * 4);
    }
  }
  Tensor acquire(int u) override { return bufs_[(size_t)u]->tensor(); }
  void release(int) override {}
  Tensor grads(int) override { ADD_FAILURE() << "no gradients here"; return Tensor(); }
  void grads_done(int) override {}

 private:
  std::vector<std::unique_ptr<BackendBuffer>> bufs_;
};
}  // namespace

// The final adapter of each case merged into its base model (merge_lora_unit: PEFT's merge_and_unload)
// and run by the existing forward gives PEFT's logits after the 5th step; where the fixture saved PEFT's
// merged model (GPT-2, LLaMA, Qwen2's tied head untied by its copy) the merged weights equal it. Checks the keys, the projections' rows inside llmt's fused
// matrices, scaling and rsLoRA, and modules_to_save on a tied model, before the adapter runs in training.
TEST(Lora, MergedFinalAdaptersGivePeftLogits) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::string base_dir = llmt_test::reference_dir() + "/" + c.base;
    ModelConfig cfg = config_from_json_file(base_dir + "/config.json");
    LoraConfig lora = read_adapter_config(case_dir(c) + "/adapter_final/adapter_config.json");
    LoraLayout AL = make_lora_layout(cfg, lora);
    const ModelLayout base_layout = make_layout(cfg);
    SafetensorsCheckpoint ckpt(base_dir);
    // PEFT's lm_head copy (and embed_tokens copy) unties a tied model
    const ModelConfig merged_cfg = merged_model_config(cfg, AL);
    const ModelLayout BL = make_layout(merged_cfg);
    EXPECT_EQ(merged_cfg.tied_embeddings, cfg.tied_embeddings && AL.saved.empty());
    SafetensorsFile fin(case_dir(c) + "/adapter_final/adapter_model.safetensors");
    std::vector<std::vector<float>> base;
    for (size_t u = 0; u < BL.units.size(); u++) {
      base.emplace_back((size_t)BL.units[u].numel);
      load_merged_unit(ckpt, cfg, base_layout, fin, AL, lora.scaling(), BL, (int)u, base.back().data());
    }
    struct stat st;
    if (::stat((case_dir(c) + "/merged").c_str(), &st) == 0) {  // PEFT's merge_and_unload, saved
      SafetensorsCheckpoint merged(case_dir(c) + "/merged");
      EXPECT_EQ(config_from_json_file(case_dir(c) + "/merged/config.json").tied_embeddings, merged_cfg.tied_embeddings);
      check_hf_tensors(merged, merged_cfg, BL, case_dir(c) + "/merged");
      for (size_t u = 0; u < BL.units.size(); u++) {
        std::vector<float> want((size_t)BL.units[u].numel);
        load_hf_unit(merged, merged_cfg, BL, (int)u, want.data());
        EXPECT_LT(rel_error(base[u].data(), want.data(), (int64_t)want.size()), tol::kF32OpForward) << "unit " << u;
      }
    }
    SafetensorsFile ref(case_dir(c) + "/reference.safetensors");
    const StTensor* ids_t = ref.find("input_ids");
    ASSERT_TRUE(ids_t);
    const int B = (int)ids_t->shape[0], T = (int)ids_t->shape[1];
    std::vector<int32_t> ids((size_t)(B * T));
    std::memcpy(ids.data(), ref.data(*ids_t), ids.size() * 4);
    auto be = make_cpu_backend(2, DType::f32);
    Transformer model(merged_cfg, *be, B, T);
    PlainStore store(*be, model.layout(), base);
    model.forward(store, ids.data(), nullptr, 0, Tensor());
    const int64_t V = merged_cfg.vocab_size, stride = model.logits_stride();
    std::vector<float> padded((size_t)(B * T * stride)), logits((size_t)(B * T * V)), want(logits.size());
    be->copy_to_host(padded.data(), model.logits().data, padded.size() * 4);
    for (int64_t r = 0; r < B * T; r++)
      std::copy(padded.begin() + r * stride, padded.begin() + r * stride + V, logits.begin() + r * V);
    ref.read_f32(*ref.find("logits_final"), want.data());
    const double err = rel_error(logits.data(), want.data(), (int64_t)want.size());
    EXPECT_LT(err, tol::kF32Logits);
    if (std::getenv("LLMT_TEST_MARGINS"))
      std::printf("margin %s logits_final %.3g of %.3g\n", c.name.c_str(), err, tol::kF32Logits);
  }
}

// A fresh adapter is PEFT's init: A within +-1/sqrt(in) and not constant, B zero, modules_to_save
// copies of the base tensors; the same seed gives the same draws.
TEST(Lora, FreshAdapterIsPeftsInit) {
  ModelConfig cfg = config_from_json_file(llmt_test::reference_dir() + "/llama_tiny/config.json");
  LoraConfig c;
  c.target_modules = {"all-linear"};
  c.modules_to_save = {"lm_head"};
  LoraLayout L = make_lora_layout(cfg, c);
  ModelLayout BL = make_layout(cfg);
  std::vector<float> root((size_t)BL.units[0].numel);
  for (size_t i = 0; i < root.size(); i++) root[i] = (float)i;
  std::vector<float> u0((size_t)L.units[0].numel), u1((size_t)L.units[1].numel), again(u1.size());
  init_lora_unit(L, 0, 7, BL, root.data(), u0.data());
  EXPECT_EQ(u0[(size_t)L.saved[0].offset + 5], root[(size_t)BL.root.lm_head + 5]);
  init_lora_unit(L, 1, 7, BL, root.data(), u1.data());
  init_lora_unit(L, 1, 7, BL, root.data(), again.data());
  EXPECT_EQ(u1, again);
  for (const LoraSlot& s : L.slots) {
    const int64_t na = 16 * s.proj.in, nb = s.proj.out * 16;
    double bound = 1.0 / std::sqrt((double)s.proj.in), lo = 1, hi = -1;
    for (int64_t k = 0; k < na; k++) lo = std::min(lo, (double)u1[s.a + k]), hi = std::max(hi, (double)u1[s.a + k]);
    EXPECT_GE(lo, -bound);
    EXPECT_LE(hi, bound);
    EXPECT_LT(lo, -0.8 * bound) << s.proj.module;  // the draws fill the range
    EXPECT_GT(hi, 0.8 * bound) << s.proj.module;
    for (int64_t k = 0; k < nb; k++) ASSERT_EQ(u1[s.b + k], 0.0f);
  }
}

// PEFT gives every LoRA module its own nn.Dropout: q_proj's and k_proj's adapters, which read the same
// input through one fused matrix, draw independent masks. With equal A and equal B rows, the two
// adapters' outputs agree without dropout and differ with it.
TEST(Lora, EachAdaptedProjectionDrawsItsOwnDropoutMask) {
  const ModelConfig cfg = config_from_json_file(llmt_test::reference_dir() + "/llama_tiny/config.json");
  LoraConfig c;
  c.r = 4, c.alpha = 8, c.dropout = 0.5;
  c.target_modules = {"q_proj", "k_proj"};
  c = resolve_lora_config(c, cfg);
  const LoraLayout AL = make_lora_layout(cfg, c);
  ASSERT_EQ(AL.slots.size(), 2u);
  const LoraSlot &q = AL.slots[0], &k = AL.slots[1];
  const int64_t C = cfg.d_model, R = cfg.qkv_dim(), kout = k.proj.out, T = 6;
  auto be = make_cpu_backend(1, DType::f32);
  std::unique_ptr<DataComm> solo = make_solo_data_comm();
  FsdpStore store(*be, AL, Strategy::no_shard, *solo, 1);
  std::vector<float> unit((size_t)AL.units[1].numel, 0.0f);
  const std::vector<float> A = randn(c.r * C, 21, 0.3f), B = randn(kout * c.r, 22, 0.3f);
  std::copy(A.begin(), A.end(), unit.begin() + q.a);
  std::copy(A.begin(), A.end(), unit.begin() + k.a);
  std::copy(B.begin(), B.end(), unit.begin() + q.b);  // q's first kout rows = k's rows
  std::copy(B.begin(), B.end(), unit.begin() + k.b);
  store.set_unit(1, unit.data());
  LoraAdapters hook(cfg, c, AL, *be, store, 1, (int)T);
  Dev dev{*be, {}};
  const Tensor x = dev.put(randn(T * C, 23), DType::f32);
  for (float p : {0.0f, 0.5f}) {
    hook.acquire(1);
    Tensor y = dev.put(std::vector<float>((size_t)(T * R), 0.0f), DType::f32);
    AdapterSite at;
    at.layer = 0, at.matrix = BlockMatrix::qkv, at.B = 1, at.T = (int)T;
    at.dropout.p = p, at.dropout.key = 99;
    hook.forward(at, y, x);
    hook.release(1);
    const std::vector<float> out = dev.get(y);
    std::vector<float> yq, yk;
    for (int64_t t = 0; t < T; t++)
      for (int64_t j = 0; j < kout; j++) {
        yq.push_back(out[(size_t)(t * R + q.proj.row0 + j)]);
        yk.push_back(out[(size_t)(t * R + k.proj.row0 + j)]);
      }
    if (p == 0.0f) EXPECT_EQ(yq, yk);
    else EXPECT_GT(rel_error(yq.data(), yk.data(), (int64_t)yk.size()), 0.1) << "q_proj and k_proj share a mask";
  }
}
