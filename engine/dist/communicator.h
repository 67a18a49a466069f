// Two communicators with two jobs.
//
// ControlComm moves host values between the ranks: agreement on errors, barriers, small scalars and
// strings, checkpoint coordination, and the MPI handle that parallel HDF5 needs. It is always MPI
// (engine/dist/mpi_communicator.cpp).
//
// DataComm moves the training data: parameter gathers, gradient reductions, and the device-side loss
// and norm, on buffers where the backend keeps its memory. MPI implements it for host memory (the CPU
// backend); NCCL will implement it for GPU memory behind the same calls. The FSDP store sees only
// this one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/tensor.h"

namespace llmt {

enum class ReduceOp { sum, avg };

// A data collective in flight. wait(): work issued to the backend afterwards sees the result (on a
// GPU this orders the compute stream after the communication stream; the host does not block).
// wait_host(): the host blocks until the result is in place, for host use of it (checkpoints,
// export). On host memory the two are the same. Destroying an unfinished request waits for it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  virtual void wait_host() { wait(); }
};

// Bytes each rank sent, by the ring-algorithm convention nccl-tests uses for bus bandwidth:
// all_gather and reduce_scatter move (W-1)/W of the full buffer, all_reduce 2(W-1)/W of it.
struct CommStats {
  double all_gather_bytes = 0, reduce_scatter_bytes = 0, all_reduce_bytes = 0;
  int64_t calls = 0;
  double total() const { return all_gather_bytes + reduce_scatter_bytes + all_reduce_bytes; }
};

class DataComm {
 public:
  virtual ~DataComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "solo", "nccl"

  // recv[size * count] = every rank's send[count], in rank order.
  virtual std::unique_ptr<CommRequest> all_gather_async(const void* send, void* recv, int64_t count, DType t) = 0;
  // recv[count] = reduction over ranks of their send[rank * count .. (rank + 1) * count).
  virtual std::unique_ptr<CommRequest> reduce_scatter_async(const void* send, void* recv, int64_t count, DType t,
                                                            ReduceOp op) = 0;
  // buf[count] = reduction over ranks of buf, in place.
  virtual std::unique_ptr<CommRequest> all_reduce_async(void* buf, int64_t count, DType t, ReduceOp op) = 0;
  // Ranks with the same color form a new communicator, ordered by key (collective).
  virtual std::unique_ptr<DataComm> split(int color, int key) = 0;

  void all_gather(const void* send, void* recv, int64_t count, DType t) { all_gather_async(send, recv, count, t)->wait(); }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) {
    reduce_scatter_async(send, recv, count, t, op)->wait();
  }
  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) { all_reduce_async(buf, count, t, op)->wait(); }

  CommStats& stats() { return stats_; }

 protected:
  CommStats stats_;
};

class ControlComm {
 public:
  virtual ~ControlComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  // A sum of doubles over ranks (token counts, flags that say whether any rank failed).
  virtual double all_reduce_sum(double x) = 0;
  // Host buffers: recv[size * count] = every rank's send[count]; buf from root to every rank.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType t) = 0;
  virtual void broadcast(void* buf, int64_t count, DType t, int root) = 0;
  // Ranks with the same color form a new communicator, ordered by key (collective).
  virtual std::unique_ptr<ControlComm> split(int color, int key) = 0;
  // The MPI_Comm* underneath, for libraries that take one (parallel HDF5); nullptr without MPI.
  // Only engine/dist and engine/ckpt use it.
  virtual void* native_handle() = 0;
};

// A DataComm of one rank on host memory, without MPI: gathers and reductions are copies. For
// single-process tools and tests.
std::unique_ptr<DataComm> make_solo_data_comm();

}  // namespace llmt
