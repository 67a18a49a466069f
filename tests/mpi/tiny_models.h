// The tiny models the multi-rank tests train. Odd sizes on purpose: GPT-2's units (6925 and 6805
// parameters at d_model 25) divide by none of 2, 3, 4; LLaMA's root (9342) not by 4, and it groups
// 3 query heads over 1 kv head.
#pragma once
#include <cstdint>
#include <vector>

#include "models/config.h"

inline llmt::ModelConfig tiny_model(llmt::Arch arch, int d_model = 0) {
  llmt::ModelConfig c = llmt::base_config(arch);
  c.vocab_size = 259;
  c.max_seq_len = 16;
  c.n_layer = 2;
  c.n_head = arch == llmt::Arch::gpt2 ? 5 : 3;
  c.n_kv_head = arch == llmt::Arch::gpt2 ? 5 : 1;
  c.d_model = d_model ? d_model : arch == llmt::Arch::gpt2 ? 25 : 18;
  c.d_ff = arch == llmt::Arch::gpt2 ? 80 : 34;
  c.tied_embeddings = arch == llmt::Arch::gpt2;
  c.norm_eps = 1e-5f;
  return c;
}

// A global batch of n sequences of T tokens for step `step` (vocabulary 259), with some targets masked:
// the last position of every row, and a prompt-like prefix of 4 on every third row.
inline void tiny_global_batch(int step, int n, int T, std::vector<int32_t>& tokens, std::vector<int32_t>& targets) {
  tokens.resize((size_t)n * T);
  targets.resize((size_t)n * T);
  uint64_t s = 1000 + (uint64_t)step * 7919;
  for (int i = 0; i < n * T; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    tokens[i] = (int32_t)((s >> 33) % 259);
  }
  for (int b = 0; b < n; b++)
    for (int t = 0; t < T; t++) {
      int i = b * T + t;
      bool masked = t + 1 == T || (b % 3 == 0 && t < 4);
      targets[i] = masked ? -100 : tokens[i + 1];
    }
}
