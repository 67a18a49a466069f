#include "engine/core/error.h"

#include <cstdio>
#include <vector>

namespace llmt {

std::string vstrformat(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = std::vsnprintf(nullptr, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) return fmt;
  std::vector<char> buf((size_t)n + 1);
  std::vsnprintf(buf.data(), buf.size(), fmt, ap);
  return std::string(buf.data(), (size_t)n);
}

std::string strformat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrformat(fmt, ap);
  va_end(ap);
  return s;
}

void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrformat(fmt, ap);
  va_end(ap);
  throw Error(s);
}

}  // namespace llmt
