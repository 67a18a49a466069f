#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/watchdog.h"

namespace llmt {

int mkdir_parents(const std::string& dir, std::string* failed) {
  for (size_t at = 1; at <= dir.size(); at++) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      if (failed) *failed = part;
      return errno;
    }
  }
  return 0;
}

namespace {

void make_dir(const std::string& dir) {
  std::string part;
  if (const int err = mkdir_parents(dir, &part))
    fail("cannot create output directory %s: %s: %s", dir.c_str(), part.c_str(), std::strerror(err));
  std::string probe = dir + "/.llmt_write_test";
  FILE* f = std::fopen(probe.c_str(), "w");
  LLMT_CHECK(f, "output directory %s is not writable: %s", dir.c_str(), std::strerror(errno));
  std::fclose(f);
  std::remove(probe.c_str());
}

// The run's claim on its output_dir: an fcntl lock on output_dir/.llmt.lock, held until the process
// ends (the kernel drops it even after kill -9; fcntl locks also work over NFS), with the holder's
// host and pid in the file for the second run's message. Two runs in one directory trampled each
// other's temporary checkpoint directories.
int lock_output_dir(const std::string& dir) {
  const std::string path = dir + "/.llmt.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LLMT_CHECK(fd >= 0, "cannot create %s: %s", path.c_str(), std::strerror(errno));
  struct flock fl;
  std::memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_SETLK, &fl) != 0) {
    char holder[256] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    std::string who = n > 0 ? std::string(holder, (size_t)n) : "unknown";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    fail("%s is in use by another llmt run (%s): wait for it to end, or give another --output_dir", dir.c_str(),
         who.c_str());
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string me = strformat("host %s pid %d\n", host, (int)getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != (ssize_t)me.size())
    log_warn("cannot write %s: %s", path.c_str(), std::strerror(errno));
  return fd;
}

}  // namespace

int claim_output_dir(ControlComm& world, const std::string& output_dir, bool resuming, bool overwrite) {
  int lock_fd = -1;
  if (world.rank() == 0) {
    make_dir(output_dir);
    lock_fd = lock_output_dir(output_dir);
    std::vector<CheckpointEntry> old = list_checkpoint_dirs(output_dir);
    LLMT_CHECK(old.empty() || resuming || overwrite,
               "%s already holds checkpoints: pass --resume_from_checkpoint latest to continue, or "
               "--overwrite_output_dir to start again there (it removes them)", output_dir.c_str());
    if (overwrite && !resuming)
      for (const CheckpointEntry& c : old) {  // a new run's checkpoints must not mix with the old run's steps
        log_info("remove %s (--overwrite_output_dir)", c.path.c_str());
        remove_dir_tree(c.path);
      }
  }
  world.barrier();
  return lock_fd;
}

void release_output_dir(int& lock_fd, const std::string& output_dir) {
  if (lock_fd < 0) return;
  ::unlink((output_dir + "/.llmt.lock").c_str());
  ::close(lock_fd);
  lock_fd = -1;
}

// Progress records go under the output directory, which every node shares; the run id (rank 0's
// clock and pid) tells this run's records from a crashed earlier run's. Each run has a folder of
// its own, so a second run refused by the output_dir lock never touches the first one's records.
void start_progress_records(ControlComm& world, const LaunchInfo& launch, const std::string& output_dir) {
  PeerRecords peers;
  peers.world_size = world.size();
  peers.host = launch.hostname;
  const double id = world.all_reduce_sum(
      world.rank() == 0 ? (double)((uint64_t)std::time(nullptr) * 100000 + (uint64_t)getpid() % 100000) : 0.0);
  peers.run_id = strformat("%.0f", id);
  const std::string records = output_dir + "/.llmt-progress";
  peers.dir = records + "/" + peers.run_id;
  mkdir_parents(output_dir);  // the trainer reports a bad output_dir itself; then there are no records
  ::mkdir(records.c_str(), 0755);
  if (::mkdir(peers.dir.c_str(), 0755) != 0 && errno != EEXIST) peers.dir.clear();
  watchdog_set_peers(peers);
}

}  // namespace llmt
