// DType and Tensor: a non-owning view of device or host memory with a dtype and a shape.
// Ops receive Tensors so a backend can check what it is given; the memory belongs to whoever
// allocated it (a Backend allocation, a flat parameter buffer, an mmap).
#pragma once
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/core/error.h"

namespace llmt {

// The label / target id that contributes no loss (PyTorch CrossEntropyLoss's ignore_index, the
// Hugging Face convention for masked labels).
constexpr int32_t kIgnoreIndex = -100;

enum class DType : uint8_t { f32, bf16, i32, f64 };  // f64: device-side scalars (loss, norm)

size_t dtype_size(DType t);
const char* dtype_name(DType t);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* p, DType t, std::initializer_list<int64_t> dims);
  Tensor(void* p, DType t, const std::vector<int64_t>& dims);

  int64_t numel() const;
  size_t nbytes() const { return (size_t)numel() * dtype_size(dtype); }
  std::string shape_str() const;

  // Typed access; throws when the dtype is not the one asked for.
  float* f32() const;
  uint16_t* bf16() const;
  int32_t* i32() const;
  double* f64() const;
  // Elements [offset, offset + prod(dims)) of this tensor's flat buffer, as a tensor of shape dims.
  Tensor view(int64_t offset, std::initializer_list<int64_t> dims) const;
};

inline Tensor f32_tensor(float* p, std::initializer_list<int64_t> dims) { return Tensor(p, DType::f32, dims); }
inline Tensor i32_tensor(int32_t* p, std::initializer_list<int64_t> dims) { return Tensor(p, DType::i32, dims); }

// Scalar conversions. bf16: round to nearest even, NaN kept quiet. f16: IEEE half.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace llmt
