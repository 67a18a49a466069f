// FSDP: each unit's flat fp32 parameters, gradients and Adam moments are split into equal shards
// over a shard group (the unit padded to a multiple of the group size); the full parameters of a
// unit exist only while the model uses it (gathered on acquire, the next unit prefetched), and its
// gradient is reduce-scattered into the shard as soon as backward is done with it.
//
// The four Hugging Face strategies are one mechanism with different groups:
//   full_shard     shard over every rank; re-gather in backward (ZeRO-3)
//   shard_grad_op  shard over every rank; keep a unit gathered from forward until its backward (ZeRO-2)
//   hybrid_shard   shard within a node, replicate across nodes (gradients all-reduced between replicas)
//   no_shard       a shard group of one: full replicas, gradients all-reduced (DDP)
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/dist/communicator.h"
#include "engine/optim/adamw.h"
#include "engine/params/layout.h"
#include "engine/params/unit_store.h"

namespace llmt {

enum class Strategy { full_shard, shard_grad_op, no_shard, hybrid_shard };

// Parses Hugging Face's --fsdp value ("full_shard auto_wrap", "shard_grad_op", "no_shard",
// "hybrid_shard", "" = no_shard); an option llmt does not implement (offload, ...) is an error.
Strategy parse_fsdp(const std::string& spec);
const char* strategy_name(Strategy s);

// Shard and replica group sizes for a strategy on this layout of ranks.
struct ShardGroups {
  int shard_size = 1;    // ranks a unit is split over
  int replica_size = 1;  // copies of each shard
};
ShardGroups shard_groups(Strategy s, int world, int local_size);

class FsdpStore : public UnitStore {
 public:
  // world: every rank. local_size: ranks per node (hybrid_shard shards within a node).
  FsdpStore(Backend& be, const ParamLayout& layout, Strategy strategy, DataComm& world, int local_size);
  ~FsdpStore() override;
  FsdpStore(const FsdpStore&) = delete;
  FsdpStore& operator=(const FsdpStore&) = delete;

  // UnitStore: what the model calls
  float* acquire(int unit) override;
  void release(int unit) override;
  void prefetch(int unit) override;
  float* grads(int unit) override;
  void grads_done(int unit) override;
  // Nothing is left to overlap the last reduction with: complete it, so its buffer is free before
  // the next micro-batch gathers again.
  void backward_done() override { finish_reduce(); }

  // the trainer's side
  void zero_grads();                // the shards' accumulated gradients, before a step's micro-batches
  double grad_sq_norm();            // sum of squares of the whole model's gradient (all ranks agree)
  void optimizer_step(float lr, const AdamWConfig& cfg, float grad_scale);
  int steps_done() const { return t_; }
  // Keeps this rank's shard of a unit's full parameters (host, every rank passes the same values).
  void set_unit(int unit, const float* full_host);
  // The full parameters of a unit into host memory (collective over the shard group).
  void get_unit(int unit, float* full_host);

  // This rank's shard of a unit: elements [lo, hi) of the unit's flat buffer (hi <= lo when the
  // shard is all padding), its master weights and Adam moments (for checkpoints), and its gradient
  // as the last step left it.
  struct ShardState {
    int64_t lo = 0, hi = 0;
    float *master = nullptr, *m = nullptr, *v = nullptr, *grad = nullptr;
  };
  ShardState shard_state(int unit) const;
  // Which copy of the shards this rank holds (0 .. replicas - 1): checkpoints write replica 0 only.
  int replica_index() const;
  void set_steps_done(int t) { t_ = t; }

  Strategy strategy() const { return strategy_; }
  const ShardGroups& groups() const { return groups_; }
  int64_t shard_numel(int unit) const { return units_[unit].shard; }
  // Bytes this rank holds for the whole run (master, grad, m, v shards) and the most held in
  // gathered parameter and gradient buffers at once so far.
  int64_t persistent_bytes() const;
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  // Bytes this rank has sent in the store's collectives so far (CommStats convention).
  double comm_bytes() const;

 private:
  struct Unit {
    int64_t numel = 0, padded = 0, shard = 0, lo = 0, hi = 0;  // [lo, hi): this rank's real elements
    float *master = nullptr, *grad = nullptr, *m = nullptr, *v = nullptr;  // shard-sized
    float* gathered = nullptr;                  // full parameters while in use
    std::unique_ptr<CommRequest> pending;       // a prefetch in flight into `gathered`
    float* full_grad = nullptr;                 // full gradient buffer during backward
  };
  float* take_buffer(int64_t numel);
  void give_buffer(float* p, int64_t numel);
  void start_gather(Unit& u);
  void finish_reduce();

  Backend& be_;
  const ParamLayout& layout_;
  Strategy strategy_;
  ShardGroups groups_;
  std::unique_ptr<DataComm> shard_comm_, replica_comm_;  // replica_comm_ null without replicas
  std::vector<Unit> units_;
  // gathered parameter and gradient buffers, reused by size (a block's, the root's)
  std::vector<std::pair<int64_t, float*>> free_buffers_;
  std::vector<float*> all_buffers_;
  int64_t gathered_now_ = 0, peak_gathered_bytes_ = 0;
  // the gradient reduction in flight: its unit, the full gradient being sent (owned until it
  // completes, no longer the unit's), and the shard-sized receive buffer
  int pending_reduce_unit_ = -1;
  std::unique_ptr<CommRequest> pending_reduce_;
  float* reduce_send_ = nullptr;
  float* reduce_recv_ = nullptr;
  int t_ = 0;
};

}  // namespace llmt
