#include "engine/dist/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <cstring>
#include <functional>

#include "engine/core/error.h"
#include "engine/dist/watchdog.h"

namespace llmt {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::f64: return MPI_DOUBLE;
    case DType::bf16: return MPI_UINT16_T;  // moved as bits; reduced by bf16_sum_op below
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

// MPI has no bf16: a sum that adds in fp32 and rounds once per pair, as NCCL's bf16 sum does.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = (const uint16_t*)in;
  uint16_t* b = (uint16_t*)inout;
  for (int i = 0; i < *len; i++) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}
MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op o;
    check(MPI_Op_create(bf16_sum, 1, &o), "op_create");
    return o;
  }();
  return op;
}
MPI_Op sum_op(DType t) { return t == DType::bf16 ? bf16_sum_op() : MPI_SUM; }

// What the watchdog names: "all_gather of 4096 bf16 over 2 ranks (mpi)".
std::string describe(const char* op, int64_t count, DType t, int size) {
  return strformat("%s of %lld %s over %d ranks (mpi)", op, (long long)count, dtype_name(t), size);
}

// A nonblocking collective, watched from its start to the end of its wait.
class MpiRequest : public CommRequest {
 public:
  MpiRequest(MPI_Request r, std::function<void()> after, const std::string& what)
      : req_(r), after_(std::move(after)), watch_(watchdog_running() ? watchdog_begin(what) : 0) {}
  ~MpiRequest() override {
    if (!done_) {
      CommWaitTimer waiting;
      MPI_Wait(&req_, MPI_STATUS_IGNORE);  // never leave MPI writing into freed memory
    }
    watchdog_end(watch_);
  }
  void wait() override {
    if (done_) return;
    {
      CommWaitTimer waiting;
      check(MPI_Wait(&req_, MPI_STATUS_IGNORE), "wait");
    }
    done_ = true;
    watchdog_end(watch_);
    watch_ = 0;
    if (after_) after_();
  }

 private:
  MPI_Request req_;
  std::function<void()> after_;
  uint64_t watch_;
  bool done_ = false;
};

// MPI has no average: sum, then divide once the result is in place.
std::function<void()> average_after(ReduceOp op, void* buf, int64_t count, DType t, int size) {
  if (op != ReduceOp::avg) return nullptr;
  float inv = 1.0f / (float)size;
  switch (t) {
    case DType::f32:
      return [p = (float*)buf, count, inv] {
        for (int64_t i = 0; i < count; i++) p[i] *= inv;
      };
    case DType::f64:
      return [p = (double*)buf, count, size] {
        for (int64_t i = 0; i < count; i++) p[i] /= size;
      };
    case DType::bf16:
      return [p = (uint16_t*)buf, count, inv] {
        for (int64_t i = 0; i < count; i++) p[i] = f32_to_bf16(bf16_to_f32(p[i]) * inv);
      };
    default: fail("mpi: no average of %s", dtype_name(t));
  }
}

class MpiDataComm : public DataComm {
 public:
  explicit MpiDataComm(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiDataComm() override {
    WatchScope watch(strformat("comm_free over %d ranks (mpi)", size_));
    MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  std::unique_ptr<CommRequest> all_gather_async(const void* send, void* recv, int64_t count, DType t) override {
    int n = checked_count(count * size_, "all_gather") / size_;
    MPI_Request r;
    {
      CommWaitTimer moving;  // MPI may move data inside the call that starts it
      check(MPI_Iallgather(send, n, mpi_type(t), recv, n, mpi_type(t), comm_, &r), "all_gather");
    }
    stats_.all_gather_bytes += (double)(size_ - 1) * count * dtype_size(t);
    stats_.calls++;
    return std::make_unique<MpiRequest>(r, nullptr, describe("all_gather", count * size_, t, size_));
  }

  std::unique_ptr<CommRequest> reduce_scatter_async(const void* send, void* recv, int64_t count, DType t,
                                                    ReduceOp op) override {
    LLMT_CHECK(t != DType::i32, "mpi reduce_scatter: i32 is not a reduction type here");
    int n = checked_count(count * size_, "reduce_scatter") / size_;
    MPI_Request r;
    {
      CommWaitTimer moving;  // MPI may move data inside the call that starts it
      check(MPI_Ireduce_scatter_block(send, recv, n, mpi_type(t), sum_op(t), comm_, &r), "reduce_scatter");
    }
    stats_.reduce_scatter_bytes += (double)(size_ - 1) * count * dtype_size(t);
    stats_.calls++;
    return std::make_unique<MpiRequest>(r, average_after(op, recv, count, t, size_),
                                        describe("reduce_scatter", count * size_, t, size_));
  }

  std::unique_ptr<CommRequest> all_reduce_async(void* buf, int64_t count, DType t, ReduceOp op) override {
    LLMT_CHECK(t != DType::i32, "mpi all_reduce: i32 is not a reduction type here");
    int n = checked_count(count, "all_reduce");
    MPI_Request r;
    {
      CommWaitTimer moving;  // MPI may move data inside the call that starts it
      check(MPI_Iallreduce(MPI_IN_PLACE, buf, n, mpi_type(t), sum_op(t), comm_, &r), "all_reduce");
    }
    stats_.all_reduce_bytes += 2.0 * (size_ - 1) / size_ * count * dtype_size(t);
    stats_.calls++;
    return std::make_unique<MpiRequest>(r, average_after(op, buf, count, t, size_),
                                        describe("all_reduce", count, t, size_));
  }

  std::unique_ptr<DataComm> split(int color, int key) override {
    MPI_Comm sub;
    WatchScope watch(strformat("comm_split over %d ranks (mpi)", size_));
    check(MPI_Comm_split(comm_, color, key, &sub), "comm_split");
    return std::make_unique<MpiDataComm>(sub);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

class MpiControlComm : public ControlComm {
 public:
  MpiControlComm(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiControlComm() override {
    if (!owned_) return;
    WatchScope watch(strformat("comm_free over %d ranks (mpi control)", size_));
    MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override {
    WatchScope watch(strformat("barrier over %d ranks (mpi control)", size_));
    check(MPI_Barrier(comm_), "barrier");
  }
  double all_reduce_sum(double x) override {
    WatchScope watch(strformat("all_reduce of 1 f64 over %d ranks (mpi control)", size_));
    check(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_SUM, comm_), "all_reduce");
    return x;
  }
  void all_gather(const void* send, void* recv, int64_t count, DType t) override {
    int n = checked_count(count * size_, "all_gather") / size_;
    WatchScope watch(strformat("all_gather of %lld %s over %d ranks (mpi control)", (long long)count * size_,
                               dtype_name(t), size_));
    check(MPI_Allgather(send, n, mpi_type(t), recv, n, mpi_type(t), comm_), "all_gather");
  }
  void broadcast(void* buf, int64_t count, DType t, int root) override {
    WatchScope watch(strformat("broadcast of %lld %s from rank %d over %d ranks (mpi control)", (long long)count,
                               dtype_name(t), root, size_));
    check(MPI_Bcast(buf, checked_count(count, "broadcast"), mpi_type(t), root, comm_), "broadcast");
  }
  std::unique_ptr<ControlComm> split(int color, int key) override {
    MPI_Comm sub;
    WatchScope watch(strformat("comm_split over %d ranks (mpi control)", size_));
    check(MPI_Comm_split(comm_, color, key, &sub), "comm_split");
    return std::make_unique<MpiControlComm>(sub, true);
  }
  void* native_handle() override { return &comm_; }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<ControlComm> make_mpi_world_control() {
  return std::make_unique<MpiControlComm>(MPI_COMM_WORLD, false);
}

std::unique_ptr<DataComm> make_mpi_data_comm(ControlComm& control) {
  void* h = control.native_handle();
  LLMT_CHECK(h, "an MPI data communicator needs an MPI control communicator");
  MPI_Comm dup;
  {
    WatchScope watch(strformat("comm_dup over %d ranks (mpi)", control.size()));
    check(MPI_Comm_dup(*(MPI_Comm*)h, &dup), "comm_dup");
  }
  return std::make_unique<MpiDataComm>(dup);
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, (size_t)std::max(0, len));
  const size_t cut = s.find_first_of(",\n");  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  return cut == std::string::npos ? s : s.substr(0, cut);
}

}  // namespace llmt
