// Every family's forward and backward (the switches of ModelConfig::family), built from Backend ops, unit by unit through a UnitStore
// (engine/params/unit_store.h). Activations are in the backend's compute dtype; parameter
// gradients f32; norm statistics and the attention's log-sum-exp f32.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/params/unit_store.h"
#include "models/config.h"
#include "models/layout.h"
#include "models/moe.h"
#include "models/projection_adapters.h"

namespace llmt {

// Where a training batch sits, for its dropout masks: the run's seed, the optimizer step, and the
// global index (in that step's global batch) of the batch's first sequence.
struct DropoutAt {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first_sequence = 0;
};

// What a training forward pass needs beyond the batch: gradients are kept as grad_scale *
// dloss/dlogits (grad_scale is usually 1 / the tokens counted in the step), dropout as `dropout` says.
struct TrainPass {
  float grad_scale = 1.0f;
  DropoutAt dropout;
  // the factor on the gradient of an MoE model's load-balancing loss (output_router_logits), which
  // transformers adds, times router_aux_loss_coef, to each forward's loss: 1 for one batch
  float aux_scale = 1.0f;
};

// One buffer of activations or scratch: its name, dtype and shape.
struct ActivationBuffer {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int64_t bytes() const;
};

class Transformer {
 public:
  // Allocates activations for batches of B sequences of up to T tokens on the backend. With
  // checkpointing only each block's input is kept; backward recomputes the block's forward.
  // head_chunk > 0: the LM head and loss run over at most that many tokens at a time, so the logits
  // buffer holds head_chunk rows, not B*T (LLaMA 3's 128256 x 8192 tokens would be 2 GiB in bf16);
  // training then recomputes each chunk's logits in backward (one more head matmul), and a pass
  // without targets (whose logits would be read) is refused. 0: the whole batch at once.
  Transformer(const ModelConfig& cfg, Backend& backend, int B, int T, bool checkpointing = false,
              int64_t head_chunk = 0);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ModelLayout& layout() const { return layout_; }
  Backend& backend() const { return be_; }
  int batch() const { return B_; }
  int seq_len() const { return T_max_; }  // the most tokens per sequence

  // Every buffer the model allocates for (B, T) in the given compute dtype on a backend whose
  // vocab_pad() is `vocab_pad`: the one table the constructor allocates from, activation_bytes sums,
  // and llmt plan prints.
  static std::vector<ActivationBuffer> activation_buffers(const ModelConfig& cfg, int B, int T, bool checkpointing,
                                                          DType compute, int vocab_pad, int64_t head_chunk = 0);
  static int64_t activation_bytes(const ModelConfig& cfg, int B, int T, bool checkpointing, DType compute,
                                  int vocab_pad, int64_t head_chunk = 0);
  // FLOPs of one token's training step (forward and backward) at sequence length T, by the PaLM
  // convention (appendix B): 6 * N_matmul + attention_flops_per_token, N_matmul counting every
  // weight of a matrix product and the LM head once.
  static double flops_per_token(const ModelConfig& cfg, const ModelLayout& layout, int T);
  // The attention's share: PaLM's 12 * q_dim * T for each layer of full causal attention (q_dim =
  // heads x head_dim, d_model unless a config gives head_dim apart, as Qwen3's); a layer with a
  // sliding window W < T counts T times the fraction of the causal (query, key) pairs its band keeps,
  // (W (W + 1) / 2 + (T - W) W) / (T (T + 1) / 2), so MFU follows the work the kernels do.
  static double attention_flops_per_token(const ModelConfig& cfg, int T);
  static constexpr const char* kFlopsConvention = "6*N_matmul + 12*L*d*T per token (PaLM B)";

  // Runs the forward pass on tokens[B*T] (host memory); seq_len (<= seq_len(); 0 = all of it) is
  // this batch's sequence length T: tokens and targets hold B*T entries. With targets[B*T] (host,
  // kIgnoreIndex = ignored), loss_sum[1] (f64 on the backend) += the sum of the token losses. With
  // `train`, it also leaves grad_scale * dloss/dlogits in place of the logits for backward and
  // applies dropout; without, it is an evaluation pass and keeps the logits.
  // doc_start[B*T] (host; null: one document a row): packed documents, each token's document
  // beginning at doc_start[b*T + t] of its row; attention stays inside a document and positions
  // restart at each (transformers' DataCollatorWithFlattening / TRL's packing).
  void forward(UnitStore& store, const int32_t* tokens, const int32_t* targets, int seq_len, Tensor loss_sum,
               const TrainPass* train = nullptr, const int32_t* doc_start = nullptr);
  // Adds this batch's gradients into store.grads(u); call after a training forward. A unit whose
  // grads(u) is empty is frozen: its parameter-gradient products (dW, bias, norm weights, embeddings)
  // are skipped, the input gradients still computed.
  void backward(UnitStore& store);
  // Adapters on the block projections (models/projection_adapters.h), or null; the model calls them
  // from then on. Not owned.
  void set_adapters(ProjectionAdapters* adapters) { adapters_ = adapters; }
  // An MoE model's router_aux_loss_coef times transformers' load_balancing_loss_func over the last
  // forward with targets (f64 [1] on the backend; zero without output_router_logits): the loss
  // transformers reports is the token mean of loss_sum plus this.
  Tensor router_aux_loss() const { return moe_.aux_loss(); }
  // Logits [B*T, logits_stride()] on the backend in the compute dtype (T of the last forward), valid
  // after an evaluation forward or a decode: each row's first V entries are the logits, the rest
  // padding that is never written (Backend::vocab_pad).
  Tensor logits() const;
  int64_t logits_stride() const { return V_pad_; }
  // The vocabulary rounded up to a multiple of vocab_pad: the logits' row stride.
  static int64_t padded_vocab(const ModelConfig& cfg, int vocab_pad);

  // Generation (llmt generate) with a KV cache. start_generation sizes the cache for the model's B
  // sequences of up to `cap` positions (prompt and new tokens) and empties it; sequence b's real
  // tokens begin at key_start[b] (left padding before them: never attended, and positions count
  // from the first real token, as transformers' generate does with an attention mask). decode runs
  // n <= seq_len() tokens[B*n] of each sequence at positions cached() .. cached()+n-1, appending
  // their keys and values to the cache; logits() holds their rows after it. Evaluation only.
  // LongRoPE (Phi-3): a pass uses the short factors while its last position + 1 is at most the
  // original context, the long ones beyond, as transformers picks per forward. A cache filled with
  // the short set cannot take a pass that needs the long one (decode refuses it): transformers then
  // recomputes the whole sequence, and so does generate, restarting with long_rope true (every
  // decode of this cache uses the long set).
  void start_generation(int cap, const std::vector<int32_t>& key_start, bool long_rope = false);
  void decode(UnitStore& store, const int32_t* tokens, int n);
  int cached() const { return kv_len_; }
  // Whether a decode of n more tokens would need the long factors while the cache holds keys made
  // with the short ones (never without longrope).
  bool decode_needs_long_restart(int n) const;
  // Bytes of a KV cache for B sequences of cap positions, for llmt plan.
  static int64_t kv_cache_bytes(const ModelConfig& cfg, int B, int cap, DType compute);

 private:
  struct BlockActs {  // what one block keeps for its backward
    Tensor ln1, ln1_mean, ln1_rstd, qkv, lse, attn_out, resid_mid, ln2, ln2_mean, ln2_rstd, mlp_in, mlp_act;
    Tensor qkv_pre, qk_rstd;  // qk_norm: the projections' output before the q/k norms, and their rstd
    // sandwich_norms: the attention and MLP branches' outputs before their norms, and the norms' rstd
    Tensor attn_branch, attn_branch_rstd, mlp_branch, mlp_branch_rstd;
  };
  // Walks the activation table, handing each buffer to `take`: the constructor allocates, the
  // static functions only record. The one place the model's memory is described.
  static void walk_buffers(const ModelConfig& cfg, int B, int T, bool checkpointing, DType compute, int vocab_pad,
                           int64_t head_chunk, const std::function<Tensor(const ActivationBuffer&)>& take,
                           Transformer* model);
  // The LM head and loss over chunks of head_rows_ rows (one chunk unless head_chunk): forward's
  // logits and losses; backward's gradient products (recomputing chunked logits and dlogits first).
  void head_forward(Tensor root);
  void head_backward(Tensor root, Tensor groot);
  Dropout dropout_for(int layer, int site, float p) const;
  // the adapters' hook at block l's matrix m (nothing without adapters on it)
  AdapterSite adapter_site(int l, BlockMatrix m) const;
  void adapt_forward(int l, BlockMatrix m, Tensor y, Tensor x);
  void adapt_backward(int l, BlockMatrix m, Tensor dy, Tensor x, Tensor dx);
  bool adapted(BlockMatrix m) const { return adapters_ && adapters_->adapts(m); }
  // the store's unit calls, and the adapters' beside them
  Tensor acquire(UnitStore& store, int unit);
  void prefetch(UnitStore& store, int unit);
  void release(UnitStore& store, int unit);
  void grads_done(UnitStore& store, int unit);
  void norm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, int64_t w_off, int64_t b_off);
  // dx (+=) from dout: dres_ from dnorm_ unless given
  void norm_backward(Tensor x, Tensor mean, Tensor rstd, Tensor w, Tensor g, int64_t w_off, int64_t b_off,
                     Tensor dx = Tensor(), Tensor dout = Tensor());
  // a sandwich norm's backward: the gradient at the branch's output before its norm (in sandwich_),
  // from dnormed, the gradient after it
  Tensor sandwich_backward(Tensor dnormed, Tensor branch, Tensor rstd, Tensor w, Tensor g, int64_t w_off);
  // layer l's RoPE: rope_local_ on Gemma 3's sliding layers, else rope_
  const RopeSpec& rope_for(int l) const { return cfg_.rope_local_theta > 0.0f && cfg_.window(l) > 0 ? rope_local_ : rope_; }
  void block_forward(int l, Tensor w);
  // The embeddings, every block and the head over the current batch (forward's and decode's part).
  void forward_units(UnitStore& store);
  void release_kv_cache();
  // t as an i32 [B*T] tensor of the current batch while documents are packed, else no tensor
  Tensor packed_tensor(const Tensor& t) const;
  // the current batch's documents while packed, else none
  PackedDocs packed_docs() const { return packed_ ? PackedDocs{packed_tensor(doc_start_), doc_count_} : PackedDocs(); }
  void block_backward(int l, Tensor w, Tensor g);
  int act(int l) const { return checkpointing_ ? 0 : l; }  // which set of block activations layer l uses
  // Tensor [rows, cols] at the start of buffer t for the current batch (T rows per sequence).
  Tensor rows(const Tensor& t, int64_t cols) const;

  ModelConfig cfg_;
  ModelLayout layout_;
  Backend& be_;
  DType dt_;        // the compute dtype
  int B_, T_max_;   // capacity
  int64_t V_pad_;   // the logits' row stride
  int cur_T_ = 0;   // the current batch's sequence length
  bool checkpointing_;
  RopeSpec rope_;  // the model's RoPE frequencies (theta and rope_scaling)
  // longrope: ext = the short or long factors for a pass whose last position + 1 is len
  void pick_rope_factors(int len);
  bool kv_long_ = false;  // the cache's keys were rotated with longrope's long factors
  RopeSpec rope_local_;  // the sliding layers' own (rope_local_theta, unscaled), when the config has one
  float embed_scale_ = 1.0f;  // scaled_embeddings: sqrt(d_model) rounded to the compute dtype
  AttnScores scores_;  // the attention's scale and soft-cap (Gemma's query_pre_attn_scalar, attn_logit_softcapping)
  std::vector<void*> allocations_;
  bool have_grad_ = false;
  const TrainPass* train_ = nullptr;  // the current training pass (dropout), or null
  TrainPass train_copy_;

  Tensor tokens_, targets_;                 // i32 [B*T]
  std::vector<Tensor> resid_;               // [L+1] residual stream entering block l (resid_[L] leaves the last)
  std::vector<BlockActs> acts_;             // per layer, or one set reused when checkpointing
  Tensor lnf_, lnf_mean_, lnf_rstd_, logits_;
  int64_t head_rows_ = 0;  // rows the logits buffer holds (B*T unless chunked)
  Tensor head_loss_;       // forward's loss_sum while it runs (the chunked head adds into it)
  Tensor discarded_loss_;  // f64: backward's recomputed chunks add their losses here, never read
  // backward scratch; dropped_ holds a residual branch's output (forward) or gradient (backward) under dropout
  Tensor dres_, dnorm_, dattn_, dqkv_, dmlp_in_, dmlp_act_, dropped_;
  Tensor sandwich_;  // sandwich_norms: a branch's normed output (forward) or its gradient before the norm (backward)
  Tensor frozen_norm_grad_;  // f32 [2 max(C, head size)]: a frozen norm's weight and bias gradients, discarded
  ProjectionAdapters* adapters_ = nullptr;
  MoeBlocks moe_;             // the mixture-of-experts blocks' buffers and ops (models/moe.h)
  bool recomputing_ = false;  // backward's recompute of a checkpointed block's forward

  // packed documents (the last forward's): positions_ and doc_start_ hold each token's
  bool packed_ = false;
  Tensor positions_, doc_start_;  // i32 [B*T]
  int64_t doc_count_ = 0;         // the documents that begin in the batch
  // generation: while kv_on_, attention reads and extends the cache and positions_ places each row
  bool kv_on_ = false;
  int kv_cap_ = 0, kv_len_ = 0;
  std::vector<int32_t> key_start_host_;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [B, NKV, cap, hs]
  Tensor key_start_;                       // i32 [B]
  std::vector<void*> kv_allocations_;
};

// Fills a unit's parameters the way transformers initialises them: normal(0, initializer_range)
// weights, output projections scaled by 1/sqrt(2 * n_layer) where family.scaled_out_init (GPT-2),
// zero biases, unit norm weights.
// Deterministic in (seed, unit): independent of how units are later sharded. Host memory, f32.
void init_unit_params(const ModelConfig& cfg, const UnitLayout& unit, int unit_index, uint64_t seed, float* host);
// Elements [lo, hi) of the same unit into out[0, hi - lo): a rank makes only its shard. Each weight
// element is the normal of its own draw index (normal_at), so the range is filled in parallel.
void init_unit_range(const ModelConfig& cfg, const UnitLayout& unit, int unit_index, uint64_t seed, int64_t lo,
                     int64_t hi, float* out);

}  // namespace llmt
