// The plain CUDA kernels of the Backend ops cuda_kernels.cu does not cover (semantics in cuda_ops.h
// and engine/backend/backend.h). Plain means: no tensor cores, no inline PTX, no cp.async — they run
// under the SIMT emulator and on any GPU, and the fast paths are checked against them. Every sum
// has a fixed order (block reductions whose every thread adds the warps' partials in warp order,
// column sums in chunks of rows added in chunk order, or one thread per output looping over its
// inputs), so a run repeats bit for bit.
#include "kernels/cuda/cuda_ops.h"

#include <algorithm>
#include <initializer_list>
#include <cmath>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/device_common.cuh"

namespace llmt {
namespace cuda {
namespace {

constexpr int kMaxHeadSize = 256;  // attention keeps a head's vectors in registers (local memory)
constexpr int kColumnLanes = 8;    // row lanes per column in a column-sum block of 32 x 8 threads

__device__ void report(int* err, int code, int value, int64_t pos, int bound) {
  if (atomicCAS(err, kErrNone, code) == kErrNone) {
    err[1] = value;
    err[2] = (int)(pos & 0xffffffff);
    err[3] = (int)(pos >> 32);
    err[4] = bound;
  }
}

// The block's sum (or max), the same value in every thread. blockDim.x: a multiple of WARP_SIZE.
template <typename A>
__device__ A block_sum_all(A x) {
  LLMT_SHARED(A, partial, [WARP_SIZE]);
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, nw = (int)blockDim.x / WARP_SIZE;
  for (int o = WARP_SIZE / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();  // the array's previous use is over
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  A r = 0;
  for (int i = 0; i < nw; i++) r += partial[i];
  return r;
}
__device__ float block_max_all(float x) {
  LLMT_SHARED(float, partial, [WARP_SIZE]);
  const int tid = (int)threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, nw = (int)blockDim.x / WARP_SIZE;
  for (int o = WARP_SIZE / 2; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  float r = -INFINITY;
  for (int i = 0; i < nw; i++) r = fmaxf(r, partial[i]);
  return r;
}

// Threads for a kernel with a block per row of C: a warp per 32 channels, up to kBlock.
inline int row_threads(int C) { return std::min(kBlock, std::max(WARP_SIZE, (C + WARP_SIZE - 1) / WARP_SIZE * WARP_SIZE)); }
inline unsigned blocks_for(int64_t n, int per) { return (unsigned)std::max<int64_t>(1, (n + per - 1) / per); }
inline int64_t grid_stride_blocks(int64_t n) { return grid_for(n); }

// ---- matmul: 64 x 64 output tiles, 4 x 4 outputs per thread, operands staged through shared
// memory 16 k at a time; each output sums its products in k order (fp32) ----
constexpr int kMmTile = 64, kMmK = 16, kMmThreads = 256;

template <typename Ta, typename Tout>
__global__ void __launch_bounds__(kMmThreads) matmul_kernel(Tout* out, const Ta* a, const Ta* b, const Ta* bias,
                                                            int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                                                            bool acc, int64_t lda, int64_t ldo) {
  LLMT_SHARED(float, as, [kMmK][kMmTile + 4]);
  LLMT_SHARED(float, bs, [kMmK][kMmTile + 4]);
  const int tid = (int)threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t row0 = (int64_t)blockIdx.y * kMmTile, col0 = (int64_t)blockIdx.x * kMmTile;
  float sum[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kMmK) {
    // stage op(a)[row0.., k0..] and op(b)[k0.., col0..]; the index that runs fastest over the
    // threads is the one contiguous in memory, so the loads coalesce
    for (int e = tid; e < kMmK * kMmTile; e += kMmThreads) {
      const int kk = ta ? e / kMmTile : e % kMmK, r = ta ? e % kMmTile : e / kMmK;
      const int64_t row = row0 + r, k = k0 + kk;
      as[kk][r] = row < M && k < K ? to_f32(ta ? a[k * lda + row] : a[row * lda + k]) : 0.0f;
    }
    for (int e = tid; e < kMmK * kMmTile; e += kMmThreads) {
      const int kk = tb ? e % kMmK : e / kMmTile, c = tb ? e / kMmK : e % kMmTile;
      const int64_t col = col0 + c, k = k0 + kk;
      bs[kk][c] = col < N && k < K ? to_f32(tb ? b[col * K + k] : b[k * N + col]) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kMmK; kk++) {
      float av[4], bv[4];
      for (int i = 0; i < 4; i++) av[i] = as[kk][ty * 4 + i], bv[i] = bs[kk][tx * 4 + i];
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) sum[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; i++) {
    const int64_t row = row0 + ty * 4 + i;
    if (row >= M) break;
    for (int j = 0; j < 4; j++) {
      const int64_t col = col0 + tx * 4 + j;
      if (col >= N) break;
      float v = sum[i][j];
      if (bias) v += to_f32(bias[col]);
      if (acc) v += to_f32(out[row * ldo + col]);
      out[row * ldo + col] = from_f32<Tout>(v);
    }
  }
}

// ---- column sums (bias and norm-weight gradients) in two stages, in an order fixed by N and C
// alone: blocks of 32 columns x 8 row lanes sum a chunk of rows each into partials[chunk][c]
// (each lane every 8th row, then the 8 lanes in order), then a thread per column adds the chunks in
// order into the output (+=). No atomics, so a run repeats bit for bit; a chunk per ~256 rows
// fills the GPU where a thread per column looping over every row did not. ----
enum ColumnSum { kBiasGrad = 0, kLayerNormGrads = 1, kRmsNormGrad = 2 };

// V: columns a thread sums, 16 bytes of dout a load where V > 1 (C a multiple of V, rows aligned).
template <typename T, int KIND, int V>
__global__ void column_partials_kernel(float* partials, const T* dout, const T* x, const float* mean,
                                       const float* rstd, int64_t N, int C, int64_t rows_per_chunk) {
  LLMT_SHARED(float, s0, [kColumnLanes][32 * V + 1]);
  LLMT_SHARED(float, s1, [kColumnLanes][32 * V + 1]);
  const int cx = (int)threadIdx.x % 32, ry = (int)threadIdx.x / 32, chunk = (int)blockIdx.y;
  const int c = ((int)blockIdx.x * 32 + cx) * V;  // this thread's first column
  const int64_t r0 = chunk * rows_per_chunk, r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float a0[V], a1[V];
#pragma unroll
  for (int e = 0; e < V; e++) a0[e] = a1[e] = 0.0f;
  if (c < C)
    for (int64_t r = r0 + ry; r < r1; r += kColumnLanes) {
      float d[V], xv[V];
      const Vec<T, V> dv = load_vec<T, V>(dout + r * C + c);
      Vec<T, V> xr;
      if (KIND != kBiasGrad) xr = load_vec<T, V>(x + r * C + c);
#pragma unroll
      for (int e = 0; e < V; e++) {
        d[e] = to_f32(dv.v[e]);
        xv[e] = KIND != kBiasGrad ? to_f32(xr.v[e]) : 0.0f;
        if (KIND == kBiasGrad) a0[e] += d[e];
        if (KIND == kLayerNormGrads) a0[e] += d[e] * (xv[e] - mean[r]) * rstd[r], a1[e] += d[e];
        if (KIND == kRmsNormGrad) a0[e] += d[e] * xv[e] * rstd[r];
      }
    }
#pragma unroll
  for (int e = 0; e < V; e++) s0[ry][cx * V + e] = a0[e], s1[ry][cx * V + e] = a1[e];
  __syncthreads();
  if (ry != 0 || c >= C) return;
  const int chunks = (int)gridDim.y;
#pragma unroll
  for (int e = 0; e < V; e++) {
    float t0 = 0.0f, t1 = 0.0f;
    for (int k = 0; k < kColumnLanes; k++) t0 += s0[k][cx * V + e], t1 += s1[k][cx * V + e];
    partials[(int64_t)chunk * C + c + e] = t0;
    if (KIND == kLayerNormGrads) partials[(int64_t)(chunks + chunk) * C + c + e] = t1;
  }
}

__global__ void column_finish_kernel(float* out0, float* out1, const float* partials, int chunks, int C) {
  const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C) return;
  float t0 = 0.0f, t1 = 0.0f;
  for (int k = 0; k < chunks; k++) t0 += partials[(int64_t)k * C + c];
  out0[c] += t0;
  if (!out1) return;
  for (int k = 0; k < chunks; k++) t1 += partials[(int64_t)(chunks + k) * C + c];
  out1[c] += t1;
}

template <typename T, int KIND>
void column_sums(float* out0, float* out1, const T* dout, const T* x, const float* mean, const float* rstd, int64_t N,
                 int C, float* partials, Stream stream) {
  if (N == 0 || C == 0) return;
  const int chunks = column_chunks(N);
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  constexpr int V = 16 / sizeof(T);  // 16-byte loads where every row starts aligned
  if (C % V == 0 && aligned(dout, 16) && aligned(x, 16))
    LLMT_LAUNCH((column_partials_kernel<T, KIND, V>), dim3(blocks_for(C, 32 * V), (unsigned)chunks),
                32 * kColumnLanes, 0, stream, partials, dout, x, mean, rstd, N, C, rows_per_chunk);
  else
    LLMT_LAUNCH((column_partials_kernel<T, KIND, 1>), dim3(blocks_for(C, 32), (unsigned)chunks), 32 * kColumnLanes, 0,
                stream, partials, dout, x, mean, rstd, N, C, rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  LLMT_LAUNCH(column_finish_kernel, blocks_for(C, kBlock), kBlock, 0, stream, out0, out1, partials, chunks, C);
  CUDA_CHECK_LAUNCH();
}

// ---- per-head RMSNorm (Qwen3's q_norm and k_norm) over qkv rows [q | k | v]: a block per hs-wide
// piece of a row (row n's piece h at (n * pieces + h) * hs): q and k pieces normalised, v copied ----
template <typename T>
__global__ void head_rmsnorm_forward_kernel(T* out, float* rstd, const T* in, const T* wq, const T* wk, int NH, int NKV,
                                            int hs, float eps, float w_off) {
  const int pieces = NH + 2 * NKV, heads = NH + NKV;
  const int64_t n = (int64_t)blockIdx.x / pieces, i0 = (int64_t)blockIdx.x * hs;
  const int h = (int)((int64_t)blockIdx.x % pieces);
  if (h >= heads) {  // a v head (the whole block)
    for (int c = (int)threadIdx.x; c < hs; c += (int)blockDim.x) out[i0 + c] = in[i0 + c];
    return;
  }
  const T* w = h < NH ? wq : wk;
  float s = 0.0f;
  for (int c = (int)threadIdx.x; c < hs; c += (int)blockDim.x) {
    const float v = to_f32(in[i0 + c]);
    s += v * v;
  }
  const float r = 1.0f / sqrtf(block_sum_all(s) / hs + eps);
  for (int c = (int)threadIdx.x; c < hs; c += (int)blockDim.x)
    out[i0 + c] = from_f32<T>(to_f32(in[i0 + c]) * r * (w_off + to_f32(w[c])));
  if (threadIdx.x == 0) rstd[n * heads + h] = r;
}

// din may be dout: each thread writes only the elements it read, after the block's sum
template <typename T>
__global__ void head_rmsnorm_backward_dx_kernel(T* din, const T* dout, const T* in, const T* wq, const T* wk,
                                                const float* rstd, int NH, int NKV, int hs, float w_off) {
  const int pieces = NH + 2 * NKV, heads = NH + NKV;
  const int64_t n = (int64_t)blockIdx.x / pieces, i0 = (int64_t)blockIdx.x * hs;
  const int h = (int)((int64_t)blockIdx.x % pieces);
  if (h >= heads) {
    if (din != dout)
      for (int c = (int)threadIdx.x; c < hs; c += (int)blockDim.x) din[i0 + c] = dout[i0 + c];
    return;
  }
  const T* w = h < NH ? wq : wk;
  const float r = rstd[n * heads + h];
  float s = 0.0f;
  for (int c = (int)threadIdx.x; c < hs; c += (int)blockDim.x)
    s += to_f32(dout[i0 + c]) * (w_off + to_f32(w[c])) * to_f32(in[i0 + c]) * r;
  const float mean_dnn = block_sum_all(s) / hs;
  for (int c = (int)threadIdx.x; c < hs; c += (int)blockDim.x) {
    const int64_t i = i0 + c;
    din[i] = from_f32<T>((to_f32(dout[i]) * (w_off + to_f32(w[c])) - to_f32(in[i]) * r * mean_dnn) * r);
  }
}

// The weight gradients' partial sums: blockIdx.y = part * chunks + chunk (part 0: q heads, 1: k
// heads), a thread per column c summing its chunk's tokens in order, partials[part][chunk][c]; then
// column_finish_kernel adds the chunks in order (deterministic).
template <typename T>
__global__ void head_rmsnorm_dw_partials_kernel(float* partials, const T* dout, const T* in, const float* rstd,
                                                int64_t N, int NH, int NKV, int hs, int chunks,
                                                int64_t rows_per_chunk) {
  const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= hs) return;
  const int part = (int)blockIdx.y / chunks, chunk = (int)blockIdx.y % chunks;
  const int pieces = NH + 2 * NKV, heads = NH + NKV, h0 = part ? NH : 0, h1 = part ? heads : NH;
  const int64_t n0 = (int64_t)chunk * rows_per_chunk, n1 = n0 + rows_per_chunk < N ? n0 + rows_per_chunk : N;
  float a = 0.0f;
  for (int64_t n = n0; n < n1; n++)
    for (int h = h0; h < h1; h++) {
      const int64_t i = (n * pieces + h) * hs + c;
      a += to_f32(dout[i]) * to_f32(in[i]) * rstd[n * heads + h];
    }
  partials[((int64_t)part * chunks + chunk) * hs + c] = a;
}

// ---- embeddings ----
template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int T_, int C, int V,
                                         int64_t n, int* err) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t row = i / C, c = i % C;
    const int tok = tokens[row];
    if (tok < 0 || tok >= V) {
      report(err, kErrToken, tok, row, V);
      out[i] = from_f32<T>(0.0f);
      continue;
    }
    float v = to_f32(wte[(int64_t)tok * C + c]);
    if (wpe) v += to_f32(wpe[(row % T_) * C + c]);
    out[i] = from_f32<T>(v);
  }
}

// dwte, deterministically and without atomics: the token ids are split into `buckets` classes (id
// % buckets; a bad id goes to class 0) and a thread per (channel, class) walks every row, adding
// only its class's rows. Two rows with one id are always one thread's, added in row order, so the
// sums are the same bits as one thread per channel walking every row, with C x buckets threads in
// place of C (768 threads were 3 blocks of an H100's 132 SMs). The ids are read by every thread, a
// warp's 32 channels at once; each row of dout once. A bad id is reported and its row skipped: the
// forward's report of it is read only at the next synchronize, after this backward has run.
template <typename T>
__global__ void embedding_backward_wte_kernel(float* dwte, const T* dout, const int32_t* tokens, int64_t N, int C,
                                              int V, int buckets, int* err) {
  const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x), bucket = (int)blockIdx.y;
  if (c >= C) return;
  for (int64_t row = 0; row < N; row++) {
    const int tok = tokens[row];
    const bool ok = tok >= 0 && tok < V;
    if ((ok ? tok % buckets : 0) != bucket) continue;
    if (ok) dwte[(int64_t)tok * C + c] += to_f32(dout[row * C + c]);
    else if (c == 0) report(err, kErrToken, tok, row, V);
  }
}

// dwpe[t, c] += dout[b, t, c] over b in order (row order, as the sums above): a thread per (t, c).
template <typename T>
__global__ void embedding_backward_wpe_kernel(float* dwpe, const T* dout, int B, int T_, int C) {
  const int64_t n = (int64_t)T_ * C, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += to_f32(dout[(int64_t)b * n + i]);
    dwpe[i] = acc;
  }
}

// ---- norms: a block per row for the row's statistics and dx; dw and db as column sums ----
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int C,
                                         float eps) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  float s = 0.0f;
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) s += to_f32(xr[c]);
  const float m = block_sum_all(s) / C;
  float v = 0.0f;
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
    const float d = to_f32(xr[c]) - m;
    v += d * d;
  }
  const float r = 1.0f / sqrtf(block_sum_all(v) / C + eps);
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x)
    out[row * C + c] = from_f32<T>((to_f32(xr[c]) - m) * r * to_f32(w[c]) + to_f32(b[c]));
  if (threadIdx.x == 0) mean[row] = m, rstd[row] = r;
}

template <typename T>
__global__ void layernorm_backward_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const float* mean,
                                             const float* rstd, int C) {
  const int64_t row = blockIdx.x;
  const float m = mean[row], r = rstd[row];
  float s_dn = 0.0f, s_dnn = 0.0f;
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
    const float n = (to_f32(x[row * C + c]) - m) * r, dn = to_f32(dout[row * C + c]) * to_f32(w[c]);
    s_dn += dn;
    s_dnn += dn * n;
  }
  const float mean_dn = block_sum_all(s_dn) / C, mean_dnn = block_sum_all(s_dnn) / C;
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
    const int64_t i = row * C + c;
    const float n = (to_f32(x[i]) - m) * r;
    dx[i] = from_f32<T>(to_f32(dx[i]) + (to_f32(dout[i]) * to_f32(w[c]) - mean_dn - n * mean_dnn) * r);
  }
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* w, int C, float eps, float w_off) {
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  float s = 0.0f;
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
    const float v = to_f32(xr[c]);
    s += v * v;
  }
  const float r = 1.0f / sqrtf(block_sum_all(s) / C + eps);
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x)
    out[row * C + c] = from_f32<T>(to_f32(xr[c]) * r * (w_off + to_f32(w[c])));
  if (threadIdx.x == 0) rstd[row] = r;
}

template <typename T>
__global__ void rmsnorm_backward_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const float* rstd, int C,
                                           float w_off) {
  const int64_t row = blockIdx.x;
  const float r = rstd[row];
  float s = 0.0f;
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x)
    s += to_f32(dout[row * C + c]) * (w_off + to_f32(w[c])) * to_f32(x[row * C + c]) * r;
  const float mean_dnn = block_sum_all(s) / C;
  for (int c = (int)threadIdx.x; c < C; c += (int)blockDim.x) {
    const int64_t i = row * C + c;
    dx[i] = from_f32<T>(to_f32(dx[i]) + (to_f32(dout[i]) * (w_off + to_f32(w[c])) - to_f32(x[i]) * r * mean_dnn) * r);
  }
}

// ---- the norms vectorised: a block per row, 16 bytes a load, the row held in registers between its
// passes (one read of x, and of dout, per row). K: 16-byte chunks a thread holds, at most
// kNormMaxChunks; rows whose C is no multiple of the vector, whose rows are not 16-byte aligned, or
// longer than kBlock * kNormMaxChunks chunks take the scalar kernels above. The same sums as those,
// each thread's chunks in order, then block_sum_all: deterministic. ----
constexpr int kNormMaxChunks = 8;

// Chunk k of this thread's share of a row: its values widened to f32 (zeros past the row).
template <typename T, int V>
__device__ __forceinline__ bool load_chunk(float (&v)[V], const T* row, int chunk, int chunks) {
  if (chunk >= chunks) {
#pragma unroll
    for (int e = 0; e < V; e++) v[e] = 0.0f;
    return false;
  }
  const Vec<T, V> raw = load_vec<T, V>(row + (int64_t)chunk * V);
#pragma unroll
  for (int e = 0; e < V; e++) v[e] = to_f32(raw.v[e]);
  return true;
}
template <typename T, int V>
__device__ __forceinline__ void store_chunk(T* row, int chunk, const float (&v)[V]) {
  Vec<T, V> raw;
#pragma unroll
  for (int e = 0; e < V; e++) raw.v[e] = from_f32<T>(v[e]);
  store_vec<T, V>(row + (int64_t)chunk * V, raw);
}

template <typename T, int K>
__global__ void layernorm_forward_vec_kernel(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int C,
                                             float eps) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const int chunks = C / V, t = (int)threadIdx.x, step = (int)blockDim.x;
  float xv[K][V], s = 0.0f;
#pragma unroll
  for (int k = 0; k < K; k++) {
    load_chunk<T, V>(xv[k], x + row * C, t + k * step, chunks);
#pragma unroll
    for (int e = 0; e < V; e++) s += xv[k][e];
  }
  const float m = block_sum_all(s) / C;
  float var = 0.0f;
#pragma unroll
  for (int k = 0; k < K; k++)
    if (t + k * step < chunks)
#pragma unroll
      for (int e = 0; e < V; e++) var += (xv[k][e] - m) * (xv[k][e] - m);
  const float r = 1.0f / sqrtf(block_sum_all(var) / C + eps);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int ch = t + k * step;
    float wv[V], bv[V];
    if (!load_chunk<T, V>(wv, w, ch, chunks)) continue;
    load_chunk<T, V>(bv, b, ch, chunks);
#pragma unroll
    for (int e = 0; e < V; e++) xv[k][e] = (xv[k][e] - m) * r * wv[e] + bv[e];
    store_chunk<T, V>(out + row * C, ch, xv[k]);
  }
  if (t == 0) mean[row] = m, rstd[row] = r;
}

template <typename T, int K>
__global__ void layernorm_backward_dx_vec_kernel(T* dx, const T* dout, const T* x, const T* w, const float* mean,
                                                 const float* rstd, int C) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const int chunks = C / V, t = (int)threadIdx.x, step = (int)blockDim.x;
  const float m = mean[row], r = rstd[row];
  float nv[K][V], dn[K][V], s_dn = 0.0f, s_dnn = 0.0f;  // the normalised x, dout * w
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int ch = t + k * step;
    float wv[V];
    load_chunk<T, V>(nv[k], x + row * C, ch, chunks);
    load_chunk<T, V>(dn[k], dout + row * C, ch, chunks);
    load_chunk<T, V>(wv, w, ch, chunks);
#pragma unroll
    for (int e = 0; e < V; e++) {
      nv[k][e] = (nv[k][e] - m) * r;
      dn[k][e] *= wv[e];
      s_dn += dn[k][e];
      s_dnn += dn[k][e] * nv[k][e];
    }
  }
  const float mean_dn = block_sum_all(s_dn) / C, mean_dnn = block_sum_all(s_dnn) / C;
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int ch = t + k * step;
    float dv[V];
    if (!load_chunk<T, V>(dv, dx + row * C, ch, chunks)) continue;
#pragma unroll
    for (int e = 0; e < V; e++) dv[e] += (dn[k][e] - mean_dn - nv[k][e] * mean_dnn) * r;
    store_chunk<T, V>(dx + row * C, ch, dv);
  }
}

template <typename T, int K>
__global__ void rmsnorm_forward_vec_kernel(T* out, float* rstd, const T* x, const T* w, int C, float eps, float w_off) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const int chunks = C / V, t = (int)threadIdx.x, step = (int)blockDim.x;
  float xv[K][V], s = 0.0f;
#pragma unroll
  for (int k = 0; k < K; k++) {
    load_chunk<T, V>(xv[k], x + row * C, t + k * step, chunks);
#pragma unroll
    for (int e = 0; e < V; e++) s += xv[k][e] * xv[k][e];
  }
  const float r = 1.0f / sqrtf(block_sum_all(s) / C + eps);
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int ch = t + k * step;
    float wv[V];
    if (!load_chunk<T, V>(wv, w, ch, chunks)) continue;
#pragma unroll
    for (int e = 0; e < V; e++) xv[k][e] = xv[k][e] * r * (w_off + wv[e]);
    store_chunk<T, V>(out + row * C, ch, xv[k]);
  }
  if (t == 0) rstd[row] = r;
}

template <typename T, int K>
__global__ void rmsnorm_backward_dx_vec_kernel(T* dx, const T* dout, const T* x, const T* w, const float* rstd, int C,
                                               float w_off) {
  constexpr int V = 16 / sizeof(T);
  const int64_t row = blockIdx.x;
  const int chunks = C / V, t = (int)threadIdx.x, step = (int)blockDim.x;
  const float r = rstd[row];
  float xv[K][V], dn[K][V], s = 0.0f;
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int ch = t + k * step;
    float wv[V];
    load_chunk<T, V>(xv[k], x + row * C, ch, chunks);
    load_chunk<T, V>(dn[k], dout + row * C, ch, chunks);
    load_chunk<T, V>(wv, w, ch, chunks);
#pragma unroll
    for (int e = 0; e < V; e++) {
      dn[k][e] *= w_off + wv[e];
      s += dn[k][e] * xv[k][e] * r;
    }
  }
  const float mean_dnn = block_sum_all(s) / C;
#pragma unroll
  for (int k = 0; k < K; k++) {
    const int ch = t + k * step;
    float dv[V];
    if (!load_chunk<T, V>(dv, dx + row * C, ch, chunks)) continue;
#pragma unroll
    for (int e = 0; e < V; e++) dv[e] += (dn[k][e] - xv[k][e] * r * mean_dnn) * r;
    store_chunk<T, V>(dx + row * C, ch, dv);
  }
}

// ---- RoPE, rotate_half layout, angle t * inv_freq[j] (rope_inv_freq) as transformers computes it,
// over the first rope_dim channels of each head; cos and sin times the attention factor ----
template <typename T>
__global__ void rope_kernel(T* qkv, const int32_t* pos, int T_, int NH, int NKV, int hs, RopeSpec rope, float sign,
                            int64_t n) {
  const int half = rope_dim(rope, hs) / 2, heads = NH + NKV;
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * hs;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t row = i / ((int64_t)heads * half);
    const int h = (int)(i / half % heads), j = (int)(i % half), t = pos ? pos[row] : (int)(row % T_);
    const float inv_freq = rope_inv_freq(rope, j, hs);
    const float angle = (float)t * inv_freq;
    const float c = (float)cos((double)angle) * rope.attention_factor,
                s = sign * ((float)sin((double)angle) * rope.attention_factor);
    T* x = qkv + row * row_len + (int64_t)h * hs;
    const float x1 = to_f32(x[j]), x2 = to_f32(x[j + half]);
    x[j] = from_f32<T>(x1 * c - x2 * s);
    x[j + half] = from_f32<T>(x2 * c + x1 * s);
  }
}

template <typename T>
__global__ void dropout_kernel(T* x, int T_, int C, Dropout d, int64_t n) {
  const float keep_scale = 1.0f / (1.0f - d.p);
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t row = i / C;
    const bool keep = dropout_keep(d.key, dropout_row(d.row0 + row / T_, (int)(row % T_)), i % C, d.p);
    x[i] = from_f32<T>(keep ? to_f32(x[i]) * keep_scale : 0.0f);
  }
}

// ---- attention: a thread per query row (forward, dq) or key row (dk, dv), the head's vectors in
// registers; probabilities recomputed from lse in the backward, never stored ----
__device__ __forceinline__ bool attn_keep(const Dropout& d, int b, int h, int t, int t2) {
  return dropout_keep(d.key, dropout_row(d.row0 + b, t), ((int64_t)h << kDropoutPosBits) + t2, d.p);
}

// The first key query t of sequence b sees: its document's start (packed documents), or its sliding
// window's (t - window + 1) when that is later.
__device__ __forceinline__ int first_key(const int32_t* doc, int b, int T_, int t, int window) {
  const int d0 = doc ? doc[(int64_t)b * T_ + t] : 0, w0 = window > 0 ? t - window + 1 : 0;
  return d0 > w0 ? d0 : w0;
}

template <typename T>
__device__ __forceinline__ float dot_row(const float* q, const T* k, int hs) {
  float s = 0.0f;
  for (int j = 0; j < hs; j++) s += q[j] * to_f32(k[j]);
  return s;
}

// A scaled score soft-capped (softcap > 0, Gemma 2: softcap tanh(s / softcap)), or as it is; dcap
// (when asked) the cap's derivative 1 - tanh^2, 1 without a cap.
__device__ __forceinline__ float cap_score(float s, float softcap, float* dcap = nullptr) {
  if (softcap <= 0.0f) {
    if (dcap) *dcap = 1.0f;
    return s;
  }
  const float th = tanhf(s / softcap);
  if (dcap) *dcap = 1.0f - th * th;
  return softcap * th;
}

template <typename T>
__global__ void attention_forward_kernel(T* out, float* lse, const T* qkv, const int32_t* doc, int T_, int NH, int NKV,
                                         int hs, Dropout drop, int window, float scale, float softcap) {
  const int h = (int)blockIdx.x, b = (int)blockIdx.y, kvh = h / (NH / NKV);
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * hs;
  const T* base = qkv + (int64_t)b * T_ * row_len;
  const float keep_scale = drop.p > 0.0f ? 1.0f / (1.0f - drop.p) : 1.0f;
  float q[kMaxHeadSize], acc[kMaxHeadSize];
  for (int t = (int)threadIdx.x; t < T_; t += (int)blockDim.x) {
    const int s0 = first_key(doc, b, T_, t, window);
    for (int j = 0; j < hs; j++) q[j] = to_f32(base[t * row_len + (int64_t)h * hs + j]) * scale, acc[j] = 0.0f;
    float m = -INFINITY;
    for (int t2 = s0; t2 <= t; t2++)
      m = fmaxf(m, cap_score(dot_row(q, base + t2 * row_len + (int64_t)(NH + kvh) * hs, hs), softcap));
    float sum = 0.0f;
    for (int t2 = s0; t2 <= t; t2++) {
      const float e = expf(cap_score(dot_row(q, base + t2 * row_len + (int64_t)(NH + kvh) * hs, hs), softcap) - m);
      sum += e;
      const float wgt = drop.p > 0.0f ? (attn_keep(drop, b, h, t, t2) ? e * keep_scale : 0.0f) : e;
      const T* v = base + t2 * row_len + (int64_t)(NH + NKV + kvh) * hs;
      for (int j = 0; j < hs; j++) acc[j] += wgt * to_f32(v[j]);
    }
    T* o = out + ((int64_t)b * T_ + t) * NH * hs + (int64_t)h * hs;
    for (int j = 0; j < hs; j++) o[j] = from_f32<T>(acc[j] / sum);
    lse[((int64_t)b * NH + h) * T_ + t] = m + logf(sum);
  }
}

// ---- generation: the KV cache ----
// element e of the new tokens' k and v (B*Tn rows of NKV*hs each) into the cache [B, NKV, cap, hs]
template <typename T>
__global__ void kv_append_kernel(T* k_cache, T* v_cache, const T* qkv, int Tn, int p0, int cap, int NH, int NKV, int hs,
                                 int64_t n) {
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * hs, stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t r = e / ((int64_t)NKV * hs);  // the token's row, b * Tn + i
    const int kvh = (int)(e / hs % NKV), j = (int)(e % hs), b = (int)(r / Tn), i = (int)(r % Tn);
    const int64_t dst = (((int64_t)b * NKV + kvh) * cap + p0 + i) * hs + j;
    k_cache[dst] = qkv[r * row_len + (int64_t)(NH + kvh) * hs + j];
    v_cache[dst] = qkv[r * row_len + (int64_t)(NH + NKV + kvh) * hs + j];
  }
}

// a thread per new query row of head blockIdx.x, sequence blockIdx.y: two passes over its cached keys
template <typename T>
__global__ void attention_kv_kernel(T* out, const T* k_cache, const T* v_cache, const T* qkv, const int32_t* key_start,
                                    int Tn, int p0, int cap, int NH, int NKV, int hs, int window, float scale,
                                    float softcap) {
  const int h = (int)blockIdx.x, b = (int)blockIdx.y, kvh = h / (NH / NKV);
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * hs;
  const T* K = k_cache + ((int64_t)b * NKV + kvh) * cap * hs;
  const T* V = v_cache + ((int64_t)b * NKV + kvh) * cap * hs;
  const int start = key_start[b] > 0 ? key_start[b] : 0;
  float q[kMaxHeadSize], acc[kMaxHeadSize];
  for (int i = (int)threadIdx.x; i < Tn; i += (int)blockDim.x) {
    const int last = p0 + i, first = window > 0 && last - window + 1 > start ? last - window + 1 : start;
    const T* qr = qkv + ((int64_t)b * Tn + i) * row_len + (int64_t)h * hs;
    for (int j = 0; j < hs; j++) q[j] = to_f32(qr[j]) * scale, acc[j] = 0.0f;
    float m = -INFINITY, sum = 0.0f;
    for (int t2 = first; t2 <= last; t2++) m = fmaxf(m, cap_score(dot_row(q, K + (int64_t)t2 * hs, hs), softcap));
    for (int t2 = first; t2 <= last; t2++) {
      const float e = expf(cap_score(dot_row(q, K + (int64_t)t2 * hs, hs), softcap) - m);
      sum += e;
      for (int j = 0; j < hs; j++) acc[j] += e * to_f32(V[(int64_t)t2 * hs + j]);
    }
    T* o = out + ((int64_t)b * Tn + i) * NH * hs + (int64_t)h * hs;
    for (int j = 0; j < hs; j++) o[j] = from_f32<T>(first <= last ? acc[j] / sum : 0.0f);
  }
}

// D[o] = rowsum(dout * out) for each row o = (b, t, h) of out, in out's row order
template <typename T>
__global__ void attention_d_kernel(float* D, const T* dout, const T* out, int hs, int64_t rows) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += stride) {
    float s = 0.0f;
    for (int j = 0; j < hs; j++) s += to_f32(dout[i * hs + j]) * to_f32(out[i * hs + j]);
    D[i] = s;
  }
}

template <typename T>
__global__ void attention_dq_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                    const int32_t* doc, int T_, int NH, int NKV, int hs, Dropout drop, int window,
                                    float scale, float softcap) {
  const int h = (int)blockIdx.x, b = (int)blockIdx.y, kvh = h / (NH / NKV);
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * hs;
  const T* base = qkv + (int64_t)b * T_ * row_len;
  const float keep_scale = drop.p > 0.0f ? 1.0f / (1.0f - drop.p) : 1.0f;
  float q[kMaxHeadSize], dd[kMaxHeadSize], dq[kMaxHeadSize];
  for (int t = (int)threadIdx.x; t < T_; t += (int)blockDim.x) {
    const int64_t o = ((int64_t)b * T_ + t) * NH + h;  // out's row (b, t, h)
    for (int j = 0; j < hs; j++) {
      q[j] = to_f32(base[t * row_len + (int64_t)h * hs + j]) * scale;
      dd[j] = to_f32(dout[o * hs + j]);
      dq[j] = 0.0f;
    }
    const float lse_t = lse[((int64_t)b * NH + h) * T_ + t], Dt = D[o];
    for (int t2 = first_key(doc, b, T_, t, window); t2 <= t; t2++) {
      const T* k = base + t2 * row_len + (int64_t)(NH + kvh) * hs;
      const T* v = base + t2 * row_len + (int64_t)(NH + NKV + kvh) * hs;
      float dcap;
      const float p = expf(cap_score(dot_row(q, k, hs), softcap, &dcap) - lse_t);
      float dp = dot_row(dd, v, hs);
      if (drop.p > 0.0f) dp = attn_keep(drop, b, h, t, t2) ? dp * keep_scale : 0.0f;
      const float ds = p * (dp - Dt) * scale * dcap;
      for (int j = 0; j < hs; j++) dq[j] += ds * to_f32(k[j]);
    }
    T* out = dqkv + ((int64_t)b * T_ + t) * row_len + (int64_t)h * hs;
    for (int j = 0; j < hs; j++) out[j] = from_f32<T>(dq[j]);
  }
}

template <typename T>
__global__ void attention_dkv_kernel(T* dqkv, const T* dout, const T* qkv, const float* lse, const float* D,
                                     const int32_t* doc, int T_, int NH, int NKV, int hs, Dropout drop, int window,
                                     float scale, float softcap) {
  const int kvh = (int)blockIdx.x, b = (int)blockIdx.y, group = NH / NKV;
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * hs;
  const T* base = qkv + (int64_t)b * T_ * row_len;
  const float keep_scale = drop.p > 0.0f ? 1.0f / (1.0f - drop.p) : 1.0f;
  float k[kMaxHeadSize], v[kMaxHeadSize], dk[kMaxHeadSize], dv[kMaxHeadSize];
  for (int t2 = (int)threadIdx.x; t2 < T_; t2 += (int)blockDim.x) {
    for (int j = 0; j < hs; j++) {
      k[j] = to_f32(base[t2 * row_len + (int64_t)(NH + kvh) * hs + j]);
      v[j] = to_f32(base[t2 * row_len + (int64_t)(NH + NKV + kvh) * hs + j]);
      dk[j] = dv[j] = 0.0f;
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
      // the queries that see key t2: from t2 up to the window's end, within t2's document
      const int t_end = window > 0 && t2 + window < T_ ? t2 + window : T_;
      for (int t = t2; t < t_end; t++) {
        if (doc && doc[(int64_t)b * T_ + t] > t2) break;  // t and every later query are in a later document
        const T* q = base + t * row_len + (int64_t)h * hs;
        const int64_t o = ((int64_t)b * T_ + t) * NH + h;
        const T* dd = dout + o * hs;
        float s = 0.0f, dp = 0.0f;
        for (int j = 0; j < hs; j++) s += to_f32(q[j]) * k[j], dp += to_f32(dd[j]) * v[j];
        float dcap;
        const float p = expf(cap_score(s * scale, softcap, &dcap) - lse[((int64_t)b * NH + h) * T_ + t]);
        float pd = p;
        if (drop.p > 0.0f) {
          const bool keep = attn_keep(drop, b, h, t, t2);
          pd = keep ? p * keep_scale : 0.0f;
          dp = keep ? dp * keep_scale : 0.0f;
        }
        const float ds = p * (dp - D[o]) * scale * dcap;
        for (int j = 0; j < hs; j++) dk[j] += ds * to_f32(q[j]), dv[j] += pd * to_f32(dd[j]);
      }
    }
    T* row = dqkv + ((int64_t)b * T_ + t2) * row_len;
    for (int j = 0; j < hs; j++) {
      row[(int64_t)(NH + kvh) * hs + j] = from_f32<T>(dk[j]);
      row[(int64_t)(NH + NKV + kvh) * hs + j] = from_f32<T>(dv[j]);
    }
  }
}

// ---- loss: a block per row, then one block sums the rows in order ----
// One block per row of the logits, two passes over it: an online softmax (each thread a running max
// and its sum of exponentials, rescaled when the max grows; the threads combined in order), then
// dlogits in place. VEC logits at a time (16 bytes) when the row is 16-byte aligned, as the padded
// rows (Backend::vocab_pad) are; scalar otherwise.
__device__ __forceinline__ void softmax_step(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;  // m = -inf at first: 0 * 0 + 1
    m = x;
  } else if (x > -INFINITY) {  // a -inf logit adds nothing (and -inf - -inf would be NaN)
    s += expf(x - m);
  }
}

// A logit soft-capped (cap > 0: cap tanh(x / cap)), or as it is.
__device__ __forceinline__ float cap_logit(float x, float cap) { return cap > 0.0f ? cap * tanhf(x / cap) : x; }
// The loss's gradient of a logit whose capped value is y: g, times 1 - (y / cap)^2 with a cap.
__device__ __forceinline__ float cap_grad(float g, float y, float cap) {
  if (cap <= 0.0f) return g;
  const float t = y / cap;
  return g * (1.0f - t * t);
}

// cap > 0: the loss over the soft-capped logits, dlogits with respect to the logits before the cap
template <typename T, int VEC>
__global__ void cross_entropy_kernel(double* row_losses, T* dlogits, const T* logits, const int32_t* targets, int V,
                                     int64_t ld, float grad_scale, float cap, int* err) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * ld;
  T* dx = dlogits ? dlogits + row * ld : nullptr;
  const int tg = targets[row];
  const bool bad = tg != kIgnoreIndex && (tg < 0 || tg >= V);
  if (bad && threadIdx.x == 0) report(err, kErrTarget, tg, row, V);
  const int nvec = VEC > 1 ? V / VEC : 0;  // whole vectors; the tail is scalar
  if (tg == kIgnoreIndex || bad) {
    if (dx)
      for (int j = (int)threadIdx.x; j < V; j += (int)blockDim.x) dx[j] = from_f32<T>(0.0f);
    if (threadIdx.x == 0) row_losses[row] = 0.0;
    return;
  }
  const float target_logit = cap_logit(to_f32(x[tg]), cap);
  float m = -INFINITY, s = 0.0f;
  for (int i = (int)threadIdx.x; i < nvec; i += (int)blockDim.x) {
    const Vec<T, VEC> v = load_vec<T, VEC>(x + (int64_t)i * VEC);
#pragma unroll
    for (int k = 0; k < VEC; k++) softmax_step(cap_logit(to_f32(v.v[k]), cap), m, s);
  }
  for (int j = nvec * VEC + (int)threadIdx.x; j < V; j += (int)blockDim.x)
    softmax_step(cap_logit(to_f32(x[j]), cap), m, s);
  const float row_max = block_max_all(m);
  const double sum = block_sum_all(m == -INFINITY ? 0.0 : (double)s * exp((double)(m - row_max)));
  // every logit has been read: dlogits may now overwrite them
  if (dx) {
    const float f = (float)(grad_scale / sum);
    for (int i = (int)threadIdx.x; i < nvec; i += (int)blockDim.x) {
      const int64_t j0 = (int64_t)i * VEC;
      Vec<T, VEC> v = load_vec<T, VEC>(x + j0);
#pragma unroll
      for (int k = 0; k < VEC; k++) {
        const float y = cap_logit(to_f32(v.v[k]), cap);
        v.v[k] = from_f32<T>(cap_grad(expf(y - row_max) * f - (j0 + k == tg ? grad_scale : 0.0f), y, cap));
      }
      store_vec<T, VEC>(dx + j0, v);
    }
    for (int j = nvec * VEC + (int)threadIdx.x; j < V; j += (int)blockDim.x) {
      const float y = cap_logit(to_f32(x[j]), cap);
      dx[j] = from_f32<T>(cap_grad(expf(y - row_max) * f - (j == tg ? grad_scale : 0.0f), y, cap));
    }
  }
  if (threadIdx.x == 0) row_losses[row] = log(sum) + row_max - target_logit;
}

// x[row * ld + j] = cap tanh(x / cap) for j < V: a block per row
template <typename T>
__global__ void logit_softcap_kernel(T* x, int V, int64_t ld, float cap) {
  T* r = x + (int64_t)blockIdx.x * ld;
  for (int j = (int)threadIdx.x; j < V; j += (int)blockDim.x) r[j] = from_f32<T>(cap * tanhf(to_f32(r[j]) / cap));
}

__global__ void sum_rows_kernel(double* out, const double* rows, int64_t n) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += rows[i];
  s = block_sum_all(s);
  if (threadIdx.x == 0) out[0] += s;
}

template <typename Td, typename Ts>
__global__ void accumulate_mixed_kernel(Td* dst, const Ts* src, int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = from_f32<Td>(to_f32(dst[i]) + to_f32(src[i]));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// host launchers

template <typename Ta, typename Tout>
void matmul(Tout* out, const Ta* a, const Ta* b, const Ta* bias, int64_t M, int64_t N, int64_t K, bool trans_a,
            bool trans_b, bool accumulate, int64_t ld_a, int64_t ld_out, Stream stream) {
  LLMT_CHECK(M >= 0 && N >= 0 && K >= 0, "cuda matmul: bad shape %lld x %lld x %lld", (long long)M, (long long)N,
             (long long)K);
  if (M == 0 || N == 0) return;
  LLMT_CHECK((M + kMmTile - 1) / kMmTile <= 65535, "cuda matmul: %lld rows exceed the grid", (long long)M);
  LLMT_LAUNCH(matmul_kernel, dim3(blocks_for(N, kMmTile), blocks_for(M, kMmTile)), kMmThreads, 0, stream, out, a, b,
              bias, M, N, K, trans_a, trans_b, accumulate, ld_a, ld_out);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void bias_backward(float* dbias, const T* dout, int64_t M, int64_t N, float* partials, Stream stream) {
  column_sums<T, kBiasGrad>(dbias, nullptr, dout, (const T*)nullptr, nullptr, nullptr, M, (int)N, partials, stream);
}

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C, int V, int* err,
                       Stream stream) {
  const int64_t n = (int64_t)B * T_ * C;
  if (n == 0) return;
  LLMT_LAUNCH(embedding_forward_kernel, grid_stride_blocks(n), kBlock, 0, stream, out, tokens, wte, wpe, T_, C, V, n, err);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C, int V,
                        int* err, Stream stream) {
  if (C == 0) return;
  const int64_t N = (int64_t)B * T_;
  // classes of ids: enough threads to fill a GPU at training sizes (256 x C), few where a class
  // would hold only a handful of rows (every thread reads every id: small batches, the emulator)
  const int buckets = (int)std::max<int64_t>(1, std::min<int64_t>({256, V, N / 64}));
  LLMT_LAUNCH(embedding_backward_wte_kernel, dim3(blocks_for(C, kBlock), (unsigned)buckets), kBlock, 0, stream, dwte,
              dout, tokens, N, C, V, buckets, err);
  CUDA_CHECK_LAUNCH();
  if (dwpe) {
    LLMT_LAUNCH(embedding_backward_wpe_kernel, grid_stride_blocks((int64_t)T_ * C), kBlock, 0, stream, dwpe, dout, B,
                T_, C);
    CUDA_CHECK_LAUNCH();
  }
}

// The vectorised norms' launch for rows of C elements of T: threads per block and K (16-byte chunks a
// thread holds: 1, 2, 4 or 8), or K = 0 where the scalar kernels take the call (C no multiple of the
// vector, a pointer off 16 bytes, or a row over kBlock * kNormMaxChunks chunks).
struct NormVec {
  int threads = 0, K = 0;
};
template <typename T>
NormVec norm_vec(int C, std::initializer_list<const void*> ptrs) {
  constexpr int V = 16 / sizeof(T);
  NormVec nv;
  if (C % V) return nv;
  for (const void* p : ptrs)
    if (!aligned(p, 16)) return nv;
  const int chunks = C / V;
  nv.threads = std::min(kBlock, (chunks + WARP_SIZE - 1) / WARP_SIZE * WARP_SIZE);
  const int per = (chunks + nv.threads - 1) / nv.threads;
  nv.K = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : per <= kNormMaxChunks ? 8 : 0;
  return nv;
}
// Launches kernel<T, K> for the K asked for.
#define LLMT_NORM_VEC_LAUNCH(kernel, nv, N, stream, ...)                                                      \
  do {                                                                                                     \
    if ((nv).K == 1) LLMT_LAUNCH((kernel<T, 1>), (unsigned)(N), (nv).threads, 0, stream, __VA_ARGS__);    \
    else if ((nv).K == 2) LLMT_LAUNCH((kernel<T, 2>), (unsigned)(N), (nv).threads, 0, stream, __VA_ARGS__); \
    else if ((nv).K == 4) LLMT_LAUNCH((kernel<T, 4>), (unsigned)(N), (nv).threads, 0, stream, __VA_ARGS__); \
    else LLMT_LAUNCH((kernel<T, 8>), (unsigned)(N), (nv).threads, 0, stream, __VA_ARGS__);                \
  } while (0)

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t N, int C, float eps,
                       Stream stream) {
  if (N == 0) return;
  const NormVec nv = norm_vec<T>(C, {out, x, w, b});
  if (nv.K)
    LLMT_NORM_VEC_LAUNCH(layernorm_forward_vec_kernel, nv, N, stream, out, mean, rstd, x, w, b, C, eps);
  else
    LLMT_LAUNCH(layernorm_forward_kernel, (unsigned)N, row_threads(C), 0, stream, out, mean, rstd, x, w, b, C, eps);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void layernorm_backward(T* dx, float* dw, float* db, const T* dout, const T* x, const T* w, const float* mean,
                        const float* rstd, int64_t N, int C, float* partials, Stream stream) {
  if (N == 0) return;
  const NormVec nv = norm_vec<T>(C, {dx, dout, x, w});
  if (nv.K)
    LLMT_NORM_VEC_LAUNCH(layernorm_backward_dx_vec_kernel, nv, N, stream, dx, dout, x, w, mean, rstd, C);
  else
    LLMT_LAUNCH(layernorm_backward_dx_kernel, (unsigned)N, row_threads(C), 0, stream, dx, dout, x, w, mean, rstd, C);
  CUDA_CHECK_LAUNCH();
  column_sums<T, kLayerNormGrads>(dw, db, dout, x, mean, rstd, N, C, partials, stream);
}

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t N, int C, float eps, float w_off,
                     Stream stream) {
  if (N == 0) return;
  const NormVec nv = norm_vec<T>(C, {out, x, w});
  if (nv.K)
    LLMT_NORM_VEC_LAUNCH(rmsnorm_forward_vec_kernel, nv, N, stream, out, rstd, x, w, C, eps, w_off);
  else
    LLMT_LAUNCH(rmsnorm_forward_kernel, (unsigned)N, row_threads(C), 0, stream, out, rstd, x, w, C, eps, w_off);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd, int64_t N, int C,
                      float w_off, float* partials, Stream stream) {
  if (N == 0) return;
  const NormVec nv = norm_vec<T>(C, {dx, dout, x, w});
  if (nv.K)
    LLMT_NORM_VEC_LAUNCH(rmsnorm_backward_dx_vec_kernel, nv, N, stream, dx, dout, x, w, rstd, C, w_off);
  else
    LLMT_LAUNCH(rmsnorm_backward_dx_kernel, (unsigned)N, row_threads(C), 0, stream, dx, dout, x, w, rstd, C, w_off);
  CUDA_CHECK_LAUNCH();
  column_sums<T, kRmsNormGrad>(dw, nullptr, dout, x, (const float*)nullptr, rstd, N, C, partials, stream);
}

template <typename T>
void head_rmsnorm_forward(T* out, float* rstd, const T* in, const T* wq, const T* wk, int64_t N, int NH, int NKV,
                          int hs, float eps, float w_off, Stream stream) {
  const int64_t pieces = N * (NH + 2 * NKV);
  if (pieces == 0) return;
  LLMT_CHECK(pieces <= 0x7fffffff, "cuda head_rmsnorm: %lld heads exceed a grid", (long long)pieces);
  LLMT_LAUNCH(head_rmsnorm_forward_kernel, (unsigned)pieces, row_threads(hs), 0, stream, out, rstd, in, wq, wk, NH, NKV,
              hs, eps, w_off);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void head_rmsnorm_backward(T* din, float* dwq, float* dwk, const T* dout, const T* in, const T* wq, const T* wk,
                           const float* rstd, int64_t N, int NH, int NKV, int hs, float w_off, float* partials,
                           Stream stream) {
  const int64_t pieces = N * (NH + 2 * NKV);
  if (pieces == 0) return;
  LLMT_CHECK(pieces <= 0x7fffffff, "cuda head_rmsnorm: %lld heads exceed a grid", (long long)pieces);
  // the weights' gradients first: din may be dout, which the dx kernel overwrites
  const int chunks = column_chunks(N);  // partials: column_partials_bytes(N, hs), [2][chunks][hs]
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  LLMT_LAUNCH(head_rmsnorm_dw_partials_kernel, dim3(blocks_for(hs, WARP_SIZE), (unsigned)(2 * chunks)), WARP_SIZE, 0,
              stream, partials, dout, in, rstd, N, NH, NKV, hs, chunks, rows_per_chunk);
  CUDA_CHECK_LAUNCH();
  LLMT_LAUNCH(head_rmsnorm_backward_dx_kernel, (unsigned)pieces, row_threads(hs), 0, stream, din, dout, in, wq, wk, rstd,
              NH, NKV, hs, w_off);
  CUDA_CHECK_LAUNCH();
  LLMT_LAUNCH(column_finish_kernel, blocks_for(hs, kBlock), kBlock, 0, stream, dwq, (float*)nullptr, partials, chunks,
              hs);
  CUDA_CHECK_LAUNCH();
  LLMT_LAUNCH(column_finish_kernel, blocks_for(hs, kBlock), kBlock, 0, stream, dwk, (float*)nullptr,
              partials + (int64_t)chunks * hs, chunks, hs);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void rope(T* qkv, const int32_t* pos, int B, int T_, int NH, int NKV, int hs, const RopeSpec& rope, float sign,
          Stream stream) {
  LLMT_CHECK(hs % 2 == 0, "cuda rope: head size %d is odd", hs);
  const int64_t n = (int64_t)B * T_ * (NH + NKV) * (rope_dim(rope, hs) / 2);
  if (n == 0) return;
  LLMT_LAUNCH(rope_kernel, grid_stride_blocks(n), kBlock, 0, stream, qkv, pos, T_, NH, NKV, hs, rope, sign, n);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void dropout(T* x, int B, int T_, int C, const Dropout& d, Stream stream) {
  if (!d.active()) return;
  LLMT_CHECK(d.p < 1.0f, "dropout: p = %g must be below 1", d.p);
  const int64_t n = (int64_t)B * T_ * C;
  if (n == 0) return;
  LLMT_LAUNCH(dropout_kernel, grid_stride_blocks(n), kBlock, 0, stream, x, T_, C, d, n);
  CUDA_CHECK_LAUNCH();
}

// Threads per attention block: enough for short sequences, a block per (head, batch) either way.
inline int attention_threads(int T_) { return T_ >= 128 ? 128 : (T_ + WARP_SIZE - 1) / WARP_SIZE * WARP_SIZE; }

template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, const int32_t* doc, int B, int T_, int NH, int NKV, int hs,
                       const Dropout& drop, int window, float scale, float softcap, Stream stream) {
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  LLMT_CHECK(hs <= kMaxHeadSize, "cuda attention: head size %d over %d", hs, kMaxHeadSize);
  if (B == 0 || T_ == 0) return;
  LLMT_LAUNCH(attention_forward_kernel, dim3(NH, B), attention_threads(T_), 0, stream, out, lse, qkv, doc, T_, NH, NKV,
              hs, drop, window, scale, softcap);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_row_dots(float* D, const T* dout, const T* out, int64_t rows, int hs, Stream stream) {
  if (rows == 0) return;
  LLMT_LAUNCH(attention_d_kernel, grid_stride_blocks(rows), kBlock, 0, stream, D, dout, out, hs, rows);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* scratch_d,
                        const int32_t* doc, int B, int T_, int NH, int NKV, int hs, const Dropout& drop, int window,
                        float scale, float softcap, Stream stream) {
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  LLMT_CHECK(hs <= kMaxHeadSize, "cuda attention: head size %d over %d", hs, kMaxHeadSize);
  if (B == 0 || T_ == 0) return;
  attention_row_dots(scratch_d, dout, out, (int64_t)B * T_ * NH, hs, stream);
  LLMT_LAUNCH(attention_dq_kernel, dim3(NH, B), attention_threads(T_), 0, stream, dqkv, dout, qkv, lse, scratch_d, doc,
              T_, NH, NKV, hs, drop, window, scale, softcap);
  CUDA_CHECK_LAUNCH();
  LLMT_LAUNCH(attention_dkv_kernel, dim3(NKV, B), attention_threads(T_), 0, stream, dqkv, dout, qkv, lse, scratch_d,
              doc, T_, NH, NKV, hs, drop, window, scale, softcap);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void attention_kv(T* out, T* k_cache, T* v_cache, const T* qkv, const int32_t* key_start, int B, int Tn, int p0, int cap,
                  int NH, int NKV, int hs, int window, float scale, float softcap, Stream stream) {
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  LLMT_CHECK(hs <= kMaxHeadSize, "cuda attention: head size %d over %d", hs, kMaxHeadSize);
  const int64_t n = (int64_t)B * Tn * NKV * hs;
  if (n == 0) return;
  LLMT_LAUNCH(kv_append_kernel, grid_stride_blocks(n), kBlock, 0, stream, k_cache, v_cache, qkv, Tn, p0, cap, NH, NKV,
              hs, n);
  CUDA_CHECK_LAUNCH();
  LLMT_LAUNCH(attention_kv_kernel, dim3(NH, B), attention_threads(Tn), 0, stream, out, k_cache, v_cache, qkv, key_start,
              Tn, p0, cap, NH, NKV, hs, window, scale, softcap);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void cross_entropy(double* loss_sum, double* row_losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                   int V, int64_t ld, float grad_scale, float softcap, int* err, Stream stream) {
  if (N == 0) return;
  // 16-byte loads when every row starts 16-byte aligned
  if (aligned(logits, 16) && aligned(dlogits, 16) && (ld * (int64_t)sizeof(T)) % 16 == 0)
    LLMT_LAUNCH((cross_entropy_kernel<T, (int)(16 / sizeof(T))>), (unsigned)N, row_threads(V), 0, stream, row_losses, dlogits, logits,
                targets, V, ld, grad_scale, softcap, err);
  else
    LLMT_LAUNCH((cross_entropy_kernel<T, 1>), (unsigned)N, row_threads(V), 0, stream, row_losses, dlogits, logits,
                targets, V, ld, grad_scale, softcap, err);
  CUDA_CHECK_LAUNCH();
  LLMT_LAUNCH(sum_rows_kernel, 1, 1024, 0, stream, loss_sum, row_losses, N);
  CUDA_CHECK_LAUNCH();
}

template <typename T>
void logit_softcap(T* x, int64_t N, int V, int64_t ld, float cap, Stream stream) {
  if (N == 0) return;
  LLMT_CHECK(N <= 0x7fffffff, "cuda logit_softcap: %lld rows exceed a grid", (long long)N);
  LLMT_LAUNCH(logit_softcap_kernel, (unsigned)N, row_threads(V), 0, stream, x, V, ld, cap);
  CUDA_CHECK_LAUNCH();
}

template <typename Td, typename Ts>
void accumulate_mixed(Td* dst, const Ts* src, int64_t n, Stream stream) {
  if (n == 0) return;
  LLMT_LAUNCH(accumulate_mixed_kernel, grid_stride_blocks(n), kBlock, 0, stream, dst, src, n);
  CUDA_CHECK_LAUNCH();
}

// the instantiations the backend uses
#define LLMT_ACT_TYPES(X) X(float) X(uint16_t)
// ---- packed documents as cuDNN's ragged batch (cudnn_attention.cpp) ----
constexpr int kDocThreads = 1024;

// One block. Each thread counts the document starts in its chunk of the N = B T tokens, the block
// scans the counts, then each thread writes the documents that begin in its chunk, in order:
// offsets in elements (the document's first token times the row stride of qkv, of out and of the
// token-major stats) and, where a document ends in its chunk, its length. Slots past the last
// document are length 0 with offsets at the end. Nothing is written past `slots`.
__global__ void document_batch_kernel(int32_t* seq_len, int32_t* qkv_off, int32_t* out_off, int32_t* stats_off,
                                      const int32_t* doc, int T_, int64_t N, int slots, int R, int C, int NH) {
  LLMT_SHARED(int, before, [kDocThreads + 1]);  // the starts before each thread's chunk; [blockDim]: all
  const int tid = threadIdx.x, threads = blockDim.x;
  const int64_t per = (N + threads - 1) / threads, lo = tid * per < N ? tid * per : N, hi = lo + per < N ? lo + per : N;
  int mine = 0;
  for (int64_t g = lo; g < hi; g++) mine += doc[g] == (int)(g % T_);
  before[tid + 1] = mine;
  __syncthreads();
  if (tid == 0) {
    before[0] = 0;
    for (int i = 1; i <= threads; i++) before[i] += before[i - 1];
  }
  __syncthreads();
  int k = before[tid] - 1;  // the document the token before this chunk is in
  for (int64_t g = lo; g < hi; g++) {
    const int t = (int)(g % T_), d = doc[g];
    if (d == t && ++k < slots) {
      qkv_off[k] = (int32_t)(g * R);
      out_off[k] = (int32_t)(g * C);
      stats_off[k] = (int32_t)(g * NH);
    }
    const bool last = g + 1 == N || t + 1 == T_ || doc[g + 1] == t + 1;
    if (last && k >= 0 && k < slots) seq_len[k] = t - d + 1;
  }
  for (int j = before[threads] + tid; j <= slots; j += threads) {
    if (j < slots) seq_len[j] = 0;
    qkv_off[j] = (int32_t)(N * R);
    out_off[j] = (int32_t)(N * C);
    stats_off[j] = (int32_t)(N * NH);
  }
}

void document_batch(int32_t* seq_len, int32_t* qkv_off, int32_t* out_off, int32_t* stats_off, const int32_t* doc, int B,
                    int T_, int slots, int R, int C, int NH, Stream stream) {
  const int64_t N = (int64_t)B * T_;
  LLMT_CHECK(N * R < INT32_MAX && slots >= 1, "document_batch: %lld tokens of %d values overflow int32 offsets",
             (long long)N, R);
  LLMT_LAUNCH(document_batch_kernel, 1, kDocThreads, 0, stream, seq_len, qkv_off, out_off, stats_off, doc, T_, N, slots,
              R, C, NH);
  CUDA_CHECK_LAUNCH();
}

// lse [B, NH, T] from token-major stats [B*T, NH] (to_lse), or the other way
__global__ void stats_layout_kernel(float* dst, const float* src, int T_, int NH, int64_t n, bool to_lse) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t b = i / ((int64_t)NH * T_);
    const int h = (int)(i / T_ % NH), t = (int)(i % T_);
    const int64_t tok = ((b * T_ + t) * NH + h);
    if (to_lse) dst[i] = src[tok];
    else dst[tok] = src[i];
  }
}

void stats_to_lse(float* lse, const float* stats, int B, int T_, int NH, Stream stream) {
  const int64_t n = (int64_t)B * NH * T_;
  if (n == 0) return;
  LLMT_LAUNCH(stats_layout_kernel, grid_stride_blocks(n), kBlock, 0, stream, lse, stats, T_, NH, n, true);
  CUDA_CHECK_LAUNCH();
}

void lse_to_stats(float* stats, const float* lse, int B, int T_, int NH, Stream stream) {
  const int64_t n = (int64_t)B * NH * T_;
  if (n == 0) return;
  LLMT_LAUNCH(stats_layout_kernel, grid_stride_blocks(n), kBlock, 0, stream, stats, lse, T_, NH, n, false);
  CUDA_CHECK_LAUNCH();
}

#define LLMT_INSTANTIATE(T)                                                                                          \
  template void matmul<T, T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, bool, bool, bool, int64_t, \
                             int64_t, Stream);                                                                       \
  template void bias_backward<T>(float*, const T*, int64_t, int64_t, float*, Stream);                                        \
  template void embedding_forward<T>(T*, const int32_t*, const T*, const T*, int, int, int, int, int*, Stream);      \
  template void embedding_backward<T>(float*, float*, const T*, const int32_t*, int, int, int, int, int*, Stream);  \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const T*, const T*, int64_t, int, float, Stream); \
  template void layernorm_backward<T>(T*, float*, float*, const T*, const T*, const T*, const float*, const float*,   \
                                      int64_t, int, float*, Stream);                                                 \
  template void rmsnorm_forward<T>(T*, float*, const T*, const T*, int64_t, int, float, float, Stream);              \
  template void rmsnorm_backward<T>(T*, float*, const T*, const T*, const T*, const float*, int64_t, int, float,     \
                                    float*, Stream);                                                                 \
  template void head_rmsnorm_forward<T>(T*, float*, const T*, const T*, const T*, int64_t, int, int, int, float,       \
                                        float, Stream);                                                              \
  template void head_rmsnorm_backward<T>(T*, float*, float*, const T*, const T*, const T*, const T*, const float*,    \
                                         int64_t, int, int, int, float, float*, Stream);                             \
  template void rope<T>(T*, const int32_t*, int, int, int, int, int, const RopeSpec&, float, Stream);                         \
  template void attention_kv<T>(T*, T*, T*, const T*, const int32_t*, int, int, int, int, int, int, int, int, float,    \
                                float, Stream);                                                                      \
  template void dropout<T>(T*, int, int, int, const Dropout&, Stream);                                               \
  template void attention_forward<T>(T*, float*, const T*, const int32_t*, int, int, int, int, int, const Dropout&,   \
                                     int, float, float, Stream);                                                                        \
  template void attention_row_dots<T>(float*, const T*, const T*, int64_t, int, Stream);                           \
  template void attention_backward<T>(T*, const T*, const T*, const T*, const float*, float*, const int32_t*, int, int, \
                                      int, int, int,                                                                 \
                                      const Dropout&, int, float, float, Stream);                                                       \
  template void cross_entropy<T>(double*, double*, T*, const T*, const int32_t*, int64_t, int, int64_t, float, float, \
                                 int*, Stream);                                                                    \
  template void logit_softcap<T>(T*, int64_t, int, int64_t, float, Stream);
LLMT_ACT_TYPES(LLMT_INSTANTIATE)
#undef LLMT_INSTANTIATE
#undef LLMT_ACT_TYPES
template void matmul<uint16_t, float>(float*, const uint16_t*, const uint16_t*, const uint16_t*, int64_t, int64_t,
                                      int64_t, bool, bool, bool, int64_t, int64_t, Stream);
template void accumulate_mixed<float, uint16_t>(float*, const uint16_t*, int64_t, Stream);
template void accumulate_mixed<uint16_t, float>(uint16_t*, const float*, int64_t, Stream);

}  // namespace cuda
}  // namespace llmt
