#include "engine/dist/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "engine/core/error.h"

namespace llmt {

Watchdog::Watchdog(double timeout_s, int rank, FailFn on_fail, double poll_s)
    : timeout_s_(timeout_s),
      // often enough that a timeout is seen within a tenth of it, never busier than every 10 ms
      poll_s_(poll_s > 0 ? poll_s : std::clamp(timeout_s / 10, 0.01, 1.0)),
      rank_(rank),
      on_fail_(std::move(on_fail)) {
  LLMT_CHECK(timeout_s > 0, "--ddp_timeout must be positive, got %g", timeout_s);
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t Watchdog::begin(const std::string& what, std::function<bool()> done) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  entries_[id] = Entry{what, ++seq_, step_, std::chrono::steady_clock::now(), std::move(done)};
  return id;
}

void Watchdog::end(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(id);
}

uint64_t Watchdog::add_error_probe(std::function<std::string()> error) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  probes_[id] = std::move(error);
  return id;
}

void Watchdog::remove_error_probe(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  probes_.erase(id);
}

void Watchdog::set_step(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
}

size_t Watchdog::in_flight() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_ && !failed_) {
    cv_.wait_for(lock, std::chrono::duration<double>(poll_s_), [this] { return stop_; });
    if (stop_) break;
    std::string reason;
    // Probes and done() run under the lock: begin/end wait a poll's work at most, and an entry's
    // done() never runs after end() removed it.
    for (auto& [id, probe] : probes_) {
      reason = probe();
      if (!reason.empty()) break;
    }
    const auto now = std::chrono::steady_clock::now();
    for (auto it = entries_.begin(); reason.empty() && it != entries_.end();) {
      Entry& e = it->second;
      if (e.done && e.done()) {
        it = entries_.erase(it);
        continue;
      }
      const double waited = std::chrono::duration<double>(now - e.start).count();
      if (waited > timeout_s_) {
        reason = strformat("%s (collective #%llu, %s) did not finish within %g s (--ddp_timeout): a peer rank is "
                           "dead, stopped or far behind",
                           e.what.c_str(), (unsigned long long)e.seq,
                           e.step < 0 ? "before the first step" : strformat("step %lld", (long long)e.step).c_str(),
                           timeout_s_);
      }
      ++it;
    }
    if (reason.empty()) continue;
    failed_ = true;
    const std::string message = strformat("rank %d: %s", rank_, reason.c_str());
    lock.unlock();
    on_fail_(message);
    return;
  }
}

// ---- the process-wide watchdog ----
namespace {

std::mutex g_mu;  // guards g_watchdog and g_hooks
std::unique_ptr<Watchdog> g_watchdog;
std::map<uint64_t, std::function<void()>> g_hooks;
uint64_t g_next_hook = 1;

[[noreturn]] void fail_process(const std::string& message) {
  std::fprintf(stderr, "error: %s; aborting the job\n", message.c_str());
  std::fflush(stderr);
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (auto& [id, h] : g_hooks) hooks.push_back(h);
  }
  for (auto& h : hooks) h();
  // _exit: the main thread may sit in MPI or in a CUDA call that will never return; no destructor
  // may wait for it.
  _exit(kWatchdogExitCode);
}

Watchdog* current() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_watchdog.get();
}

}  // namespace

void watchdog_start(double timeout_s, int rank) {
  std::lock_guard<std::mutex> lock(g_mu);
  LLMT_CHECK(!g_watchdog, "the watchdog is already running");
  g_watchdog = std::make_unique<Watchdog>(timeout_s, rank, fail_process);
}

void watchdog_stop() {
  std::unique_ptr<Watchdog> w;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    w = std::move(g_watchdog);
  }
}

bool watchdog_running() { return current() != nullptr; }

uint64_t watchdog_begin(const std::string& what, std::function<bool()> done) {
  Watchdog* w = current();
  return w ? w->begin(what, std::move(done)) : 0;
}

void watchdog_end(uint64_t id) {
  if (Watchdog* w = current(); w && id) w->end(id);
}

uint64_t watchdog_add_error_probe(std::function<std::string()> error) {
  Watchdog* w = current();
  return w ? w->add_error_probe(std::move(error)) : 0;
}

void watchdog_remove_error_probe(uint64_t id) {
  if (Watchdog* w = current(); w && id) w->remove_error_probe(id);
}

void watchdog_set_step(int64_t step) {
  if (Watchdog* w = current()) w->set_step(step);
}

uint64_t watchdog_add_abort_hook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(g_mu);
  const uint64_t id = g_next_hook++;
  g_hooks[id] = std::move(hook);
  return id;
}

void watchdog_remove_abort_hook(uint64_t id) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hooks.erase(id);
}

}  // namespace llmt
