#include "engine/dist/launch.h"

#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/core/crash.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/agree.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/dist/watchdog.h"

namespace llmt {

static bool g_initialized = false;
static bool g_launched = false;  // started by a launcher (its variables were set before MPI_Init set its own)

bool launch_initialized() { return g_initialized; }

static int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : -1;
}

int launcher_rank_from_env() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK"}) {
    int r = env_int(name);
    if (r >= 0) return r;
  }
  return -1;
}

// A process that another launcher started as one of several, alone in its MPI world: torchrun's
// (WORLD_SIZE, RANK) or srun's without an MPI plugin (SLURM_STEP_NUM_TASKS, SLURM_PROCID). Each would
// run the whole job by itself, N copies racing for one output directory; refused, saying how to start
// one job of N ranks.
static void check_not_one_of_many() {
  const int torch_world = env_int("WORLD_SIZE"), slurm_tasks = env_int("SLURM_STEP_NUM_TASKS");
  LLMT_CHECK(torch_world <= 1,
             "this process was started as rank %d of %d by torchrun (WORLD_SIZE, RANK), but llmt's ranks meet through "
             "MPI, and MPI sees it alone: each of the %d would run the whole job. Start llmt with mpirun -np %d llmt "
             "... (mpirun -hostfile FILE across nodes), srun --mpi=pmix llmt ... under Slurm, or scripts/launch.sh",
             env_int("RANK"), torch_world, torch_world, torch_world);
  LLMT_CHECK(slurm_tasks <= 1,
             "this process is task %d of %d that srun started (SLURM_STEP_NUM_TASKS), but MPI sees it alone: srun ran "
             "without an MPI plugin, so each task would run the whole job. Use srun --mpi=pmix llmt ... (srun "
             "--mpi=list shows the plugins), or mpirun inside the allocation",
             env_int("SLURM_PROCID"), slurm_tasks);
}

// MPI's calls here, each watched: a rank stopped or dead before it arrives ends the job in timeout_s.
static void watched(const char* what, int rc) {
  if (rc != MPI_SUCCESS) fail("MPI %s failed during start-up (error %d)", what, rc);
}

LaunchInfo init_launch(int* argc, char*** argv, std::unique_ptr<ControlComm>* world, const std::string& command,
                       double timeout_s) {
  LaunchInfo info;
  if (!g_initialized) {
    // The watchdog first: MPI_Init itself waits for every rank (the launcher's rendezvous).
    g_launched = launcher_rank_from_env() >= 0;
    if (!watchdog_running()) watchdog_start(timeout_s, std::max(0, launcher_rank_from_env()));
    test_stop_point("init", launcher_rank_from_env());
    int provided = 0;
    {
      WatchScope watch("MPI_Init (every rank meets the launcher)");
      watched("init", MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    }
    // Errors come back as return codes, so they can be reported with context.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    g_initialized = true;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &info.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info.world);
  watchdog_set_rank(info.rank);
  if (info.world == 1) check_not_one_of_many();

  // ranks sharing this node's memory
  MPI_Comm local;
  {
    WatchScope watch(strformat("comm_split_type (the ranks of each node) over %d ranks (mpi)", info.world));
    watched("comm_split_type", MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &local));
  }
  MPI_Comm_rank(local, &info.local_rank);
  MPI_Comm_size(local, &info.local_size);
  // nodes: the local rank 0s, numbered in rank order
  MPI_Comm leaders;
  {
    WatchScope watch(strformat("comm_split (one rank per node) over %d ranks (mpi)", info.world));
    watched("comm_split", MPI_Comm_split(MPI_COMM_WORLD, info.local_rank == 0 ? 0 : MPI_UNDEFINED, info.rank, &leaders));
  }
  int node = 0, num_nodes = 0;
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_rank(leaders, &node);
    MPI_Comm_size(leaders, &num_nodes);
    WatchScope watch("comm_free of the node leaders' communicator (mpi)");
    MPI_Comm_free(&leaders);
  }
  {
    WatchScope watch(strformat("broadcast of the node number over %d ranks of a node (mpi)", info.local_size));
    watched("broadcast", MPI_Bcast(&node, 1, MPI_INT, 0, local));
  }
  {
    WatchScope watch("comm_free of a node's communicator (mpi)");
    MPI_Comm_free(&local);
  }
  {
    WatchScope watch(strformat("all_reduce of the node count over %d ranks (mpi)", info.world));
    watched("all_reduce", MPI_Allreduce(MPI_IN_PLACE, &num_nodes, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  }
  info.node = node;
  info.num_nodes = num_nodes;

  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  info.hostname = host;

  // cross-check with what the launcher says
  int ompi_local = env_int("OMPI_COMM_WORLD_LOCAL_RANK"), slurm_local = env_int("SLURM_LOCALID");
  if (ompi_local >= 0) {
    info.launcher = "mpirun";
    LLMT_CHECK(ompi_local == info.local_rank,
               "rank %d on %s: OMPI_COMM_WORLD_LOCAL_RANK=%d but MPI's shared-memory split gives local rank %d",
               info.rank, host, ompi_local, info.local_rank);
  } else if (slurm_local >= 0) {
    info.launcher = "srun";
    LLMT_CHECK(slurm_local == info.local_rank,
               "rank %d on %s: SLURM_LOCALID=%d but MPI's shared-memory split gives local rank %d", info.rank, host,
               slurm_local, info.local_rank);
  } else {
    info.launcher = info.world == 1 ? "single process" : "mpi";
  }
  log_set_rank(info.rank, info.world);
  crash_report_set_rank(info.rank, info.world);
  std::unique_ptr<ControlComm> control = make_mpi_world_control();
  // the first collective every subcommand issues alike: the rest would not match across commands
  check_ranks_agree(*control, "command", {{"command", command.empty() ? "(a test program)" : "llmt " + command}});
  if (world) *world = std::move(control);
  return info;
}

int default_threads_per_rank(const LaunchInfo& info) {
  int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
  cpu_set_t set;
  int allowed = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : cores;
  return std::max(1, std::min(allowed, cores / std::max(1, info.local_size)));
}

std::string describe_layout(const LaunchInfo& info, const std::string& device) {
  return strformat("layout %d rank%s on %d node%s, %d rank%s per node (%s), device %s per rank", info.world,
                   info.world == 1 ? "" : "s", info.num_nodes, info.num_nodes == 1 ? "" : "s", info.local_size,
                   info.local_size == 1 ? "" : "s", info.launcher.c_str(), device.c_str());
}

void finalize_launch() {
  if (!g_initialized) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    WatchScope watch("MPI_Finalize (every rank takes part)");
    MPI_Finalize();
  }
  watchdog_stop();
}

void abort_job(int code) {
  if (g_initialized) {
    int finalized = 0, world = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_size(MPI_COMM_WORLD, &world);
    // A single process with no launcher has no job to end: MPI_Abort only printed Open MPI's 8-line
    // MPI_ABORT banner under the error line. It finishes MPI and exits.
    if (!finalized && world == 1 && !g_launched) {
      finalize_launch();
    } else if (!finalized) {
      MPI_Abort(MPI_COMM_WORLD, code);
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(code);
}

}  // namespace llmt
