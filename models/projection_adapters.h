// The hook through which something beside the frozen weights adds to a block's linear projections
// (LoRA's adapters, models/lora.h): the model calls it right after each of the four block matmuls in
// forward and after each one's input-gradient product in backward, and beside each of its own
// UnitStore calls, so that the adapter's parameter unit u is held while the model holds unit u and
// its gradient is handed over when the model's is. transformer.cpp knows nothing more of it.
#pragma once
#include <cstdint>

#include "engine/backend/backend.h"

namespace llmt {

// A block weight matrix of llmt's layout (models/layout.h's BlockOffsets), [rows, in] as stored.
enum class BlockMatrix { qkv, attn_proj, mlp_in, mlp_out };
constexpr int kBlockMatrices = 4;

// One call of the hook: which block and matrix, the batch's rows (N = B * T) and the dropout the
// adapter's input takes at this site in this pass (inactive in evaluation or without dropout).
struct AdapterSite {
  int layer = 0;
  BlockMatrix matrix = BlockMatrix::qkv;
  int B = 0, T = 0;
  Dropout dropout;
};

class ProjectionAdapters {
 public:
  virtual ~ProjectionAdapters() = default;
  // Does an adapter sit on this matrix (in every block)? The block then runs the unfused form
  // where a fused op would hide the point of addition (GPT-2's matmul_gelu, matmul_dgelu).
  virtual bool adapts(BlockMatrix m) const = 0;
  // The dropout probability on the adapters' input (0: none); the model derives the masks' keys.
  virtual float dropout_p() const = 0;
  // y ([N, rows of m], the matrix's output, bias included) += the adapters' output for input x [N, in].
  virtual void forward(const AdapterSite& at, Tensor y, Tensor x) = 0;
  // From dy (laid out as y): the adapters' parameter gradients, and dx ([N, in]) += their input
  // gradient. x and the site as forward had them.
  virtual void backward(const AdapterSite& at, Tensor dy, Tensor x, Tensor dx) = 0;
  // A trainable replacement of the output head's weight [V, C] (PEFT's modules_to_save "lm_head"),
  // valid while unit 0 is held, or an empty tensor; and where its gradient goes (f32 [V, C]).
  virtual Tensor head_weight() { return Tensor(); }
  virtual Tensor head_grad() { return Tensor(); }
  // The same for the token embeddings [V, C] (modules_to_save "embed_tokens"): the input embedding
  // reads it instead of the base's table (a tied head keeps the base's), and the embedding's backward
  // writes its gradient (f32 [V, C], valid until grads_done(0)).
  virtual Tensor embed_weight() { return Tensor(); }
  virtual Tensor embed_grad() { return Tensor(); }
  // Beside the model's UnitStore calls of the same names, for the same unit.
  virtual void acquire(int unit) = 0;
  virtual void prefetch(int unit) = 0;
  virtual void release(int unit) = 0;
  virtual void grads_done(int unit) = 0;
  virtual void backward_done() = 0;
};

}  // namespace llmt
