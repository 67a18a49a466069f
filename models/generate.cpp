#include "models/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/rng.h"

namespace llmt {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Row `row` of the model's logits, as floats on the host.
// The V logits of one row; rows are `stride` apart (Transformer::logits_stride).
void read_logits_row(Backend& be, const Tensor& logits, int64_t stride, int64_t row, int V, std::vector<float>& out) {
  out.resize((size_t)V);
  const size_t width = dtype_size(logits.dtype);
  const char* src = (const char*)logits.data + (size_t)(row * stride) * width;
  if (logits.dtype == DType::f32) return be.copy_to_host(out.data(), src, sizeof(float) * V);
  std::vector<uint16_t> bits((size_t)V);
  be.copy_to_host(bits.data(), src, sizeof(uint16_t) * V);
  for (int i = 0; i < V; i++) out[i] = bf16_to_f32(bits[i]);
}
}  // namespace

int32_t choose_token(const std::vector<float>& logits, const GenerateOptions& o, double u) {
  const int V = (int)logits.size();
  LLMT_CHECK(V > 0, "choose_token: no logits");
  const int greedy = (int)(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (!o.do_sample) return greedy;
  // x = (logit - max) / T in double: at most 0, so a tiny temperature cannot overflow (1e-40 gave
  // x / T = inf, exp(inf - inf) = NaN and the last token every step); the max stays 0 and the other
  // tokens go to -inf, the greedy choice
  const double top = logits[(size_t)greedy];
  std::vector<double> x((size_t)V);
  for (int i = 0; i < V; i++) x[(size_t)i] = ((double)logits[(size_t)i] - top) / o.temperature;
  if (o.top_k > 0 && o.top_k < V) {  // keep the values at least the k-th largest (ties kept)
    std::vector<double> sorted(x);
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[(size_t)o.top_k - 1];
    for (double& v : x)
      if (v < kth) v = -INFINITY;
  }
  if (o.top_p < 1.0f) {  // drop the least likely tokens whose probabilities sum to at most 1 - top_p
    std::vector<double> p((size_t)V);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += (p[i] = std::exp(x[i]));
    std::vector<int> order((size_t)V);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] < x[b]; });
    double cum = 0;
    for (int k = 0; k + 1 < V; k++) {  // the most likely token always stays
      cum += p[order[k]] / sum;
      if (cum > 1.0 - (double)o.top_p) break;
      x[order[k]] = -INFINITY;
    }
  }
  double sum = 0;
  for (double v : x) sum += std::exp(v);
  const double target = u * sum;
  double cum = 0;
  int last = greedy;
  for (int i = 0; i < V; i++) {
    if (x[i] == -INFINITY) continue;
    last = i;
    cum += std::exp(x[i]);
    if (cum >= target) return i;
  }
  return last;  // u * sum rounded above the total
}

std::vector<Generated> generate(Transformer& model, UnitStore& store, const std::vector<std::vector<int32_t>>& prompts,
                                const GenerateOptions& o, int64_t first_index, GenerateTimes* times) {
  const int B = model.batch(), V = model.config().vocab_size;
  LLMT_CHECK((int)prompts.size() == B, "generate: %zu prompts for a model sized for %d", prompts.size(), B);
  LLMT_CHECK(o.max_new_tokens >= 1, "generate: max_new_tokens = %d, expected at least 1", o.max_new_tokens);
  LLMT_CHECK(!o.do_sample || o.temperature > 0.0f, "generate: temperature %g, expected > 0", o.temperature);
  LLMT_CHECK(!o.do_sample || (o.top_p > 0.0f && o.top_p <= 1.0f), "generate: top_p %g, expected in (0, 1]", o.top_p);
  LLMT_CHECK(o.pad_id >= 0 && o.pad_id < V, "generate: pad id %d outside the vocabulary of %d", o.pad_id, V);
  int P = 0;
  for (size_t b = 0; b < prompts.size(); b++) {
    LLMT_CHECK(!prompts[b].empty(), "generate: prompt %lld has no tokens", (long long)(first_index + (int64_t)b));
    P = std::max(P, (int)prompts[b].size());
  }
  LLMT_CHECK(P <= model.seq_len(), "generate: a prompt of %d tokens, the model was sized for %d", P, model.seq_len());

  // left padding: sequence b's real tokens begin at key_start[b]
  std::vector<int32_t> key_start((size_t)B), tokens((size_t)B * P, o.pad_id);
  int64_t real = 0;
  for (int b = 0; b < B; b++) {
    const auto& p = prompts[(size_t)b];
    key_start[(size_t)b] = P - (int)p.size();
    std::copy(p.begin(), p.end(), tokens.begin() + (size_t)b * P + key_start[(size_t)b]);
    real += (int64_t)p.size();
  }
  Backend& be = model.backend();
  double t0 = now_s();
  model.start_generation(P + o.max_new_tokens, key_start);
  model.decode(store, tokens.data(), P);

  std::vector<Generated> out((size_t)B);
  std::vector<float> row;
  std::vector<int32_t> next((size_t)B, o.pad_id);
  // every sequence's tokens so far (padding included), for longrope's one recomputation
  std::vector<std::vector<int32_t>> history((size_t)B);
  for (int b = 0; b < B; b++)
    history[(size_t)b].assign(tokens.begin() + (size_t)b * P, tokens.begin() + (size_t)(b + 1) * P);
  int rows_per_seq = P;  // the last decode's rows: the prefill's, then the one new row
  int live = B;
  for (int step = 0; step < o.max_new_tokens && live > 0; step++) {
    for (int b = 0; b < B; b++) {
      Generated& g = out[(size_t)b];
      if (g.stopped_at_eos) {
        next[(size_t)b] = o.pad_id;
        continue;
      }
      read_logits_row(be, model.logits(), model.logits_stride(), (int64_t)b * rows_per_seq + rows_per_seq - 1, V, row);
      double u = 0.5;
      if (o.do_sample) {
        SplitMix64 rng{stream_state(stream_state(o.seed, (uint64_t)(first_index + b)), (uint64_t)step)};
        u = rng.uniform();
      }
      const int32_t id = choose_token(row, o, u);
      g.ids.push_back(id);
      next[(size_t)b] = id;
      if (times && step > 0) times->decode_tokens++;
      if (std::find(o.eos_ids.begin(), o.eos_ids.end(), id) != o.eos_ids.end()) g.stopped_at_eos = true, live--;
    }
    if (step == 0) {
      if (times) times->prefill_s += now_s() - t0, times->prefill_tokens += real;
      t0 = now_s();
    }
    if (live == 0 || step + 1 == o.max_new_tokens) break;
    for (int b = 0; b < B; b++) history[(size_t)b].push_back(next[(size_t)b]);
    if (model.decode_needs_long_restart(1)) {
      // longrope: this pass passes the original context, so the long factors apply to every key;
      // transformers' Phi-3 drops its cache here and recomputes the sequence, and so does llmt (in
      // passes of at most seq_len() tokens, all with the long factors)
      const int len = (int)history[0].size();
      model.start_generation(P + o.max_new_tokens, key_start, true);
      std::vector<int32_t> chunk;
      for (int at = 0; at < len; at += rows_per_seq) {
        rows_per_seq = std::min(model.seq_len(), len - at);
        chunk.clear();
        for (int b = 0; b < B; b++)
          chunk.insert(chunk.end(), history[(size_t)b].begin() + at, history[(size_t)b].begin() + at + rows_per_seq);
        model.decode(store, chunk.data(), rows_per_seq);
      }
      continue;
    }
    model.decode(store, next.data(), 1);
    rows_per_seq = 1;
  }
  if (times) times->decode_s += now_s() - t0;
  return out;
}

}  // namespace llmt
