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

constexpr uint64_t kSplitMixIncrement = 0x9e3779b97f4a7c15ull;

// A 64-bit draw as a double in (0, 1).
inline double uniform_from(uint64_t bits) { return ((bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
// Box-Muller's cosine half from two uniforms.
inline double box_muller(double u1, double u2) { return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2); }

// The state is a counter: draw j (from 1) of the stream that starts at state s0 is
// mix64(s0 + j * increment), so any draw can be computed without the ones before it (normal_at).
struct SplitMix64 {
  uint64_t s;
  uint64_t next() { return mix64(s += kSplitMixIncrement); }
  double uniform() { return uniform_from(next()); }
  double normal() {  // two draws, in this order
    const double u1 = uniform();
    const double u2 = uniform();
    return box_muller(u1, u2);
  }
};

// What the k-th normal() call (from 0) of SplitMix64{s0} returns.
inline double normal_at(uint64_t s0, uint64_t k) {
  return box_muller(uniform_from(mix64(s0 + (2 * k + 1) * kSplitMixIncrement)),
                    uniform_from(mix64(s0 + (2 * k + 2) * kSplitMixIncrement)));
}

}  // namespace llmt
