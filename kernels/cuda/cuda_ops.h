// Host launchers for the CUDA kernels of the Backend ops that cuda_kernels.h does not cover:
// matmul, norms, embeddings, RoPE, dropout, attention, the loss. Semantics as engine/backend/backend.h
// says for each op. Act tensors are float (f32) or uint16_t (bf16 bits); every launch is
// asynchronous on `stream` and deterministic (no floating-point atomics: every sum has a fixed order).
// These are the plain kernels: they run under the SIMT emulator and on any GPU; fast paths (cuBLASLt,
// cuDNN) sit beside them in the backend.
#pragma once
#include <cstdint>

#include "engine/backend/backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace llmt {
namespace cuda {

// Where a kernel reports bad input it cannot throw on, kErrWords ints on the device: err[0] = code
// (kErr*), err[1] = the bad value, err[2..3] = its position (int64, low and high halves), err[4] = the
// bound it broke (the vocabulary size). The first report wins; the backend reads the word when it
// next synchronizes and throws there.
constexpr int kErrWords = 8;
constexpr int kErrNone = 0, kErrToken = 1, kErrTarget = 2;

// out[M,N] (= or +=) op(a) op(b) + bias, fp32 accumulation. Ta: float or uint16_t; Tout: float or Ta.
template <typename Ta, typename Tout>
void matmul(Tout* out, const Ta* a, const Ta* b, const Ta* bias, int64_t M, int64_t N, int64_t K, bool trans_a,
            bool trans_b, bool accumulate, int64_t ld_a, int64_t ld_out, Stream stream);
// Bias and norm-weight gradients are column sums in two stages (a chunk of rows per block, then the
// chunks in order: deterministic) through `partials`, a device scratch of column_partials_bytes(N, C)
// for N rows of C columns.
constexpr int kColumnChunkRows = 256, kColumnMaxChunks = 128;
inline int column_chunks(int64_t N) {
  const int64_t chunks = (N + kColumnChunkRows - 1) / kColumnChunkRows;
  return (int)(chunks < 1 ? 1 : chunks > kColumnMaxChunks ? kColumnMaxChunks : chunks);
}
inline size_t column_partials_bytes(int64_t N, int64_t C) { return (size_t)column_chunks(N) * (size_t)C * 2 * sizeof(float); }

template <typename T>
void bias_backward(float* dbias, const T* dout, int64_t M, int64_t N, float* partials, Stream stream);

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C, int V, int* err,
                       Stream stream);
template <typename T>
void embedding_backward(float* dwte, float* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C, int V,
                        int* err, Stream stream);

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* x, const T* w, const T* b, int64_t N, int C, float eps,
                       Stream stream);
template <typename T>
void layernorm_backward(T* dx, float* dw, float* db, const T* dout, const T* x, const T* w, const float* mean,
                        const float* rstd, int64_t N, int C, float* partials, Stream stream);
// the weights are (w_off + w): Gemma's norms have w_off 1
template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* x, const T* w, int64_t N, int C, float eps, float w_off,
                     Stream stream);
template <typename T>
void rmsnorm_backward(T* dx, float* dw, const T* dout, const T* x, const T* w, const float* rstd, int64_t N, int C,
                      float w_off, float* partials, Stream stream);

// Qwen3's per-head q and k RMSNorm (Backend::head_rmsnorm_*); partials: column_partials_bytes(N, hs)
template <typename T>
void head_rmsnorm_forward(T* out, float* rstd, const T* in, const T* wq, const T* wk, int64_t N, int NH, int NKV,
                          int hs, float eps, float w_off, Stream stream);
template <typename T>
void head_rmsnorm_backward(T* din, float* dwq, float* dwk, const T* dout, const T* in, const T* wq, const T* wk,
                           const float* rstd, int64_t N, int NH, int NKV, int hs, float w_off, float* partials,
                           Stream stream);

// pos: each row's position (i32 [B*T_]), or nullptr for t of the row's (b, t)
template <typename T>
void rope(T* qkv, const int32_t* pos, int B, int T_, int NH, int NKV, int hs, const RopeSpec& rope, float sign,
          Stream stream);
template <typename T>
void dropout(T* x, int B, int T_, int C, const Dropout& d, Stream stream);

// scratch_d: B*NH*T floats (rowsum(dout * out)) for the backward.
// doc: Backend::attention_forward's doc_start (device, [B*T_]) or nullptr; window: its sliding window
// (0 = none); scale (> 0) and softcap (0: none): its AttnScores, the scale resolved.
template <typename T>
void attention_forward(T* out, float* lse, const T* qkv, const int32_t* doc, int B, int T_, int NH, int NKV, int hs,
                       const Dropout& drop, int window, float scale, float softcap, Stream stream);
// D[o] = rowsum(dout * out) for each of the `rows` rows (b, t, h) of attention's output: the term
// every attention backward subtracts (FlashAttention-2's D).
// cuDNN's ragged batch for packed documents (doc: the i32 [B*T] starts of PackedDocs): for each of
// the `slots` sequences cuDNN's graph was built for, seq_len[slots] and the ragged offsets
// [slots + 1], in elements, of the qkv rows (R values a token), the out rows (C) and token-major
// stats (NH); the documents in order, then empty slots. slots must be at least the document count.
void document_batch(int32_t* seq_len, int32_t* qkv_off, int32_t* out_off, int32_t* stats_off, const int32_t* doc, int B,
                    int T, int slots, int R, int C, int NH, Stream stream);
// lse [B, NH, T] (llmt's) from cuDNN's token-major ragged stats [B*T, NH], and back.
void stats_to_lse(float* lse, const float* stats, int B, int T, int NH, Stream stream);
void lse_to_stats(float* stats, const float* lse, int B, int T, int NH, Stream stream);
template <typename T>
void attention_row_dots(float* D, const T* dout, const T* out, int64_t rows, int hs, Stream stream);
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* scratch_d,
                        const int32_t* doc, int B, int T_, int NH, int NKV, int hs, const Dropout& drop, int window,
                        float scale, float softcap, Stream stream);

// Backend::attention_kv: the new tokens' k and v into the cache, then their attention over it.
template <typename T>
void attention_kv(T* out, T* k_cache, T* v_cache, const T* qkv, const int32_t* key_start, int B, int Tn, int p0, int cap,
                  int NH, int NKV, int hs, int window, float scale, float softcap, Stream stream);

// loss_sum[0] += the rows' losses (row_losses: N doubles of scratch); dlogits may be nullptr or alias logits.
// Rows are ld elements apart. softcap > 0: as Backend::cross_entropy's (the logits capped first).
template <typename T>
void cross_entropy(double* loss_sum, double* row_losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                   int V, int64_t ld, float grad_scale, float softcap, int* err, Stream stream);
// Backend::logit_softcap: x[N rows ld apart, V] = cap tanh(x / cap) in place.
template <typename T>
void logit_softcap(T* x, int64_t N, int V, int64_t ld, float cap, Stream stream);

// dst[i] += src[i] across dtypes (f32 += bf16 and the like).
template <typename Td, typename Ts>
void accumulate_mixed(Td* dst, const Ts* src, int64_t n, Stream stream);

}  // namespace cuda
}  // namespace llmt
