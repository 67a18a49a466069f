// cuDNN attention (cudnn_attention.h) through cudnn-frontend's graph API.
//
// The tensors are views into llmt's packed buffers, described to cuDNN by dims and strides in its
// [batch, head, sequence, head size] order: q, k and v are column slices of the qkv rows (R = (NH +
// 2 NKV) hs values a token), out and dout rows of NH hs values, lse [B, NH, T] is the stats tensor
// [B, NH, T, 1]. dq, dk and dv are the same slices of dqkv, so the backward writes every value of
// dqkv. K and V have NKV heads: cuDNN groups the query heads over them as llmt does (head h reads
// kv head h / (NH / NKV)).
//
// A graph is built once per (pass, B, T, NH, NKV, hs), with its workspace, and kept as long as the
// backend that owns the CudnnAttention: a step after the first allocates nothing. A shape cuDNN
// cannot run is remembered as such.
//
// The real frontend is built with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: it finds cuDNN's functions
// through cudnn_dlhandle, which cudnn_library() opens, so llmt does not link libcudnn. The emulated
// build compiles this same file against the stand-in (simt/cudnn_frontend_simt.h); a GPU build
// without the headers (LLMT_CUDNN=0) keeps only the refusals at the end.
#include "kernels/cuda/cudnn_attention.h"

#if defined(LLMT_SIMT)
#include "kernels/cuda/simt/cudnn_frontend_simt.h"
#define LLMT_HAS_CUDNN 1
#elif defined(LLMT_CUDNN) && LLMT_CUDNN
#include <dlfcn.h>

#include <cudnn_frontend.h>
#define LLMT_HAS_CUDNN 1
#endif

#include <cmath>
#include <map>
#include <memory>
#include <tuple>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace llmt {
namespace cuda {

bool cudnn_attention_fits(int hs) { return hs > 0 && hs % 8 == 0 && hs <= 128; }

bool cudnn_attention_packs(int B, int T, int NH, int NKV, int hs) {
  // the ragged offsets are int32 elements of the qkv rows
  return (int64_t)B * T * (NH + 2 * NKV) * hs < INT32_MAX;
}

#ifdef LLMT_HAS_CUDNN

}  // namespace cuda
}  // namespace llmt

#ifndef LLMT_SIMT
// The frontend's dynamic loading reads cuDNN's symbols through this handle (its Python package sets
// it; llmt does, in cudnn_library()).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}
#endif

namespace llmt {
namespace cuda {

namespace fe = cudnn_frontend;

namespace {

// Empty once cuDNN is loaded, else why it is not.
const std::string& cudnn_library() {
  static const std::string why = []() -> std::string {
#ifdef LLMT_SIMT
    return "";
#else
    if (fe::cudnn_dlhandle) return "";
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (!fe::cudnn_dlhandle) {
      const char* e = dlerror();
      return strformat("libcudnn.so.9 did not load (%s); install cuDNN 9 (pip install nvidia-cudnn-cu13) and put its "
                       "lib folder on LD_LIBRARY_PATH",
                       e ? e : "no reason given");
    }
    return "";
#endif
  }();
  return why;
}

enum SdpaUid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV,
  // packed documents: the sequences' lengths and each tensor's ragged offsets
  kSeqLenQ, kSeqLenKV, kOffQ, kOffK, kOffV, kOffO, kOffStats, kOffDO, kOffDQ, kOffDK, kOffDV
};

// One call's shape. slots > 0: packed documents as a ragged batch of `slots` sequences of at most T
// tokens (the documents, then empty ones), B rows of T tokens in memory. window > 0: a sliding window
// of that many keys (the diagonal band's left bound), 0 none.
struct SdpaShape {
  int B, T, NH, NKV, hs, slots, window;
  float scale;  // the scores' scale, a constant of the graph
  int64_t R() const { return (int64_t)(NH + 2 * NKV) * hs; }
  int64_t C() const { return (int64_t)NH * hs; }
  bool ragged() const { return slots > 0; }
  int64_t batch() const { return ragged() ? slots : B; }
};

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// An int32 [n, 1, 1, 1] index tensor: sequence lengths or ragged offsets.
fe::graph::Tensor_attributes index_tensor(const char* name, SdpaUid uid, int64_t n) {
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({n, 1, 1, 1})
      .set_stride({1, 1, 1, 1})
      .set_data_type(fe::DataType_t::INT32);
}

// The ragged offsets [slots + 1] of a tensor, or none when not packed.
TensorPtr ragged_offsets(fe::graph::Graph& g, const char* name, SdpaUid uid, const SdpaShape& s) {
  return s.ragged() ? g.tensor(index_tensor(name, uid, (int64_t)s.slots + 1)) : nullptr;
}

// q, k or v of the qkv rows (or dq, dk, dv of dqkv), as a [batch, heads, T, hs] tensor; packed, each
// sequence starts at its ragged offset and the batch stride is not used.
fe::graph::Tensor_attributes qkv_part(const char* name, SdpaUid uid, const SdpaShape& s, int heads,
                                      const TensorPtr& offsets) {
  auto t = fe::graph::Tensor_attributes()
               .set_name(name)
               .set_uid(uid)
               .set_dim({s.batch(), heads, s.T, s.hs})
               .set_stride({s.T * s.R(), s.hs, s.R(), 1});
  if (offsets) t.set_ragged_offset(offsets);
  return t;
}

// out or dout: [B*T, NH*hs] rows as a [batch, NH, T, hs] tensor.
fe::graph::Tensor_attributes out_rows(const char* name, SdpaUid uid, const SdpaShape& s, const TensorPtr& offsets) {
  auto t = fe::graph::Tensor_attributes()
               .set_name(name)
               .set_uid(uid)
               .set_dim({s.batch(), s.NH, s.T, s.hs})
               .set_stride({s.T * s.C(), s.hs, s.C(), 1});
  if (offsets) t.set_ragged_offset(offsets);
  return t;
}

// The softmax stats: llmt's lse [B, NH, T] itself, or, packed, cuDNN's token-major ragged layout
// [B*T, NH] (what its Hopper kernels take with ragged offsets), converted from and to lse.
fe::graph::Tensor_attributes stats_tensor(const SdpaShape& s, const TensorPtr& offsets) {
  auto t = fe::graph::Tensor_attributes()
               .set_name("lse")
               .set_uid(kStats)
               .set_dim({s.batch(), s.NH, s.T, 1})
               .set_data_type(fe::DataType_t::FLOAT);
  if (!offsets) return t.set_stride({(int64_t)s.NH * s.T, s.T, 1, 1});
  return t.set_stride({(int64_t)s.NH * s.T, 1, s.NH, 1}).set_ragged_offset(offsets);
}

// An output the graph made (o, lse, dq, dk, dv) given the uid, dims, strides, offsets of `like`.
void output_as(const TensorPtr& t, fe::graph::Tensor_attributes like) {
  t->set_output(true).set_uid(like.get_uid()).set_dim(like.get_dim()).set_stride(like.get_stride());
  if (like.get_ragged_offset()) t->set_ragged_offset(like.get_ragged_offset());
}

// Sets the packed batch's attributes on SDPA_attributes or SDPA_backward_attributes: each sequence's
// length (query and key alike: a document attends to itself) through the padding mask, and the
// token total, which bounds cuDNN's workspace by the tokens instead of slots x T.
template <class Attrs>
void set_packed(Attrs& attrs, fe::graph::Graph& g, const SdpaShape& s) {
  if (!s.ragged()) return;
  attrs.set_padding_mask(true)
      .set_seq_len_q(g.tensor(index_tensor("seq_len_q", kSeqLenQ, s.slots)))
      .set_seq_len_kv(g.tensor(index_tensor("seq_len_kv", kSeqLenKV, s.slots)))
      .set_max_total_seq_len_q((int64_t)s.B * s.T)
      .set_max_total_seq_len_kv((int64_t)s.B * s.T);
}

// A device buffer of at least `bytes`, grown (after the device has finished with the old one:
// cudaFree waits) when a call needs more.
void* device_scratch(void*& p, size_t& have, size_t bytes) {
  if (bytes <= have) return p;
  if (p) CUDA_CHECK(cudaFree(p));
  p = nullptr;
  have = 0;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  have = bytes;
  return p;
}

}  // namespace

// The handle, the graphs built so far, and the device scratch every graph shares (one stream runs
// them in turn): cuDNN's workspace, the packed batch's lengths and offsets, its token-major stats.
struct CudnnAttention::Plans {
  struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;  // null: cuDNN has no engine for this shape
    int64_t workspace = 0;                    // bytes
  };
  cudnnHandle_t handle = nullptr;
  // (backward, B, T, NH, NKV, hs, slots, window, scale)
  std::map<std::tuple<bool, int, int, int, int, int, int, int, float>, Plan> built;
  void* workspace = nullptr;
  void* index = nullptr;  // int32: seq_len [slots], then the qkv, out and stats offsets [slots + 1] each
  void* stats = nullptr;  // f32 [B*T, NH]
  size_t workspace_bytes = 0, index_bytes = 0, stats_bytes = 0;
};

namespace {

// The graph for a pass over shape s, built on first use.
const CudnnAttention::Plans::Plan& sdpa_plan(CudnnAttention::Plans& c, bool backward, const SdpaShape& s) {
  const auto key = std::make_tuple(backward, s.B, s.T, s.NH, s.NKV, s.hs, s.slots, s.window, s.scale);
  auto found = c.built.find(key);
  if (found != c.built.end()) return found->second;

  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto q = g->tensor(qkv_part("q", kQ, s, s.NH, ragged_offsets(*g, "q offsets", kOffQ, s)));
  auto k = g->tensor(qkv_part("k", kK, s, s.NKV, ragged_offsets(*g, "k offsets", kOffK, s)));
  auto v = g->tensor(qkv_part("v", kV, s, s.NKV, ragged_offsets(*g, "v offsets", kOffV, s)));
  const TensorPtr stats_offsets = ragged_offsets(*g, "stats offsets", kOffStats, s);
  const float scale = s.scale;
  if (!backward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("llmt attention forward")
                     .set_generate_stats(true)
                     .set_causal_mask(true)
                     .set_attn_scale(scale);
    // top-left causal with a left bound W keeps key j of query i where j + W > i: transformers' window
    if (s.window > 0) attrs.set_diagonal_band_left_bound(s.window);
    set_packed(attrs, *g, s);
    auto [o, lse] = g->sdpa(q, k, v, attrs);
    output_as(o, out_rows("out", kO, s, ragged_offsets(*g, "out offsets", kOffO, s)));
    output_as(lse, stats_tensor(s, stats_offsets));
    lse->set_data_type(fe::DataType_t::FLOAT);
  } else {
    auto o = g->tensor(out_rows("out", kO, s, ragged_offsets(*g, "out offsets", kOffO, s)));
    auto dout = g->tensor(out_rows("dout", kDO, s, ragged_offsets(*g, "dout offsets", kOffDO, s)));
    auto lse = g->tensor(stats_tensor(s, stats_offsets));
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("llmt attention backward")
                     .set_causal_mask(true)
                     .set_attn_scale(scale)
                     .set_deterministic_algorithm(true);
    if (s.window > 0) attrs.set_diagonal_band_left_bound(s.window);
    set_packed(attrs, *g, s);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, lse, attrs);
    output_as(dq, qkv_part("dq", kDQ, s, s.NH, ragged_offsets(*g, "dq offsets", kOffDQ, s)));
    output_as(dk, qkv_part("dk", kDK, s, s.NKV, ragged_offsets(*g, "dk offsets", kOffDK, s)));
    output_as(dv, qkv_part("dv", kDV, s, s.NKV, ragged_offsets(*g, "dv offsets", kOffDV, s)));
  }

  CudnnAttention::Plans::Plan plan;
  auto err = g->validate();
  if (err.is_good()) err = g->build_operation_graph(c.handle);
  if (err.is_good()) err = g->create_execution_plans({fe::HeurMode_t::A});
  if (err.is_good()) err = g->check_support(c.handle);
  if (err.is_good()) err = g->build_plans(c.handle);
  if (err.is_good()) err = g->get_workspace_size(plan.workspace);
  if (err.is_good()) {
    plan.graph = g;
  } else {
    log_warn("cuDNN attention %s (B=%d T=%d heads %d/%d hs %d%s%s): %s; that pass runs llmt's own kernel",
             backward ? "backward" : "forward", s.B, s.T, s.NH, s.NKV, s.hs,
             s.ragged() ? strformat(", packed as %d sequences", s.slots).c_str() : "",
             s.window > 0 ? strformat(", window %d", s.window).c_str() : "", err.get_message().c_str());
  }
  return c.built.emplace(key, plan).first->second;
}

// Runs the pass; `pack` holds the operands, and this adds the workspace and, packed, the index
// tensors (made from doc_start here, on the stream) and the token-major stats.
bool sdpa_run(CudnnAttention::Plans& c, bool backward, const SdpaShape& s, std::unordered_map<int64_t, void*> pack,
              const int32_t* doc_start, Stream stream) {
  const CudnnAttention::Plans::Plan& p = sdpa_plan(c, backward, s);
  if (!p.graph) return false;
  void* workspace = device_scratch(c.workspace, c.workspace_bytes, (size_t)p.workspace);
  float* lse = (float*)pack.at(kStats);
  if (s.ragged()) {
    const size_t n = (size_t)s.slots + 1;
    int32_t* index = (int32_t*)device_scratch(c.index, c.index_bytes, (s.slots + 3 * n) * sizeof(int32_t));
    int32_t *seq_len = index, *qkv_off = index + s.slots, *out_off = qkv_off + n, *stats_off = out_off + n;
    document_batch(seq_len, qkv_off, out_off, stats_off, doc_start, s.B, s.T, s.slots, (int)s.R(), (int)s.C(), s.NH,
                   stream);
    float* stats = (float*)device_scratch(c.stats, c.stats_bytes, (size_t)s.B * s.T * s.NH * sizeof(float));
    if (backward) lse_to_stats(stats, lse, s.B, s.T, s.NH, stream);
    pack[kStats] = stats;
    pack[kSeqLenQ] = pack[kSeqLenKV] = seq_len;
    pack[kOffQ] = pack[kOffK] = pack[kOffV] = qkv_off;
    pack[kOffO] = out_off;
    pack[kOffStats] = stats_off;
    if (backward) {
      pack[kOffDO] = out_off;
      pack[kOffDQ] = pack[kOffDK] = pack[kOffDV] = qkv_off;
    }
  }
  const cudnnStatus_t st = fe::detail::set_stream(c.handle, stream);
  if (st != CUDNN_STATUS_SUCCESS) fail("cuDNN attention: cudnnSetStream: %s", fe::detail::get_error_string(st));
  auto err = p.graph->execute(c.handle, pack, workspace);
  launch_count().fetch_add(1, std::memory_order_relaxed);  // one graph, whatever cuDNN runs inside
  if (!err.is_good())
    fail("cuDNN attention %s (B=%d T=%d heads %d/%d hs %d): %s", backward ? "backward" : "forward", s.B, s.T, s.NH,
         s.NKV, s.hs, err.get_message().c_str());
  if (s.ragged() && !backward) stats_to_lse(lse, (const float*)c.stats, s.B, s.T, s.NH, stream);
  return true;
}

}  // namespace

const std::string& cudnn_attention_unavailable() { return cudnn_library(); }

std::string cudnn_attention_version() {
#ifdef LLMT_SIMT
  return "(the emulated build's CPU stand-in)";
#else
  if (!cudnn_library().empty()) return "not loaded";
  const int v = (int)fe::detail::get_backend_version();
  return strformat("%d.%d.%d (frontend %d.%d.%d)", v / 10000, v / 100 % 100, v % 100, CUDNN_FRONTEND_MAJOR_VERSION,
                   CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
#endif
}

CudnnAttention::CudnnAttention() : p_(std::make_unique<Plans>()) {
  const std::string& why = cudnn_library();
  if (!why.empty()) fail("cuDNN attention: %s", why.c_str());
  const cudnnStatus_t st = fe::detail::create_handle(&p_->handle);
  if (st != CUDNN_STATUS_SUCCESS) fail("cuDNN attention: cudnnCreate: %s", fe::detail::get_error_string(st));
}

CudnnAttention::~CudnnAttention() {
  for (void* p : {p_->workspace, p_->index, p_->stats})
    if (p) (void)cudaFree(p);
  p_->built.clear();  // the graphs before the handle they were built on
  if (p_->handle) (void)fe::detail::destroy_handle(p_->handle);
}

int cudnn_packed_slots(int64_t docs) {
  int slots = 1;
  while (slots < docs) slots *= 2;
  return slots;
}

bool CudnnAttention::forward(uint16_t* out, float* lse, const uint16_t* qkv, const int32_t* doc_start, int64_t docs,
                             int B, int T, int NH, int NKV, int hs, int window, float scale, Stream stream) {
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  if (B == 0 || T == 0) return true;
  // a window of T or more keys masks nothing: the causal graph, one fewer to build
  const SdpaShape s{B, T, NH, NKV, hs, doc_start ? cudnn_packed_slots(docs) : 0, window < T ? window : 0, scale};
  uint16_t* x = const_cast<uint16_t*>(qkv);  // cuDNN's variant pack holds void*; it only reads them
  return sdpa_run(*p_, false, s,
                  {{kQ, x}, {kK, x + (int64_t)NH * hs}, {kV, x + (int64_t)(NH + NKV) * hs}, {kO, out}, {kStats, lse}},
                  doc_start, stream);
}

bool CudnnAttention::backward(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                              const float* lse, const int32_t* doc_start, int64_t docs, int B, int T, int NH, int NKV,
                              int hs, int window, float scale, Stream stream) {
  LLMT_CHECK(NKV > 0 && NH % NKV == 0, "attention: %d heads do not group over %d kv heads", NH, NKV);
  if (B == 0 || T == 0) return true;
  const SdpaShape s{B, T, NH, NKV, hs, doc_start ? cudnn_packed_slots(docs) : 0, window < T ? window : 0, scale};
  uint16_t* x = const_cast<uint16_t*>(qkv);
  const int64_t k_at = (int64_t)NH * hs, v_at = (int64_t)(NH + NKV) * hs;
  return sdpa_run(*p_, true, s,
                  {{kQ, x},
                   {kK, x + k_at},
                   {kV, x + v_at},
                   {kO, const_cast<uint16_t*>(out)},
                   {kDO, const_cast<uint16_t*>(dout)},
                   {kStats, const_cast<float*>(lse)},
                   {kDQ, dqkv},
                   {kDK, dqkv + k_at},
                   {kDV, dqkv + v_at}},
                  doc_start, stream);
}

#else  // a GPU build without the cudnn-frontend headers

const std::string& cudnn_attention_unavailable() {
  static const std::string why =
      "llmt was built without the cudnn-frontend headers (scripts/setup.sh installs them where nvcc is)";
  return why;
}
std::string cudnn_attention_version() { return "none"; }
struct CudnnAttention::Plans {};
CudnnAttention::CudnnAttention() { fail("cuDNN attention: %s", cudnn_attention_unavailable().c_str()); }
CudnnAttention::~CudnnAttention() = default;
int cudnn_packed_slots(int64_t) { return 0; }
bool CudnnAttention::forward(uint16_t*, float*, const uint16_t*, const int32_t*, int64_t, int, int, int, int, int, int,
                             float, Stream) {
  return false;
}
bool CudnnAttention::backward(uint16_t*, const uint16_t*, const uint16_t*, const uint16_t*, const float*,
                              const int32_t*, int64_t, int, int, int, int, int, int, float, Stream) {
  return false;
}

#endif

}  // namespace cuda
}  // namespace llmt
