#include "engine/params/layout.h"

namespace llmt {

int64_t ParamSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<int64_t> ParamSpec::hf_shape() const {
  if (!hf_transposed) return shape;
  return {shape[1], shape[0]};
}

int64_t UnitLayout::add(const std::string& hf_name, std::vector<int64_t> shape, bool decay, bool hf_transposed) {
  numel = (numel + kParamAlign - 1) / kParamAlign * kParamAlign;
  return extend(hf_name, std::move(shape), decay, hf_transposed);
}

int64_t UnitLayout::extend(const std::string& hf_name, std::vector<int64_t> shape, bool decay, bool hf_transposed) {
  ParamSpec p;
  p.hf_name = hf_name;
  p.offset = numel;
  p.shape = std::move(shape);
  p.decay = decay;
  p.hf_transposed = hf_transposed;
  numel += p.numel();
  params.push_back(p);
  return p.offset;
}

}  // namespace llmt
