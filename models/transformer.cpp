#include "models/transformer.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/core/rng.h"

namespace llmt {

namespace {
// a parameter at offset `off` of a unit buffer (parameters or gradients), or an empty tensor where
// the family has none
// (or of a frozen unit's gradients, which are an empty tensor)
Tensor P(const Tensor& unit, int64_t off, std::initializer_list<int64_t> dims) {
  return off < 0 || !unit.data ? Tensor() : unit.view(off, dims);
}
// dropout sites inside a layer (the embeddings are layer -1)
enum DropSite { kEmbd = 0, kAttnProbs = 1, kAttnOut = 2, kMlpOut = 3 };
// the adapters' dropout masks: a stream of their own under (seed, step), site (layer, matrix) in it
constexpr uint64_t kAdapterDropStream = 0x6164617074ull;
}  // namespace

int64_t ActivationBuffer::bytes() const {
  int64_t n = (int64_t)dtype_size(dtype);
  for (int64_t d : shape) n *= d;
  return n;
}

void Transformer::walk_buffers(const ModelConfig& cfg, int B, int T, bool checkpointing, DType dt, int vocab_pad,
                               int64_t head_chunk, const std::function<Tensor(const ActivationBuffer&)>& take,
                               Transformer* m) {
  const int64_t N = (int64_t)B * T, C = cfg.d_model, QKV = cfg.qkv_dim(), FI = cfg.mlp_in_dim(), FF = cfg.d_ff,
                Q = (int64_t)cfg.n_head * cfg.head_size();
  const DType f32 = DType::f32;
  auto t = [&](const char* name, DType d, std::vector<int64_t> shape) { return take({name, d, std::move(shape)}); };
  Tensor tokens = t("tokens", DType::i32, {N}), targets = t("targets", DType::i32, {N});
  // packed documents (and generation): each token's position and its document's first position
  Tensor positions = t("positions", DType::i32, {N}), doc_starts = t("document starts", DType::i32, {N});
  std::vector<Tensor> resid;
  for (int l = 0; l <= cfg.n_layer; l++) resid.push_back(t("residual stream", dt, {N, C}));
  std::vector<BlockActs> acts;
  for (int s = 0; s < (checkpointing ? 1 : cfg.n_layer); s++) {
    BlockActs a;
    a.ln1 = t("norm 1", dt, {N, C});
    a.ln1_mean = t("norm 1 mean", f32, {N});
    a.ln1_rstd = t("norm 1 rstd", f32, {N});
    a.qkv = t("qkv", dt, {N, QKV});
    if (cfg.family.qk_norm) {
      a.qkv_pre = t("qkv before the q/k norms", dt, {N, QKV});
      a.qk_rstd = t("q/k norm rstd", f32, {N, cfg.n_head + cfg.n_kv_head});
    }
    a.lse = t("attention log-sum-exp", f32, {B, cfg.n_head, T});
    a.attn_out = t("attention out", dt, {N, Q});
    a.resid_mid = t("residual mid-block", dt, {N, C});
    a.ln2 = t("norm 2", dt, {N, C});
    a.ln2_mean = t("norm 2 mean", f32, {N});
    a.ln2_rstd = t("norm 2 rstd", f32, {N});
    if (checkpointing ? cfg.moe_layers() < cfg.n_layer : !cfg.moe_layer(s)) {  // MoE layers: models/moe.h
      a.mlp_in = t("mlp in", dt, {N, FI});
      a.mlp_act = t("mlp activation", dt, {N, FF});
    }
    if (cfg.family.sandwich_norms) {
      a.attn_branch = t("attention branch before its norm", dt, {N, C});
      a.attn_branch_rstd = t("attention branch norm rstd", f32, {N});
      a.mlp_branch = t("mlp branch before its norm", dt, {N, C});
      a.mlp_branch_rstd = t("mlp branch norm rstd", f32, {N});
    }
    acts.push_back(a);
  }
  Tensor lnf = t("final norm", dt, {N, C}), lnf_mean = t("final norm mean", f32, {N}),
         lnf_rstd = t("final norm rstd", f32, {N}),
         logits = t("logits", dt, {head_chunk > 0 ? std::min(head_chunk, N) : N, padded_vocab(cfg, vocab_pad)});
  Tensor discarded = head_chunk > 0 && head_chunk < N ? t("chunked head's recomputed loss", DType::f64, {1}) : Tensor();
  Tensor dres = t("grad residual", dt, {N, C}), dnorm = t("grad norm", dt, {N, C}), dattn = t("grad attention out", dt, {N, Q}),
         dqkv = t("grad qkv", dt, {N, QKV});
  const bool dense = cfg.moe_layers() < cfg.n_layer;
  Tensor dmlp_in = dense ? t("grad mlp in", dt, {N, FI}) : Tensor(),
         // the GELU MLP's gradient comes out of matmul_dgelu straight into dmlp_in
         dmlp_act = cfg.family.mlp == MlpKind::gelu_tanh || !dense ? Tensor() : t("grad mlp activation", dt, {N, FF});
  Tensor dropped = cfg.resid_pdrop > 0.0f ? t("dropout branch", dt, {N, C}) : Tensor();
  Tensor sandwich = cfg.family.sandwich_norms ? t("sandwich norm scratch", dt, {N, C}) : Tensor();
  Tensor frozen_norm_grad = t("frozen norm's discarded gradient", f32, {2 * std::max<int64_t>(C, cfg.head_size())});
  MoeBlocks::walk(cfg, B, T, checkpointing, dt,
                  [&](const char* name, DType d, std::vector<int64_t> shape) { return t(name, d, std::move(shape)); },
                  m ? &m->moe_ : nullptr);
  if (!m) return;
  m->tokens_ = tokens, m->targets_ = targets, m->resid_ = resid, m->acts_ = acts;
  m->positions_ = positions, m->doc_start_ = doc_starts;
  m->lnf_ = lnf, m->lnf_mean_ = lnf_mean, m->lnf_rstd_ = lnf_rstd, m->logits_ = logits;
  m->dres_ = dres, m->dnorm_ = dnorm, m->dattn_ = dattn, m->dqkv_ = dqkv, m->dmlp_in_ = dmlp_in, m->dmlp_act_ = dmlp_act;
  m->dropped_ = dropped;
  m->sandwich_ = sandwich;
  m->frozen_norm_grad_ = frozen_norm_grad;
  m->discarded_loss_ = discarded;
}

std::vector<ActivationBuffer> Transformer::activation_buffers(const ModelConfig& cfg, int B, int T, bool checkpointing,
                                                              DType compute, int vocab_pad, int64_t head_chunk) {
  std::vector<ActivationBuffer> out;
  walk_buffers(cfg, B, T, checkpointing, compute, vocab_pad, head_chunk,
               [&](const ActivationBuffer& b) { out.push_back(b); return Tensor(); }, nullptr);
  return out;
}

int64_t Transformer::activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpointing, DType compute,
                                      int vocab_pad, int64_t head_chunk) {
  int64_t n = 0;
  for (const ActivationBuffer& b : activation_buffers(cfg, B, T, checkpointing, compute, vocab_pad, head_chunk))
    n += b.bytes();
  return n;
}

int64_t Transformer::padded_vocab(const ModelConfig& cfg, int vocab_pad) {
  LLMT_CHECK(vocab_pad >= 1, "padded_vocab: vocab_pad %d", vocab_pad);
  return ((int64_t)cfg.vocab_size + vocab_pad - 1) / vocab_pad * vocab_pad;
}

double Transformer::flops_per_token(const ModelConfig& cfg, const ModelLayout& layout, int T) {
  return 6.0 * (double)layout.matmul_numel + attention_flops_per_token(cfg, T);
}

double Transformer::attention_flops_per_token(const ModelConfig& cfg, int T) {
  const double t = T, full_pairs = t * (t + 1.0) / 2.0;
  double keys = 0.0;  // keys a query is counted against, summed over the layers
  for (int l = 0; l < cfg.n_layer; l++) {
    const double w = cfg.window(l);
    keys += w <= 0.0 || w >= t ? t : t * (w * (w + 1.0) / 2.0 + (t - w) * w) / full_pairs;
  }
  return 12.0 * cfg.q_dim() * keys;
}

Transformer::Transformer(const ModelConfig& cfg, Backend& backend, int B, int T, bool checkpointing,
                         int64_t head_chunk)
    : cfg_(cfg),
      layout_(make_layout(cfg)),
      be_(backend),
      dt_(backend.compute_dtype()),
      B_(B),
      T_max_(T),
      V_pad_(padded_vocab(cfg, backend.vocab_pad())),
      cur_T_(T),
      checkpointing_(checkpointing) {
  LLMT_CHECK(B > 0 && T > 0, "batch size %d and sequence length %d must be positive", B, T);
  LLMT_CHECK(T <= cfg.max_seq_len, "sequence length %d exceeds the model's context of %d tokens", T, cfg.max_seq_len);
  LLMT_CHECK(T < (1 << kDropoutPosBits), "sequence length %d: at most %d tokens", T, (1 << kDropoutPosBits) - 1);
  rope_.theta = cfg.rope_theta;
  rope_.rotary_dim = cfg.rotary_dim();
  if (cfg.rope_scaling == "linear" || cfg.rope_scaling == "llama3") {
    rope_.scaling = cfg.rope_scaling == "linear" ? RopeSpec::linear : RopeSpec::llama3;
    rope_.factor = cfg.rope_factor;
    rope_.low_freq_factor = cfg.rope_low_freq_factor;
    rope_.high_freq_factor = cfg.rope_high_freq_factor;
    rope_.original_max = (float)cfg.rope_original_max;
  } else if (cfg.rope_scaling == "longrope") {
    rope_.scaling = RopeSpec::longrope;
    rope_.attention_factor = cfg.longrope_attention_factor();
    rope_.original_max = (float)cfg.rope_original_max;
    pick_rope_factors(1);
  } else if (cfg.rope_scaling == "dynamic") {
    // dynamic NTK leaves the frequencies alone up to the original context; past it they change with
    // the sequence length, which llmt does not implement
    const int original = cfg.rope_original_max > 0 ? cfg.rope_original_max : cfg.max_seq_len;
    LLMT_CHECK(T <= original, "sequence length %d exceeds the %d tokens within which dynamic rope scaling changes "
               "nothing; llmt does not implement it beyond", T, original);
  }
  if (cfg.rope_local_theta > 0.0f) rope_local_.theta = cfg.rope_local_theta;  // unscaled
  if (cfg.query_pre_attn_scalar > 0.0f) scores_.scale = 1.0f / std::sqrt(cfg.query_pre_attn_scalar);
  scores_.softcap = cfg.attn_softcap;
  if (cfg.family.scaled_embeddings) {  // as transformers' embed_scale in the weights' dtype
    embed_scale_ = std::sqrt((float)cfg.d_model);
    if (dt_ == DType::bf16) embed_scale_ = bf16_to_f32(f32_to_bf16(embed_scale_));
  }
  LLMT_CHECK(head_chunk >= 0, "head chunk of %lld tokens: expected 0 (the whole batch) or more",
             (long long)head_chunk);
  head_rows_ = head_chunk > 0 ? std::min<int64_t>(head_chunk, (int64_t)B * T) : (int64_t)B * T;
  walk_buffers(cfg, B, T, checkpointing, dt_, be_.vocab_pad(), head_chunk,
               [&](const ActivationBuffer& b) {
                 void* p = be_.alloc((size_t)b.bytes());
                 allocations_.push_back(p);
                 return Tensor(p, b.dtype, b.shape);
               },
               this);
}

Transformer::~Transformer() {
  release_kv_cache();
  for (void* p : allocations_) be_.release(p);
}

void Transformer::release_kv_cache() {
  for (void* p : kv_allocations_) be_.release(p);
  kv_allocations_.clear();
  k_cache_.clear(), v_cache_.clear();
  kv_on_ = false;
}

int64_t Transformer::kv_cache_bytes(const ModelConfig& cfg, int B, int cap, DType compute) {
  return 2 * (int64_t)cfg.n_layer * B * cfg.n_kv_head * cap * cfg.head_size() * (int64_t)dtype_size(compute);
}

void Transformer::pick_rope_factors(int len) {
  if (rope_.scaling != RopeSpec::longrope) return;
  const std::vector<float>& set = len > cfg_.rope_original_max ? cfg_.rope_long_factor : cfg_.rope_short_factor;
  std::copy(set.begin(), set.end(), rope_.ext);
}

bool Transformer::decode_needs_long_restart(int n) const {
  if (rope_.scaling != RopeSpec::longrope || kv_long_ || kv_len_ == 0) return false;
  const int first = *std::min_element(key_start_host_.begin(), key_start_host_.end());
  return kv_len_ + n - first > cfg_.rope_original_max;
}

void Transformer::start_generation(int cap, const std::vector<int32_t>& key_start, bool long_rope) {
  LLMT_CHECK((int)key_start.size() == B_, "start_generation: %zu key starts for %d sequences", key_start.size(), B_);
  LLMT_CHECK(cap > 0, "start_generation: a cache of %d positions", cap);
  for (int b = 0; b < B_; b++) {
    LLMT_CHECK(key_start[b] >= 0 && key_start[b] < cap, "start_generation: sequence %d starts at %d, outside the "
               "cache's %d positions", b, key_start[b], cap);
    LLMT_CHECK(cap - key_start[b] <= cfg_.max_seq_len, "generation: sequence %d would reach %d tokens, beyond the "
               "model's context of %d", b, cap - key_start[b], cfg_.max_seq_len);
  }
  if (cap != kv_cap_ || k_cache_.empty()) {
    release_kv_cache();
    const std::vector<int64_t> shape = {B_, cfg_.n_kv_head, cap, cfg_.head_size()};
    auto take = [&](DType d, std::vector<int64_t> sh) {
      Tensor probe(nullptr, d, sh);
      void* p = be_.alloc(probe.nbytes());
      kv_allocations_.push_back(p);
      return Tensor(p, d, sh);
    };
    for (int l = 0; l < cfg_.n_layer; l++) k_cache_.push_back(take(dt_, shape)), v_cache_.push_back(take(dt_, shape));
    key_start_ = take(DType::i32, {B_});
  }
  kv_cap_ = cap, kv_len_ = 0;
  kv_long_ = long_rope && rope_.scaling == RopeSpec::longrope;
  key_start_host_ = key_start;
  be_.copy_from_host(key_start_.data, key_start.data(), sizeof(int32_t) * B_);
}

void Transformer::decode(UnitStore& store, const int32_t* tokens, int n) {
  LLMT_CHECK(!k_cache_.empty(), "decode before start_generation");
  LLMT_CHECK(n > 0 && n <= T_max_, "decode: %d tokens at once, the model was sized for 1 to %d", n, T_max_);
  LLMT_CHECK(kv_len_ + n <= kv_cap_, "decode: %d cached and %d new tokens exceed the cache's %d positions", kv_len_, n,
             kv_cap_);
  cur_T_ = n;
  train_ = nullptr;
  have_grad_ = false;
  packed_ = false;
  const int64_t N = (int64_t)B_ * n;
  std::vector<int32_t> pos((size_t)N);
  for (int b = 0; b < B_; b++)  // counted from the first real token; padding's own are never read
    for (int i = 0; i < n; i++) pos[(size_t)b * n + i] = std::max(0, kv_len_ + i - key_start_host_[b]);
  be_.copy_from_host(tokens_.data, tokens, sizeof(int32_t) * N);
  be_.copy_from_host(positions_.data, pos.data(), sizeof(int32_t) * N);
  LLMT_CHECK(!decode_needs_long_restart(n), "decode: %d cached and %d new tokens pass longrope's original context of "
             "%d, so the long factors apply, but the cache holds keys rotated with the short ones; start again "
             "with long_rope (generate does)", kv_len_, n, cfg_.rope_original_max);
  if (rope_.scaling == RopeSpec::longrope) {  // the pass's last position + 1, over the batch
    int len = 0;
    for (int32_t p : pos) len = std::max(len, p + 1);
    kv_long_ = kv_long_ || len > cfg_.rope_original_max;
    pick_rope_factors(kv_long_ ? cfg_.rope_original_max + 1 : len);
  }
  kv_on_ = true;
  moe_.begin_pass(be_, cfg_, false);
  forward_units(store);
  kv_on_ = false;
  kv_len_ += n;
}

Tensor Transformer::rows(const Tensor& t, int64_t cols) const {
  return Tensor(t.data, t.dtype, {(int64_t)B_ * cur_T_, cols});
}

Tensor Transformer::logits() const {
  LLMT_CHECK(head_rows_ >= (int64_t)B_ * cur_T_, "logits: the LM head ran in chunks of %lld tokens; no pass keeps "
             "every row's logits", (long long)head_rows_);
  return rows(logits_, V_pad_);
}

Tensor Transformer::packed_tensor(const Tensor& t) const {
  return packed_ ? Tensor(t.data, DType::i32, {(int64_t)B_ * cur_T_}) : Tensor();
}

Dropout Transformer::dropout_for(int layer, int site, float p) const {
  Dropout d;
  if (!train_ || p <= 0.0f) return d;  // evaluation, or no dropout at this site
  d.p = p;
  d.key = stream_state(stream_state(train_->dropout.seed, (uint64_t)train_->dropout.step),
                       (uint64_t)((layer + 1) * 4 + site));
  d.row0 = train_->dropout.first_sequence;
  return d;
}

AdapterSite Transformer::adapter_site(int l, BlockMatrix m) const {
  AdapterSite at;
  at.layer = l, at.matrix = m, at.B = B_, at.T = cur_T_;
  const float p = adapters_->dropout_p();
  if (train_ && p > 0.0f) {
    at.dropout.p = p;
    at.dropout.key = stream_state(stream_state(stream_state(train_->dropout.seed, (uint64_t)train_->dropout.step),
                                               kAdapterDropStream),
                                  (uint64_t)l * kBlockMatrices + (uint64_t)m);
    at.dropout.row0 = train_->dropout.first_sequence;
  }
  return at;
}

void Transformer::adapt_forward(int l, BlockMatrix m, Tensor y, Tensor x) {
  if (adapted(m)) adapters_->forward(adapter_site(l, m), y, x);
}

void Transformer::adapt_backward(int l, BlockMatrix m, Tensor dy, Tensor x, Tensor dx) {
  if (adapted(m)) adapters_->backward(adapter_site(l, m), dy, x, dx);
}

Tensor Transformer::acquire(UnitStore& store, int unit) {
  if (adapters_) adapters_->acquire(unit);
  return store.acquire(unit);
}

void Transformer::prefetch(UnitStore& store, int unit) {
  if (adapters_) adapters_->prefetch(unit);
  store.prefetch(unit);
}

void Transformer::release(UnitStore& store, int unit) {
  if (adapters_) adapters_->release(unit);
  store.release(unit);
}

void Transformer::grads_done(UnitStore& store, int unit) {
  if (adapters_) adapters_->grads_done(unit);
  store.grads_done(unit);
}

// The family's norm over the current batch's rows: LayerNorm (weight and bias) or RMSNorm (weight
// only; mean unused). w_off/b_off are offsets into the unit `w`.
void Transformer::norm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, int64_t w_off, int64_t b_off) {
  const int64_t N = (int64_t)B_ * cur_T_, C = cfg_.d_model;
  if (cfg_.family.norm == NormKind::layernorm)
    be_.layernorm_forward(out, mean, rstd, x, P(w, w_off, {C}), P(w, b_off, {C}), N, (int)C, cfg_.norm_eps);
  else
    be_.rmsnorm_forward(out, rstd, x, P(w, w_off, {C}), N, (int)C, cfg_.norm_eps, cfg_.family.norm_offset);
}

// Backward of norm_forward: dres_ += dx (from dnorm_), and the weight (and bias) gradients into unit g.
// A frozen unit (g empty): the ops compute dx and dw in one pass, so dw goes to a scratch of 2C
// floats that nothing reads (one multiply-add an element; no product is skipped or added).
void Transformer::norm_backward(Tensor x, Tensor mean, Tensor rstd, Tensor w, Tensor g, int64_t w_off, int64_t b_off,
                                Tensor dx, Tensor dout) {
  const int64_t N = (int64_t)B_ * cur_T_, C = cfg_.d_model;
  if (!dx.data) dx = rows(dres_, C);
  if (!dout.data) dout = rows(dnorm_, C);
  Tensor dw = P(g, w_off, {C}), db = P(g, b_off, {C});
  if (!g.data) {
    be_.zero(frozen_norm_grad_.data, frozen_norm_grad_.nbytes());
    dw = frozen_norm_grad_.view(0, {C}), db = b_off >= 0 ? frozen_norm_grad_.view(C, {C}) : Tensor();
  }
  if (cfg_.family.norm == NormKind::layernorm)
    be_.layernorm_backward(dx, dw, db, dout, x, P(w, w_off, {C}), mean, rstd, N, (int)C);
  else
    be_.rmsnorm_backward(dx, dw, dout, x, P(w, w_off, {C}), rstd, N, (int)C, cfg_.family.norm_offset);
}

Tensor Transformer::sandwich_backward(Tensor dnormed, Tensor branch, Tensor rstd, Tensor w, Tensor g, int64_t w_off) {
  const int64_t C = cfg_.d_model;
  Tensor d = rows(sandwich_, C);
  be_.zero(d.data, d.nbytes());
  norm_backward(rows(branch, C), Tensor(), rstd, w, g, w_off, -1, d, dnormed);
  return d;
}

void Transformer::block_forward(int l, Tensor w) {
  const int T = cur_T_;
  const BlockActs& a = acts_[act(l)];
  const BlockOffsets& o = layout_.block;
  const int64_t N = (int64_t)B_ * T, C = cfg_.d_model, QKV = cfg_.qkv_dim(), FI = cfg_.mlp_in_dim(), FF = cfg_.d_ff;
  const int NH = cfg_.n_head, NKV = cfg_.n_kv_head, hs = cfg_.head_size();
  const int64_t Q = (int64_t)NH * hs;
  const bool rope = cfg_.family.rope, gelu = cfg_.family.mlp == MlpKind::gelu_tanh, qk_norm = cfg_.family.qk_norm;
  const bool sandwich = cfg_.family.sandwich_norms;
  const GluAct glu = cfg_.family.mlp == MlpKind::geglu ? GluAct::gelu_tanh : GluAct::silu;
  const RopeSpec& rope_l = rope_for(l);
  const Dropout out_drop_attn = dropout_for(l, kAttnOut, cfg_.resid_pdrop), out_drop_mlp = dropout_for(l, kMlpOut, cfg_.resid_pdrop);
  Tensor x = rows(resid_[l], C), qkv = rows(a.qkv, QKV), attn_out = rows(a.attn_out, Q), xm = rows(a.resid_mid, C);
  Tensor ln1 = rows(a.ln1, C), ln2 = rows(a.ln2, C), mlp_in = rows(a.mlp_in, FI), mlp_act = rows(a.mlp_act, FF);
  Tensor lse(a.lse.data, DType::f32, {B_, NH, T});

  // attention sub-block: resid_mid = x + dropout(proj(attention(norm1(x))))
  norm_forward(ln1, a.ln1_mean, a.ln1_rstd, x, w, o.ln1_w, o.ln1_b);
  // with per-head q/k norms the projections write qkv_pre, and the norms qkv from it
  Tensor proj = qk_norm ? rows(a.qkv_pre, QKV) : qkv;
  be_.matmul(proj, ln1, P(w, o.qkv_w, {QKV, C}), P(w, o.qkv_b, {QKV}), N, QKV, C, false, true, false);
  adapt_forward(l, BlockMatrix::qkv, proj, ln1);  // before RoPE, as the projections' outputs
  if (qk_norm)
    be_.head_rmsnorm_forward(qkv, Tensor(a.qk_rstd.data, DType::f32, {N, NH + NKV}), proj, P(w, o.q_norm_w, {hs}),
                             P(w, o.k_norm_w, {hs}), N, NH, NKV, hs, cfg_.norm_eps, cfg_.family.norm_offset);
  if (kv_on_) {  // generation: each row at its position, attending over the cache
    if (rope) be_.rope_forward(qkv, B_, T, NH, NKV, hs, rope_l, Tensor(positions_.data, DType::i32, {N}));
    be_.attention_kv(attn_out, k_cache_[l], v_cache_[l], qkv, key_start_, B_, T, kv_len_, kv_cap_, NH, NKV, hs,
                     cfg_.window(l), scores_);
  } else {
    if (rope) be_.rope_forward(qkv, B_, T, NH, NKV, hs, rope_l, packed_tensor(positions_));
    be_.attention_forward(attn_out, lse, qkv, B_, T, NH, NKV, hs, dropout_for(l, kAttnProbs, cfg_.attn_pdrop),
                          packed_docs(), cfg_.window(l), scores_);
  }
  if (sandwich) {  // resid_mid = x + dropout(norm(proj(...))): the branch kept before its norm
    Tensor branch = rows(a.attn_branch, C), normed = rows(sandwich_, C);
    be_.matmul(branch, attn_out, P(w, o.attn_proj_w, {C, Q}), P(w, o.attn_proj_b, {C}), N, C, Q, false, true, false);
    adapt_forward(l, BlockMatrix::attn_proj, branch, attn_out);
    norm_forward(normed, Tensor(), a.attn_branch_rstd, branch, w, o.post_attn_norm_w, -1);
    if (out_drop_attn.active()) be_.dropout(normed, B_, T, (int)C, out_drop_attn);
    be_.add(xm, x, normed, N * C);
  } else if (out_drop_attn.active()) {
    Tensor branch = rows(dropped_, C);
    be_.matmul(branch, attn_out, P(w, o.attn_proj_w, {C, Q}), P(w, o.attn_proj_b, {C}), N, C, Q, false, true, false);
    adapt_forward(l, BlockMatrix::attn_proj, branch, attn_out);
    be_.dropout(branch, B_, T, (int)C, out_drop_attn);
    be_.add(xm, x, branch, N * C);
  } else {  // the adapter adds into the residual sum, which is linear
    be_.matmul_residual(xm, x, attn_out, P(w, o.attn_proj_w, {C, Q}), P(w, o.attn_proj_b, {C}), N, C, Q);
    adapt_forward(l, BlockMatrix::attn_proj, xm, attn_out);
  }

  // MLP sub-block: resid[l+1] = resid_mid + dropout(mlp(norm2(resid_mid)))
  Tensor out = rows(resid_[l + 1], C);
  norm_forward(ln2, a.ln2_mean, a.ln2_rstd, xm, w, o.ln2_w, o.ln2_b);
  if (cfg_.moe_layer(l)) {  // a mixture of experts (models/moe.h): resid[l+1] = resid_mid + moe(norm2(...))
    LLMT_CHECK(!adapted(BlockMatrix::mlp_in) && !adapted(BlockMatrix::mlp_out), "LoRA on the experts of an MoE "
               "layer is not implemented");
    moe_.forward(be_, cfg_, layout_.moe, l, w, ln2, xm, out, N, recomputing_);
    return;
  }
  if (gelu && !adapted(BlockMatrix::mlp_in)) {  // one op, so that a GPU runs it as one cuBLASLt call
    be_.matmul_gelu(mlp_act, mlp_in, ln2, P(w, o.mlp_in_w, {FI, C}), P(w, o.mlp_in_b, {FI}), N, FI, C);
  } else {  // an adapter on c_fc adds before the GELU
    be_.matmul(mlp_in, ln2, P(w, o.mlp_in_w, {FI, C}), P(w, o.mlp_in_b, {FI}), N, FI, C, false, true, false);
    adapt_forward(l, BlockMatrix::mlp_in, mlp_in, ln2);
    if (gelu) be_.gelu_forward(mlp_act, mlp_in, N * FF);
    else be_.swiglu_forward(mlp_act, mlp_in, N, (int)FF, glu);
  }
  if (sandwich) {
    Tensor branch = rows(a.mlp_branch, C), normed = rows(sandwich_, C);
    be_.matmul(branch, mlp_act, P(w, o.mlp_out_w, {C, FF}), P(w, o.mlp_out_b, {C}), N, C, FF, false, true, false);
    adapt_forward(l, BlockMatrix::mlp_out, branch, mlp_act);
    norm_forward(normed, Tensor(), a.mlp_branch_rstd, branch, w, o.post_mlp_norm_w, -1);
    if (out_drop_mlp.active()) be_.dropout(normed, B_, T, (int)C, out_drop_mlp);
    be_.add(out, xm, normed, N * C);
  } else if (out_drop_mlp.active()) {
    Tensor branch = rows(dropped_, C);
    be_.matmul(branch, mlp_act, P(w, o.mlp_out_w, {C, FF}), P(w, o.mlp_out_b, {C}), N, C, FF, false, true, false);
    adapt_forward(l, BlockMatrix::mlp_out, branch, mlp_act);
    be_.dropout(branch, B_, T, (int)C, out_drop_mlp);
    be_.add(out, xm, branch, N * C);
  } else {
    be_.matmul_residual(out, xm, mlp_act, P(w, o.mlp_out_w, {C, FF}), P(w, o.mlp_out_b, {C}), N, C, FF);
    adapt_forward(l, BlockMatrix::mlp_out, out, mlp_act);
  }
}

// On entry dres_ holds dloss/d resid[l+1]; on exit dloss/d resid[l].
void Transformer::block_backward(int l, Tensor w, Tensor g) {
  const int T = cur_T_;
  const BlockActs& a = acts_[act(l)];
  const BlockOffsets& o = layout_.block;
  const int64_t N = (int64_t)B_ * T, C = cfg_.d_model, QKV = cfg_.qkv_dim(), FI = cfg_.mlp_in_dim(), FF = cfg_.d_ff;
  const int NH = cfg_.n_head, NKV = cfg_.n_kv_head, hs = cfg_.head_size();
  const int64_t Q = (int64_t)NH * hs;
  const bool rope = cfg_.family.rope, gelu = cfg_.family.mlp == MlpKind::gelu_tanh, qk_norm = cfg_.family.qk_norm;
  const bool sandwich = cfg_.family.sandwich_norms;
  const GluAct glu = cfg_.family.mlp == MlpKind::geglu ? GluAct::gelu_tanh : GluAct::silu;
  Tensor dres = rows(dres_, C), dnorm = rows(dnorm_, C), dattn = rows(dattn_, Q), dqkv = rows(dqkv_, QKV);
  Tensor dmlp_in = rows(dmlp_in_, FI), dmlp_act = rows(dmlp_act_, FF);
  Tensor qkv = rows(a.qkv, QKV), attn_out = rows(a.attn_out, Q), xm = rows(a.resid_mid, C);
  Tensor ln1 = rows(a.ln1, C), ln2 = rows(a.ln2, C), mlp_in = rows(a.mlp_in, FI), mlp_act = rows(a.mlp_act, FF);
  Tensor lse(a.lse.data, DType::f32, {B_, NH, T});
  // a residual branch's gradient: dres itself, or dres through the branch's dropout mask
  auto branch_grad = [&](int site) {
    Dropout d = dropout_for(l, site, cfg_.resid_pdrop);
    if (!d.active()) return dres;
    Tensor b = rows(dropped_, C);
    be_.copy(b.data, dres.data, b.nbytes());
    be_.dropout(b, B_, T, (int)C, d);
    return b;
  };

  // MLP: resid[l+1] = resid_mid + dropout(mlp_act W_out^T + b_out)
  // a frozen unit (g empty) skips every parameter-gradient product
  const bool grads = g.data != nullptr;
  Tensor dbranch;
  if (cfg_.moe_layer(l)) {  // the experts' gradients, and dnorm (=) at norm2's output
    moe_.backward(be_, cfg_, layout_.moe, l, w, g, ln2, dres, dnorm, N);
  } else {
    dbranch = branch_grad(kMlpOut);
    if (sandwich) dbranch = sandwich_backward(dbranch, a.mlp_branch, a.mlp_branch_rstd, w, g, o.post_mlp_norm_w);
    if (grads) be_.matmul(P(g, o.mlp_out_w, {C, FF}), dbranch, mlp_act, Tensor(), C, FF, N, true, false, true);
    if (grads && o.mlp_out_b >= 0) be_.bias_backward(P(g, o.mlp_out_b, {C}), dbranch, N, C);
    if (gelu && !adapted(BlockMatrix::mlp_out)) {
      be_.matmul_dgelu(dmlp_in, dbranch, P(w, o.mlp_out_w, {C, FF}), mlp_in, N, FF, C);
    } else if (gelu) {  // the adapter on mlp.c_proj adds its input gradient before GELU's (in place: FI == FF)
      be_.matmul(dmlp_in, dbranch, P(w, o.mlp_out_w, {C, FF}), Tensor(), N, FF, C, false, false, false);
      adapt_backward(l, BlockMatrix::mlp_out, dbranch, mlp_act, dmlp_in);
      be_.gelu_backward(dmlp_in, mlp_in, dmlp_in, N * FF);
    } else {
      be_.matmul(dmlp_act, dbranch, P(w, o.mlp_out_w, {C, FF}), Tensor(), N, FF, C, false, false, false);
      adapt_backward(l, BlockMatrix::mlp_out, dbranch, mlp_act, dmlp_act);
      be_.swiglu_backward(dmlp_in, dmlp_act, mlp_in, N, (int)FF, glu);
    }
    if (grads) be_.matmul(P(g, o.mlp_in_w, {FI, C}), dmlp_in, ln2, Tensor(), FI, C, N, true, false, true);
    if (grads && o.mlp_in_b >= 0) be_.bias_backward(P(g, o.mlp_in_b, {FI}), dmlp_in, N, FI);
    be_.matmul(dnorm, dmlp_in, P(w, o.mlp_in_w, {FI, C}), Tensor(), N, C, FI, false, false, false);
    adapt_backward(l, BlockMatrix::mlp_in, dmlp_in, ln2, dnorm);
  }
  norm_backward(xm, a.ln2_mean, a.ln2_rstd, w, g, o.ln2_w, o.ln2_b);

  // attention: resid_mid = x + dropout(attn_out W_proj^T + b_proj)
  dbranch = branch_grad(kAttnOut);
  if (sandwich) dbranch = sandwich_backward(dbranch, a.attn_branch, a.attn_branch_rstd, w, g, o.post_attn_norm_w);
  if (grads) be_.matmul(P(g, o.attn_proj_w, {C, Q}), dbranch, attn_out, Tensor(), C, Q, N, true, false, true);
  if (grads && o.attn_proj_b >= 0) be_.bias_backward(P(g, o.attn_proj_b, {C}), dbranch, N, C);
  be_.matmul(dattn, dbranch, P(w, o.attn_proj_w, {C, Q}), Tensor(), N, Q, C, false, false, false);
  adapt_backward(l, BlockMatrix::attn_proj, dbranch, attn_out, dattn);
  be_.attention_backward(dqkv, dattn, qkv, attn_out, lse, B_, T, NH, NKV, hs, dropout_for(l, kAttnProbs, cfg_.attn_pdrop),
                         packed_docs(), cfg_.window(l), scores_);
  if (rope) be_.rope_backward(dqkv, B_, T, NH, NKV, hs, rope_for(l), packed_tensor(positions_));
  if (qk_norm) {  // dqkv in place: from the normed q and k back to the projections' output
    Tensor dwq = P(g, o.q_norm_w, {hs}), dwk = P(g, o.k_norm_w, {hs});
    if (!grads) {  // frozen: into the discarded scratch
      be_.zero(frozen_norm_grad_.data, frozen_norm_grad_.nbytes());
      dwq = frozen_norm_grad_.view(0, {hs}), dwk = frozen_norm_grad_.view(hs, {hs});
    }
    be_.head_rmsnorm_backward(dqkv, dwq, dwk, dqkv, rows(a.qkv_pre, QKV), P(w, o.q_norm_w, {hs}), P(w, o.k_norm_w, {hs}),
                              Tensor(a.qk_rstd.data, DType::f32, {N, NH + NKV}), N, NH, NKV, hs, cfg_.family.norm_offset);
  }
  if (grads) be_.matmul(P(g, o.qkv_w, {QKV, C}), dqkv, ln1, Tensor(), QKV, C, N, true, false, true);
  // after RoPE's inverse: the bias came before RoPE
  if (grads && o.qkv_b >= 0) be_.bias_backward(P(g, o.qkv_b, {QKV}), dqkv, N, QKV);
  be_.matmul(dnorm, dqkv, P(w, o.qkv_w, {QKV, C}), Tensor(), N, C, QKV, false, false, false);
  adapt_backward(l, BlockMatrix::qkv, dqkv, ln1, dnorm);
  norm_backward(rows(resid_[l], C), a.ln1_mean, a.ln1_rstd, w, g, o.ln1_w, o.ln1_b);
}

void Transformer::forward(UnitStore& store, const int32_t* tokens, const int32_t* targets, int seq_len,
                          Tensor loss_sum, const TrainPass* train, const int32_t* doc_start) {
  LLMT_CHECK(!train || targets, "forward: gradients need targets");
  LLMT_CHECK(!targets || loss_sum.data, "forward: a loss needs a loss_sum tensor");
  LLMT_CHECK(seq_len >= 0 && seq_len <= T_max_, "forward: sequence length %d exceeds the %d the model was sized for",
             seq_len, T_max_);
  cur_T_ = seq_len > 0 ? seq_len : T_max_;
  train_ = nullptr;
  if (train) train_copy_ = *train, train_ = &train_copy_;
  const int T = cur_T_;
  const int64_t N = (int64_t)B_ * T;
  be_.copy_from_host(tokens_.data, tokens, sizeof(int32_t) * N);
  if (targets) be_.copy_from_host(targets_.data, targets, sizeof(int32_t) * N);
  packed_ = doc_start != nullptr;
  if (packed_) {  // positions restart at each document
    std::vector<int32_t> pos((size_t)N);
    doc_count_ = 0;
    for (int64_t i = 0; i < N; i++) {
      const int t = (int)(i % T), d = doc_start[i];
      LLMT_CHECK(d >= 0 && d <= t && (t == 0 ? d == 0 : d == t || d == doc_start[i - 1]),
                 "forward: token %lld (position %d of its row) has document start %d: documents must be contiguous "
                 "runs starting at or before the token", (long long)i, t, d);
      pos[(size_t)i] = t - d;
      doc_count_ += d == t;
    }
    be_.copy_from_host(doc_start_.data, doc_start, sizeof(int32_t) * N);
    be_.copy_from_host(positions_.data, pos.data(), sizeof(int32_t) * N);
    int len = 0;  // longrope: the set by the largest position, as transformers' with position_ids
    for (int32_t p : pos) len = std::max(len, p + 1);
    pick_rope_factors(len);
  } else {
    pick_rope_factors(T);
  }
  const bool chunked = head_rows_ < N;
  LLMT_CHECK(!chunked || targets, "forward: the LM head runs %lld of the %lld tokens at a time (--logits_chunk_tokens), "
             "so a pass without targets, whose logits would be read, cannot keep them", (long long)head_rows_,
             (long long)N);
  head_loss_ = targets ? loss_sum : Tensor();  // the head adds the losses
  moe_.begin_pass(be_, cfg_, targets != nullptr);
  forward_units(store);
  moe_.finish_forward(be_, cfg_, N, train ? train->aux_scale : 1.0f);
  head_loss_ = Tensor();
  have_grad_ = train != nullptr;
}

void Transformer::forward_units(UnitStore& store) {
  const int T = cur_T_;
  const int64_t N = (int64_t)B_ * T, C = cfg_.d_model, V = cfg_.vocab_size;
  const RootOffsets& r = layout_.root;
  Tensor tok(tokens_.data, DType::i32, {N}), x0 = rows(resid_[0], C);
  Tensor root = acquire(store, 0);
  prefetch(store, 1 % (cfg_.n_layer + 1));
  Tensor wte = adapters_ ? adapters_->embed_weight() : Tensor();  // a trainable copy, the base's frozen
  if (!wte.data) wte = P(root, r.wte, {V, C});
  if ((kv_on_ || packed_) && r.wpe >= 0) {  // wpe at each row's own position, added to wte (one rounding either way)
    Tensor wpe_rows = rows(dnorm_, C);  // backward's scratch, free until backward
    be_.embedding_forward(x0, tok, wte, Tensor(), B_, T, (int)C, (int)V);
    be_.embedding_forward(wpe_rows, Tensor(positions_.data, DType::i32, {N}), P(root, r.wpe, {cfg_.max_seq_len, C}),
                          Tensor(), B_, T, (int)C, cfg_.max_seq_len);
    be_.add(x0, x0, wpe_rows, N * C);
  } else {
    be_.embedding_forward(x0, tok, wte, P(root, r.wpe, {cfg_.max_seq_len, C}), B_, T, (int)C, (int)V);
  }
  if (cfg_.family.scaled_embeddings) be_.scale(x0, embed_scale_, N * C);
  be_.dropout(x0, B_, T, (int)C, dropout_for(-1, kEmbd, cfg_.embd_pdrop));
  release(store, 0);
  for (int l = 0; l < cfg_.n_layer; l++) {
    Tensor w = acquire(store, 1 + l);
    prefetch(store, (2 + l) % (cfg_.n_layer + 1));  // the next block, or the root for the head
    block_forward(l, w);
    release(store, 1 + l);
  }
  root = acquire(store, 0);
  norm_forward(rows(lnf_, C), lnf_mean_, lnf_rstd_, rows(resid_[cfg_.n_layer], C), root, r.lnf_w, r.lnf_b);
  head_forward(root);
  release(store, 0);
}

// The chunk at rows [c0, c0 + n) of a [N, cols] buffer.
static Tensor chunk_rows(const Tensor& t, int64_t c0, int64_t n, int64_t cols) {
  return Tensor((char*)t.data + (size_t)(c0 * cols) * dtype_size(t.dtype), t.dtype, {n, cols});
}

// The head over chunks of head_rows_ rows (one chunk unless --logits_chunk_tokens): logits, and with
// targets the loss. A single chunk in training leaves its dlogits in place for backward; chunks keep
// only the losses, and backward recomputes them.
void Transformer::head_forward(Tensor root) {
  const int64_t N = (int64_t)B_ * cur_T_, C = cfg_.d_model, V = cfg_.vocab_size;
  Tensor w = adapters_ ? adapters_->head_weight() : Tensor(), lg(logits_.data, dt_, {head_rows_, V_pad_});
  if (!w.data) w = P(root, layout_.root.lm_head, {V, C});
  const bool keep_dlogits = train_ && head_rows_ >= N;
  for (int64_t c0 = 0; c0 < N; c0 += head_rows_) {
    const int64_t n = std::min(head_rows_, N - c0);
    be_.matmul(lg, chunk_rows(lnf_, c0, n, C), w, Tensor(), n, V, C, false, true, false, 0, V_pad_);
    if (head_loss_.data)
      be_.cross_entropy(head_loss_, keep_dlogits ? lg : Tensor(), lg, chunk_rows(targets_, c0, n, 1), n, (int)V,
                        keep_dlogits ? train_->grad_scale : 0.0f, V_pad_, cfg_.final_softcap);
    // what reads the logits (evaluation, generation) sees them capped, as transformers returns them;
    // the loss capped its own copy and training's dlogits are taken with respect to the raw ones
    if (cfg_.final_softcap > 0.0f && !keep_dlogits) be_.logit_softcap(lg, n, (int)V, cfg_.final_softcap, V_pad_);
  }
}

// The head's weight gradient and the final norm's input gradient, chunk by chunk from dlogits (rows
// V_pad_ apart). Chunked, each chunk's logits come again first, its dlogits in place (its loss
// discarded: forward counted it).
void Transformer::head_backward(Tensor root, Tensor groot) {
  const int64_t N = (int64_t)B_ * cur_T_, C = cfg_.d_model, V = cfg_.vocab_size;
  Tensor w = adapters_ ? adapters_->head_weight() : Tensor(), dw = P(groot, layout_.root.lm_head, {V, C});
  if (w.data) dw = adapters_->head_grad();  // a trainable copy of the head (the base's stays frozen)
  else w = P(root, layout_.root.lm_head, {V, C});
  Tensor lg(logits_.data, dt_, {head_rows_, V_pad_});
  const bool recompute = head_rows_ < N;
  for (int64_t c0 = 0; c0 < N; c0 += head_rows_) {
    const int64_t n = std::min(head_rows_, N - c0);
    Tensor lnf = chunk_rows(lnf_, c0, n, C);
    if (recompute) {
      be_.matmul(lg, lnf, w, Tensor(), n, V, C, false, true, false, 0, V_pad_);
      be_.cross_entropy(discarded_loss_, lg, lg, chunk_rows(targets_, c0, n, 1), n, (int)V, train_->grad_scale,
                        V_pad_, cfg_.final_softcap);
    }
    if (dw.data) be_.matmul(dw, lg, lnf, Tensor(), V, C, n, true, false, true, V_pad_);
    be_.matmul(chunk_rows(dnorm_, c0, n, C), lg, w, Tensor(), n, C, V, false, false, false, V_pad_);
  }
}

void Transformer::backward(UnitStore& store) {
  LLMT_CHECK(have_grad_, "backward called without a training forward");
  have_grad_ = false;
  const int T = cur_T_;
  const int64_t N = (int64_t)B_ * T, C = cfg_.d_model, V = cfg_.vocab_size;
  const RootOffsets& r = layout_.root;

  // head: logits = norm_f(resid[L]) W_head^T; logits_ holds dloss/dlogits
  Tensor root = acquire(store, 0);
  prefetch(store, cfg_.n_layer);
  Tensor groot = store.grads(0);  // empty: the root is frozen
  Tensor dres = rows(dres_, C);
  head_backward(root, groot);
  be_.zero(dres.data, dres.nbytes());
  norm_backward(rows(resid_[cfg_.n_layer], C), lnf_mean_, lnf_rstd_, root, groot, r.lnf_w, r.lnf_b);
  release(store, 0);

  for (int l = cfg_.n_layer - 1; l >= 0; l--) {
    Tensor w = acquire(store, 1 + l);
    if (l > 0) prefetch(store, l);
    if (checkpointing_) {  // recompute what backward needs from the kept input
      recomputing_ = true;
      block_forward(l, w);
      recomputing_ = false;
    }
    block_backward(l, w, store.grads(1 + l));
    release(store, 1 + l);
    grads_done(store, 1 + l);
  }

  // the embedding's gradient needs no parameters, only the root's gradient buffer (none when frozen),
  // or the adapters' copy's
  Tensor gwte = adapters_ ? adapters_->embed_grad() : Tensor(), gwpe = P(groot, r.wpe, {cfg_.max_seq_len, C});
  if (!gwte.data) gwte = P(groot, r.wte, {V, C});
  if (gwte.data || gwpe.data) {
    be_.dropout(dres, B_, T, (int)C, dropout_for(-1, kEmbd, cfg_.embd_pdrop));
    if (cfg_.family.scaled_embeddings) be_.scale(dres, embed_scale_, N * C);
    if (packed_ && r.wpe >= 0) {  // wpe's rows at each token's position within its document
      if (gwte.data)
        be_.embedding_backward(gwte, Tensor(), dres, Tensor(tokens_.data, DType::i32, {N}), B_, T, (int)C);
      if (gwpe.data)
        be_.embedding_backward(gwpe, Tensor(), dres, Tensor(positions_.data, DType::i32, {N}), B_, T, (int)C);
    } else {
      be_.embedding_backward(gwte, gwpe, dres, Tensor(tokens_.data, DType::i32, {N}), B_, T, (int)C);
    }
  }
  grads_done(store, 0);
  store.backward_done();
  if (adapters_) adapters_->backward_done();
}

void init_unit_params(const ModelConfig& cfg, const UnitLayout& unit, int unit_index, uint64_t seed, float* host) {
  init_unit_range(cfg, unit, unit_index, seed, 0, unit.numel, host);
}

void init_unit_range(const ModelConfig& cfg, const UnitLayout& unit, int unit_index, uint64_t seed, int64_t lo,
                     int64_t hi, float* out) {
  LLMT_CHECK(0 <= lo && lo <= hi && hi <= unit.numel, "init_unit_range: [%lld, %lld) outside the unit's %lld elements",
             (long long)lo, (long long)hi, (long long)unit.numel);
  const uint64_t s0 = stream_state(seed, (uint64_t)unit_index);
  const float std_dev = cfg.init_std;  // initializer_range
  const float proj_std = std_dev / std::sqrt(2.0f * cfg.n_layer);
  const BlockOffsets out_proj = cfg.family.scaled_out_init ? make_layout(cfg).block : BlockOffsets();
  std::fill(out, out + (hi - lo), 0.0f);  // gaps between parameters, if any
  uint64_t draws = 0;  // normals drawn by the unit's earlier weights (in params order)
  for (const ParamSpec& p : unit.params) {
    // the unit's elements [a, b) of this parameter fall in the range: out[e - lo]
    const int64_t n = p.numel(), a = std::max(lo, p.offset), b = std::min(hi, p.offset + n);
    if (p.shape.size() == 1) {  // biases zero, norm weights one (as norm_offset + w: Gemma's 0); no draws
      const bool is_norm = p.hf_name.find("bias") == std::string::npos;
      for (int64_t e = a; e < b; e++) out[e - lo] = is_norm ? 1.0f - cfg.family.norm_offset : 0.0f;
      continue;
    }
    const bool scaled = cfg.family.scaled_out_init && unit_index > 0 &&
                        (p.offset == out_proj.attn_proj_w || p.offset == out_proj.mlp_out_w);
    const double s = scaled ? proj_std : std_dev;
    const uint64_t k0 = draws - (uint64_t)p.offset;  // element e draws normal k0 + e
#pragma omp parallel for schedule(static)
    for (int64_t e = a; e < b; e++) out[e - lo] = (float)(normal_at(s0, k0 + (uint64_t)e) * s);
    draws += (uint64_t)n;
  }
}

}  // namespace llmt
