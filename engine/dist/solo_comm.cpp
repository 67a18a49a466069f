// A DataComm of one rank on host memory: every collective is a copy (or nothing).
#include <cstring>

#include "engine/dist/communicator.h"

namespace llmt {

namespace {

struct Done : CommRequest {
  void wait() override {}
};

class SoloDataComm : public DataComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "solo"; }
  std::unique_ptr<CommRequest> all_gather_async(const void* send, void* recv, int64_t count, DType t) override {
    if (send != recv) std::memmove(recv, send, (size_t)count * dtype_size(t));
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommRequest> reduce_scatter_async(const void* send, void* recv, int64_t count, DType t,
                                                    ReduceOp) override {
    if (send != recv) std::memmove(recv, send, (size_t)count * dtype_size(t));
    return std::make_unique<Done>();
  }
  std::unique_ptr<CommRequest> all_reduce_async(void*, int64_t, DType, ReduceOp) override {
    return std::make_unique<Done>();
  }
  std::unique_ptr<DataComm> split(int, int) override { return std::make_unique<SoloDataComm>(); }
};

}  // namespace

std::unique_ptr<DataComm> make_solo_data_comm() { return std::make_unique<SoloDataComm>(); }

}  // namespace llmt
