#include "engine/core/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace llmt {

namespace {

// Formatted ahead of time: a signal handler may only write(), never printf or allocate.
char g_who[160] = "llmt";
size_t g_who_len = 4;

void set_who(int rank, int world_size) {
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  int n = world_size > 1 ? std::snprintf(g_who, sizeof(g_who), "llmt rank %d of %d on %s, pid %d", rank, world_size,
                                         host, (int)getpid())
                         : std::snprintf(g_who, sizeof(g_who), "llmt on %s, pid %d", host, (int)getpid());
  g_who_len = n > 0 ? std::min((size_t)n, sizeof(g_who) - 1) : 0;
}

void put(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

// The report's first line, built whole and written with one write(): a launcher that merges the
// ranks' output (mpirun, srun) then never splits it with another rank's line.
struct Line {
  char text[512];
  size_t len = 0;
  void add(const char* s, size_t n) {
    n = std::min(n, sizeof(text) - len);
    std::memcpy(text + len, s, n);
    len += n;
  }
  void add(const char* s) { add(s, std::strlen(s)); }
  void add_number(unsigned long v, unsigned base) {  // no printf in a signal handler
    char buf[24];
    char* p = buf + sizeof(buf);
    do {
      *--p = "0123456789abcdef"[v % base];
      v /= base;
    } while (v);
    if (base == 16) add("0x");
    add(p, (size_t)(buf + sizeof(buf) - p));
  }
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV (invalid memory access)";
    case SIGBUS: return "SIGBUS (bus error: a mapped file shrank, or misaligned access)";
    case SIGILL: return "SIGILL (illegal instruction: built for a newer CPU?)";
    case SIGFPE: return "SIGFPE (arithmetic fault)";
    case SIGABRT: return "SIGABRT (abort)";
    default: return "a fatal signal";
  }
}

// Where the fault happened, from the interrupted context: the program counter, and when it is 0 (a
// call through a null function pointer, which leaves backtrace() nothing to unwind) the return
// address the call pushed, which names the caller. x86-64 Linux only; elsewhere nothing.
void put_fault_site(void* ctx) {
#if defined(__x86_64__) && defined(__linux__)
  if (!ctx) return;
  const ucontext_t* uc = static_cast<const ucontext_t*>(ctx);
  void* at[2] = {reinterpret_cast<void*>(uc->uc_mcontext.gregs[REG_RIP]), nullptr};
  int n = 1;
  if (at[0] == nullptr) {  // the stack is the caller's, intact: its top is the return address
    at[1] = *reinterpret_cast<void* const*>(uc->uc_mcontext.gregs[REG_RSP]);
    n = 2;
  }
  const char head[] = "fault site (the program counter; when it is 0, the return address of the null call):\n";
  put(head, sizeof(head) - 1);
  backtrace_symbols_fd(at, n, STDERR_FILENO);
#else
  (void)ctx;
#endif
}

void on_fatal_signal(int sig, siginfo_t* info, void* ctx) {
  Line line;
  line.add("\n");
  line.add(g_who, g_who_len);
  line.add(": fatal signal ");
  line.add(signal_name(sig));
  if (info && info->si_code > 0 && sig != SIGABRT) {  // raised by the kernel: the fault's address
    line.add(" at address ");
    line.add_number((unsigned long)(uintptr_t)info->si_addr, 16);
  } else if (info && info->si_code <= 0) {  // sent by kill(2) or raise(3)
    line.add(" sent by pid ");
    line.add_number((unsigned long)info->si_pid, 10);
  }
  line.add("; backtrace:\n");
  put(line.text, line.len);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  if (info && info->si_code > 0 && sig != SIGABRT) put_fault_site(ctx);
  // The default action back, then the same signal again: the process ends as it would have ended
  // without this report (status, core dump). Set here, not only by SA_RESETHAND: another handler
  // that chains to this one (the SIMT emulator's) calls it as a function, and raising under that
  // handler's own disposition reported the crash again and again.
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

void install_crash_report() {
  set_who(0, 1);
  // backtrace() loads libgcc on its first call, which must not happen inside the handler.
  void* warm[1];
  backtrace(warm, 1);
  // Its own stack, so that a stack overflow is reported too (the main thread's: the alternate stack
  // is per thread).
  static char alt_stack[64 * 1024];
  stack_t ss;
  std::memset(&ss, 0, sizeof(ss));
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof(alt_stack);
  sigaltstack(&ss, nullptr);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_fatal_signal;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) sigaction(sig, &sa, nullptr);
}

void crash_report_set_rank(int rank, int world_size) { set_who(rank, world_size); }

}  // namespace llmt
