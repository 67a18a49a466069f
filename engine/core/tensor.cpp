#include "engine/core/tensor.h"

#include <cmath>

namespace llmt {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::f64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::f64: return "f64";
  }
  return "?";
}

Tensor::Tensor(void* p, DType t, std::initializer_list<int64_t> dims) : data(p), dtype(t) {
  LLMT_CHECK(dims.size() <= 4, "Tensor: at most 4 dimensions, got %zu", dims.size());
  for (int64_t d : dims) shape[ndim++] = d;
}

Tensor::Tensor(void* p, DType t, const std::vector<int64_t>& dims) : data(p), dtype(t) {
  LLMT_CHECK(dims.size() <= 4, "Tensor: at most 4 dimensions, got %zu", dims.size());
  for (int64_t d : dims) shape[ndim++] = d;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

float* Tensor::f32() const {
  LLMT_CHECK(dtype == DType::f32, "expected an f32 tensor, got %s %s", dtype_name(dtype), shape_str().c_str());
  return (float*)data;
}
uint16_t* Tensor::bf16() const {
  LLMT_CHECK(dtype == DType::bf16, "expected a bf16 tensor, got %s %s", dtype_name(dtype), shape_str().c_str());
  return (uint16_t*)data;
}
int32_t* Tensor::i32() const {
  LLMT_CHECK(dtype == DType::i32, "expected an i32 tensor, got %s %s", dtype_name(dtype), shape_str().c_str());
  return (int32_t*)data;
}

double* Tensor::f64() const {
  LLMT_CHECK(dtype == DType::f64, "expected an f64 tensor, got %s %s", dtype_name(dtype), shape_str().c_str());
  return (double*)data;
}

Tensor Tensor::view(int64_t offset, std::initializer_list<int64_t> dims) const {
  Tensor t((char*)data + offset * (int64_t)dtype_size(dtype), dtype, dims);
  LLMT_CHECK(offset >= 0 && offset + t.numel() <= numel(), "view [%lld, +%lld) outside a tensor of %lld elements",
             (long long)offset, (long long)t.numel(), (long long)numel());
  return t;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp((float)mant, -24);  // zero and subnormals
    return sign ? -f : f;
  }
  uint32_t u;
  if (exp == 31) u = sign | 0x7f800000u | (mant << 13);  // inf, NaN
  else u = sign | ((exp + 112) << 23) | (mant << 13);
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;            // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;           // overflow to inf (rounds past 65504)
  if (a < 0x33000001u) return sign;                     // underflow to zero
  int exp = (int)(a >> 23) - 127;
  uint32_t mant = (a & 0x7fffff) | 0x800000;
  int shift = exp >= -14 ? 13 : 13 + (-14 - exp);       // normal vs subnormal result
  uint32_t half_mant = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (half_mant & 1))) half_mant++;
  // a rounding carry out of the mantissa rolls into the exponent because the fields are adjacent
  uint32_t out = exp >= -14 ? ((uint32_t)(exp + 15) << 10) + (half_mant - 0x400) : half_mant;
  return sign | (uint16_t)out;
}

}  // namespace llmt
