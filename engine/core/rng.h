// splitmix64: a small, well-mixed generator (Steele, Lea, Flood 2014), the same on every platform.
// Independent streams come from hashing their keys into the starting state: states that differ by a
// multiple of the increment would be the same stream shifted, so keys are never added in directly.
#pragma once
#include <cmath>
#include <cstdint>

namespace llmt {

// splitmix64's output function: a bijective 64-bit mix.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The starting state of stream (a, b), e.g. (seed, unit) or (seed, epoch).
inline uint64_t stream_state(uint64_t a, uint64_t b) { return mix64(mix64(a) ^ mix64(b + 0x632be59bd9b4e019ull)); }

struct SplitMix64 {
  uint64_t s;
  uint64_t next() { return mix64(s += 0x9e3779b97f4a7c15ull); }
  double uniform() { return ((next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // in (0, 1)
  double normal() { return std::sqrt(-2.0 * std::log(uniform())) * std::cos(6.283185307179586 * uniform()); }
};

}  // namespace llmt
