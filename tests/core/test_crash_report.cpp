// The crash report (engine/core/crash.h) of a call through a null function pointer: backtrace()
// cannot unwind from program counter 0, so the report adds the fault site, whose return address
// names the caller. A netcheck rank died so once (cluster.slurm, a requeued job) with a report that
// named nothing but the handler.
#include <gtest/gtest.h>

#include "engine/core/crash.h"

// x86-64 Linux only (the fault site is read from its context), and not under AddressSanitizer, whose
// own SIGSEGV handler reports the crash instead
#if defined(__x86_64__) && defined(__linux__) && !defined(__SANITIZE_ADDRESS__)
namespace {

using Fn = void (*)();
volatile Fn g_null_fn = nullptr;

// not inlined, so that it is the caller the report must name
__attribute__((noinline)) void call_through_null() {
  g_null_fn();
  asm volatile("");  // keeps the call from becoming a tail jump, which pushes no return address
}

}  // namespace

TEST(CrashReport, ANullCallNamesItsCaller) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        llmt::install_crash_report();
        call_through_null();
      },
      "at address 0x0; backtrace:(.|\n)*fault site \\(the program counter; when it is 0, the return address of the "
      "null call\\):\n[^\n]*\\[0x0\\]\n[^\n]*\\(([^)]*)\\+0x[0-9a-f]+\\)\\[0x[0-9a-f]+\\]");
}
#endif
