// The CPU's choice of bf16 matmul kernel (kernels/cpu/bf16_matmul_choice.h): the shape classes, the
// forced modes, the cache file (written, read back, ignored with a note when corrupt or foreign),
// and both kernels against the double reference within the bf16 op limit on the op suite's shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "engine/core/tensor.h"
#include "kernels/cpu/bf16_matmul_choice.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/reference_ops.h"
#include "tests/test_util.h"
#include "tests/tolerances.h"

namespace {

using llmt::Bf16Kernel;
using llmt::Bf16MatmulChoice;
using llmt::DType;
using llmt::MatmulShape;
using llmt::Tensor;

// GPT-2 124M at batch 4 x 64 tokens: the forward's a x b^T, dX's a x b and dW's a^T x b (+=, fp32)
TEST(Bf16MatmulChoice, ShapeClassesOfAGpt2Step) {
  EXPECT_EQ(llmt::matmul_shape_class({256, 2304, 768, false, true, false, DType::bf16}), "NT s.m.m");
  EXPECT_EQ(llmt::matmul_shape_class({256, 50257, 768, false, true, false, DType::bf16}), "NT s.l.m");
  EXPECT_EQ(llmt::matmul_shape_class({256, 768, 50257, false, false, false, DType::bf16}), "NN s.m.l");
  EXPECT_EQ(llmt::matmul_shape_class({2304, 768, 256, true, false, true, DType::f32}), "TN+= m.m.s ->f32");
  MatmulShape p = llmt::matmul_class_probe({256, 50257, 3072, false, true, false, DType::bf16});
  EXPECT_EQ(p.M, 256);
  EXPECT_EQ(p.N, 4096);
  EXPECT_EQ(p.K, 1024);
  EXPECT_EQ(llmt::matmul_shape_class(p), "NT s.l.m");  // a probe stays in its class
}

// A stand-in for the two kernels: each call of `slow` takes a few ms more than the other.
Bf16MatmulChoice::RunOnce fake_run(Bf16Kernel slow, int* calls) {
  return [slow, calls](Bf16Kernel k, Tensor, Tensor, Tensor, const MatmulShape&) {
    ++*calls;
    if (k == slow) std::this_thread::sleep_for(std::chrono::milliseconds(4));
  };
}

const MatmulShape kShape{256, 768, 768, false, true, false, DType::bf16};
const std::string kKey = "a test CPU | oneDNN 0.0.0 | 2 threads";

double rel_err(const std::vector<double>& got, const std::vector<double>& want) {  // max |got - want| / max |want|
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); i++) {
    num = std::max(num, std::fabs(got[i] - want[i]));
    den = std::max(den, std::fabs(want[i]));
  }
  return num / den;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Bf16MatmulChoice, ForcedModesNeverMeasure) {
  llmt_test::TempDir dir("bf16choice");
  for (const char* mode : {"bf16", "fp32"}) {
    Bf16MatmulChoice c(mode, dir.path, kKey);
    int calls = 0;
    EXPECT_EQ(llmt::bf16_kernel_name(c.pick(kShape, fake_run(Bf16Kernel::bf16, &calls))), std::string(mode));
    EXPECT_EQ(calls, 0);
    EXPECT_EQ(c.choices().at("NT s.m.m").source, std::string("forced by LLMT_CPU_BF16_MATMUL=") + mode);
    EXPECT_FALSE(std::ifstream(c.cache_path()).good());  // nothing cached
  }
  setenv("LLMT_CPU_BF16_MATMUL", "fast", 1);
  llmt_test::expect_error([] { llmt::bf16_matmul_mode_from_env(); }, {"LLMT_CPU_BF16_MATMUL=fast", "auto", "bf16",
                                                                     "fp32"});
  setenv("LLMT_CPU_BF16_MATMUL", "fp32", 1);
  EXPECT_EQ(llmt::bf16_matmul_mode_from_env(), "fp32");
  unsetenv("LLMT_CPU_BF16_MATMUL");
  EXPECT_EQ(llmt::bf16_matmul_mode_from_env(), "auto");
}

TEST(Bf16MatmulChoice, AutoPicksTheFasterAndCachesIt) {
  llmt_test::TempDir dir("bf16choice");
  for (Bf16Kernel slow : {Bf16Kernel::bf16, Bf16Kernel::fp32}) {
    const std::string sub = dir.path + "/" + llmt::bf16_kernel_name(slow);
    const Bf16Kernel fast = slow == Bf16Kernel::bf16 ? Bf16Kernel::fp32 : Bf16Kernel::bf16;
    int calls = 0;
    {
      Bf16MatmulChoice c("auto", sub, kKey);
      EXPECT_EQ(c.pick(kShape, fake_run(slow, &calls)), fast);
      EXPECT_GE(calls, 4);  // a warm-up and at least one timed call each
      const int measured = calls;
      EXPECT_EQ(c.pick(kShape, fake_run(slow, &calls)), fast);  // the class is known now
      EXPECT_EQ(calls, measured);
      EXPECT_EQ(c.choices().at("NT s.m.m").source, "measured");
      EXPECT_TRUE(c.notes().empty());
    }
    // a later run reads the file and measures nothing, even with the other kernel slow now
    calls = 0;
    Bf16MatmulChoice again("auto", sub, kKey);
    EXPECT_EQ(again.pick(kShape, fake_run(fast, &calls)), fast);
    EXPECT_EQ(calls, 0);
    EXPECT_EQ(again.choices().at("NT s.m.m").source, "cache");
    EXPECT_TRUE(again.notes().empty());
    // a new class is measured and added beside the cached one
    MatmulShape dw{768, 768, 256, true, false, true, DType::f32};
    again.pick(dw, fake_run(fast, &calls));
    EXPECT_GT(calls, 0);
    const std::string text = read_all(again.cache_path());
    EXPECT_NE(text.find("NT s.m.m\t"), std::string::npos) << text;
    EXPECT_NE(text.find("TN+= m.m.s ->f32\t"), std::string::npos) << text;
    // both cached classes, when they run, are what the process reports
    llmt::clear_cpu_bf16_matmul_choices();
    calls = 0;
    Bf16MatmulChoice third("auto", sub, kKey);
    third.pick(kShape, fake_run(fast, &calls));
    third.pick(dw, fake_run(fast, &calls));
    EXPECT_EQ(calls, 0);
    std::vector<llmt::Bf16ClassChoice> ran = llmt::cpu_bf16_matmul_choices();
    ASSERT_EQ(ran.size(), 2u);
    for (const auto& c : ran) EXPECT_EQ(c.source, "cache") << c.shape_class;
  }
}

// A file that does not parse, or that holds another CPU's timings, is ignored with a note, the class
// measured again, and the file rewritten.
TEST(Bf16MatmulChoice, CorruptOrForeignCacheIsIgnoredWithANote) {
  llmt_test::TempDir dir("bf16choice");
  const std::string path = Bf16MatmulChoice("auto", dir.path, kKey).cache_path();
  const std::string good = "llmt cpu bf16 matmul choices v1\nkey " + kKey + "\n";
  struct Bad {
    std::string text, says;
  };
  for (const Bad& bad : {Bad{"\x7f" "ELF garbage\n", "first line"},
                         Bad{"llmt cpu bf16 matmul choices v1\nkey another CPU | oneDNN 0.0.0 | 2 threads\n"
                             "NT s.m.m\tfp32\t1.0\t2.0\n", "another CPU"},
                         Bad{good + "NT s.m.m\tbf16\t1.0\n", "line 3"},
                         Bad{good + "NT s.m.m\tfast\t1.0\t2.0\n", "line 3"},
                         Bad{good + "NT s.m.m\tbf16\t1.0\tx2\n", "line 3"}}) {
    SCOPED_TRACE(bad.text);
    { std::ofstream(path) << bad.text; }
    Bf16MatmulChoice c("auto", dir.path, kKey);
    int calls = 0;
    // the bad files say bf16 or fp32; the measurement (bf16 slow) must decide
    EXPECT_EQ(c.pick(kShape, fake_run(Bf16Kernel::bf16, &calls)), Bf16Kernel::fp32);
    EXPECT_GT(calls, 0);
    ASSERT_EQ(c.notes().size(), 1u);
    EXPECT_NE(c.notes()[0].find("ignoring " + path), std::string::npos) << c.notes()[0];
    EXPECT_NE(c.notes()[0].find(bad.says), std::string::npos) << c.notes()[0];
    EXPECT_EQ(read_all(path).rfind(good, 0), 0u) << read_all(path);  // rewritten with this key
  }
}

TEST(Bf16MatmulChoice, UnwritableCacheDirIsANoteNotAnError) {
  Bf16MatmulChoice c("auto", "/proc/llmt_no_such_dir", kKey);
  int calls = 0;
  EXPECT_EQ(c.pick(kShape, fake_run(Bf16Kernel::fp32, &calls)), Bf16Kernel::bf16);
  ASSERT_EQ(c.notes().size(), 1u);
  EXPECT_NE(c.notes()[0].find("cannot write"), std::string::npos) << c.notes()[0];
}

// Both kernels, forced, on the op suite's matmul cases (every transposition, bias, accumulation,
// bf16 and fp32 outputs), against the double reference within the bf16 op limit; the backend
// reports the kernel it ran.
TEST(Bf16MatmulChoice, BothKernelsWithinTheBf16Limit) {
  struct MM {
    int64_t M, N, K;
  };
  for (const char* mode : {"bf16", "fp32"}) {
    SCOPED_TRACE(mode);
    setenv("LLMT_CPU_BF16_MATMUL", mode, 1);
    auto be = llmt::make_cpu_backend(2, DType::bf16);
    unsetenv("LLMT_CPU_BF16_MATMUL");
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    auto draw = [&](size_t n, float lo, bool f32) {  // values bf16 holds exactly (f32 outputs: any)
      std::vector<float> v(n);
      for (auto& x : v) x = f32 ? lo + d(rng) / 2 : llmt::bf16_to_f32(llmt::f32_to_bf16(lo + d(rng) / 2));
      return v;
    };
    auto bits = [](const std::vector<float>& v) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); i++) h[i] = llmt::f32_to_bf16(v[i]);
      return h;
    };
    for (MM s : {MM{7, 5, 9}, MM{33, 17, 65}, MM{1, 13, 3}})
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          for (int hb = 0; hb < 2; hb++)
            for (int acc = 0; acc < 2; acc++)
              for (int f32_out = 0; f32_out < 2; f32_out++) {
                if (f32_out && hb) continue;
                SCOPED_TRACE(::testing::Message() << "M=" << s.M << " N=" << s.N << " K=" << s.K << " ta=" << ta
                                                  << " tb=" << tb << " bias=" << hb << " acc=" << acc
                                                  << " f32_out=" << f32_out);
                std::vector<float> a = draw(s.M * s.K, 0, false), b = draw(s.K * s.N, 0, false),
                                   bias = draw(s.N, 0, false), pre = draw(s.M * s.N, 2.5f, f32_out);
                std::vector<uint16_t> ha = bits(a), hb16 = bits(b), hbias = bits(bias), hout = bits(pre);
                std::vector<float> fout = pre;
                Tensor out = f32_out ? Tensor(fout.data(), DType::f32, {s.M, s.N})
                                     : Tensor(hout.data(), DType::bf16, {s.M, s.N});
                be->matmul(out, Tensor(ha.data(), DType::bf16, {s.M * s.K}),
                           Tensor(hb16.data(), DType::bf16, {s.K * s.N}),
                           hb ? Tensor(hbias.data(), DType::bf16, {s.N}) : Tensor(nullptr, DType::bf16, {s.N}), s.M,
                           s.N, s.K, ta, tb, acc);
                std::vector<double> want(pre.begin(), pre.end()), bd(bias.begin(), bias.end());
                llmt_ref::matmul(want, std::vector<double>(a.begin(), a.end()),
                                 std::vector<double>(b.begin(), b.end()), hb ? &bd : nullptr, s.M, s.N, s.K, ta, tb,
                                 acc);
                std::vector<double> got(want.size());
                for (size_t i = 0; i < got.size(); i++)
                  got[i] = f32_out ? fout[i] : llmt::bf16_to_f32(hout[i]);
                EXPECT_LE(rel_err(got, want), llmt_test::tol::kBf16OpForward);
              }
    // (where oneDNN has no bf16 kernel, as under DNNL_MAX_CPU_ISA=AVX2, every class is widened)
    for (const llmt::Bf16ClassChoice& c : llmt::cpu_bf16_matmul_choices()) {
      const bool no_kernel = c.source == "oneDNN has no bf16 matmul on this CPU";
      EXPECT_EQ(llmt::bf16_kernel_name(c.kernel), std::string(no_kernel ? "fp32" : mode)) << c.shape_class;
      if (!no_kernel) {
        EXPECT_EQ(c.source, std::string("forced by LLMT_CPU_BF16_MATMUL=") + mode);
      }
    }
    EXPECT_NE(llmt::describe_cpu_bf16_matmul_choices().find("NT s.s.s: "), std::string::npos)
        << llmt::describe_cpu_bf16_matmul_choices();
  }
}

}  // namespace
