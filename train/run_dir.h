// The run's output directory: made (mkdir -p, checked writable), claimed with a lock for the run's
// life, and the watchdog's progress records under it.
#pragma once
#include <string>

#include "engine/dist/communicator.h"
#include "engine/dist/launch.h"

namespace llmt {

// mkdir -p: each missing parent in turn, as the Hugging Face Trainer's os.makedirs. 0, or the errno of
// the first part that could not be made (with *failed set to that part).
int mkdir_parents(const std::string& dir, std::string* failed = nullptr);

// Rank 0 makes output_dir, locks it (a second run there is refused, naming the holder) and checks
// the checkpoints it holds: refused unless `resuming` or `overwrite` (which, when not resuming,
// removes them). Every rank waits for it. Returns rank 0's lock descriptor (held open for the
// run's life: closing it drops the lock), -1 on the other ranks.
int claim_output_dir(ControlComm& world, const std::string& output_dir, bool resuming, bool overwrite);

// The end of a run that ended cleanly: rank 0 (lock_fd >= 0) removes output_dir/.llmt.lock while it
// still holds the lock, then drops it. A run that fails leaves the file (its lock is gone with the
// process; the next run takes it).
void release_output_dir(int& lock_fd, const std::string& output_dir);

// The watchdog's progress records for this run: output_dir/.llmt-progress/<run id>/rank-N, the run
// id agreed from rank 0's clock and pid (watchdog.h says what they are for). Collective.
void start_progress_records(ControlComm& world, const LaunchInfo& launch, const std::string& output_dir);

}  // namespace llmt
