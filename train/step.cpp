#include "train/step.h"

#include <cmath>

#include "engine/core/error.h"

namespace llmt {

int64_t count_targets(const int32_t* targets, int64_t n) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++) c += targets[i] != kIgnoreIndex;
  return c;
}

StepResult train_step(Transformer& model, FsdpStore& store, ControlComm& control, DataComm& data,
                      StepScalars& scalars, const std::vector<MicroBatch>& micro, const StepSettings& s,
                      FsdpStore* adapter) {
  LLMT_CHECK(!adapter || store.frozen(), "train_step: with adapters the model's own store must be frozen");
  FsdpStore& trained = adapter ? *adapter : store;
  StepResult r;
  Backend& be = store.backend();
  const int B = model.batch();
  double counted = 0.0;
  for (const MicroBatch& mb : micro) counted += (double)count_targets(mb.targets, (int64_t)B * mb.seq_len);
  r.counted = control.all_reduce_sum(counted);
  LLMT_CHECK(r.counted > 0, "every target of the global batch is masked: nothing to learn from");

  const Tensor& both = scalars.buffer.tensor();
  LLMT_CHECK(both.dtype == DType::f64 && both.numel() == 2, "train_step: the step's scalars are f64[2]");
  be.zero(both.data, both.nbytes());
  Tensor loss_sum = both.view(0, {1}), grad_sq = both.view(1, {1});
  trained.zero_grads();
  for (const MicroBatch& mb : micro) {
    // scaled by the global count, the reduce-scatter's sum is the gradient of the global mean loss
    TrainPass pass;
    pass.grad_scale = (float)(1.0 / r.counted);
    pass.dropout = {s.seed, s.step, mb.first_sequence};
    model.forward(store, mb.tokens, mb.targets, mb.seq_len, loss_sum, &pass, mb.doc_start);
    model.backward(store);
  }
  data.all_reduce_async(loss_sum.data, 1, DType::f64, ReduceOp::sum)->wait();
  trained.grad_sq_sum(grad_sq);
  double host[2];
  be.copy_to_host(host, both.data, sizeof(host));  // the step's one read
  r.loss = host[0] / r.counted;
  r.grad_norm = std::sqrt(host[1]);
  LLMT_CHECK(std::isfinite(r.grad_norm) && std::isfinite(r.loss),
             "step %lld: the loss or gradient is not finite (loss %g, grad norm %g); stopping (the weights as loaded, "
             "the learning rate or a bad batch: the last checkpoint holds the model before it)", (long long)s.step + 1,
             r.loss, r.grad_norm);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1
  float clip = 1.0f;
  if (s.max_grad_norm > 0.0) clip = (float)std::min(1.0, s.max_grad_norm / (r.grad_norm + 1e-6));
  trained.optimizer_step(s.lr, s.adamw, clip);
  return r;
}

}  // namespace llmt
