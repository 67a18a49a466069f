// The tiny models the multi-rank tests train. Odd sizes on purpose: GPT-2's units (6925 and 6805
// parameters at d_model 25) divide by none of 2, 3, 4; LLaMA's root (9342) not by 4, and it groups
// 3 query heads over 1 kv head.
#pragma once
#include "models/config.h"

inline llmt::ModelConfig tiny_model(llmt::Arch arch, int d_model = 0) {
  llmt::ModelConfig c;
  c.arch = arch;
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
