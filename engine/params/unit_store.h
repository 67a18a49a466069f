// UnitStore: how a model reaches its parameters and gradients, one unit at a time. The model
// never owns its parameters: it asks for a unit's buffer just before using it and hands it back
// right after, and it asks where to accumulate a unit's gradient and says when that gradient is
// complete. FSDP (engine/fsdp) gathers on acquire and reduce-scatters on grads_done.
#pragma once

namespace llmt {

class UnitStore {
 public:
  virtual ~UnitStore() = default;
  virtual float* acquire(int unit) = 0;  // the unit's full parameters, valid until release
  virtual void release(int unit) = 0;
  virtual void prefetch(int /*unit*/) {}  // the model will acquire this unit next: start fetching it
  virtual float* grads(int unit) = 0;    // the unit's full gradient buffer; backward adds into it
  virtual void grads_done(int unit) = 0; // backward will not touch this unit's gradient again
  virtual void backward_done() {}        // the whole backward pass is over
};

}  // namespace llmt
