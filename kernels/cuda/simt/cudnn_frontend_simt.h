// The CPU stand-in for cudnn-frontend's graph API in the emulated build: the part that
// kernels/cuda/cudnn_attention.cpp calls (a graph of one SDPA node, forward or backward), with the
// frontend's names and signatures and cuDNN's documented semantics, computed on the emulator's device
// buffers (host memory). It lets cudnn_attention.cpp's own code (the [batch, head, sequence, hs]
// views into llmt's packed qkv rows, the stats as llmt's lse, the uids of the variant pack, the
// per-shape cache, the workspace) run in ctest under LLMT_ATTENTION=cudnn. What it cannot show:
// cuDNN's kernels, their rounding and speed, and which shapes its heuristics accept; those are
// checked on a GPU (scripts/gpu_selftest.sh runs the same tests against the real library).
//
// Semantics (cuDNN's "Scaled Dot Product Attention" in its graph API documentation). Tensors are
// 4-d, [batch, heads, sequence, hidden], any strides with the last one 1; K and V may have fewer
// heads than Q (grouped query attention: query head h reads kv head h / (h_q / h_k)).
//   forward:  S = attn_scale Q K^T, causal (TOP_LEFT, right bound 0: key j <= query i), with a
//             diagonal band left bound W (set_diagonal_band_left_bound, set_sliding_window_length:
//             the frontend's sliding_window_mask keeps column + W > row) also j > i - W, P =
//             softmax(S), O = P V; with generate_stats, Stats [b, h_q, s_q, 1] (f32) = the natural
//             log-sum-exp of each row of S.
//   padded and ragged batches: with set_padding_mask(true), sequence b has seq_len_q[b] queries and
//             seq_len_kv[b] keys (int32 [b, 1, 1, 1] tensors), the causal diagonal per sequence; a
//             tensor with a ragged offset (int32 or int64 [b + 1, 1, 1, 1], in elements) has its
//             sequence b at offset[b] instead of b times its batch stride, which is not used. Ragged
//             tensors need the padding mask; set_max_total_seq_len_q bounds the backward's dQ
//             workspace by the queries of all sequences (token-packed) instead of b x s_q.
//   backward: from Q, K, V, O, dO and Stats: P = exp(S - Stats), dV = P^T dO, dP = dO V^T,
//             dS = P (dP - rowsum(dO O)), dQ = attn_scale dS K, dK = attn_scale dS^T Q; dK and dV
//             sum over the query heads of a group. It reports a workspace (an f32 dQ accumulator, as
//             cuDNN's backward has) and uses it, so a missing one fails.
// Accumulation is in double (dQ's in f32, in the workspace); each output is rounded once to its type.
// Without set_deterministic_algorithm(true) the backward's dQ sums run in an order that changes
// from call to call, as cuDNN's atomics make them, so a run that needs repeatability and forgets to
// ask for it fails its repeat checks here too. Graphs the documentation
// rules out (a missing uid or dim, a stride other than 1 on the last dim, a hidden size not a
// multiple of 8 or over 256, heads that do not group, stats not f32, a call out of order) give an
// error_t saying why, as the real frontend's do.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/simt/simt.h"

typedef struct cudnnContext* cudnnHandle_t;
typedef enum { CUDNN_STATUS_SUCCESS = 0, CUDNN_STATUS_BAD_PARAM = 2000 } cudnnStatus_t;

namespace cudnn_frontend {

enum class DataType_t { NOT_SET, FLOAT, HALF, BFLOAT16, INT32, INT64 };
enum class HeurMode_t { A, B, FALLBACK };
enum class BuildPlanPolicy_t { HEURISTICS_CHOICE, ALL };
enum class error_code_t { OK, ATTRIBUTE_NOT_SET, INVALID_VALUE, GRAPH_NOT_SUPPORTED, GRAPH_EXECUTION_FAILED };

struct error_object {
  error_code_t code = error_code_t::OK;
  std::string err_msg;
  error_object() = default;
  error_object(error_code_t c, std::string m) : code(c), err_msg(std::move(m)) {}
  bool is_good() const { return code == error_code_t::OK; }
  bool is_bad() const { return !is_good(); }
  error_code_t get_code() const { return code; }
  std::string get_message() const { return err_msg; }
};
using error_t = error_object;

namespace detail {
cudnnStatus_t create_handle(cudnnHandle_t* handle);
cudnnStatus_t destroy_handle(cudnnHandle_t handle);
cudnnStatus_t set_stream(cudnnHandle_t handle, cudaStream_t stream);
const char* get_error_string(cudnnStatus_t status);
size_t get_backend_version();
}  // namespace detail

namespace graph {

class Tensor_attributes {
 public:
  Tensor_attributes& set_name(const std::string& v) { name_ = v; return *this; }
  Tensor_attributes& set_uid(int64_t v) { uid_ = v; uid_set_ = true; return *this; }
  Tensor_attributes& set_dim(const std::vector<int64_t>& v) { dim_ = v; return *this; }
  Tensor_attributes& set_stride(const std::vector<int64_t>& v) { stride_ = v; return *this; }
  Tensor_attributes& set_data_type(DataType_t v) { type_ = v; return *this; }
  Tensor_attributes& set_output(bool v) { output_ = v; return *this; }
  Tensor_attributes& set_ragged_offset(const std::shared_ptr<Tensor_attributes>& v) { ragged_ = v; return *this; }
  const std::shared_ptr<Tensor_attributes>& get_ragged_offset() const { return ragged_; }
  const std::string& get_name() const { return name_; }
  int64_t get_uid() const { return uid_; }
  bool has_uid() const { return uid_set_; }
  const std::vector<int64_t>& get_dim() const { return dim_; }
  const std::vector<int64_t>& get_stride() const { return stride_; }
  DataType_t get_data_type() const { return type_; }
  bool get_is_output() const { return output_; }

 private:
  std::string name_;
  int64_t uid_ = 0;
  bool uid_set_ = false;
  std::vector<int64_t> dim_, stride_;
  DataType_t type_ = DataType_t::NOT_SET;
  bool output_ = false;
  std::shared_ptr<Tensor_attributes> ragged_;  // [b + 1, 1, 1, 1] int: where each sequence starts
};

// The attributes SDPA's forward and backward share for a padded or ragged batch, and their setters.
struct Padding {
  bool padding_mask = false;
  std::shared_ptr<Tensor_attributes> seq_len_q, seq_len_kv;
  int64_t max_total_q = -1, max_total_kv = -1;  // -1: not set
};
template <class Self>
class PaddingAttributes : public Padding {
 public:
  Self& set_padding_mask(bool v) { padding_mask = v; return self(); }
  Self& set_seq_len_q(std::shared_ptr<Tensor_attributes> v) { seq_len_q = std::move(v); return self(); }
  Self& set_seq_len_kv(std::shared_ptr<Tensor_attributes> v) { seq_len_kv = std::move(v); return self(); }
  Self& set_max_total_seq_len_q(int64_t v) { max_total_q = v; return self(); }
  Self& set_max_total_seq_len_kv(int64_t v) { max_total_kv = v; return self(); }

 private:
  Self& self() { return static_cast<Self&>(*this); }
};

class SDPA_attributes : public PaddingAttributes<SDPA_attributes> {
 public:
  SDPA_attributes& set_name(const std::string& v) { name = v; return *this; }
  SDPA_attributes& set_generate_stats(bool v) { generate_stats = v ? 1 : 0; return *this; }
  SDPA_attributes& set_is_inference(bool v) { return set_generate_stats(!v); }
  SDPA_attributes& set_causal_mask(bool v) { causal = v; return *this; }
  SDPA_attributes& set_attn_scale(float v) { attn_scale = v; scale_set = true; return *this; }
  SDPA_attributes& set_diagonal_band_left_bound(int v) { left_bound = v; left_set = true; return *this; }
  SDPA_attributes& set_sliding_window_length(int v) { return set_diagonal_band_left_bound(v); }
  std::string name;
  int generate_stats = -1;  // -1: not set, which the frontend refuses
  bool causal = false, scale_set = false, left_set = false;
  int left_bound = 0;
  float attn_scale = 1.0f;
};

class SDPA_backward_attributes : public PaddingAttributes<SDPA_backward_attributes> {
 public:
  SDPA_backward_attributes& set_name(const std::string& v) { name = v; return *this; }
  SDPA_backward_attributes& set_causal_mask(bool v) { causal = v; return *this; }
  SDPA_backward_attributes& set_attn_scale(float v) { attn_scale = v; scale_set = true; return *this; }
  SDPA_backward_attributes& set_deterministic_algorithm(bool v) { deterministic = v; return *this; }
  SDPA_backward_attributes& set_diagonal_band_left_bound(int v) { left_bound = v; left_set = true; return *this; }
  SDPA_backward_attributes& set_sliding_window_length(int v) { return set_diagonal_band_left_bound(v); }
  std::string name;
  bool causal = false, scale_set = false, deterministic = false, left_set = false;
  int left_bound = 0;
  float attn_scale = 1.0f;
};

class Graph {
 public:
  using T = std::shared_ptr<Tensor_attributes>;
  Graph& set_io_data_type(DataType_t v) { io_ = v; return *this; }
  Graph& set_intermediate_data_type(DataType_t v) { intermediate_ = v; return *this; }
  Graph& set_compute_data_type(DataType_t v) { compute_ = v; return *this; }
  T tensor(const Tensor_attributes& a);
  std::array<T, 2> sdpa(T q, T k, T v, SDPA_attributes attrs);
  std::array<T, 3> sdpa_backward(T q, T k, T v, T o, T dO, T stats, SDPA_backward_attributes attrs);

  error_t validate();
  error_t build_operation_graph(cudnnHandle_t handle);
  error_t create_execution_plans(const std::vector<HeurMode_t>& modes);
  error_t check_support(cudnnHandle_t handle);
  error_t build_plans(cudnnHandle_t handle, BuildPlanPolicy_t policy = BuildPlanPolicy_t::HEURISTICS_CHOICE,
                      bool multithreaded = false);
  error_t get_workspace_size(int64_t& bytes) const;
  error_t execute(cudnnHandle_t handle, std::unordered_map<int64_t, void*>& pack, void* workspace) const;

 private:
  enum class Stage { made, validated, op_graph, plans, supported, built };
  DataType_t io_ = DataType_t::NOT_SET, intermediate_ = DataType_t::NOT_SET, compute_ = DataType_t::NOT_SET;
  std::vector<T> tensors_;
  int node_ = 0;  // 0: none, 1: sdpa, 2: sdpa_backward (one node: what llmt builds)
  SDPA_attributes fwd_;
  SDPA_backward_attributes bwd_;
  T q_, k_, v_, o_, stats_, do_, dq_, dk_, dv_;
  Stage stage_ = Stage::made;
  mutable int64_t calls_ = 0;  // backward executions (the order of a non-deterministic one's dQ sums)
  std::set<const Tensor_attributes*> index_;  // the int tensors: sequence lengths and ragged offsets
  const Padding& padding() const { return node_ == 1 ? (const Padding&)fwd_ : (const Padding&)bwd_; }
  error_t step(Stage from, Stage to, const char* what);
};

}  // namespace graph
}  // namespace cudnn_frontend
