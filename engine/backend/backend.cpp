// The Backend's op entries: each checks its arguments once, for every backend, against the
// conventions in backend.h, then counts the op, times it when op profiling is on, and calls the
// backend's implementation. Messages name the backend, the op, the argument and what was expected:
//   cpu matmul: a is f32, the backend computes in bf16
//   cuda layernorm_forward: x holds 12 elements ([3, 4]), needs 20 (N * C)
#include "engine/backend/backend.h"

#include <chrono>

#include "engine/core/error.h"

namespace llmt {

namespace {

// value >= lo, else an error naming the size
void need_size(const Backend& be, const char* op, const char* what, int64_t value, int64_t lo) {
  LLMT_CHECK(value >= lo, "%s %s: %s = %lld, expected at least %lld", be.name().c_str(), op, what, (long long)value,
             (long long)lo);
}

}  // namespace

template <class F>
void Backend::run(const char* category, F&& f) {
  counters_.ops++;
  if (!profiling_) return f();
  synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  f();
  synchronize();
  op_ms_[category] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// t holds at least n elements, with data when n > 0.
void Backend::need_elems(const char* op, const char* arg, const Tensor& t, int64_t n) const {
  if (n <= 0) return;
  LLMT_CHECK(t.data != nullptr, "%s %s: %s has no data, needs %lld elements", name().c_str(), op, arg, (long long)n);
  LLMT_CHECK(t.numel() >= n, "%s %s: %s holds %lld elements (%s), needs %lld", name().c_str(), op, arg,
             (long long)t.numel(), t.shape_str().c_str(), (long long)n);
}
// t is in the compute dtype and holds n elements
void Backend::need_act(const char* op, const char* arg, const Tensor& t, int64_t n) const {
  LLMT_CHECK(t.dtype == compute_dtype(), "%s %s: %s is %s, the backend computes in %s", name().c_str(), op, arg,
             dtype_name(t.dtype), dtype_name(compute_dtype()));
  need_elems(op, arg, t, n);
}
// t is `dtype` (f32 gradients and statistics, f64 scalars, i32 ids) and holds n elements
void Backend::need(const char* op, const char* arg, const Tensor& t, DType dtype, int64_t n) const {
  LLMT_CHECK(t.dtype == dtype, "%s %s: %s is %s, expected %s", name().c_str(), op, arg, dtype_name(t.dtype),
             dtype_name(dtype));
  need_elems(op, arg, t, n);
}
// t is f32 or bf16 and holds n elements
void Backend::need_float(const char* op, const char* arg, const Tensor& t, int64_t n) const {
  LLMT_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16, "%s %s: %s is %s, expected f32 or bf16",
             name().c_str(), op, arg, dtype_name(t.dtype));
  need_elems(op, arg, t, n);
}

// ---- memory ----

void Backend::zero(void* p, size_t bytes) {
  LLMT_CHECK(p != nullptr || bytes == 0, "%s zero: no memory given for %zu bytes", name().c_str(), bytes);
  run("gradient zeroing", [&] { zero_impl(p, bytes); });
}
void Backend::copy(void* dst, const void* src, size_t bytes) {
  LLMT_CHECK((dst != nullptr && src != nullptr) || bytes == 0, "%s copy: no memory given for %zu bytes",
             name().c_str(), bytes);
  run("copies", [&] { copy_impl(dst, src, bytes); });
}

// ---- dense ----

void Backend::matmul(Tensor out, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K, bool trans_a,
                     bool trans_b, bool accumulate, int64_t ld_a, int64_t ld_out) {
  const char* op = "matmul";
  LLMT_CHECK(a.dtype == compute_dtype(), "%s matmul: a is %s, the backend computes in %s", name().c_str(),
             dtype_name(a.dtype), dtype_name(compute_dtype()));
  LLMT_CHECK(b.dtype == compute_dtype(), "%s matmul: b is %s, the backend computes in %s", name().c_str(),
             dtype_name(b.dtype), dtype_name(compute_dtype()));
  LLMT_CHECK(out.dtype == compute_dtype() || out.dtype == DType::f32, "%s matmul: out is %s, expected %s or f32",
             name().c_str(), dtype_name(out.dtype), dtype_name(compute_dtype()));
  LLMT_CHECK(!bias.data || bias.dtype == b.dtype, "%s matmul: bias is %s, b is %s", name().c_str(),
             dtype_name(bias.dtype), dtype_name(b.dtype));
  LLMT_CHECK(M >= 0 && N >= 0 && K >= 0, "%s matmul: bad shape %lld x %lld x %lld", name().c_str(), (long long)M,
             (long long)N, (long long)K);
  if (M == 0 || N == 0) return;
  LLMT_CHECK(K > 0, "%s matmul: bad shape %lld x %lld x %lld", name().c_str(), (long long)M, (long long)N,
             (long long)K);
  const int64_t a_rows = trans_a ? K : M, a_cols = trans_a ? M : K;
  if (ld_a == 0) ld_a = a_cols;
  if (ld_out == 0) ld_out = N;
  LLMT_CHECK(ld_a >= a_cols && ld_out >= N, "%s matmul: row strides ld_a = %lld and ld_out = %lld, expected at least "
             "%lld and %lld", name().c_str(), (long long)ld_a, (long long)ld_out, (long long)a_cols, (long long)N);
  need_elems(op, "a", a, (a_rows - 1) * ld_a + a_cols);
  need_elems(op, "b", b, K * N);
  need_elems(op, "out", out, (M - 1) * ld_out + N);
  if (bias.data) need_elems(op, "bias", bias, N);
  run("matmul", [&] { matmul_impl(out, a, b, bias, M, N, K, trans_a, trans_b, accumulate, ld_a, ld_out); });
}

void Backend::bias_backward(Tensor dbias, Tensor dout, int64_t M, int64_t N) {
  const char* op = "bias_backward";
  need_size(*this, op, "M", M, 0);
  need_size(*this, op, "N", N, 0);
  need(op, "dbias", dbias, DType::f32, N);
  need_act(op, "dout", dout, M * N);
  run("matmul", [&] { bias_backward_impl(dbias, dout, M, N); });
}

void Backend::matmul_residual(Tensor out, Tensor residual, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N,
                              int64_t K) {
  const char* op = "matmul_residual";
  need_size(*this, op, "M", M, 0);
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "K", K, 1);
  need_act(op, "out", out, M * N);
  need_act(op, "residual", residual, M * N);
  need_act(op, "a", a, M * K);
  need_act(op, "b", b, N * K);
  if (bias.data) need_act(op, "bias", bias, N);
  const uintptr_t bytes = (uintptr_t)(M * N) * dtype_size(out.dtype), o = (uintptr_t)out.data,
                  r = (uintptr_t)residual.data;
  LLMT_CHECK(M * N == 0 || o + bytes <= r || r + bytes <= o, "%s %s: out and residual overlap", name().c_str(), op);
  if (M == 0 || N == 0) return;
  run("matmul", [&] { matmul_residual_impl(out, residual, a, b, bias, M, N, K); });
}

void Backend::matmul_gelu(Tensor out, Tensor pre, Tensor a, Tensor b, Tensor bias, int64_t M, int64_t N, int64_t K) {
  const char* op = "matmul_gelu";
  need_size(*this, op, "M", M, 0);
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "K", K, 1);
  need_act(op, "out", out, M * N);
  need_act(op, "pre", pre, M * N);
  need_act(op, "a", a, M * K);
  need_act(op, "b", b, N * K);
  if (bias.data) need_act(op, "bias", bias, N);
  if (M == 0 || N == 0) return;
  run("matmul", [&] { matmul_gelu_impl(out, pre, a, b, bias, M, N, K); });
}

void Backend::matmul_dgelu(Tensor dpre, Tensor dout, Tensor b, Tensor pre, int64_t M, int64_t N, int64_t K) {
  const char* op = "matmul_dgelu";
  need_size(*this, op, "M", M, 0);
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "K", K, 1);
  need_act(op, "dpre", dpre, M * N);
  need_act(op, "dout", dout, M * K);
  need_act(op, "b", b, K * N);
  need_act(op, "pre", pre, M * N);
  if (M == 0 || N == 0) return;
  run("matmul", [&] { matmul_dgelu_impl(dpre, dout, b, pre, M, N, K); });
}

// ---- embeddings ----

void Backend::embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe, int B, int T, int C, int V) {
  const char* op = "embedding_forward";
  need_size(*this, op, "B", B, 1);
  need_size(*this, op, "T", T, 1);
  need_size(*this, op, "C", C, 1);
  need_size(*this, op, "V", V, 1);
  const int64_t BT = (int64_t)B * T;
  need_act(op, "out", out, BT * C);
  need(op, "tokens", tokens, DType::i32, BT);
  need_act(op, "wte", wte, (int64_t)V * C);
  if (wpe.data) need_act(op, "wpe", wpe, (int64_t)T * C);
  run("embedding", [&] { embedding_forward_impl(out, tokens, wte, wpe, B, T, C, V); });
}

void Backend::embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens, int B, int T, int C) {
  const char* op = "embedding_backward";
  need_size(*this, op, "B", B, 1);
  need_size(*this, op, "T", T, 1);
  need_size(*this, op, "C", C, 1);
  const int64_t BT = (int64_t)B * T;
  LLMT_CHECK(dwte.ndim == 2 && dwte.shape[1] == C && dwte.shape[0] > 0,
             "%s embedding_backward: dwte is %s, expected [V, %d]", name().c_str(), dwte.shape_str().c_str(), C);
  need(op, "dwte", dwte, DType::f32, dwte.numel());
  if (dwpe.data) need(op, "dwpe", dwpe, DType::f32, (int64_t)T * C);
  need_act(op, "dout", dout, BT * C);
  need(op, "tokens", tokens, DType::i32, BT);
  run("embedding", [&] { embedding_backward_impl(dwte, dwpe, dout, tokens, B, T, C); });
}

// ---- norms ----

void Backend::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor w, Tensor b, int64_t N, int C,
                                float eps) {
  const char* op = "layernorm_forward";
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "C", C, 1);
  need_act(op, "out", out, N * C);
  need_act(op, "x", x, N * C);
  need_act(op, "w", w, C);
  need_act(op, "b", b, C);
  need(op, "mean", mean, DType::f32, N);
  need(op, "rstd", rstd, DType::f32, N);
  run("norms", [&] { layernorm_forward_impl(out, mean, rstd, x, w, b, N, C, eps); });
}

void Backend::layernorm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dout, Tensor x, Tensor w, Tensor mean,
                                 Tensor rstd, int64_t N, int C) {
  const char* op = "layernorm_backward";
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "C", C, 1);
  need_act(op, "dx", dx, N * C);
  need_act(op, "dout", dout, N * C);
  need_act(op, "x", x, N * C);
  need_act(op, "w", w, C);
  need(op, "dw", dw, DType::f32, C);
  need(op, "db", db, DType::f32, C);
  need(op, "mean", mean, DType::f32, N);
  need(op, "rstd", rstd, DType::f32, N);
  run("norms", [&] { layernorm_backward_impl(dx, dw, db, dout, x, w, mean, rstd, N, C); });
}

void Backend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int64_t N, int C, float eps,
                              float w_offset) {
  const char* op = "rmsnorm_forward";
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "C", C, 1);
  need_act(op, "out", out, N * C);
  need_act(op, "x", x, N * C);
  need_act(op, "w", w, C);
  need(op, "rstd", rstd, DType::f32, N);
  run("norms", [&] { rmsnorm_forward_impl(out, rstd, x, w, N, C, eps, w_offset); });
}

void Backend::rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int64_t N, int C,
                               float w_offset) {
  const char* op = "rmsnorm_backward";
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "C", C, 1);
  need_act(op, "dx", dx, N * C);
  need_act(op, "dout", dout, N * C);
  need_act(op, "x", x, N * C);
  need_act(op, "w", w, C);
  need(op, "dw", dw, DType::f32, C);
  need(op, "rstd", rstd, DType::f32, N);
  run("norms", [&] { rmsnorm_backward_impl(dx, dw, dout, x, w, rstd, N, C, w_offset); });
}

void Backend::head_rmsnorm_forward(Tensor out, Tensor rstd, Tensor in, Tensor wq, Tensor wk, int64_t N, int NH,
                                   int NKV, int hs, float eps, float w_offset) {
  const char* op = "head_rmsnorm_forward";
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "NH", NH, 1);
  need_size(*this, op, "NKV", NKV, 1);
  need_size(*this, op, "hs", hs, 1);
  const int64_t row = (int64_t)(NH + 2 * NKV) * hs;
  need_act(op, "out", out, N * row);
  need_act(op, "in", in, N * row);
  need_act(op, "wq", wq, hs);
  need_act(op, "wk", wk, hs);
  need(op, "rstd", rstd, DType::f32, N * (NH + NKV));
  LLMT_CHECK(out.data != in.data, "%s %s: out must not be in (it keeps the input for backward)", name().c_str(), op);
  run("norms", [&] { head_rmsnorm_forward_impl(out, rstd, in, wq, wk, N, NH, NKV, hs, eps, w_offset); });
}

void Backend::head_rmsnorm_backward(Tensor din, Tensor dwq, Tensor dwk, Tensor dout, Tensor in, Tensor wq, Tensor wk,
                                    Tensor rstd, int64_t N, int NH, int NKV, int hs, float w_offset) {
  const char* op = "head_rmsnorm_backward";
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "NH", NH, 1);
  need_size(*this, op, "NKV", NKV, 1);
  need_size(*this, op, "hs", hs, 1);
  const int64_t row = (int64_t)(NH + 2 * NKV) * hs;
  need_act(op, "din", din, N * row);
  need_act(op, "dout", dout, N * row);
  need_act(op, "in", in, N * row);
  need_act(op, "wq", wq, hs);
  need_act(op, "wk", wk, hs);
  need(op, "dwq", dwq, DType::f32, hs);
  need(op, "dwk", dwk, DType::f32, hs);
  need(op, "rstd", rstd, DType::f32, N * (NH + NKV));
  run("norms", [&] { head_rmsnorm_backward_impl(din, dwq, dwk, dout, in, wq, wk, rstd, N, NH, NKV, hs, w_offset); });
}

// ---- activations ----

void Backend::gelu_forward(Tensor out, Tensor x, int64_t n) {
  const char* op = "gelu_forward";
  need_size(*this, op, "n", n, 0);
  need_act(op, "out", out, n);
  need_act(op, "x", x, n);
  run("activations", [&] { gelu_forward_impl(out, x, n); });
}

void Backend::gelu_backward(Tensor dx, Tensor x, Tensor dout, int64_t n) {
  const char* op = "gelu_backward";
  need_size(*this, op, "n", n, 0);
  need_act(op, "dx", dx, n);
  need_act(op, "x", x, n);
  need_act(op, "dout", dout, n);
  run("activations", [&] { gelu_backward_impl(dx, x, dout, n); });
}

void Backend::swiglu_forward(Tensor out, Tensor gate_up, int64_t N, int I, GluAct act) {
  const char* op = "swiglu_forward";
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "I", I, 1);
  need_act(op, "out", out, N * I);
  need_act(op, "gate_up", gate_up, N * 2 * I);
  run("activations", [&] { swiglu_forward_impl(out, gate_up, N, I, act); });
}

void Backend::swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up, int64_t N, int I, GluAct act) {
  const char* op = "swiglu_backward";
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "I", I, 1);
  need_act(op, "dgate_up", dgate_up, N * 2 * I);
  need_act(op, "dout", dout, N * I);
  need_act(op, "gate_up", gate_up, N * 2 * I);
  run("activations", [&] { swiglu_backward_impl(dgate_up, dout, gate_up, N, I, act); });
}

void Backend::dropout(Tensor x, int B, int T, int C, const Dropout& d) {
  const char* op = "dropout";
  LLMT_CHECK(d.p >= 0.0f && d.p < 1.0f, "%s dropout: p = %g, expected 0 <= p < 1", name().c_str(), d.p);
  need_size(*this, op, "B", B, 0);
  need_size(*this, op, "T", T, 0);
  need_size(*this, op, "C", C, 0);
  need_act(op, "x", x, (int64_t)B * T * C);
  if (!d.active()) return;  // p = 0: nothing to do, and nothing counted
  run("activations", [&] { dropout_impl(x, B, T, C, d); });
}

// ---- attention ----

namespace {

// B, T, NH, NKV, hs in range for rope and attention: heads group evenly, hs even (RoPE's halves)
void need_heads(const Backend& be, const char* op, int B, int T, int NH, int NKV, int hs) {
  need_size(be, op, "B", B, 1);
  need_size(be, op, "T", T, 1);
  need_size(be, op, "hs", hs, 1);
  LLMT_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0, "%s %s: %d heads do not group over %d kv heads (NH %% NKV != 0)",
             be.name().c_str(), op, NH, NKV);
}

// a packed batch's document count in range: at least one document a row, at most one a token
void need_doc_count(const Backend& be, const char* op, const PackedDocs& docs, int B, int T) {
  if (!docs.active()) {
    LLMT_CHECK(docs.count == 0, "%s %s: %lld documents but no doc_start", be.name().c_str(), op,
               (long long)docs.count);
    return;
  }
  LLMT_CHECK(docs.count >= B && docs.count <= (int64_t)B * T,
             "%s %s: %lld packed documents in %d rows of %d tokens, expected %d to %lld", be.name().c_str(), op,
             (long long)docs.count, B, T, B, (long long)B * T);
}

// a sliding window of 0 (none) or more keys
// The spec's rotated channels: even, within the head, and (longrope) one factor for each pair.
void need_rope(const Backend& be, const char* op, const RopeSpec& r, int hs) {
  const int d = rope_dim(r, hs);
  LLMT_CHECK(r.rotary_dim >= 0 && d <= hs && d % 2 == 0 && d > 0, "%s %s: rotary_dim %d for a head of %d, expected an "
             "even count of at most the head size (0: all)", be.name().c_str(), op, r.rotary_dim, hs);
  LLMT_CHECK(r.scaling != RopeSpec::longrope || d / 2 <= RopeSpec::kMaxFactors, "%s %s: longrope over %d channels "
             "needs %d factors, at most %d are held", be.name().c_str(), op, d, d / 2, RopeSpec::kMaxFactors);
}
void need_window(const Backend& be, const char* op, int window) {
  LLMT_CHECK(window >= 0, "%s %s: sliding window of %d keys, expected 0 (none) or more", be.name().c_str(), op,
             window);
}

// The scores' scale and soft cap: finite, >= 0 (0: the default); the scale resolved for the backend.
AttnScores checked_scores(const Backend& be, const char* op, const AttnScores& s, int hs) {
  LLMT_CHECK(std::isfinite(s.scale) && s.scale >= 0.0f, "%s %s: attention scale %g, expected > 0 (or 0: 1/sqrt(%d))",
             be.name().c_str(), op, s.scale, hs);
  LLMT_CHECK(std::isfinite(s.softcap) && s.softcap >= 0.0f,
             "%s %s: attention soft cap %g, expected > 0 (or 0: none)", be.name().c_str(), op, s.softcap);
  AttnScores r = s;
  r.scale = s.scale_for(hs);
  return r;
}

}  // namespace

void Backend::rope_forward(Tensor qkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                           Tensor positions) {
  const char* op = "rope_forward";
  need_heads(*this, op, B, T, NH, NKV, hs);
  LLMT_CHECK(hs % 2 == 0, "%s rope_forward: head size %d is odd", name().c_str(), hs);
  need_rope(*this, op, rope, hs);
  need_act(op, "qkv", qkv, (int64_t)B * T * (NH + 2 * NKV) * hs);
  if (positions.data) need(op, "positions", positions, DType::i32, (int64_t)B * T);
  run("attention", [&] { rope_forward_impl(qkv, B, T, NH, NKV, hs, rope, positions); });
}

void Backend::rope_backward(Tensor dqkv, int B, int T, int NH, int NKV, int hs, const RopeSpec& rope,
                            Tensor positions) {
  const char* op = "rope_backward";
  need_heads(*this, op, B, T, NH, NKV, hs);
  LLMT_CHECK(hs % 2 == 0, "%s rope_backward: head size %d is odd", name().c_str(), hs);
  need_rope(*this, op, rope, hs);
  need_act(op, "dqkv", dqkv, (int64_t)B * T * (NH + 2 * NKV) * hs);
  if (positions.data) need(op, "positions", positions, DType::i32, (int64_t)B * T);
  run("attention", [&] { rope_backward_impl(dqkv, B, T, NH, NKV, hs, rope, positions); });
}

void Backend::attention_forward(Tensor out, Tensor lse, Tensor qkv, int B, int T, int NH, int NKV, int hs,
                                const Dropout& drop, const PackedDocs& docs, int window, const AttnScores& scores) {
  const char* op = "attention_forward";
  need_heads(*this, op, B, T, NH, NKV, hs);
  need_window(*this, op, window);
  const AttnScores sc = checked_scores(*this, op, scores, hs);
  LLMT_CHECK(drop.p >= 0.0f && drop.p < 1.0f, "%s attention_forward: dropout p = %g, expected 0 <= p < 1",
             name().c_str(), drop.p);
  const int64_t BT = (int64_t)B * T;
  need_act(op, "out", out, BT * NH * hs);
  need(op, "lse", lse, DType::f32, BT * NH);
  need_act(op, "qkv", qkv, BT * (NH + 2 * NKV) * hs);
  if (docs.active()) need(op, "doc_start", docs.start, DType::i32, BT);
  need_doc_count(*this, op, docs, B, T);
  run("attention", [&] { attention_forward_impl(out, lse, qkv, B, T, NH, NKV, hs, drop, docs, window, sc); });
}

void Backend::attention_kv(Tensor out, Tensor k_cache, Tensor v_cache, Tensor qkv, Tensor key_start, int B, int Tn,
                           int p0, int cap, int NH, int NKV, int hs, int window, const AttnScores& scores) {
  const char* op = "attention_kv";
  need_heads(*this, op, B, Tn, NH, NKV, hs);
  need_window(*this, op, window);
  const AttnScores sc = checked_scores(*this, op, scores, hs);
  LLMT_CHECK(p0 >= 0 && p0 + Tn <= cap, "%s attention_kv: %d cached and %d new tokens exceed the cache's %d positions",
             name().c_str(), p0, Tn, cap);
  const int64_t BT = (int64_t)B * Tn, cache = (int64_t)B * NKV * cap * hs;
  need_act(op, "out", out, BT * NH * hs);
  need_act(op, "k_cache", k_cache, cache);
  need_act(op, "v_cache", v_cache, cache);
  need_act(op, "qkv", qkv, BT * (NH + 2 * NKV) * hs);
  need(op, "key_start", key_start, DType::i32, B);
  run("attention",
      [&] { attention_kv_impl(out, k_cache, v_cache, qkv, key_start, B, Tn, p0, cap, NH, NKV, hs, window, sc); });
}

void Backend::attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor lse, int B, int T, int NH,
                                 int NKV, int hs, const Dropout& drop, const PackedDocs& docs, int window,
                                 const AttnScores& scores) {
  const char* op = "attention_backward";
  need_heads(*this, op, B, T, NH, NKV, hs);
  need_window(*this, op, window);
  const AttnScores sc = checked_scores(*this, op, scores, hs);
  LLMT_CHECK(drop.p >= 0.0f && drop.p < 1.0f, "%s attention_backward: dropout p = %g, expected 0 <= p < 1",
             name().c_str(), drop.p);
  const int64_t BT = (int64_t)B * T;
  need_act(op, "dqkv", dqkv, BT * (NH + 2 * NKV) * hs);
  need_act(op, "dout", dout, BT * NH * hs);
  need_act(op, "qkv", qkv, BT * (NH + 2 * NKV) * hs);
  need_act(op, "out", out, BT * NH * hs);
  need(op, "lse", lse, DType::f32, BT * NH);
  if (docs.active()) need(op, "doc_start", docs.start, DType::i32, BT);
  need_doc_count(*this, op, docs, B, T);
  run("attention",
      [&] { attention_backward_impl(dqkv, dout, qkv, out, lse, B, T, NH, NKV, hs, drop, docs, window, sc); });
}

// ---- elementwise ----

void Backend::add(Tensor out, Tensor a, Tensor b, int64_t n) {
  const char* op = "add";
  need_size(*this, op, "n", n, 0);
  LLMT_CHECK(out.dtype == a.dtype && a.dtype == b.dtype, "%s add: dtypes %s = %s + %s differ", name().c_str(),
             dtype_name(out.dtype), dtype_name(a.dtype), dtype_name(b.dtype));
  need_float(op, "out", out, n);
  need_elems(op, "a", a, n);
  need_elems(op, "b", b, n);
  run("elementwise", [&] { add_impl(out, a, b, n); });
}

void Backend::accumulate(Tensor dst, Tensor src, int64_t n) {
  const char* op = "accumulate";
  need_size(*this, op, "n", n, 0);
  need_float(op, "dst", dst, n);
  need_float(op, "src", src, n);
  run("elementwise", [&] { accumulate_impl(dst, src, n); });
}

void Backend::scale(Tensor x, float s, int64_t n) {
  need_size(*this, "scale", "n", n, 0);
  need_float("scale", "x", x, n);
  run("elementwise", [&] { scale_impl(x, s, n); });
}

// ---- loss ----

void Backend::cross_entropy(Tensor loss_sum, Tensor dlogits, Tensor logits, Tensor targets, int64_t N, int V,
                            float grad_scale, int64_t ld, float softcap) {
  const char* op = "cross_entropy";
  LLMT_CHECK(std::isfinite(softcap) && softcap >= 0.0f,
             "%s cross_entropy: logit soft cap %g, expected > 0 (or 0: none)", name().c_str(), softcap);
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "V", V, 1);
  if (ld == 0) ld = V;
  need_size(*this, op, "ld", ld, V);
  const int64_t span = N > 0 ? (N - 1) * ld + V : 0;
  need(op, "loss_sum", loss_sum, DType::f64, 1);
  need_act(op, "logits", logits, span);
  if (dlogits.data) need_act(op, "dlogits", dlogits, span);
  need(op, "targets", targets, DType::i32, N);
  run("loss", [&] { cross_entropy_impl(loss_sum, dlogits, logits, targets, N, V, grad_scale, ld, softcap); });
}

void Backend::logit_softcap(Tensor x, int64_t N, int V, float cap, int64_t ld) {
  const char* op = "logit_softcap";
  LLMT_CHECK(std::isfinite(cap) && cap > 0.0f, "%s logit_softcap: cap %g, expected > 0", name().c_str(), cap);
  need_size(*this, op, "N", N, 0);
  need_size(*this, op, "V", V, 1);
  if (ld == 0) ld = V;
  need_size(*this, op, "ld", ld, V);
  need_act(op, "x", x, N > 0 ? (N - 1) * ld + V : 0);
  run("loss", [&] { logit_softcap_impl(x, N, V, cap, ld); });
}

// ---- optimizer and reductions ----

void Backend::adamw(Tensor p, Tensor p_compute, Tensor g, Tensor m, Tensor v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, const DecaySpans& decay, int t, float grad_scale) {
  const char* op = "adamw";
  need_size(*this, op, "n", n, 0);
  LLMT_CHECK(decay.count >= 0 && decay.count <= DecaySpans::kMax, "%s adamw: %d decay spans, expected 0 to %d",
             name().c_str(), decay.count, DecaySpans::kMax);
  for (int s = 0; s < decay.count; s++)
    LLMT_CHECK(decay.begin[s] < decay.end[s] && decay.end[s] <= n && (s == 0 || decay.begin[s] >= decay.end[s - 1]),
               "%s adamw: decay span %d [%lld, %lld) is empty, beyond n = %lld or out of order", name().c_str(), s,
               (long long)decay.begin[s], (long long)decay.end[s], (long long)n);
  need_size(*this, op, "step t (1-based)", t, 1);
  need(op, "p", p, DType::f32, n);
  if (p_compute.data) need(op, "p_compute", p_compute, DType::bf16, n);
  need(op, "g", g, DType::f32, n);
  need(op, "m", m, DType::f32, n);
  need(op, "v", v, DType::f32, n);
  run("adamw", [&] { adamw_impl(p, p_compute, g, m, v, n, lr, beta1, beta2, eps, weight_decay, decay, t, grad_scale); });
}

void Backend::sum_squares(Tensor out, Tensor x, int64_t n) {
  need_size(*this, "sum_squares", "n", n, 0);
  need("sum_squares", "out", out, DType::f64, 1);
  need("sum_squares", "x", x, DType::f32, n);
  run("grad norm", [&] { sum_squares_impl(out, x, n); });
}

// ---- dtype conversion ----

void Backend::convert(Tensor out, Tensor in, int64_t n) {
  need_size(*this, "convert", "n", n, 0);
  need_float("convert", "out", out, n);
  need_float("convert", "in", in, n);
  run("elementwise", [&] { convert_impl(out, in, n); });
}

// ---- mixture of experts ----

namespace {
// N tokens, E experts, k of them each, C channels: sizes an MoE op can take
void need_moe(const Backend& be, const char* op, int64_t N, int E, int k, int C) {
  need_size(be, op, "N", N, 0);
  need_size(be, op, "E", E, 1);
  need_size(be, op, "k", k, 1);
  need_size(be, op, "C", C, 1);
  LLMT_CHECK(k <= E, "%s %s: k = %d experts of E = %d", be.name().c_str(), op, k, E);
}
}  // namespace

void Backend::moe_route(Tensor topk_idx, Tensor topk_w, Tensor probs, Tensor stats, Tensor logits, int64_t N, int E,
                        int k, bool norm_topk, bool round_w) {
  const char* op = "moe_route";
  need_moe(*this, op, N, E, k, 1);
  need(op, "topk_idx", topk_idx, DType::i32, N * k);
  need(op, "topk_w", topk_w, DType::f32, N * k);
  need(op, "probs", probs, DType::f32, N * E);
  if (stats.data) need(op, "stats", stats, DType::f32, 2 * E);
  need_act(op, "logits", logits, N * E);
  if (N == 0) return;
  run("moe routing", [&] { moe_route_impl(topk_idx, topk_w, probs, stats, logits, N, E, k, norm_topk, round_w); });
}

void Backend::moe_route_backward(Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor aux_grad,
                                 int64_t N, int E, int k, bool norm_topk) {
  const char* op = "moe_route_backward";
  need_moe(*this, op, N, E, k, 1);
  need_act(op, "dlogits", dlogits, N * E);
  need(op, "dtopk_w", dtopk_w, DType::f32, N * k);
  need(op, "probs", probs, DType::f32, N * E);
  need(op, "topk_idx", topk_idx, DType::i32, N * k);
  if (aux_grad.data) need(op, "aux_grad", aux_grad, DType::f32, E);
  if (N == 0) return;
  run("moe routing", [&] { moe_route_backward_impl(dlogits, dtopk_w, probs, topk_idx, aux_grad, N, E, k, norm_topk); });
}

void Backend::moe_dispatch(Tensor offsets, Tensor pos, Tensor xg, Tensor x, Tensor topk_idx, int64_t N, int E, int k,
                           int C) {
  const char* op = "moe_dispatch";
  need_moe(*this, op, N, E, k, C);
  need(op, "offsets", offsets, DType::i32, E + 1);
  need(op, "pos", pos, DType::i32, N * k);
  need(op, "topk_idx", topk_idx, DType::i32, N * k);
  if (xg.data) {
    need_act(op, "xg", xg, N * k * C);
    need_act(op, "x", x, N * C);
  }
  run("moe dispatch", [&] { moe_dispatch_impl(offsets, pos, xg, x, topk_idx, N, E, k, C); });
}

void Backend::moe_undispatch(Tensor dx, Tensor dxg, Tensor pos, int64_t N, int k, int C) {
  const char* op = "moe_undispatch";
  need_moe(*this, op, N, k, k, C);
  need_act(op, "dx", dx, N * C);
  need_act(op, "dxg", dxg, N * k * C);
  need(op, "pos", pos, DType::i32, N * k);
  if (N == 0) return;
  run("moe dispatch", [&] { moe_undispatch_impl(dx, dxg, pos, N, k, C); });
}

void Backend::moe_matmul(Tensor out, Tensor a, Tensor w, Tensor offsets, int64_t rows, int E, int64_t n, int64_t K,
                         int64_t w_stride, bool trans_w) {
  const char* op = "moe_matmul";
  need_size(*this, op, "rows", rows, 0);
  need_size(*this, op, "E", E, 1);
  need_size(*this, op, "n", n, 1);
  need_size(*this, op, "K", K, 1);
  need_size(*this, op, "w_stride", w_stride, n * K);
  need_act(op, "out", out, rows * n);
  need_act(op, "a", a, rows * K);
  need_act(op, "w", w, (E - 1) * w_stride + n * K);
  need(op, "offsets", offsets, DType::i32, E + 1);
  if (rows == 0) return;
  run("moe matmul", [&] { moe_matmul_impl(out, a, w, offsets, rows, E, n, K, w_stride, trans_w); });
}

void Backend::moe_matmul_wgrad(Tensor dw, Tensor dout, Tensor a, Tensor offsets, int64_t rows, int E, int64_t n,
                               int64_t K, int64_t w_stride) {
  const char* op = "moe_matmul_wgrad";
  need_size(*this, op, "rows", rows, 0);
  need_size(*this, op, "E", E, 1);
  need_size(*this, op, "n", n, 1);
  need_size(*this, op, "K", K, 1);
  need_size(*this, op, "w_stride", w_stride, n * K);
  need(op, "dw", dw, DType::f32, (E - 1) * w_stride + n * K);
  need_act(op, "dout", dout, rows * n);
  need_act(op, "a", a, rows * K);
  need(op, "offsets", offsets, DType::i32, E + 1);
  if (rows == 0) return;
  run("moe matmul", [&] { moe_matmul_wgrad_impl(dw, dout, a, offsets, rows, E, n, K, w_stride); });
}

void Backend::moe_combine(Tensor out, Tensor residual, Tensor y, Tensor topk_w, Tensor pos, Tensor shared,
                          Tensor gate, int64_t N, int k, int C) {
  const char* op = "moe_combine";
  need_moe(*this, op, N, k, k, C);
  need_act(op, "out", out, N * C);
  need_act(op, "residual", residual, N * C);
  need_act(op, "y", y, N * k * C);
  need(op, "topk_w", topk_w, DType::f32, N * k);
  need(op, "pos", pos, DType::i32, N * k);
  if (shared.data) {
    need_act(op, "shared", shared, N * C);
    need_act(op, "gate", gate, N);
  }
  if (N == 0) return;
  run("moe combine", [&] { moe_combine_impl(out, residual, y, topk_w, pos, shared, gate, N, k, C); });
}

void Backend::moe_combine_backward(Tensor dy, Tensor dtopk_w, Tensor dshared, Tensor dgate, Tensor dout, Tensor y,
                                   Tensor topk_w, Tensor pos, Tensor shared, Tensor gate, int64_t N, int k, int C) {
  const char* op = "moe_combine_backward";
  need_moe(*this, op, N, k, k, C);
  need_act(op, "dy", dy, N * k * C);
  need(op, "dtopk_w", dtopk_w, DType::f32, N * k);
  need_act(op, "dout", dout, N * C);
  need_act(op, "y", y, N * k * C);
  need(op, "topk_w", topk_w, DType::f32, N * k);
  need(op, "pos", pos, DType::i32, N * k);
  if (shared.data) {
    need_act(op, "dshared", dshared, N * C);
    need_act(op, "dgate", dgate, N);
    need_act(op, "shared", shared, N * C);
    need_act(op, "gate", gate, N);
  }
  if (N == 0) return;
  run("moe combine", [&] {
    moe_combine_backward_impl(dy, dtopk_w, dshared, dgate, dout, y, topk_w, pos, shared, gate, N, k, C);
  });
}

void Backend::moe_aux_loss(Tensor loss, Tensor grad, Tensor stats, int E, double rows, float coef, float grad_scale) {
  const char* op = "moe_aux_loss";
  need_size(*this, op, "E", E, 1);
  LLMT_CHECK(rows > 0, "%s %s: rows = %g, expected at least 1", name().c_str(), op, rows);
  need(op, "loss", loss, DType::f64, 1);
  need(op, "grad", grad, DType::f32, E);
  need(op, "stats", stats, DType::f32, 2 * E);
  run("moe routing", [&] { moe_aux_loss_impl(loss, grad, stats, E, rows, coef, grad_scale); });
}

}  // namespace llmt
