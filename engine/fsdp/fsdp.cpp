#include "engine/fsdp/fsdp.h"

#include <algorithm>
#include <cstring>

#include "engine/core/error.h"

namespace llmt {

Strategy parse_fsdp(const std::string& spec) {
  // Hugging Face accepts a space-separated list: a strategy plus options such as auto_wrap.
  Strategy s = Strategy::no_shard;
  int strategies = 0;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(' ', pos);
    if (end == std::string::npos) end = spec.size();
    std::string word = spec.substr(pos, end - pos);
    pos = end + 1;
    if (word.empty()) continue;
    if (word == "full_shard") s = Strategy::full_shard, strategies++;
    else if (word == "shard_grad_op") s = Strategy::shard_grad_op, strategies++;
    else if (word == "no_shard") s = Strategy::no_shard, strategies++;
    else if (word == "hybrid_shard") s = Strategy::hybrid_shard, strategies++;
    else if (word == "auto_wrap") continue;  // llmt always wraps one unit per transformer block
    else
      fail("--fsdp \"%s\": \"%s\" is not supported (full_shard, shard_grad_op, hybrid_shard, no_shard, auto_wrap)",
           spec.c_str(), word.c_str());
  }
  LLMT_CHECK(strategies <= 1, "--fsdp \"%s\" names more than one sharding strategy", spec.c_str());
  return s;
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::full_shard: return "full_shard";
    case Strategy::shard_grad_op: return "shard_grad_op";
    case Strategy::no_shard: return "no_shard";
    case Strategy::hybrid_shard: return "hybrid_shard";
  }
  return "?";
}

ShardGroups shard_groups(Strategy s, int world, int local_size) {
  ShardGroups g;
  switch (s) {
    case Strategy::full_shard:
    case Strategy::shard_grad_op: g.shard_size = world; break;
    case Strategy::no_shard: g.shard_size = 1; break;
    case Strategy::hybrid_shard:
      LLMT_CHECK(local_size > 0 && world % local_size == 0,
                 "hybrid_shard shards within a node: the world size %d is not a multiple of the %d ranks per node",
                 world, local_size);
      g.shard_size = local_size;
      break;
  }
  g.replica_size = world / g.shard_size;
  return g;
}

namespace {
Tensor alloc_tensor(Backend& be, DType t, int64_t n) { return Tensor(be.alloc((size_t)n * dtype_size(t)), t, {n}); }
}  // namespace

FsdpStore::FsdpStore(Backend& be, const ParamLayout& layout, Strategy strategy, DataComm& world, int local_size,
                     DType reduce_dtype, bool frozen)
    : be_(be),
      layout_(layout),
      strategy_(strategy),
      groups_(shard_groups(strategy, world.size(), local_size)),
      compute_(be.compute_dtype()),
      reduce_(reduce_dtype),
      frozen_(frozen) {
  LLMT_CHECK(reduce_ == DType::f32 || reduce_ == DType::bf16, "fsdp: gradients reduce in f32 or bf16, not %s",
             dtype_name(reduce_));
  // Shard group: consecutive ranks (a node's ranks for hybrid_shard); replicas: same position in each group.
  const int r = world.rank();
  shard_comm_ = world.split(r / groups_.shard_size, r);
  if (groups_.replica_size > 1) replica_comm_ = world.split(r % groups_.shard_size, r);
  const int W = groups_.shard_size, me = shard_comm_->rank();
  int64_t max_shard = 0;
  for (const UnitLayout& ul : layout.units) {
    Unit u;
    u.numel = ul.numel;
    u.padded = (ul.numel + W - 1) / W * W;
    u.shard = u.padded / W;
    u.lo = std::min<int64_t>(u.numel, me * u.shard);
    u.hi = std::min<int64_t>(u.numel, (me + 1) * u.shard);
    // frozen: the compute copy alone (the f32 master is that copy in f32, absent under bf16)
    if (!frozen_ || compute_ == DType::f32) u.master = alloc_tensor(be_, DType::f32, u.shard);
    if (!frozen_) {
      u.grad = alloc_tensor(be_, DType::f32, u.shard);
      u.m = alloc_tensor(be_, DType::f32, u.shard);
      u.v = alloc_tensor(be_, DType::f32, u.shard);
    }
    u.compute = compute_ == DType::f32 ? u.master : alloc_tensor(be_, compute_, u.shard);
    max_shard = std::max(max_shard, u.shard);
    units_.push_back(std::move(u));
  }
  if (!frozen_) reduce_recv_ = alloc_tensor(be_, reduce_, max_shard);
}

FsdpStore::~FsdpStore() {
  for (auto& u : units_) {
    unhold(u);
    if (u.pending) u.pending->wait_host();
  }
  if (pending_reduce_) pending_reduce_->wait_host();
  be_.synchronize();
  for (auto& u : units_) {
    for (Tensor* t : {&u.master, &u.grad, &u.m, &u.v})
      if (t->data) be_.release(t->data);
    if (u.compute.data != u.master.data) be_.release(u.compute.data);
  }
  for (void* p : all_buffers_) be_.release(p);
  if (reduce_recv_.data) be_.release(reduce_recv_.data);
}

Tensor FsdpStore::take_buffer(DType t, int64_t numel) {
  const int64_t bytes = numel * (int64_t)dtype_size(t);
  void* p = nullptr;
  for (size_t i = 0; i < free_buffers_.size(); i++)
    if (free_buffers_[i].bytes == bytes) {
      be_.wait(*free_buffers_[i].last_use);  // its last reader or writer has finished with it
      p = free_buffers_[i].p;
      free_buffers_.erase(free_buffers_.begin() + (long)i);
      break;
    }
  if (!p) {
    p = be_.alloc((size_t)bytes);
    all_buffers_.push_back(p);
  }
  gathered_now_ += bytes;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_now_);
  return Tensor(p, t, {numel});
}

void FsdpStore::give_buffer(Tensor& buf) {
  Pooled b;
  b.bytes = (int64_t)buf.nbytes();
  b.p = buf.data;
  b.last_use = be_.make_event();
  be_.record(*b.last_use);
  free_buffers_.push_back(std::move(b));
  gathered_now_ -= (int64_t)buf.nbytes();
  buf = Tensor();
}

double FsdpStore::comm_bytes() const {
  return shard_comm_->stats().total() + (replica_comm_ ? replica_comm_->stats().total() : 0.0);
}

void FsdpStore::hold(Unit& u, const Tensor& params) {
  if (u.held == params.data) return;
  unhold(u);
  be_.params_held(params);
  u.held = params.data;
}

void FsdpStore::unhold(Unit& u) {
  if (!u.held) return;
  be_.params_released(u.held);
  u.held = nullptr;
}

void FsdpStore::start_gather(Unit& u) {
  u.gathered = take_buffer(compute_, u.padded);
  u.pending = shard_comm_->all_gather_async(u.compute.data, u.gathered.data, u.shard, compute_);
}

Tensor FsdpStore::acquire(int unit) {
  Unit& u = units_[unit];
  if (groups_.shard_size == 1) {  // the shard is the whole unit
    hold(u, u.compute);
    return u.compute;
  }
  if (!u.gathered.data) start_gather(u);
  if (u.pending) {
    u.pending->wait();
    u.pending.reset();
  }
  hold(u, u.gathered);
  return u.gathered;
}

void FsdpStore::prefetch(int unit) {
  Unit& u = units_[unit];
  if (groups_.shard_size == 1 || u.gathered.data) return;
  start_gather(u);
}

void FsdpStore::release(int unit) {
  // shard_grad_op keeps parameters from forward until the unit's backward is done (grads_done).
  if (groups_.shard_size == 1 || strategy_ == Strategy::shard_grad_op) return;
  Unit& u = units_[unit];
  if (!u.gathered.data) return;
  if (u.pending) u.pending->wait(), u.pending.reset();
  unhold(u);
  give_buffer(u.gathered);
}

Tensor FsdpStore::grads(int unit) {
  if (frozen_) return Tensor();  // the model skips this unit's parameter gradients
  Unit& u = units_[unit];
  if (u.full_grad.data) return u.full_grad;
  // A single process with no replicas accumulates straight into the shard (which is the unit).
  if (groups_.shard_size == 1 && !replica_comm_) return u.full_grad = u.grad;
  u.full_grad = take_buffer(DType::f32, u.padded);
  be_.zero(u.full_grad.data, u.full_grad.nbytes());
  return u.full_grad;
}

void FsdpStore::grads_done(int unit) {
  finish_reduce();
  Unit& u = units_[unit];
  if (strategy_ == Strategy::shard_grad_op && u.gathered.data) {  // backward is done with them
    unhold(u);
    give_buffer(u.gathered);
  }
  Tensor full = u.full_grad;
  u.full_grad = Tensor();  // a later backward of this unit (next micro-batch) gets a fresh buffer
  if (!full.data || full.data == u.grad.data) return;
  if (reduce_ != DType::f32) {  // gradients travel in the reduce dtype, rounded once
    Tensor send = take_buffer(reduce_, u.padded);
    be_.convert(send, full, u.padded);
    give_buffer(full);
    full = send;
  }
  pending_reduce_unit_ = unit;
  reduce_send_ = full;
  if (groups_.shard_size > 1)
    pending_reduce_ = shard_comm_->reduce_scatter_async(full.data, reduce_recv_.data, u.shard, reduce_, ReduceOp::sum);
  else
    pending_reduce_ = replica_comm_->all_reduce_async(full.data, u.padded, reduce_, ReduceOp::sum);
}

// Completes the gradient reduction in flight: sum over replicas too, then add into the shard's gradient.
void FsdpStore::finish_reduce() {
  if (pending_reduce_unit_ < 0) return;
  Unit& u = units_[pending_reduce_unit_];
  pending_reduce_->wait();
  pending_reduce_.reset();
  Tensor reduced = reduce_recv_;
  if (groups_.shard_size == 1) {
    reduced = reduce_send_;  // all-reduced in place
  } else if (replica_comm_) {
    replica_comm_->all_reduce(reduce_recv_.data, u.shard, reduce_, ReduceOp::sum);
  }
  be_.accumulate(u.grad, reduced, u.shard);
  give_buffer(reduce_send_);
  pending_reduce_unit_ = -1;
}

void FsdpStore::zero_grads() {
  if (frozen_) return;
  finish_reduce();
  for (auto& u : units_) be_.zero(u.grad.data, u.grad.nbytes());
}

void FsdpStore::grad_sq_sum(Tensor out) {
  finish_reduce();
  be_.zero(out.data, out.nbytes());
  if (frozen_) return;  // no gradient: zero on every rank
  for (auto& u : units_) be_.sum_squares(out, u.grad, u.shard);
  // replicas hold identical shards: sum over one shard group only
  if (groups_.shard_size > 1) shard_comm_->all_reduce_async(out.data, 1, DType::f64, ReduceOp::sum)->wait();
}

void FsdpStore::optimizer_step(float lr, const AdamWConfig& cfg, float grad_scale) {
  finish_reduce();
  t_++;
  if (frozen_) return;
  for (size_t i = 0; i < units_.size(); i++) {
    Unit& u = units_[i];
    // the compute copy changes here only through the backend's adamw, which keeps what it derived
    // from held parameters current (Backend::params_held): the hold stays
    if (u.hi <= u.lo) continue;  // this rank's shard is all padding
    Tensor compute = u.compute.data != u.master.data ? u.compute : Tensor();
    adamw_step_range(be_, layout_.units[i], u.lo, u.hi, u.master, compute, u.grad, u.m, u.v, lr, cfg, t_, grad_scale);
  }
}

void FsdpStore::set_unit(int unit, const float* full_host) {
  Unit& u = units_[unit];
  unhold(u);
  // a frozen bf16 store has no master: the shard passes through an f32 buffer on its way in
  Tensor master = u.master.data ? u.master : take_buffer(DType::f32, u.shard);
  be_.zero(master.data, master.nbytes());
  if (u.hi > u.lo) be_.copy_from_host(master.data, full_host + u.lo, sizeof(float) * (size_t)(u.hi - u.lo));
  if (u.compute.data != master.data) be_.convert(u.compute, master, u.shard);
  if (!u.master.data) give_buffer(master);
}

void FsdpStore::masters_changed() {
  for (auto& u : units_) {
    if (!u.master.data) continue;  // frozen under bf16: the compute copy is all there is
    unhold(u);
    if (u.compute.data != u.master.data) be_.convert(u.compute, u.master, u.shard);
  }
}

void FsdpStore::get_unit(int unit, float* full_host) {
  Unit& u = units_[unit];
  if (!u.master.data) {  // frozen under bf16: the compute copy, gathered and widened
    Tensor low = take_buffer(compute_, u.padded), full = take_buffer(DType::f32, u.padded);
    if (groups_.shard_size == 1) be_.copy(low.data, u.compute.data, u.compute.nbytes());
    else shard_comm_->all_gather_async(u.compute.data, low.data, u.shard, compute_)->wait();
    be_.convert(full, low, u.padded);
    be_.copy_to_host(full_host, full.data, sizeof(float) * (size_t)u.numel);
    give_buffer(full);
    give_buffer(low);
    return;
  }
  if (groups_.shard_size == 1) {
    be_.copy_to_host(full_host, u.master.data, sizeof(float) * (size_t)u.numel);
    return;
  }
  Tensor full = take_buffer(DType::f32, u.padded);
  shard_comm_->all_gather_async(u.master.data, full.data, u.shard, DType::f32)->wait();
  be_.copy_to_host(full_host, full.data, sizeof(float) * (size_t)u.numel);
  give_buffer(full);
}

FsdpStore::ShardState FsdpStore::shard_state(int unit) const {
  const Unit& u = units_[unit];
  return {u.lo, u.hi, u.master, u.m, u.v, u.grad};
}

int FsdpStore::replica_index() const { return replica_comm_ ? replica_comm_->rank() : 0; }

int64_t FsdpStore::persistent_bytes() const {
  int64_t n = 0;
  for (auto& u : units_) {
    n += (u.master.data ? 1 : 0) * u.shard * (int64_t)sizeof(float);
    n += (u.grad.data ? 3 : 0) * u.shard * (int64_t)sizeof(float);  // grad, m, v
    if (u.compute.data != u.master.data) n += u.shard * (int64_t)dtype_size(compute_);
  }
  return n;
}

}  // namespace llmt
