// Causal self-attention on tensor cores, forward and backward, in the manner of FlashAttention-2
// (Dao, 2023): bf16 in, f32 accumulation, head sizes 64 and 128, grouped-query heads, dropout on the
// probabilities with the counter-based masks every backend draws, packed documents, a sliding window,
// any score scale and Gemma 2's soft cap (softcap tanh(s / softcap), its own instantiation: tanhf on
// each score, and 1 - tanh^2 in dS), the log-sum-exp (of the capped scores) kept for the backward,
// and a backward without atomics, so a run repeats bit for bit.
// A row's keys run from its first key (its document's start, or t - window + 1 when later) to itself:
// key tiles wholly outside that band are never loaded or computed, the tiles it cuts are masked.
//
// Forward, a block of 4 warps per 64 query rows of one head of one sequence (grid: query tiles
// x heads x batch, the longest walks first); each warp owns 16 rows:
//   Q's tile -> shared memory (cp.async, 16 bytes a copy) -> A fragments, in registers for the walk;
//   for each 64-key tile from the block's first row's first key up to the block's diagonal (a warp
//   skips a tile before its own first row's window), K and V double-buffered: the next tile's
//   cp.async is in flight while this one computes;
//     S = Q K^T (mma.sync, K by ldmatrix x4); the causal, document and window masks on the tiles that need
//     them only; the running row maximum in log2 units (the softmax scale times log2(e) folded in,
//     so each probability is one FFMA and one ex2); P rounded to bf16 by cvt.rn.bf16x2;
//     O += P V (P's accumulators reused as A fragments, V by ldmatrix x4 .trans);
//   O / rowsum through shared memory to 16-byte stores; lse = (m + log2 rowsum) ln 2.
// Row sums stay per lane until the end and are added over the row's four lanes in a fixed order.
//
// Backward, 5 matrix products per pair of tiles as FlashAttention-2 (S and dP computed once):
//   S^T = K Q^T, dP^T = V dO^T, P = exp(S scale - lse), dS = P (dP - D) scale (D = rowsum(dO O),
//   attention_row_dots), dV += P_drop^T dO, dK += dS^T Q, dQ += dS K; with a soft cap P = exp(cap(S
//   scale) - lse) and dS takes the factor 1 - tanh^2.
// A block of 4 warps per (split, kv head, sequence) walks key tiles split, split + splits, ...; for
// each it holds K and V in shared memory, each warp 16 keys' dK and dV in registers, and walks the
// query tiles from the diagonal to the last whose first row still sees a key of the tile (document
// and window) for every head of the group, Q and dO double-buffered by
// cp.async (at head size 64). dS goes through shared memory to form dQ's A fragments, and each
// warp adds its 16 rows of dQ into the split's own f32 partial sums in global memory: a split's
// key tiles add in increasing order, and no two blocks write one element. flash_dq_reduce_kernel
// then adds the splits' partials in split order and rounds dQ to bf16 once. The number of splits
// follows from the shape alone (cuda_flash_backward_splits), so the result does not depend on the GPU.
#include "kernels/cuda/flash_attention.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace llmt {
namespace cuda {
namespace {

constexpr int kTile = 64;      // query rows and keys per tile
constexpr int kThreads = 128;  // 4 warps, 16 rows (forward) or 16 keys (backward) each
constexpr float kLog2e = 1.4426950408889634f;

// A tile of 64 rows of one head into shared memory (row stride HS + 8 elements: 16-byte aligned, and
// ldmatrix's eight row addresses fall in different banks), 16 bytes a cp.async, zeros past the
// sequence (their copies read nothing, from the sequence's first row). `src` is the sequence's first
// row, `col0` the head's first element in a row.
template <int HS>
__device__ __forceinline__ void load_tile_async(uint16_t* dst, const uint16_t* src, int row_len, int col0, int r0,
                                                int T_) {
  constexpr int LD = HS + 8, CHUNKS = HS / 8, ROWS = kThreads / CHUNKS;  // rows a pass of the block covers
  const int r = (int)threadIdx.x / CHUNKS, cc = (int)threadIdx.x % CHUNKS;
  uint16_t* to = dst + r * LD + cc * 8;  // a base and constant offsets: no address kept per pass
  const uint16_t* from = src + (int64_t)(r0 + r) * row_len + col0 + cc * 8;
#pragma unroll
  for (int k = 0; k < kTile / ROWS; k++) {
    const bool valid = r0 + r + k * ROWS < T_;
    cp_async_16(to + k * ROWS * LD, valid ? from + (int64_t)k * ROWS * row_len : src, valid);
  }
}

// The first position of row t's document in sequence b (packed documents), 0 without them or past
// the sequence.
__device__ __forceinline__ int doc_start_of(const int32_t* doc, int b, int T_, int t) {
  return doc && t < T_ ? doc[(int64_t)b * T_ + t] : 0;
}
// The first key row t sees: its document's start, or its sliding window's (t - window + 1; window 0:
// none) when later. Never decreases with t, as document starts do not.
__device__ __forceinline__ int first_key_of(const int32_t* doc, int b, int T_, int t, int window) {
  const int d0 = doc_start_of(doc, b, T_, t), w0 = window > 0 ? t - window + 1 : 0;
  return d0 > w0 ? d0 : w0;
}

// tanh(x) = 1 - 2 / (e^2x + 1): one ex2 and one approximate reciprocal (tanhf takes about 20
// instructions), within a few 1e-7 of tanh absolutely, which is what a capped score's softmax sees
// (times the cap: about 1e-5 at Gemma 2's 50, against the 4e-3 of P's bf16 rounding); e^2x past
// the float range gives 1 (and -1 below), as tanh.
__device__ __forceinline__ float fast_tanh(float x) {
  return 1.0f - __fdividef(2.0f, fast_exp2(x * (2.0f * kLog2e)) + 1.0f);
}

// A's fragment (16 rows x 16 columns) of a row-major tile in shared memory: one ldmatrix x4.
__device__ __forceinline__ void load_a(uint32_t a[4], const uint16_t* tile, int ld, int row0, int col0) {
  const int l = (int)threadIdx.x % WARP_SIZE;
  ldmatrix<4, false>(a, &tile[(row0 + l % 8 + (l / 8) % 2 * 8) * ld + col0 + l / 16 * 8]);
}
// B's fragments of two n-tiles (16 columns of B) and one k-step, where B = M^T and M (rows = B's
// columns, 16 of them from row0) is stored row-major: one ldmatrix x4. b[0..1] n-tile 0, b[2..3] 1.
__device__ __forceinline__ void load_b_rows(uint32_t b[4], const uint16_t* tile, int ld, int row0, int col0) {
  const int l = (int)threadIdx.x % WARP_SIZE;
  ldmatrix<4, false>(b, &tile[(row0 + l / 16 * 8 + l % 8) * ld + col0 + (l / 8) % 2 * 8]);
}
// The same where B itself (16 k-rows from row0, 16 columns from col0) is stored row-major (k-major):
// one ldmatrix x4 .trans.
__device__ __forceinline__ void load_b_trans(uint32_t b[4], const uint16_t* tile, int ld, int row0, int col0) {
  const int l = (int)threadIdx.x % WARP_SIZE;
  ldmatrix<4, true>(b, &tile[(row0 + (l / 8) % 2 * 8 + l % 8) * ld + col0 + l / 16 * 8]);
}
__device__ __forceinline__ void mma2(float d0[4], float d1[4], const uint32_t a[4], const uint32_t b[4]) {
  const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
  mma_m16n8k16_bf16(d0, a, b0, d0);
  mma_m16n8k16_bf16(d1, a, b1, d1);
}
// The A fragments of a 16 x 16 step from two n-tiles of f32 accumulators (rows as the accumulators').
__device__ __forceinline__ void accumulators_as_a(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack_bf16x2(c0[0], c0[1]);
  a[1] = pack_bf16x2(c0[2], c0[3]);
  a[2] = pack_bf16x2(c1[0], c1[1]);
  a[3] = pack_bf16x2(c1[2], c1[3]);
}

// ---- forward ----

template <int HS>
constexpr size_t forward_shared_bytes() {
  return (size_t)2 * 2 * kTile * (HS + 8) * sizeof(uint16_t);  // K and V in two stages; Q in stage 1's K first
}

// SOFTCAP: Gemma 2's scores, softcap tanh(scale S / softcap), a separate instantiation so that the
// other kernels' loop is as it was.
template <int HS, bool DROPOUT, bool SOFTCAP>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(uint16_t* out, float* lse, const uint16_t* qkv, const int32_t* doc, int T_, int NH, int NKV,
                         Dropout drop, int window, float scale, float softcap) {
  constexpr int LD = HS + 8, KS = HS / 16, NS = HS / 8;  // k-steps over the head, 8-wide n-tiles of it
  uint16_t* skv = LLMT_DYNAMIC_SHARED(uint16_t);  // [stage][K, V][kTile][LD]
  uint16_t* sq = skv + 2 * kTile * LD;             // Q's tile, in stage 1's K until Q is in registers
  const int qt = (int)(gridDim.x - 1 - blockIdx.x), h = (int)blockIdx.y, b = (int)blockIdx.z, kvh = h / (NH / NKV);
  const int tid = (int)threadIdx.x, warp = tid / WARP_SIZE, l = tid % WARP_SIZE, g = l / 4, t4 = l % 4;
  const int row_len = (NH + 2 * NKV) * HS;  // elements per row
  const uint16_t* base = qkv + (int64_t)b * T_ * row_len;
  // S's factor into log2 units: the scale times log2(e), or with a cap (S then holds tanh(scale S /
  // softcap)) the cap times log2(e)
  const float c = (SOFTCAP ? softcap : scale) * kLog2e, keep_scale = DROPOUT ? 1.0f / (1.0f - drop.p) : 1.0f;
  const float cap_in = SOFTCAP ? scale / softcap : 0.0f;
  const int q_first = qt * kTile, q0 = q_first + warp * 16;  // the lane's rows: q0 + g, q0 + g + 8
  const int q_last = (q_first + kTile < T_ ? q_first + kTile : T_) - 1;

  load_tile_async<HS>(sq, base, row_len, h * HS, q_first, T_);
  cp_async_commit();
  // from the tile holding the block's first row's first key: no row sees a key before it
  const int kt0 = first_key_of(doc, b, T_, q_first, window) / kTile, kt1 = q_last / kTile;
  auto load_kv = [&](int kt, int stage) {
    uint16_t* sk = skv + stage * 2 * kTile * LD;
    load_tile_async<HS>(sk, base, row_len, (NH + kvh) * HS, kt * kTile, T_);
    load_tile_async<HS>(sk + kTile * LD, base, row_len, (NH + NKV + kvh) * HS, kt * kTile, T_);
    cp_async_commit();
  };
  load_kv(kt0, 0);
  cp_async_wait<1>();  // Q has landed
  __syncthreads();
  uint32_t qf[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; kk++) load_a(qf[kk], sq, LD, warp * 16, kk * 16);
  __syncthreads();  // every warp has Q before stage 1 is loaded over it

  float o[NS][4];
#pragma unroll
  for (int n = 0; n < NS; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f};  // rows g and g+8: max (log2 units), this lane's sum
  int first[2];  // the first key of each row: its document's start or its window's, else 0
  for (int r = 0; r < 2; r++) first[r] = first_key_of(doc, b, T_, q0 + g + 8 * r, window);
  // first keys never decrease with the row: the warp's last row has the latest, its first the earliest
  const int doc_last = first_key_of(doc, b, T_, q0 + 15 < T_ ? q0 + 15 : T_ - 1, window);
  const int band_first = window > 0 ? q0 - window + 1 : 0;

  for (int kt = kt0; kt <= kt1; kt++) {
    const int stage = (kt - kt0) & 1;
    if (kt < kt1) {
      load_kv(kt + 1, stage ^ 1);  // in flight while this tile computes
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this tile, from every thread's copies
    const uint16_t* sk = skv + stage * 2 * kTile * LD;
    const uint16_t* sv = sk + kTile * LD;
    const int k0 = kt * kTile;
    // a tile wholly after the warp's rows, or wholly before its first row's window, adds nothing to them
    if (k0 <= q0 + 15 && k0 + kTile > band_first) {
      // S = Q K^T: 8 n-tiles of 8 keys
      float s[kTile / 8][4];
#pragma unroll
      for (int n = 0; n < kTile / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int np = 0; np < kTile / 16; np++)
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
          uint32_t kb[4];
          load_b_rows(kb, sk, LD, np * 16, kk * 16);
          mma2(s[2 * np], s[2 * np + 1], qf[kk], kb);
        }
      if (SOFTCAP)  // before the masks, as transformers caps before adding its mask
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
          for (int i = 0; i < 4; i++) s[n][i] = fast_tanh(s[n][i] * cap_in);
      // the causal, document and window masks, only where a key may lie after a row or before its first key
      if (k0 + kTile - 1 > q0 || k0 < doc_last) {
#pragma unroll
        for (int n = 0; n < kTile / 8; n++)
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const int row = q0 + g + (i >= 2 ? 8 : 0), key = k0 + n * 8 + 2 * t4 + (i & 1);
            if (key > row || key < first[i / 2]) s[n][i] = -INFINITY;
          }
      }
      // the new row maxima (over the row's four lanes), in log2 units
      float mx[2] = {-INFINITY, -INFINITY}, m_use[2];
#pragma unroll
      for (int n = 0; n < kTile / 8; n++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
      }
#pragma unroll
      for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m[r], mx[r] * c);
        // -inf while a row has seen only masked keys (a later document's row in an earlier tile):
        // its sums stay 0, and exponents are taken from 0 so that none is exp2(-inf + inf)
        m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = fast_exp2(m[r] - m_use[r]);
        m[r] = m_new;
        lsum[r] *= alpha;
#pragma unroll
        for (int n = 0; n < NS; n++) o[n][2 * r] *= alpha, o[n][2 * r + 1] *= alpha;
      }
      // P = 2^(S c - m): the sums take every probability, the product with V the kept ones, scaled
#pragma unroll
      for (int n = 0; n < kTile / 8; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
          const float e = fast_exp2(fmaf(s[n][i], c, -m_use[i / 2]));
          lsum[i / 2] += e;
          float w = e;
          if (DROPOUT) {
            const int row = q0 + g + (i >= 2 ? 8 : 0), key = k0 + n * 8 + 2 * t4 + (i & 1);
            w = row < T_ && key < T_ &&
                        dropout_keep(drop.key, dropout_row(drop.row0 + b, row), ((int64_t)h << kDropoutPosBits) + key,
                                     drop.p)
                    ? e * keep_scale
                    : 0.0f;
          }
          s[n][i] = w;
        }
      // O += P V: 4 steps of 16 keys
#pragma unroll
      for (int kk = 0; kk < kTile / 16; kk++) {
        uint32_t pa[4];
        accumulators_as_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int np = 0; np < NS / 2; np++) {
          uint32_t vb[4];
          load_b_trans(vb, sv, LD, kk * 16, np * 16);
          mma2(o[2 * np], o[2 * np + 1], pa, vb);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before it is loaded again
  }

  // the row sums over the row's four lanes, in one order; then out = O / sum, lse = m + log(sum)
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float s1 = __shfl_xor_sync(0xffffffffu, lsum[r], 1);
    const float pair = (t4 & 1) ? s1 + lsum[r] : lsum[r] + s1;  // lanes (0,1) and (2,3): one order for both
    const float s2 = __shfl_xor_sync(0xffffffffu, pair, 2);
    lsum[r] = (t4 & 2) ? s2 + pair : pair + s2;
  }
  // the warp's 16 rows through its own rows of stage 0's K (free after the walk's last barrier) to
  // 16-byte stores
  uint16_t* stage_rows = skv + warp * 16 * LD;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float inv = 1.0f / lsum[r];
#pragma unroll
    for (int n = 0; n < NS; n++)
      *reinterpret_cast<uint32_t*>(&stage_rows[(g + 8 * r) * LD + n * 8 + 2 * t4]) =
          pack_bf16x2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    const int row = q0 + g + 8 * r;
    if (t4 == 0 && row < T_) lse[((int64_t)b * NH + h) * T_ + row] = (m[r] + log2f(lsum[r])) / kLog2e;
  }
  __syncwarp();
#pragma unroll
  for (int i = l; i < 16 * NS; i += WARP_SIZE) {
    const int r = i / NS, cc = i % NS, row = q0 + r;
    if (row < T_)
      store_vec<uint16_t, 8>(out + ((int64_t)b * T_ + row) * NH * HS + (int64_t)h * HS + cc * 8,
                             load_vec<uint16_t, 8>(&stage_rows[r * LD + cc * 8]));
  }
}

// ---- backward ----

// Q and dO stages: double-buffered at head size 64; at 128 one, so that two blocks fit an SM.
template <int HS>
constexpr int kBackwardStages = HS <= 64 ? 2 : 1;
constexpr int kLdS = kTile + 8;  // dS's shared row stride
template <int HS>
constexpr size_t backward_shared_bytes() {
  return (size_t)(2 + 2 * kBackwardStages<HS>) * kTile * (HS + 8) * sizeof(uint16_t)  // K, V; Q, dO per stage
         + (size_t)kTile * kLdS * sizeof(uint16_t)                                      // dS^T
         + (size_t)kBackwardStages<HS> * kTile * (2 * sizeof(float) + sizeof(int));  // lse, D, document starts
}

template <int HS, bool DROPOUT, bool SOFTCAP>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kernel(uint16_t* dqkv, float* dq_partial, const uint16_t* dout, const uint16_t* qkv,
                          const float* lse, const float* D, const int32_t* doc, int B, int T_, int NH, int NKV,
                          Dropout drop, int window, float scale, float softcap) {
  constexpr int LD = HS + 8, KS = HS / 16, NS = HS / 8, STAGES = kBackwardStages<HS>;
  constexpr int QH = HS > 64 ? 4 : 1, QW = kTile / QH;  // passes over a query tile, and their queries
  uint16_t* sk = LLMT_DYNAMIC_SHARED(uint16_t);
  uint16_t* sv = sk + kTile * LD;
  uint16_t* sqdo = sv + kTile * LD;                  // [stage][Q, dO][kTile][LD]
  uint16_t* sds = sqdo + STAGES * 2 * kTile * LD;    // dS^T: [key][query]
  float* slse = reinterpret_cast<float*>(sds + kTile * kLdS);  // [stage][kTile]: lse in log2 units
  float* sd = slse + STAGES * kTile;                            // [stage][kTile]: D times the scale
  int* sdoc = reinterpret_cast<int*>(sd + STAGES * kTile);      // [stage][kTile]: first keys (document, window)
  const int split = (int)blockIdx.x, splits = (int)gridDim.x, kvh = (int)blockIdx.y, b = (int)blockIdx.z;
  const int group = NH / NKV;
  const int tid = (int)threadIdx.x, warp = tid / WARP_SIZE, l = tid % WARP_SIZE, g = l / 4, t4 = l % 4;
  const int row_len = (NH + 2 * NKV) * HS, out_len = NH * HS;  // elements per row: small, 32 bits each
  const uint16_t* base = qkv + (int64_t)b * T_ * row_len;
  const uint16_t* dbase = dout + (int64_t)b * T_ * out_len;
  // as the forward's: with a cap, the exponent is tanh(scale S / softcap) softcap log2(e)
  const float c = (SOFTCAP ? softcap : scale) * kLog2e, cap_in = SOFTCAP ? scale / softcap : 0.0f;
  const float keep_scale = DROPOUT ? 1.0f / (1.0f - drop.p) : 1.0f;
  const int tiles = (T_ + kTile - 1) / kTile;
  float* partial = dq_partial + ((int64_t)split * B + b) * T_ * out_len;  // this split's dQ sums, sequence b

  for (int kt = split; kt < tiles; kt += splits) {
    const int k_first = kt * kTile, kw = k_first + warp * 16;  // the lane's keys: kw + g, kw + g + 8
    // query tiles from the diagonal while their first row (the tile's earliest first key: its document's
    // start or its window's) may still see this tile
    int it_end = kt;
    while (it_end < tiles && first_key_of(doc, b, T_, it_end * kTile, window) <= k_first + kTile - 1) it_end++;
    const int per_head = it_end - kt, items = group * per_head;
    // item j: head kvh * group + j / per_head, query tile kt + j % per_head
    auto load_item = [&](int j, int stage) {
      const int h = kvh * group + j / per_head, qs = (kt + j % per_head) * kTile;
      uint16_t* sq = sqdo + stage * 2 * kTile * LD;
      load_tile_async<HS>(sq, base, row_len, h * HS, qs, T_);
      load_tile_async<HS>(sq + kTile * LD, dbase, out_len, h * HS, qs, T_);
      cp_async_commit();
      if (tid < kTile) {
        const int t = qs + tid;
        slse[stage * kTile + tid] = t < T_ ? lse[((int64_t)b * NH + h) * T_ + t] * kLog2e : 0.0f;
        sd[stage * kTile + tid] = t < T_ ? D[((int64_t)b * T_ + t) * NH + h] * scale : 0.0f;
        sdoc[stage * kTile + tid] = first_key_of(doc, b, T_, t, window);
      }
    };
    __syncthreads();  // every warp is done with the previous key tile's K, V and staging
    load_tile_async<HS>(sk, base, row_len, (NH + kvh) * HS, k_first, T_);
    load_tile_async<HS>(sv, base, row_len, (NH + NKV + kvh) * HS, k_first, T_);
    cp_async_commit();
    if (items > 0) load_item(0, 0);

    float dk[NS][4], dv[NS][4];
#pragma unroll
    for (int n = 0; n < NS; n++)
#pragma unroll
      for (int i = 0; i < 4; i++) dk[n][i] = dv[n][i] = 0.0f;

    for (int j = 0; j < items; j++) {
      const int stage = STAGES == 2 ? j & 1 : 0;
      if (STAGES == 2 && j + 1 < items) {  // the next item in flight while this one computes
        load_item(j + 1, stage ^ 1);
        cp_async_wait<1>();
      } else {
        if (STAGES == 1 && j > 0) load_item(j, 0);  // one stage: loaded after the last item's barrier
        cp_async_wait<0>();
      }
      __syncthreads();  // this item's tiles (and, for the first, K and V) from every thread's copies
      const int h = kvh * group + j / per_head, qs = (kt + j % per_head) * kTile;
      const uint16_t* sq = sqdo + stage * 2 * kTile * LD;
      const uint16_t* sdo = sq + kTile * LD;
      const float* lse2 = slse + stage * kTile;
      const float* dd = sd + stage * kTile;
      const int* first = sdoc + stage * kTile;

      // in QH passes of QW queries (two at head size 128, to keep the registers within bounds):
      // masks where a key may lie after a query, a query past the sequence, or (first keys never
      // decrease with the row, so the tile's last query has the latest) a key before a query's first
      // key (its document's start or its window's)
      const int q_last = qs + kTile - 1 < T_ ? qs + kTile - 1 : T_ - 1;
      const bool docs = kw < first[q_last - qs];
      const bool masked = kw + 15 > qs || qs + kTile > T_ || docs;
#pragma unroll 1
      for (int qh = 0; qh < QH; qh++) {
        // S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys x QW queries, n-tiles of 8 queries
        float s[QW / 8][4], dp[QW / 8][4];
#pragma unroll
        for (int n = 0; n < QW / 8; n++)
#pragma unroll
          for (int i = 0; i < 4; i++) s[n][i] = dp[n][i] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
          uint32_t ka[4];
          load_a(ka, sk, LD, warp * 16, kk * 16);
#pragma unroll
          for (int np = 0; np < QW / 16; np++) {
            uint32_t qb[4];
            load_b_rows(qb, sq, LD, qh * QW + np * 16, kk * 16);
            mma2(s[2 * np], s[2 * np + 1], ka, qb);
          }
        }
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
          uint32_t va[4];
          load_a(va, sv, LD, warp * 16, kk * 16);
#pragma unroll
          for (int np = 0; np < QW / 16; np++) {
            uint32_t ob[4];
            load_b_rows(ob, sdo, LD, qh * QW + np * 16, kk * 16);
            mma2(dp[2 * np], dp[2 * np + 1], va, ob);
          }
        }
        // P (masked: a key after its query, before the query's first key, or a query past the
        // sequence), the dropped P in dp's place once dS is known, dS in s's place
        const int q_lane = qh * QW + 2 * t4;            // element (n, i)'s query: qs + q_lane + n * 8 + (i & 1)
        const int key_minus_q = kw + g - qs - q_lane;   // for i < 2; 8 more for i >= 2
        const int q_room = T_ - qs - q_lane;            // the query is in the sequence below this
#pragma unroll
        for (int n = 0; n < QW / 8; n++)
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const int off = n * 8 + (i & 1), qc = q_lane + off, key = kw + g + (i >= 2 ? 8 : 0), query = qs + qc;
            bool out = false;
            if (masked) {
              out = key_minus_q + (i >= 2 ? 8 : 0) > off || off >= q_room;
              if (docs) out = out || key < first[qc];
            }
            // the score in log2 units: with a cap, tanh(scale S / softcap) times softcap log2(e)
            const float th = SOFTCAP ? fast_tanh(s[n][i] * cap_in) : s[n][i];
            const float pr = out ? 0.0f : fast_exp2(fmaf(th, c, -lse2[qc]));
            float keep = 1.0f;
            if (DROPOUT)
              keep = query < T_ && key < T_ &&
                             dropout_keep(drop.key, dropout_row(drop.row0 + b, query),
                                          ((int64_t)h << kDropoutPosBits) + key, drop.p)
                         ? keep_scale
                         : 0.0f;
            // dS = P (dP keep - D) scale as one FFMA and one FMUL (D scaled as it was staged), with a
            // cap times 1 - tanh^2
            const float ds = pr * fmaf(dp[n][i], DROPOUT ? keep * scale : scale, -dd[qc]);
            s[n][i] = SOFTCAP ? ds * fmaf(-th, th, 1.0f) : ds;
            dp[n][i] = pr * keep;
          }
        // dV += P_drop^T dO and dK += dS^T Q: steps of 16 queries; dO and Q (query-major) by .trans
#pragma unroll
        for (int kk = 0; kk < QW / 16; kk++) {
          uint32_t pa[4], sa[4];
          accumulators_as_a(pa, dp[2 * kk], dp[2 * kk + 1]);
          accumulators_as_a(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
          for (int np = 0; np < NS / 2; np++) {
            uint32_t ob[4], qb[4];
            load_b_trans(ob, sdo, LD, qh * QW + kk * 16, np * 16);
            load_b_trans(qb, sq, LD, qh * QW + kk * 16, np * 16);
            mma2(dv[2 * np], dv[2 * np + 1], pa, ob);
            mma2(dk[2 * np], dk[2 * np + 1], sa, qb);
          }
        }
        // dS^T to shared memory, the warp's 16 key rows, for dQ's A fragments
#pragma unroll
        for (int n = 0; n < QW / 8; n++) {
          const int col = qh * QW + n * 8 + 2 * t4;
          *reinterpret_cast<uint32_t*>(&sds[(warp * 16 + g) * kLdS + col]) = pack_bf16x2(s[n][0], s[n][1]);
          *reinterpret_cast<uint32_t*>(&sds[(warp * 16 + g + 8) * kLdS + col]) = pack_bf16x2(s[n][2], s[n][3]);
        }
      }
      __syncthreads();
      // dQ's rows 16 warp .. 16 warp + 15 of this query tile: dS (query x key, dS^T by .trans) times
      // K (key-major, by .trans), added into the split's partial sums
#pragma unroll 1
      for (int dh = 0; dh < QH; dh++) {  // the head's columns in QH parts, as the queries above
        constexpr int DS = NS / QH;        // n-tiles per part
        float dq[DS][4];
#pragma unroll
        for (int n = 0; n < DS; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kTile / 16; kk++) {
          uint32_t da[4];
          ldmatrix<4, true>(da, &sds[(kk * 16 + l / 16 * 8 + l % 8) * kLdS + warp * 16 + (l / 8) % 2 * 8]);
#pragma unroll
          for (int np = 0; np < DS / 2; np++) {
            uint32_t kb[4];
            load_b_trans(kb, sk, LD, kk * 16, (dh * DS + 2 * np) * 8);
            mma2(dq[2 * np], dq[2 * np + 1], da, kb);
          }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
          const int query = qs + warp * 16 + g + 8 * r;
          if (query >= T_) continue;
          float* row = partial + (int64_t)query * out_len + (int64_t)h * HS + dh * DS * 8;
#pragma unroll
          for (int n = 0; n < DS; n++) {
            Vec<float, 2> v = load_vec<float, 2>(row + n * 8 + 2 * t4);
            v.v[0] += dq[n][2 * r];
            v.v[1] += dq[n][2 * r + 1];
            store_vec<float, 2>(row + n * 8 + 2 * t4, v);
          }
        }
      }
      __syncthreads();  // every warp is done with dS^T and this stage before they are written again
    }

    // dK and dV of the warp's 16 keys through its own rows of K's and V's tiles to 16-byte stores
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
      for (int n = 0; n < NS; n++) {
        const int at = (warp * 16 + g + 8 * r) * LD + n * 8 + 2 * t4;
        *reinterpret_cast<uint32_t*>(&sk[at]) = pack_bf16x2(dk[n][2 * r], dk[n][2 * r + 1]);
        *reinterpret_cast<uint32_t*>(&sv[at]) = pack_bf16x2(dv[n][2 * r], dv[n][2 * r + 1]);
      }
    __syncwarp();
#pragma unroll
    for (int i = l; i < 16 * NS; i += WARP_SIZE) {
      const int r = i / NS, cc = i % NS, key = kw + r;
      if (key >= T_) continue;
      uint16_t* row = dqkv + ((int64_t)b * T_ + key) * row_len;
      store_vec<uint16_t, 8>(row + (int64_t)(NH + kvh) * HS + cc * 8,
                             load_vec<uint16_t, 8>(&sk[(warp * 16 + r) * LD + cc * 8]));
      store_vec<uint16_t, 8>(row + (int64_t)(NH + NKV + kvh) * HS + cc * 8,
                             load_vec<uint16_t, 8>(&sv[(warp * 16 + r) * LD + cc * 8]));
    }
  }
}

// dQ = the splits' partial sums added in split order, rounded to bf16 once, into dqkv's query part:
// a thread per 4 consecutive elements (16-byte loads, 8-byte stores).
__global__ void flash_dq_reduce_kernel(uint16_t* dqkv, const float* dq_partial, int splits, int64_t rows, int q_len,
                                       int64_t row_len) {
  const int64_t quads = rows * q_len / 4, stride = (int64_t)gridDim.x * blockDim.x, plane = rows * q_len;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < quads; i += stride) {
    const int64_t e = i * 4, row = e / q_len, col = e % q_len;
    Vec<float, 4> sum = load_vec<float, 4>(dq_partial + e);
    for (int s = 1; s < splits; s++) {
      const Vec<float, 4> p = load_vec<float, 4>(dq_partial + s * plane + e);
#pragma unroll
      for (int k = 0; k < 4; k++) sum.v[k] += p.v[k];
    }
    Vec<uint32_t, 2> packed;
    packed.v[0] = pack_bf16x2(sum.v[0], sum.v[1]);
    packed.v[1] = pack_bf16x2(sum.v[2], sum.v[3]);
    store_vec<uint32_t, 2>(reinterpret_cast<uint32_t*>(dqkv + row * row_len + col), packed);
  }
}

}  // namespace

AttentionImpl attention_impl() {
  const char* v = std::getenv("LLMT_ATTENTION");
  const std::string s = v ? v : "";
  if (s.empty()) return AttentionImpl::automatic;
  if (s == "cudnn") return AttentionImpl::cudnn;
  if (s == "flash") return AttentionImpl::flash;
  if (s == "plain") return AttentionImpl::plain;
  fail("LLMT_ATTENTION=%s: expected cudnn (cuDNN's fused attention), flash (tensor cores in bf16 at head size 64 or "
       "128) or plain; unset picks cuDNN where it loads on a GPU, else flash",
       s.c_str());
}

const char* attention_impl_name(AttentionImpl impl) {
  return impl == AttentionImpl::cudnn ? "cudnn" : impl == AttentionImpl::flash ? "flash"
         : impl == AttentionImpl::plain ? "plain" : "automatic";
}

bool flash_attention_fits(int hs) { return hs == 64 || hs == 128; }

size_t flash_backward_scratch_bytes(int B, int T_, int NH, int NKV, int hs) {
  if (!flash_attention_fits(hs) || B == 0 || T_ == 0) return 0;
  return (size_t)cuda_flash_backward_splits(B, T_, NKV) * B * T_ * NH * hs * sizeof(float);
}

#define LLMT_FLASH_FORWARD(HS, DROP, CAP)                                                                    \
  do {                                                                                                        \
    constexpr size_t shared = forward_shared_bytes<HS>();                                                     \
    CUDA_CHECK(LLMT_MAX_DYNAMIC_SHARED((flash_forward_kernel<HS, DROP, CAP>), shared));                       \
    LLMT_LAUNCH((flash_forward_kernel<HS, DROP, CAP>), grid, kThreads, shared, stream, out, lse, qkv, doc, T_, \
                NH, NKV, drop, window, scale, softcap);                                                       \
  } while (0)
// the instantiation for (hs, dropout, softcap)
#define LLMT_FLASH_PICK(LAUNCH)                                      \
  do {                                                               \
    if (hs == 64 && !dropping && !capped) LAUNCH(64, false, false);  \
    else if (hs == 64 && !dropping) LAUNCH(64, false, true);         \
    else if (hs == 64 && !capped) LAUNCH(64, true, false);           \
    else if (hs == 64) LAUNCH(64, true, true);                       \
    else if (!dropping && !capped) LAUNCH(128, false, false);        \
    else if (!dropping) LAUNCH(128, false, true);                    \
    else if (!capped) LAUNCH(128, true, false);                      \
    else LAUNCH(128, true, true);                                    \
  } while (0)

void flash_attention_forward(uint16_t* out, float* lse, const uint16_t* qkv, const int32_t* doc, int B, int T_, int NH,
                             int NKV, int hs, const Dropout& drop, int window, float scale, float softcap,
                             Stream stream) {
  LLMT_CHECK(flash_attention_fits(hs), "flash attention: head size %d (64 or 128)", hs);
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  LLMT_CHECK(aligned(qkv, 16) && aligned(out, 16), "flash attention: qkv and out must be 16-byte aligned");
  if (B == 0 || T_ == 0) return;
  const dim3 grid((unsigned)((T_ + kTile - 1) / kTile), (unsigned)NH, (unsigned)B);
  const bool dropping = drop.active(), capped = softcap > 0.0f;
  LLMT_FLASH_PICK(LLMT_FLASH_FORWARD);
  CUDA_CHECK_LAUNCH();
}

#define LLMT_FLASH_BACKWARD(HS, DROP, CAP)                                                                   \
  do {                                                                                                        \
    constexpr size_t shared = backward_shared_bytes<HS>();                                                    \
    CUDA_CHECK(LLMT_MAX_DYNAMIC_SHARED((flash_backward_kernel<HS, DROP, CAP>), shared));                      \
    LLMT_LAUNCH((flash_backward_kernel<HS, DROP, CAP>), grid, kThreads, shared, stream, dqkv, dq_partial, dout, \
                qkv, lse, D, doc, B, T_, NH, NKV, drop, window, scale, softcap);                              \
  } while (0)

void flash_attention_backward(uint16_t* dqkv, float* dq_partial, const uint16_t* dout, const uint16_t* qkv,
                              const float* lse, const float* D, const int32_t* doc, int B, int T_, int NH, int NKV,
                              int hs, const Dropout& drop, int window, float scale, float softcap, Stream stream) {
  LLMT_CHECK(flash_attention_fits(hs), "flash attention: head size %d (64 or 128)", hs);
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  LLMT_CHECK(aligned(qkv, 16) && aligned(dout, 16) && aligned(dqkv, 16) && aligned(dq_partial, 16),
             "flash attention: qkv, dout, dqkv and the scratch must be 16-byte aligned");
  if (B == 0 || T_ == 0) return;
  const int splits = cuda_flash_backward_splits(B, T_, NKV);
  CUDA_CHECK(cudaMemsetAsync(dq_partial, 0, flash_backward_scratch_bytes(B, T_, NH, NKV, hs), stream));
  const dim3 grid((unsigned)splits, (unsigned)NKV, (unsigned)B);
  const bool dropping = drop.active(), capped = softcap > 0.0f;
  LLMT_FLASH_PICK(LLMT_FLASH_BACKWARD);
  CUDA_CHECK_LAUNCH();
  const int64_t rows = (int64_t)B * T_;
  const int q_len = NH * hs;
  LLMT_LAUNCH(flash_dq_reduce_kernel, grid_for(rows * q_len / 4), kBlock, 0, stream, dqkv, dq_partial, splits, rows,
              q_len, (int64_t)(NH + 2 * NKV) * hs);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace llmt
