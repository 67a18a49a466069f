#include "train/trainer.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/byte_tokenizer.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "engine/backend/backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/core/crc32c.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/log.h"
#include "engine/core/stop.h"
#include "engine/dist/agree.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/dist/nccl_log.h"
#include "engine/dist/watchdog.h"
#include "engine/fsdp/fsdp.h"
#include "engine/optim/adamw.h"
#include "engine/optim/schedule.h"
#include "engine/fsdp/staged_comm.h"
#include "kernels/cpu/bf16_matmul_choice.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"
#include "train/export.h"
#include "train/plan.h"
#include "train/step.h"
#include "train/tensorboard.h"

namespace llmt {

namespace {

// SIGUSR1 (Slurm's --signal=USR1@120 before the time limit) or SIGTERM (scancel, preemption):
// finish the step, save a checkpoint, exit cleanly so the job can be requeued and resumed. Set by
// the signal thread (install_stop_handlers) in engine/core/stop.h, where data preparation reads it.

const double kMiB = 1024.0 * 1024.0;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peak_rss_gib() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}

// mkdir -p: each missing parent in turn, as the Hugging Face Trainer's os.makedirs. 0, or the errno of
// the first part that could not be made (with *failed set to that part).
int mkdir_parents(const std::string& dir, std::string* failed = nullptr) {
  for (size_t at = 1; at <= dir.size(); at++) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      if (failed) *failed = part;
      return errno;
    }
  }
  return 0;
}

void make_dir(const std::string& dir) {
  std::string part;
  if (const int err = mkdir_parents(dir, &part))
    fail("cannot create output directory %s: %s: %s", dir.c_str(), part.c_str(), std::strerror(err));
  std::string probe = dir + "/.llmt_write_test";
  FILE* f = std::fopen(probe.c_str(), "w");
  LLMT_CHECK(f, "output directory %s is not writable: %s", dir.c_str(), std::strerror(errno));
  std::fclose(f);
  std::remove(probe.c_str());
}

// An output file of lines (metrics.jsonl), each written and flushed at once. A failed write, flush or
// close is an error naming the file: a full disk or an unwritable file gave exit 0 and no metrics.
class LineFile {
 public:
  ~LineFile() {
    if (f_) std::fclose(f_);
  }
  void open(const std::string& path) {
    path_ = path;
    f_ = std::fopen(path.c_str(), "w");
    LLMT_CHECK(f_, "cannot create %s: %s", path.c_str(), std::strerror(errno));
  }
  void write(const std::string& line) {
    if (!f_) return;
    const std::string text = line + "\n";
    const bool ok = std::fwrite(text.data(), 1, text.size(), f_) == text.size() && std::fflush(f_) == 0;
    LLMT_CHECK(ok, "writing %s failed: %s", path_.c_str(), std::strerror(errno));
  }
  void close() {
    if (!f_) return;
    const int rc = std::fclose(f_);
    f_ = nullptr;
    LLMT_CHECK(rc == 0, "closing %s failed: %s", path_.c_str(), std::strerror(errno));
  }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

// The run's claim on its output_dir: an fcntl lock on output_dir/.llmt.lock, held until the process
// ends (the kernel drops it even after kill -9; fcntl locks also work over NFS), with the holder's
// host and pid in the file for the second run's message. Two runs in one directory trampled each
// other's temporary checkpoint directories. The descriptor stays open for the whole run: closing
// it would drop the lock.
int lock_output_dir(const std::string& dir) {
  const std::string path = dir + "/.llmt.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  LLMT_CHECK(fd >= 0, "cannot create %s: %s", path.c_str(), std::strerror(errno));
  struct flock fl;
  std::memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_SETLK, &fl) != 0) {
    char holder[256] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof(holder) - 1, 0);
    ::close(fd);
    std::string who = n > 0 ? std::string(holder, (size_t)n) : "unknown";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    fail("%s is in use by another llmt run (%s): wait for it to end, or give another --output_dir", dir.c_str(),
         who.c_str());
  }
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string me = strformat("host %s pid %d\n", host, (int)getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != (ssize_t)me.size())
    log_warn("cannot write %s: %s", path.c_str(), std::strerror(errno));
  return fd;
}

// --tokenizer_name_or_path, else the model directory: a directory, a tokenizer file, or "bytes".
std::string tokenizer_source(const TrainArgs& a) {
  return a.tokenizer_name_or_path.empty() ? a.model_name_or_path : a.tokenizer_name_or_path;
}

// The directory whose tokenizer files saved models carry ("" for none).
std::string tokenizer_dir(const std::string& src) {
  struct stat st;
  if (src == "bytes" || stat(src.c_str(), &st) != 0) return "";
  if (S_ISDIR(st.st_mode)) return src;
  size_t slash = src.rfind('/');
  return slash == std::string::npos ? "." : src.substr(0, slash);
}

// The safetensors dtype saved models are written in, as transformers saves a model loaded with
// --torch_dtype: unset (run_clm's None) and float32 load fp32 weights, which the Trainer saves in fp32
// under --bf16 too (autocast and FSDP's MixedPrecision keep fp32 parameters); bfloat16 and float16
// load the model in that dtype; auto, in the checkpoint's own: config.json's "torch_dtype" ("dtype"
// in transformers 5), else its first floating-point tensor's. A model made from a config is fp32.
std::string saved_model_dtype(const TrainArgs& a, const SafetensorsCheckpoint* ckpt) {
  auto from_torch = [](const std::string& v) -> std::string {
    if (v == "float32") return "F32";
    if (v == "bfloat16") return "BF16";
    if (v == "float16") return "F16";
    return "";
  };
  if (a.torch_dtype != "auto") return a.torch_dtype.empty() ? "F32" : from_torch(a.torch_dtype);
  if (!ckpt) return "F32";
  struct stat st;
  const std::string cfg_path = a.model_name_or_path + "/config.json";
  if (stat(a.model_name_or_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && stat(cfg_path.c_str(), &st) == 0) {
    std::ifstream f(cfg_path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    check_json_depth(text, cfg_path);
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    for (const char* key : {"torch_dtype", "dtype"}) {
      if (!j.is_object() || !j.contains(key) || j[key].is_null()) continue;
      std::string dt = from_torch(j[key].is_string() ? j[key].get<std::string>() : std::string());
      LLMT_CHECK(!dt.empty(), "--torch_dtype auto: %s: \"%s\" is %s; llmt saves float32, bfloat16 or float16 (give "
                 "--torch_dtype)", cfg_path.c_str(), key, clip_for_message(j[key].dump()).c_str());
      return dt;
    }
  }
  for (const std::string& name : ckpt->names()) {
    const StTensor* t = ckpt->find(name, nullptr);
    if (t->dtype == "F32" || t->dtype == "BF16" || t->dtype == "F16") return t->dtype;
  }
  return "F32";
}

std::unique_ptr<Tokenizer> pick_tokenizer(const TrainArgs& a, const ModelConfig& cfg) {
  std::string name = tokenizer_source(a);
  LLMT_CHECK(!name.empty(), "no tokenizer: give --tokenizer_name_or_path (a tokenizer directory or file, or \"bytes\" "
                            "for byte-level ids 0..255)");
  std::unique_ptr<Tokenizer> tok =
      name == "bytes" ? make_byte_tokenizer() : load_tokenizer(name, a.llama3_special_tokens);
  LLMT_CHECK(tok->vocab_size() <= cfg.vocab_size,
             "the tokenizer (%s, %d ids) does not fit the model's vocabulary of %d", name.c_str(), tok->vocab_size(),
             cfg.vocab_size);
  return tok;
}

// Everything one run holds. The constructor sets it up; run() is the loop of steps and their hooks.
class Trainer {
 public:
  Trainer(const TrainArgs& a, ControlComm& world, const LaunchInfo& launch);
  void run();

 private:
  // setup
  void prepare_output_dir();
  void build_model();
  int cuda_device_for_rank(const LaunchInfo& launch);
  std::unique_ptr<DataComm> make_device_data_comm();
  void report_nccl_transports();
  void describe_gpus();
  void load_data();
  void load_parameters();
  PlanArgs plan_args() const;
  void check_memory_fits();
  void describe();
  void resume();
  // the loop: a step, then its hooks
  StepResult step(int64_t step);
  void log(int64_t step, const StepResult& r);
  void maybe_evaluate(int64_t step);
  bool maybe_save(int64_t step);
  bool stop_requested(int64_t step, bool saved);
  void finish();
  void close_outputs();
  // what the hooks call
  double evaluate();
  void save_checkpoint(int64_t step);
  void record(const nlohmann::json& j);
  nlohmann::json data_identity_json() const;
  void check_resumed_data(const std::string& ck, const nlohmann::json& recorded);
  std::string resume_path();
  bool epoch_end(int64_t step) const { return (step + 1) % steps_per_epoch_ == 0; }

  const TrainArgs& a_;
  ControlComm& world_;
  const LaunchInfo& launch_;
  std::unique_ptr<DataComm> data_ = make_mpi_data_comm(world_);  // the world's data collectives
  const Strategy strategy_ = parse_fsdp(a_.fsdp);
  const DType reduce_dtype_ = parse_reduce_dtype(a_.mixed_precision_reduce);
  const int W_ = world_.size();
  ModelConfig cfg_;
  int threads_ = 0;
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Tokenizer> tok_;
  std::string tokenizer_dir_;  // copied beside saved models
  std::string save_dtype_ = "F32";  // what saved models are written in (--torch_dtype)
  TokenDataset train_, eval_;
  DataIdentity data_id_;  // the training data's identity, recorded in checkpoints and compared on resume
  int B_ = 0, T_ = 0, pad_id_ = 0, local_size_ = 1;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<FsdpStore> store_;
  std::unique_ptr<Sampler> sampler_;
  int64_t steps_per_epoch_ = 1, total_steps_ = 0, first_step_ = 0;
  int64_t global_batch_ = 1;  // sequences per step over every rank: with the seed, it fixes the data order
  Schedule sched_;
  AdamWConfig adamw_;
  LineFile metrics_;  // output_dir/metrics.jsonl (rank 0)
  std::unique_ptr<TensorBoardWriter> tb_;  // rank 0, with --report_to tensorboard
  std::vector<nlohmann::json> log_history_;  // what was logged, for trainer_state.json (rank 0)
  // this rank's batch buffers, one per micro-batch
  std::vector<std::vector<int32_t>> tokens_, targets_;
  // the logging window and the whole run's throughput
  double window_start_ = 0.0, window_loss_ = 0.0, window_flops_ = 0.0, run_start_ = 0.0;
  int64_t window_tokens_ = 0, window_steps_ = 0, run_tokens_ = 0;
  double comm_before_ = 0.0, comm_first_step_ = 0.0, planned_comm_bytes_ = 0.0;
  bool comm_recorded_ = false;
  double lr_ = 0.0;
  double first_loss_ = 0.0, first_grad_norm_ = 0.0;  // this run's first step, for the divergence warning
  bool warned_explosion_ = false;
  // A live progress line on a terminal; not under mpirun or srun, whose ranks' output may look like a
  // terminal but ends up in logs.
  bool live_ = false;
  bool log_nccl_ = false;
  int lock_fd_ = -1;  // rank 0: the open lock on output_dir (lock_output_dir), held for the run's life  // NCCL writes its log where report_nccl_transports reads it
  // Fault injection for the tests: LLMT_FAIL_AT_STEP=rank:step makes that rank fail at that step.
  int fail_rank_ = -1;
  long long fail_step_ = -1;
};

Trainer::Trainer(const TrainArgs& a, ControlComm& world, const LaunchInfo& launch)
    : a_(a), world_(world), launch_(launch) {
  if (a.tf32 && a.device == "cpu")
    log_info("note   --tf32 selects TF32 for fp32 matmuls on a GPU; the CPU has no TF32 and ignores it");
  install_stop_handlers();  // again, for callers other than `llmt train` (which installs them first thing)
  prepare_output_dir();
  log_info("%s", describe_layout(launch, a.device).c_str());
  build_model();
  load_data();
  load_parameters();
  describe();
  resume();
  live_ = world_.rank() == 0 && isatty(fileno(stdout)) && launch_.launcher == "single process";
  if (const char* f = std::getenv("LLMT_FAIL_AT_STEP")) std::sscanf(f, "%d:%lld", &fail_rank_, &fail_step_);
}

void Trainer::prepare_output_dir() {
  if (world_.rank() == 0) {
    make_dir(a_.output_dir);
    lock_fd_ = lock_output_dir(a_.output_dir);
    std::vector<CheckpointEntry> old = list_checkpoint_dirs(a_.output_dir);
    LLMT_CHECK(old.empty() || !a_.resume_from_checkpoint.empty() || a_.overwrite_output_dir,
               "%s already holds checkpoints: pass --resume_from_checkpoint latest to continue, or "
               "--overwrite_output_dir to start again there (it removes them)", a_.output_dir.c_str());
    if (a_.overwrite_output_dir && a_.resume_from_checkpoint.empty())
      for (const CheckpointEntry& c : old) {  // a new run's checkpoints must not mix with the old run's steps
        log_info("remove %s (--overwrite_output_dir)", c.path.c_str());
        remove_dir_tree(c.path);
      }
  }
  world_.barrier();
}

// What one rank's dataset is, by content: ranks whose files differ under one path (a node-local copy)
// would train on different data without a word.
static std::string dataset_identity(const TokenDataset& d) {
  if (d.empty()) return "none";
  const int64_t n = d.size(), tokens = d.total_tokens();
  uint32_t crc = crc32c(0, d.offsets_data(), (size_t)(n + 1) * sizeof(int64_t));
  crc = crc32c(crc, d.ids_data(), (size_t)tokens * sizeof(int32_t));
  if (!d.labels_are_ids()) crc = crc32c(crc, d.labels_data(), (size_t)tokens * sizeof(int32_t));
  return strformat("%lld examples, %lld tokens, CRC-32C %08x", (long long)n, (long long)tokens, crc);
}

void Trainer::build_model() {
  cfg_ = resolve_model_config(!a_.model_name_or_path.empty() ? a_.model_name_or_path : a_.model_config);
  {  // the same flags may still name different files on different nodes
    ConfigFields model;
    const nlohmann::json hf = config_to_hf_json(cfg_);
    for (auto it = hf.begin(); it != hf.end(); ++it) model.emplace_back("config.json " + it.key(), it.value().dump());
    check_ranks_agree(world_, "model configuration", model);
  }
  if (!a_.fsdp_transformer_layer_cls_to_wrap.empty()) {
    const char* want = cfg_.arch == Arch::gpt2 ? "GPT2Block" : "LlamaDecoderLayer";
    LLMT_CHECK(a_.fsdp_transformer_layer_cls_to_wrap == want, "--fsdp_transformer_layer_cls_to_wrap %s: a %s model's "
               "layers are %s", a_.fsdp_transformer_layer_cls_to_wrap.c_str(), cfg_.arch_name(), want);
  }
  tok_ = pick_tokenizer(a_, cfg_);
  tokenizer_dir_ = tokenizer_dir(tokenizer_source(a_));
  threads_ = a_.threads > 0 ? a_.threads : default_threads_per_rank(launch_);
  const DType compute = a_.bf16 ? DType::bf16 : DType::f32;
  if (a_.device == "cpu") {
    be_ = make_cpu_backend(threads_, compute);
    return;
  }
  be_ = make_cuda_backend(cuda_device_for_rank(launch_), compute, a_.tf32);
  describe_gpus();
  data_ = make_device_data_comm();
}

// --ddp_backend for --device cuda: NCCL unless the ranks of a node share a GPU (NCCL refuses two ranks
// on one device) or the build has no NCCL; else MPI, staged through host memory.
std::unique_ptr<DataComm> Trainer::make_device_data_comm() {
  const bool emulated = std::string(cuda_build_kind()) == "simt";  // the stand-in takes any layout
  const bool shared_gpu = !emulated && launch_.local_size > cuda_device_count();
  std::string backend = a_.ddp_backend;
  if (backend.empty()) backend = shared_gpu || !nccl_available() || emulated ? "mpi" : "nccl";
  LLMT_CHECK(!(backend == "nccl" && shared_gpu), "--ddp_backend nccl: %d ranks per node share %d GPU%s, and NCCL "
             "refuses two ranks on one device; start one rank per GPU or use --ddp_backend mpi", launch_.local_size,
             cuda_device_count(), cuda_device_count() == 1 ? "" : "s");
  if (backend == "mpi") {
    log_info("comm   data collectives over MPI, staged through host memory (--ddp_backend mpi): nothing overlaps");
    return make_staged_data_comm(std::move(data_), *be_);
  }
  log_nccl_ = !std::getenv("NCCL_DEBUG");  // the user's own NCCL_DEBUG settings win
  if (log_nccl_) {
    // NCCL's own account of its transports, one file per process, read back after the first step
    const std::string dir = a_.output_dir + "/nccl_logs";
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      fail("cannot create %s for NCCL's logs: %s", dir.c_str(), std::strerror(errno));
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "INIT,NET", 1);
    setenv("NCCL_DEBUG_FILE", (dir + "/nccl.%h.%p").c_str(), 1);
  }
  std::unique_ptr<DataComm> nccl = make_nccl_data_comm(world_, *be_, a_.ddp_timeout);
  log_info("comm   data collectives over NCCL %s on a communication stream of their own (--ddp_backend nccl)",
           nccl_build_version().c_str());
  return nccl;
}

// One GPU per rank: the rank's index among its node's ranks, over the devices it can see
// (CUDA_VISIBLE_DEVICES applies). More ranks than GPUs on a node share them, with a warning.
int Trainer::cuda_device_for_rank(const LaunchInfo& launch) {
  const int n = cuda_device_count();
  LLMT_CHECK(n > 0, "--device cuda: rank %d sees no usable CUDA device (%s)", world_.rank(),
             cuda_device_description(0).c_str());
  if (launch.local_size > n && world_.rank() == 0)
    log_info("warning %d ranks per node share %d GPU%s: fine for tests, slow for training", launch.local_size, n,
             n == 1 ? "" : "s");
  return launch.local_rank % n;
}

// After the first step, when NCCL has connected its channels: every rank's NCCL log, gathered on
// rank 0 and summarised by the netcheck parser (which path each connection takes: NET/IB with
// GDRDMA, NET/Socket, P2P, SHM) with its warnings, e.g. sockets between nodes that have RDMA.
void Trainer::report_nccl_transports() {
  std::string text;
  for (const std::string& l : read_text_lines(nccl_debug_file_path())) text += l + "\n";
  const size_t kMax = 256 << 10;  // a few thousand lines is plenty for a summary
  if (text.size() > kMax) text.resize(kMax);
  int32_t len = (int32_t)text.size(), longest = 0;
  std::vector<int32_t> lens((size_t)W_);
  world_.all_gather(&len, lens.data(), 1, DType::i32);
  for (int32_t l : lens) longest = std::max(longest, l);
  const int64_t words = (longest + 3) / 4;
  text.resize((size_t)words * 4, '\0');
  std::vector<char> all((size_t)words * 4 * W_);
  world_.all_gather(text.data(), all.data(), words, DType::i32);
  if (world_.rank() != 0) return;
  std::vector<std::string> lines;
  for (int r = 0; r < W_; r++) {
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
  log_info("nccl   (each rank's whole log: %s/nccl_logs/)", a_.output_dir.c_str());
}

// Which GPU each rank drives, as every rank sees it, on rank 0's log.
void Trainer::describe_gpus() {
  char line[256] = {0};
  std::snprintf(line, sizeof(line), "%s", cuda_device_description(cuda_device_for_rank(launch_)).c_str());
  std::vector<char> all((size_t)W_ * sizeof(line));
  world_.all_gather(line, all.data(), sizeof(line) / 4, DType::i32);
  if (world_.rank() != 0) return;
  for (int r = 0; r < W_; r++)
    log_info("gpu    rank %d: %s%s", r, all.data() + (size_t)r * sizeof(line),
             std::string(cuda_build_kind()) == "simt" ? " [the SIMT emulator: CUDA kernels on the CPU]" : "");
  log_info("gpu    attention: %s",
           cuda_attention_kernels(a_.bf16 ? DType::bf16 : DType::f32, cfg_.head_size()).c_str());
}

void Trainer::load_data() {
  DataArgs da = a_.data;
  if (da.block_size <= 0) da.block_size = std::min(1024, cfg_.max_seq_len);
  LLMT_CHECK(da.block_size <= cfg_.max_seq_len, "--block_size %d exceeds the model's context of %d", da.block_size,
             cfg_.max_seq_len);
  const std::string tok_src = tokenizer_source(a_);
  if (da.tokenizer_path.empty() && tok_src != "bytes") da.tokenizer_path = tok_src;
  // Alpaca examples longer than the model's context are cut at it, like those past model_max_length
  if (da.model_max_length > cfg_.max_seq_len) {
    if (!da.data_path.empty())
      log_info("data   --model_max_length %d is beyond the model's context: examples are cut at %d tokens",
               da.model_max_length, cfg_.max_seq_len);
    da.model_max_length = cfg_.max_seq_len;
  }
  test_stop_point("data", world_.rank());
  train_ = load_train_dataset(da, *tok_, world_.rank(), W_, &data_id_);
  if (a_.do_eval || a_.evaluation_strategy != "no") {
    eval_ = load_eval_dataset(da, *tok_, world_.rank(), W_);
    LLMT_CHECK(!eval_.empty(), "--do_eval / --evaluation_strategy: there is no evaluation data (--validation_file, or "
                               "a dataset with a validation split)");
  }
  check_ranks_agree(world_, "data",
                    {{"tokenizer", strformat("%s, %d ids", tok_->kind().c_str(), tok_->vocab_size())},
                     {"train data", dataset_identity(train_)},
                     {"evaluation data", dataset_identity(eval_)}});
  pad_id_ = default_pad_id(*tok_);
  B_ = a_.per_device_train_batch_size;
  T_ = (int)std::min<int64_t>(train_.max_length(), cfg_.max_seq_len);
  if (!eval_.empty()) T_ = (int)std::min<int64_t>(std::max<int64_t>(T_, eval_.max_length()), cfg_.max_seq_len);

  const int accum = a_.gradient_accumulation_steps;
  sampler_ = std::make_unique<Sampler>(train_.size(), W_, world_.rank(), B_, accum, a_.seed);
  steps_per_epoch_ = sampler_->steps_per_epoch();
  global_batch_ = (int64_t)W_ * B_ * accum;
  total_steps_ = total_train_steps(a_, steps_per_epoch_, global_batch_);
  sched_ = make_schedule(a_.lr_scheduler_type, total_steps_, a_.warmup_steps, a_.warmup_ratio, a_.lr_scheduler_kwargs,
                         a_.learning_rate);
  adamw_.beta1 = (float)a_.adam_beta1;
  adamw_.beta2 = (float)a_.adam_beta2;
  adamw_.eps = (float)a_.adam_epsilon;
  adamw_.weight_decay = (float)a_.weight_decay;
  tokens_.resize((size_t)accum);
  targets_.resize((size_t)accum);
}

// The model's activations and the store, then every unit's parameters: read from the Hugging Face
// checkpoint or initialised, one unit at a time (no rank holds the whole model).
// What llmt plan computes for this run (the same figures as `llmt plan` with these flags).
PlanArgs Trainer::plan_args() const {
  PlanArgs pa;
  pa.world = W_;
  pa.ranks_per_node = strategy_ == Strategy::hybrid_shard ? local_size_ : W_;
  pa.fsdp = strategy_name(strategy_);
  pa.batch = B_;
  pa.seq_len = T_;
  pa.accum = a_.gradient_accumulation_steps;
  pa.gradient_checkpointing = a_.gradient_checkpointing;
  pa.bf16 = a_.bf16;
  pa.reduce_dtype = reduce_dtype_;
  return pa;
}

// Before anything large is allocated: the plan's per-rank total against the memory this rank can
// have: on a GPU, the device's free memory over the ranks that share it; on the CPU, the node's
// available memory over its ranks. --per_device_train_batch_size 100000 took 8 GB and half a minute
// before any check.
void Trainer::check_memory_fits() {
  const nlohmann::json plan = make_plan(cfg_, plan_args());
  const double need = plan["total_gib"].get<double>();
  std::string where;
  const double per_rank = memory_per_rank_gib(be_.get(), launch_.local_rank, launch_.local_size, &where);
  if (per_rank <= 0) return;  // nothing to compare with
  LLMT_CHECK(need <= per_rank, "this run needs %.2f GiB per rank (llmt plan: %.2f persistent, %.2f gathered, %.2f "
             "activations) and %s: lower --per_device_train_batch_size or --block_size/--model_max_length, add "
             "--gradient_checkpointing True, or shard over more ranks", need, plan["persistent_gib"].get<double>(),
             plan["gathered_peak_gib"].get<double>(), plan["activations_gib"].get<double>(), where.c_str());
}

void Trainer::load_parameters() {
  local_size_ = a_.hybrid_shard_group_size > 0 ? a_.hybrid_shard_group_size : launch_.local_size;
  check_memory_fits();
  model_ = std::make_unique<Transformer>(cfg_, *be_, B_, T_, a_.gradient_checkpointing);
  const ModelLayout& L = model_->layout();
  // hybrid_shard's groups are runs of consecutive ranks: with a node's ranks they must be that node's
  if (strategy_ == Strategy::hybrid_shard && a_.hybrid_shard_group_size <= 0)
    LLMT_CHECK(world_.rank() / launch_.local_size == launch_.node,
               "hybrid_shard shards within a node, so each node's ranks must be consecutive (mpirun's default "
               "--map-by slot, or ppr:N:node); rank %d sits on node %d", world_.rank(), launch_.node);
  test_stop_point("store", world_.rank());
  store_ = std::make_unique<FsdpStore>(*be_, L, strategy_, *data_, local_size_, reduce_dtype_);
  std::unique_ptr<SafetensorsCheckpoint> ckpt;
  if (!a_.model_name_or_path.empty()) {
    ckpt = std::make_unique<SafetensorsCheckpoint>(a_.model_name_or_path);
    check_hf_tensors(*ckpt, cfg_, L, a_.model_name_or_path);
  }
  save_dtype_ = saved_model_dtype(a_, ckpt.get());
  std::vector<float> host;
  for (size_t u = 0; u < L.units.size(); u++) {
    host.assign((size_t)L.units[u].numel, 0.0f);
    if (ckpt) load_hf_unit(*ckpt, cfg_, L, (int)u, host.data());
    else init_unit_params(cfg_, L.units[u], (int)u, a_.seed, host.data());
    store_->set_unit((int)u, host.data());
  }
}

// What this run holds and will send, as llmt plan predicts it (measured figures follow at the end).
void Trainer::describe() {
  const ModelLayout& L = model_->layout();
  const ShardGroups& g = store_->groups();
  nlohmann::json plan = make_plan(cfg_, plan_args());
  log_info("model  %s, %.2fM parameters (%s)", cfg_.describe().c_str(), L.total_numel / 1e6,
           a_.model_name_or_path.empty() ? "random init" : a_.model_name_or_path.c_str());
  log_info("fsdp   %s: shards over %d rank%s x %d replica%s; per rank %.1f MiB of state (master, grad, m, v%s), "
           "activations %.1f MiB%s; compute %s, gradients reduced in %s, models saved in %s",
           strategy_name(strategy_), g.shard_size, g.shard_size == 1 ? "" : "s", g.replica_size,
           g.replica_size == 1 ? "" : "s", store_->persistent_bytes() / kMiB, a_.bf16 ? ", bf16 copy" : "",
           Transformer::activation_bytes(cfg_, B_, T_, a_.gradient_checkpointing, be_->compute_dtype()) / kMiB,
           a_.gradient_checkpointing ? " (gradient checkpointing)" : "", dtype_name(be_->compute_dtype()),
           dtype_name(reduce_dtype_), save_dtype_.c_str());
  log_info("plan   per rank: gathered buffers at most %.1f MiB; %.1f MiB sent per step at the longest batches "
           "(llmt plan)",
           plan["gathered_peak_gib"].get<double>() * 1024.0, plan["comm_total_bytes"].get<double>() / kMiB);
  planned_comm_bytes_ = plan["comm_total_bytes"].get<double>();
  log_info("train  %lld steps (%lld per epoch), global batch %d x %d x %d = %lld sequences, lr %g (%s, %lld warmup), "
           "%d threads per rank; each line logs the lr its step used (HF 4.40 logged the next step's) and the loss "
           "averaged over the tokens of the global batch (as transformers since 4.46)",
           (long long)total_steps_, (long long)steps_per_epoch_, W_, B_, a_.gradient_accumulation_steps,
           (long long)global_batch_, a_.learning_rate, sched_.type.c_str(), (long long)sched_.warmup_steps, threads_);
}

void Trainer::resume() {
  std::string ck = resume_path();
  if (!ck.empty()) {
    struct stat sb;
    LLMT_CHECK(::stat((ck + "/state.h5").c_str(), &sb) == 0,
               "%s holds no training state (it was saved with --save_only_model), so it cannot be resumed; start a "
               "new run from its weights with --model_name_or_path %s", ck.c_str(), ck.c_str());
    LoadedTrainState st =
        load_train_state(ck + "/state.h5", world_, model_->layout(), *store_, config_to_hf_json(cfg_).dump());
    first_step_ = st.global_step;
    if (world_.rank() == 0) {  // the log so far, so trainer_state.json keeps the whole history
      std::ifstream f(ck + "/trainer_state.json", std::ios::binary);
      const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      check_json_depth(text, ck + "/trainer_state.json");
      nlohmann::json ts = nlohmann::json::parse(text, nullptr, false);
      LLMT_CHECK(ts.is_object() && ts.contains("log_history") && ts["log_history"].is_array(),
                 "%s/trainer_state.json is missing or malformed", ck.c_str());
      LLMT_CHECK(!ts.contains("model_config") || ts["model_config"] == config_to_hf_json(cfg_),
                 "%s/trainer_state.json belongs to another model (%s), not this %s", ck.c_str(),
                 clip_for_message(ts["model_config"].dump()).c_str(), cfg_.describe().c_str());
      for (auto& rec : ts["log_history"]) log_history_.push_back(rec);
    }
    world_.barrier();
    nlohmann::json sc = nlohmann::json::parse(st.scalars_json, nullptr, false);
    for (const char* key : {"global_batch", "seed"})  // (sc.value would throw nlohmann's own error on a string)
      LLMT_CHECK(!sc.is_object() || !sc.contains(key) || sc[key].is_number_integer(),
                 "%s/state.h5: /meta/scalars \"%s\" is %s, expected an integer", ck.c_str(), key,
                 clip_for_message(sc[key].dump()).c_str());
    LLMT_CHECK(sc.is_object() && sc.value("global_batch", global_batch_) == global_batch_ &&
                   sc.value("seed", a_.seed) == a_.seed,
               "%s was trained with a global batch of %lld sequences and --seed %llu; this run has %lld and %llu, so "
               "it would not continue with the same data (keep ranks x per-device batch x accumulation, and the seed)",
               ck.c_str(), (long long)sc.value("global_batch", (int64_t)0), (unsigned long long)sc.value("seed", (uint64_t)0),
               (long long)global_batch_, (unsigned long long)a_.seed);
    if (sc.contains("train_data")) check_resumed_data(ck, sc["train_data"]);  // (older checkpoints lack it)
    log_info("resume %s: step %lld, Adam step %d; continuing to step %lld", ck.c_str(), (long long)first_step_,
             st.adam_step, (long long)total_steps_);
    LLMT_CHECK(first_step_ < total_steps_, "%s is at step %lld, and the run ends at step %lld: nothing left to train",
               ck.c_str(), (long long)first_step_, (long long)total_steps_);
  }
  if (world_.rank() == 0) {  // metrics.jsonl: this run's records, after the resumed checkpoint's history
    metrics_.open(a_.output_dir + "/metrics.jsonl");
    for (const auto& rec : log_history_) metrics_.write(rec.dump());
    if (a_.report_tensorboard) {  // this run's records only: a resumed run's history is in its own files
      tb_ = std::make_unique<TensorBoardWriter>(a_.logging_dir.empty() ? default_logging_dir(a_.output_dir)
                                                                       : a_.logging_dir);
      log_info("report tensorboard: %s (tensorboard --logdir %s)", tb_->path().c_str(),
               (a_.logging_dir.empty() ? a_.output_dir + "/runs" : a_.logging_dir).c_str());
    }
  }
}

nlohmann::json Trainer::data_identity_json() const {
  return {{"key", data_id_.key},
          {"source", data_id_.source},
          {"block_size", data_id_.block_size},
          {"model_max_length", data_id_.model_max_length},
          {"examples", data_id_.examples},
          {"tokens", data_id_.tokens}};
}

// A resume with other data (another --train_file, --block_size, --model_max_length, tokenizer, or the
// file edited) continued silently at the checkpoint's step of a different order. The token cache key
// decides; the readable fields say what differs. --ignore_data_skip True accepts it.
void Trainer::check_resumed_data(const std::string& ck, const nlohmann::json& was) {
  const nlohmann::json now = data_identity_json();
  if (was.is_object() && was.value("key", std::string()) == data_id_.key) return;
  std::string diff;
  for (const char* field : {"source", "block_size", "model_max_length", "examples", "tokens"}) {
    const nlohmann::json a = was.is_object() && was.contains(field) ? was[field] : nlohmann::json(),
                         b = now[field];
    if (a != b)
      diff += strformat("%s%s %s, now %s", diff.empty() ? "" : "; ", field, clip_for_message(a.dump()).c_str(),
                        clip_for_message(b.dump()).c_str());
  }
  if (diff.empty()) diff = "the same file name and settings, but its content or the tokenizer's files changed";
  diff += strformat(" (token cache key %s, now %s)", clip_for_message(was.is_object() ? was.value("key", "") : "").c_str(),
                    data_id_.key.c_str());
  LLMT_CHECK(a_.ignore_data_skip, "%s was trained on other data: %s. Resuming would continue at step %lld of another "
             "data order; give the checkpoint's data, or --ignore_data_skip True to continue on this data anyway",
             ck.c_str(), diff.c_str(), (long long)first_step_);
  log_info("warning %s was trained on other data: %s; continuing on this data (--ignore_data_skip True)", ck.c_str(),
           diff.c_str());
}

void Trainer::run() {
  // A signal during setup (tokenizing a large corpus, loading a checkpoint): stop now, all ranks
  // together; the job can be requeued and start again.
  if (world_.all_reduce_sum(stop_signal() != 0 ? 1.0 : 0.0) > 0) {
    log_info("stopped before the first step by a signal; nothing to save");
    return;
  }
  window_start_ = run_start_ = now_s();
  comm_before_ = store_->comm_bytes() + data_->stats().total();
  for (int64_t s = first_step_; s < total_steps_; s++) {
    if (s - first_step_ == a_.throughput_warmup_steps) run_start_ = now_s(), run_tokens_ = 0;
    watchdog_set_step(s + 1);  // steps are counted from 1 in the log
    StepResult r = step(s);
    if (s == first_step_) comm_first_step_ = store_->comm_bytes() + data_->stats().total() - comm_before_;
    if (s == first_step_ && log_nccl_) report_nccl_transports();
    if (s == first_step_ && a_.device == "cpu" && a_.bf16)  // the layout's kernels, now that they have run
      log_info("layout bf16 matmul kernels by shape class (LLMT_CPU_BF16_MATMUL=auto|bf16|fp32): %s",
               describe_cpu_bf16_matmul_choices().c_str());
    log(s, r);
    maybe_evaluate(s);
    bool saved = maybe_save(s);
    if (stop_requested(s, saved)) {
      log_info("stopped at step %lld of %lld by a signal; checkpoint-%lld holds the model", (long long)s + 1,
               (long long)total_steps_, (long long)s + 1);
      close_outputs();
      return;
    }
  }
  finish();
  close_outputs();
}

// metrics.jsonl and the TensorBoard file, closed with their errors reported (rank 0 holds them).
void Trainer::close_outputs() {
  metrics_.close();
  if (tb_) tb_->close();
}

// This rank's micro-batches of step `s`, then one optimizer step over every rank.
StepResult Trainer::step(int64_t s) {
  LLMT_CHECK(!(world_.rank() == fail_rank_ && s + 1 == fail_step_), "injected failure (LLMT_FAIL_AT_STEP) at step %lld",
             (long long)s + 1);
  std::vector<MicroBatch> micro;
  int64_t step_tokens = 0;
  for (int m = 0; m < a_.gradient_accumulation_steps; m++) {
    int len = collate(train_, sampler_->indices(s, m), pad_id_, tokens_[m], targets_[m]);
    LLMT_CHECK(len <= T_, "internal: batch length %d over %d", len, T_);
    micro.push_back({tokens_[m].data(), targets_[m].data(), len, ((int64_t)m * W_ + world_.rank()) * B_});
    step_tokens += (int64_t)B_ * len;
    window_flops_ += (double)B_ * len * Transformer::flops_per_token(cfg_, model_->layout(), len);
  }
  lr_ = a_.learning_rate * sched_.multiplier(s);
  StepSettings ss;
  ss.lr = (float)lr_;
  ss.adamw = adamw_;
  ss.max_grad_norm = a_.max_grad_norm;
  ss.seed = a_.seed;
  ss.step = s;
  StepResult r = train_step(*model_, *store_, world_, *data_, micro, ss);
  window_loss_ += r.loss;
  window_tokens_ += step_tokens * W_;
  run_tokens_ += step_tokens * W_;
  window_steps_++;
  return r;
}

// Every logging_steps (and at the last step): a line on rank 0 and a record in metrics.jsonl.
void Trainer::log(int64_t s, const StepResult& r) {
  if (live_) {
    std::printf("\r  step %lld/%lld  loss %.4f  ", (long long)s + 1, (long long)total_steps_, r.loss);
    std::fflush(stdout);
  }
  // A loss or gradient norm 1000x its first value keeps training silently: say so once, with the step.
  if (s == first_step_) first_loss_ = r.loss, first_grad_norm_ = r.grad_norm;
  if (!warned_explosion_ && (r.loss > 1e3 * first_loss_ || r.grad_norm > 1e3 * std::max(first_grad_norm_, 1e-3))) {
    warned_explosion_ = true;
    log_info("warning step %lld: the loss (%g) or gradient norm (%g) is over 1000 times its first value (%g, %g): training "
             "is diverging; lower --learning_rate or set --max_grad_norm", (long long)s + 1, r.loss, r.grad_norm,
             first_loss_, first_grad_norm_);
  }
  // --logging_strategy as the Trainer's: every logging_steps, or at each epoch's end; and the last step
  const bool last = s + 1 == total_steps_;
  bool now = a_.logging_strategy == "steps"   ? (s + 1) % a_.logging_steps == 0 || last
             : a_.logging_strategy == "epoch" ? epoch_end(s) || last
                                              : false;
  if (a_.logging_first_step && s == 0) now = true;
  if (!now) return;
  const double dt = now_s() - window_start_, tps = window_tokens_ / dt, mean_loss = window_loss_ / window_steps_;
  const double epoch = (double)(s + 1) / steps_per_epoch_;
  if (live_) std::printf("\r");
  log_info("step %6lld/%lld | epoch %.2f | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s (%.0f per rank) | "
           "%.0f ms/step | rss %.2f GiB",
           (long long)s + 1, (long long)total_steps_, epoch, mean_loss, lr_, r.grad_norm, tps, tps / W_,
           1000.0 * dt / window_steps_, peak_rss_gib());
  nlohmann::json j = {{"step", s + 1},
                      {"epoch", epoch},
                      {"loss", mean_loss},
                      {"learning_rate", lr_},
                      {"grad_norm", r.grad_norm},
                      {"tokens_per_s", tps},
                      {"tokens_per_s_per_rank", tps / W_},
                      {"gflops_rank0", window_flops_ / dt / 1e9},
                      {"flops_convention", Transformer::kFlopsConvention},
                      {"peak_rss_gib", peak_rss_gib()}};
  if (!comm_recorded_) {  // the first record of the run: what rank 0 sent in its first step, and the plan
    j["comm_bytes_first_step_rank0"] = comm_first_step_;
    j["comm_bytes_planned_per_step"] = planned_comm_bytes_;
    comm_recorded_ = true;
  }
  record(j);
  window_start_ = now_s();
  window_loss_ = window_flops_ = 0.0;
  window_tokens_ = window_steps_ = 0;
}

void Trainer::maybe_evaluate(int64_t s) {
  const int64_t every = a_.eval_steps > 0 ? a_.eval_steps : a_.logging_steps;  // Hugging Face's fallback
  bool now = (a_.evaluation_strategy == "steps" && (s + 1) % every == 0) ||
             (a_.evaluation_strategy == "epoch" && epoch_end(s));
  if (!now) return;
  double el = evaluate();
  log_info("eval   step %lld | eval_loss %.4f | perplexity %.3f", (long long)s + 1, el, std::exp(el));
  record({{"step", s + 1}, {"eval_loss", el}, {"perplexity", std::exp(el)}});
}

bool Trainer::maybe_save(int64_t s) {
  bool now = (a_.save_strategy == "steps" && (s + 1) % a_.save_steps == 0) ||
             (a_.save_strategy == "epoch" && epoch_end(s));
  if (now) save_checkpoint(s + 1);
  return now;
}

// A signal reaches some ranks and not others: agree before acting, so every rank saves together.
bool Trainer::stop_requested(int64_t s, bool saved) {
  if (s + 1 >= total_steps_ || world_.all_reduce_sum(stop_signal() != 0 ? 1.0 : 0.0) == 0) return false;
  log_info("signal received: saving at step %lld and stopping", (long long)s + 1);
  if (!saved) save_checkpoint(s + 1);
  return true;
}

void Trainer::finish() {
  const double run_s = now_s() - run_start_;
  if (total_steps_ - first_step_ > a_.throughput_warmup_steps)
    log_info("done   %.0f tok/s over steps %d..%lld (%.0f per rank); measured per rank: %.1f MiB sent in step 1, "
             "gathered buffers peaked at %.1f MiB, peak rss %.2f GiB",
             run_tokens_ / run_s, a_.throughput_warmup_steps + 1, (long long)total_steps_, run_tokens_ / run_s / W_,
             comm_first_step_ / kMiB, store_->peak_gathered_bytes() / kMiB, peak_rss_gib());
  if (a_.do_eval) {
    double el = evaluate();
    log_info("eval   eval_loss %.4f | perplexity %.3f", el, std::exp(el));
    record({{"step", total_steps_}, {"eval_loss", el}, {"perplexity", std::exp(el)}});
  }
  // a signal arriving now changes nothing: this is the end of the run
  write_hf_model(world_, *store_, cfg_, model_->layout(), a_.output_dir, save_dtype_, tokenizer_dir_);
  log_info("saved  %s (config.json, model.safetensors in %s)", a_.output_dir.c_str(), save_dtype_.c_str());
}

// A metrics record: to metrics.jsonl and the log history (rank 0 only).
void Trainer::record(const nlohmann::json& j) {
  if (world_.rank() != 0) return;
  log_history_.push_back(j);
  metrics_.write(j.dump());
  if (!tb_) return;
  // every number but the step, under the Trainer's tag names; an eval record's perplexity is eval/
  std::vector<std::pair<std::string, double>> scalars;
  const bool eval = j.contains("eval_loss");
  for (const auto& [key, value] : j.items())
    if (key != "step" && value.is_number())
      scalars.push_back({eval && key == "perplexity" ? "eval/perplexity" : tensorboard_tag(key), value.get<double>()});
  tb_->add_scalars(j.value("step", (int64_t)0), scalars);
}

// Mean loss over every token counted on every rank, without dropout.
double Trainer::evaluate() {
  // per_device_eval_batch_size examples per rank per round, run through the training-sized activations
  // B_ rows at a time: an eval batch larger than the training one takes several forwards (the loss is
  // a sum over tokens, so the pieces add up to the same mean)
  const int B = a_.per_device_eval_batch_size > 0 ? a_.per_device_eval_batch_size : B_;
  const int pieces = (B + B_ - 1) / B_;
  const int rank = world_.rank();
  const int64_t n = eval_.size(), per_round = (int64_t)W_ * B;
  const int64_t rounds = (n + per_round - 1) / per_round;  // the same on every rank: forward is collective
  std::vector<int32_t> tokens, targets;
  double counted = 0.0;
  BackendBuffer loss_sum(*be_, DType::f64, {1});
  for (int64_t chunk = 0; chunk < rounds * pieces; chunk++) {
    const int64_t round = chunk / pieces;
    const int first = (int)(chunk % pieces) * B_;
    std::vector<int64_t> idx;
    for (int b = first; b < std::min(B, first + B_); b++) {
      int64_t i = round * per_round + (int64_t)rank * B + b;
      if (i < n) idx.push_back(i);
    }
    int T = 1;
    if (!idx.empty()) T = collate(eval_, idx, pad_id_, tokens, targets);
    LLMT_CHECK(T <= T_, "internal: evaluation batch of %d tokens over the %d the model was sized for", T, T_);
    // rows past the examples (the last round, and beyond the eval batch) are padding with no targets
    std::vector<int32_t> tok_full((size_t)B_ * T, pad_id_), tgt_full((size_t)B_ * T, kIgnoreIndex);
    for (size_t b = 0; b < idx.size(); b++)
      for (int t = 0; t < T; t++) {
        tok_full[b * T + t] = tokens[b * T + t];
        tgt_full[b * T + t] = targets[b * T + t];
      }
    counted += (double)count_targets(tgt_full.data(), (int64_t)tgt_full.size());
    model_->forward(*store_, tok_full.data(), tgt_full.data(), T, loss_sum.tensor());
  }
  data_->all_reduce_async(loss_sum.tensor().data, 1, DType::f64, ReduceOp::sum)->wait();
  double total = 0.0;
  be_->copy_to_host(&total, loss_sum.tensor().data, sizeof(total));
  counted = world_.all_reduce_sum(counted);
  return counted > 0 ? total / counted : NAN;
}

// output_dir/checkpoint-<step>: the Hugging Face export, the exact training state (state.h5) and
// trainer_state.json, written under a temporary name, checksummed into manifest.json and renamed,
// so a checkpoint is complete or absent; then the oldest beyond save_total_limit are removed.
void Trainer::save_checkpoint(int64_t step) {
  std::string dir = save_checkpoint_dir(a_.output_dir, step, world_, [&](const std::string& tmp) {
    write_hf_model(world_, *store_, cfg_, model_->layout(), tmp, save_dtype_, tokenizer_dir_);
    nlohmann::json scalars = {{"global_step", step},
                              {"seed", a_.seed},
                              {"steps_per_epoch", steps_per_epoch_},
                              {"global_batch", global_batch_},
                              {"train_data", data_identity_json()}};
    if (!a_.save_only_model)  // --save_only_model: the model alone, as the Trainer's; nothing to resume from
      save_train_state(tmp + "/state.h5", world_, model_->layout(), *store_, step, scalars.dump(),
                       config_to_hf_json(cfg_).dump());
    std::string error;
    if (world_.rank() == 0) try {
        nlohmann::json ts = {{"global_step", step},
                             {"epoch", (double)step / steps_per_epoch_},
                             {"max_steps", a_.max_steps},
                             {"num_train_epochs", a_.num_train_epochs},
                             {"logging_steps", a_.logging_steps},
                             {"save_steps", a_.save_steps},
                             {"train_batch_size", B_},
                             {"model_config", config_to_hf_json(cfg_)},
                             {"train_data", data_identity_json()},
                             {"log_history", log_history_}};
        write_file_atomic(tmp + "/trainer_state.json", ts.dump(2) + "\n");
      } catch (const Error& e) {
        error = e.what();
      }
    agree_or_throw(world_, error.empty(), error);
  });
  if (world_.rank() == 0) {
    for (const std::string& gone : apply_save_total_limit(a_.output_dir, a_.save_total_limit, dir))
      log_info("removed %s (--save_total_limit %d)", gone.c_str(), a_.save_total_limit);
    log_info("saved  %s", dir.c_str());
  }
  world_.barrier();
}

// The checkpoint --resume_from_checkpoint names ("latest"/"True": the newest complete one whose
// checksums verify), agreed on every rank; "" when not resuming.
std::string Trainer::resume_path() {
  const std::string& want = a_.resume_from_checkpoint;
  if (want.empty()) return "";
  if (want != "latest" && want != "True" && want != "true") {
    std::string problem;
    if (world_.rank() == 0) try {
        verify_checkpoint(want, kCheckpointRequiredFiles);
      } catch (const Error& e) {
        problem = e.what();
      }
    agree_or_throw(world_, problem.empty(), problem);
    return want;
  }
  // rank 0 looks (checksums cost a full read), every rank learns the step
  double step = 0.0;
  std::string problem;
  if (world_.rank() == 0) {
    // Newest first, checksums recomputed. One that fails is said loudly and moved aside (kept for a
    // look, out of the checkpoint namespace, so this run never overwrites it), and the next older
    // one is tried.
    std::vector<CheckpointEntry> all = list_checkpoint_dirs(a_.output_dir);
    std::string latest;
    int failed = 0;
    for (size_t i = all.size(); i-- > 0 && latest.empty();) {
      const std::string why = checkpoint_problem(all[i].path, true, kCheckpointRequiredFiles);
      if (why.empty()) {
        latest = all[i].path;
        break;
      }
      failed++;
      std::string aside = all[i].path + ".corrupt";
      for (int n = 2; ::access(aside.c_str(), F_OK) == 0; n++) aside = all[i].path + strformat(".corrupt-%d", n);
      const bool moved = ::rename(all[i].path.c_str(), aside.c_str()) == 0;
      log_info("warning %s failed its checks: %s; %s", all[i].path.c_str(), why.c_str(),
               moved ? strformat("moved aside to %s", aside.c_str()).c_str()
                     : strformat("could not move it aside (%s)", std::strerror(errno)).c_str());
    }
    if (latest.empty())
      problem = failed ? strformat("--resume_from_checkpoint %s: %s holds %d checkpoint%s and every one failed its "
                                   "checks (see the warnings above; they were moved aside as *.corrupt)",
                                   want.c_str(), a_.output_dir.c_str(), failed, failed == 1 ? "" : "s")
                       : strformat("--resume_from_checkpoint %s: %s holds no checkpoint", want.c_str(),
                                   a_.output_dir.c_str());
    else
      step = (double)std::stoll(latest.substr(latest.rfind('-') + 1));
  }
  agree_or_throw(world_, problem.empty(), problem);
  step = world_.all_reduce_sum(step);
  return checkpoint_path(a_.output_dir, (int64_t)step);
}

}  // namespace

// The signals are blocked in every thread (threads made later inherit the mask: MPI's, OpenMP's,
// oneDNN's) and taken by one thread of their own with sigwait. A handler would run on whichever
// thread the kernel picks, on that thread's stack: a signal arriving inside oneDNN's JIT GEMM
// corrupted the heap about one time in seven (free() in dnnl_sgemm: "corrupted size vs.
// prev_size"), which never happens when no computing thread is interrupted.
void install_stop_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread([set] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) == 0) set_stop_signal(sig);
      }
    }).detach();
  });
}

void run_training(const TrainArgs& a, ControlComm& world, const LaunchInfo& launch) {
  // init_launch started the watchdog before MPI_Init (a caller that did not gets one here): a dead or
  // stopped rank ends the job in --ddp_timeout.
  const bool own_watchdog = !watchdog_running();
  if (own_watchdog) watchdog_start(a.ddp_timeout, world.rank());
  struct StopWatchdog {
    bool own;
    ~StopWatchdog() {
      watchdog_clear_peers();  // a finished run leaves no progress records
      if (own) watchdog_stop();
    }
  } stop_watchdog{own_watchdog};  // after the Trainer and its communicators are gone
  // Every rank must run the same job: a flag that differs would hang, abort inside MPI or train wrong.
  check_ranks_agree(world, "train configuration", train_config_fields(a));
  // Progress records go under the output directory, which every node shares; the run id (rank 0's
  // clock and pid) tells this run's records from a crashed earlier run's.
  // Each run has a folder of its own, so a second run refused by the output_dir lock never touches
  // the first one's records.
  PeerRecords peers;
  peers.world_size = world.size();
  peers.host = launch.hostname;
  const double id = world.all_reduce_sum(
      world.rank() == 0 ? (double)((uint64_t)std::time(nullptr) * 100000 + (uint64_t)getpid() % 100000) : 0.0);
  peers.run_id = strformat("%.0f", id);
  const std::string records = a.output_dir + "/.llmt-progress";
  peers.dir = records + "/" + peers.run_id;
  mkdir_parents(a.output_dir);  // the trainer reports a bad output_dir itself; then there are no records
  ::mkdir(records.c_str(), 0755);
  if (::mkdir(peers.dir.c_str(), 0755) != 0 && errno != EEXIST) peers.dir.clear();
  watchdog_set_peers(peers);
  Trainer t(a, world, launch);
  t.run();
}

}  // namespace llmt
