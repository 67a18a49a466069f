// FSDP: each unit's flat fp32 master parameters, gradients and Adam moments are split into equal
// shards over a shard group (the unit padded to a multiple of the group size); the full parameters
// of a unit exist only while the model uses it (gathered on acquire, the next unit prefetched), and
// its gradient is reduce-scattered into the shard as soon as backward is done with it.
//
// The four Hugging Face strategies are one mechanism with different groups:
//   full_shard     shard over every rank; re-gather in backward (ZeRO-3)
//   shard_grad_op  shard over every rank; keep a unit gathered from forward until its backward (ZeRO-2)
//   hybrid_shard   shard within a node, replicate across nodes (gradients all-reduced between replicas)
//   no_shard       a shard group of one: full replicas, gradients all-reduced (DDP)
//
// Mixed precision, as PyTorch FSDP's MixedPrecision(param_dtype, reduce_dtype): when the backend
// computes in bf16, each shard also keeps a bf16 compute copy that the optimizer writes, the
// gathers move the compute copy (half the bytes), and the model's full gradients (f32) are
// reduce-scattered in the reduce dtype (f32 by default, bf16 on request) and accumulate in the f32
// shard. In f32 the compute copy is the master itself.
//
// A frozen store (LoRA's base model) holds parameters that nothing updates: the compute copy of each
// shard only (under bf16 no f32 master either), no gradient, no Adam moments; grads(u) is an empty
// tensor, which tells the model to skip the unit's parameter-gradient products, and grads_done,
// zero_grads and optimizer_step move no bytes. It gathers for compute as any store does.
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
  // reduce_dtype: what gradients travel in (f32 or bf16). frozen: parameters only (above).
  FsdpStore(Backend& be, const ParamLayout& layout, Strategy strategy, DataComm& world, int local_size,
            DType reduce_dtype = DType::f32, bool frozen = false);
  ~FsdpStore() override;
  FsdpStore(const FsdpStore&) = delete;
  FsdpStore& operator=(const FsdpStore&) = delete;

  // UnitStore: what the model calls
  Tensor acquire(int unit) override;
  void release(int unit) override;
  void prefetch(int unit) override;
  Tensor grads(int unit) override;  // empty in a frozen store
  void grads_done(int unit) override;
  // Nothing is left to overlap the last reduction with: complete it, so its buffer is free before
  // the next micro-batch gathers again.
  void backward_done() override { finish_reduce(); }

  // the trainer's side
  void zero_grads();  // the shards' accumulated gradients, before a step's micro-batches
  // out[0] (f64 on the backend, =) the sum of squares of the whole model's gradient; every rank
  // gets the same value once the work issued so far has run (no host read here).
  void grad_sq_sum(Tensor out);
  void optimizer_step(float lr, const AdamWConfig& cfg, float grad_scale);
  int steps_done() const { return t_; }
  // Keeps this rank's shard of a unit's full parameters (host, every rank passes the same values).
  void set_unit(int unit, const float* full_host);
  // The full fp32 master parameters of a unit into host memory (collective over the shard group).
  void get_unit(int unit, float* full_host);
  bool frozen() const { return frozen_; }
  // Rewrites every compute copy from its master (after the masters were loaded from a checkpoint).
  void masters_changed();

  // This rank's shard of a unit: elements [lo, hi) of the unit's flat buffer (hi <= lo when the
  // shard is all padding), its f32 master weights and Adam moments (for checkpoints), and its
  // gradient as the last step left it; each a [shard] tensor on the backend (a frozen store has no
  // moments or gradient, and under bf16 no master: empty tensors).
  struct ShardState {
    int64_t lo = 0, hi = 0;
    Tensor master, m, v, grad;
  };
  ShardState shard_state(int unit) const;
  // Which copy of the shards this rank holds (0 .. replicas - 1): checkpoints write replica 0 only.
  int replica_index() const;
  void set_steps_done(int t) { t_ = t; }

  Strategy strategy() const { return strategy_; }
  Backend& backend() const { return be_; }
  const ShardGroups& groups() const { return groups_; }
  DType compute_dtype() const { return compute_; }
  DType reduce_dtype() const { return reduce_; }
  int64_t shard_numel(int unit) const { return units_[unit].shard; }
  // Bytes this rank holds for the whole run (master, grad, m, v shards and a separate compute
  // copy; a frozen store's compute copy only) and the most held in gathered parameter and gradient buffers at once so far.
  int64_t persistent_bytes() const;
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }
  // Bytes this rank has sent in the store's collectives so far (CommStats convention).
  double comm_bytes() const;

 private:
  struct Unit {
    int64_t numel = 0, padded = 0, shard = 0, lo = 0, hi = 0;  // [lo, hi): this rank's real elements
    Tensor master, grad, m, v;             // f32 [shard]
    Tensor compute;                        // [shard] in the compute dtype (the master itself in f32)
    Tensor gathered;                       // [padded] compute dtype, full parameters while in use
    std::unique_ptr<CommRequest> pending;  // a prefetch in flight into `gathered`
    Tensor full_grad;                      // [padded] f32, the full gradient during backward
    const void* held = nullptr;            // the parameters the backend was told are unchanged (hold)
  };
  // A pooled buffer: reused by size, never before the event of its last use.
  struct Pooled {
    int64_t bytes = 0;
    void* p = nullptr;
    std::unique_ptr<Event> last_use;
  };
  Tensor take_buffer(DType t, int64_t numel);
  void give_buffer(Tensor& buf);
  void start_gather(Unit& u);
  void finish_reduce();
  // Backend::params_held from acquire until the gathered buffer goes back to the pool, or, where the
  // unit is the compute copy itself (a shard group of one), until a load writes it (the optimizer
  // writes it through the backend's adamw, which the hold allows).
  void hold(Unit& u, const Tensor& params);
  void unhold(Unit& u);

  Backend& be_;
  const ParamLayout& layout_;
  Strategy strategy_;
  ShardGroups groups_;
  DType compute_, reduce_;
  std::unique_ptr<DataComm> shard_comm_, replica_comm_;  // replica_comm_ null without replicas
  std::vector<Unit> units_;
  std::vector<Pooled> free_buffers_;
  std::vector<void*> all_buffers_;
  int64_t gathered_now_ = 0, peak_gathered_bytes_ = 0;
  // the gradient reduction in flight: its unit, the buffer being sent (owned until it completes, no
  // longer the unit's), and the shard-sized receive buffer
  int pending_reduce_unit_ = -1;
  std::unique_ptr<CommRequest> pending_reduce_;
  Tensor reduce_send_, reduce_recv_;
  int t_ = 0;
  bool frozen_ = false;
};

}  // namespace llmt
