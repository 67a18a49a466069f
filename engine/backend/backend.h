// The Backend interface: memory, the compute stream and its events, and the one op set every model
// is built from. The CPU backend (kernels/cpu) implements it with OpenMP and oneDNN; the CUDA
// backend (kernels/cuda) with its kernels behind the same calls.
// Models and the trainer never see which.
//
// Dtypes. A backend computes in one compute dtype, compute_dtype(): f32, or bf16 for mixed
// precision. "act" below means a tensor in that dtype: activations, their gradients, the gathered
// parameters. Fixed whatever the compute dtype: parameter gradients (the buffers backward adds
// into) f32; norm statistics (mean, rstd) and the attention's log-sum-exp f32; device scalars
// (loss sum, sum of squares) f64; token ids and targets i32. Inside every op the arithmetic is
// fp32: a bf16 value is widened on load and rounded once, to nearest even, on store; matmuls
// accumulate in fp32.
//
// Streams. Ops, copies and memory work run in order on the backend's compute stream. copy_to_host
// returns when the data is on the host. Bad input only a device sees (a token id or target outside
// the vocabulary) is thrown as llmt::Error by the op or, on a device, by the next synchronize or
// copy_to_host. An Event marks the stream's work so far: a collective that
// must not start before some compute (or a buffer that must not be reused before its last reader)
// waits on one. On the CPU everything runs in program order and events are trivial.
//
// Conventions for every op:
//  - Shapes are given explicitly (N rows = B*T tokens, C channels); tensors are row-major.
//  - "+=" in a comment means the op accumulates into that output; "=" means it overwrites.
//  - Backward ops that accumulate let gradients from several paths (residual stream, tied
//    embeddings, micro-batches) meet in one buffer without extra copies.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "engine/core/tensor.h"

namespace llmt {

// The activation of a gated MLP's gate (Backend::swiglu_*): silu (SwiGLU) or the tanh GELU (GeGLU).
enum class GluAct { silu, gelu_tanh };

// Position of a work item on the compute stream; see "Streams" above.
class Event {
 public:
  virtual ~Event() = default;
  virtual void synchronize() = 0;  // the host waits until the marked work is done
};

// Inverted dropout with a counter-based mask: element e of site `site` keeps its value (scaled by
// 1/(1-p)) when hash(key, row, e) lands above p. `key` is fixed by (seed, step, layer, site) and
// `row0` is the global index of the batch's first sequence, so the mask depends only on which
// sequence, position and element it is: every world size, micro-batch split and strategy draws the
// same masks, and a resumed run the same as an unbroken one. p = 0 is no dropout.
struct Dropout {
  float p = 0.0f;
  uint64_t key = 0;
  int64_t row0 = 0;   // global sequence index of the batch's row 0
  bool active() const { return p > 0.0f; }
};

// How attention turns q . k into the scores its softmax takes (Gemma 2 and 3): s = scale * (q . k),
// scale 0 meaning 1/sqrt(hs) (Gemma's query_pre_attn_scalar^-0.5 otherwise); then, with softcap > 0,
// s = softcap * tanh(s / softcap) (Gemma 2's attn_logit_softcapping), before the masks and the
// softmax, as transformers' eager_attention_forward. The default is every other family's attention.
struct AttnScores {
  float scale = 0.0f;    // > 0, or 0: 1/sqrt(hs)
  float softcap = 0.0f;  // > 0, or 0: none
  bool capped() const { return softcap > 0.0f; }
  float scale_for(int hs) const { return scale > 0.0f ? scale : 1.0f / std::sqrt((float)hs); }
};

// Packed documents (--packing). start (i32 [B*T]): token (b, t) belongs to the document that begins
// at position start[b*T + t] <= t of its row (documents are contiguous: start[t] is t or start[t-1]).
// count: how many documents begin in the batch (the tokens with start[b*T + t] == t, at least one a
// row): the host knows it when it packs, and a library launched from the host needs it without
// reading the device (cuDNN's batch of documents). No start data: one document a row.
struct PackedDocs {
  Tensor start;
  int64_t count = 0;
  bool active() const { return start.data != nullptr; }
};

// RoPE's frequencies: inv_freq[i] = theta^(-2i/d) over the d rotated channels of a head, then
// rope_scaling as transformers computes it (modeling_rope_utils): linear divides every frequency by
// factor; llama3 divides the low frequencies (wavelength above original_max / low_freq_factor) by
// factor, keeps the high ones (below original_max / high_freq_factor) and blends in between;
// longrope (Phi-3) divides frequency i by ext[i], the short or the long factor set (the model picks
// the set for each pass; the kernels see one), and multiplies cos and sin by attention_factor.
// Partial rotary (Phi-4-mini): only the first rotary_dim channels of each head rotate (rotate_half
// within them), the rest pass through; rotary_dim 0 means the whole head. Kernels get it by value,
// so the factors are a bounded array.
struct RopeSpec {
  enum Scaling { none = 0, linear = 1, llama3 = 2, longrope = 3 };
  static constexpr int kMaxFactors = 128;  // rotary_dim / 2 at most (heads of up to 256 channels)
  float theta = 10000.0f;
  int scaling = none;
  float factor = 1.0f, low_freq_factor = 1.0f, high_freq_factor = 4.0f, original_max = 8192.0f;
  int rotary_dim = 0;
  float attention_factor = 1.0f;  // longrope: cos and sin are multiplied by it (1 otherwise)
  float ext[kMaxFactors] = {};    // longrope: rotary_dim / 2 factors
};

// The elements of an adamw call that take weight decay: `count` sorted, disjoint spans [begin, end).
// A kernel gets them by value, so their number is bounded; a unit with more (none today: a block
// has a few runs of weight matrices) is stepped in several calls (engine/optim/adamw.cpp).
struct DecaySpans {
  static constexpr int kMax = 16;
  int count = 0;
  int64_t begin[kMax] = {}, end[kMax] = {};
  static DecaySpans all(int64_t n) {  // every element decays (n > 0), or none (n == 0)
    DecaySpans d;
    if (n > 0) d.count = 1, d.end[0] = n;
    return d;
  }
  bool decays(int64_t i) const {
    for (int s = 0; s < count; s++)
      if (i >= begin[s] && i < end[s]) return true;
    return false;
  }
};

// Work a backend has done since it was made, for llmt bench (issue 21's launches and host syncs
// per step). ops: op entries that ran (the CPU's launches: one per op). launches: on the CUDA
// backend every kernel launch, a cuBLASLt matmul as one. host_syncs: the times the host waited for
// the stream (synchronize, copy_to_host, Event::synchronize; on a device also alloc and a scratch
// buffer growing). allocs: alloc() calls and scratch buffers growing (a training step makes none).
struct BackendCounters {
  int64_t ops = 0;
  int64_t launches = 0;
  int64_t host_syncs = 0;
  int64_t allocs = 0;
};

// The op set has two layers. The public op below is one non-virtual entry per op (backend.cpp):
// it checks the arguments against the conventions above (dtypes, that each tensor holds what the
// explicit sizes need, non-null data, sizes in range) and throws llmt::Error naming the backend,
// the op, the argument and what was expected; then it counts the op, times it when op profiling
// is on (llmt bench) and calls the backend's protected <op>_impl. An implementation may therefore
// take its arguments as checked and only checks what only it can see (token ids on a device).
// An impl never calls a public op of its backend (that would count and time it twice); it calls
// another impl.
// The vocabulary padding of a GPU backend's logits rows (Backend::vocab_pad; llmt plan for --device
// cuda): 128 elements, as llm.c pads GPT-2's 50257 to 50304.
constexpr int kDeviceVocabPad = 128;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "cuda"
  virtual int threads() const = 0;       // CPU threads the backend's ops use
  virtual DType compute_dtype() const = 0;
  virtual bool is_host_memory() const = 0;  // alloc() memory is addressable by the host
  // The logits' row stride is the vocabulary rounded up to a multiple of this (1: no padding), so
  // that a device's LM-head matmuls and loss see 16-byte aligned rows (50257 -> 50304 for GPT-2).
  // The padding columns are never written or read: no parameter, checkpoint or export changes.
  virtual int vocab_pad() const { return 1; }  // kDeviceVocabPad on a GPU
  virtual void* native_stream() = 0;        // the compute stream (cudaStream_t), nullptr on the CPU
  virtual std::unique_ptr<Event> make_event() = 0;
  virtual void record(Event& e) = 0;  // e marks the compute stream's work issued so far
  virtual void wait(Event& e) = 0;    // work issued afterwards starts after e's work

  // ---- memory ----
  virtual void* alloc(size_t bytes) = 0;  // zero-filled, 64-byte aligned
  virtual void release(void* p) = 0;
  void zero(void* p, size_t bytes);  // timed as "gradient zeroing"
  virtual void copy_from_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;  // returns with the data on the host
  void copy(void* dst, const void* src, size_t bytes);  // timed as "copies"
  virtual void synchronize() = 0;  // the host waits for all issued work
  // The memory alloc() draws from when it is not the host's (a GPU's): free and total bytes, as the
  // driver reports them now. False on the CPU.
  virtual bool device_memory(size_t* free_bytes, size_t* total_bytes) {
    (void)free_bytes;
    (void)total_bytes;
    return false;
  }

  // ---- parameters held ----
  // A store says that `params` (a unit's parameters in the compute dtype) will change only through
  // this backend's adamw until params_released(params.data): meanwhile a backend may keep what it
  // derives from them, and its adamw keeps that current. The CPU keeps an fp32 mirror of the bf16
  // weights its widened matmuls read (bf16_matmul_choice.h), so a weight is widened once while held,
  // not at every matmul, and AdamW writes the mirror beside the bf16 values. Nothing, by default.
  virtual void params_held(const Tensor& params) { (void)params; }
  virtual void params_released(const void* data) { (void)data; }

  // ---- counters and op profiling (llmt bench) ----
  virtual BackendCounters counters() const { return counters_; }
  // While on, every op waits for the stream before and after it and adds its milliseconds to its
  // category (matmul, attention, loss, ...): where a step's time goes.
  void profile_ops(bool on) { profiling_ = on; }
  void reset_op_ms() { op_ms_.clear(); }
  const std::map<std::string, double>& op_ms() const { return op_ms_; }

  // ---- dense ----
  // out[M,N] (= or +=) op(a) @ op(b) + bias[N]
  //   op(a): a stored [M,K], or [K,M] with trans_a;  op(b): b stored [K,N], or [N,K] with trans_b.
  //   a, b: act; bias: b's dtype, or data == nullptr; out: act, or f32 (parameter gradients).
  //   accumulate adds to out instead of overwriting it (one rounding of out). M or N = 0: nothing.
  //   ld_a, ld_out: the row strides of a and out as stored (0: dense, a's stored columns and N), for
  //   the padded logits (vocab_pad); elements between a row's end and the next row are not touched.
  void matmul(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K, bool trans_a,
              bool trans_b, bool accumulate, int64_t ld_a = 0, int64_t ld_out = 0);
  // dbias[N] (f32) += sum over rows of dout[M,N] (act)
  void bias_backward(Tensor dbias, Tensor dout, int64_t M, int64_t N);
  // A residual connection's linear layer: out[M,N] (=) residual[M,N] + a[M,K] @ b[N,K]^T + bias[N],
  // the sum rounded once (as matmul with accumulate onto a copy of residual). All act; bias b's
  // dtype or data == nullptr; out must not overlap residual. On a GPU one cuBLASLt call (C != D).
  void matmul_residual(Tensor out, Tensor residual, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K);
  // A linear layer into GELU (tanh form), as one op so that a GPU runs it as one cuBLASLt call
  // (epilogue GELU_AUX_BIAS): pre[M,N] (=) a[M,K] @ b[N,K]^T + bias[N], out[M,N] (=) gelu(pre).
  // a, b, pre, out: act; bias: b's dtype, or data == nullptr. pre is kept for matmul_dgelu.
  void matmul_gelu(Tensor out, Tensor pre, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K);
  // The gradient back through that GELU from the next linear layer (cuBLASLt's DGELU epilogue):
  // dpre[M,N] (=) (dout[M,K] @ b[K,N]) * gelu'(pre[M,N]). All act.
  void matmul_dgelu(Tensor dpre, Tensor dout, Tensor b, Tensor pre, int64_t M, int64_t N, int64_t K);

  // ---- embeddings ----
  // out[B*T,C] (act) = wte[token] (+ wpe[t] when wpe.data != nullptr). Token ids must lie in [0, V).
  void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C, int V);
  // dwte[token] (f32, [V, C]) += dout (act); dwpe[t] (f32) += dout (when dwpe.data != nullptr). A token id
  // outside [0, V) is an error (thrown, or reported at the next synchronize) and writes nothing outside dwte.
  void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C);

  // ---- norms ----
  // out = (x - mean) * rstd * w + b over each row of C; mean[N] and rstd[N] (f32) are saved for backward.
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, int64_t N, int C,
                         float eps);
  // dx (act) += ..., dw (f32) += ..., db (f32) += ...
  void layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean, Tensor rstd,
                          int64_t N, int C);
  // out = x * rstd * (w_offset + w), rstd = 1/sqrt(mean(x^2) + eps) (f32) saved for backward; the
  // product in f32, rounded once. w_offset 1 is Gemma's (1 + weight) norm: the offset is added in f32,
  // so a small w is not lost to a bf16 1 + w.
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps,
                       float w_offset = 0.0f);
  // dx (act) += ... (through w_offset + w), dw (f32) += ... (the offset changes nothing there)
  void rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int64_t N, int C,
                        float w_offset = 0.0f);

  // RMSNorm over each hs-wide head of q and of k in rows [q (NH*hs) | k (NKV*hs) | v (NKV*hs)] (as
  // attention's qkv), before RoPE (Qwen3's q_norm and k_norm): out[N, (NH+2*NKV)*hs] (=) in with each
  // q head normalised with wq[hs] and each k head with wk[hs], the v part copied; rstd[N, NH+NKV]
  // (f32) saved for backward. out must not overlap in. The weights are (w_offset + w), as rmsnorm's
  // (Gemma 3's q_norm and k_norm: 1).
  void head_rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor wq, Tensor wk, int64_t N, int NH, int NKV,
                            int hs, float eps, float w_offset = 0.0f);
  // din (=) dout back through it (the v part copied), dwq and dwk (f32) +=. din may be dout itself (in
  // place), but must not overlap it otherwise.
  void head_rmsnorm_backward(Tensor din, Tensor dwq, Tensor dwk, Tensor dout, Tensor in, Tensor wq, Tensor wk,
                             Tensor rstd, int64_t N, int NH, int NKV, int hs, float w_offset = 0.0f);

  // ---- activations (act) ----
  // GELU, tanh form (gelu_new). out = gelu(x); dx = dout * gelu'(x) (dx may alias dout).
  void gelu_forward(Tensor out, Tensor x, int64_t n);
  void gelu_backward(Tensor dx, Tensor x, Tensor dout, int64_t n);
  // A gated MLP's activation over rows of gate_up[N, 2I] = [gate | up]: out[N,I] = act(gate) * up,
  // act silu (SwiGLU) or the tanh GELU (GeGLU, Gemma's gelu_pytorch_tanh). dgate_up (=) from dout[N,I].
  void swiglu_forward(Tensor out, Tensor gate_up, int64_t N, int I, GluAct act = GluAct::silu);
  void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I, GluAct act = GluAct::silu);
  // x[B*T, C] (=) x * mask / (1 - p) in place, element (b, t, c) kept as dropout_keep(d.key,
  // dropout_row(d.row0 + b, t), c, d.p) says; 0 <= p < 1. The backward of a dropout is the same call
  // on the gradient.
  void dropout(Tensor x, int B, int T, int C, const Dropout& d);

  // ---- attention (act, lse f32) ----
  // qkv rows are [q (NH*hs) | k (NKV*hs) | v (NKV*hs)] for each of the B*T tokens; hs is even.
  // RoPE in place on the q and k parts, Hugging Face rotate_half layout, row (b, t) at position t, or
  // at positions[b*T + t] (i32 [B*T], >= 0) when given (packed documents, generation): the same
  // angles either way. inv_freq[i] = rope_inv_freq(rope, i, hs); cos and sin times
  // rope.attention_factor; only the first rope_dim(rope, hs) channels of a head rotate (the rest
  // are left as they are). rope_backward applies the transposed map to dq and dk in place.
  void rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                    Tensor positions = Tensor());
  void rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                     Tensor positions = Tensor());
  // Causal self-attention with grouped-query heads (head h reads kv head h / (NH/NKV); NH % NKV == 0),
  // scores as `scores` says (AttnScores: the scale, 1/sqrt(hs) by default, and Gemma 2's soft cap),
  // dropout on the probabilities as `drop` says (its row index counts sequences).
  // out[B*T, NH*hs] (=); lse[B,NH,T] (=) keeps each query row's log-sum-exp of the scores (scaled, and
  // capped when softcap > 0): all that backward needs to recompute the probabilities, so no T x T
  // buffer exists.
  // docs (PackedDocs, or none): a token attends only keys of its own document, from the document's
  // start to itself, never across a boundary.
  // window (>= 0; 0 = none): a sliding window of `window` keys, the query's own included: query t
  // attends key u only when t - window < u <= t (transformers' sliding_window, masking_utils'
  // sliding_window_overlay: kv_idx > q_idx - sliding_window), intersected with the document.
  void attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int NH, int NKV, int hs,
                         const Dropout& drop, const PackedDocs& docs = PackedDocs(), int window = 0,
                         const AttnScores& scores = AttnScores());
  // dqkv (=) from dout, given the forward's qkv, out and lse (FlashAttention-2's backward); docs,
  // window and scores as the forward's (with a soft cap, d(score) takes the factor 1 - tanh^2).
  void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int NH, int NKV,
                          int hs, const Dropout& drop, const PackedDocs& docs = PackedDocs(), int window = 0,
                          const AttnScores& scores = AttnScores());

  // ---- generation: a KV cache (llmt generate; nothing here goes backward) ----
  // Tn new tokens of each of B sequences against a KV cache k_cache, v_cache (act, [B, NKV, cap, hs]),
  // which holds positions 0 .. p0-1 of each sequence. First appends the new tokens' k and v (their
  // qkv rows, RoPE applied) at positions p0 .. p0+Tn-1; then out[b*Tn + i, NH*hs] (=) is query i
  // (position p0 + i) attending causally, scores as attention_forward's, grouped-query heads as it,
  // over positions key_start[b] .. p0 + i (key_start: i32 [B], the sequence's first real token after
  // left padding). A query before key_start[b] is padding: it attends nothing and gets zeros.
  // window (0 = none) as attention_forward's, by cache position: from max(key_start[b], p0 + i -
  // window + 1); the cache keeps every position all the same.
  void attention_kv(Tensor out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor key_start, int B, int Tn, int p0,
                    int cap, int NH, int NKV, int hs, int window = 0, const AttnScores& scores = AttnScores());

  // ---- elementwise (f32 or bf16) ----
  void add(Tensor out, Tensor a, Tensor b, int64_t n);  // out = a + b, one dtype (out may alias a or b)
  void accumulate(Tensor dst, Tensor src, int64_t n);   // dst += src (any float dtypes)
  void scale(Tensor x, float s, int64_t n);             // x *= s

  // ---- loss ----
  // Softmax cross-entropy over rows of logits[N,V] (act) with targets[N] (i32; kIgnoreIndex = ignored),
  // in fp32. loss_sum[1] (f64, on the backend) += the sum of the per-row losses over rows not ignored.
  // When dlogits.data != nullptr: dlogits (act, =) grad_scale * (softmax - onehot), zero on ignored
  // rows; dlogits may alias logits. A target outside [0, V) other than kIgnoreIndex is an error.
  // ld: the row stride of logits and dlogits (0: V); the columns past V are not touched.
  // softcap > 0 (Gemma 2's final_logit_softcapping): the loss is taken over y = softcap *
  // tanh(logits / softcap), and dlogits is the gradient with respect to the logits before the cap,
  // grad_scale * (softmax(y) - onehot) * (1 - (y / softcap)^2): the cap's forward and backward in
  // the loss's one pass, so the capped logits need no buffer of their own. y stays fp32 (transformers
  // rounds it to the logits' dtype first; the difference is within a bf16 rounding of a logit).
  void cross_entropy(Tensor loss_sum, Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V,
                     float grad_scale, int64_t ld = 0, float softcap = 0.0f);
  // x[N, V] (act, rows ld apart, 0: V) (=) cap * tanh(x / cap) in place, cap > 0: the capped logits
  // for what reads them outside the loss (generation, evaluation's outputs). Training's backward
  // needs no op of its own: cross_entropy's softcap takes it.
  void logit_softcap(Tensor x, int64_t N, int V, float cap, int64_t ld = 0);

  // ---- optimizer and reductions ----
  // AdamW as torch.optim.AdamW on f32 p, g, m, v: p *= 1 - lr*wd for the elements inside `decay`'s
  // spans (the rest, biases and norm weights, take no decay); m, v updated with g*grad_scale;
  // bias-corrected step t (1-based). When p_compute.data != nullptr it receives p's rounding to bf16
  // (the compute copy of the shard). One call steps a unit's whole shard.
  void adamw(Tensor p, Tensor p_compute, Tensor g, Tensor m, Tensor v, int64_t n, float lr, float beta1, float beta2,
             float eps, float weight_decay, const DecaySpans& decay, int t, float grad_scale);
  // out[1] (f64, on the backend) += sum of x[i]^2 (x f32)
  void sum_squares(Tensor out, Tensor x, int64_t n);

  // ---- dtype conversion ----
  void convert(Tensor out, Tensor in, int64_t n);  // f32 <-> bf16 (round to nearest even), or a copy

  // ---- mixture of experts (models/moe.h): routing, tokens grouped by expert, each expert's products ----
  // N tokens routed to k of E experts. A token's k choices are its slots; assignment t k + s is token
  // t's slot s; grouped by expert, the N k assignments are rows: expert e's rows are
  // [offsets[e], offsets[e+1]), in token order (stable), offsets[E] = N k (dropless).
  // Routing as transformers' TopKRouter: probs[N,E] (f32, =) softmax(logits[N,E] (act)) in fp32;
  // topk_idx[N,k] (i32, =) the k largest, largest first, ties broken as torch.topk on the CPU breaks them
  // (libstdc++'s nth_element and sort over (value, index) pairs, or partial_sort when 64 k <= E);
  // topk_w[N,k] (f32, =) their probabilities, divided by their sum when norm_topk, then rounded to the
  // compute dtype when round_w (Qwen's .to(router_logits.dtype)). stats[2E] (f32, +=; no data: none):
  // the load-balancing loss's sums, [0, E) the slots each expert was chosen for, [E, 2E) each expert's
  // probability summed over the tokens, each expert's in token order.
  void moe_route(Tensor topk_idx, Tensor topk_w, Tensor probs, Tensor stats, Tensor logits, int64_t N, int E, int k,
                 bool norm_topk, bool round_w);
  // dlogits[N,E] (act, =) from dtopk_w[N,k] (f32) back through the renormalisation (norm_topk) and the
  // softmax, given the forward's probs and topk_idx; aux_grad[E] (f32; no data: none) is added to every
  // token's d probs (the load-balancing loss's gradient, moe_aux_loss).
  void moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor aux_grad, int64_t N,
                          int E, int k, bool norm_topk);
  // Tokens grouped by expert: offsets[E+1] (i32, =), pos[N k] (i32, =) the row of assignment t k + s, and
  // xg[N k, C] (act, =; no data: not written) row pos[t k + s] = x[t].
  void moe_dispatch(Tensor offsets, Tensor pos, Tensor xg, Tensor x, Tensor topk_idx, int64_t N, int E, int k, int C);
  // dx[N,C] (act, +=) the sum over token t's slots of dxg[pos[t k + s]] (fp32, slot order), rounded once.
  void moe_undispatch(Tensor dx, Tensor dxg, Tensor pos, int64_t N, int k, int C);
  // Each expert's product over its rows: out[r, 0:n] (act, =) a[r, 0:K] (act) op(W_e) for the rows r of
  // expert e, W_e at w + e w_stride (act), stored [n, K] (trans_w: a W_e^T) or [K, n] (a W_e). rows = N k.
  void moe_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, int64_t rows, int E, int64_t n, int64_t K,
                  int64_t w_stride, bool trans_w);
  // The experts' weight gradients: dW_e [n, K] (f32, +=, at dw + e w_stride) dout_e^T a_e over expert e's
  // rows (dout [rows, n], a [rows, K], act); an expert with no rows gets nothing.
  void moe_matmul_wgrad(Tensor dw, Tensor dout, Tensor a, Tensor offsets, int64_t rows, int E, int64_t n, int64_t K,
                        int64_t w_stride);
  // out[N,C] (act, =) residual + sum over slots s of topk_w[t,s] y[pos[t k + s]] (+ sigmoid(gate[t])
  // shared[t] when shared has data: Qwen2-MoE's shared expert, gate [N] act), in fp32, slot order,
  // rounded once. out may alias residual.
  void moe_combine(Tensor out, Tensor residual, Tensor y, Tensor topk_w, Tensor pos, Tensor shared, Tensor gate,
                   int64_t N, int k, int C);
  // moe_combine's backward from dout[N,C] (act): dy[N k, C] (act, =) topk_w dout at each row;
  // dtopk_w[N,k] (f32, =) dout . y; with shared: dshared[N,C] (act, =) sigmoid(gate) dout, dgate[N] (act,
  // =) (dout . shared) sigmoid' (gate). The residual's gradient is dout itself.
  void moe_combine_backward(Tensor dy, Tensor dtopk_w, Tensor dshared, Tensor dgate, Tensor dout, Tensor y,
                            Tensor topk_w, Tensor pos, Tensor shared, Tensor gate, int64_t N, int k, int C);
  // transformers' load_balancing_loss_func from stats[2E] (f32, moe_route's sums over every MoE layer's
  // `rows` tokens): aux = E sum_e (count_e / rows) (prob_e / rows); loss[1] (f64, +=) coef aux; grad[E]
  // (f32, =) grad_scale coef E count_e / rows^2, the gradient of coef aux with respect to each token's
  // probability of expert e (counts are not differentiated, as in transformers).
  void moe_aux_loss(Tensor loss, Tensor grad, Tensor stats, int E, double rows, float coef, float grad_scale);

 protected:
  // What each backend implements: the ops above, arguments already checked (attention's
  // scores.scale resolved: > 0).
  virtual void zero_impl(void* p, size_t bytes) = 0;
  virtual void copy_impl(void* dst, const void* src, size_t bytes) = 0;
  // ld_a and ld_out are given (never 0)
  virtual void matmul_impl(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K,
                           bool trans_a, bool trans_b, bool accumulate, int64_t ld_a, int64_t ld_out) = 0;
  virtual void bias_backward_impl(Tensor dbias, Tensor dout, int64_t M, int64_t N) = 0;
  virtual void matmul_residual_impl(Tensor out, Tensor residual, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N,
                                    int64_t K) = 0;
  virtual void matmul_gelu_impl(Tensor out, Tensor pre, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N,
                                int64_t K) = 0;
  virtual void matmul_dgelu_impl(Tensor dpre, Tensor dout, Tensor b, Tensor pre, int64_t M, int64_t N, int64_t K) = 0;
  virtual void embedding_forward_impl(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C,
                                      int V) = 0;
  virtual void embedding_backward_impl(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C) = 0;
  virtual void layernorm_forward_impl(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, int64_t N,
                                      int C, float eps) = 0;
  virtual void layernorm_backward_impl(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w,
                                       Tensor mean, Tensor rstd, int64_t N, int C) = 0;
  virtual void rmsnorm_forward_impl(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps,
                                    float w_offset) = 0;
  virtual void rmsnorm_backward_impl(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int64_t N,
                                     int C, float w_offset) = 0;
  virtual void head_rmsnorm_forward_impl(Tensor out, Tensor rstd, Tensor in, Tensor wq, Tensor wk, int64_t N, int NH,
                                         int NKV, int hs, float eps, float w_offset) = 0;
  virtual void head_rmsnorm_backward_impl(Tensor din, Tensor dwq, Tensor dwk, Tensor dout, Tensor in, Tensor wq,
                                          Tensor wk, Tensor rstd, int64_t N, int NH, int NKV, int hs,
                                          float w_offset) = 0;
  virtual void gelu_forward_impl(Tensor out, Tensor x, int64_t n) = 0;
  virtual void gelu_backward_impl(Tensor dx, Tensor x, Tensor dout, int64_t n) = 0;
  virtual void swiglu_forward_impl(Tensor out, Tensor gate_up, int64_t N, int I, GluAct act) = 0;
  virtual void swiglu_backward_impl(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I, GluAct act) = 0;
  virtual void dropout_impl(Tensor x, int B, int T, int C, const Dropout& d) = 0;
  virtual void rope_forward_impl(Tensor qkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                                 Tensor positions) = 0;
  virtual void rope_backward_impl(Tensor dqkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                                  Tensor positions) = 0;
  virtual void attention_forward_impl(Tensor out, Tensor lse, Tensor qkv, int B, int T, int NH, int NKV, int hs,
                                      const Dropout& drop, const PackedDocs& docs, int window,
                                      const AttnScores& scores) = 0;
  virtual void attention_backward_impl(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T,
                                       int NH, int NKV, int hs, const Dropout& drop, const PackedDocs& docs,
                                       int window, const AttnScores& scores) = 0;
  virtual void attention_kv_impl(Tensor out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor key_start, int B,
                                 int Tn, int p0, int cap, int NH, int NKV, int hs, int window,
                                 const AttnScores& scores) = 0;
  virtual void add_impl(Tensor out, Tensor a, Tensor b, int64_t n) = 0;
  virtual void accumulate_impl(Tensor dst, Tensor src, int64_t n) = 0;
  virtual void scale_impl(Tensor x, float s, int64_t n) = 0;
  virtual void cross_entropy_impl(Tensor loss_sum, Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V,
                                  float grad_scale, int64_t ld, float softcap) = 0;
  virtual void logit_softcap_impl(Tensor x, int64_t N, int V, float cap, int64_t ld) = 0;
  virtual void adamw_impl(Tensor p, Tensor p_compute, Tensor g, Tensor m, Tensor v, int64_t n, float lr, float beta1,
                          float beta2, float eps, float weight_decay, const DecaySpans& decay, int t,
                          float grad_scale) = 0;
  virtual void sum_squares_impl(Tensor out, Tensor x, int64_t n) = 0;
  virtual void convert_impl(Tensor out, Tensor in, int64_t n) = 0;
  virtual void moe_route_impl(Tensor topk_idx, Tensor topk_w, Tensor probs, Tensor stats, Tensor logits, int64_t N,
                              int E, int k, bool norm_topk, bool round_w) = 0;
  virtual void moe_route_backward_impl(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor aux_grad,
                                       int64_t N, int E, int k, bool norm_topk) = 0;
  virtual void moe_dispatch_impl(Tensor offsets, Tensor pos, Tensor xg, Tensor x, Tensor topk_idx, int64_t N, int E,
                                 int k, int C) = 0;
  virtual void moe_undispatch_impl(Tensor dx, Tensor dxg, Tensor pos, int64_t N, int k, int C) = 0;
  virtual void moe_matmul_impl(Tensor out, Tensor a, Tensor w, Tensor offsets, int64_t rows, int E, int64_t n,
                               int64_t K, int64_t w_stride, bool trans_w) = 0;
  virtual void moe_matmul_wgrad_impl(Tensor dw, Tensor dout, Tensor a, Tensor offsets, int64_t rows, int E, int64_t n,
                                     int64_t K, int64_t w_stride) = 0;
  virtual void moe_combine_impl(Tensor out, Tensor residual, Tensor y, Tensor topk_w, Tensor pos, Tensor shared,
                                Tensor gate, int64_t N, int k, int C) = 0;
  virtual void moe_combine_backward_impl(Tensor dy, Tensor dtopk_w, Tensor dshared, Tensor dgate, Tensor dout,
                                         Tensor y, Tensor topk_w, Tensor pos, Tensor shared, Tensor gate, int64_t N,
                                         int k, int C) = 0;
  virtual void moe_aux_loss_impl(Tensor loss, Tensor grad, Tensor stats, int E, double rows, float coef,
                                 float grad_scale) = 0;

  BackendCounters counters_;  // ops counted by the entries; the backend adds host_syncs (and launches)

 private:
  // Counts the op and runs f, timed into op_ms_[category] while profiling.
  template <class F>
  void run(const char* category, F&& f);
  // The argument checks the entries share (backend.cpp).
  void need_act(const char* op, const char* arg, const Tensor& t, int64_t n) const;
  void need(const char* op, const char* arg, const Tensor& t, DType dtype, int64_t n) const;
  void need_float(const char* op, const char* arg, const Tensor& t, int64_t n) const;
  void need_elems(const char* op, const char* arg, const Tensor& t, int64_t n) const;

  bool profiling_ = false;
  std::map<std::string, double> op_ms_;
};

// A backend allocation that releases itself: one tensor, zero-filled.
class BackendBuffer {
 public:
  BackendBuffer(Backend& be, DType t, const std::vector<int64_t>& shape) : be_(be) {
    Tensor probe(nullptr, t, shape);
    tensor_ = Tensor(be.alloc(probe.nbytes()), t, shape);
  }
  ~BackendBuffer() { be_.release(tensor_.data); }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;
  const Tensor& tensor() const { return tensor_; }

 private:
  Backend& be_;
  Tensor tensor_;
};

// Functions device code calls too (the CUDA kernels draw the same dropout masks).
#if defined(__CUDACC__)
#define LLMT_HOST_DEVICE __host__ __device__
#else
#define LLMT_HOST_DEVICE
#endif

// A dropout mask element: 24 bits of a counter-based hash of (key, row, element), compared with p.
// A row is one token of one sequence (dropout_row); the element is the channel, or for attention
// probabilities head * 2^20 + key position. The same function on every backend, so masks are
// identical everywhere.
constexpr int kDropoutPosBits = 20;  // positions below 2^20 per sequence
LLMT_HOST_DEVICE inline int64_t dropout_row(int64_t sequence, int t) { return (sequence << kDropoutPosBits) + t; }
LLMT_HOST_DEVICE inline uint32_t dropout_bits(uint64_t key, int64_t row, int64_t e) {
  uint64_t z = key ^ ((uint64_t)row * 0x9e3779b97f4a7c15ull);
  z += (uint64_t)e * 0xd1b54a32d192ed03ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (uint32_t)(z >> 40);
}
LLMT_HOST_DEVICE inline bool dropout_keep(uint64_t key, int64_t row, int64_t e, float p) {
  return (double)dropout_bits(key, row, e) >= (double)p * 16777216.0;
}

// The channels of a head of hs that rotate.
LLMT_HOST_DEVICE inline int rope_dim(const RopeSpec& r, int hs) { return r.rotary_dim > 0 ? r.rotary_dim : hs; }
// RoPE frequency i of a head of hs channels (rope_dim of them rotating), in fp32 step for step as
// transformers computes it (_compute_default / _linear_scaling / _llama3 / _longrope_parameters),
// so the same angles come out everywhere.
LLMT_HOST_DEVICE inline float rope_inv_freq(const RopeSpec& r, int i, int hs) {
  const float p = powf(r.theta, (float)(2 * i) / (float)rope_dim(r, hs));
  if (r.scaling == RopeSpec::longrope) return 1.0f / (r.ext[i] * p);
  const float f = 1.0f / p;
  if (r.scaling == RopeSpec::linear) return f / r.factor;
  if (r.scaling != RopeSpec::llama3) return f;
  const float wavelen = 6.2831853071795862f / f;  // 2 pi / inv_freq
  const float low_freq_wavelen = r.original_max / r.low_freq_factor;
  const float high_freq_wavelen = r.original_max / r.high_freq_factor;
  if (wavelen > low_freq_wavelen) return f / r.factor;  // long wavelengths: scaled
  if (wavelen < high_freq_wavelen) return f;            // short ones: kept
  const float smooth = (r.original_max / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1.0f - smooth) * f / r.factor + smooth * f;
}

}  // namespace llmt
