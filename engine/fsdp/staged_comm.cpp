#include "engine/fsdp/staged_comm.h"

#include <vector>

namespace llmt {
namespace {

struct Done : CommRequest {
  void wait() override {}
};

class StagedDataComm : public DataComm {
 public:
  StagedDataComm(std::unique_ptr<DataComm> host, Backend& be) : host_(std::move(host)), be_(be) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string name() const override { return host_->name() + " (staged through host memory)"; }

  std::unique_ptr<CommRequest> all_gather_async(const void* send, void* recv, int64_t count, DType t) override {
    const size_t bytes = (size_t)count * dtype_size(t);
    char* s = staging(send_, bytes);
    char* r = staging(recv_, bytes * (size_t)size());
    be_.copy_to_host(s, send, bytes);
    host_->all_gather(s, r, count, t);
    be_.copy_from_host(recv, r, bytes * (size_t)size());
    return finish();
  }
  std::unique_ptr<CommRequest> reduce_scatter_async(const void* send, void* recv, int64_t count, DType t,
                                                    ReduceOp op) override {
    const size_t bytes = (size_t)count * dtype_size(t);
    char* s = staging(send_, bytes * (size_t)size());
    char* r = staging(recv_, bytes);
    be_.copy_to_host(s, send, bytes * (size_t)size());
    host_->reduce_scatter(s, r, count, t, op);
    be_.copy_from_host(recv, r, bytes);
    return finish();
  }
  std::unique_ptr<CommRequest> all_reduce_async(void* buf, int64_t count, DType t, ReduceOp op) override {
    if (size() == 1) return finish();  // over one rank the sum or mean is the value itself: nothing to move
    const size_t bytes = (size_t)count * dtype_size(t);
    char* s = staging(send_, bytes);
    be_.copy_to_host(s, buf, bytes);
    host_->all_reduce(s, count, t, op);
    be_.copy_from_host(buf, s, bytes);
    return finish();
  }
  std::unique_ptr<DataComm> split(int color, int key) override {
    return std::make_unique<StagedDataComm>(host_->split(color, key), be_);
  }

 private:
  static char* staging(std::vector<char>& v, size_t bytes) {
    if (v.size() < bytes) v.resize(bytes);
    return v.data();
  }
  std::unique_ptr<CommRequest> finish() {
    stats_ = host_->stats();
    return std::make_unique<Done>();
  }

  std::unique_ptr<DataComm> host_;
  Backend& be_;
  std::vector<char> send_, recv_;  // the host copies (pageable: copy_from_host returns once read)
};

}  // namespace

std::unique_ptr<DataComm> make_staged_data_comm(std::unique_ptr<DataComm> host_comm, Backend& be) {
  return std::make_unique<StagedDataComm>(std::move(host_comm), be);
}

}  // namespace llmt
