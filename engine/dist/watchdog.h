// The collective watchdog: a run never hangs on a dead or stopped peer.
//
// Every collective a communicator issues is registered here while it is in flight. A thread checks
// them every poll interval; one that has not finished within the timeout (--ddp_timeout seconds,
// the Hugging Face Trainer's name, default 1800), or an error a communicator reports
// asynchronously (NCCL's ncclCommGetAsyncError), ends the process: the message names the collective,
// its sequence number, the step and this rank; the abort hooks run (ncclCommAbort, so no kernel
// keeps spinning on the device); then the process exits with kWatchdogExitCode. mpirun (or srun)
// sees a rank exit without MPI_Finalize and ends the others, and their own watchdogs do the same if
// they are stuck too, so every rank exits non-zero in about one timeout.
//
// The process-wide watchdog is started by init_launch before MPI_Init (watchdog_start), so MPI's own
// start-up, communicator creation and everything after are watched, and stopped by finalize_launch
// after MPI_Finalize; without one, watchdog_begin and the rest do nothing, so tools and tests that
// never start it pay nothing. The trainer adds the progress records below once it knows its output
// directory (watchdog_set_peers), and removes them when the run is over (watchdog_clear_peers).
//
// A rank that was itself stopped (SIGSTOP, a frozen node or VM) sees its in-flight collective run
// past the timeout the moment it resumes, with every peer's record at or past it: the watchdog's
// thread notices the gap in its own polling, and the message says this rank was not running, not that
// the collective is stuck.
//
// Which ranks did not arrive: a rank cannot ask a stopped peer anything, so each rank leaves a
// record of its progress where the others can read it: one small file per rank under
// <output_dir>/.llmt-progress/<run id> (the output directory is on a file system every node shares, as
// checkpoints need). The watchdog's thread rewrites it with the sequence number of the last collective
// this rank began and its step: at its next poll when the step changed, else at most every few seconds
// and only when something changed. Every rank
// issues the same collectives in the same order, so on a timeout the ranks whose record is below the
// stuck collective's number are the ones that never reached it; the message names them with their
// host and pid. A finished run removes its records; a crashed one leaves its folder, ignored by later runs.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/dist/comm_wait.h"

namespace llmt {

// The per-rank progress record's file, and its parser (public for the tests).
std::string peer_record_path(const std::string& dir, int rank);
struct PeerRecord {
  std::string run_id, host;
  uint64_t seq = 0;
  int64_t step = -1;
  long long pid = 0;
  double written_unix_s = 0;
};
bool parse_peer_record(const std::string& text, PeerRecord* out);

constexpr int kWatchdogExitCode = 3;  // not 1 (an ordinary error) nor 124 (timeout(1)), so scripts can tell

// Where ranks leave their progress records; an empty dir turns them off.
struct PeerRecords {
  std::string dir;
  int world_size = 1;
  std::string run_id;  // the same on every rank of one run
  std::string host;    // this rank's host name, for the others' messages
};

class Watchdog {
 public:
  // on_fail receives the whole message; the default (used by watchdog_start) prints it, runs the
  // abort hooks and exits. Tests pass their own.
  using FailFn = std::function<void(const std::string& message)>;
  Watchdog(double timeout_s, int rank, FailFn on_fail, double poll_s = 0, PeerRecords peers = {});
  void set_rank(int rank);             // once MPI knows it (the watchdog starts before MPI_Init)
  void set_peers(PeerRecords peers);   // start keeping this rank's progress record
  void clear_peers();                  // remove it (a finished run leaves no records)
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A collective in flight. done, when given, is polled from the watchdog's thread and ends the
  // entry when it returns true (a CUDA event after an NCCL kernel); otherwise end() does.
  uint64_t begin(const std::string& what, std::function<bool()> done = nullptr);
  void end(uint64_t id);
  // error returns "" while all is well, else what went wrong (polled from the watchdog's thread).
  uint64_t add_error_probe(std::function<std::string()> error);
  void remove_error_probe(uint64_t id);
  void set_step(int64_t step);
  double timeout_s() const { return timeout_s_; }
  size_t in_flight();

 private:
  struct Entry {
    std::string what;
    uint64_t seq;
    int64_t step;
    std::chrono::steady_clock::time_point start;
    std::function<bool()> done;
  };
  void run();
  void write_record(const PeerRecords& peers, int rank, uint64_t seq, int64_t step);
  std::string who_did_not_arrive(const PeerRecords& peers, int rank, uint64_t seq, bool paused);

  const double timeout_s_, poll_s_, record_every_s_;
  int rank_;           // guarded by mu_, as peers_ is
  PeerRecords peers_;
  // the longest gap in the thread's own polling that shows this process was not running, and when it ended
  double paused_s_ = 0;
  std::chrono::steady_clock::time_point resumed_at_;
  std::chrono::steady_clock::time_point started_;  // when the watchdog was made
  uint64_t recorded_seq_ = ~0ull;  // what our record last said
  int64_t recorded_step_ = -1;
  std::chrono::steady_clock::time_point recorded_at_;
  bool writing_ = false;  // the thread is writing a record with mu_ released
  std::condition_variable written_;
  FailFn on_fail_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, failed_ = false;
  int64_t step_ = -1;
  uint64_t next_id_ = 1, seq_ = 0;
  std::map<uint64_t, Entry> entries_;
  std::map<uint64_t, std::function<std::string()>> probes_;
  std::thread thread_;
};

// ---- the process-wide watchdog ----
void watchdog_start(double timeout_s, int rank, PeerRecords peers = {});  // once (init_launch, before MPI_Init)
void watchdog_set_rank(int rank);
void watchdog_set_peers(PeerRecords peers);
void watchdog_clear_peers();
void watchdog_stop();
bool watchdog_running();
uint64_t watchdog_begin(const std::string& what, std::function<bool()> done = nullptr);  // 0 when none runs
void watchdog_end(uint64_t id);
uint64_t watchdog_add_error_probe(std::function<std::string()> error);
void watchdog_remove_error_probe(uint64_t id);
void watchdog_set_step(int64_t step);
// Run before the process exits on a failure (each communicator adds its abort); the id removes it.
uint64_t watchdog_add_abort_hook(std::function<void()> hook);
void watchdog_remove_abort_hook(uint64_t id);

// For the tests: LLMT_TEST_STOP=RANK:WHERE makes that rank stop itself (SIGSTOP, as a hung node would)
// when it reaches the point named WHERE ("init": before MPI_Init; "data": before tokenizing; "store":
// before the FSDP store splits its communicators).
void test_stop_point(const char* where, int rank);

// Registers a blocking collective for the scope it lives in, and counts its time as waiting
// (comm_wait.h).
class WatchScope {
 public:
  explicit WatchScope(const std::string& what) : id_(watchdog_running() ? watchdog_begin(what) : 0) {}
  ~WatchScope() {
    if (id_) watchdog_end(id_);
  }
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;

 private:
  CommWaitTimer wait_;
  uint64_t id_;
};

}  // namespace llmt
