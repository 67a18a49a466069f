// The training run: set up (output directory, model, data, FSDP store, schedule, resume), then a
// loop of steps, each followed by its hooks (log, evaluate, save, stop on a signal), then finish
// (throughput, evaluation, the final model).
#pragma once
#include "engine/dist/communicator.h"
#include "engine/dist/launch.h"
#include "train/train_args.h"

namespace llmt {

// SIGUSR1 (Slurm's --signal=USR1@N before the time limit), SIGTERM (scancel, preemption) and SIGINT
// (Ctrl-C) ask the run to stop: after the step in progress, with a checkpoint; before the first
// step, without one. A second SIGINT ends the process at once, saving nothing. `llmt train` installs
// the handlers before anything else, since the signal can come at any time.
void install_stop_handlers();

// Runs the job on every rank of `world`.
void run_training(const TrainArgs& args, ControlComm& world, const LaunchInfo& launch);

}  // namespace llmt
