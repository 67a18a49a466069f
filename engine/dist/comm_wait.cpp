#include "engine/dist/comm_wait.h"

#include <atomic>
#include <chrono>

namespace llmt {

namespace {
std::atomic<long long> g_wait_ns{0};
thread_local int t_depth = 0;  // timers open on this thread

double steady_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::atomic<double (*)()> g_device_source{nullptr};  // set_device_comm_wait's
}  // namespace

double host_comm_wait_s() { return (double)g_wait_ns.load() * 1e-9; }

double comm_wait_s() {
  double (*device)() = g_device_source.load();
  return host_comm_wait_s() + (device ? device() : 0.0);
}

void set_device_comm_wait(double (*seconds)()) { g_device_source = seconds; }

CommWaitTimer::CommWaitTimer() {
  if (t_depth++ == 0) start_ = steady_s();
}

CommWaitTimer::~CommWaitTimer() {
  t_depth--;
  if (start_ >= 0) g_wait_ns += (long long)((steady_s() - start_) * 1e9);
}

}  // namespace llmt
