// cuDNN's fused attention (SDPA) for the CUDA backend (cudnn_attention.cpp): causal self-attention's
// forward and backward in bf16, through cudnn-frontend's graph API, one graph per shape built on first
// use and kept. Same operands and results as attention_forward / attention_backward (cuda_ops.h):
// qkv rows [q | k | v], out [B*T, NH*hs], lse [B, NH, T] the natural log-sum-exp of each row's scaled
// scores (cuDNN's softmax stats), so the other kernels' backward can follow a cuDNN forward.
//
// What it takes: bf16, head size a multiple of 8 up to 128, no dropout (cuDNN's dropout masks are not
// llmt's counter-based ones, which the CPU and the other kernels share), any score scale (the SDPA
// node's attn_scale), no soft cap (cudnn-frontend has a Softcap score modifier, but llmt does not
// build it: the backend runs the flash kernel for a soft cap, LLMT_ATTENTION=cudnn saying so once).
// Packed documents go to cuDNN as a ragged batch: each document one sequence (its length through the
// padding mask, its place in the rows through ragged offsets), top-left causal inside it, the batch
// padded with empty sequences to a power of two so that a handful of graphs serve every packing. A
// sliding window is the SDPA node's diagonal band left bound (top left, key j of query i kept where
// j + window > i, inside each document as the ragged batch aligns every sequence top left). The
// backward asks cuDNN for its deterministic algorithm, so a run repeats bit for bit.
//
// cuDNN is loaded when first used (dlopen libcudnn.so.9), so a machine without it runs llmt with the
// other kernels. In the emulated build the same code calls a CPU stand-in of the frontend's graph API
// (simt/cudnn_frontend_simt.h). A plain C++ header.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend/backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace llmt {
namespace cuda {

// Empty when this program can run cuDNN attention; otherwise why not (built without the
// cudnn-frontend headers, or libcudnn.so.9 does not load: dlerror's words). Loads cuDNN once.
const std::string& cudnn_attention_unavailable();
// Whether cuDNN attention takes head size hs (dropout and packing are the caller's to rule out); it
// says nothing of the library.
bool cudnn_attention_fits(int hs);
// Whether cuDNN can take packed documents of this shape (its ragged offsets are int32).
bool cudnn_attention_packs(int B, int T, int NH, int NKV, int hs);
// The sequences of the ragged batch for `docs` packed documents: the next power of two.
int cudnn_packed_slots(int64_t docs);
// "9.19.0 (frontend 1.32.0)", or the emulated build's stand-in.
std::string cudnn_attention_version();

// cuDNN's handle and the graphs built so far, with their workspaces: one per CUDA backend, made at
// its first cuDNN call (it throws llmt::Error when cuDNN is unavailable) and freed with it.
class CudnnAttention {
 public:
  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // As attention_forward (cuda_ops.h) for bf16, with no dropout; doc_start (or null) and docs as
  // PackedDocs (engine/backend/backend.h), window as Backend::attention_forward's (0 = none), scale
  // its AttnScores' (resolved, > 0; a graph per scale). False,
  // having done nothing, when cuDNN's heuristics find no engine for this shape (the caller runs
  // another kernel); throws llmt::Error, with cuDNN's message, when the library fails.
  bool forward(uint16_t* out, float* lse, const uint16_t* qkv, const int32_t* doc_start, int64_t docs, int B, int T,
               int NH, int NKV, int hs, int window, float scale, Stream stream);
  // As attention_backward (cuda_ops.h): dqkv (=) from dout and the forward's qkv, out and lse. False
  // as above.
  bool backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out, const float* lse,
                const int32_t* doc_start, int64_t docs, int B, int T, int NH, int NKV, int hs, int window,
                float scale, Stream stream);

  struct Plans;  // the frontend's types stay in cudnn_attention.cpp

 private:
  std::unique_ptr<Plans> p_;
};

}  // namespace cuda
}  // namespace llmt
