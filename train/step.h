// One optimizer step of FSDP training: this rank's micro-batches forward and backward (gradients
// reduce-scattered unit by unit into the shards), the loss as a mean over every token counted on
// every rank, clipping by the global gradient norm, AdamW on the shards.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/fsdp/fsdp.h"
#include "models/transformer.h"

namespace llmt {

struct MicroBatch {
  const int32_t* tokens;   // B * seq_len, host
  const int32_t* targets;  // B * seq_len, host; -100 = no loss
  int seq_len;
};

struct StepResult {
  double loss = 0.0;       // mean over the global batch's counted tokens
  double grad_norm = 0.0;  // before clipping
  double counted = 0.0;    // tokens with a target, over every rank
};

StepResult train_step(Transformer& model, FsdpStore& store, ControlComm& world, const std::vector<MicroBatch>& micro,
                      float lr, const AdamWConfig& adamw, double max_grad_norm);

}  // namespace llmt
