#include "engine/core/stop.h"

#include <atomic>
#include <csignal>
#include <cstring>

#include "engine/core/error.h"

namespace llmt {

namespace {
std::atomic<int> g_stop{0};
}

void set_stop_signal(int sig) { g_stop = sig; }

int stop_signal() { return g_stop.load(std::memory_order_relaxed); }

bool stop_now() {
  const int sig = stop_signal();
  return sig != 0 && sig != SIGUSR1;
}

void throw_if_stopped(const std::string& doing) {
  if (!stop_now()) return;
  const int sig = stop_signal();
  fail("stopped by %s while %s: nothing was saved", sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1"
                                                     : sig == SIGINT ? "SIGINT" : strsignal(sig), doing.c_str());
}

}  // namespace llmt
