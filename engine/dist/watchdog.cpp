#include "engine/dist/watchdog.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "engine/core/error.h"

namespace llmt {

static double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string peer_record_path(const std::string& dir, int rank) { return strformat("%s/rank-%d", dir.c_str(), rank); }

bool parse_peer_record(const std::string& text, PeerRecord* out) {
  std::istringstream in(text);
  std::string word;
  if (!(in >> word) || word != "llmt-progress") return false;
  PeerRecord r;
  int fields = 0;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) return false;
    const std::string k = word.substr(0, eq), v = word.substr(eq + 1);
    char* end = nullptr;
    errno = 0;
    if (k == "run") r.run_id = v;
    else if (k == "host") r.host = v;
    else if (k == "seq") r.seq = std::strtoull(v.c_str(), &end, 10);
    else if (k == "step") r.step = std::strtoll(v.c_str(), &end, 10);
    else if (k == "pid") r.pid = std::strtoll(v.c_str(), &end, 10);
    else if (k == "time") r.written_unix_s = std::strtod(v.c_str(), &end);
    else continue;  // a later version's field
    if (end && (*end || errno)) return false;
    fields++;
  }
  if (fields < 6) return false;
  *out = r;
  return true;
}

Watchdog::Watchdog(double timeout_s, int rank, FailFn on_fail, double poll_s, PeerRecords peers)
    : timeout_s_(timeout_s),
      // often enough that a timeout is seen within a tenth of it, never busier than every 10 ms
      poll_s_(poll_s > 0 ? poll_s : std::clamp(timeout_s / 10, 0.01, 1.0)),
      // a record is final well before any peer's timeout can fire, and costs at most one small
      // write every 5 s per rank on the shared file system
      record_every_s_(std::clamp(timeout_s / 4, poll_s_, 5.0)),
      rank_(rank),
      peers_(std::move(peers)),
      on_fail_(std::move(on_fail)) {
  LLMT_CHECK(timeout_s > 0, "--ddp_timeout must be positive, got %g", timeout_s);
  if (!peers_.dir.empty()) {  // "began nothing yet", before any collective
    write_record(peers_, rank_, 0, -1);
    recorded_seq_ = 0;
    recorded_step_ = -1;
    recorded_at_ = std::chrono::steady_clock::now();
  }
  started_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { run(); });
}

void Watchdog::set_rank(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  rank_ = rank;
}

void Watchdog::set_peers(PeerRecords peers) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_ = std::move(peers);
  // what this rank began so far: every rank issued the same collectives up to here
  if (!peers_.dir.empty()) {
    write_record(peers_, rank_, seq_, step_);
    recorded_seq_ = seq_;
    recorded_step_ = step_;
    recorded_at_ = std::chrono::steady_clock::now();
  }
}

void Watchdog::clear_peers() {
  std::unique_lock<std::mutex> lock(mu_);
  written_.wait(lock, [this] { return !writing_; });  // no record is rewritten after it is removed
  if (peers_.dir.empty()) return;
  // the last rank out removes the run's folder, and .llmt-progress when it is empty
  std::remove(peer_record_path(peers_.dir, rank_).c_str());
  ::rmdir(peers_.dir.c_str());
  const size_t slash = peers_.dir.rfind('/');
  if (slash != std::string::npos) ::rmdir(peers_.dir.substr(0, slash).c_str());
  peers_ = PeerRecords{};
}

// Written whole to a temporary and renamed, so a reader never sees half a record.
void Watchdog::write_record(const PeerRecords& peers, int rank, uint64_t seq, int64_t step) {
  const std::string path = peer_record_path(peers.dir, rank), tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return;  // the message will say the record is missing; nothing else depends on it
  std::fprintf(f, "llmt-progress run=%s rank=%d host=%s pid=%lld seq=%llu step=%lld time=%.3f\n",
               peers.run_id.c_str(), rank, peers.host.c_str(), (long long)getpid(), (unsigned long long)seq,
               (long long)step, unix_seconds());
  const bool ok = std::fclose(f) == 0;
  if (ok) std::rename(tmp.c_str(), path.c_str());
}

// The ranks whose records show they never began collective #seq, for the timeout message.
std::string Watchdog::who_did_not_arrive(const PeerRecords& peers_, int rank_, uint64_t seq, bool paused) {
  std::vector<std::string> behind;
  std::vector<int> missing;
  const double now = unix_seconds();
  for (int r = 0; r < peers_.world_size; r++) {
    if (r == rank_) continue;
    std::ifstream in(peer_record_path(peers_.dir, r));
    std::stringstream text;
    text << in.rdbuf();
    PeerRecord rec;
    if (!in || !parse_peer_record(text.str(), &rec) || rec.run_id != peers_.run_id) {
      missing.push_back(r);
      continue;
    }
    if (rec.seq >= seq) continue;
    // The record is rewritten every few seconds, so a rank stopped since then may have got further.
    const std::string shows =
        rec.seq == 0 ? std::string("no collective begun yet")
                     : strformat("collective #%llu begun %s", (unsigned long long)rec.seq,
                                 rec.step < 0 ? "before the first step"
                                              : strformat("at step %lld", (long long)rec.step).c_str());
    behind.push_back(strformat("%d (%s pid %lld; its last record, %.0f s old, shows %s)", r, rec.host.c_str(),
                               rec.pid, std::max(0.0, now - rec.written_unix_s), shows.c_str()));
  }
  auto list = [](const std::vector<std::string>& items) {
    std::string s;
    const size_t shown = std::min<size_t>(items.size(), 8);
    for (size_t i = 0; i < shown; i++) s += (i ? ", " : "") + items[i];
    if (items.size() > shown) s += strformat(" and %zu more", items.size() - shown);
    return s;
  };
  std::string out;
  if (!behind.empty())
    out += strformat("; rank%s that did not arrive: %s", behind.size() == 1 ? "" : "s", list(behind).c_str());
  if (!missing.empty()) {
    std::vector<std::string> ranks;
    for (int r : missing) ranks.push_back(std::to_string(r));
    out += strformat("; no progress record of this run from rank%s %s under %s (is the output directory on a "
                     "file system every node shares?)",
                     missing.size() == 1 ? "" : "s", list(ranks).c_str(), peers_.dir.c_str());
  }
  if (behind.empty() && missing.empty() && !paused)
    out += strformat("; every rank began it (records under %s): the collective itself is stuck (network, NCCL)",
                     peers_.dir.c_str());
  return out;
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  clear_peers();  // a finished run leaves no records behind
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
  // A gap this long between two polls means the process was not running (SIGSTOP, a frozen node or
  // VM): a loaded machine delays a wake-up by milliseconds, not seconds.
  const double pause_gap_s = std::max(1.0, 5 * poll_s_);
  // from the constructor, not this thread's start: a process stopped before the thread first ran
  // (found by a test that stops itself right after its first collectives) still sees the gap
  auto last_wake = started_;
  while (!stop_ && !failed_) {
    cv_.wait_for(lock, std::chrono::duration<double>(poll_s_), [this] { return stop_; });
    if (stop_) break;
    const auto woke = std::chrono::steady_clock::now();
    const double gap = std::chrono::duration<double>(woke - last_wake).count();
    last_wake = woke;
    if (gap > pause_gap_s) {
      paused_s_ = gap - poll_s_;
      resumed_at_ = woke;
    }
    std::string reason;
    // Probes and done() run under the lock: begin/end wait a poll's work at most, and an entry's
    // done() never runs after end() removed it.
    for (auto& [id, probe] : probes_) {
      reason = probe();
      if (!reason.empty()) break;
    }
    const auto now = std::chrono::steady_clock::now();
    uint64_t stuck_seq = 0;
    std::string pause_note;
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
        stuck_seq = e.seq;
        // Stopped while it waited, or shortly before it began (the peers gave up meanwhile): the
        // timeout is this rank's own doing, whatever the records say.
        if (paused_s_ > 0 && resumed_at_ + std::chrono::duration<double>(timeout_s_) >= e.start)
          pause_note = strformat("; this rank itself was not running for %.0f s until %.0f s ago (stopped with "
                                 "SIGSTOP, or its node or VM froze): the other ranks have likely timed out waiting "
                                 "for it and ended",
                                 paused_s_, std::chrono::duration<double>(now - resumed_at_).count());
      }
      ++it;
    }
    if (reason.empty()) {
      // A new step is written at once (at most once a poll), other progress at most every
      // record_every_s_: a rank stopped during step 3's save was quoted from a record of before the
      // first step, written before steps 1-3 ran within one record interval.
      const bool new_step = step_ != recorded_step_;
      if (!peers_.dir.empty() && (new_step || (seq_ != recorded_seq_ &&
                                               std::chrono::duration<double>(now - recorded_at_).count() >= record_every_s_))) {
        const uint64_t seq = seq_;
        const int64_t step = step_;
        const PeerRecords peers = peers_;
        const int rank = rank_;
        recorded_seq_ = seq;
        recorded_step_ = step;
        recorded_at_ = now;
        writing_ = true;
        lock.unlock();  // file I/O must not hold up begin() and end()
        write_record(peers, rank, seq, step);
        lock.lock();
        writing_ = false;
        written_.notify_all();
      }
      continue;
    }
    failed_ = true;
    const PeerRecords peers = peers_;
    const int rank = rank_;
    lock.unlock();
    if (stuck_seq && !peers.dir.empty()) reason += who_did_not_arrive(peers, rank, stuck_seq, !pause_note.empty());
    reason += pause_note;
    on_fail_(strformat("rank %d: %s", rank, reason.c_str()));
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

void watchdog_start(double timeout_s, int rank, PeerRecords peers) {
  std::lock_guard<std::mutex> lock(g_mu);
  LLMT_CHECK(!g_watchdog, "the watchdog is already running");
  g_watchdog = std::make_unique<Watchdog>(timeout_s, rank, fail_process, 0, std::move(peers));
}

void watchdog_set_rank(int rank) {
  if (Watchdog* w = current()) w->set_rank(rank);
}

void watchdog_set_peers(PeerRecords peers) {
  if (Watchdog* w = current()) w->set_peers(std::move(peers));
}

void watchdog_clear_peers() {
  if (Watchdog* w = current()) w->clear_peers();
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

void test_stop_point(const char* where, int rank) {
  const char* spec = std::getenv("LLMT_TEST_STOP");
  if (!spec) return;
  const char* colon = std::strchr(spec, ':');
  if (!colon || std::atoi(spec) != rank || std::strcmp(colon + 1, where) != 0) return;
  std::fprintf(stderr, "rank %d: LLMT_TEST_STOP: stopping itself at %s (pid %lld)\n", rank, where, (long long)getpid());
  std::fflush(stderr);
  ::raise(SIGSTOP);
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
