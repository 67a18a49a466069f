// Causal self-attention's forward on tensor cores, in the manner of FlashAttention-2 (Dao, 2023):
// bf16 in, f32 accumulation, head size 64 or 128, grouped-query heads, dropout on the probabilities
// with the counter-based masks every backend draws, the log-sum-exp kept for the backward.
//
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

template <int HS>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(uint16_t* out, float* lse, const uint16_t* qkv, int T_, int NH, int NKV, Dropout drop) {
  constexpr int LD = HS + 8;  // shared row stride in elements: 16-byte aligned, conflict-free for ldmatrix
  __shared__ __align__(16) uint16_t sk[kFlashKeys * LD];
  __shared__ __align__(16) uint16_t sv[kFlashKeys * LD];
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

  const int block_end = (qt + 1) * kFlashRows < T_ ? (qt + 1) * kFlashRows : T_;
  const int block_last = block_end - 1;  // the last key any row of the block sees
  for (int k0 = 0; k0 <= block_last; k0 += kFlashKeys) {
    __syncthreads();  // every warp is done with the previous tile
    for (int i = tid; i < kFlashKeys * HS / 2; i += kFlashThreads) {  // two elements at a time
      const int r = i / (HS / 2), c = (i % (HS / 2)) * 2;
      uint32_t kw = 0u, vw = 0u;
      if (k0 + r < T_) {
        const uint16_t* row = base + (int64_t)(k0 + r) * row_len;
        kw = (uint32_t)row[(int64_t)(NH + kvh) * HS + c] | (uint32_t)row[(int64_t)(NH + kvh) * HS + c + 1] << 16;
        vw = (uint32_t)row[(int64_t)(NH + NKV + kvh) * HS + c] |
             (uint32_t)row[(int64_t)(NH + NKV + kvh) * HS + c + 1] << 16;
      }
      sk[r * LD + c] = (uint16_t)kw;
      sk[r * LD + c + 1] = (uint16_t)(kw >> 16);
      sv[r * LD + c] = (uint16_t)vw;
      sv[r * LD + c + 1] = (uint16_t)(vw >> 16);
    }
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
    // scale, the causal mask, the new row maxima (over the row's four lanes)
    float mx[2] = {-INFINITY, -INFINITY};
    for (int n = 0; n < kFlashKeys / 8; n++)
      for (int i = 0; i < 4; i++) {
        const int row = q0 + g + (i >= 2 ? 8 : 0), key = k0 + n * 8 + 2 * t4 + (i & 1);
        const float v = key > row || key >= T_ ? -INFINITY : s[n][i] * scale;
        s[n][i] = v;
        mx[i / 2] = fmaxf(mx[i / 2], v);
      }
    float alpha[2];
    for (int r = 0; r < 2; r++) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);  // finite: every row sees its own key in its diagonal tile
      alpha[r] = expf(m[r] - m_new);
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
        const float e = expf(s[n][i] - m[i / 2]);
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

}  // namespace

AttentionImpl attention_impl() {
  static const AttentionImpl impl = [] {
    const char* v = std::getenv("LLMT_ATTENTION");
    const std::string s = v ? v : "";
    if (s.empty() || s == "flash") return AttentionImpl::flash;
    if (s == "plain") return AttentionImpl::plain;
    fail("LLMT_ATTENTION=%s: expected flash (the default: tensor cores in bf16 at head size 64 or 128) or plain",
         s.c_str());
  }();
  return impl;
}

bool flash_attention_fits(int hs) { return hs == 64 || hs == 128; }

void flash_attention_forward(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T_, int NH, int NKV, int hs,
                             const Dropout& drop, Stream stream) {
  LLMT_CHECK(flash_attention_fits(hs), "flash attention: head size %d (64 or 128)", hs);
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  if (B == 0 || T_ == 0) return;
  const dim3 grid((unsigned)((T_ + kFlashRows - 1) / kFlashRows), (unsigned)NH, (unsigned)B);
  if (hs == 64) LLMT_LAUNCH(flash_forward_kernel<64>, grid, kFlashThreads, 0, stream, out, lse, qkv, T_, NH, NKV, drop);
  else LLMT_LAUNCH(flash_forward_kernel<128>, grid, kFlashThreads, 0, stream, out, lse, qkv, T_, NH, NKV, drop);
  CUDA_CHECK_LAUNCH();
}

}  // namespace cuda
}  // namespace llmt
