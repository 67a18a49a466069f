// Mixture of experts as transformers 5 computes it (Mixtral, Qwen2-MoE, Qwen3-MoE; docs/design.md,
// "Mixture of experts"): the MoE families' config.json fields, their parameters in a block's unit and
// the Hub's per-expert names, and one MoE block's forward and backward from Backend ops:
//
//   logits = x Wr^T (act)          route: probs = softmax(logits) fp32, top-k (torch's tie rule),
//                                  renormalised (norm_topk), rounded to act (round_weights)
//   dispatch: tokens grouped by expert (stable counting sort); xg = x's rows in that order
//   h = xg W_in,e^T, a = silu(gate) * up, y = a W_out,e^T     each expert over its rows
//   out = residual + sum_s w_s y[pos(t, s)] (+ sigmoid(x Wsg^T) shared(x), Qwen2-MoE)
//
// dropless (every token reaches its k experts), no allocation per step (every buffer is in the
// activation table), no host read (the CPU reads the offsets in place; a device keeps them).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/params/layout.h"
#include "models/config.h"
#include "models/layout.h"

namespace llmt {

// ---- config.json ----
// The dense family whose attention, norms and names an MoE model_type shares: mixtral -> mistral,
// qwen2_moe -> qwen2, qwen3_moe -> qwen3; any other type is returned as it is.
std::string moe_dense_relative(const std::string& model_type);
bool is_moe_model_type(const std::string& model_type);
// Reads the MoE fields of a mixtral, qwen2_moe or qwen3_moe config.json into c.moe (c.model_type set,
// the attention part read as its dense relative's); refuses by name what llmt does not compute
// (router_jitter_noise, Qwen's sliding windows).
void read_moe_config(const nlohmann::json& j, const std::string& source, const std::string& type, ModelConfig& c);
// A model_type of another mixture of experts (DeepSeek, gpt-oss, Llama 4, OLMoE, ...): an error naming
// what llmt does not implement. Returns for any other type.
void refuse_other_moe(const std::string& type, const std::string& source);
// c's MoE fields into j (config_to_hf_json of a mixtral, qwen2_moe or qwen3_moe model), as the config
// classes read them; architectures and model_type too.
void moe_to_hf_json(const ModelConfig& c, nlohmann::json& j);
void validate_moe_config(const ModelConfig& c, const std::string& source);
// The published shapes (their Hub config.json): mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B.
ModelConfig mixtral_8x7b();
ModelConfig qwen3_30b_a3b();

// ---- parameters ----
// Appends an MoE block's tensors (after ln2) to u under the Hub's names of layer l and returns where.
MoeOffsets add_moe_params(UnitLayout& u, const ModelConfig& c, int l);
// The expert weights a token does not use (E - k experts' of each MoE layer): matmul_numel counts the
// active ones, for FLOPs.
int64_t moe_inactive_numel(const ModelConfig& c);

// ---- compute ----
// What one MoE block keeps for its backward.
struct MoeActs {
  Tensor probs, topk_idx, topk_w, offsets, pos;  // routing (f32 [N,E], i32 [N,k], f32 [N,k], i32 [E+1], i32 [N k])
  Tensor h, a, y;                                // the experts' [gate|up] [N k, 2I], activation [N k, I], out [N k, C]
  Tensor sh_in, sh_act, sh_out, sh_gate;         // the shared expert's ([N,2Is], [N,Is], [N,C]) and its gate [N]
};

// Every MoE block of a model: their activations and scratch, forward, backward and the aux loss.
class MoeBlocks {
 public:
  using Take = std::function<Tensor(const char* name, DType dtype, std::vector<int64_t> shape)>;
  // Describes (and through `take`, allocates) the buffers for B*T tokens: per MoE layer, or one set
  // with checkpointing; m null: describe only (Transformer::activation_buffers).
  static void walk(const ModelConfig& c, int B, int T, bool checkpointing, DType dt, const Take& take, MoeBlocks* m);

  // A pass begins: the aux loss's sums are zeroed when it will be computed (output_router_logits and
  // a loss asked for).
  void begin_pass(Backend& be, const ModelConfig& c, bool aux);
  // Layer l: out (=) residual + the block of x ([N, C], the norm's output); w the block's unit. The
  // router's sums are added to the aux loss's unless `recompute` (checkpointing's second forward).
  void forward(Backend& be, const ModelConfig& c, const MoeOffsets& o, int l, Tensor w, Tensor x, Tensor residual,
               Tensor out, int64_t N, bool recompute);
  // After the last block: the aux loss (aux_loss()) and its gradient, times grad_scale, for backward.
  void finish_forward(Backend& be, const ModelConfig& c, int64_t N, float grad_scale);
  // Layer l from dout (the gradient at out): dx (=) the gradient at x; the parameters' gradients added
  // into g (none when g is empty: frozen); the residual's gradient is dout itself.
  void backward(Backend& be, const ModelConfig& c, const MoeOffsets& o, int l, Tensor w, Tensor g, Tensor x,
                Tensor dout, Tensor dx, int64_t N);
  // coef * load_balancing_loss of the last pass that computed it (f64 [1] on the backend), else zero.
  Tensor aux_loss() const { return aux_loss_; }
  bool aux_on() const { return aux_on_; }

 private:
  bool checkpointing_ = false;
  std::vector<MoeActs> acts_;  // by layer (dense layers' entries empty), or one set with checkpointing
  Tensor logits_, rows_, dh_, da_, dlogits_, dtopk_w_, dsh_out_, dsh_in_, dsh_act_, dgate_;  // scratch
  Tensor stats_, aux_grad_, aux_loss_;
  bool aux_on_ = false;
  const MoeActs& acts(int l) const { return acts_[checkpointing_ ? 0 : (size_t)l]; }
};

}  // namespace llmt
