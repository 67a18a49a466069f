// The crash report: a process that dies of a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT)
// first prints one line saying which process it was (rank, host, pid), the signal and the faulting
// address, and then a backtrace, on stderr. Then the signal takes its default action again, so the
// exit status (139 for SIGSEGV), the launcher's report and any core dump are what they would have
// been. On a cluster the launcher alone says only "task 3: Segmentation fault".
#pragma once

namespace llmt {

// Once, as the process starts (before MPI, whose own handlers then leave ours in place).
void install_crash_report();
// Called when the rank is known: later reports name it.
void crash_report_set_rank(int rank, int world_size);

}  // namespace llmt
