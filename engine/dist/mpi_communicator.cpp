#include "engine/dist/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <functional>

#include "engine/core/error.h"

namespace llmt {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::bf16: return MPI_UINT16_T;  // moved, never reduced by MPI
  }
  return MPI_BYTE;
}

int checked_count(int64_t count, const char* what) {
  LLMT_CHECK(count >= 0 && count <= INT_MAX, "mpi %s: %lld elements exceed MPI's int count", what, (long long)count);
  return (int)count;
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("MPI %s failed: %s", what, msg);
}

class MpiRequest : public CommRequest {
 public:
  MpiRequest(MPI_Request r, std::function<void()> after) : req_(r), after_(std::move(after)) {}
  ~MpiRequest() override {
    if (!done_) {
      MPI_Wait(&req_, MPI_STATUS_IGNORE);  // never leave MPI writing into freed memory
    }
  }
  void wait() override {
    if (done_) return;
    check(MPI_Wait(&req_, MPI_STATUS_IGNORE), "wait");
    done_ = true;
    if (after_) after_();
  }

 private:
  MPI_Request req_;
  std::function<void()> after_;
  bool done_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  std::unique_ptr<CommRequest> all_gather_async(const void* send, void* recv, int64_t count, DType t) override {
    int n = checked_count(count * size_, "all_gather") / size_;
    MPI_Request r;
    check(MPI_Iallgather(send, n, mpi_type(t), recv, n, mpi_type(t), comm_, &r), "all_gather");
    stats_.all_gather_bytes += (double)(size_ - 1) * count * dtype_size(t);
    stats_.calls++;
    return std::make_unique<MpiRequest>(r, nullptr);
  }

  std::unique_ptr<CommRequest> reduce_scatter_async(const void* send, void* recv, int64_t count, DType t,
                                                    ReduceOp op) override {
    LLMT_CHECK(t != DType::bf16, "mpi reduce_scatter: bf16 reductions are not supported by MPI");
    int n = checked_count(count * size_, "reduce_scatter") / size_;
    MPI_Request r;
    check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(t), MPI_SUM, comm_, &r), "reduce_scatter");
    stats_.reduce_scatter_bytes += (double)(size_ - 1) * count * dtype_size(t);
    stats_.calls++;
    return std::make_unique<MpiRequest>(r, average_after(op, recv, count, t));
  }

  std::unique_ptr<CommRequest> all_reduce_async(void* buf, int64_t count, DType t, ReduceOp op) override {
    LLMT_CHECK(t != DType::bf16, "mpi all_reduce: bf16 reductions are not supported by MPI");
    int n = checked_count(count, "all_reduce");
    MPI_Request r;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(t), MPI_SUM, comm_, &r), "all_reduce");
    stats_.all_reduce_bytes += 2.0 * (size_ - 1) / size_ * count * dtype_size(t);
    stats_.calls++;
    return std::make_unique<MpiRequest>(r, average_after(op, buf, count, t));
  }

  void broadcast(void* buf, int64_t count, DType t, int root) override {
    check(MPI_Bcast(buf, checked_count(count, "broadcast"), mpi_type(t), root, comm_), "broadcast");
    stats_.broadcast_bytes += (double)count * dtype_size(t);
    stats_.calls++;
  }

  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }

  double all_reduce_sum(double x) override {
    check(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, comm_), "all_reduce");
    return x;
  }

  void* native_handle() override { return &comm_; }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "comm_split");
    return std::make_unique<MpiCommunicator>(sub, true);
  }

 private:
  // MPI has no average: sum, then divide once the result is in place.
  std::function<void()> average_after(ReduceOp op, void* buf, int64_t count, DType t) {
    if (op != ReduceOp::avg) return nullptr;
    LLMT_CHECK(t == DType::f32, "mpi: average is supported for f32 only");
    float inv = 1.0f / (float)size_;
    float* p = (float*)buf;
    return [p, count, inv] {
      for (int64_t i = 0; i < count; i++) p[i] *= inv;
    };
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

}  // namespace llmt
