// `llmt export CHECKPOINT_DIR OUT_DIR`: a Hugging Face directory from a checkpoint's exact training
// state (the fp32 master weights in state.h5), whatever world size wrote it; one unit gathered at a
// time. Runs alone or under mpirun.
#pragma once
#include <string>

#include "engine/dist/communicator.h"

namespace llmt {

void run_export(const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
                ControlComm& world);

}  // namespace llmt
