// LoRA adapters as PEFT trains them (peft.tuners.lora: LoraConfig, LoraLayer's Linear): on a frozen
// projection y = x W^T, the adapted output is y + scaling * B(A(dropout(x))), A [r, in] and B [out, r],
// scaling = alpha / r (alpha / sqrt(r) with rsLoRA). A starts Kaiming-uniform (a = sqrt(5), so
// U(-1/sqrt(in), 1/sqrt(in))) and B at zero, so a fresh adapter changes nothing.
//
// The adapter is its own piece: which projections it sits on (PEFT's target_modules matching on
// Hugging Face module names), where A and B live (their own parameter units, unit u holding the
// adapters of the base model's unit u), the forward and backward of one adapted projection through
// Backend ops, and PEFT's adapter directory (adapter_config.json, adapter_model.safetensors).
// llmt fuses LLaMA's q|k|v and gate|up into one matrix, and GPT-2's c_attn is one Conv1D in
// Hugging Face too: a projection is a range of rows [row0, row0 + out) of such a matrix, and its
// adapter adds to those output columns only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/formats/safetensors.h"
#include "engine/params/layout.h"
#include "engine/params/unit_store.h"
#include "models/config.h"
#include "models/layout.h"
#include "models/projection_adapters.h"

namespace llmt {


// One linear projection of a block as Hugging Face names it, and where it sits in llmt's weights.
struct Projection {
  std::string module;       // module path inside a block: "self_attn.q_proj", "attn.c_attn", "mlp.c_proj"
  BlockMatrix matrix = BlockMatrix::qkv;
  int64_t row0 = 0;         // first row of the projection in llmt's matrix (k_proj: q's rows after q)
  int64_t out = 0, in = 0;  // the projection's own shape (PEFT's out_features, in_features)
  int64_t rows = 0;         // rows of the whole matrix: the row stride of its output activations
  bool conv1d = false;      // GPT-2's Conv1D, which PEFT adapts with fan_in_fan_out
};

// Every linear projection of one block (the output head is not in a block), in Hugging Face's order.
std::vector<Projection> block_projections(const ModelConfig& cfg);
// The Hugging Face module path of block l, with a trailing dot: "transformer.h.3.", "model.layers.3.".
std::string block_module_prefix(const ModelConfig& cfg, int l);

struct LoraConfig {
  int r = 16;                 // --lora_r
  double alpha = 32.0;        // --lora_alpha
  double dropout = 0.05;      // --lora_dropout
  bool rslora = false;        // --use_rslora
  // --lora_target_modules: names matched as PEFT matches a list (the module path equals the name or
  // ends with "." + name), or the one name "all-linear" (every linear projection but the output head,
  // which PEFT expands to those projections' last names). Empty with target_regex set: PEFT's string
  // form, a regular expression the whole module path must match (re.fullmatch; here std::regex's
  // ECMAScript grammar, which agrees with Python's for alternations, classes and repetitions).
  std::vector<std::string> target_modules;
  std::string target_regex;
  std::vector<std::string> modules_to_save;  // --lora_modules_to_save: "lm_head", "embed_tokens" (GPT-2: "wte")
  std::string base_model_name_or_path;       // recorded in adapter_config.json
  double scaling() const;
};

// Checks r, alpha, dropout and the target names against the model (an unknown name, or one matching
// nothing, is an error naming it and the model's projections); the config with "all-linear" expanded.
LoraConfig resolve_lora_config(const LoraConfig& c, const ModelConfig& cfg);
// PEFT's rule: does the adapter sit on the module at this full path ("model.layers.0.self_attn.q_proj")?
bool lora_targets(const LoraConfig& c, const std::string& module_path);

// One adapted projection and where its A and B sit inside the adapter unit of its block.
struct LoraSlot {
  Projection proj;
  int64_t a = -1, b = -1;  // offsets of lora_A [r, in] and lora_B [out, r]
};

// A module of modules_to_save: a trainable copy of a root tensor (the base one stays frozen).
struct LoraSavedModule {
  std::string name;        // as given: "lm_head", "embed_tokens"
  int64_t offset = -1;     // in the adapter's root unit
  bool lm_head = false;    // the output head's weight (else the token embeddings)
};

// The adapter's parameters: unit 0 (root: modules_to_save copies, maybe empty) and unit 1 + l
// (block l's A and B), each tensor under the key PEFT saves it as, so adapter units line up with the
// base model's units and ride the same FSDP schedule.
struct LoraLayout : ParamLayout {
  std::vector<LoraSlot> slots;             // the same in every block, in Hugging Face's module order
  std::vector<LoraSavedModule> saved;      // in the order of modules_to_save
  const LoraSlot* slot(BlockMatrix m, int64_t row0) const;
};
LoraLayout make_lora_layout(const ModelConfig& cfg, const LoraConfig& lora);

// FLOPs of one token's training step with the base frozen, by Transformer::flops_per_token's
// convention: the base's matrix products forward and for dx only (4 N_matmul; its dW products are
// skipped), an lm_head copy's dW too (+2 V C), each adapter's A and B forward and backward
// (6 (r in + out r) a projection), and the attention's (Transformer::attention_flops_per_token).
double lora_flops_per_token(const ModelConfig& cfg, const ModelLayout& base, const LoraConfig& lora,
                            const LoraLayout& layout, int T);

// PEFT's saved key for a block projection's A or B: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".
std::string lora_key(const ModelConfig& cfg, int layer, const Projection& p, bool b);

// A fresh adapter's unit, as PEFT's init_lora_weights=True makes it: A uniform in +-1/sqrt(in), B zero;
// the root unit's modules_to_save copies from the base model's root unit (base_root: f32 host, laid out
// as base.units[0]). PEFT's distribution, not torch's stream: element k of A in unit u is
// uniform_from(mix64 of (seed, u, k)), so any range can be made alone. host: layout.units[unit].numel floats.
void init_lora_unit(const LoraLayout& layout, int unit, uint64_t seed, const ModelLayout& base, const float* base_root,
                    float* host);

// The offset of a block matrix inside a base block unit.
int64_t block_matrix_offset(const BlockOffsets& o, BlockMatrix m);
// PEFT's merge_and_unload on host buffers: into base unit `unit` (f32, laid out as base.units[unit]) adds
// each adapted projection's scaling * B A to its rows (a Conv1D's too: llmt stores every weight
// [out, in], so fan_in_fan_out's transpose is the loader's), and for unit 0 puts each modules_to_save
// copy in place of its base tensor (an lm_head copy needs a base layout with an untied lm_head).
// adapter: the adapter's unit `unit`, f32 host. Sums in double, rounded once.
void merge_lora_unit(const ModelLayout& base, const LoraLayout& lora, double scaling, int unit, const float* adapter,
                     float* base_host);

// The model a merge of this adapter gives: the base's config, untied (tie_word_embeddings false) when
// the adapter holds a modules_to_save copy (lm_head or embed_tokens) of a tensor the base ties, since
// the merged head and embeddings then differ: one is the trained copy, the other the base's.
ModelConfig merged_model_config(const ModelConfig& base, const LoraLayout& lora);
// One unit of PEFT's merge_and_unload of an adapter file into a base model's weights: the base's
// unit `unit` read from base (laid out as base_layout), moved into merged_layout (make_layout of
// merged_model_config: an untied lm_head starts as the embeddings and is then the adapter's copy),
// and the adapter's unit merged in (merge_lora_unit). out: merged_layout.units[unit].numel floats.
void load_merged_unit(const SafetensorsCheckpoint& base, const ModelConfig& base_cfg, const ModelLayout& base_layout,
                      const SafetensorsFile& adapter, const LoraLayout& lora, double scaling,
                      const ModelLayout& merged_layout, int unit, float* out);

// ---- one adapted projection on a backend ----
// Scratch an adapted projection needs for N rows: h (kept from forward to backward) and dh, [N, r]
// in the compute dtype each, and with dropout xd [N, in] in the compute dtype.
struct LoraActs {
  Tensor h;   // scaling * dropout(x) A^T, kept for backward
  Tensor dh;  // backward's scratch
  Tensor xd;  // dropout(x) (forward), and the masked dx (backward); only with dropout
};
// Where dropout's mask comes from for this call: the site's Dropout and the batch's B x T rows.
struct LoraDropout {
  Dropout d;
  int B = 0, T = 0;
};
// y (act, the whole matrix's output: N rows of stride p.rows, column 0 of the matrix at y.data)
// columns [p.row0, p.row0 + p.out) += scaling * (dropout(x) A^T) B^T; x (act) [N, p.in]; A [r, in],
// B [out, r] (act, the adapter unit's compute copy). Keeps h for backward.
void lora_forward(Backend& be, const Projection& p, int r, float scaling, Tensor y, Tensor x, Tensor A, Tensor B,
                  const LoraActs& acts, int64_t N, const LoraDropout& drop = {});
// The backward of lora_forward, from dy (the whole matrix's output gradient, laid out as y; dy_p its
// columns of this projection): dB (f32) += dy_p^T h; dh = scaling * dy_p B; dA (f32) += dh^T dropout(x);
// dx (act, [N, in]) += dropout's mask applied to dh A. x, A, B and acts.h as forward had them.
void lora_backward(Backend& be, const Projection& p, int r, float scaling, Tensor dy, Tensor x, Tensor A, Tensor B,
                   Tensor dA, Tensor dB, Tensor dx, const LoraActs& acts, int64_t N, const LoraDropout& drop = {});

// ---- the adapter on a model ----
// PEFT's LoRA as the model's ProjectionAdapters: each adapted projection's A and B from the adapter
// unit the store holds beside the model's own unit (an FsdpStore of the LoraLayout, trainable, with
// the run's strategy; the base model's store frozen), its gradients into that store's grads(u), and
// modules_to_save's lm_head copy in place of the head and embed_tokens copy in place of the input
// embeddings. Activations for batches of B x T rows: h
// [B*T, r] per adapted projection of each block (kept for backward), one dh [B*T, r], and with
// dropout one [B*T, largest in] scratch, in the backend's compute dtype. Set on a Transformer with
// set_adapters; the layout and store must outlive it.
class LoraAdapters : public ProjectionAdapters {
 public:
  LoraAdapters(const ModelConfig& cfg, const LoraConfig& lora, const LoraLayout& layout, Backend& be,
               UnitStore& store, int B, int T);
  ~LoraAdapters() override;
  LoraAdapters(const LoraAdapters&) = delete;
  LoraAdapters& operator=(const LoraAdapters&) = delete;
  // Bytes of those activations (for a plan of the run).
  static int64_t activation_bytes(const ModelConfig& cfg, const LoraConfig& lora, const LoraLayout& layout, int B,
                                  int T, DType compute);

  bool adapts(BlockMatrix m) const override { return adapts_[(int)m]; }
  float dropout_p() const override { return (float)lora_.dropout; }
  void forward(const AdapterSite& at, Tensor y, Tensor x) override;
  void backward(const AdapterSite& at, Tensor dy, Tensor x, Tensor dx) override;
  Tensor head_weight() override;
  Tensor head_grad() override;
  Tensor embed_weight() override;
  Tensor embed_grad() override;
  void acquire(int unit) override;
  void prefetch(int unit) override;
  void release(int unit) override;
  void grads_done(int unit) override;
  void backward_done() override { store_.backward_done(); }

 private:
  bool empty(int unit) const { return layout_.units[(size_t)unit].numel == 0; }
  template <class F>
  void each_slot(const AdapterSite& at, F&& f);  // forward's and backward's walk over a site's projections
  Tensor saved_weight(const LoraSavedModule* m);  // a modules_to_save copy while unit 0 is held
  Tensor saved_grad(const LoraSavedModule* m);
  ModelConfig cfg_;
  LoraConfig lora_;
  const LoraLayout& layout_;
  Backend& be_;
  UnitStore& store_;
  int64_t rows_;  // B * T: the most rows a call has
  float scaling_;
  bool adapts_[kBlockMatrices] = {false, false, false, false};
  const LoraSavedModule* head_ = nullptr;  // modules_to_save's lm_head copy, if any
  const LoraSavedModule* embed_ = nullptr;  // modules_to_save's embed_tokens copy, if any
  std::vector<Tensor> held_;               // each adapter unit's parameters while the model holds its unit
  std::vector<std::vector<Tensor>> h_;     // [layer][slot]
  Tensor dh_, xd_;
  std::vector<void*> allocations_;
};

// ---- PEFT's adapter directory ----
// adapter_config.json as PEFT's LoraConfig.save_pretrained writes it (every field PEFT reads, at its
// default where llmt has no choice), for PeftModel.from_pretrained.
nlohmann::json adapter_config_json(const LoraConfig& lora, bool fan_in_fan_out);
// Reads adapter_config.json; options llmt cannot train or apply (use_dora, bias other than "none",
// lora_bias, another peft_type, rank_pattern / alpha_pattern / layers_to_transform / exclude_modules /
// layer_replication / target_parameters / trainable_token_indices / megatron_config, any unknown
// field that is set) are errors naming the file and the field. fan_in_fan_out is returned in *fifo.
LoraConfig read_adapter_config(const std::string& path, bool* fan_in_fan_out = nullptr);
// Checks that an adapter_model.safetensors holds exactly the layout's keys with their shapes.
void check_adapter_tensors(const SafetensorsFile& f, const LoraLayout& layout);
// Reads unit `unit`'s tensors from the file into host (f32, layout.units[unit].numel floats).
void load_adapter_unit(const SafetensorsFile& f, const LoraLayout& layout, int unit, float* host);
// Writes dir/adapter_config.json and dir/adapter_model.safetensors (f32) from the adapter units'
// host buffers, as save_pretrained does (creates dir).
void save_adapter(const std::string& dir, const LoraConfig& lora, const LoraLayout& layout,
                  const std::vector<const float*>& unit_host);

}  // namespace llmt
