#include "train/session.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "data/tokenizer.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/diag/nccl_log.h"
#include "engine/dist/watchdog.h"
#include "engine/fsdp/staged_comm.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/hf_checkpoint.h"
#include "train/plan.h"

namespace llmt {

namespace {

// Which GPU each rank drives, as every rank sees it, on rank 0's log.
void describe_gpus(ControlComm& world, int gpu, DType compute, const ModelConfig& cfg, bool packing) {
  char line[256] = {0};
  std::snprintf(line, sizeof(line), "%s", cuda_device_description(gpu).c_str());
  const int W = world.size();
  std::vector<char> all((size_t)W * sizeof(line));
  world.all_gather(line, all.data(), sizeof(line) / 4, DType::i32);
  if (world.rank() != 0) return;
  for (int r = 0; r < W; r++)
    log_info("gpu    rank %d: %s%s", r, all.data() + (size_t)r * sizeof(line),
             std::string(cuda_build_kind()) == "simt" ? " [the SIMT emulator: CUDA kernels on the CPU]" : "");
  log_info("gpu    attention: %s", cuda_attention_kernels(compute, cfg.head_size(), cfg.attn_pdrop > 0.0f, packing, cfg.attn_softcap > 0.0f).c_str());
  log_info("gpu    matmul: %s", cuda_matmul_kernels().c_str());
}

// --ddp_backend for --device cuda: NCCL unless the ranks of a node share a GPU (NCCL refuses two ranks
// on one device) or the build has no NCCL; else MPI, staged through host memory.
void make_device_data_comm(ControlComm& world, const LaunchInfo& launch, const SessionSettings& s, Session& out) {
  const bool emulated = std::string(cuda_build_kind()) == "simt";  // the stand-in takes any layout
  const bool shared_gpu = !emulated && launch.local_size > cuda_device_count();
  std::string backend = s.ddp_backend;
  if (backend.empty()) backend = shared_gpu || !nccl_available() || emulated ? "mpi" : "nccl";
  LLMT_CHECK(!(backend == "nccl" && shared_gpu), "--ddp_backend nccl: %d ranks per node share %d GPU%s, and NCCL "
             "refuses two ranks on one device; start one rank per GPU or use --ddp_backend mpi", launch.local_size,
             cuda_device_count(), cuda_device_count() == 1 ? "" : "s");
  out.ddp_backend = backend;
  if (backend == "mpi") {
    if (s.log) log_info("comm   data collectives over MPI, staged through host memory (--ddp_backend mpi): nothing overlaps");
    out.data = make_staged_data_comm(std::move(out.data), *out.backend);
    return;
  }
  out.nccl_logs = !s.nccl_log_dir.empty() && !std::getenv("NCCL_DEBUG");  // the user's own NCCL_DEBUG settings win
  if (out.nccl_logs) {
    // NCCL's own account of its transports, one file per process, read back after the first step
    const std::string& dir = s.nccl_log_dir;
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      fail("cannot create %s for NCCL's logs: %s", dir.c_str(), std::strerror(errno));
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
    setenv("NCCL_DEBUG_FILE", (dir + "/nccl.%h.%p").c_str(), 1);
  }
  out.data = make_nccl_data_comm(world, *out.backend, s.ddp_timeout);
  if (s.log) log_info("comm   data collectives over NCCL %s on a communication stream of their own (--ddp_backend nccl)",
           nccl_build_version().c_str());
}

// Before anything large is allocated: the plan's per-rank total against the memory this rank can
// have: on a GPU, the device's free memory over the ranks that share it; on the CPU, the node's
// available memory over its ranks. --per_device_train_batch_size 100000 took 8 GB and half a minute
// before any check.
void check_memory_fits(const LaunchInfo& launch, const PlanArgs& pa, const ModelConfig& cfg, Backend& be) {
  const Plan plan = plan_run(cfg, pa);
  const double need = plan.total_gib;
  std::string where;
  const double per_rank = memory_per_rank_gib(&be, launch.local_rank, launch.local_size, &where);
  if (per_rank <= 0) return;  // nothing to compare with
  LLMT_CHECK(need <= per_rank, "this run needs %.2f GiB per rank (llmt plan: %.2f persistent, %.2f gathered, %.2f "
             "activations) and %s: lower --per_device_train_batch_size or --block_size/--model_max_length, add "
             "--gradient_checkpointing True, or shard over more ranks", need, plan.persistent_gib,
             plan.gathered_peak_gib, plan.activations_gib, where.c_str());
}

}  // namespace

int cuda_device_for_rank(const LaunchInfo& launch) {
  const int n = cuda_device_count();
  LLMT_CHECK(n > 0, "--device cuda: rank %d sees no usable CUDA device (%s)", launch.rank,
             cuda_device_description(0).c_str());
  return launch.local_rank % n;
}

SessionSettings session_settings(const ParallelismConfig& p, const PrecisionConfig& q) {
  SessionSettings s;
  s.device = p.device;
  s.threads = p.threads;
  s.ddp_backend = p.ddp_backend;
  s.ddp_timeout = p.ddp_timeout;
  s.shard_group_size = p.hybrid_shard_group_size;
  s.gradient_checkpointing = p.gradient_checkpointing;
  s.logits_chunk_tokens = p.logits_chunk_tokens;
  s.strategy = parse_fsdp(p.fsdp);
  s.bf16 = q.bf16;
  s.tf32 = q.tf32;
  s.reduce_dtype = parse_reduce_dtype(q.mixed_precision_reduce);
  return s;
}

PlanArgs plan_args(const SessionSettings& s, int world, int node_ranks) {
  PlanArgs a;
  a.world = world;
  a.ranks_per_node = s.strategy == Strategy::hybrid_shard && s.shard_group_size > 0 ? s.shard_group_size : node_ranks;
  a.fsdp = strategy_name(s.strategy);
  a.batch = s.batch;
  a.seq_len = s.seq_len;
  a.accum = s.accum;
  a.gradient_checkpointing = s.gradient_checkpointing;
  a.bf16 = s.bf16;
  a.reduce_dtype = s.reduce_dtype;
  a.vocab_pad = s.device == "cuda" ? kDeviceVocabPad : 1;
  a.logits_chunk_tokens = s.logits_chunk_tokens;
  a.lora = s.lora;
  return a;
}

Session make_session(ControlComm& world, const LaunchInfo& launch, const SessionSettings& s, const ModelConfig& cfg) {
  Session out;
  out.threads = s.threads > 0 ? s.threads : default_threads_per_rank(launch);
  const DType compute = s.bf16 ? DType::bf16 : DType::f32;
  out.data = make_mpi_data_comm(world);  // the world's data collectives
  if (s.device == "cpu") {
    out.backend = make_cpu_backend(out.threads, compute);
  } else {
    out.gpu = cuda_device_for_rank(launch);
    const int n = cuda_device_count();
    if (launch.local_size > n && world.rank() == 0 && s.log)  // more ranks than GPUs on a node share them
      log_info("warning %d ranks per node share %d GPU%s: fine for tests, slow for training", launch.local_size, n,
               n == 1 ? "" : "s");
    out.backend = make_cuda_backend(out.gpu, compute, s.tf32);
    if (s.log) describe_gpus(world, out.gpu, compute, cfg, s.packing);
  }
  if (s.device != "cpu") make_device_data_comm(world, launch, s, out);

  const int shard_group = s.shard_group_size > 0 ? s.shard_group_size : launch.local_size;
  out.plan = plan_args(s, world.size(), launch.local_size);
  if (s.check_memory) check_memory_fits(launch, out.plan, cfg, *out.backend);
  if (s.batch > 0) out.model = std::make_unique<Transformer>(cfg, *out.backend, s.batch, s.seq_len,
                                                             s.gradient_checkpointing, s.logits_chunk_tokens);
  else out.own_layout = std::make_unique<ModelLayout>(make_layout(cfg));
  // hybrid_shard's groups are runs of consecutive ranks: with a node's ranks they must be that node's
  if (s.strategy == Strategy::hybrid_shard && s.shard_group_size <= 0)
    LLMT_CHECK(world.rank() / launch.local_size == launch.node,
               "hybrid_shard shards within a node, so each node's ranks must be consecutive (mpirun's default "
               "--map-by slot, or ppr:N:node); rank %d sits on node %d", world.rank(), launch.node);
  test_stop_point("store", world.rank());
  out.store = std::make_unique<FsdpStore>(*out.backend, out.layout(), s.strategy, *out.data, shard_group,
                                          s.reduce_dtype, s.lora.has_value());
  out.shard_group = shard_group;
  return out;
}

int64_t init_parameters(Session& session, const ModelConfig& cfg, uint64_t seed) {
  const ModelLayout& L = session.layout();
  std::vector<float> host;
  int64_t made = 0;
  for (size_t u = 0; u < L.units.size(); u++) {
    // only this rank's shard is made: set_unit reads no other element
    const FsdpStore::ShardState sh = session.store->shard_state((int)u);
    host.resize((size_t)L.units[u].numel);
    if (sh.hi > sh.lo) init_unit_range(cfg, L.units[u], (int)u, seed, sh.lo, sh.hi, host.data() + sh.lo);
    session.store->set_unit((int)u, host.data());
    made += std::max<int64_t>(0, sh.hi - sh.lo);
  }
  return made;
}

void load_hf_parameters(Session& session, const ModelConfig& cfg, const SafetensorsCheckpoint& ckpt,
                        const std::string& dir) {
  const ModelLayout& L = session.layout();
  check_hf_tensors(ckpt, cfg, L, dir);
  std::vector<float> host;
  for (size_t u = 0; u < L.units.size(); u++) {
    host.assign((size_t)L.units[u].numel, 0.0f);
    load_hf_unit(ckpt, cfg, L, (int)u, host.data());
    session.store->set_unit((int)u, host.data());
  }
}

std::unique_ptr<Tokenizer> model_tokenizer(const std::string& source, const std::string& llama3_special_tokens,
                                           const ModelConfig& cfg) {
  LLMT_CHECK(!source.empty(), "no tokenizer: give --tokenizer_name_or_path (a tokenizer directory or file, or "
                              "\"bytes\" for byte-level ids 0..255)");
  std::unique_ptr<Tokenizer> tok = load_tokenizer(source, llama3_special_tokens);
  LLMT_CHECK(tok->vocab_size() <= cfg.vocab_size, "the tokenizer (%s, %d ids) does not fit the model's vocabulary of %d",
             source.c_str(), tok->vocab_size(), cfg.vocab_size);
  return tok;
}

void report_nccl_transports(ControlComm& world, const std::string& nccl_log_dir) {
  const int W = world.size();
  std::string text;
  for (const std::string& l : read_text_lines(nccl_debug_file_path())) text += l + "\n";
  const size_t kMax = 256 << 10;  // a few thousand lines is plenty for a summary
  if (text.size() > kMax) text.resize(kMax);
  int32_t len = (int32_t)text.size(), longest = 0;
  std::vector<int32_t> lens((size_t)W);
  world.all_gather(&len, lens.data(), 1, DType::i32);
  for (int32_t l : lens) longest = std::max(longest, l);
  const int64_t words = (longest + 3) / 4;
  text.resize((size_t)words * 4, '\0');
  std::vector<char> all((size_t)words * 4 * W);
  world.all_gather(text.data(), all.data(), words, DType::i32);
  if (world.rank() != 0) return;
  std::vector<std::string> lines;
  for (int r = 0; r < W; r++) {
    const char* p = all.data() + (size_t)r * words * 4;
    std::string one(p, (size_t)lens[r]);
    for (size_t at = 0, nl; at < one.size(); at = nl + 1) {
      nl = one.find('\n', at);
      if (nl == std::string::npos) nl = one.size();
      lines.push_back(one.substr(at, nl - at));
    }
  }
  const std::string summary = summarize_nccl_logs(lines);
  for (size_t at = 0, nl; at < summary.size(); at = nl + 1) {
    nl = summary.find('\n', at);
    if (nl == std::string::npos) nl = summary.size();
    if (nl > at) log_info("nccl   %s", summary.substr(at, nl - at).c_str());
  }
  log_info("nccl   (each rank's whole log: %s/)", nccl_log_dir.c_str());
}

}  // namespace llmt
