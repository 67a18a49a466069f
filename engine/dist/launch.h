// Where this process sits in the job: rank and world size from MPI, local rank and local size
// from the ranks that share this node's memory (MPI_Comm_split_type), cross-checked with the
// launcher's variables (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID) where set. Works the same
// under `mpirun`, `srun --mpi=pmix` and as a plain single process.
#pragma once
#include <memory>
#include <string>

#include "engine/dist/communicator.h"

namespace llmt {

struct LaunchInfo {
  int rank = 0, world = 1;
  int local_rank = 0, local_size = 1;
  int node = 0, num_nodes = 1;  // nodes numbered by their lowest rank's order
  std::string hostname;
  std::string launcher;  // "mpirun", "srun", "single process"
};

// Initialises MPI (once); returns the layout and the world's control communicator. Throws on an
// inconsistent layout (e.g. the launcher's local rank disagrees with MPI's).
// The collective watchdog starts first, before MPI_Init, with `timeout_s` (--ddp_timeout), so a rank
// that never arrives ends the job from MPI's own start-up on; finalize_launch stops it. Then the
// ranks check that they all run the same `command` (the subcommand): ranks running different ones
// would otherwise wait forever in collectives that never match.
constexpr double kDefaultCollectiveTimeout = 1800;  // seconds: the Hugging Face Trainer's ddp_timeout
LaunchInfo init_launch(int* argc, char*** argv, std::unique_ptr<ControlComm>* world, const std::string& command = "",
                       double timeout_s = kDefaultCollectiveTimeout);
// CPU threads a rank should use by default: the cores this process may run on (the launcher's
// binding: Open MPI binds each of 1-2 ranks to one core), and at most the node's cores shared
// evenly among its ranks.
int default_threads_per_rank(const LaunchInfo& info);
// A one-line description of the layout for rank 0 to print.
std::string describe_layout(const LaunchInfo& info, const std::string& device);
// Ends MPI cleanly (every rank; MPI_Finalize is watched), then stops the watchdog.
void finalize_launch();
// Ends the whole job from one failing rank: every rank exits non-zero promptly (MPI_Abort). A single
// process started without a launcher finishes MPI and exits, without Open MPI's abort banner.
[[noreturn]] void abort_job(int code);
bool launch_initialized();
// This process's rank as the launcher's environment gives it before MPI starts (OMPI_COMM_WORLD_RANK,
// PMIX_RANK, SLURM_PROCID, PMI_RANK), or -1: lets argument errors be printed by rank 0 alone.
int launcher_rank_from_env();

}  // namespace llmt
