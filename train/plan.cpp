#include "train/plan.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <string>

#include "engine/core/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/layout.h"
#include "models/lora.h"
#include "models/transformer.h"

namespace llmt {

namespace {

// One FSDP store's bytes per rank: its shards (persistent), its gathered buffers at their peak, and
// what it sends per step. Units as FsdpStore lays them out: a root unit, then n_layer equal blocks,
// each padded to split evenly over the shard group.
struct StoreBytes {
  double persistent = 0, gathered = 0, all_gather = 0, reduce_scatter = 0, all_reduce = 0;
};

// P: the compute dtype's bytes, S: the reduce dtype's. A frozen store holds the compute copy of its
// shards only and has no gradients to gather, reduce or step (engine/fsdp/fsdp.h).
StoreBytes store_bytes(const ParamLayout& L, int nb, Strategy s, const ShardGroups& g, double P, double S, bool bf16,
                       bool frozen, int accum) {
  const int Ws = g.shard_size, Rp = g.replica_size;
  const double G = frozen ? 0.0 : 4.0, f = 4.0;  // full gradients (f32), shards (f32)
  auto padded = [&](int64_t n) { return (double)((n + Ws - 1) / Ws * Ws); };
  const double root = padded(L.units[0].numel), block = L.units.size() > 1 ? padded(L.units[1].numel) : 0.0;
  double shard_total = 0.0;
  for (auto& u : L.units) shard_total += padded(u.numel) / Ws;
  StoreBytes b;
  b.persistent = frozen ? shard_total * P : 4 * shard_total * f + (bf16 ? shard_total * P : 0.0);

  // Gathered parameter and gradient buffers at their peak (see FsdpStore: prefetch keeps one unit
  // ahead, the root's gradient lives through backward, one reduction is in flight behind the
  // current unit's gradient; a bf16 reduction converts the f32 gradient into a bf16 send buffer).
  const double send = frozen || S == G ? 0.0 : 1.0;  // a separate send buffer exists in a non-f32 reduction
  const double inflight = frozen ? 0.0 : (send ? S : G);
  if (Ws > 1 && s != Strategy::shard_grad_op) {
    double fwd = std::max(root * P + block * P, 2 * block * P);
    double head = root * P + block * P + root * G;
    double bwd = root * G + 2 * block * P + block * G + block * inflight;
    double last = root * G + root * S * send;
    b.gathered = std::max({fwd, head, bwd, last});
  } else if (s == Strategy::shard_grad_op && Ws > 1) {
    b.gathered = root * P + nb * block * P + root * G + block * G + block * inflight;
  } else if (Rp > 1) {
    b.gathered = root * G + block * G + block * inflight;
  }

  // bytes each rank sends per step
  const double shard_root = root / Ws, shard_blocks = nb * block / Ws;
  if (Ws > 1) {
    // forward gathers the root twice (embeddings, head) and backward once more; shard_grad_op keeps
    // every unit gathered from forward to backward
    double gathers = s == Strategy::shard_grad_op ? shard_root + shard_blocks : 3 * shard_root + 2 * shard_blocks;
    b.all_gather = accum * (Ws - 1) * gathers * P;
    if (!frozen) b.reduce_scatter = accum * (Ws - 1) * (shard_root + shard_blocks) * S;
  }
  if (Rp > 1 && !frozen) b.all_reduce = accum * 2.0 * (Rp - 1) / Rp * (shard_root + shard_blocks) * S;
  return b;
}

}  // namespace

Plan plan_run(const ModelConfig& cfg, const PlanArgs& a) {
  LLMT_CHECK(a.world > 0 && a.batch > 0 && a.seq_len > 0 && a.accum > 0,
             "llmt plan: world size, batch, sequence length and accumulation must be positive");
  LLMT_CHECK(a.seq_len <= cfg.max_seq_len, "llmt plan: sequence length %d exceeds the model's context of %d", a.seq_len,
             cfg.max_seq_len);
  Strategy s = parse_fsdp(a.fsdp);
  const int per_node = a.ranks_per_node > 0 ? a.ranks_per_node : a.world;
  ShardGroups g = shard_groups(s, a.world, per_node);
  ModelLayout L = make_layout(cfg);
  const DType compute = a.bf16 ? DType::bf16 : DType::f32;
  const double P = (double)dtype_size(compute), S = (double)dtype_size(a.reduce_dtype);
  const bool lora = a.lora.has_value();
  // the model's store (frozen under LoRA), and the adapter's beside it; their peaks are added, a bound
  StoreBytes base = store_bytes(L, cfg.n_layer, s, g, P, S, a.bf16, lora, a.accum);
  StoreBytes adapter;
  LoraLayout lora_layout;
  if (lora) {
    lora_layout = make_lora_layout(cfg, *a.lora);
    adapter = store_bytes(lora_layout, cfg.n_layer, s, g, P, S, a.bf16, false, a.accum);
  }
  // the step's scalars: the loss summed over every rank, the gradient's squares over a shard group
  const int Ws = g.shard_size;
  const double scalars = 2.0 * (a.world - 1) / a.world * 8.0 + 2.0 * (Ws - 1) / Ws * 8.0;

  std::vector<ActivationBuffer> bufs =
      Transformer::activation_buffers(cfg, a.batch, a.seq_len, a.gradient_checkpointing, compute, a.vocab_pad,
                                      a.logits_chunk_tokens);
  double activations = 0.0;
  std::map<std::string, double> by_buffer;
  for (const ActivationBuffer& b : bufs) {
    activations += (double)b.bytes();
    by_buffer[b.name] += (double)b.bytes();
  }
  if (lora) {  // each adapted projection's h, one dh, and the dropout scratch
    const double h = (double)LoraAdapters::activation_bytes(cfg, *a.lora, lora_layout, a.batch, a.seq_len, compute);
    activations += h;
    by_buffer["LoRA adapters (h, dh, dropout)"] += h;
  }
  if (a.vocab_pad > 1) {  // a GPU (the only place logits rows are padded): the attention backward's scratch
    const double scratch = (double)cuda_attention_scratch_bytes(a.batch, a.seq_len, cfg.n_head, cfg.n_kv_head,
                                                                cfg.head_size(), compute);
    activations += scratch;
    by_buffer["attention backward scratch (GPU)"] += scratch;
  }
  const double gib = 1024.0 * 1024.0 * 1024.0;
  Plan p;
  p.model = cfg.describe();
  p.params = L.total_numel;
  if (lora) {
    p.adapter_params = lora_layout.total_numel;
    p.adapter = strformat("LoRA r %d on %zu projections a block%s", a.lora->r, lora_layout.slots.size(),
                          lora_layout.saved.empty() ? "" : " and modules_to_save");
  }
  p.world = a.world;
  p.ranks_per_node = per_node;
  p.strategy = s;
  p.shard_group = Ws;
  p.replicas = g.replica_size;
  p.batch = a.batch;
  p.seq_len = a.seq_len;
  p.accum = a.accum;
  p.gradient_checkpointing = a.gradient_checkpointing;
  p.compute_dtype = compute;
  p.reduce_dtype = a.reduce_dtype;
  p.persistent_gib = (base.persistent + adapter.persistent) / gib;
  p.gathered_peak_gib = (base.gathered + adapter.gathered) / gib;
  p.activations_gib = activations / gib;
  for (auto& kv : by_buffer) p.activations_by_buffer_gib[kv.first] = kv.second / gib;
  p.total_gib = p.persistent_gib + p.gathered_peak_gib + p.activations_gib;
  p.comm_all_gather_bytes = base.all_gather + adapter.all_gather;
  p.comm_reduce_scatter_bytes = base.reduce_scatter + adapter.reduce_scatter;
  p.comm_all_reduce_bytes = base.all_reduce + adapter.all_reduce + scalars;
  p.comm_total_bytes = p.comm_all_gather_bytes + p.comm_reduce_scatter_bytes + p.comm_all_reduce_bytes;
  p.flops_per_token = lora ? lora_flops_per_token(cfg, L, *a.lora, lora_layout, a.seq_len)
                           : Transformer::flops_per_token(cfg, L, a.seq_len);
  p.kv_cache_gib = Transformer::kv_cache_bytes(cfg, a.batch, a.seq_len, p.compute_dtype) / gib;
  return p;
}

nlohmann::json plan_json(const Plan& p) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  nlohmann::json act_json = nlohmann::json::object();
  for (auto& kv : p.activations_by_buffer_gib) act_json[kv.first] = kv.second;
  nlohmann::json j = {{"model", p.model},
          {"params", p.params},
          {"world", p.world},
          {"ranks_per_node", p.ranks_per_node},
          {"strategy", strategy_name(p.strategy)},
          {"shard_group", p.shard_group},
          {"replicas", p.replicas},
          {"batch", p.batch},
          {"seq_len", p.seq_len},
          {"accum", p.accum},
          {"gradient_checkpointing", p.gradient_checkpointing},
          {"compute_dtype", dtype_name(p.compute_dtype)},
          {"reduce_dtype", dtype_name(p.reduce_dtype)},
          {"persistent_gib", p.persistent_gib},
          {"gathered_peak_gib", p.gathered_peak_gib},
          {"activations_gib", p.activations_gib},
          {"activations_by_buffer_gib", act_json},
          {"total_gib", p.total_gib},
          {"comm_all_gather_bytes", p.comm_all_gather_bytes},
          {"comm_reduce_scatter_bytes", p.comm_reduce_scatter_bytes},
          {"comm_all_reduce_bytes", p.comm_all_reduce_bytes},
          {"comm_total_bytes", p.comm_total_bytes},
          {"comm_total_gib", p.comm_total_bytes / gib},
          {"flops_per_token", p.flops_per_token},
          {"flops_convention", Transformer::kFlopsConvention},
          {"kv_cache_gib", p.kv_cache_gib}};
  if (!p.adapter.empty()) j["adapter"] = p.adapter, j["adapter_params"] = p.adapter_params;
  return j;
}

nlohmann::json make_plan(const ModelConfig& cfg, const PlanArgs& a) { return plan_json(plan_run(cfg, a)); }

double memory_per_rank_gib(Backend* be, int local_rank, int local_size, std::string* where) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  size_t free_b = 0, total_b = 0;
  if (be && be->device_memory(&free_b, &total_b)) {
    const int devices = std::max(1, cuda_device_count());
    const int sharing = (local_size + devices - 1) / devices;  // ranks on this rank's GPU
    *where = strformat("its GPU (cuda:%d) has %.2f GiB free of %.2f GiB%s", local_rank % devices, free_b / gib,
                       total_b / gib, sharing > 1 ? strformat(", shared by %d ranks", sharing).c_str() : "");
    return (double)free_b / gib / sharing;
  }
  double available_kib = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    double value = 0;
    std::string unit;
    meminfo >> value >> unit;
    if (key == "MemAvailable:") available_kib = value;
  }
  if (available_kib <= 0) return 0.0;  // not Linux, or unreadable: nothing to compare with
  const double per_rank = available_kib / (1024.0 * 1024.0) / local_size;
  *where = strformat("this node has %.2f GiB available for each of its %d rank%s", per_rank, local_size,
                     local_size == 1 ? "" : "s");
  return per_rank;
}

std::string format_plan(const nlohmann::json& p) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const bool bf16 = p["compute_dtype"] == "bf16", lora = p.contains("adapter");
  const std::string adapter =
      lora ? strformat("       %s: %lld parameters trained, the model's frozen\n",
                       p["adapter"].get<std::string>().c_str(), (long long)p["adapter_params"].get<int64_t>())
           : "";
  const char* persistent = lora   ? (bf16 ? "persistent (frozen bf16 base; adapter)"
                                          : "persistent (frozen base; adapter's state)")
                           : bf16 ? "persistent (fp32 master, grad, m, v; bf16)"
                                  : "persistent (fp32 master, grad, Adam m, v)";
  return strformat(
      "plan   %s\n"
      "       %lld parameters, %s over %d ranks (%d per node): shards over %d, %d replica(s)\n"
      "%s"
      "       batch %d x %d tokens, accumulation %d%s; compute %s, gradients reduced in %s\n"
      "per rank memory\n"
      "       %-42s %8.3f GiB\n"
      "       gathered units at peak                     %8.3f GiB\n"
      "       activations and scratch                    %8.3f GiB\n"
      "       total                                      %8.3f GiB\n"
      "per rank, per step, bytes sent (ring convention)\n"
      "       all_gather %.3f GiB, reduce_scatter %.3f GiB, all_reduce %.3f GiB: %.3f GiB\n"
      "llmt generate, %d sequences of %d tokens: KV cache %.3f GiB\n",
      p["model"].get<std::string>().c_str(), (long long)p["params"].get<int64_t>(),
      p["strategy"].get<std::string>().c_str(), p["world"].get<int>(), p["ranks_per_node"].get<int>(),
      p["shard_group"].get<int>(), p["replicas"].get<int>(), adapter.c_str(), p["batch"].get<int>(),
      p["seq_len"].get<int>(),
      p["accum"].get<int>(), p["gradient_checkpointing"].get<bool>() ? ", gradient checkpointing" : "",
      p["compute_dtype"].get<std::string>().c_str(), p["reduce_dtype"].get<std::string>().c_str(),
      persistent, p["persistent_gib"].get<double>(), p["gathered_peak_gib"].get<double>(),
      p["activations_gib"].get<double>(), p["total_gib"].get<double>(),
      p["comm_all_gather_bytes"].get<double>() / gib, p["comm_reduce_scatter_bytes"].get<double>() / gib,
      p["comm_all_reduce_bytes"].get<double>() / gib, p["comm_total_bytes"].get<double>() / gib, p["batch"].get<int>(),
      p["seq_len"].get<int>(), p["kv_cache_gib"].get<double>());
}

}  // namespace llmt
