// The Communicator: collectives over a group of ranks on typed buffers. MPI implements it now
// (engine/dist/mpi_communicator.cpp); NCCL will implement it for GPU buffers behind the same calls.
// Buffers live where the backend keeps its memory (host for the CPU backend).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/tensor.h"

namespace llmt {

enum class ReduceOp { sum, avg };

// A collective in flight; wait() blocks until its result is in place. Destroying an unfinished
// request waits for it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};

// Bytes each rank sent, by the ring-algorithm convention nccl-tests uses for bus bandwidth:
// all_gather and reduce_scatter move (W-1)/W of the full buffer, all_reduce 2(W-1)/W of it.
struct CommStats {
  double all_gather_bytes = 0, reduce_scatter_bytes = 0, all_reduce_bytes = 0, broadcast_bytes = 0;
  int64_t calls = 0;
  double total() const { return all_gather_bytes + reduce_scatter_bytes + all_reduce_bytes + broadcast_bytes; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "nccl"

  // recv[size * count] = every rank's send[count], in rank order.
  virtual std::unique_ptr<CommRequest> all_gather_async(const void* send, void* recv, int64_t count, DType t) = 0;
  // recv[count] = reduction over ranks of their send[rank * count .. (rank + 1) * count).
  virtual std::unique_ptr<CommRequest> reduce_scatter_async(const void* send, void* recv, int64_t count, DType t,
                                                            ReduceOp op) = 0;
  // buf[count] = reduction over ranks of buf, in place.
  virtual std::unique_ptr<CommRequest> all_reduce_async(void* buf, int64_t count, DType t, ReduceOp op) = 0;
  virtual void broadcast(void* buf, int64_t count, DType t, int root) = 0;
  virtual void barrier() = 0;
  // Ranks with the same color form a new communicator, ordered by key.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  void all_gather(const void* send, void* recv, int64_t count, DType t) { all_gather_async(send, recv, count, t)->wait(); }
  void reduce_scatter(const void* send, void* recv, int64_t count, DType t, ReduceOp op) {
    reduce_scatter_async(send, recv, count, t, op)->wait();
  }
  void all_reduce(void* buf, int64_t count, DType t, ReduceOp op) { all_reduce_async(buf, count, t, op)->wait(); }
  // A sum of doubles over ranks (losses, norms, token counts).
  virtual double all_reduce_sum(double x) = 0;

  CommStats& stats() { return stats_; }
  // The underlying handle (an MPI_Comm for "mpi"), for libraries that take one such as parallel HDF5;
  // only engine/dist and engine/ckpt may use it.
  virtual void* native_handle() = 0;

 protected:
  CommStats stats_;
};

}  // namespace llmt
