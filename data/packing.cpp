#include "data/packing.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "engine/core/error.h"

namespace llmt {

PackedRows pack_examples(const TokenDataset& ds, int row_len) {
  LLMT_CHECK(row_len >= 1, "packing: rows of %d tokens", row_len);
  PackedRows p;
  p.row_len = row_len;
  std::vector<int64_t> order((size_t)ds.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ds.length(a) > ds.length(b); });
  // rows by the room left in them: the fullest row that still fits is the first with room >= length
  std::multimap<int64_t, size_t> by_room;
  std::vector<int64_t>& used = p.row_tokens;
  for (int64_t i : order) {
    const int64_t len = ds.length(i);
    LLMT_CHECK(len <= row_len, "packing: example %lld has %lld tokens, more than a row's %d", (long long)i,
               (long long)len, row_len);
    if (len == 0) continue;
    auto it = by_room.lower_bound(len);
    size_t r;
    if (it == by_room.end()) {
      r = p.rows.size();
      p.rows.emplace_back();
      used.push_back(0);
    } else {
      r = it->second;
      by_room.erase(it);
    }
    p.rows[r].push_back(i);
    used[r] += len;
    p.tokens += len;
    p.longest = std::max(p.longest, used[r]);
    if (used[r] < row_len) by_room.emplace(row_len - used[r], r);
  }
  return p;
}

namespace {
// padding over batches of `batch` consecutive entries of order, each entry `len(entry)` tokens long
template <class Len>
double padding_of(const std::vector<int64_t>& order, int batch, Len len) {
  int64_t real = 0, computed = 0;
  for (size_t s = 0; s + (size_t)batch <= order.size(); s += (size_t)batch) {
    int64_t longest = 0;
    for (size_t k = s; k < s + (size_t)batch; k++) real += len(order[k]), longest = std::max(longest, len(order[k]));
    computed += longest * batch;
  }
  return computed > 0 ? 1.0 - (double)real / (double)computed : 0.0;
}
}  // namespace

double padding_fraction_unpacked(const TokenDataset& ds, const std::vector<int64_t>& order, int batch) {
  return padding_of(order, batch, [&](int64_t i) { return ds.length(i); });
}

double padding_fraction_packed(const PackedRows& p, const std::vector<int64_t>& order, int batch) {
  return padding_of(order, batch, [&](int64_t r) { return p.row_tokens[(size_t)r]; });
}

int collate_packed(const TokenDataset& ds, const PackedRows& p, const std::vector<int64_t>& idx, int pad_id,
                   std::vector<int32_t>& tokens, std::vector<int32_t>& targets, std::vector<int32_t>& doc_start) {
  LLMT_CHECK(!idx.empty(), "collate_packed: no rows");
  int64_t T = 0;
  for (int64_t r : idx) {
    LLMT_CHECK(r >= 0 && r < (int64_t)p.rows.size(), "collate_packed: row %lld of %zu", (long long)r, p.rows.size());
    T = std::max(T, p.row_tokens[(size_t)r]);
  }
  const int64_t B = (int64_t)idx.size();
  tokens.assign((size_t)(B * T), pad_id);
  targets.assign((size_t)(B * T), kIgnoreIndex);
  doc_start.assign((size_t)(B * T), 0);
  for (int64_t b = 0; b < B; b++) {
    int64_t at = 0;
    for (int64_t i : p.rows[(size_t)idx[(size_t)b]]) {
      const int64_t len = ds.length(i);
      const int32_t *x = ds.ids(i), *y = ds.labels(i);
      for (int64_t t = 0; t < len; t++) {
        tokens[(size_t)(b * T + at + t)] = x[t];
        doc_start[(size_t)(b * T + at + t)] = (int32_t)at;
        if (t + 1 < len) targets[(size_t)(b * T + at + t)] = y[t + 1];  // inside the example only
      }
      at += len;
    }
    for (int64_t t = at; t < T; t++) doc_start[(size_t)(b * T + t)] = (int32_t)at;  // the padding's own document
  }
  return (int)T;
}

}  // namespace llmt
