// Causal self-attention on tensor cores, forward and backward, in the manner of FlashAttention-2
// (Dao, 2023): bf16 in, f32 accumulation, head size 64 or 128, grouped-query heads, dropout on the
// probabilities with the counter-based masks every backend draws, the log-sum-exp kept for the
// backward.
//
// Forward:
// A block of 4 warps takes 64 query rows of one head of one sequence (grid: query tiles x heads x
// batch, so a single long sequence fills the GPU); each warp owns 16 rows. The block walks the key
// tiles of 64 up to its diagonal: K and V tiles go to shared memory (rows padded by 8 elements, so
// ldmatrix's eight row addresses fall in different banks), S = Q K^T comes from mma.sync with Q's
// fragments held in registers for the whole walk and K's by ldmatrix, the running row maximum
// rescales the running sums and the output, and P (rounded to bf16) times V goes through mma.sync
// again with P's accumulator fragment reused as the A fragment and V's by ldmatrix.trans. The row
// sums stay per lane until the end and are then added over the row's four lanes in a fixed order,
// so a run repeats bit for bit.
#include "kernels/cuda/flash_attention.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace llmt {
namespace cuda {
namespace {

constexpr int kFlashRows = 64;  // query rows per block: 4 warps x 16
constexpr int kFlashKeys = 64;  // keys per tile
constexpr int kFlashThreads = 128;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return (uint32_t)bf16_bits(lo) | (uint32_t)bf16_bits(hi) << 16;
}

// Two adjacent bf16 of row `row` (zeros past the sequence) as one register.
__device__ __forceinline__ uint32_t load_pair(const uint16_t* base, int64_t row_len, int row, int T_, int64_t col) {
  if (row >= T_) return 0u;
  const uint16_t* p = base + (int64_t)row * row_len + col;
  return (uint32_t)p[0] | (uint32_t)p[1] << 16;
}

// A tile of 64 rows of one head (`col0` its first element in each row) into shared memory, zeros
// past the sequence: a block's threads two elements at a time.
template <int HS>
__device__ __forceinline__ void load_tile(uint16_t* dst, const uint16_t* src, int64_t row_len, int64_t col0, int r0,
                                          int T_) {
  constexpr int LD = HS + 8;
  for (int i = (int)threadIdx.x; i < kFlashKeys * HS / 2; i += kFlashThreads) {
    const int r = i / (HS / 2), c = (i % (HS / 2)) * 2;
    const uint32_t w = load_pair(src, row_len, r0 + r, T_, col0 + c);
    dst[r * LD + c] = (uint16_t)w;
    dst[r * LD + c + 1] = (uint16_t)(w >> 16);
  }
}

// The first position of row t's document in sequence b (packed documents), 0 without them or past
// the sequence.
__device__ __forceinline__ int doc_start_of(const int32_t* doc, int b, int T_, int t) {
  return doc && t < T_ ? doc[(int64_t)b * T_ + t] : 0;
}

template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(uint16_t* out, float* lse, const uint16_t* qkv, const int32_t* doc, int T_, int NH, int NKV,
                         Dropout drop) {
  constexpr int LD = HS + 8;  // shared row stride in elements: 16-byte aligned, conflict-free for ldmatrix
  LLMT_SHARED(uint16_t, sk, [kFlashKeys * LD]);
  LLMT_SHARED(uint16_t, sv, [kFlashKeys * LD]);
  const int qt = (int)blockIdx.x, h = (int)blockIdx.y, b = (int)blockIdx.z, kvh = h / (NH / NKV);
  const int tid = (int)threadIdx.x, warp = tid / WARP_SIZE, l = tid % WARP_SIZE, g = l / 4, t4 = l % 4;
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * HS;
  const uint16_t* base = qkv + (int64_t)b * T_ * row_len;
  const float scale = 1.0f / sqrtf((float)HS), keep_scale = drop.p > 0.0f ? 1.0f / (1.0f - drop.p) : 1.0f;
  const int q0 = qt * kFlashRows + warp * 16;  // this warp's first row; the lane's rows are q0+g, q0+g+8

  // Q's A fragments for every 16-column step of the head, for the whole walk
  uint32_t qf[HS / 16][4];
  for (int kk = 0; kk < HS / 16; kk++) {
    const int64_t col = (int64_t)h * HS + kk * 16 + 2 * t4;
    qf[kk][0] = load_pair(base, row_len, q0 + g, T_, col);
    qf[kk][1] = load_pair(base, row_len, q0 + g + 8, T_, col);
    qf[kk][2] = load_pair(base, row_len, q0 + g, T_, col + 8);
    qf[kk][3] = load_pair(base, row_len, q0 + g + 8, T_, col + 8);
  }
  float o[HS / 8][4];
  for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f};  // rows g and g+8: max, this lane's sum
  int first[2];  // the first key of each row's document (packed documents), else 0
  for (int r = 0; r < 2; r++) first[r] = doc_start_of(doc, b, T_, q0 + g + 8 * r);

  const int block_end = (qt + 1) * kFlashRows < T_ ? (qt + 1) * kFlashRows : T_;
  const int block_last = block_end - 1;  // the last key any row of the block sees
  // from the tile holding the block's first row's document start: no row sees a key before it
  for (int k0 = doc_start_of(doc, b, T_, qt * kFlashRows) / kFlashKeys * kFlashKeys; k0 <= block_last;
       k0 += kFlashKeys) {
    __syncthreads();  // every warp is done with the previous tile
    load_tile<HS>(sk, base, row_len, (int64_t)(NH + kvh) * HS, k0, T_);
    load_tile<HS>(sv, base, row_len, (int64_t)(NH + NKV + kvh) * HS, k0, T_);
    __syncthreads();

    // S = Q K^T: 8 column tiles of 8 keys; K's rows are B's columns (ldmatrix without .trans)
    float s[kFlashKeys / 8][4];
    for (int n = 0; n < kFlashKeys / 8; n++) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t kb[2];
        ldmatrix<2, false>(kb, &sk[(n * 8 + l % 8) * LD + kk * 16 + (l / 8) % 2 * 8]);
        mma_m16n8k16_bf16(s[n], qf[kk], kb, s[n]);
      }
    }
    // scale, the causal and document masks, the new row maxima (over the row's four lanes)
    float mx[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < kFlashKeys / 8; n++)
      for (int i = 0; i < 4; i++) {
        const int row = q0 + g + (i >= 2 ? 8 : 0), key = k0 + n * 8 + 2 * t4 + (i & 1);
        const float v = key > row || key >= T_ || key < first[i / 2] ? -INFINITY : s[n][i] * scale;
        s[n][i] = v;
        mx[i / 2] = fmaxf(mx[i / 2], v);
      }
    float alpha[2], m_exp[2];
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      // -inf while a row has seen only masked keys (a later document's row in an earlier tile): its
      // sums stay 0, and exponents are taken from 0 so that none is exp(-inf + inf)
      m_exp[r] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = expf(m[r] - m_exp[r]);
      m[r] = m_new;
      lsum[r] *= alpha[r];
    }
    for (int n = 0; n < HS / 8; n++) {
      o[n][0] *= alpha[0], o[n][1] *= alpha[0];
      o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
    // P = exp(S - m): the sums take every probability, the product with V the kept ones, scaled
    for (int n = 0; n < kFlashKeys / 8; n++)
      for (int i = 0; i < 4; i++) {
        const float e = expf(s[n][i] - m_exp[i / 2]);
        lsum[i / 2] += e;
        float w = e;
        if (drop.p > 0.0f) {
          const int row = q0 + g + (i >= 2 ? 8 : 0), key = k0 + n * 8 + 2 * t4 + (i & 1);
          w = row < T_ && key < T_ && dropout_keep(drop.key, dropout_row(drop.row0 + b, row),
                                                   ((int64_t)h << kDropoutPosBits) + key, drop.p)
                  ? e * keep_scale
                  : 0.0f;
        }
        s[n][i] = w;
      }
    // O += P V: P's accumulators are the A fragments of 16-key steps; V (k-major) by ldmatrix.trans
    for (int kk = 0; kk < kFlashKeys / 16; kk++) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      for (int n = 0; n < HS / 8; n++) {
        uint32_t vb[2];
        ldmatrix<2, true>(vb, &sv[(kk * 16 + (l / 8) % 2 * 8 + l % 8) * LD + n * 8]);
        mma_m16n8k16_bf16(o[n], pa, vb, o[n]);
      }
    }
  }

  // the row sums over the row's four lanes, in one order; then out = O / sum, lse = m + log(sum)
  for (int r = 0; r < 2; r++) {
    const float s1 = __shfl_xor_sync(0xffffffffu, lsum[r], 1);
    const float pair = (t4 & 1) ? s1 + lsum[r] : lsum[r] + s1;  // lanes (0,1) and (2,3): one order for both
    const float s2 = __shfl_xor_sync(0xffffffffu, pair, 2);
    lsum[r] = (t4 & 2) ? s2 + pair : pair + s2;
  }
  for (int r = 0; r < 2; r++) {
    const int row = q0 + g + 8 * r;
    if (row >= T_) continue;
    const float inv = 1.0f / lsum[r];
    uint16_t* orow = out + ((int64_t)b * T_ + row) * NH * HS + (int64_t)h * HS;
    for (int n = 0; n < HS / 8; n++) {
      orow[n * 8 + 2 * t4] = bf16_bits(o[n][2 * r] * inv);
      orow[n * 8 + 2 * t4 + 1] = bf16_bits(o[n][2 * r + 1] * inv);
    }
    if (t4 == 0) lse[((int64_t)b * NH + h) * T_ + row] = m[r] + logf(lsum[r]);
  }
}


// The backward, FlashAttention-2's way in two kernels, each output element written by one warp (no
// atomics, so a run repeats bit for bit). Both recompute P = exp(S * scale - lse) from the forward's
// lse and take D = rowsum(dO * O) (attention_row_dots) as given:
//   dV = P_drop^T dO,  dP = dO V^T (times the dropout mask),  dS = P * (dP - D) * scale,
//   dK = dS^T Q,       dQ = dS K.
// flash_dkv_kernel: a block per (64-key tile, kv head, sequence); each warp keeps 16 keys' K and V
// as A fragments and walks the query tiles at and past its diagonal for every head of the group,
// with Q and dO in shared memory: S^T = K Q^T and dP^T = V dO^T, then dV += P^T dO and dK += dS^T Q
// with the accumulators of P^T and dS^T reused as A fragments (as P in the forward).
template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_dkv_kernel(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const float* lse, const float* D,
                     const int32_t* doc, int T_, int NH, int NKV, Dropout drop) {
  constexpr int LD = HS + 8;
  LLMT_SHARED(uint16_t, sq, [kFlashRows * LD]);
  LLMT_SHARED(uint16_t, sdo, [kFlashRows * LD]);
  LLMT_SHARED(float, slse, [kFlashRows]);
  LLMT_SHARED(float, sd, [kFlashRows]);
  LLMT_SHARED(int, sdoc, [kFlashRows]);
  const int kt = (int)blockIdx.x, kvh = (int)blockIdx.y, b = (int)blockIdx.z, group = NH / NKV;
  const int tid = (int)threadIdx.x, warp = tid / WARP_SIZE, l = tid % WARP_SIZE, g = l / 4, t4 = l % 4;
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * HS, out_len = (int64_t)NH * HS;
  const uint16_t* base = qkv + (int64_t)b * T_ * row_len;
  const uint16_t* dbase = dout + (int64_t)b * T_ * out_len;
  const float scale = 1.0f / sqrtf((float)HS), keep_scale = drop.p > 0.0f ? 1.0f / (1.0f - drop.p) : 1.0f;
  const int k0 = kt * kFlashKeys + warp * 16;  // this warp's first key; the lane's keys are k0+g, k0+g+8

  uint32_t kf[HS / 16][4], vf[HS / 16][4];
  for (int kk = 0; kk < HS / 16; kk++) {
    const int64_t kcol = (int64_t)(NH + kvh) * HS + kk * 16 + 2 * t4, vcol = kcol + (int64_t)NKV * HS;
    for (int i = 0; i < 4; i++) {
      const int row = k0 + g + (i & 1) * 8;
      const int64_t off = (i & 2) ? 8 : 0;
      kf[kk][i] = load_pair(base, row_len, row, T_, kcol + off);
      vf[kk][i] = load_pair(base, row_len, row, T_, vcol + off);
    }
  }
  float dk[HS / 8][4], dv[HS / 8][4];
  for (int n = 0; n < HS / 8; n++)
    for (int i = 0; i < 4; i++) dk[n][i] = dv[n][i] = 0.0f;

  for (int h = kvh * group; h < (kvh + 1) * group; h++)
    for (int qs = kt * kFlashKeys; qs < T_; qs += kFlashRows) {
      // this tile's queries and every later one belong to documents after the block's last key
      if (doc_start_of(doc, b, T_, qs) > kt * kFlashKeys + kFlashKeys - 1) break;
      __syncthreads();  // every warp is done with the previous tiles
      load_tile<HS>(sq, base, row_len, (int64_t)h * HS, qs, T_);
      load_tile<HS>(sdo, dbase, out_len, (int64_t)h * HS, qs, T_);
      if (tid < kFlashRows) {
        const int t = qs + tid;
        slse[tid] = t < T_ ? lse[((int64_t)b * NH + h) * T_ + t] : 0.0f;
        sd[tid] = t < T_ ? D[((int64_t)b * T_ + t) * NH + h] : 0.0f;
        sdoc[tid] = doc_start_of(doc, b, T_, t);
      }
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T: 8 column tiles of 8 queries; Q's and dO's rows are B's columns
      float p[kFlashRows / 8][4], dp[kFlashRows / 8][4];
      for (int n = 0; n < kFlashRows / 8; n++) {
        for (int i = 0; i < 4; i++) p[n][i] = dp[n][i] = 0.0f;
        for (int kk = 0; kk < HS / 16; kk++) {
          const int at = (n * 8 + l % 8) * LD + kk * 16 + (l / 8) % 2 * 8;
          uint32_t qb[2], ob[2];
          ldmatrix<2, false>(qb, &sq[at]);
          ldmatrix<2, false>(ob, &sdo[at]);
          mma_m16n8k16_bf16(p[n], kf[kk], qb, p[n]);
          mma_m16n8k16_bf16(dp[n], vf[kk], ob, dp[n]);
        }
      }
      // P (masked: a key after its query, or a query past the sequence), the dropped P in dp's
      // place once dS is known, dS in p's place
      float pd[kFlashRows / 8][4];
      for (int n = 0; n < kFlashRows / 8; n++)
        for (int i = 0; i < 4; i++) {
          const int key = k0 + g + (i >= 2 ? 8 : 0), qc = n * 8 + 2 * t4 + (i & 1), query = qs + qc;
          const float pr = key > query || query >= T_ || key < sdoc[qc] ? 0.0f : expf(p[n][i] * scale - slse[qc]);
          float keep = 1.0f;
          if (drop.p > 0.0f)
            keep = query < T_ && key < T_ &&
                           dropout_keep(drop.key, dropout_row(drop.row0 + b, query), ((int64_t)h << kDropoutPosBits) + key,
                                        drop.p)
                       ? keep_scale
                       : 0.0f;
          pd[n][i] = pr * keep;
          p[n][i] = pr * (dp[n][i] * keep - sd[qc]) * scale;
        }
      // dV += P_drop^T dO and dK += dS^T Q: 16-query steps; dO and Q (query-major) by ldmatrix.trans
      for (int kk = 0; kk < kFlashRows / 16; kk++) {
        const uint32_t pa[4] = {pack_bf16(pd[2 * kk][0], pd[2 * kk][1]), pack_bf16(pd[2 * kk][2], pd[2 * kk][3]),
                                pack_bf16(pd[2 * kk + 1][0], pd[2 * kk + 1][1]),
                                pack_bf16(pd[2 * kk + 1][2], pd[2 * kk + 1][3])};
        const uint32_t sa[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                                pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        for (int n = 0; n < HS / 8; n++) {
          const int at = (kk * 16 + (l / 8) % 2 * 8 + l % 8) * LD + n * 8;
          uint32_t ob[2], qb[2];
          ldmatrix<2, true>(ob, &sdo[at]);
          ldmatrix<2, true>(qb, &sq[at]);
          mma_m16n8k16_bf16(dv[n], pa, ob, dv[n]);
          mma_m16n8k16_bf16(dk[n], sa, qb, dk[n]);
        }
      }
    }

  for (int r = 0; r < 2; r++) {
    const int key = k0 + g + 8 * r;
    if (key >= T_) continue;
    uint16_t* row = dqkv + ((int64_t)b * T_ + key) * row_len;
    for (int n = 0; n < HS / 8; n++) {
      const int64_t c = n * 8 + 2 * t4;
      row[(int64_t)(NH + kvh) * HS + c] = bf16_bits(dk[n][2 * r]);
      row[(int64_t)(NH + kvh) * HS + c + 1] = bf16_bits(dk[n][2 * r + 1]);
      row[(int64_t)(NH + NKV + kvh) * HS + c] = bf16_bits(dv[n][2 * r]);
      row[(int64_t)(NH + NKV + kvh) * HS + c + 1] = bf16_bits(dv[n][2 * r + 1]);
    }
  }
}

// flash_dq_kernel: a block per (64-query tile, head, sequence), as the forward; each warp keeps 16
// query rows' Q and dO as A fragments and walks the key tiles up to its diagonal with K and V in
// shared memory: S = Q K^T, dP = dO V^T, then dQ += dS K (K key-major, by ldmatrix.trans).
template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_dq_kernel(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const float* lse, const float* D,
                    const int32_t* doc, int T_, int NH, int NKV, Dropout drop) {
  constexpr int LD = HS + 8;
  LLMT_SHARED(uint16_t, sk, [kFlashKeys * LD]);
  LLMT_SHARED(uint16_t, sv, [kFlashKeys * LD]);
  const int qt = (int)blockIdx.x, h = (int)blockIdx.y, b = (int)blockIdx.z, kvh = h / (NH / NKV);
  const int tid = (int)threadIdx.x, warp = tid / WARP_SIZE, l = tid % WARP_SIZE, g = l / 4, t4 = l % 4;
  const int64_t row_len = (int64_t)(NH + 2 * NKV) * HS, out_len = (int64_t)NH * HS;
  const uint16_t* base = qkv + (int64_t)b * T_ * row_len;
  const uint16_t* dbase = dout + (int64_t)b * T_ * out_len;
  const float scale = 1.0f / sqrtf((float)HS), keep_scale = drop.p > 0.0f ? 1.0f / (1.0f - drop.p) : 1.0f;
  const int q0 = qt * kFlashRows + warp * 16;  // the lane's rows are q0+g, q0+g+8

  uint32_t qf[HS / 16][4], of[HS / 16][4];
  for (int kk = 0; kk < HS / 16; kk++) {
    const int64_t col = (int64_t)h * HS + kk * 16 + 2 * t4;
    for (int i = 0; i < 4; i++) {
      const int row = q0 + g + (i & 1) * 8;
      const int64_t off = (i & 2) ? 8 : 0;
      qf[kk][i] = load_pair(base, row_len, row, T_, col + off);
      of[kk][i] = load_pair(dbase, out_len, row, T_, col + off);
    }
  }
  float row_lse[2], row_d[2];
  int first[2];
  for (int r = 0; r < 2; r++) {
    const int row = q0 + g + 8 * r;
    first[r] = doc_start_of(doc, b, T_, row);
    row_lse[r] = row < T_ ? lse[((int64_t)b * NH + h) * T_ + row] : 0.0f;
    row_d[r] = row < T_ ? D[((int64_t)b * T_ + row) * NH + h] : 0.0f;
  }
  float dq[HS / 8][4];
  for (int n = 0; n < HS / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

  const int block_end = (qt + 1) * kFlashRows < T_ ? (qt + 1) * kFlashRows : T_;
  for (int k0 = doc_start_of(doc, b, T_, qt * kFlashRows) / kFlashKeys * kFlashKeys; k0 < block_end;
       k0 += kFlashKeys) {
    __syncthreads();
    load_tile<HS>(sk, base, row_len, (int64_t)(NH + kvh) * HS, k0, T_);
    load_tile<HS>(sv, base, row_len, (int64_t)(NH + NKV + kvh) * HS, k0, T_);
    __syncthreads();

    float s[kFlashKeys / 8][4], dp[kFlashKeys / 8][4];
    for (int n = 0; n < kFlashKeys / 8; n++) {
      for (int i = 0; i < 4; i++) s[n][i] = dp[n][i] = 0.0f;
      for (int kk = 0; kk < HS / 16; kk++) {
        const int at = (n * 8 + l % 8) * LD + kk * 16 + (l / 8) % 2 * 8;
        uint32_t kb[2], vb[2];
        ldmatrix<2, false>(kb, &sk[at]);
        ldmatrix<2, false>(vb, &sv[at]);
        mma_m16n8k16_bf16(s[n], qf[kk], kb, s[n]);
        mma_m16n8k16_bf16(dp[n], of[kk], vb, dp[n]);
      }
    }
    for (int n = 0; n < kFlashKeys / 8; n++)
      for (int i = 0; i < 4; i++) {
        const int r = i / 2, row = q0 + g + 8 * r, key = k0 + n * 8 + 2 * t4 + (i & 1);
        const float pr = key > row || row >= T_ || key < first[r] ? 0.0f : expf(s[n][i] * scale - row_lse[r]);
        float keep = 1.0f;
        if (drop.p > 0.0f)
          keep = row < T_ && key < T_ &&
                         dropout_keep(drop.key, dropout_row(drop.row0 + b, row), ((int64_t)h << kDropoutPosBits) + key,
                                      drop.p)
                     ? keep_scale
                     : 0.0f;
        s[n][i] = pr * (dp[n][i] * keep - row_d[r]) * scale;
      }
    // dQ += dS K: dS's accumulators are the A fragments of 16-key steps
    for (int kk = 0; kk < kFlashKeys / 16; kk++) {
      const uint32_t sa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      for (int n = 0; n < HS / 8; n++) {
        uint32_t kb[2];
        ldmatrix<2, true>(kb, &sk[(kk * 16 + (l / 8) % 2 * 8 + l % 8) * LD + n * 8]);
        mma_m16n8k16_bf16(dq[n], sa, kb, dq[n]);
      }
    }
  }

  for (int r = 0; r < 2; r++) {
    const int row = q0 + g + 8 * r;
    if (row >= T_) continue;
    uint16_t* dst = dqkv + ((int64_t)b * T_ + row) * row_len + (int64_t)h * HS;
    for (int n = 0; n < HS / 8; n++) {
      dst[n * 8 + 2 * t4] = bf16_bits(dq[n][2 * r]);
      dst[n * 8 + 2 * t4 + 1] = bf16_bits(dq[n][2 * r + 1]);
    }
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

void flash_attention_forward(uint16_t* out, float* lse, const uint16_t* qkv, const int32_t* doc, int B, int T_, int NH,
                             int NKV, int hs, const Dropout& drop, Stream stream) {
  LLMT_CHECK(flash_attention_fits(hs), "flash attention: head size %d (64 or 128)", hs);
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  if (B == 0 || T_ == 0) return;
  const dim3 grid((unsigned)((T_ + kFlashRows - 1) / kFlashRows), (unsigned)NH, (unsigned)B);
  if (hs == 64)
    LLMT_LAUNCH(flash_forward_kernel<64>, grid, kFlashThreads, 0, stream, out, lse, qkv, doc, T_, NH, NKV, drop);
  else
    LLMT_LAUNCH(flash_forward_kernel<128>, grid, kFlashThreads, 0, stream, out, lse, qkv, doc, T_, NH, NKV, drop);
  CUDA_CHECK_LAUNCH();
}

void flash_attention_backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const float* lse,
                              const float* D, const int32_t* doc, int B, int T_, int NH, int NKV, int hs,
                              const Dropout& drop, Stream stream) {
  LLMT_CHECK(flash_attention_fits(hs), "flash attention: head size %d (64 or 128)", hs);
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  if (B == 0 || T_ == 0) return;
  const unsigned tiles = (unsigned)((T_ + kFlashRows - 1) / kFlashRows);
  const dim3 kv_grid(tiles, (unsigned)NKV, (unsigned)B), q_grid(tiles, (unsigned)NH, (unsigned)B);
  if (hs == 64) {
    LLMT_LAUNCH(flash_dkv_kernel<64>, kv_grid, kFlashThreads, 0, stream, dqkv, dout, qkv, lse, D, doc, T_, NH, NKV,
                drop);
    CUDA_CHECK_LAUNCH();
    LLMT_LAUNCH(flash_dq_kernel<64>, q_grid, kFlashThreads, 0, stream, dqkv, dout, qkv, lse, D, doc, T_, NH, NKV,
                drop);
  } else {
    LLMT_LAUNCH(flash_dkv_kernel<128>, kv_grid, kFlashThreads, 0, stream, dqkv, dout, qkv, lse, D, doc, T_, NH, NKV,
                drop);
    CUDA_CHECK_LAUNCH();
    LLMT_LAUNCH(flash_dq_kernel<128>, q_grid, kFlashThreads, 0, stream, dqkv, dout, qkv, lse, D, doc, T_, NH, NKV,
                drop);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace llmt
