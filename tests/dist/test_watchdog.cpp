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

#include "engine/core/error.h"
#include "engine/dist/watchdog.h"

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
