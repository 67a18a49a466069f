// The collective watchdog's logic (engine/dist/watchdog.h) with fake collectives and short timeouts:
// what ends in time is forgotten, what does not is reported once with its name, sequence number,
// step and rank, an asynchronous error is reported as it is, and done-probes end entries without
// end(). The process-level behaviour (every rank exits when one is stopped) is tests/cli/hung_rank.sh.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"
#include "engine/dist/watchdog.h"
#include "tests/test_util.h"

using namespace llmt;

namespace {

struct Failures {
  std::mutex mu;
  std::vector<std::string> messages;
  Watchdog::FailFn fn() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      messages.push_back(m);
    };
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return messages.size();
  }
  std::string first() {
    std::lock_guard<std::mutex> lock(mu);
    return messages.empty() ? "" : messages[0];
  }
};

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// Waits up to `limit` seconds for a failure to be reported.
bool wait_for_failure(Failures& f, double limit) {
  const auto start = std::chrono::steady_clock::now();
  while (f.count() == 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < limit)
    sleep_s(0.005);
  return f.count() > 0;
}

}  // namespace

TEST(Watchdog, CollectivesThatEndInTimeAreForgotten) {
  Failures f;
  Watchdog w(0.2, 0, f.fn(), 0.01);
  for (int i = 0; i < 20; i++) {
    uint64_t id = w.begin("all_gather of 8 f32 over 2 ranks (mpi)");
    sleep_s(0.02);
    w.end(id);
  }
  EXPECT_EQ(w.in_flight(), 0u);
  sleep_s(0.4);  // twice the timeout with nothing in flight
  EXPECT_EQ(f.count(), 0u);
}

TEST(Watchdog, AStuckCollectiveIsReportedWithItsNameStepAndRank) {
  Failures f;
  Watchdog w(0.15, 3, f.fn(), 0.01);
  w.begin("barrier over 4 ranks (mpi control)");  // collective #1, ends in time below
  w.end(1);
  w.set_step(7);
  const auto start = std::chrono::steady_clock::now();
  w.begin("reduce_scatter of 1024 bf16 over 4 ranks (nccl)");  // never ends
  ASSERT_TRUE(wait_for_failure(f, 5.0));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(took, 0.15);
  EXPECT_LT(took, 2.0);  // the timeout plus a poll, with room for a loaded machine
  const std::string m = f.first();
  EXPECT_NE(m.find("rank 3:"), std::string::npos) << m;
  EXPECT_NE(m.find("reduce_scatter of 1024 bf16 over 4 ranks (nccl)"), std::string::npos) << m;
  EXPECT_NE(m.find("collective #2"), std::string::npos) << m;
  EXPECT_NE(m.find("step 7"), std::string::npos) << m;
  EXPECT_NE(m.find("--ddp_timeout"), std::string::npos) << m;
  sleep_s(0.3);
  EXPECT_EQ(f.count(), 1u) << "reported once";
}

TEST(Watchdog, BeforeTheFirstStepIsSaid) {
  Failures f;
  Watchdog w(0.05, 0, f.fn(), 0.01);
  w.begin("ncclCommInitRankConfig of 2 ranks (nccl)");
  ASSERT_TRUE(wait_for_failure(f, 5.0));
  EXPECT_NE(f.first().find("before the first step"), std::string::npos) << f.first();
}

TEST(Watchdog, ADoneProbeEndsTheEntryWithoutEnd) {
  Failures f;
  std::atomic<bool> finished{false};
  Watchdog w(0.3, 0, f.fn(), 0.01);
  w.begin("all_reduce of 1 f64 over 2 ranks (nccl)", [&] { return finished.load(); });
  sleep_s(0.1);
  EXPECT_EQ(w.in_flight(), 1u);
  finished = true;
  sleep_s(0.1);
  EXPECT_EQ(w.in_flight(), 0u);
  sleep_s(0.4);
  EXPECT_EQ(f.count(), 0u);
}

TEST(Watchdog, AnEntryWhoseProbeNeverSaysDoneTimesOut) {
  Failures f;
  Watchdog w(0.1, 1, f.fn(), 0.01);
  w.begin("all_gather of 64 bf16 over 2 ranks (nccl)", [] { return false; });
  ASSERT_TRUE(wait_for_failure(f, 5.0));
  EXPECT_NE(f.first().find("all_gather of 64 bf16"), std::string::npos) << f.first();
}

TEST(Watchdog, AnAsynchronousErrorIsReportedAsIs) {
  Failures f;
  std::atomic<bool> broken{false};
  Watchdog w(100, 2, f.fn(), 0.01);
  uint64_t probe = w.add_error_probe([&] { return broken ? std::string("NCCL reported remote error") : std::string(); });
  sleep_s(0.05);
  EXPECT_EQ(f.count(), 0u);
  broken = true;
  ASSERT_TRUE(wait_for_failure(f, 5.0));  // long before the 100 s timeout
  EXPECT_EQ(f.first(), "rank 2: NCCL reported remote error");
  w.remove_error_probe(probe);
}

TEST(Watchdog, ARemovedProbeIsNotAsked) {
  Failures f;
  Watchdog w(100, 0, f.fn(), 0.5);
  uint64_t probe = w.add_error_probe([] { return std::string("broken"); });
  w.remove_error_probe(probe);  // long before the first poll, half a second away
  sleep_s(1.0);
  EXPECT_EQ(f.count(), 0u);
}

TEST(Watchdog, RejectsANonPositiveTimeout) {
  Failures f;
  EXPECT_THROW(Watchdog(0, 0, f.fn()), Error);
  EXPECT_THROW(Watchdog(-5, 0, f.fn()), Error);
}

TEST(Watchdog, WithoutAProcessWatchdogTheHooksDoNothing) {
  ASSERT_FALSE(watchdog_running());
  EXPECT_EQ(watchdog_begin("all_gather"), 0u);
  watchdog_end(0);
  watchdog_set_step(3);
  { WatchScope scope("barrier"); }
}

// ---- which ranks did not arrive: the progress records ----
namespace {

PeerRecords records(const std::string& dir, int world, const std::string& run = "run7") {
  PeerRecords p;
  p.dir = dir;
  p.world_size = world;
  p.run_id = run;
  p.host = "node" + run;
  return p;
}

// Begins n collectives and ends them.
void run_collectives(Watchdog& w, int n) {
  for (int i = 0; i < n; i++) w.end(w.begin("all_reduce of 1 f64 over 2 ranks (mpi)"));
}

}  // namespace

TEST(WatchdogRecords, TheTimeoutNamesTheRankThatNeverBeganTheCollective) {
  llmt_test::TempDir tmp("watchdog");
  const std::string& dir = tmp.path;
  Failures never;  // rank 1 keeps up until collective #3, then stops issuing any
  Watchdog w1(0.8, 1, never.fn(), 0.01, records(dir, 2));
  run_collectives(w1, 3);
  sleep_s(0.5);  // its record is rewritten within timeout/4 = 0.2 s

  Failures f;
  Watchdog w0(0.4, 0, f.fn(), 0.01, records(dir, 2));
  run_collectives(w0, 3);
  w0.begin("all_gather of 64 f32 over 2 ranks (mpi)");  // #4, which rank 1 never begins
  ASSERT_TRUE(wait_for_failure(f, 5.0));
  const std::string m = f.first();
  EXPECT_NE(m.find("collective #4"), std::string::npos) << m;
  // the record's age depends on the machine's pace; the rest is exact
  EXPECT_NE(m.find("rank that did not arrive: 1 (noderun7 pid " + std::to_string(getpid()) + "; its last record, "),
            std::string::npos)
      << m;
  EXPECT_NE(m.find(" s old, shows collective #3 begun before the first step)"), std::string::npos) << m;
  EXPECT_EQ(never.count(), 0u);
}

TEST(WatchdogRecords, EveryRankArrivedMeansTheCollectiveItselfIsStuck) {
  llmt_test::TempDir tmp("watchdog");
  const std::string& dir = tmp.path;
  Failures never;
  Watchdog w1(0.8, 1, never.fn(), 0.01, records(dir, 2));
  w1.set_step(5);
  w1.begin("all_gather of 64 f32 over 2 ranks (mpi)");  // rank 1 is in #1 as well (and would time out too)
  sleep_s(0.3);
  Failures f;
  Watchdog w0(0.4, 0, f.fn(), 0.01, records(dir, 2));
  w0.begin("all_gather of 64 f32 over 2 ranks (mpi)");
  ASSERT_TRUE(wait_for_failure(f, 5.0));
  EXPECT_NE(f.first().find("every rank began it"), std::string::npos) << f.first();
  EXPECT_EQ(f.first().find("did not arrive"), std::string::npos) << f.first();
}

TEST(WatchdogRecords, MissingAndStaleRecordsAreSaidToBeMissing) {
  llmt_test::TempDir tmp("watchdog");
  const std::string& dir = tmp.path;
  auto write = [&](int rank, const char* text) {
    FILE* f = std::fopen(peer_record_path(dir, rank).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text, f);
    std::fclose(f);
  };
  // rank 1's record is from another run (a crash in the same folder), rank 2's is torn, rank 3 wrote none
  write(1, "llmt-progress run=run6 rank=1 host=a pid=2 seq=900 step=4 time=5\n");
  write(2, "llmt-progress run=run7 rank=2 host=a pid=2 seq=");
  Failures f;
  Watchdog w0(0.3, 0, f.fn(), 0.01, records(dir, 4));
  w0.set_step(2);
  w0.begin("reduce_scatter of 64 f32 over 4 ranks (nccl)");
  ASSERT_TRUE(wait_for_failure(f, 5.0));
  const std::string m = f.first();
  EXPECT_NE(m.find("step 2) did not finish"), std::string::npos) << m;
  EXPECT_NE(m.find("no progress record of this run from ranks 1, 2, 3 under " + dir), std::string::npos) << m;
}

TEST(WatchdogRecords, ARecordSaysWhatTheRankBeganAndAFinishedRunRemovesIt) {
  llmt_test::TempDir tmp("watchdog");
  const std::string& dir = tmp.path;
  {
    Failures f;
    Watchdog w(0.4, 3, f.fn(), 0.01, records(dir, 4));
    w.set_step(9);
    run_collectives(w, 5);
    sleep_s(0.3);  // past timeout/4
    std::ifstream in(peer_record_path(dir, 3));
    std::stringstream text;
    text << in.rdbuf();
    PeerRecord r;
    ASSERT_TRUE(parse_peer_record(text.str(), &r)) << text.str();
    EXPECT_EQ(r.run_id, "run7");
    EXPECT_EQ(r.host, "noderun7");
    EXPECT_EQ(r.seq, 5u);
    EXPECT_EQ(r.step, 9);
    EXPECT_EQ(r.pid, (long long)getpid());
  }
  struct stat st;
  EXPECT_NE(stat(peer_record_path(dir, 3).c_str(), &st), 0) << "the record outlived its run";
  EXPECT_NE(stat(dir.c_str(), &st), 0) << "the empty records folder was left behind";
}

// A new step is in the record at the next poll, however soon after the last write: steps 1-3 ran
// within one record interval (5 s), the rank was stopped in step 3's save, and the timeout quoted its
// record of before the first step.
TEST(WatchdogRecords, ANewStepIsRecordedAtTheNextPoll) {
  llmt_test::TempDir tmp("watchdog");
  const std::string& dir = tmp.path;
  Failures f;
  Watchdog w(20.0, 1, f.fn(), 0.02, records(dir, 2));  // records at most every 5 s
  run_collectives(w, 9);
  for (int step = 1; step <= 3; step++) {
    w.set_step(step);
    run_collectives(w, 4);
  }
  sleep_s(0.4);  // 20 polls, far from 5 s
  std::ifstream in(peer_record_path(dir, 1));
  std::stringstream text;
  text << in.rdbuf();
  PeerRecord r;
  ASSERT_TRUE(parse_peer_record(text.str(), &r)) << text.str();
  EXPECT_EQ(r.step, 3) << text.str();
  EXPECT_EQ(r.seq, 21u) << text.str();
  EXPECT_EQ(f.count(), 0u);
}

TEST(WatchdogRecords, RecordsAddedAfterTheStartSayWhatWasBegunAndGoWhenCleared) {
  // init_launch starts the watchdog before MPI_Init; the trainer adds the records later
  llmt_test::TempDir tmp("watchdog");
  const std::string& dir = tmp.path;
  Failures f;
  Watchdog w(0.4, -1, f.fn(), 0.01);
  w.set_rank(2);
  run_collectives(w, 6);
  w.set_peers(records(dir, 4));
  std::ifstream in(peer_record_path(dir, 2));
  std::stringstream text;
  text << in.rdbuf();
  PeerRecord r;
  ASSERT_TRUE(parse_peer_record(text.str(), &r)) << text.str();
  EXPECT_EQ(r.seq, 6u);
  w.clear_peers();
  struct stat st;
  EXPECT_NE(stat(peer_record_path(dir, 2).c_str(), &st), 0) << "clear_peers left the record";
  EXPECT_NE(stat(dir.c_str(), &st), 0) << "clear_peers left the empty folder";
}

// A rank stopped (SIGSTOP) while in a collective finds it past the timeout the moment it resumes, and
// every peer's record at or past it: it must say it was stopped, not that the collective is stuck.
TEST(WatchdogRecords, AResumedRankSaysItWasStoppedNotThatTheCollectiveIsStuck) {
  llmt_test::TempDir tmp("watchdog");
  const std::string dir = tmp.path;
  // rank 0 began #5 too (its record, as the stopped rank finds it on resuming)
  {
    FILE* f = std::fopen(peer_record_path(dir, 0).c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "llmt-progress run=run7 rank=0 host=a pid=1 seq=5 step=3 time=%.3f\n", (double)std::time(nullptr));
    std::fclose(f);
  }
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 1, in a process of its own that stops itself
    Watchdog w(1.0, 1,
               [&](const std::string& m) {
                 (void)!write(report[1], m.data(), m.size());
                 _exit(0);
               },
               0.05, records(dir, 2));
    w.set_step(3);
    run_collectives(w, 4);
    w.begin("all_gather of 64 f32 over 2 ranks (mpi)");  // #5
    // Stopped by itself right after it began, not by the parent once told: a parent slow to be
    // scheduled (ASan on a loaded host) let the timeout pass before the stop, and the message was
    // then the stuck collective's, not the stopped rank's.
    raise(SIGSTOP);
    for (;;) pause();
  }
  close(report[1]);  // only the child writes: a child that dies ends the reads below, never hangs them
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the child ended before it stopped, status " << status;
  sleep_s(2.5);  // longer than the timeout: the peers would have given up
  kill(child, SIGCONT);
  std::string m;
  char buf[4096];
  for (ssize_t n; (n = read(report[0], buf, sizeof(buf))) > 0;) {
    m.append(buf, (size_t)n);
    break;  // one write holds the whole message
  }
  waitpid(child, &status, 0);
  EXPECT_NE(m.find("collective #5, step 3) did not finish within 1 s"), std::string::npos) << m;
  EXPECT_NE(m.find("this rank itself was not running for "), std::string::npos) << m;
  EXPECT_EQ(m.find("every rank began it"), std::string::npos) << m;
}

TEST(WatchdogRecords, ParserRejectsWhatItCannotTrust) {
  PeerRecord r;
  EXPECT_TRUE(parse_peer_record("llmt-progress run=1 rank=0 host=a pid=2 seq=3 step=-1 time=5.5\n", &r));
  EXPECT_TRUE(parse_peer_record("llmt-progress run=1 host=a pid=2 seq=3 step=4 time=5 future=x\n", &r));
  EXPECT_FALSE(parse_peer_record("", &r));
  EXPECT_FALSE(parse_peer_record("llmt-progress run=1 host=a pid=2 seq=3", &r));             // torn
  EXPECT_FALSE(parse_peer_record("llmt-progress run=1 host=a pid=2 seq=3x step=4 time=5", &r));  // not a number
  EXPECT_FALSE(parse_peer_record("something else entirely", &r));
}
