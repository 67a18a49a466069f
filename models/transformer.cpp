#include "models/transformer.h"

#include <cmath>

#include "engine/core/error.h"
#include "engine/core/rng.h"

namespace llmt {

namespace {
Tensor F(const float* p, std::initializer_list<int64_t> dims) { return Tensor((void*)p, DType::f32, dims); }
Tensor none() { return Tensor(); }
// a parameter at offset `off` of a unit buffer, or an empty tensor where the family has none
Tensor P(const float* unit, int64_t off, std::initializer_list<int64_t> dims) {
  return off < 0 ? Tensor() : F(unit + off, dims);
}
}  // namespace

float* Transformer::buf(size_t n) {
  void* p = be_.alloc(n * sizeof(float));
  allocations_.push_back(p);
  return (float*)p;
}

int64_t Transformer::activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpointing) {
  const int64_t N = (int64_t)B * T, C = cfg.d_model, L = cfg.n_layer, sets = checkpointing ? 1 : L;
  const int64_t att = (int64_t)B * cfg.n_head * T * T;
  const int64_t per_set = 5 * N * C + 4 * N + N * cfg.qkv_dim() + att + N * cfg.mlp_in_dim() + N * cfg.d_ff;
  const int64_t head = N * C + 2 * N + N * cfg.vocab_size;
  const int64_t scratch = 3 * N * C + N * cfg.qkv_dim() + att + N * cfg.mlp_in_dim() + N * cfg.d_ff;
  return (int64_t)sizeof(float) * ((L + 1) * N * C + sets * per_set + head + scratch) + 2 * (int64_t)sizeof(int32_t) * N;
}

Transformer::Transformer(const ModelConfig& cfg, Backend& backend, int B, int T, bool checkpointing)
    : cfg_(cfg), layout_(make_layout(cfg)), be_(backend), B_(B), T_max_(T), cur_T_(T), checkpointing_(checkpointing) {
  LLMT_CHECK(B > 0 && T > 0, "batch size %d and sequence length %d must be positive", B, T);
  LLMT_CHECK(T <= cfg.max_seq_len, "sequence length %d exceeds the model's context of %d tokens", T, cfg.max_seq_len);
  const size_t N = (size_t)B * T, C = cfg.d_model, L = cfg.n_layer;
  const size_t att = (size_t)B * cfg.n_head * T * T;
  tokens_ = (int32_t*)be_.alloc(N * sizeof(int32_t));
  targets_ = (int32_t*)be_.alloc(N * sizeof(int32_t));
  allocations_.push_back(tokens_);
  allocations_.push_back(targets_);
  for (size_t l = 0; l <= L; l++) resid_.push_back(buf(N * C));
  for (size_t l = 0; l < (checkpointing ? 1 : L); l++) {
    ln1_.push_back(buf(N * C));
    ln1_mean_.push_back(buf(N));
    ln1_rstd_.push_back(buf(N));
    qkv_.push_back(buf(N * cfg.qkv_dim()));
    att_.push_back(buf(att));
    attn_out_.push_back(buf(N * C));
    resid_mid_.push_back(buf(N * C));
    ln2_.push_back(buf(N * C));
    ln2_mean_.push_back(buf(N));
    ln2_rstd_.push_back(buf(N));
    mlp_in_.push_back(buf(N * cfg.mlp_in_dim()));
    mlp_act_.push_back(buf(N * cfg.d_ff));
  }
  lnf_ = buf(N * C);
  lnf_mean_ = buf(N);
  lnf_rstd_ = buf(N);
  logits_ = buf(N * cfg.vocab_size);
  dres_ = buf(N * C);
  dnorm_ = buf(N * C);
  dattn_ = buf(N * C);
  dqkv_ = buf(N * cfg.qkv_dim());
  datt_ = buf(att);
  dmlp_in_ = buf(N * cfg.mlp_in_dim());
  dmlp_act_ = buf(N * cfg.d_ff);
}

Transformer::~Transformer() {
  for (void* p : allocations_) be_.release(p);
}

Tensor Transformer::logits() const { return F(logits_, {(int64_t)B_ * cur_T_, cfg_.vocab_size}); }

// The family's norm over the current batch's rows: LayerNorm (GPT-2, weight and bias) or RMSNorm
// (LLaMA, weight only; mean unused). w_off/b_off are offsets into the unit `w`.
void Transformer::norm_forward(float* out, float* mean, float* rstd, Tensor x, const float* w, int64_t w_off,
                               int64_t b_off) {
  const int64_t N = (int64_t)B_ * cur_T_, C = cfg_.d_model;
  if (cfg_.arch == Arch::gpt2)
    be_.layernorm_forward(F(out, {N, C}), F(mean, {N}), F(rstd, {N}), x, P(w, w_off, {C}), P(w, b_off, {C}), N, (int)C,
                          cfg_.norm_eps);
  else
    be_.rmsnorm_forward(F(out, {N, C}), F(rstd, {N}), x, P(w, w_off, {C}), N, (int)C, cfg_.norm_eps);
}

// Backward of norm_forward: dres_ += dx (from dnorm_), and the weight (and bias) gradients into unit g.
void Transformer::norm_backward(Tensor x, const float* mean, const float* rstd, const float* w, float* g,
                                int64_t w_off, int64_t b_off) {
  const int64_t N = (int64_t)B_ * cur_T_, C = cfg_.d_model;
  if (cfg_.arch == Arch::gpt2)
    be_.layernorm_backward(F(dres_, {N, C}), P(g, w_off, {C}), P(g, b_off, {C}), F(dnorm_, {N, C}), x,
                           P(w, w_off, {C}), F(mean, {N}), F(rstd, {N}), N, (int)C);
  else
    be_.rmsnorm_backward(F(dres_, {N, C}), P(g, w_off, {C}), F(dnorm_, {N, C}), x, P(w, w_off, {C}), F(rstd, {N}), N,
                         (int)C);
}

void Transformer::block_forward(int l, const float* w) {
  const int T = cur_T_, a = act(l);
  const BlockOffsets& o = layout_.block;
  const int64_t N = (int64_t)B_ * T, C = cfg_.d_model, QKV = cfg_.qkv_dim(), FI = cfg_.mlp_in_dim(),
                FF = cfg_.d_ff;
  const int NH = cfg_.n_head, NKV = cfg_.n_kv_head, hs = cfg_.head_size();
  const bool gpt2 = cfg_.arch == Arch::gpt2;
  Tensor x = F(resid_[l], {N, C});

  // attention sub-block: resid_mid = x + proj(attention(norm1(x)))
  norm_forward(ln1_[a], ln1_mean_[a], ln1_rstd_[a], x, w, o.ln1_w, o.ln1_b);
  be_.matmul(F(qkv_[a], {N, QKV}), F(ln1_[a], {N, C}), P(w, o.qkv_w, {QKV, C}), P(w, o.qkv_b, {QKV}), N, QKV, C,
             false, true, false);
  if (!gpt2) be_.rope_forward(F(qkv_[a], {N, QKV}), B_, T, NH, NKV, hs, cfg_.rope_theta);
  be_.attention_forward(F(attn_out_[a], {N, C}), F(att_[a], {B_, NH, T, T}), F(qkv_[a], {N, QKV}), B_, T, NH, NKV,
                        hs);
  be_.copy(resid_mid_[a], resid_[l], sizeof(float) * N * C);
  be_.matmul(F(resid_mid_[a], {N, C}), F(attn_out_[a], {N, C}), P(w, o.attn_proj_w, {C, C}),
             P(w, o.attn_proj_b, {C}), N, C, C, false, true, true);

  // MLP sub-block: resid[l+1] = resid_mid + mlp(norm2(resid_mid))
  Tensor xm = F(resid_mid_[a], {N, C});
  norm_forward(ln2_[a], ln2_mean_[a], ln2_rstd_[a], xm, w, o.ln2_w, o.ln2_b);
  be_.matmul(F(mlp_in_[a], {N, FI}), F(ln2_[a], {N, C}), P(w, o.mlp_in_w, {FI, C}), P(w, o.mlp_in_b, {FI}), N, FI, C,
             false, true, false);
  if (gpt2)
    be_.gelu_forward(F(mlp_act_[a], {N, FF}), F(mlp_in_[a], {N, FI}), N * FF);
  else
    be_.swiglu_forward(F(mlp_act_[a], {N, FF}), F(mlp_in_[a], {N, FI}), N, (int)FF);
  be_.copy(resid_[l + 1], resid_mid_[a], sizeof(float) * N * C);
  be_.matmul(F(resid_[l + 1], {N, C}), F(mlp_act_[a], {N, FF}), P(w, o.mlp_out_w, {C, FF}), P(w, o.mlp_out_b, {C}),
             N, C, FF, false, true, true);
}

// On entry dres_ holds dloss/d resid[l+1]; on exit dloss/d resid[l].
void Transformer::block_backward(int l, const float* w, float* g) {
  const int T = cur_T_, a = act(l);
  const BlockOffsets& o = layout_.block;
  const int64_t N = (int64_t)B_ * T, C = cfg_.d_model, QKV = cfg_.qkv_dim(), FI = cfg_.mlp_in_dim(),
                FF = cfg_.d_ff;
  const int NH = cfg_.n_head, NKV = cfg_.n_kv_head, hs = cfg_.head_size();
  const bool gpt2 = cfg_.arch == Arch::gpt2;
  Tensor dres = F(dres_, {N, C});

  // MLP: resid[l+1] = resid_mid + mlp_act W_out^T + b_out
  be_.matmul(P(g, o.mlp_out_w, {C, FF}), dres, F(mlp_act_[a], {N, FF}), none(), C, FF, N, true, false, true);
  if (gpt2) be_.bias_backward(P(g, o.mlp_out_b, {C}), dres, N, C);
  be_.matmul(F(dmlp_act_, {N, FF}), dres, P(w, o.mlp_out_w, {C, FF}), none(), N, FF, C, false, false, false);
  if (gpt2)
    be_.gelu_backward(F(dmlp_in_, {N, FI}), F(mlp_in_[a], {N, FI}), F(dmlp_act_, {N, FF}), N * FF);
  else
    be_.swiglu_backward(F(dmlp_in_, {N, FI}), F(dmlp_act_, {N, FF}), F(mlp_in_[a], {N, FI}), N, (int)FF);
  be_.matmul(P(g, o.mlp_in_w, {FI, C}), F(dmlp_in_, {N, FI}), F(ln2_[a], {N, C}), none(), FI, C, N, true, false, true);
  if (gpt2) be_.bias_backward(P(g, o.mlp_in_b, {FI}), F(dmlp_in_, {N, FI}), N, FI);
  be_.matmul(F(dnorm_, {N, C}), F(dmlp_in_, {N, FI}), P(w, o.mlp_in_w, {FI, C}), none(), N, C, FI, false, false, false);
  Tensor xm = F(resid_mid_[a], {N, C});
  norm_backward(xm, ln2_mean_[a], ln2_rstd_[a], w, g, o.ln2_w, o.ln2_b);

  // attention: resid_mid = x + attn_out W_proj^T + b_proj
  be_.matmul(P(g, o.attn_proj_w, {C, C}), dres, F(attn_out_[a], {N, C}), none(), C, C, N, true, false, true);
  if (gpt2) be_.bias_backward(P(g, o.attn_proj_b, {C}), dres, N, C);
  be_.matmul(F(dattn_, {N, C}), dres, P(w, o.attn_proj_w, {C, C}), none(), N, C, C, false, false, false);
  be_.attention_backward(F(dqkv_, {N, QKV}), F(datt_, {B_, NH, T, T}), F(dattn_, {N, C}), F(qkv_[a], {N, QKV}),
                         F(att_[a], {B_, NH, T, T}), B_, T, NH, NKV, hs);
  if (!gpt2) be_.rope_backward(F(dqkv_, {N, QKV}), B_, T, NH, NKV, hs, cfg_.rope_theta);
  be_.matmul(P(g, o.qkv_w, {QKV, C}), F(dqkv_, {N, QKV}), F(ln1_[a], {N, C}), none(), QKV, C, N, true, false, true);
  if (gpt2) be_.bias_backward(P(g, o.qkv_b, {QKV}), F(dqkv_, {N, QKV}), N, QKV);
  be_.matmul(F(dnorm_, {N, C}), F(dqkv_, {N, QKV}), P(w, o.qkv_w, {QKV, C}), none(), N, C, QKV, false, false, false);
  Tensor x = F(resid_[l], {N, C});
  norm_backward(x, ln1_mean_[a], ln1_rstd_[a], w, g, o.ln1_w, o.ln1_b);
}

double Transformer::forward(UnitStore& store, const int32_t* tokens, const int32_t* targets, bool want_grad,
                            float grad_scale, int seq_len) {
  LLMT_CHECK(!want_grad || targets, "forward: gradients need targets");
  LLMT_CHECK(seq_len >= 0 && seq_len <= T_max_, "forward: sequence length %d exceeds the %d the model was sized for",
             seq_len, T_max_);
  cur_T_ = seq_len > 0 ? seq_len : T_max_;
  const int T = cur_T_;
  const int64_t N = (int64_t)B_ * T, C = cfg_.d_model, V = cfg_.vocab_size;
  const RootOffsets& r = layout_.root;
  be_.copy_from_host(tokens_, tokens, sizeof(int32_t) * N);
  if (targets) be_.copy_from_host(targets_, targets, sizeof(int32_t) * N);

  const float* root = store.acquire(0);
  store.prefetch(1 % (cfg_.n_layer + 1));
  be_.embedding_forward(F(resid_[0], {N, C}), Tensor(tokens_, DType::i32, {N}), P(root, r.wte, {V, C}),
                        P(root, r.wpe, {cfg_.max_seq_len, C}), B_, T, (int)C, (int)V);
  store.release(0);
  for (int l = 0; l < cfg_.n_layer; l++) {
    const float* w = store.acquire(1 + l);
    store.prefetch((2 + l) % (cfg_.n_layer + 1));  // the next block, or the root for the head
    block_forward(l, w);
    store.release(1 + l);
  }
  root = store.acquire(0);
  Tensor x = F(resid_[cfg_.n_layer], {N, C});
  norm_forward(lnf_, lnf_mean_, lnf_rstd_, x, root, r.lnf_w, r.lnf_b);
  be_.matmul(F(logits_, {N, V}), F(lnf_, {N, C}), P(root, r.lm_head, {V, C}), none(), N, V, C, false, true, false);
  store.release(0);
  have_grad_ = want_grad;
  if (!targets) return 0.0;
  Tensor lg = F(logits_, {N, V});
  return be_.cross_entropy(want_grad ? lg : none(), lg, Tensor(targets_, DType::i32, {N}), N, (int)V, grad_scale);
}

void Transformer::backward(UnitStore& store) {
  LLMT_CHECK(have_grad_, "backward called without a forward that kept gradients");
  have_grad_ = false;
  const int T = cur_T_;
  const int64_t N = (int64_t)B_ * T, C = cfg_.d_model, V = cfg_.vocab_size;
  const RootOffsets& r = layout_.root;

  // head: logits = norm_f(resid[L]) W_head^T; logits_ holds dloss/dlogits
  const float* root = store.acquire(0);
  store.prefetch(cfg_.n_layer);
  float* groot = store.grads(0);
  Tensor dlogits = F(logits_, {N, V});
  be_.matmul(P(groot, r.lm_head, {V, C}), dlogits, F(lnf_, {N, C}), none(), V, C, N, true, false, true);
  be_.matmul(F(dnorm_, {N, C}), dlogits, P(root, r.lm_head, {V, C}), none(), N, C, V, false, false, false);
  be_.zero(dres_, sizeof(float) * N * C);
  Tensor x = F(resid_[cfg_.n_layer], {N, C});
  norm_backward(x, lnf_mean_, lnf_rstd_, root, groot, r.lnf_w, r.lnf_b);
  store.release(0);

  for (int l = cfg_.n_layer - 1; l >= 0; l--) {
    const float* w = store.acquire(1 + l);
    if (l > 0) store.prefetch(l);
    if (checkpointing_) block_forward(l, w);  // recompute what backward needs from the kept input
    block_backward(l, w, store.grads(1 + l));
    store.release(1 + l);
    store.grads_done(1 + l);
  }

  // the embedding's gradient needs no parameters, only the root's gradient buffer
  be_.embedding_backward(P(groot, r.wte, {V, C}), P(groot, r.wpe, {cfg_.max_seq_len, C}), F(dres_, {N, C}),
                         Tensor(tokens_, DType::i32, {N}), B_, T, (int)C);
  store.grads_done(0);
  store.backward_done();
}

FullUnitStore::FullUnitStore(Backend& backend, const ModelLayout& layout) : be_(backend), layout_(layout) {
  for (auto& u : layout.units) {
    params_.push_back((float*)be_.alloc(sizeof(float) * u.numel));
    grads_.push_back((float*)be_.alloc(sizeof(float) * u.numel));
  }
}

FullUnitStore::~FullUnitStore() {
  for (float* p : params_) be_.release(p);
  for (float* p : grads_) be_.release(p);
}

void FullUnitStore::zero_grads() {
  for (size_t u = 0; u < grads_.size(); u++) be_.zero(grads_[u], sizeof(float) * layout_.units[u].numel);
}

void init_unit_params(const ModelConfig& cfg, const UnitLayout& unit, int unit_index, uint64_t seed, float* host) {
  SplitMix64 rng{stream_state(seed, (uint64_t)unit_index)};
  const float std_dev = 0.02f;
  const float proj_std = std_dev / std::sqrt(2.0f * cfg.n_layer);
  for (const ParamSpec& p : unit.params) {
    float* dst = host + p.offset;
    const int64_t n = p.numel();
    bool is_norm = p.shape.size() == 1 && p.hf_name.find("bias") == std::string::npos;
    if (p.shape.size() == 1) {  // biases zero, norm weights one
      for (int64_t i = 0; i < n; i++) dst[i] = is_norm ? 1.0f : 0.0f;
      continue;
    }
    bool scaled = cfg.arch == Arch::gpt2 && p.hf_name.find("c_proj.weight") != std::string::npos;
    float s = scaled ? proj_std : std_dev;
    for (int64_t i = 0; i < n; i++) dst[i] = (float)(rng.normal() * s);
  }
}

}  // namespace llmt
