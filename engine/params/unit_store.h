// UnitStore: how a model reaches its parameters and gradients, one unit at a time. The model
// never owns its parameters: it asks for a unit's buffer just before using it and hands it back
// right after, and it asks where to accumulate a unit's gradient and says when that gradient is
// complete. FSDP (engine/fsdp) gathers on acquire and reduce-scatters on grads_done.
#pragma once
#include "engine/core/tensor.h"

namespace llmt {

class UnitStore {
 public:
  virtual ~UnitStore() = default;
  // The unit's full parameters in the backend's compute dtype, a flat [numel] tensor (offsets of
  // ParamSpec index it), valid until release.
  virtual Tensor acquire(int unit) = 0;
  virtual void release(int unit) = 0;
  virtual void prefetch(int /*unit*/) {}  // the model will acquire this unit next: start fetching it
  // The unit's full gradient, f32 [numel]; backward adds into it.
  virtual Tensor grads(int unit) = 0;
  virtual void grads_done(int unit) = 0;  // backward will not touch this unit's gradient again
  virtual void backward_done() {}         // the whole backward pass is over
};

}  // namespace llmt
