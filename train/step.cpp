#include "train/step.h"

#include <cmath>

#include "engine/core/error.h"

namespace llmt {

StepResult train_step(Transformer& model, FsdpStore& store, ControlComm& world, const std::vector<MicroBatch>& micro,
                      float lr, const AdamWConfig& adamw, double max_grad_norm) {
  StepResult r;
  const int B = model.batch();
  double counted = 0.0;
  for (const MicroBatch& mb : micro)
    for (int64_t i = 0; i < (int64_t)B * mb.seq_len; i++) counted += mb.targets[i] != -100;
  r.counted = world.all_reduce_sum(counted);
  LLMT_CHECK(r.counted > 0, "every target of the global batch is masked: nothing to learn from");

  store.zero_grads();
  double loss_sum = 0.0;
  for (const MicroBatch& mb : micro) {
    // scaled by the global count, the reduce-scatter's sum is the gradient of the global mean loss
    loss_sum += model.forward(store, mb.tokens, mb.targets, true, (float)(1.0 / r.counted), mb.seq_len);
    model.backward(store);
  }
  r.loss = world.all_reduce_sum(loss_sum) / r.counted;
  r.grad_norm = std::sqrt(store.grad_sq_norm());
  LLMT_CHECK(std::isfinite(r.grad_norm) && std::isfinite(r.loss),
             "the loss or gradient is not finite (loss %g, grad norm %g); stopping", r.loss, r.grad_norm);
  // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1
  float clip = 1.0f;
  if (max_grad_norm > 0.0) clip = (float)std::min(1.0, max_grad_norm / (r.grad_norm + 1e-6));
  store.optimizer_step(lr, adamw, clip);
  return r;
}

}  // namespace llmt
