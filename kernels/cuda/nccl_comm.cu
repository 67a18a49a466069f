// The data communicator over NCCL for the CUDA backend (make_nccl_data_comm, cuda_backend.h).
//
// Bootstrap: rank 0 makes the unique id, MPI (the control communicator) broadcasts it, every rank
// inits a nonblocking communicator and polls it until ready, within --ddp_timeout. Collectives run
// on a communication stream of their own: an event recorded on the compute stream orders each after
// the compute work that produced its input, and a second event, recorded after it, is what
// CommRequest::wait() makes the compute stream wait for, so gathers for the next unit and gradient
// reductions of the last one overlap compute (llm.c's scheme). The host never blocks except in
// wait_host().
//
// Every collective is registered with the watchdog (engine/dist/watchdog.h) before it is issued
// and ends when its event completes; the communicator's asynchronous error is polled too, and the
// abort hook calls ncclCommAbort, so a dead peer ends the job instead of hanging it.
//
// In the emulated build NCCL is the CPU stand-in over MPI (simt/nccl_simt.h).
#include "kernels/cuda/cuda_platform.h"

#ifdef LLMT_SIMT
#include "kernels/cuda/simt/nccl_simt.h"
#elif LLMT_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/dist/comm_wait.h"
#include "engine/dist/communicator.h"
#include "engine/dist/watchdog.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.h"

namespace llmt {

#if defined(LLMT_SIMT) || LLMT_NCCL
namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::f64: return ncclFloat64;
  }
  fail("nccl: no NCCL type for %s", dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::avg ? ncclAvg : ncclSum; }

std::string nccl_error(ncclComm_t comm, ncclResult_t r) {
  const char* last = comm ? ncclGetLastError(comm) : "";
  return strformat("%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

// A nonblocking communicator's pending operation (init, split, a collective's enqueue) ends in
// ncclSuccess; ncclInProgress means poll again. Anything else, or no end within the timeout, aborts it.
void wait_ready(ncclComm_t comm, const char* what, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const std::string why = nccl_error(comm, state);
      ncclCommAbort(comm);
      fail("NCCL %s failed: %s", what, why.c_str());
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      ncclCommAbort(comm);
      fail("NCCL %s did not finish within %g s (--ddp_timeout): a rank did not take part (check that every rank "
           "reached it and that NCCL_SOCKET_IFNAME names an interface the nodes share)",
           what, timeout_s);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// A call on a nonblocking communicator: ncclInProgress is fine once polled to the end.
void issued(ncclComm_t comm, ncclResult_t r, const char* what, double timeout_s) {
  if (r == ncclInProgress) return wait_ready(comm, what, timeout_s);
  if (r != ncclSuccess) fail("NCCL %s failed: %s", what, nccl_error(comm, r).c_str());
}

// Makes `device` current on the calling thread, once per thread and device.
void use_device(int device) {
  static thread_local int current = -1;
  if (current != device && cudaSetDevice(device) == cudaSuccess) current = device;
}

struct Event {
  cudaEvent_t e = nullptr;
  int device = 0;                     // the backend's, current when the event is made
  std::atomic<bool> recorded{false};  // the watchdog may poll before the collective is issued
  Event() {
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  // Both may run on the watchdog's thread, whose current device is 0 until it is told otherwise: a
  // call from there on another device's event would make a context (hundreds of MiB) on GPU 0 for
  // every rank of the node.
  ~Event() {
    use_device(device);
    (void)cudaEventDestroy(e);
  }
  bool done() const {
    if (!recorded) return false;
    use_device(device);
    return cudaEventQuery(e) == cudaSuccess;
  }
};

// Each collective's time on its communication stream, from when this rank's inputs were ready
// (the stream reaches `start` after waiting on the compute stream) to the collective's end, so a
// wait for slower peers is in it. Read back once the end event has completed (after the step's
// read of its scalars): no host wait of its own. comm_wait.h adds the sum to the host's waits.
// What the host itself waited while issuing it is taken off, so no wait counts twice: on a GPU the
// issue does not block; the emulator's NCCL stand-in runs the collective in the call, over MPI,
// whose waits the host already counted.
class CollectiveClock {
 public:
  struct Timed {
    cudaEvent_t start, end;
    double host_s;  // the host's counted waits when the collective began, then during its issue
  };
  // A pair of timing events for a collective about to be issued on `stream`; `start` recorded now.
  Timed begin(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    Timed t{take(), take(), host_comm_wait_s()};
    CUDA_CHECK(cudaEventRecord(t.start, stream));
    return t;
  }
  // After the collective is issued: `end` recorded, the pair pending until it completes.
  void end(Timed t, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    CUDA_CHECK(cudaEventRecord(t.end, stream));
    t.host_s = host_comm_wait_s() - t.host_s;
    pending_.push_back(t);
  }
  // Seconds of every completed collective so far; polls the pending ones without waiting.
  double seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t kept = 0;
    for (Timed& p : pending_) {
      float ms = 0.0f;
      if (cudaEventQuery(p.end) != cudaSuccess || cudaEventElapsedTime(&ms, p.start, p.end) != cudaSuccess) {
        pending_[kept++] = p;  // not done yet (cudaErrorNotReady is no error: clear it)
        (void)cudaGetLastError();
        continue;
      }
      done_s_ += std::max(0.0, ms * 1e-3 - p.host_s);
      free_.push_back(p.start);
      free_.push_back(p.end);
    }
    pending_.resize(kept);
    return done_s_;
  }

 private:
  cudaEvent_t take() {
    if (free_.empty()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));  // with timing
      return e;
    }
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  std::mutex mu_;
  std::vector<Timed> pending_;
  std::vector<cudaEvent_t> free_;
  double done_s_ = 0.0;
};

// Never destroyed: its events would outlive the CUDA context at exit.
CollectiveClock& collective_clock() {
  static CollectiveClock* clock = new CollectiveClock;
  return *clock;
}

class NcclRequest : public CommRequest {
 public:
  NcclRequest(std::shared_ptr<Event> done, cudaStream_t compute) : done_(std::move(done)), compute_(compute) {}
  ~NcclRequest() override {
    if (!waited_) (void)cudaStreamWaitEvent(compute_, done_->e, 0);  // later compute never races the collective
  }
  void wait() override {
    CUDA_CHECK(cudaStreamWaitEvent(compute_, done_->e, 0));
    waited_ = true;
  }
  void wait_host() override {
    CommWaitTimer waiting;
    CUDA_CHECK(cudaEventSynchronize(done_->e));  // a dead peer: the watchdog ends the process
    waited_ = true;
  }

 private:
  std::shared_ptr<Event> done_;
  cudaStream_t compute_;
  bool waited_ = false;
};

class NcclDataComm : public DataComm {
 public:
  NcclDataComm(ncclComm_t comm, int rank, int size, cudaStream_t compute, double timeout_s)
      : comm_(comm), rank_(rank), size_(size), compute_(compute), timeout_s_(timeout_s) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    abort_hook_ = watchdog_add_abort_hook([c = comm_] { ncclCommAbort(c); });
    error_probe_ = watchdog_add_error_probe([c = comm_, rank, size] {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(c, &state) != ncclSuccess || state == ncclSuccess || state == ncclInProgress)
        return std::string();
      return strformat("NCCL reported an error on a communicator of %d ranks (its rank %d): %s", size, rank,
                       nccl_error(c, state).c_str());
    });
  }
  ~NcclDataComm() override {
    watchdog_remove_error_probe(error_probe_);
    watchdog_remove_abort_hook(abort_hook_);
    (void)cudaStreamSynchronize(stream_);
    // nonblocking: finalize may still be flushing; poll it out, then free
    if (ncclCommFinalize(comm_) == ncclInProgress) {
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ncclCommDestroy(comm_);
    (void)cudaEventDestroy(inputs_ready_);
    (void)cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  std::unique_ptr<CommRequest> all_gather_async(const void* send, void* recv, int64_t count, DType t) override {
    stats_.all_gather_bytes += (double)(size_ - 1) * count * dtype_size(t);
    return run("all_gather", count * size_, t, [&] {
      return ncclAllGather(send, recv, (size_t)count, nccl_type(t), comm_, stream_);
    });
  }
  std::unique_ptr<CommRequest> reduce_scatter_async(const void* send, void* recv, int64_t count, DType t,
                                                    ReduceOp op) override {
    stats_.reduce_scatter_bytes += (double)(size_ - 1) * count * dtype_size(t);
    return run("reduce_scatter", count * size_, t, [&] {
      return ncclReduceScatter(send, recv, (size_t)count, nccl_type(t), nccl_op(op), comm_, stream_);
    });
  }
  std::unique_ptr<CommRequest> all_reduce_async(void* buf, int64_t count, DType t, ReduceOp op) override {
    stats_.all_reduce_bytes += 2.0 * (size_ - 1) / size_ * count * dtype_size(t);
    return run("all_reduce", count, t, [&] {
      return ncclAllReduce(buf, buf, (size_t)count, nccl_type(t), nccl_op(op), comm_, stream_);
    });
  }
  std::unique_ptr<DataComm> split(int color, int key) override {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = nullptr;
    {
      WatchScope watch(strformat("ncclCommSplit of %d ranks (nccl)", size_));
      issued(comm_, ncclCommSplit(comm_, color, key, &sub, &config), "split", timeout_s_);
      wait_ready(sub, "split", timeout_s_);
    }
    // the new communicator's rank and size, as MPI would give them: ask it
    int sub_rank = 0, sub_size = 0;
    comm_rank_size(sub, &sub_rank, &sub_size);
    return std::make_unique<NcclDataComm>(sub, sub_rank, sub_size, compute_, timeout_s_);
  }

  static void comm_rank_size(ncclComm_t c, int* rank, int* size);

 private:
  // One collective: on the communication stream after the compute stream's work so far, watched
  // from before it is issued (a blocking enqueue is caught too) until its event completes.
  template <class Call>
  std::unique_ptr<CommRequest> run(const char* op, int64_t count, DType t, Call call) {
    CUDA_CHECK(cudaEventRecord(inputs_ready_, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
    const auto timed = collective_clock().begin(stream_);
    auto done = std::make_shared<Event>();
    const uint64_t id = watchdog_running() ? watchdog_begin(strformat("%s of %lld %s over %d ranks (nccl)", op,
                                                                      (long long)count, dtype_name(t), size_),
                                                            [done] { return done->done(); })
                                           : 0;
    try {
      issued(comm_, call(), op, timeout_s_);
      collective_clock().end(timed, stream_);
      CUDA_CHECK(cudaEventRecord(done->e, stream_));
    } catch (...) {
      watchdog_end(id);
      throw;
    }
    done->recorded = true;
    stats_.calls++;
    return std::make_unique<NcclRequest>(done, compute_);
  }

  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t compute_, stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;
  double timeout_s_;
  uint64_t abort_hook_ = 0, error_probe_ = 0;
};

void NcclDataComm::comm_rank_size(ncclComm_t c, int* rank, int* size) {
  ncclResult_t r = ncclCommUserRank(c, rank);
  if (r == ncclSuccess) r = ncclCommCount(c, size);
  if (r != ncclSuccess) fail("NCCL rank and size of a new communicator: %s", nccl_error(c, r).c_str());
}

}  // namespace

std::unique_ptr<DataComm> make_nccl_data_comm(ControlComm& world, Backend& be, double timeout_s) {
  LLMT_CHECK(be.name() == "cuda" && !be.is_host_memory(), "NCCL needs the CUDA backend, not the %s one",
             be.name().c_str());
  cudaStream_t compute = (cudaStream_t)be.native_stream();
  set_device_comm_wait([] { return collective_clock().seconds(); });  // the slow-rank report's device waits
  ncclUniqueId id;
  if (world.rank() == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) fail("NCCL: ncclGetUniqueId failed on rank 0: %s", nccl_error(nullptr, r).c_str());
  }
  world.broadcast(&id, sizeof(id) / 4, DType::i32, 0);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // init is polled, within the timeout, instead of blocking on a missing rank
  ncclComm_t comm = nullptr;
  {
    WatchScope watch(strformat("ncclCommInitRankConfig of %d ranks (nccl)", world.size()));
    ncclResult_t r = ncclCommInitRankConfig(&comm, world.size(), id, world.rank(), &config);
    if (r != ncclSuccess && r != ncclInProgress)
      fail("NCCL: ncclCommInitRankConfig failed on rank %d of %d: %s", world.rank(), world.size(),
           nccl_error(comm, r).c_str());
    wait_ready(comm, "ncclCommInitRankConfig", timeout_s);
  }
  return std::make_unique<NcclDataComm>(comm, world.rank(), world.size(), compute, timeout_s);
}

bool nccl_available() { return true; }

std::string nccl_build_version() {
#ifdef LLMT_SIMT
  return "(the emulated build's stand-in over MPI)";
#else
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9
  return strformat("%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
#endif
}

#else  // a CUDA build without NCCL

std::unique_ptr<DataComm> make_nccl_data_comm(ControlComm&, Backend&, double) {
  fail("--ddp_backend nccl: this llmt was built without NCCL (nccl.h and libnccl were not found when it was "
       "configured); install NCCL and rebuild, or use --ddp_backend mpi");
}
bool nccl_available() { return false; }
std::string nccl_build_version() { return "none (built without NCCL)"; }

#endif

}  // namespace llmt
