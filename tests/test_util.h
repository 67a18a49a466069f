// Helpers shared by the tests: where the sources and the shared data are, relative error.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"

namespace llmt_test {

// Runs f and expects an llmt::Error whose message holds every one of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const llmt::Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "\"" << p << "\" not in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected an llmt::Error";
}

// The message of the llmt::Error that f throws, or "(no error)" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const llmt::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Expects `stmt` to throw an llmt::Error whose message holds `needle`, and shows the message if not.
#define EXPECT_ERROR_HAS(stmt, needle)                                                   \
  do {                                                                                   \
    const std::string msg_ = llmt_test::error_of([&] { stmt; });                        \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "error was: " << msg_;            \
  } while (0)

// The checkout the tests were built from; $LLMT_SOURCE_DIR when the programs moved to another
// machine (scripts/gpu_bundle.sh).
inline std::string source_dir() {
  const char* env = std::getenv("LLMT_SOURCE_DIR");
  return env && *env ? std::string(env) : LLMT_SOURCE_DIR;
}
inline std::string reference_dir() { return source_dir() + "/tests/reference"; }
// Real data (tokenizers, WikiText, ...): $LLMT_TEST_DATA, else ../shared/data beside the checkout.
inline std::string shared_data_dir() {
  const char* env = std::getenv("LLMT_TEST_DATA");
  return env && *env ? std::string(env) : source_dir() + "/../shared/data";
}

// max |a - b| / max |b|: the error relative to the reference's scale.
inline double rel_error(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    num = std::max(num, (double)std::fabs((double)a[i] - (double)b[i]));
    den = std::max(den, (double)std::fabs((double)b[i]));
  }
  return den > 0.0 ? num / den : num;
}

// A fresh folder /tmp/llmt_<name>_XXXXXX (mkdtemp: one test may hold several), removed with what the
// test put there when it goes out of scope.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& name) {
    std::string tmpl = "/tmp/llmt_" + name + "_XXXXXX";
    const char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << tmpl;
    path = made ? made : tmpl;
  }
  ~TempDir() { (void)!std::system(("rm -rf '" + path + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// A backend tensor (f32 or bf16) as host floats.
inline std::vector<float> to_host(llmt::Backend& be, const llmt::Tensor& t) {
  std::vector<float> out((size_t)t.numel());
  if (t.dtype == llmt::DType::f32) {
    be.copy_to_host(out.data(), t.data, t.nbytes());
  } else {
    std::vector<uint16_t> h((size_t)t.numel());
    be.copy_to_host(h.data(), t.data, t.nbytes());
    for (size_t i = 0; i < h.size(); i++) out[i] = llmt::bf16_to_f32(h[i]);
  }
  return out;
}

}  // namespace llmt_test
