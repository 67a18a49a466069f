// Text generation with a KV cache (llmt generate): a batch of prompts, left-padded to the longest,
// prefilled in one pass, then one token per sequence per step until each stops at an EOS id or
// reaches max_new_tokens. Choosing a token is transformers' generate: greedy (do_sample=False)
// takes the first largest logit; sampling applies temperature, then top_k, then top_p (its
// TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper) and draws from the softmax.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/params/unit_store.h"
#include "models/transformer.h"

namespace llmt {

struct GenerateOptions {
  int max_new_tokens = 20;
  bool do_sample = false;
  double temperature = 1.0;  // > 0; the logits are scaled in double, so 1e-40 gives the greedy ids
  int top_k = 50;            // 0 = off (transformers' default is 50)
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  uint64_t seed = 42;        // sampling: a sequence's draws depend on (seed, its index, the step) only
  std::vector<int32_t> eos_ids;  // a sequence stops after producing one of these (it is kept)
  int32_t pad_id = 0;        // fed as left padding and after a sequence stopped; never attended
};

struct Generated {
  std::vector<int32_t> ids;  // the new tokens, an EOS last when it stopped at one
  bool stopped_at_eos = false;
};

struct GenerateTimes {
  double prefill_s = 0, decode_s = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;  // real tokens (not padding), over the batch
};

// Prompts (non-empty, at most model.seq_len() ids each, model.batch() of them; `first_index` is the
// first's index among all prompts, for the sampling streams) through `model` with parameters from
// `store`. The model must be sized for batch() sequences of the longest prompt, and the context must
// hold the longest prompt plus max_new_tokens.
std::vector<Generated> generate(Transformer& model, UnitStore& store, const std::vector<std::vector<int32_t>>& prompts,
                                const GenerateOptions& o, int64_t first_index = 0, GenerateTimes* times = nullptr);

// The next token from one row of logits (V floats) as `o` says; `u` is a uniform draw in (0, 1)
// (unused when greedy). Exposed for tests.
int32_t choose_token(const std::vector<float>& logits, const GenerateOptions& o, double u);

}  // namespace llmt
