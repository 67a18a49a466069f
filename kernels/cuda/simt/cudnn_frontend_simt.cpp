// cudnn-frontend's SDPA graphs on the CPU for the emulated build (cudnn_frontend_simt.h says what this
// is for, the semantics it implements and what it cannot show).
#include "kernels/cuda/simt/cudnn_frontend_simt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "engine/core/error.h"
#include "engine/core/tensor.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

namespace cudnn_frontend {

namespace detail {
cudnnStatus_t create_handle(cudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  *handle = new cudnnContext();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t destroy_handle(cudnnHandle_t handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  delete handle;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t set_stream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}
const char* get_error_string(cudnnStatus_t status) {
  return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_BAD_PARAM";
}
size_t get_backend_version() { return 0; }
}  // namespace detail

namespace graph {

namespace {

error_t refuse(error_code_t code, const std::string& why) { return error_t(code, "[stand-in] " + why); }

bool same_dims(const Graph::T& t, std::vector<int64_t> want) { return t->get_dim() == want; }

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

Graph::T Graph::tensor(const Tensor_attributes& a) {
  tensors_.push_back(std::make_shared<Tensor_attributes>(a));
  return tensors_.back();
}

std::array<Graph::T, 2> Graph::sdpa(T q, T k, T v, SDPA_attributes attrs) {
  node_ = node_ ? -1 : 1;  // -1: more than one node, which validate refuses
  fwd_ = attrs;
  q_ = q, k_ = k, v_ = v;
  o_ = tensor(Tensor_attributes().set_name(attrs.name + "::O"));
  stats_ = tensor(Tensor_attributes().set_name(attrs.name + "::Stats"));
  return {o_, stats_};
}

std::array<Graph::T, 3> Graph::sdpa_backward(T q, T k, T v, T o, T dO, T stats, SDPA_backward_attributes attrs) {
  node_ = node_ ? -1 : 2;
  bwd_ = attrs;
  q_ = q, k_ = k, v_ = v, o_ = o, do_ = dO, stats_ = stats;
  dq_ = tensor(Tensor_attributes().set_name(attrs.name + "::dQ"));
  dk_ = tensor(Tensor_attributes().set_name(attrs.name + "::dK"));
  dv_ = tensor(Tensor_attributes().set_name(attrs.name + "::dV"));
  return {dq_, dk_, dv_};
}

error_t Graph::step(Stage from, Stage to, const char* what) {
  if (stage_ != from) return refuse(error_code_t::INVALID_VALUE, std::string(what) + " called out of order");
  stage_ = to;
  return {};
}

error_t Graph::validate() {
  if (stage_ != Stage::made) return refuse(error_code_t::INVALID_VALUE, "validate called twice");
  if (node_ <= 0) return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "the stand-in runs graphs of one SDPA node");
  if (io_ != DataType_t::BFLOAT16) return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "the stand-in computes bf16 io only");
  if (intermediate_ != DataType_t::FLOAT || compute_ != DataType_t::FLOAT)
    return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "intermediate and compute types must be FLOAT");
  std::set<int64_t> uids;
  for (auto& t : tensors_) {
    if (t->get_data_type() == DataType_t::NOT_SET)
      t->set_data_type(t == stats_ ? intermediate_ : io_);
    if (t->get_data_type() == DataType_t::INT32 || t->get_data_type() == DataType_t::INT64)
      index_.insert(t.get());  // sequence lengths or ragged offsets, checked below
    const bool made_here = node_ == 1 ? (t == o_ || t == stats_) : (t == dq_ || t == dk_ || t == dv_);
    if (made_here && !t->get_is_output())
      return refuse(error_code_t::GRAPH_NOT_SUPPORTED, t->get_name() + " is virtual: mark it set_output(true)");
    if (!t->has_uid()) return refuse(error_code_t::ATTRIBUTE_NOT_SET, t->get_name() + ": no uid");
    if (!uids.insert(t->get_uid()).second)
      return refuse(error_code_t::INVALID_VALUE, t->get_name() + ": uid " + std::to_string(t->get_uid()) + " used twice");
    if (t->get_dim().size() != 4 || t->get_stride().size() != 4)
      return refuse(error_code_t::ATTRIBUTE_NOT_SET, t->get_name() + ": needs 4 dims and 4 strides");
    if (t->get_stride()[3] != 1)
      return refuse(error_code_t::GRAPH_NOT_SUPPORTED, t->get_name() + ": the last dim's stride must be 1");
    for (int64_t d : t->get_dim())
      if (d <= 0) return refuse(error_code_t::INVALID_VALUE, t->get_name() + ": dims " + dims_text(t->get_dim()));
  }
  const auto& qd = q_->get_dim();
  const auto& kd = k_->get_dim();
  const int64_t b = qd[0], hq = qd[1], s = qd[2], d = qd[3], hk = kd[1];
  if (kd[0] != b || kd[2] != s || kd[3] != d || !same_dims(v_, kd))
    return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "k and v must be [b, h_k, s, d] with q's b, s and d (the stand-in "
                                                     "takes s_q = s_kv and d_v = d_qk)");
  if (hq % hk != 0) return refuse(error_code_t::INVALID_VALUE, "query heads do not group over the kv heads");
  if (d % 8 != 0 || d > 256)
    return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "hidden_dim must be a multiple of 8, at most 256");
  if (!same_dims(o_, {b, hq, s, d})) return refuse(error_code_t::INVALID_VALUE, "o dims " + dims_text(o_->get_dim()));
  if (!same_dims(stats_, {b, hq, s, 1}) || stats_->get_data_type() != DataType_t::FLOAT)
    return refuse(error_code_t::INVALID_VALUE, "stats must be FLOAT [b, h_q, s_q, 1]");
  for (const T& t : {q_, k_, v_, o_})
    if (t->get_data_type() != DataType_t::BFLOAT16)
      return refuse(error_code_t::GRAPH_NOT_SUPPORTED, t->get_name() + " is not bf16");
  // padded and ragged batches
  const Padding& pad = padding();
  auto index_dims_ok = [&](const T& t, int64_t n) {
    return t && index_.count(t.get()) && same_dims(t, {n, 1, 1, 1});
  };
  if (pad.padding_mask) {
    if (!pad.seq_len_q || !pad.seq_len_kv)
      return refuse(error_code_t::ATTRIBUTE_NOT_SET, "Padding mask requires seq_len_q and seq_len_kv to be set.");
    if (!index_dims_ok(pad.seq_len_q, b) || !index_dims_ok(pad.seq_len_kv, b) ||
        pad.seq_len_q->get_data_type() != DataType_t::INT32 || pad.seq_len_kv->get_data_type() != DataType_t::INT32)
      return refuse(error_code_t::INVALID_VALUE, "seq_len_q and seq_len_kv must be INT32 [b, 1, 1, 1], b = " +
                                                     std::to_string(b));
  } else if (pad.seq_len_q || pad.seq_len_kv) {
    return refuse(error_code_t::INVALID_VALUE, "seq_len_q and seq_len_kv needs to be set only if padding mask is enabled.");
  }
  bool ragged = false;
  for (const T& t : {q_, k_, v_, o_, stats_, do_, dq_, dk_, dv_}) {
    if (!t || !t->get_ragged_offset()) continue;
    ragged = true;
    if (!index_dims_ok(t->get_ragged_offset(), b + 1))
      return refuse(error_code_t::INVALID_VALUE, t->get_name() + ": its ragged offset must be INT32 or INT64 [b + 1, 1, 1, 1] "
                                                 "and a tensor of the graph");
  }
  if (ragged && !pad.padding_mask)
    return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "ragged offsets are supported with the padding mask only");
  if ((pad.max_total_q >= 0 || pad.max_total_kv >= 0) && !ragged)
    return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "max_total_seq_len_q/kv is only supported with packed (ragged) layout");
  {
    const bool left_set = node_ == 1 ? fwd_.left_set : bwd_.left_set, causal = node_ == 1 ? fwd_.causal : bwd_.causal;
    const int left = node_ == 1 ? fwd_.left_bound : bwd_.left_bound;
    if (left_set && left <= 0)
      return refuse(error_code_t::INVALID_VALUE, "Left bound (Sliding window length) should be greater than zero when set.");
    if (left_set && !causal)
      return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "the stand-in takes a left bound (sliding window) with the causal "
                                                       "mask (top left) only");
  }
  if (node_ == 1) {
    if (fwd_.generate_stats < 0)
      return refuse(error_code_t::ATTRIBUTE_NOT_SET, "generate_stats (or is_inference) is not set");
    if (fwd_.generate_stats == 0)
      return refuse(error_code_t::GRAPH_NOT_SUPPORTED, "the stand-in runs training graphs (generate_stats) only");
  } else {
    if (!same_dims(do_, o_->get_dim()) || !same_dims(dq_, qd) || !same_dims(dk_, kd) || !same_dims(dv_, kd))
      return refuse(error_code_t::INVALID_VALUE, "dO, dQ, dK, dV must have O's, Q's, K's and V's dims");
    for (const T& t : {do_, dq_, dk_, dv_})
      if (t->get_data_type() != DataType_t::BFLOAT16)
        return refuse(error_code_t::GRAPH_NOT_SUPPORTED, t->get_name() + " is not bf16");
  }
  stage_ = Stage::validated;
  return {};
}

error_t Graph::build_operation_graph(cudnnHandle_t handle) {
  if (!handle) return refuse(error_code_t::INVALID_VALUE, "build_operation_graph: no handle");
  return step(Stage::validated, Stage::op_graph, "build_operation_graph");
}
error_t Graph::create_execution_plans(const std::vector<HeurMode_t>& modes) {
  if (modes.empty()) return refuse(error_code_t::INVALID_VALUE, "create_execution_plans: no heuristics mode");
  return step(Stage::op_graph, Stage::plans, "create_execution_plans");
}
error_t Graph::check_support(cudnnHandle_t handle) {
  if (!handle) return refuse(error_code_t::INVALID_VALUE, "check_support: no handle");
  return step(Stage::plans, Stage::supported, "check_support");
}
error_t Graph::build_plans(cudnnHandle_t handle, BuildPlanPolicy_t, bool) {
  if (!handle) return refuse(error_code_t::INVALID_VALUE, "build_plans: no handle");
  return step(Stage::supported, Stage::built, "build_plans");
}

error_t Graph::get_workspace_size(int64_t& bytes) const {
  if (stage_ != Stage::built) return refuse(error_code_t::INVALID_VALUE, "get_workspace_size before build_plans");
  const auto& qd = q_->get_dim();
  // backward: the dQ accumulator, over b x s_q queries or, packed, over max_total_seq_len_q
  const int64_t queries = padding().max_total_q >= 0 ? padding().max_total_q : qd[0] * qd[2];
  bytes = node_ == 2 ? queries * qd[1] * qd[3] * (int64_t)sizeof(float) : 0;
  return {};
}

error_t Graph::execute(cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack, void* workspace) const {
  if (!handle) return refuse(error_code_t::INVALID_VALUE, "execute: no handle");
  if (stage_ != Stage::built) return refuse(error_code_t::INVALID_VALUE, "execute before build_plans");
  for (const auto& [uid, p] : pack) {
    bool known = false;
    for (const T& t : tensors_) known = known || t->get_uid() == uid;
    if (!known) return refuse(error_code_t::INVALID_VALUE, "the variant pack names uid " + std::to_string(uid) +
                                                               ", which no tensor of the graph has");
    (void)p;
  }
  auto ptr = [&](const T& t) -> void* {
    auto it = pack.find(t->get_uid());
    return it == pack.end() ? nullptr : it->second;
  };
  for (const T& t : tensors_)
    if (!ptr(t)) return refuse(error_code_t::INVALID_VALUE, t->get_name() + ": no pointer in the variant pack");
  int64_t ws_bytes = 0;
  (void)get_workspace_size(ws_bytes);
  if (ws_bytes > 0 && !workspace) return refuse(error_code_t::INVALID_VALUE, "execute: no workspace");

  llmt::simt::HostAccess open;  // the buffers are device memory, as a kernel's
  const auto& qd = q_->get_dim();
  const int64_t B = qd[0], HQ = qd[1], S = qd[2], D = qd[3], HK = k_->get_dim()[1], group = HQ / HK;
  const bool causal = node_ == 1 ? fwd_.causal : bwd_.causal;
  const double scale = node_ == 1 ? fwd_.attn_scale : bwd_.attn_scale;
  const Padding& pad = padding();
  // an int tensor's element i (int32 or int64, as its type says)
  auto index_at = [&](const T& t, int64_t i) -> int64_t {
    const void* p = ptr(t);
    return t->get_data_type() == DataType_t::INT64 ? ((const int64_t*)p)[i] : ((const int32_t*)p)[i];
  };
  // each sequence's queries and keys: the padding mask's lengths, else all S
  std::vector<int64_t> len_q(B, S), len_kv(B, S), tok0(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    if (pad.padding_mask) {
      len_q[b] = index_at(pad.seq_len_q, b);
      len_kv[b] = index_at(pad.seq_len_kv, b);
      if (len_q[b] < 0 || len_q[b] > S || len_kv[b] < 0 || len_kv[b] > S)
        return refuse(error_code_t::GRAPH_EXECUTION_FAILED, "sequence " + std::to_string(b) + " has " +
                                                                std::to_string(len_q[b]) + " queries and " +
                                                                std::to_string(len_kv[b]) + " keys, over s = " +
                                                                std::to_string(S));
    }
    tok0[b + 1] = tok0[b] + len_q[b];
  }
  if (pad.max_total_q >= 0 && tok0[B] > pad.max_total_q)
    return refuse(error_code_t::GRAPH_EXECUTION_FAILED, "the sequences hold " + std::to_string(tok0[B]) +
                                                            " queries, over max_total_seq_len_q " +
                                                            std::to_string(pad.max_total_q));
  // tensor t's element [b, h, s, d]: sequence b at its ragged offset, else b batch strides in
  auto at = [&](const T& t, int64_t b, int64_t h, int64_t s, int64_t d) {
    const auto& st = t->get_stride();
    const int64_t base = t->get_ragged_offset() ? index_at(t->get_ragged_offset(), b) : b * st[0];
    return base + h * st[1] + s * st[2] + d * st[3];
  };
  auto bf = [](const void* base, int64_t i) { return (double)llmt::bf16_to_f32(((const uint16_t*)base)[i]); };
  auto put = [](void* base, int64_t i, double x) { ((uint16_t*)base)[i] = llmt::f32_to_bf16((float)x); };
  const void *q = ptr(q_), *k = ptr(k_), *v = ptr(v_);
  float* stats = (float*)ptr(stats_);
  std::vector<double> score(S);
  // the keys query i of sequence b sees: from its left bound (key j > i - W) to first_of .. keys_of - 1:
  // causal (top left: key j <= i) and within the sequence
  const bool left_set = node_ == 1 ? fwd_.left_set : bwd_.left_set;
  const int64_t left = node_ == 1 ? fwd_.left_bound : bwd_.left_bound;
  auto first_of = [&](int64_t i) { return left_set ? std::max<int64_t>(0, i - left + 1) : 0; };
  auto keys_of = [&](int64_t b, int64_t i) { return causal ? std::min(i + 1, len_kv[b]) : len_kv[b]; };

  if (node_ == 1) {
    void* o = ptr(o_);
    std::vector<double> acc(D);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < HQ; ++h)
        for (int64_t i = 0; i < len_q[b]; ++i) {
          const int64_t keys = keys_of(b, i), j0 = first_of(i);
          double m = -INFINITY;
          for (int64_t j = j0; j < keys; ++j) {
            double dot = 0;
            for (int64_t d = 0; d < D; ++d) dot += bf(q, at(q_, b, h, i, d)) * bf(k, at(k_, b, h / group, j, d));
            score[j] = scale * dot;
            m = std::max(m, score[j]);
          }
          double sum = 0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t j = j0; j < keys; ++j) {
            const double p = std::exp(score[j] - m);
            sum += p;
            for (int64_t d = 0; d < D; ++d) acc[d] += p * bf(v, at(v_, b, h / group, j, d));
          }
          for (int64_t d = 0; d < D; ++d) put(o, at(o_, b, h, i, d), acc[d] / sum);
          stats[at(stats_, b, h, i, 0)] = (float)(m + std::log(sum));
        }
    return {};
  }

  const void *o = ptr(o_), *dout = ptr(do_);
  void *dq = ptr(dq_), *dk = ptr(dk_), *dv = ptr(dv_);
  // dQ accumulates in f32 in the workspace, as cuDNN's does: [B, HQ, S, D], or, packed with
  // max_total_seq_len_q, [queries of all sequences, HQ, D]
  float* dq_acc = (float*)workspace;
  const bool packed_ws = pad.max_total_q >= 0;
  auto dq_at = [&](int64_t b, int64_t h, int64_t i) {
    return packed_ws ? ((tok0[b] + i) * HQ + h) * D : ((b * HQ + h) * S + i) * D;
  };
  std::vector<double> dk_acc(HK * S * D), dv_acc(HK * S * D);  // one sequence's
  std::vector<float> dq_row(D);  // f32, as cuDNN accumulates dQ
  // Without the deterministic algorithm cuDNN adds into dQ with atomics, in whatever order the blocks
  // finish; the stand-in sums the keys from a point that moves each call, so such a run does not repeat.
  const int64_t start = bwd_.deterministic ? 0 : calls_++;
  for (int64_t b = 0; b < B; ++b) {
    std::fill(dk_acc.begin(), dk_acc.end(), 0.0);
    std::fill(dv_acc.begin(), dv_acc.end(), 0.0);
    for (int64_t h = 0; h < HQ; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < len_q[b]; ++i) {
        const int64_t keys = keys_of(b, i), j0 = first_of(i), count = keys - j0;
        double row_dot = 0;  // rowsum(dO O), from O as stored
        for (int64_t d = 0; d < D; ++d) row_dot += bf(dout, at(do_, b, h, i, d)) * bf(o, at(o_, b, h, i, d));
        const double lse = stats[at(stats_, b, h, i, 0)];
        std::fill(dq_row.begin(), dq_row.end(), 0.0f);
        for (int64_t jj = 0; jj < count; ++jj) {
          const int64_t j = j0 + (jj + start) % count;
          double dot = 0, dp = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += bf(q, at(q_, b, h, i, d)) * bf(k, at(k_, b, hk, j, d));
            dp += bf(dout, at(do_, b, h, i, d)) * bf(v, at(v_, b, hk, j, d));
          }
          const double p = std::exp(scale * dot - lse), ds = p * (dp - row_dot);
          double* dkj = &dk_acc[(hk * S + j) * D];
          double* dvj = &dv_acc[(hk * S + j) * D];
          for (int64_t d = 0; d < D; ++d) {
            dq_row[d] += (float)(scale * ds * bf(k, at(k_, b, hk, j, d)));
            dkj[d] += scale * ds * bf(q, at(q_, b, h, i, d));
            dvj[d] += p * bf(dout, at(do_, b, h, i, d));
          }
        }
        for (int64_t d = 0; d < D; ++d) dq_acc[dq_at(b, h, i) + d] = dq_row[d];
      }
    }
    for (int64_t h = 0; h < HQ; ++h)
      for (int64_t i = 0; i < len_q[b]; ++i)
        for (int64_t d = 0; d < D; ++d) put(dq, at(dq_, b, h, i, d), dq_acc[dq_at(b, h, i) + d]);
    for (int64_t h = 0; h < HK; ++h)
      for (int64_t j = 0; j < len_kv[b]; ++j)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t n = (h * S + j) * D + d;
          put(dk, at(dk_, b, h, j, d), dk_acc[n]);
          put(dv, at(dv_, b, h, j, d), dv_acc[n]);
        }
  }
  return {};
}

}  // namespace graph
}  // namespace cudnn_frontend
