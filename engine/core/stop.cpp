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

void throw_if_stopped(const std::string& doing) {
  const int sig = stop_signal();
  if (sig == 0) return;
  fail("stopped by %s while %s: nothing was saved", sig == SIGTERM ? "SIGTERM" : sig == SIGUSR1 ? "SIGUSR1"
                                                     : sig == SIGINT ? "SIGINT" : strsignal(sig), doing.c_str());
}

}  // namespace llmt
