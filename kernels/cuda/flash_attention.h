// Attention on tensor cores (flash_attention.cu): causal self-attention's forward and backward in
// bf16 at head size 64 or 128, FlashAttention-2's way; the plain kernels of cuda_ops.cu take every
// other case and are the reference these are checked against. A plain C++ header.
#pragma once
#include <cstddef>
#include <cstdint>

#include "engine/backend/backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace llmt {
namespace cuda {

// LLMT_ATTENTION, read when a CUDA backend is made: cudnn (cuDNN's fused attention,
// cudnn_attention.h), flash (these kernels) or plain (the plain kernels), each where it fits and the
// next otherwise; unset, automatic: cudnn where cuDNN loads on a GPU, else flash. Anything else is an
// error naming the value.
enum class AttentionImpl { automatic, cudnn, flash, plain };
AttentionImpl attention_impl();
const char* attention_impl_name(AttentionImpl impl);  // "cudnn", "flash", "plain", "automatic"
bool flash_attention_fits(int hs);

// As attention_forward (cuda_ops.h) for bf16 tensors: out[B*T, NH*hs], lse[B, NH, T] from qkv rows
// [q | k | v], dropout on the probabilities as the Backend op says; doc: its doc_start (device,
// [B*T_]) or nullptr; window: its sliding window (0 = none); scale (> 0) and softcap (0: none): its
// AttnScores, the scale resolved.
void flash_attention_forward(uint16_t* out, float* lse, const uint16_t* qkv, const int32_t* doc, int B, int T_, int NH,
                             int NKV, int hs, const Dropout& drop, int window, float scale, float softcap,
                             Stream stream);
// As attention_backward (cuda_ops.h) for bf16 tensors: dqkv (=) from dout, the forward's qkv and
// lse, and D = rowsum(dout * out) from attention_row_dots. Deterministic: no atomics.
// dq_partial: a device scratch of flash_backward_scratch_bytes(...) bytes (the splits' f32 sums of dQ).
size_t flash_backward_scratch_bytes(int B, int T_, int NH, int NKV, int hs);
void flash_attention_backward(uint16_t* dqkv, float* dq_partial, const uint16_t* dout, const uint16_t* qkv,
                              const float* lse, const float* D, const int32_t* doc, int B, int T_, int NH, int NKV,
                              int hs, const Dropout& drop, int window, float scale, float softcap, Stream stream);

}  // namespace cuda
}  // namespace llmt
