// Errors that carry context: every failure names what was being done (file, tensor, record)
// and what was expected. Thrown as llmt::Error and caught once, in main.
#pragma once
#include <cstdarg>
#include <stdexcept>
#include <string>

namespace llmt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// printf-style formatting into a std::string.
std::string strformat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string vstrformat(const char* fmt, va_list ap);

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace llmt

// LLMT_CHECK(cond, "what went wrong: %s", detail) throws llmt::Error when cond is false.
#define LLMT_CHECK(cond, ...)        \
  do {                               \
    if (!(cond)) ::llmt::fail(__VA_ARGS__); \
  } while (0)
