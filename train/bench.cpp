#include "train/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include <unistd.h>

#include "llmt_commit.h"

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/agree.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/fsdp/fsdp.h"
#include "engine/fsdp/staged_comm.h"
#include "kernels/cpu/bf16_matmul_choice.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/transformer.h"
#include "train/lora_run.h"
#include "train/output_path.h"
#include "train/plan.h"
#include "train/session.h"
#include "train/step.h"
#include "train/train_args.h"

namespace llmt {

BenchArgs parse_bench_args(Flags& f) {
  BenchArgs a;
  a.model = f.get_string("model", a.model);
  read_parallelism(f, a);  // --device, --threads, --ddp_backend, --fsdp, ... as llmt train reads them
  read_precision(f, a);    // --bf16, --tf32, --mixed_precision_reduce
  read_lora(f, a);         // --use_peft, --lora_r, --lora_target_modules, ...
  a.batch = f.get_int("per_device_train_batch_size", a.batch);
  a.seq_len = f.get_int("seq_len", a.seq_len);
  a.steps = f.get_int("steps", a.steps);
  a.warmup = f.get_int("warmup", a.warmup);
  a.dropout = f.get_double("dropout", a.dropout);
  // the adapters' input dropout is one of the run's dropouts too: PEFT's peer (scripts/bench_pytorch.py
  // --lora) runs lora_dropout 0 beside the model's 0, and TRL's default 0.05 here cost the LoRA step
  // its mask generation and copies (docs/performance.md, "LoRA")
  if (a.dropout >= 0.0 && !f.has("lora_dropout")) a.lora_dropout = a.dropout;
  a.ops = f.get_bool("ops", false);
  LLMT_CHECK(a.batch > 0 && a.seq_len > 1 && a.steps > 0 && a.warmup >= 0,
             "llmt bench: batch, seq_len and steps must be positive and warmup not negative");
  a.sweeps = f.get_all("sweep");
  a.results = f.get_string("results", a.results);
  for (const auto& point : bench_points(a.sweeps)) {  // every point checked before the first one runs
    BenchArgs b = a;
    std::string where;
    for (const auto& [key, value] : point) {
      apply_bench_setting(b, key, value);
      where += " " + key + "=" + value;
    }
    check_bench_point(b, where.empty() ? "" : " (--sweep" + where + ")");
  }
  return a;
}

// A point's model and sequence length, as llmt bench's own error: --sweep model=gpt2-tiny,bogus ran
// the first point before refusing the second, and --seq_len past the context was "llmt plan: ...".
void check_bench_point(const BenchArgs& a, const std::string& where) {
  ModelConfig cfg;
  try {
    cfg = resolve_model_config(a.model);
  } catch (const Error& e) {
    fail("llmt bench --model %s%s: %s", a.model.c_str(), where.c_str(), e.what());
  }
  LLMT_CHECK(a.seq_len <= cfg.max_seq_len, "llmt bench: --seq_len %d%s exceeds the context of %s (%d tokens)",
             a.seq_len, where.c_str(), a.model.c_str(), cfg.max_seq_len);
  if (a.use_peft) try {
      lora_run_config(a, cfg);
    } catch (const Error& e) {
      fail("llmt bench%s: %s", where.c_str(), e.what());
    }
}

// The session training would build for these settings: the same backend, communicators and store
// (frozen, with the adapter counted by the memory check, under --use_peft).
static SessionSettings bench_session_settings(const BenchArgs& a, const ModelConfig& cfg) {
  SessionSettings sset = session_settings(a, a);
  sset.batch = a.batch;
  sset.seq_len = a.seq_len;
  if (a.use_peft) sset.lora = lora_run_config(a, cfg);
  return sset;
}

void apply_bench_setting(BenchArgs& a, const std::string& key, const std::string& value) {
  Flags f("bench", {"--" + key, value});
  if (key == "per_device_train_batch_size" || key == "batch") a.batch = f.get_int(key, a.batch);
  else if (key == "seq_len") a.seq_len = f.get_int(key, a.seq_len);
  else if (key == "threads") a.threads = f.get_int(key, a.threads);
  else if (key == "model") a.model = value;
  else if (key == "fsdp") a.fsdp = value, parse_fsdp(value);
  else if (key == "gradient_checkpointing") a.gradient_checkpointing = f.get_bool(key, false);
  else if (key == "bf16") a.bf16 = f.get_bool(key, false);
  else if (key == "tf32") a.tf32 = f.get_bool(key, false);
  else if (key == "mixed_precision_reduce") a.mixed_precision_reduce = value, parse_reduce_dtype(value);
  else if (key == "use_peft") a.use_peft = f.get_bool(key, false);
  else if (key == "lora_r") a.lora_r = f.get_int(key, a.lora_r);
  else
    fail("llmt bench --sweep %s: not a sweepable setting (per_device_train_batch_size, seq_len, threads, model, fsdp, "
         "gradient_checkpointing, bf16, tf32, mixed_precision_reduce, use_peft, lora_r)", key.c_str());
  LLMT_CHECK(a.batch > 0 && a.seq_len > 1 && a.threads >= 0 && a.lora_r > 0, "llmt bench --sweep %s=%s: out of range",
             key.c_str(), value.c_str());
}

std::vector<std::vector<std::pair<std::string, std::string>>> bench_points(const std::vector<std::string>& sweeps) {
  std::vector<std::vector<std::pair<std::string, std::string>>> points = {{}};
  for (const std::string& sweep : sweeps) {
    const size_t eq = sweep.find('=');
    LLMT_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < sweep.size(),
               "llmt bench --sweep %s: expected KEY=V1,V2,... (e.g. seq_len=512,1024)", sweep.c_str());
    const std::string key = sweep.substr(0, eq);
    std::vector<std::string> values;
    for (size_t at = eq + 1;;) {
      const size_t comma = sweep.find(',', at);
      values.push_back(sweep.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
      LLMT_CHECK(!values.back().empty(), "llmt bench --sweep %s: an empty value", sweep.c_str());
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
    std::vector<std::vector<std::pair<std::string, std::string>>> next;
    for (const auto& p : points)
      for (const std::string& v : values) {
        next.push_back(p);
        next.back().push_back({key, v});
      }
    points = std::move(next);
  }
  return points;
}

static double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// This machine's memory bandwidth, with the backend's threads, the way AdamW uses memory: every
// write lands on an array it has just read (a[i] += s * b[i]), so no write-allocate traffic hides
// in it; 12 bytes counted per element, as STREAM counts (reads and writes). AdamW streams 28 bytes
// per parameter counted the same way. Median of 5 passes over two 512 MiB arrays.
static double stream_gb_per_s(int threads) {
  const int64_t n = 128ll << 20;
  std::vector<float> a((size_t)n, 1.0f), b((size_t)n, 2.0f);
  std::vector<double> gbs;
  for (int rep = 0; rep < 6; rep++) {
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for simd num_threads(threads)
    for (int64_t i = 0; i < n; i++) a[(size_t)i] += 1e-3f * b[(size_t)i];
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) gbs.push_back(12.0 * (double)n / s / 1e9);  // the first pass is warm-up
  }
  return median_of(gbs);
}

// The matmul library's peak here: the median GFLOP/s of square M = N = K = 2048 products in the
// compute dtype on this rank's threads (every rank at once, so ranks sharing a node share its cores).
double measured_matmul_peak_gflops(Backend& be, ControlComm& world) {
  const int64_t n = 2048;
  const DType t = be.compute_dtype();
  BackendBuffer a(be, t, {n, n}), b(be, t, {n, n}), c(be, t, {n, n});
  std::vector<double> g;
  world.barrier();
  for (int rep = 0; rep < 6; rep++) {
    auto t0 = std::chrono::steady_clock::now();
    be.matmul(c.tensor(), a.tensor(), b.tensor(), Tensor(), n, n, n, false, false, false);
    be.synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) g.push_back(2.0 * n * n * n / s / 1e9);  // the first is warm-up
  }
  return median_of(g);
}

static double rss_gib() {  // resident now (the point's model and buffers are alive)
  std::ifstream f("/proc/self/statm");
  double pages_total = 0, pages_resident = 0;
  f >> pages_total >> pages_resident;
  return pages_resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0 * 1024.0);
}

// Progress goes to stderr and the JSON lines alone to stdout, so the output pipes into tools.
// One configuration: the JSON line (meaningful on rank 0). cpu_peak caches the matmul peak per dtype.
static nlohmann::json bench_point(const BenchArgs& a, ControlComm& world, const LaunchInfo& launch,
                                  std::map<std::string, double>& cpu_peak) {
  ModelConfig cfg = resolve_model_config(a.model);
  if (a.dropout >= 0.0) {
    cfg.attn_pdrop = (float)a.dropout;
    if (cfg.arch == Arch::gpt2) cfg.embd_pdrop = cfg.resid_pdrop = (float)a.dropout;
    validate_config(cfg, "--dropout");
  }
  SessionSettings sset = bench_session_settings(a, cfg);
  sset.log = false;  // stdout is for the JSON lines
  Session session = make_session(world, launch, sset, cfg);
  init_parameters(session, cfg, 1337);
  std::unique_ptr<LoraRun> lora;  // --use_peft: a fresh adapter (PEFT's init) on the frozen model
  if (a.use_peft) {
    TrainArgs t;
    static_cast<LoraArgs&>(t) = a;
    t.seed = 1337;
    lora = start_lora(t, session, cfg);
  }
  FsdpStore* adapter = lora ? lora->store.get() : nullptr;
  const bool cuda = a.device == "cuda";
  const DType compute = a.bf16 ? DType::bf16 : DType::f32;
  const int gpu = session.gpu;
  Backend& be = *session.backend;
  Transformer& model = *session.model;
  FsdpStore& store = *session.store;
  DataComm* data = session.data.get();
  const ModelLayout& L = session.layout();
  const Strategy strategy = store.strategy();

  // synthetic tokens, different on every rank
  const int64_t N = (int64_t)a.batch * a.seq_len;
  std::vector<int32_t> tokens((size_t)N), targets((size_t)N);
  uint64_t s = 12345 + (uint64_t)world.rank();
  for (int64_t i = 0; i < N; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    tokens[(size_t)i] = (int32_t)((s >> 33) % (uint64_t)cfg.vocab_size);
  }
  for (int64_t i = 0; i < N; i++) targets[(size_t)i] = (i + 1) % a.seq_len ? tokens[(size_t)i + 1] : kIgnoreIndex;
  std::vector<MicroBatch> micro = {{tokens.data(), targets.data(), a.seq_len, (int64_t)world.rank() * a.batch}};
  StepScalars scalars(be);
  StepSettings ss;
  ss.lr = 1e-4f;
  ss.adamw.weight_decay = 0.1f;
  ss.max_grad_norm = 1.0;

  std::vector<double> ms;
  double comm_per_step = 0.0;
  int64_t step_syncs = 0;  // host syncs inside train_step itself, not the timing's synchronize below
  auto timed_step = [&](int it) {
    world.barrier();
    double comm0 = store.comm_bytes() + data->stats().total() + (adapter ? adapter->comm_bytes() : 0.0);
    auto t0 = std::chrono::steady_clock::now();
    ss.step = it;
    const int64_t syncs0 = be.counters().host_syncs;
    StepResult r = train_step(model, store, world, *data, scalars, micro, ss, adapter);
    if (it >= a.warmup) step_syncs += be.counters().host_syncs - syncs0;
    be.synchronize();
    double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    comm_per_step = store.comm_bytes() + data->stats().total() + (adapter ? adapter->comm_bytes() : 0.0) - comm0;
    return std::make_pair(dt, r.loss);
  };
  BackendCounters counted;  // at the first measured step
  for (int it = 0; it < a.warmup + a.steps; it++) {
    if (it == a.warmup) counted = be.counters();
    auto [dt, loss] = timed_step(it);
    if (it >= a.warmup) ms.push_back(dt);
    if (world.rank() == 0)
      std::fprintf(stderr, "step %d/%d%s: %.1f ms, loss %.4f\n", it + 1, a.warmup + a.steps,
                   it < a.warmup ? " (warm-up)" : "", dt, loss);
  }
  // one more step with every op timed on its own: where the step's time goes (the time outside the
  // ops is communication and host work)
  const BackendCounters after = be.counters();
  const int64_t measured_step_syncs = step_syncs;
  be.profile_ops(true);
  double profiled_ms = timed_step(a.warmup + a.steps).first;
  be.profile_ops(false);
  nlohmann::json breakdown = nlohmann::json::object();
  double in_ops = 0.0;
  for (auto& [category, t] : be.op_ms()) {
    breakdown[category] = t;
    in_ops += t;
  }
  breakdown["communication and host"] = std::max(0.0, profiled_ms - in_ops);
  auto in = [&](const char* category) { return be.op_ms().count(category) ? be.op_ms().at(category) : 0.0; };
  const double matmul_ms = in("matmul"), adamw_ms = in("adamw");
  // the "everything else": neither matmuls nor the optimizer's memory-bound passes over every
  // parameter (AdamW, the gradient norm, zeroing the gradients) nor communication
  const double rest_ms = in_ops - matmul_ms - adamw_ms - in("grad norm") - in("gradient zeroing");
  // AdamW reads p, g, m, v and writes p, m, v: 28 bytes per parameter of this rank's shards, 2 more
  // for the bf16 compute copy it writes
  double shard_params = 0.0;
  FsdpStore& stepped = adapter ? *adapter : store;  // the store AdamW steps
  const size_t stepped_units = adapter ? lora->layout.units.size() : L.units.size();
  for (size_t u = 0; u < stepped_units; u++) {
    FsdpStore::ShardState st = stepped.shard_state((int)u);
    shard_params += (double)std::max<int64_t>(st.hi - st.lo, 0);
  }
  const double adamw_bytes = shard_params * (28.0 + (a.bf16 ? 2.0 : 0.0));
  // the host's memory bandwidth only matters to a CPU backend's AdamW
  const double stream = cuda ? 0.0 : stream_gb_per_s(be.threads());

  // the slowest rank sets the pace: report the median over steps of rank 0's times (all ranks
  // finish a step together, since each step ends in collectives)
  double median = median_of(ms);
  double flops_per_token = lora ? lora_flops_per_token(cfg, L, lora->config, lora->layout, a.seq_len)
                                : Transformer::flops_per_token(cfg, L, a.seq_len);
  const int W = world.size();
  double global_tokens = (double)N * W;
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  auto quantile = [&](double q) { return sorted[(size_t)std::lround(q * (double)(sorted.size() - 1))]; };
  size_t free_b = 0, total_b = 0;
  const bool device_mem = be.device_memory(&free_b, &total_b);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  nlohmann::json j = {{"model", a.model},
                      {"device", a.device},
                      {"ranks", W},
                      {"threads", be.threads()},
                      {"fsdp", strategy_name(strategy)},
                      {"ddp_backend", session.ddp_backend},
                      {"dropout", cfg.has_dropout()},
                      {"batch", a.batch},
                      {"seq_len", a.seq_len},
                      {"params", L.total_numel},
                      {"lora_r", lora ? nlohmann::json(lora->config.r) : nlohmann::json(nullptr)},
                      {"lora_dropout", lora ? nlohmann::json(lora->config.dropout) : nlohmann::json(nullptr)},
                      {"trained_params", lora ? lora->layout.total_numel : L.total_numel},
                      {"steps", a.steps},
                      {"step_ms_median", median},
                      {"step_ms_min", sorted.front()},
                      {"step_ms_max", sorted.back()},
                      {"step_ms_p10", quantile(0.1)},
                      {"step_ms_p90", quantile(0.9)},
                      {"bf16", a.bf16},
                      {"gradient_checkpointing", a.gradient_checkpointing},
                      {"tokens_per_s", global_tokens / (median / 1000.0)},
                      {"tokens_per_s_per_rank", global_tokens / (median / 1000.0) / W},
                      {"memory_gib", device_mem ? (double)(total_b - free_b) / gib : rss_gib()},
                      {"memory_kind", device_mem ? "device memory in use after the steps (all processes)"
                                                 : "resident set after the steps"},
                      {"gflop_per_step", flops_per_token * global_tokens / 1e9},
                      {"achieved_gflops", flops_per_token * global_tokens / (median / 1000.0) / 1e9},
                      {"comm_bytes_per_step_per_rank", comm_per_step},
                      {"launches_per_step", (double)(after.launches - counted.launches) / a.steps},
                      {"host_syncs_per_step", (double)measured_step_syncs / a.steps},
                      {"allocs_per_step", (double)(after.allocs - counted.allocs) / a.steps},
                      {"compute_dtype", dtype_name(be.compute_dtype())},
                      {"profiled_step_ms", profiled_ms},
                      {"breakdown_ms", breakdown},
                      {"matmul_gflops", flops_per_token * N / 1e9 / (matmul_ms / 1000.0)},
                      {"matmul_fraction", matmul_ms / profiled_ms},
                      {"rest_fraction", rest_ms / profiled_ms},
                      {"adamw_gb_per_s", adamw_bytes / (adamw_ms / 1000.0) / 1e9},
                      {"flops_convention", Transformer::kFlopsConvention}};
  if (!cuda && a.bf16) {  // which kernel each shape class of the bf16 matmuls ran (bf16_matmul_choice.h)
    nlohmann::json kernels = nlohmann::json::object();
    for (const Bf16ClassChoice& c : cpu_bf16_matmul_choices())
      kernels[c.shape_class] = {{"kernel", bf16_kernel_name(c.kernel)}, {"source", c.source},
                                {"fp32_ms", c.fp32_ms}, {"bf16_ms", c.bf16_ms}};
    j["cpu_bf16_matmul_kernels"] = kernels;
  }
  if (!cuda) {
    j["memory_gb_per_s"] = stream;
    j["adamw_fraction_of_memory_bandwidth"] = adamw_bytes / (adamw_ms / 1000.0) / 1e9 / stream;
    // MFU on a CPU: against the matmul library's measured peak in this dtype on this rank's threads
    const std::string key = dtype_name(be.compute_dtype());
    if (!cpu_peak.count(key)) {
      cpu_peak[key] = measured_matmul_peak_gflops(be, world);
      if (world.rank() == 0)
        std::fprintf(stderr, "bench  matmul peak here: %.1f GFLOP/s per rank (%s, %d threads, %s; 2048^3 products, "
                     "median of 5)\n", cpu_peak[key], key.c_str(), be.threads(), cpu_library_version().c_str());
    }
    j["peak_gflops_per_rank"] = cpu_peak[key];
    j["peak_source"] = "measured: the matmul library's 2048^3 product on this rank's threads";
    j["mfu"] = flops_per_token * global_tokens / (median / 1000.0) / 1e9 / (cpu_peak[key] * W);
  } else {
    // MFU: the achieved model FLOP/s over the ranks' peak (docs/design.md, "Throughput")
    const double peak = cuda_peak_tflops(gpu, compute, a.tf32);
    j["gpu"] = cuda_device_description(gpu);
    j["tf32"] = a.tf32;
    j["peak_tflops_per_gpu"] = peak;
    if (peak > 0) j["mfu"] = flops_per_token * global_tokens / (median / 1000.0) / (peak * 1e12 * W);
    else j["mfu"] = nullptr;  // the emulator, or a GPU without a known peak
  }
  return j;
}

// Whether a point fits before anything is allocated: llmt plan's per-rank total against the GPU's
// free memory or the node's available memory over its ranks; "" when it fits (agreed over ranks).
static std::string bench_memory_problem(const BenchArgs& a, ControlComm& world, const LaunchInfo& launch) {
  const ModelConfig cfg = resolve_model_config(a.model);
  const PlanArgs pa = plan_args(bench_session_settings(a, cfg), world.size(), launch.local_size);
  const double need = plan_run(cfg, pa).total_gib;
  std::string where;
  std::unique_ptr<Backend> gpu;  // a device's memory is its backend's to tell
  if (a.device == "cuda")
    gpu = make_cuda_backend(cuda_device_for_rank(launch), DType::f32, false);
  const double have = memory_per_rank_gib(gpu.get(), launch.local_rank, launch.local_size, &where);
  const bool fits = have <= 0 || need <= have;
  if (world.all_reduce_sum(fits ? 0.0 : 1.0) == 0) return "";
  return strformat("out of memory: llmt plan needs %.2f GiB per rank, and %s", need, where.c_str());
}

void run_bench(const BenchArgs& args, ControlComm& world, const LaunchInfo& launch) {
  if (args.ops) {
    LLMT_CHECK(args.sweeps.empty() && args.results.empty(), "llmt bench --ops: takes neither --sweep nor --results "
               "(its JSON lines go to stdout)");
    return run_op_bench(args, world, launch);
  }
  // what ran, once for every line
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  nlohmann::json machine = {{"commit", LLMT_GIT_COMMIT},
                            {"host", host},
                            {"cpu", cpu_model_name()},
                            {"libraries", {{"matmul", cpu_library_version()}, {"mpi", mpi_library_version()}}},
                            {"ranks_per_node", launch.local_size}};
  if (args.device == "cuda") machine["libraries"]["nccl"] = nccl_available() ? nccl_build_version() : "none";
  std::string problem;  // --results into a checkpoint would make it fail its checks at the next resume
  if (world.rank() == 0) try {
      check_output_path("llmt bench", {"--results", args.results}, OutputKind::file);
    } catch (const Error& e) {
      problem = e.what();
    }
  agree_or_throw(world, problem.empty(), problem);
  std::FILE* out = nullptr;
  if (world.rank() == 0 && !args.results.empty()) {
    out = std::fopen(args.results.c_str(), "a");
    LLMT_CHECK(out, "llmt bench --results %s: %s", args.results.c_str(), std::strerror(errno));
  }
  std::map<std::string, double> cpu_peak;
  const auto points = bench_points(args.sweeps);
  for (size_t i = 0; i < points.size(); i++) {
    BenchArgs a = args;
    nlohmann::json setting = nlohmann::json::object();
    for (const auto& [key, value] : points[i]) {
      apply_bench_setting(a, key, value);
      setting[key] = value;
    }
    if (world.rank() == 0 && points.size() > 1)
      std::fprintf(stderr, "bench  point %zu/%zu: %s\n", i + 1, points.size(), setting.dump().c_str());
    nlohmann::json j;
    const std::string oom = bench_memory_problem(a, world, launch);
    if (!oom.empty()) {
      j = {{"model", a.model}, {"device", a.device}, {"ranks", world.size()}, {"fsdp", a.fsdp},
           {"batch", a.batch}, {"seq_len", a.seq_len}, {"bf16", a.bf16},
           {"gradient_checkpointing", a.gradient_checkpointing}, {"oom", true}, {"error", oom}};
      if (world.rank() == 0) std::fprintf(stderr, "bench  point %zu: %s; going on\n", i + 1, oom.c_str());
    } else {
      j = bench_point(a, world, launch, cpu_peak);
    }
    j["sweep"] = setting;
    j["point"] = i + 1;
    j["machine"] = machine;
    if (world.rank() == 0) {
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
      if (out) {
        std::fprintf(out, "%s\n", j.dump().c_str());
        std::fflush(out);
      }
    }
  }
  if (out) std::fclose(out);
}

}  // namespace llmt
