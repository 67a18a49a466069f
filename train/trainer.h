// The training run: set up (output directory, model, data, FSDP store, schedule, resume), then a
// loop of steps, each followed by its hooks (log, evaluate, save, stop on a signal), then finish
// (throughput, evaluation, the final model).
#pragma once
#include "engine/dist/communicator.h"
#include "engine/dist/launch.h"
#include "train/train_args.h"

namespace llmt {

// Runs the job on every rank of `world`.
void run_training(const TrainArgs& args, ControlComm& world, const LaunchInfo& launch);

}  // namespace llmt
