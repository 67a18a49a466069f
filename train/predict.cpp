#include "train/predict.h"

#include <algorithm>
#include <map>

#include "engine/core/error.h"
#include "models/layout.h"
#include "models/transformer.h"

namespace llmt {

// Datasheet figures (NVIDIA A100 and H100/H200 datasheets: dense bf16 tensor-core peak, HBM
// bandwidth of the SXM parts) and nccl-tests bus bandwidths typical of each NVLink generation for
// all_gather and reduce_scatter within 8 GPUs (A100 NVLink 3: about 230 GB/s; H100 NVLink 4: about
// 360 GB/s). "h100-hbm2e" is the 96 GB HBM2e part of torchtitan's published runs (2.4 TB/s).
ClusterSpec cluster_preset(const std::string& gpu) {
  static const std::map<std::string, ClusterSpec> presets = [] {
    std::map<std::string, ClusterSpec> m;
    auto add = [&](const char* name, double tflops, double tbps, double nvlink, double nic) {
      ClusterSpec c;
      c.gpu = name;
      c.peak_tflops = tflops;
      c.hbm_tbps = tbps;
      c.nvlink_busbw_gbps = nvlink;
      c.nic_gbits_per_gpu = nic;
      m[name] = c;
    };
    add("a100", 312.0, 2.039, 230.0, 200.0);
    add("h100", 989.4, 3.35, 360.0, 400.0);
    add("h100-hbm2e", 989.4, 2.4, 360.0, 400.0);
    add("h200", 989.4, 4.8, 360.0, 400.0);
    return m;
  }();
  auto it = presets.find(gpu);
  LLMT_CHECK(it != presets.end(), "llmt plan --gpu %s: unknown (%s)", gpu.c_str(), cluster_preset_names().c_str());
  return it->second;
}

std::string cluster_preset_names() { return "a100, h100, h100-hbm2e, h200"; }

nlohmann::json predict_step(const ModelConfig& cfg, const PlanArgs& a, const ClusterSpec& c) {
  LLMT_CHECK(c.peak_tflops > 0 && c.hbm_tbps > 0 && c.nvlink_busbw_gbps > 0 && c.nic_gbits_per_gpu > 0,
             "llmt plan --predict: the GPU's peak, HBM bandwidth and the link bandwidths must be positive");
  LLMT_CHECK(c.matmul_efficiency > 0 && c.matmul_efficiency <= 1 && c.attention_efficiency > 0 &&
                 c.attention_efficiency <= 1,
             "llmt plan --predict: efficiencies lie in (0, 1]");
  LLMT_CHECK(c.recompute == "none" || c.recompute == "selective" || c.recompute == "full",
             "llmt plan --recompute must be none, selective or full, got \"%s\"", c.recompute.c_str());
  const nlohmann::json plan = make_plan(cfg, a);
  const ModelLayout L = make_layout(cfg);
  const Strategy s = parse_fsdp(a.fsdp);
  const int per_node = a.ranks_per_node > 0 ? a.ranks_per_node : a.world;
  const ShardGroups g = shard_groups(s, a.world, per_node);
  const int Ws = g.shard_size, nb = cfg.n_layer;
  const double peak = c.peak_tflops * 1e12, hbm = c.hbm_tbps * 1e12 * 0.8;  // 80% of HBM peak is what streams reach
  const double tokens = (double)a.batch * a.seq_len;                       // per micro-batch and rank

  // ---- compute, per micro-batch: a block's forward and backward, and the root's (embedding, head, loss)
  const double head = (double)cfg.vocab_size * cfg.d_model;
  const double mm_block = ((double)L.matmul_numel - head) / nb;  // matmul weights of one block
  const double act = a.bf16 ? 2.0 : 4.0;
  // elementwise bytes per token of one block's forward (norms, rotary or GELU, SwiGLU, residual adds:
  // read and write of each, counted from llmt's kernels); backward moves about twice that
  const double kv = (double)cfg.n_kv_head * cfg.head_size();
  const double elem_fwd = cfg.arch == Arch::llama ? (10.0 * cfg.d_model + 2.0 * kv + 3.0 * cfg.d_ff) * act
                                                  : (10.0 * cfg.d_model + 2.0 * cfg.d_ff) * act;
  // causal attention: half the PaLM term's FLOPs are computed (masked blocks are skipped); a third of
  // them in forward; per token and block, the layers' mean (sliding windows count their band)
  const double attn_fwd = Transformer::attention_flops_per_token(cfg, a.seq_len) / 3.0 / 2.0 / nb;
  // recomputation: full = the block's forward again in backward; selective (torchtitan's op-level
  // policy) = half the matmuls' forward and every elementwise op again, attention kept
  const double re_mm = c.recompute == "full" ? 1.0 : c.recompute == "selective" ? 0.5 : 0.0;
  const double re_attn = c.recompute == "full" ? 1.0 : 0.0, re_elem = c.recompute == "none" ? 0.0 : 1.0;
  const double t_mm_f = tokens * 2.0 * mm_block / (peak * c.matmul_efficiency);
  const double t_attn_f = tokens * attn_fwd / (peak * c.attention_efficiency);
  const double t_elem_f = tokens * elem_fwd / hbm;
  const double block_fwd = t_mm_f + t_attn_f + t_elem_f;
  const double block_bwd = 2.0 * (t_mm_f + t_attn_f + t_elem_f) + re_mm * t_mm_f + re_attn * t_attn_f + re_elem * t_elem_f;
  // the root: the head's matmul (2 V d per token forward, 4 backward) and the loss over V logits
  // (written, read by the softmax, its gradient written: about 4 V values a token)
  const double root_fwd = tokens * 2.0 * head / (peak * c.matmul_efficiency) + tokens * 2.0 * cfg.vocab_size * act / hbm;
  const double root_bwd = 2.0 * root_fwd;
  const double compute = a.accum * (nb * (block_fwd + block_bwd) + root_fwd + root_bwd);

  // ---- the optimizer: AdamW's 28 bytes a parameter of the shard (+2 for the bf16 copy), the
  // gradient norm's read and the zeroing's write
  double shard = 0.0;
  for (const UnitLayout& u : L.units) shard += (double)((u.numel + Ws - 1) / Ws);
  const double optimizer = shard * (28.0 + (a.bf16 ? 2.0 : 0.0) + 8.0) / hbm;

  // ---- communication: a collective over ranks of one node runs at NVLink's busbw; one that crosses
  // nodes at the node's NICs together (rings cross between nodes once per node), at most NVLink's
  const double nvlink = c.nvlink_busbw_gbps * 1e9;
  const double network = std::min(nvlink, c.gpus_per_node * c.nic_gbits_per_gpu / 8.0 * 1e9 * c.nic_efficiency);
  const bool shard_crosses_nodes = Ws > std::min(per_node, c.gpus_per_node);
  const bool replicas_cross_nodes = g.replica_size > 1 && a.world > std::min(per_node, c.gpus_per_node);
  const double bw_shard = shard_crosses_nodes ? network : nvlink, bw_rep = replicas_cross_nodes ? network : nvlink;
  const double P = a.bf16 ? 2.0 : 4.0, S = dtype_size(a.reduce_dtype);
  auto shard_bytes = [&](int64_t n) { return (double)((n + Ws - 1) / Ws) * (Ws - 1); };  // sent per gather
  const double root_n = (double)L.units[0].numel, block_n = nb > 0 ? (double)L.units[1].numel : 0.0;
  const double g_root = Ws > 1 ? shard_bytes(L.units[0].numel) * P / bw_shard : 0.0;
  const double g_block = Ws > 1 && nb > 0 ? shard_bytes(L.units[1].numel) * P / bw_shard : 0.0;
  const double rs_root = Ws > 1 ? shard_bytes(L.units[0].numel) * S / bw_shard : 0.0;
  const double rs_block = Ws > 1 && nb > 0 ? shard_bytes(L.units[1].numel) * S / bw_shard : 0.0;
  // replicas average each unit's reduced shard: an all_reduce of 2 (R-1)/R of it
  const double R = g.replica_size;
  const double ar_root = R > 1 ? 2.0 * (R - 1) / R * (root_n / Ws) * S / bw_rep : 0.0;
  const double ar_block = R > 1 ? 2.0 * (R - 1) / R * (block_n / Ws) * S / bw_rep : 0.0;
  const bool regather = s != Strategy::shard_grad_op;  // shard_grad_op keeps forward's gathers for backward
  double exposed = 0.0;
  // forward: the root's first gather has nothing to hide behind; each block hides the next unit's gather
  exposed += g_root;
  for (int i = 0; i < nb; i++) exposed += std::max(0.0, (i + 1 < nb ? g_block : g_root) - block_fwd);
  // backward: the head's backward hides the last block's gather; each block hides the one before's
  // gather and the reduction of the one after's gradient; the last reductions are exposed
  exposed += std::max(0.0, (regather ? g_block : 0.0) - root_bwd);
  for (int i = nb - 1; i >= 0; i--) {
    const double gather = regather && i > 0 ? g_block : 0.0;
    const double reduce = i == nb - 1 ? rs_root + ar_root : rs_block + ar_block;
    exposed += std::max(0.0, gather + reduce - block_bwd);
  }
  exposed += rs_block + ar_block;
  exposed *= a.accum;
  const double comm_total = a.accum * ((regather ? 3.0 : 1.0) * g_root + (regather ? 2.0 : 1.0) * nb * g_block +
                                       rs_root + nb * rs_block + ar_root + nb * ar_block);

  const double step = compute + optimizer + exposed;
  const double tokens_per_gpu = tokens * a.accum / step;
  const double flops_per_token = Transformer::flops_per_token(cfg, L, a.seq_len);
  return {{"plan", plan},
          {"gpu", c.gpu},
          {"peak_tflops", c.peak_tflops},
          {"hbm_tbps", c.hbm_tbps},
          {"matmul_efficiency", c.matmul_efficiency},
          {"attention_efficiency", c.attention_efficiency},
          {"gpus_per_node", c.gpus_per_node},
          {"nvlink_busbw_gbps", c.nvlink_busbw_gbps},
          {"nic_gbits_per_gpu", c.nic_gbits_per_gpu},
          {"network_busbw_gbps", network / 1e9},
          {"shard_group_crosses_nodes", shard_crosses_nodes},
          {"recompute", c.recompute},
          {"step_s", step},
          {"compute_s", compute},
          {"matmul_s", a.accum * (nb * (3.0 + re_mm) * t_mm_f + 3.0 * tokens * 2.0 * head / (peak * c.matmul_efficiency))},
          {"attention_s", a.accum * nb * (3.0 + re_attn) * t_attn_f},
          {"optimizer_s", optimizer},
          {"comm_total_s", comm_total},
          {"comm_exposed_s", exposed},
          {"tokens_per_s_per_gpu", tokens_per_gpu},
          {"tokens_per_s", tokens_per_gpu * a.world},
          {"mfu", flops_per_token * tokens_per_gpu / peak},
          {"flops_convention", Transformer::kFlopsConvention}};
}

std::string format_prediction(const nlohmann::json& p) {
  return strformat(
      "predict on %s: %.0f TFLOP/s bf16 peak, HBM %.2f TB/s; matmuls at %.0f%% of peak, attention at %.0f%%; "
      "%d GPUs a node, NVLink busbw %.0f GB/s, %.0f Gb/s a GPU between nodes (busbw %.0f GB/s)%s; recompute %s\n"
      "per step %.1f ms: compute %.1f ms (matmuls %.1f, attention %.1f), optimizer %.1f ms, communication %.1f ms "
      "of which %.1f ms exposed\n"
      "predicted %.0f tokens/s per GPU (%.0f in all), MFU %.1f%% (%s)\n",
      p["gpu"].get<std::string>().c_str(), p["peak_tflops"].get<double>(), p["hbm_tbps"].get<double>(),
      100 * p["matmul_efficiency"].get<double>(), 100 * p["attention_efficiency"].get<double>(),
      p["gpus_per_node"].get<int>(), p["nvlink_busbw_gbps"].get<double>(), p["nic_gbits_per_gpu"].get<double>(),
      p["network_busbw_gbps"].get<double>(),
      p["shard_group_crosses_nodes"].get<bool>() ? "; the shard group crosses nodes" : "",
      p["recompute"].get<std::string>().c_str(), 1e3 * p["step_s"].get<double>(), 1e3 * p["compute_s"].get<double>(),
      1e3 * p["matmul_s"].get<double>(), 1e3 * p["attention_s"].get<double>(), 1e3 * p["optimizer_s"].get<double>(),
      1e3 * p["comm_total_s"].get<double>(), 1e3 * p["comm_exposed_s"].get<double>(),
      p["tokens_per_s_per_gpu"].get<double>(), p["tokens_per_s"].get<double>(), 100 * p["mfu"].get<double>(),
      p["flops_convention"].get<std::string>().c_str());
}

}  // namespace llmt
