#include "engine/core/log.h"

#include <cstdarg>
#include <cstdio>

namespace llmt {

static int g_rank = 0;
static int g_world = 1;
static bool g_info_stderr = false;

void log_set_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}

int log_rank() { return g_rank; }

void log_info_to_stderr(bool on) { g_info_stderr = on; }

static void vlog(FILE* f, const char* tag, const char* fmt, va_list ap) {
  if (g_world > 1) std::fprintf(f, "[rank %d] ", g_rank);
  if (tag) std::fprintf(f, "%s", tag);
  std::vfprintf(f, fmt, ap);
  std::fputc('\n', f);
  std::fflush(f);
}

void log_info(const char* fmt, ...) {
  if (g_rank != 0) return;
  va_list ap;
  va_start(ap, fmt);
  FILE* f = g_info_stderr ? stderr : stdout;
  std::vfprintf(f, fmt, ap);
  std::fputc('\n', f);
  std::fflush(f);
  va_end(ap);
}

void log_warn(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(stderr, "warning: ", fmt, ap);
  va_end(ap);
}

void log_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(stderr, "error: ", fmt, ap);
  va_end(ap);
}

}  // namespace llmt
