// One optimizer step of FSDP training: this rank's micro-batches forward and backward (gradients
// reduce-scattered unit by unit into the shards), the loss as a mean over every token counted on
// every rank, clipping by the global gradient norm, AdamW on the shards. The loss and the squared
// gradient norm accumulate on the backend and reach the host in one read, after which the clip
// scale is computed.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/fsdp/fsdp.h"
#include "models/transformer.h"

namespace llmt {

struct MicroBatch {
  const int32_t* tokens;   // B * seq_len, host
  const int32_t* targets;  // B * seq_len, host; kIgnoreIndex = no loss
  int seq_len;
  int64_t first_sequence = 0;  // global index of its first sequence in the step's global batch (dropout)
  const int32_t* doc_start = nullptr;  // B * seq_len, host: packed examples (Transformer::forward), or null
};

struct StepSettings {
  float lr = 0.0f;
  AdamWConfig adamw;
  double max_grad_norm = 1.0;  // 0: no clipping
  uint64_t seed = 0;           // with step: the dropout masks
  int64_t step = 0;
};

// The step's two f64 scalars on the backend, [loss sum, gradient sum of squares]: made once and
// kept for the run, so a step allocates nothing (on a GPU an allocation waits for the device).
struct StepScalars {
  explicit StepScalars(Backend& be) : buffer(be, DType::f64, {2}) {}
  BackendBuffer buffer;
};

struct StepResult {
  double loss = 0.0;       // mean over the global batch's counted tokens
  double grad_norm = 0.0;  // before clipping
  double counted = 0.0;    // tokens with a target, over every rank
};

// control: host agreement (token counts); data: the world's data communicator (the loss);
// scalars: the caller's, zeroed here. adapter: the trainable store of adapters the model's hook
// holds (LoRA), the model's own store then frozen; gradients, their norm and AdamW are the
// adapter's. Null: the model's store is the one trained.
StepResult train_step(Transformer& model, FsdpStore& store, ControlComm& control, DataComm& data,
                      StepScalars& scalars, const std::vector<MicroBatch>& micro, const StepSettings& s,
                      FsdpStore* adapter = nullptr);

// Tokens with a target in a batch of n tokens.
int64_t count_targets(const int32_t* targets, int64_t n);

}  // namespace llmt
