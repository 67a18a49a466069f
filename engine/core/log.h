// Rank-aware logging: log_info prints on rank 0 only, log_warn and log_error on every rank
// (prefixed with the rank when there is more than one).
#pragma once

namespace llmt {

void log_set_rank(int rank, int world_size);
int log_rank();
void log_info(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// log_info writes to stdout, or to stderr once a command keeps stdout for its data (llmt generate).
void log_info_to_stderr(bool on);
void log_warn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace llmt
