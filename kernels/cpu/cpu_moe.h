// The CPU backend's mixture-of-experts ops other than the experts' matmuls (engine/backend/backend.h,
// "mixture of experts"): routing, grouping tokens by expert, combining the experts' outputs, the
// load-balancing loss, and their backwards. Plain loops over host memory, OpenMP across tokens or
// experts so that no two threads write one element and every sum has one order (the results do not
// depend on the thread count). `bf16` says whether act tensors hold bf16 (else f32).
#pragma once
#include <cstdint>

#include "engine/core/tensor.h"

namespace llmt::cpu_moe {

// torch.topk(x, k) on the CPU for one row of E floats: the indices of the k largest, largest first,
// ties broken as PyTorch's topk_impl_loop breaks them (its libstdc++ algorithms over (value, index)
// pairs: std::partial_sort when 64 k <= E, else std::nth_element then std::sort of the first k - 1).
void topk_row(const float* x, int E, int k, int32_t* idx);

void route(bool bf16, Tensor topk_idx, Tensor topk_w, Tensor probs, Tensor stats, Tensor logits, int64_t N, int E,
           int k, bool norm_topk, bool round_w, int threads);
void route_backward(bool bf16, Tensor dlogits, Tensor dtopk_w, Tensor probs, Tensor topk_idx, Tensor aux_grad,
                    int64_t N, int E, int k, bool norm_topk, int threads);
void dispatch(bool bf16, Tensor offsets, Tensor pos, Tensor xg, Tensor x, Tensor topk_idx, int64_t N, int E, int k,
              int C, int threads);
void undispatch(bool bf16, Tensor dx, Tensor dxg, Tensor pos, int64_t N, int k, int C, int threads);
void combine(bool bf16, Tensor out, Tensor residual, Tensor y, Tensor topk_w, Tensor pos, Tensor shared, Tensor gate,
             int64_t N, int k, int C, int threads);
void combine_backward(bool bf16, Tensor dy, Tensor dtopk_w, Tensor dshared, Tensor dgate, Tensor dout, Tensor y,
                      Tensor topk_w, Tensor pos, Tensor shared, Tensor gate, int64_t N, int k, int C, int threads);
void aux_loss(Tensor loss, Tensor grad, Tensor stats, int E, double rows, float coef, float grad_scale);

}  // namespace llmt::cpu_moe
