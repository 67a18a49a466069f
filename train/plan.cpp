#include "train/plan.h"

#include <algorithm>

#include "engine/core/error.h"
#include "models/layout.h"
#include "models/transformer.h"

namespace llmt {

nlohmann::json make_plan(const ModelConfig& cfg, const PlanArgs& a) {
  LLMT_CHECK(a.world > 0 && a.batch > 0 && a.seq_len > 0 && a.accum > 0,
             "llmt plan: world size, batch, sequence length and accumulation must be positive");
  LLMT_CHECK(a.seq_len <= cfg.max_seq_len, "llmt plan: sequence length %d exceeds the model's context of %d", a.seq_len,
             cfg.max_seq_len);
  Strategy s = parse_fsdp(a.fsdp);
  const int per_node = a.ranks_per_node > 0 ? a.ranks_per_node : a.world;
  LLMT_CHECK(a.world % per_node == 0, "llmt plan: %d ranks do not fill nodes of %d", a.world, per_node);
  ShardGroups g = shard_groups(s, a.world, per_node);
  ModelLayout L = make_layout(cfg);
  const int Ws = g.shard_size, Rp = g.replica_size;
  const double f = sizeof(float);

  // padded sizes and shards as FsdpStore lays them out
  auto padded = [&](int64_t n) { return (double)((n + Ws - 1) / Ws * Ws); };
  const double root = padded(L.units[0].numel), block = L.units.size() > 1 ? padded(L.units[1].numel) : 0.0;
  const int nb = cfg.n_layer;
  double shard_total = 0.0;
  for (auto& u : L.units) shard_total += padded(u.numel) / Ws;

  // gathered parameter and gradient buffers at their peak (see FsdpStore: prefetch keeps one unit ahead,
  // the root's gradient lives through backward, one reduction is in flight behind the current one)
  double gathered = 0.0;
  if (Ws > 1 && s != Strategy::shard_grad_op)
    gathered = std::max({root + block, 2 * root + block, root + 4 * block});
  else if (s == Strategy::shard_grad_op && Ws > 1)
    gathered = root + nb * block + root + 2 * block;
  else if (Rp > 1)
    gathered = root + 2 * block;
  gathered *= f;

  // bytes each rank sends per step
  double ag = 0.0, rs = 0.0, ar = 0.0;
  const double shard_root = root / Ws, shard_blocks = nb * block / Ws;
  if (Ws > 1) {
    double gathers = s == Strategy::shard_grad_op ? shard_root + shard_blocks : 3 * shard_root + 2 * shard_blocks;
    ag = a.accum * (Ws - 1) * gathers * f;
    rs = a.accum * (Ws - 1) * (shard_root + shard_blocks) * f;
  }
  if (Rp > 1) ar = a.accum * 2.0 * (Rp - 1) / Rp * (shard_root + shard_blocks) * f;

  double activations = (double)Transformer::activation_bytes(cfg, a.batch, a.seq_len, a.gradient_checkpointing);
  double persistent = 4 * shard_total * f;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  return {{"model", cfg.describe()},
          {"params", L.total_numel},
          {"world", a.world},
          {"ranks_per_node", per_node},
          {"strategy", strategy_name(s)},
          {"shard_group", Ws},
          {"replicas", Rp},
          {"batch", a.batch},
          {"seq_len", a.seq_len},
          {"accum", a.accum},
          {"gradient_checkpointing", a.gradient_checkpointing},
          {"persistent_gib", persistent / gib},
          {"gathered_peak_gib", gathered / gib},
          {"activations_gib", activations / gib},
          {"total_gib", (persistent + gathered + activations) / gib},
          {"comm_all_gather_gib", ag / gib},
          {"comm_reduce_scatter_gib", rs / gib},
          {"comm_all_reduce_gib", ar / gib},
          {"comm_total_gib", (ag + rs + ar) / gib},
          {"precision", "fp32 compute (CPU backend)"}};
}

std::string format_plan(const nlohmann::json& p) {
  return strformat(
      "plan   %s\n"
      "       %lld parameters, %s over %d ranks (%d per node): shards over %d, %d replica(s)\n"
      "       batch %d x %d tokens, accumulation %d%s\n"
      "per rank memory\n"
      "       persistent (fp32 master, grad, Adam m, v)  %8.3f GiB\n"
      "       gathered units at peak                     %8.3f GiB\n"
      "       activations and scratch                    %8.3f GiB\n"
      "       total                                      %8.3f GiB\n"
      "per rank, per step, bytes sent (ring convention)\n"
      "       all_gather %.3f GiB, reduce_scatter %.3f GiB, all_reduce %.3f GiB: %.3f GiB\n",
      p["model"].get<std::string>().c_str(), (long long)p["params"].get<int64_t>(),
      p["strategy"].get<std::string>().c_str(), p["world"].get<int>(), p["ranks_per_node"].get<int>(),
      p["shard_group"].get<int>(), p["replicas"].get<int>(), p["batch"].get<int>(), p["seq_len"].get<int>(),
      p["accum"].get<int>(), p["gradient_checkpointing"].get<bool>() ? ", gradient checkpointing" : "",
      p["persistent_gib"].get<double>(), p["gathered_peak_gib"].get<double>(), p["activations_gib"].get<double>(),
      p["total_gib"].get<double>(), p["comm_all_gather_gib"].get<double>(), p["comm_reduce_scatter_gib"].get<double>(),
      p["comm_all_reduce_gib"].get<double>(), p["comm_total_gib"].get<double>());
}

}  // namespace llmt
