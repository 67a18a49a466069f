// The tolerance table of docs/design.md ("Numerics and tolerances"), in one place: every numeric
// test reads its limits from here, and each limit says what it compares and why it is that size.
//
// Errors are relative to the reference tensor's largest magnitude (rel = max|got - want| / max|want|)
// unless a bound says otherwise. u is a format's unit roundoff: 2^-24 for fp32, 2^-8 for bf16 (8
// significant bits, round to nearest even).
//
// Bitwise equality is asserted only where the reduction order is fixed by construction: the same
// world size, strategy, thread count and batch split (e.g. a resumed run against an unbroken one).
// Everything else is compared within these bounds, which hold for any matmul kernel set (oneDNN's
// AVX2, AVX-512 and AVX512-BF16 code paths, DNNL_MAX_CPU_ISA): the fp32 limits are at least 10x what
// was measured on each, the bf16 ones at least 3x (they sit a few roundings above one rounding).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace llmt_test::tol {

constexpr double kUnitF32 = 0x1p-24;
constexpr double kUnitBf16 = 0x1p-8;

// ---- one op of a backend against a double-precision plain-loop reference ----
// fp32 forward: reductions of at most ~65 terms and transcendental functions accurate to a few ulp
// land near 1e-7..1e-6; an indexing or formula slip lands far above 1e-3.
constexpr double kF32OpForward = 1e-5;
// fp32 backward against double central differences (FD error ~eps^2 + 1e-10, far below fp32 roundoff),
// with the fp32 statistics saved by the backend's own forward feeding the backward.
constexpr double kF32OpBackward = 1e-4;

// bf16 (inputs exactly representable in bf16, fp32 arithmetic inside, results rounded to bf16 once
// per store): one rounding moves an element by at most u/2 = 2e-3 of itself; ops that store an
// intermediate in bf16 and read it back (attention's output feeding its backward, accumulating
// outputs, in-place rotations) take two to four. Measured: 3.4e-3 at most, forward and backward;
// the limits allow five and ten roundings (an indexing slip is O(1)).
constexpr double kBf16OpForward = 1e-2;
constexpr double kBf16OpBackward = 2e-2;

// ---- fp32 against fp32 computed another way (Hugging Face transformers, another rank split) ----
// Sums of at most a few hundred terms, grouped differently: each differs by ~sqrt(K) u per sum, a
// few 1e-7 after two layers (measured: logits 1e-6 at most).
constexpr double kF32Logits = 1e-5;
constexpr double kF32Loss = 1e-5;
// Backward goes through the softmax and norm Jacobians, whose cancellations lift the relative error
// of small entries (measured: 2e-5 at most, GPT-2's attention weights).
constexpr double kF32Grad = 1e-4;
// The same model split over ranks, micro-batches or checkpointed blocks: only the order in which
// gradient pieces are added differs (reduce-scatter, accumulation). Measured: 2e-6.
constexpr double kF32ReorderGrad = 1e-5;

// ---- bf16 (llmt's --bf16) against transformers under torch.autocast(bfloat16) ----
// Two different bf16 computations of the same model: each is a few bf16 roundings (u = 3.9e-3) from
// the exact result, not in the same places (llmt's residual stream is bf16, autocast's fp32;
// autocast's eager attention rounds scores and probabilities to bf16, llmt's keeps them in fp32), so
// they differ by up to about twice that. Measured on the tiny fixtures: logits 1.1e-2 (3u), the
// loss 1.7e-3 relative (after two steps; 3e-4 before any), gradients 2.2e-2 (6u).
constexpr double kBf16ModelLogits = 3e-2;
constexpr double kBf16ModelLoss = 5e-3;
constexpr double kBf16ModelGrad = 6e-2;
// llmt's bf16 distance from the fp32 reference at most this many times autocast's own, plus one
// rounding (measured: 2.1x at most, the final norm's weight gradient of GPT-2).
constexpr double kBf16VsAutocast = 3.0;

// ---- mixture of experts in bf16 against autocast (tests/models/test_moe.cpp) ----
// An expert's weight gradient sums only the tokens routed to it (6 to 13 rows in the fixtures, the
// dense fixtures' weights 26), so each row's roundings stay in the sum undiluted: autocast's own
// distance from fp32 reaches 2.3e-2 there, llmt's 7.2e-2 and 4.2x autocast's (llmt's residual stream
// and its gradient are bf16, autocast's fp32: about two roundings on a row's path where autocast has
// one, forward and backward; the other tensors of the MoE fixtures measure 2.5x at most). Every MoE
// fixture's gradients are held to these in place of kBf16ModelGrad and kBf16VsAutocast; fp32 keeps
// kF32Grad (measured 4e-6).
constexpr double kBf16MoeGrad = 0.15;
constexpr double kBf16VsAutocastMoe = 6.0;

// ---- bf16 against bf16 computed another way (another rank split) ----
// Each rank's rows are computed alike whatever the split; what differs is the reduction: in f32
// only its order (as kF32ReorderGrad), in bf16 (--mixed_precision_reduce bfloat16) every rank's
// contribution rounded to bf16 and every partial sum rounded again, log2(W) + 1 roundings of u/2.
// Measured at 1-4 ranks: losses 2.5e-5 apart (1e-15 with an f32 reduction).
constexpr double kBf16ReorderLoss = 5e-4;
constexpr double kBf16ReorderGrad = 2e-2;

// ---- parameters after AdamW steps ----
// Adam's step lr * m / (sqrt(v) + eps) does not depend on the gradient's scale, only on its
// direction and history: a gradient element known to a relative accuracy e = grad_err / |g| moves
// the step by at most ~2e * lr (first order; m and v each carry e), and by up to 2.1 * lr once e ~ 1,
// where even the sign is rounding noise (GPT-2's key bias has an exact gradient of zero; by
// Cauchy-Schwarz one of Adam's first steps moves an element by at most 1.002 lr). So each
// element is bounded by its own gradient's accuracy, summed over the steps, with a factor of 4 for
// the gradients of later steps, which the reference records only for the first, plus the rounding
// of the weights themselves.
//   g: the reference gradient of this element (first step); grad_err: the absolute gradient error
//   bound (the tensor's gradient tolerance times its largest gradient); w: the reference weight.
inline double adam_param_bound(double w, double g, double grad_err, double lr, int steps, double unit = kUnitF32) {
  double e = grad_err / std::max(std::fabs(g), 1e-30);
  return steps * lr * std::min(2.1, 4.0 * 2.0 * e) + 16.0 * unit * std::fabs(w) + 1e-12;
}

// Compares weights after `steps` AdamW steps element by element with adam_param_bound; returns ""
// when every element is within its bound, else the worst element and its bound.
inline std::string check_adam_params(const float* got, const float* want, const float* grad0, int64_t n,
                                     double grad_tol, double lr, int steps, double unit = kUnitF32,
                                     double* worst_ratio = nullptr) {
  double gmax = 0.0;
  for (int64_t i = 0; i < n; i++) gmax = std::max(gmax, (double)std::fabs(grad0[i]));
  double worst = 0.0;
  int64_t wi = -1;
  for (int64_t i = 0; i < n; i++) {
    double d = std::fabs((double)got[i] - (double)want[i]);
    double b = adam_param_bound(want[i], grad0[i], grad_tol * gmax, lr, steps, unit);
    double r = d / b;
    if (!(r <= worst)) worst = r, wi = i;  // NaN counts as worst
  }
  if (worst_ratio) *worst_ratio = worst;
  if (worst <= 1.0) return "";
  return "element " + std::to_string(wi) + ": got " + std::to_string(got[wi]) + ", want " + std::to_string(want[wi]) +
         " (gradient " + std::to_string(grad0[wi]) + " of max " + std::to_string(gmax) + "), off by " +
         std::to_string(worst) + "x its bound";
}

}  // namespace llmt_test::tol
