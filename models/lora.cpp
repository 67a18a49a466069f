#include "models/lora.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/rng.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"

namespace llmt {

namespace {
const char* kPeftPrefix = "base_model.model.";  // PeftModel -> LoraModel -> the transformers model

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
std::string last_name(const std::string& path) { return path.substr(path.rfind('.') + 1); }
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
// A Hugging Face root module as modules_to_save names it (PEFT matches by plain suffix of the path).
std::string root_module_path(const ModelConfig& cfg, bool lm_head) {
  if (lm_head) return "lm_head";
  return cfg.arch == Arch::gpt2 ? "transformer.wte" : "model.embed_tokens";
}
}  // namespace

std::vector<Projection> block_projections(const ModelConfig& c) {
  const int64_t C = c.d_model, F = c.d_ff, hs = c.head_size();
  const int64_t q = (int64_t)c.n_head * hs, kv = (int64_t)c.n_kv_head * hs, QKV = c.qkv_dim(), FI = c.mlp_in_dim();
  if (c.arch == Arch::gpt2)
    return {{"attn.c_attn", BlockMatrix::qkv, 0, 3 * C, C, 3 * C, true},
            {"attn.c_proj", BlockMatrix::attn_proj, 0, C, C, C, true},
            {"mlp.c_fc", BlockMatrix::mlp_in, 0, F, C, F, true},
            {"mlp.c_proj", BlockMatrix::mlp_out, 0, C, F, C, true}};
  if (c.family.fused_qkv_tensor)  // Phi-3: qkv_proj and gate_up_proj, as the checkpoint names them
    return {{"self_attn.qkv_proj", BlockMatrix::qkv, 0, QKV, C, QKV, false},
            {"self_attn.o_proj", BlockMatrix::attn_proj, 0, C, q, C, false},
            {"mlp.gate_up_proj", BlockMatrix::mlp_in, 0, FI, C, FI, false},
            {"mlp.down_proj", BlockMatrix::mlp_out, 0, C, F, C, false}};
  return {{"self_attn.q_proj", BlockMatrix::qkv, 0, q, C, QKV, false},
          {"self_attn.k_proj", BlockMatrix::qkv, q, kv, C, QKV, false},
          {"self_attn.v_proj", BlockMatrix::qkv, q + kv, kv, C, QKV, false},
          {"self_attn.o_proj", BlockMatrix::attn_proj, 0, C, q, C, false},
          {"mlp.gate_proj", BlockMatrix::mlp_in, 0, F, C, FI, false},
          {"mlp.up_proj", BlockMatrix::mlp_in, F, F, C, FI, false},
          {"mlp.down_proj", BlockMatrix::mlp_out, 0, C, F, C, false}};
}

std::string block_module_prefix(const ModelConfig& cfg, int l) {
  return (cfg.arch == Arch::gpt2 ? "transformer.h." : "model.layers.") + std::to_string(l) + ".";
}

double LoraConfig::scaling() const { return rslora ? alpha / std::sqrt((double)r) : alpha / (double)r; }

// PEFT's check_target_module_exists: a string is re.fullmatch'ed against the whole path; a list
// entry matches the path itself or its tail after a dot ("c_proj" is GPT-2's attn.c_proj and mlp.c_proj).
bool lora_targets(const LoraConfig& c, const std::string& path) {
  if (!c.target_regex.empty()) return std::regex_match(path, std::regex(c.target_regex, std::regex::ECMAScript));
  for (auto& t : c.target_modules)
    if (path == t || ends_with(path, "." + t)) return true;
  return false;
}

LoraConfig resolve_lora_config(const LoraConfig& in, const ModelConfig& cfg) {
  LoraConfig c = in;
  LLMT_CHECK(!cfg.moe.active(), "--use_peft: LoRA on a mixture-of-experts model (%s) is not implemented yet",
             cfg.model_type.c_str());
  LLMT_CHECK(c.r > 0, "--lora_r must be positive, got %d", c.r);
  LLMT_CHECK(std::isfinite(c.alpha) && c.alpha > 0, "--lora_alpha must be positive, got %g", c.alpha);
  LLMT_CHECK(c.dropout >= 0 && c.dropout < 1, "--lora_dropout must be in [0, 1), got %g", c.dropout);
  const std::vector<Projection> projs = block_projections(cfg);
  std::vector<std::string> names;
  for (auto& p : projs) names.push_back(p.module);
  if (c.target_regex.empty()) {
    LLMT_CHECK(!c.target_modules.empty(), "--lora_target_modules is empty: name the projections (%s) or all-linear",
               join(names).c_str());
    if (std::find(c.target_modules.begin(), c.target_modules.end(), "all-linear") != c.target_modules.end()) {
      // PEFT's _maybe_include_all_linear_layers: the last names of every linear layer but the output head
      LLMT_CHECK(c.target_modules.size() == 1, "--lora_target_modules: all-linear stands alone, got %s",
                 join(c.target_modules).c_str());
      std::set<std::string> all;
      for (auto& p : projs) all.insert(last_name(p.module));
      c.target_modules.assign(all.begin(), all.end());
    }
    for (auto& t : c.target_modules) {  // PEFT refuses a name that matches nothing; so does llmt, at once
      bool hit = false;
      LoraConfig one;
      one.target_modules = {t};
      for (int l = 0; l < cfg.n_layer && !hit; l++)
        for (auto& p : projs) hit = hit || lora_targets(one, block_module_prefix(cfg, l) + p.module);
      LLMT_CHECK(hit, "--lora_target_modules: %s matches no projection of this %s model (its projections: %s; the "
                 "output head is lm_head, trained whole through --lora_modules_to_save)",
                 t.c_str(), cfg.arch_name(), join(names).c_str());
    }
  } else {
    try {
      (void)std::regex(c.target_regex, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      fail("target_modules: %s is not a regular expression llmt reads (%s)", clip_for_message(c.target_regex).c_str(),
           e.what());
    }
    bool hit = false;
    for (auto& p : projs) hit = hit || lora_targets(c, block_module_prefix(cfg, 0) + p.module);
    LLMT_CHECK(hit, "target_modules: %s matches no projection of block 0 (its projections: %s)",
               clip_for_message(c.target_regex).c_str(), join(names).c_str());
    for (bool head : {true, false}) {  // PEFT would put an adapter of its own on the head or the embeddings
      const std::string path = root_module_path(cfg, head);
      LLMT_CHECK(!lora_targets(c, path), "target_modules: %s also matches %s, which PEFT would give a LoRA "
                 "adapter of its own; llmt adapts block projections only (train it whole with "
                 "--lora_modules_to_save)", clip_for_message(c.target_regex).c_str(), path.c_str());
    }
  }
  for (auto& m : c.modules_to_save) {
    bool head = ends_with("lm_head", m), embed = ends_with(root_module_path(cfg, false), m);
    LLMT_CHECK(!m.empty() && (head || embed), "--lora_modules_to_save: %s is not one llmt trains whole (lm_head, %s)",
               m.c_str(), last_name(root_module_path(cfg, false)).c_str());
  }
  return c;
}

const LoraSlot* LoraLayout::slot(BlockMatrix m, int64_t row0) const {
  for (auto& s : slots)
    if (s.proj.matrix == m && s.proj.row0 == row0) return &s;
  return nullptr;
}

double lora_flops_per_token(const ModelConfig& cfg, const ModelLayout& base, const LoraConfig& lora,
                            const LoraLayout& layout, int T) {
  double adapter = 0.0;  // A and B of every adapted projection of every block
  for (const LoraSlot& s : layout.slots) adapter += (double)lora.r * (double)(s.proj.in + s.proj.out);
  adapter *= cfg.n_layer;
  double head_copy = 0.0;
  for (const LoraSavedModule& m : layout.saved)
    if (m.lm_head) head_copy = (double)cfg.vocab_size * cfg.d_model;
  return 4.0 * (double)base.matmul_numel + 2.0 * head_copy + 6.0 * adapter +
         Transformer::attention_flops_per_token(cfg, T);
}

std::string lora_key(const ModelConfig& cfg, int layer, const Projection& p, bool b) {
  return kPeftPrefix + block_module_prefix(cfg, layer) + p.module + (b ? ".lora_B.weight" : ".lora_A.weight");
}

LoraLayout make_lora_layout(const ModelConfig& cfg, const LoraConfig& in) {
  const LoraConfig lora = resolve_lora_config(in, cfg);
  LoraLayout L;
  UnitLayout root;
  root.name = "lora.root";
  std::set<bool> done;  // each root module once, however many names reach it
  for (auto& m : lora.modules_to_save) {
    bool head = ends_with("lm_head", m);
    if (!done.insert(head).second) continue;
    // PEFT's ModulesToSaveWrapper saves its copy under the wrapped module's own key
    LoraSavedModule s;
    s.name = m;
    s.lm_head = head;
    s.offset = root.add(kPeftPrefix + root_module_path(cfg, head) + ".weight", {cfg.vocab_size, cfg.d_model}, true);
    L.saved.push_back(s);
  }
  L.units.push_back(root);
  for (auto& p : block_projections(cfg)) {
    // one set of projections in every block (PEFT's "all-linear" names each block's; a list may name
    // some blocks only, as layers_to_transform does, which llmt does not train)
    std::vector<int> hit;
    for (int l = 0; l < cfg.n_layer; l++)
      if (lora_targets(lora, block_module_prefix(cfg, l) + p.module)) hit.push_back(l);
    if (hit.empty()) continue;
    LLMT_CHECK((int)hit.size() == cfg.n_layer, "LoRA target_modules reach %s in %zu of %d blocks (first: block %d): "
               "llmt adapts the same projections in every block", p.module.c_str(), hit.size(), cfg.n_layer, hit[0]);
    L.slots.push_back(LoraSlot{p, -1, -1});
  }
  LLMT_CHECK(!L.slots.empty(), "LoRA: no projection of this %s model is targeted", cfg.arch_name());
  for (int l = 0; l < cfg.n_layer; l++) {
    UnitLayout u;
    u.name = "lora.block." + std::to_string(l);
    for (auto& s : L.slots) {
      s.a = u.add(lora_key(cfg, l, s.proj, false), {lora.r, s.proj.in}, true);
      s.b = u.add(lora_key(cfg, l, s.proj, true), {s.proj.out, lora.r}, true);
    }
    L.units.push_back(u);
  }
  for (auto& u : L.units)
    for (auto& p : u.params) L.total_numel += p.numel();
  for (size_t i = 1; i < L.units.size(); i++)
    for (auto& p : L.units[i].params) L.matmul_numel += p.numel();
  return L;
}

void init_lora_unit(const LoraLayout& L, int unit, uint64_t seed, const ModelLayout& base, const float* base_root,
                    float* host) {
  const UnitLayout& u = L.units.at((size_t)unit);
  std::fill(host, host + u.numel, 0.0f);
  if (unit == 0) {
    for (auto& s : L.saved) {
      const int64_t from = s.lm_head ? base.root.lm_head : base.root.wte;
      const int64_t n = L.units[0].params[0].numel();  // every saved module is [V, C]
      std::copy(base_root + from, base_root + from + n, host + s.offset);
    }
    return;
  }
  // nn.init.kaiming_uniform_(A, a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in) = 1/sqrt(in)
  const uint64_t s0 = stream_state(seed ^ 0x4c6f5241ull, (uint64_t)unit);  // "LoRA"
  for (auto& s : L.slots) {
    const double bound = 1.0 / std::sqrt((double)s.proj.in);
    const int64_t a_numel = u.params[(size_t)(&s - L.slots.data()) * 2].numel();  // A [r, in], then B
    for (int64_t k = 0; k < a_numel; k++)
      host[s.a + k] = (float)(bound * (2.0 * uniform_from(mix64(s0 + (uint64_t)(s.a + k))) - 1.0));
  }
}

int64_t block_matrix_offset(const BlockOffsets& o, BlockMatrix m) {
  switch (m) {
    case BlockMatrix::qkv: return o.qkv_w;
    case BlockMatrix::attn_proj: return o.attn_proj_w;
    case BlockMatrix::mlp_in: return o.mlp_in_w;
    case BlockMatrix::mlp_out: return o.mlp_out_w;
  }
  return -1;
}

void merge_lora_unit(const ModelLayout& base, const LoraLayout& L, double scaling, int unit, const float* adapter,
                     float* base_host) {
  if (unit == 0) {
    for (auto& s : L.saved) {
      const int64_t to = s.lm_head ? base.root.lm_head : base.root.wte;
      LLMT_CHECK(!s.lm_head || base.root.lm_head != base.root.wte, "merging %s into a model whose lm_head is tied to "
                 "its embeddings: the merged model is untied (tie_word_embeddings false)", s.name.c_str());
      const int64_t n = L.units[0].params[(size_t)(&s - L.saved.data())].numel();
      std::copy(adapter + s.offset, adapter + s.offset + n, base_host + to);
    }
    return;
  }
  for (size_t k = 0; k < L.slots.size(); k++) {
    const LoraSlot& s = L.slots[k];
    const Projection& p = s.proj;
    const int64_t r = L.units[(size_t)unit].params[2 * k].shape[0];
    const float* A = adapter + s.a;  // [r, in]
    const float* B = adapter + s.b;  // [out, r]
    // the projection's [out, in] rows of llmt's [rows, in] matrix
    float* W = base_host + block_matrix_offset(base.block, p.matrix) + p.row0 * p.in;
#pragma omp parallel for
    for (int64_t o = 0; o < p.out; o++)
      for (int64_t i = 0; i < p.in; i++) {
        double d = 0.0;
        for (int64_t j = 0; j < r; j++) d += (double)B[o * r + j] * (double)A[j * p.in + i];
        W[o * p.in + i] = (float)((double)W[o * p.in + i] + scaling * d);
      }
  }
}

ModelConfig merged_model_config(const ModelConfig& base, const LoraLayout& lora) {
  ModelConfig out = base;  // PEFT 0.21's merge_and_unload says "no longer tied" and sets it false too
  if (!lora.saved.empty()) out.tied_embeddings = false;
  return out;
}

void load_merged_unit(const SafetensorsCheckpoint& base, const ModelConfig& base_cfg, const ModelLayout& base_layout,
                      const SafetensorsFile& adapter, const LoraLayout& lora, double scaling,
                      const ModelLayout& merged_layout, int unit, float* out) {
  const UnitLayout& from = base_layout.units[(size_t)unit];
  const UnitLayout& to = merged_layout.units[(size_t)unit];
  std::vector<float> host((size_t)from.numel);
  load_hf_unit(base, base_cfg, base_layout, unit, host.data());
  if (from.numel == to.numel) {
    std::copy(host.begin(), host.end(), out);
  } else {  // the root of a base untied by the merge: every base tensor by name, lm_head from the embeddings
    LLMT_CHECK(unit == 0 && merged_layout.root.lm_head != merged_layout.root.wte &&
                   base_layout.root.lm_head == base_layout.root.wte,
               "internal: load_merged_unit: unit %d of the merged model is laid out unlike the base's", unit);
    std::fill(out, out + to.numel, 0.0f);
    for (const ParamSpec& q : to.params) {
      const ParamSpec* p = nullptr;
      for (const ParamSpec& c : from.params)
        if (c.hf_name == q.hf_name) p = &c;
      const int64_t src = p ? p->offset : base_layout.root.wte;
      LLMT_CHECK(p || q.offset == merged_layout.root.lm_head, "internal: load_merged_unit: %s is not in the base",
                 q.hf_name.c_str());
      std::copy(host.begin() + src, host.begin() + src + q.numel(), out + q.offset);
    }
  }
  std::vector<float> a((size_t)lora.units[(size_t)unit].numel, 0.0f);
  load_adapter_unit(adapter, lora, unit, a.data());
  merge_lora_unit(merged_layout, lora, scaling, unit, a.data(), out);
}

// ---- one adapted projection ----

void lora_forward(Backend& be, const Projection& p, int r, float scaling, Tensor y, Tensor x, Tensor A, Tensor B,
                  const LoraActs& acts, int64_t N, const LoraDropout& drop) {
  Tensor xin = x;
  if (drop.d.active()) {  // PEFT's lora_dropout: on the adapter's input only, the base sees x
    LLMT_CHECK((int64_t)drop.B * drop.T == N, "lora_forward: dropout over %d x %d rows, the batch has %lld", drop.B,
               drop.T, (long long)N);
    LLMT_CHECK(acts.xd.data, "lora_forward: dropout needs the [N, in] scratch (LoraActs::xd)");
    be.copy(acts.xd.data, x.data, (size_t)(N * p.in) * dtype_size(x.dtype));
    be.dropout(acts.xd, drop.B, drop.T, (int)p.in, drop.d);
    xin = acts.xd;
  }
  be.matmul(acts.h, xin, A, Tensor(), N, r, p.in, false, true, false);  // h = x A^T
  be.scale(acts.h, scaling, N * r);
  // y[:, row0 : row0 + out] += h B^T, in place in the matrix's output rows
  Tensor ycols(static_cast<char*>(y.data) + (size_t)p.row0 * dtype_size(y.dtype), y.dtype,
               {(N - 1) * p.rows + p.out});
  be.matmul(ycols, acts.h, B, Tensor(), N, p.out, r, false, true, true, 0, p.rows);
}

void lora_backward(Backend& be, const Projection& p, int r, float scaling, Tensor dy, Tensor x, Tensor A, Tensor B,
                   Tensor dA, Tensor dB, Tensor dx, const LoraActs& acts, int64_t N, const LoraDropout& drop) {
  Tensor dycols(static_cast<char*>(dy.data) + (size_t)p.row0 * dtype_size(dy.dtype), dy.dtype,
                {(N - 1) * p.rows + p.out});
  // dB += dy_p^T h   ([out, N] x [N, r])
  be.matmul(dB, dycols, acts.h, Tensor(), p.out, r, N, true, false, true, p.rows);
  // dh = scaling * dy_p B   ([N, out] x [out, r])
  be.matmul(acts.dh, dycols, B, Tensor(), N, r, p.out, false, false, false, p.rows);
  be.scale(acts.dh, scaling, N * r);
  Tensor xin = x;
  if (drop.d.active()) {  // the forward's mask again: same key, rows and elements
    LLMT_CHECK(acts.xd.data && (int64_t)drop.B * drop.T == N, "lora_backward: dropout needs the [N, in] scratch and "
               "the batch's %lld rows as B x T", (long long)N);
    be.copy(acts.xd.data, x.data, (size_t)(N * p.in) * dtype_size(x.dtype));
    be.dropout(acts.xd, drop.B, drop.T, (int)p.in, drop.d);
    xin = acts.xd;
  }
  // dA += dh^T dropout(x)   ([r, N] x [N, in])
  be.matmul(dA, acts.dh, xin, Tensor(), r, p.in, N, true, false, true);
  if (!drop.d.active()) {  // dx += dh A   ([N, r] x [r, in])
    be.matmul(dx, acts.dh, A, Tensor(), N, p.in, r, false, false, true);
  } else {  // dx += mask * (dh A) / (1 - p): dropout's own backward is the same mask
    be.matmul(acts.xd, acts.dh, A, Tensor(), N, p.in, r, false, false, false);
    be.dropout(acts.xd, drop.B, drop.T, (int)p.in, drop.d);
    be.add(dx, dx, acts.xd, N * p.in);
  }
}

// ---- the adapter on a model ----

namespace {
int64_t largest_in(const LoraLayout& L) {
  int64_t n = 0;
  for (const LoraSlot& s : L.slots) n = std::max(n, s.proj.in);
  return n;
}
}  // namespace

LoraAdapters::LoraAdapters(const ModelConfig& cfg, const LoraConfig& lora, const LoraLayout& layout, Backend& be,
                           UnitStore& store, int B, int T)
    : cfg_(cfg), lora_(lora), layout_(layout), be_(be), store_(store), rows_((int64_t)B * T),
      scaling_((float)lora.scaling()) {
  LLMT_CHECK(B > 0 && T > 0, "LoRA: batch %d x %d", B, T);
  LLMT_CHECK((int)layout.units.size() == cfg.n_layer + 1, "LoRA: an adapter of %zu units for a model of %d blocks",
             layout.units.size(), cfg.n_layer);
  for (const LoraSlot& s : layout.slots) adapts_[(int)s.proj.matrix] = true;
  for (const LoraSavedModule& m : layout.saved) (m.lm_head ? head_ : embed_) = &m;
  const DType dt = be.compute_dtype();
  auto take = [&](int64_t numel) {
    Tensor probe(nullptr, dt, {numel});
    void* p = be_.alloc(probe.nbytes());
    allocations_.push_back(p);
    return Tensor(p, dt, {numel});
  };
  h_.resize((size_t)cfg.n_layer);
  for (auto& per_layer : h_)
    for (size_t k = 0; k < layout.slots.size(); k++) per_layer.push_back(take(rows_ * lora.r));
  dh_ = take(rows_ * lora.r);
  if (lora.dropout > 0.0) xd_ = take(rows_ * largest_in(layout));
  held_.resize(layout.units.size());
}

LoraAdapters::~LoraAdapters() {
  be_.synchronize();
  for (void* p : allocations_) be_.release(p);
}

int64_t LoraAdapters::activation_bytes(const ModelConfig& cfg, const LoraConfig& lora, const LoraLayout& L, int B,
                                       int T, DType compute) {
  const int64_t N = (int64_t)B * T;
  int64_t n = ((int64_t)cfg.n_layer * (int64_t)L.slots.size() + 1) * N * lora.r;
  if (lora.dropout > 0.0) n += N * largest_in(L);
  return n * (int64_t)dtype_size(compute);
}

void LoraAdapters::acquire(int unit) {
  if (!empty(unit)) held_[(size_t)unit] = store_.acquire(unit);
}

void LoraAdapters::prefetch(int unit) {
  if (!empty(unit)) store_.prefetch(unit);
}

void LoraAdapters::release(int unit) {
  if (empty(unit)) return;
  store_.release(unit);
  held_[(size_t)unit] = Tensor();
}

void LoraAdapters::grads_done(int unit) {
  if (!empty(unit)) store_.grads_done(unit);
}

// A modules_to_save copy ([V, C] in the adapter's unit 0), or its gradient; none when not saved.
Tensor LoraAdapters::saved_weight(const LoraSavedModule* m) {
  if (!m) return Tensor();
  const Tensor& u = held_[0];
  LLMT_CHECK(u.data, "LoRA: the %s copy is read while the adapter's unit 0 is not held", m->name.c_str());
  return u.view(m->offset, {cfg_.vocab_size, cfg_.d_model});
}

Tensor LoraAdapters::saved_grad(const LoraSavedModule* m) {
  return m ? store_.grads(0).view(m->offset, {cfg_.vocab_size, cfg_.d_model}) : Tensor();
}

// PEFT's embed_tokens copy feeds the input embeddings only: on a tied base the head keeps reading the
// frozen base table (PEFT 0.21 without ensure_weight_tying), which the model does when only this is set.
Tensor LoraAdapters::head_weight() { return saved_weight(head_); }
Tensor LoraAdapters::head_grad() { return saved_grad(head_); }
Tensor LoraAdapters::embed_weight() { return saved_weight(embed_); }
Tensor LoraAdapters::embed_grad() { return saved_grad(embed_); }

// Each adapted projection of the site's matrix in turn: its activations, A and B (views into the held
// unit), and its own dropout stream (PEFT gives every LoRA module its own nn.Dropout, so q_proj's and
// k_proj's masks over the same input are independent), the same in forward and backward.
template <class F>
void LoraAdapters::each_slot(const AdapterSite& at, F&& f) {
  const int64_t N = (int64_t)at.B * at.T;
  LLMT_CHECK(N <= rows_, "LoRA: %lld rows, the adapter was sized for %lld", (long long)N, (long long)rows_);
  const Tensor& u = held_[(size_t)(1 + at.layer)];
  LLMT_CHECK(u.data, "LoRA: block %d's adapter used while its unit is not held", at.layer);
  for (size_t k = 0; k < layout_.slots.size(); k++) {
    const LoraSlot& s = layout_.slots[k];
    if (s.proj.matrix != at.matrix) continue;
    LoraDropout drop{at.dropout, at.B, at.T};
    if (drop.d.active()) drop.d.key = stream_state(drop.d.key, (uint64_t)k);
    f(s, u.view(s.a, {lora_.r, s.proj.in}), u.view(s.b, {s.proj.out, lora_.r}),
      LoraActs{h_[(size_t)at.layer][k], dh_, xd_}, N, drop);
  }
}

void LoraAdapters::forward(const AdapterSite& at, Tensor y, Tensor x) {
  each_slot(at, [&](const LoraSlot& s, Tensor A, Tensor B, const LoraActs& acts, int64_t N, const LoraDropout& drop) {
    lora_forward(be_, s.proj, lora_.r, scaling_, y, x, A, B, acts, N, drop);
  });
}

void LoraAdapters::backward(const AdapterSite& at, Tensor dy, Tensor x, Tensor dx) {
  Tensor g = store_.grads(1 + at.layer);
  each_slot(at, [&](const LoraSlot& s, Tensor A, Tensor B, const LoraActs& acts, int64_t N, const LoraDropout& drop) {
    lora_backward(be_, s.proj, lora_.r, scaling_, dy, x, A, B, g.view(s.a, {lora_.r, s.proj.in}),
                  g.view(s.b, {s.proj.out, lora_.r}), dx, acts, N, drop);
  });
}

// ---- PEFT's adapter directory ----

nlohmann::json adapter_config_json(const LoraConfig& c, bool fan_in_fan_out) {
  nlohmann::json j;
  // LoraConfig's fields (peft 0.17-0.21), those llmt has no choice over at PEFT's defaults
  j["alpha_pattern"] = nlohmann::json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] = c.base_model_name_or_path.empty() ? nlohmann::json(nullptr)
                                                                   : nlohmann::json(c.base_model_name_or_path);
  j["bias"] = "none";
  j["corda_config"] = nullptr;
  j["eva_config"] = nullptr;
  j["exclude_modules"] = nullptr;
  j["fan_in_fan_out"] = fan_in_fan_out;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["loftq_config"] = nlohmann::json::object();
  j["lora_alpha"] = c.alpha;
  j["lora_bias"] = false;
  j["lora_dropout"] = c.dropout;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = c.modules_to_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.modules_to_save);
  j["peft_type"] = "LORA";
  j["r"] = c.r;
  j["rank_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  if (!c.target_regex.empty()) j["target_modules"] = c.target_regex;
  else j["target_modules"] = c.target_modules;
  j["target_parameters"] = nullptr;
  j["task_type"] = "CAUSAL_LM";
  j["trainable_token_indices"] = nullptr;
  j["use_dora"] = false;
  j["use_rslora"] = c.rslora;
  return j;
}

namespace {
bool unset(const nlohmann::json& v) {  // a field at "nothing asked": null, false, empty
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
         (v.is_array() && v.empty()) || (v.is_string() && v.get<std::string>().empty());
}
}  // namespace

static std::string lower_ascii(std::string s) {
  for (char& ch : s) ch = (char)std::tolower((unsigned char)ch);
  return s;
}

LoraConfig read_adapter_config(const std::string& path, bool* fifo) {
  nlohmann::json j = read_json_file(path, "adapter config");
  LLMT_CHECK(j.is_object(), "%s: not a JSON object", path.c_str());
  auto str = [&](const char* k) -> std::string {
    LLMT_CHECK(j[k].is_string(), "%s: %s must be a string", path.c_str(), k);
    return j[k].get<std::string>();
  };
  auto names = [&](const char* k) {
    std::vector<std::string> v;
    LLMT_CHECK(j[k].is_array(), "%s: %s must be a list of names", path.c_str(), k);
    for (auto& e : j[k]) {
      LLMT_CHECK(e.is_string(), "%s: %s must be a list of names", path.c_str(), k);
      v.push_back(e.get<std::string>());
    }
    return v;
  };
  LLMT_CHECK(j.contains("peft_type") && j["peft_type"].is_string(), "%s: no peft_type", path.c_str());
  LLMT_CHECK(str("peft_type") == "LORA", "%s: peft_type %s: llmt trains LoRA adapters only", path.c_str(),
             clip_for_message(str("peft_type")).c_str());
  LoraConfig c;
  // fields llmt reads, fields that must stay at PEFT's default, fields with no effect on the numbers
  static const std::set<std::string> harmless = {"auto_mapping", "base_model_name_or_path", "revision",
                                                 "inference_mode", "megatron_core",
                                                 "peft_version", "qalora_group_size", "loftq_config",
                                                 "layers_pattern", "task_type"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const nlohmann::json& v = it.value();
    if (k == "r") {
      LLMT_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() < (1 << 20),
                 "%s: r must be a positive integer", path.c_str());
      c.r = v.get<int>();
    } else if (k == "lora_alpha") {
      LLMT_CHECK(v.is_number(), "%s: lora_alpha must be a number", path.c_str());
      c.alpha = v.get<double>();
    } else if (k == "lora_dropout") {
      LLMT_CHECK(v.is_number(), "%s: lora_dropout must be a number", path.c_str());
      c.dropout = v.get<double>();
    } else if (k == "use_rslora") {
      LLMT_CHECK(v.is_boolean(), "%s: use_rslora must be true or false", path.c_str());
      c.rslora = v.get<bool>();
    } else if (k == "fan_in_fan_out") {
      LLMT_CHECK(v.is_boolean(), "%s: fan_in_fan_out must be true or false", path.c_str());
      if (fifo) *fifo = v.get<bool>();
    } else if (k == "target_modules") {
      if (v.is_string() && lower_ascii(v.get<std::string>()) == "all-linear") c.target_modules = {"all-linear"};
      else if (v.is_string()) c.target_regex = v.get<std::string>();  // PEFT: a string is a regular expression
      else c.target_modules = names("target_modules");
    } else if (k == "init_lora_weights") {
      // How PEFT initialises A and B when it builds the layers; loading then overwrites them, except
      // where the initialisation rewrites the base weights too (PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA),
      // which a PEFT load repeats on the base: llmt would apply the adapter to another base
      const bool only_ab = v.is_boolean() || (v.is_string() && (v == "gaussian" || v == "orthogonal" || v == "eva"));
      LLMT_CHECK(only_ab, "%s: init_lora_weights %s: that initialisation rewrites the base model's weights when PEFT "
                 "loads the adapter (PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA), which llmt does not do; it reads adapters "
                 "initialised with true, false, gaussian, orthogonal or eva", path.c_str(),
                 clip_for_message(v.dump()).c_str());
    } else if (k == "modules_to_save") {
      if (!v.is_null()) c.modules_to_save = names("modules_to_save");
    } else if (k == "bias") {
      LLMT_CHECK(v.is_string() && v.get<std::string>() == "none",
                 "%s: bias %s: llmt trains LoRA with frozen biases only (bias \"none\")", path.c_str(),
                 clip_for_message(v.dump()).c_str());
    } else if (k == "base_model_name_or_path" && v.is_string()) {
      c.base_model_name_or_path = v.get<std::string>();
    } else if (k == "task_type") {
      LLMT_CHECK(v.is_null() || (v.is_string() && v.get<std::string>() == "CAUSAL_LM"),
                 "%s: task_type %s: llmt trains causal language models (CAUSAL_LM)", path.c_str(),
                 clip_for_message(v.dump()).c_str());
    } else if (k == "peft_type" || harmless.count(k)) {
    } else if (!unset(v)) {  // use_dora, lora_bias, rank_pattern, alpha_pattern, layers_to_transform, ...
      fail("%s: %s = %s is a PEFT option llmt does not implement (it trains plain LoRA: no DoRA, no per-layer "
           "ranks or layer selection, no bias training)", path.c_str(), k.c_str(), clip_for_message(v.dump()).c_str());
    }
  }
  LLMT_CHECK(j.contains("r") && j.contains("lora_alpha") && j.contains("target_modules"),
             "%s: needs r, lora_alpha and target_modules", path.c_str());
  return c;
}

void check_adapter_tensors(const SafetensorsFile& f, const LoraLayout& L) {
  std::set<std::string> want;
  for (auto& u : L.units)
    for (auto& p : u.params) {
      want.insert(p.hf_name);
      const StTensor* t = f.find(p.hf_name);
      LLMT_CHECK(t, "%s: no tensor %s", f.path().c_str(), p.hf_name.c_str());
      LLMT_CHECK(t->shape == p.shape, "%s: %s has shape %s, expected [%lld, %lld]", f.path().c_str(),
                 p.hf_name.c_str(), nlohmann::json(t->shape).dump().c_str(), (long long)p.shape[0],
                 (long long)p.shape[1]);
    }
  for (auto& t : f.tensors())
    LLMT_CHECK(want.count(t.name), "%s: tensor %s is not part of this adapter (r, target_modules and "
               "modules_to_save as adapter_config.json says)", f.path().c_str(), t.name.c_str());
}

void load_adapter_unit(const SafetensorsFile& f, const LoraLayout& L, int unit, float* host) {
  const UnitLayout& u = L.units.at((size_t)unit);
  std::fill(host, host + u.numel, 0.0f);
  for (auto& p : u.params) {
    const StTensor* t = f.find(p.hf_name);
    LLMT_CHECK(t && t->shape == p.shape, "%s: missing or misshapen %s", f.path().c_str(), p.hf_name.c_str());
    f.read_f32(*t, host + p.offset);
  }
}

void save_adapter(const std::string& dir, const LoraConfig& lora, const LoraLayout& L,
                  const std::vector<const float*>& unit_host) {
  LLMT_CHECK(unit_host.size() == L.units.size(), "save_adapter: %zu unit buffers for %zu units", unit_host.size(),
             L.units.size());
  LLMT_CHECK(::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST, "cannot make adapter directory %s: %s", dir.c_str(),
             std::strerror(errno));
  std::vector<StEntry> entries;
  for (size_t u = 0; u < L.units.size(); u++)
    for (auto& p : L.units[u].params) entries.push_back({p.hf_name, "F32", p.shape, unit_host[u] + p.offset});
  write_safetensors(dir + "/adapter_model.safetensors", entries);
  bool conv1d = false;
  for (auto& s : L.slots) conv1d = conv1d || s.proj.conv1d;
  write_file_atomic(dir + "/adapter_config.json", adapter_config_json(lora, conv1d).dump(2) + "\n");
}

}  // namespace llmt
