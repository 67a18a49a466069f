#include "train/trainer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/packing.h"
#include "data/sampler.h"
#include "data/token_cache.h"
#include "data/tokenizer.h"
#include "engine/backend/backend.h"
#include "engine/core/crc32c.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/log.h"
#include "engine/core/stop.h"
#include "engine/diag/nccl_log.h"
#include "engine/dist/agree.h"
#include "engine/dist/comm_wait.h"
#include "engine/dist/watchdog.h"
#include "engine/formats/safetensors.h"  // write_file_atomic
#include "engine/fsdp/fsdp.h"
#include "engine/optim/adamw.h"
#include "engine/optim/schedule.h"
#include "kernels/cpu/bf16_matmul_choice.h"
#include "models/transformer.h"
#include "train/checkpointer.h"
#include "train/export.h"
#include "train/lora_run.h"
#include "train/metrics.h"
#include "train/output_path.h"
#include "train/run_dir.h"
#include "train/session.h"
#include "train/step.h"

namespace llmt {

namespace {

const double kMiB = 1024.0 * 1024.0;

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

// Where the run writes (output_dir, --logging_dir, the token cache) against what it reads and every
// checkpoint (train/output_path.h): --output_dir run/checkpoint-4 wrote its files into that checkpoint,
// and the first run's next resume set it aside as corrupt. --overwrite_output_dir removes the
// checkpoints in output_dir, so none of them may be an input.
void check_train_paths(const TrainArgs& a) {
  const bool resuming = !a.resume_from_checkpoint.empty() && a.resume_from_checkpoint != "latest" &&
                        a.resume_from_checkpoint != "True";
  struct stat st;
  const bool config_file = stat(a.model_config.c_str(), &st) == 0;  // a preset name is no file
  const std::vector<NamedPath> inputs = {
      {"--model_name_or_path", a.model_name_or_path},
      {"--model_config", config_file ? a.model_config : ""},
      {"--tokenizer_name_or_path", a.tokenizer_name_or_path == "bytes" ? "" : a.tokenizer_name_or_path},
      {"--data_path", a.data.data_path},
      {"--train_file", a.data.train_file},
      {"--validation_file", a.data.validation_file},
      {"--dataset_dir", a.data.dataset_dir},
      {"--resume_from_checkpoint", resuming ? a.resume_from_checkpoint : ""}};
  check_output_path("llmt train", {"--output_dir", a.output_dir}, OutputKind::directory, inputs);
  check_output_path("llmt train", {"--logging_dir", a.logging_dir}, OutputKind::directory, inputs);
  const std::string cache = resolve_cache_dir(a.data.cache_dir);
  check_output_path("llmt train", {a.data.cache_dir.empty() ? "the token cache ($LLMT_CACHE, ~/.cache/llmt)"
                                                            : "--cache_dir", cache},
                    OutputKind::directory);
  if (!a.overwrite_output_dir || !a.resume_from_checkpoint.empty()) return;
  const std::string out = resolved_path(a.output_dir);
  for (const NamedPath& in : inputs) {
    if (in.path.empty()) continue;
    const std::string ck = enclosing_checkpoint(resolved_path(in.path));
    LLMT_CHECK(ck.empty() || !path_within(ck, out), "llmt train: --overwrite_output_dir would remove the checkpoint "
               "%s, which %s %s reads; give another --output_dir", ck.c_str(), in.flag.c_str(), in.path.c_str());
  }
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

// What the loop and its hooks read of the flags, taken once in the constructor.
struct LoopSettings {
  int accum = 1;                    // --gradient_accumulation_steps
  double learning_rate = 0.0, max_grad_norm = 1.0;
  uint64_t seed = 42;
  int throughput_warmup_steps = 0;
  std::string evaluation_strategy, save_strategy;  // no, steps, epoch
  int64_t eval_every = 0, save_steps = 0;          // eval_every: --eval_steps, else --logging_steps
  bool do_eval = false;
  int eval_batch = 0;               // --per_device_eval_batch_size (0: the train batch)
  std::string output_dir, nccl_log_dir;
  bool cpu_bf16 = false;            // bf16 on the CPU: the layout line names the matmul kernels chosen
};

// Everything one run holds. The constructor sets it up; run() is the loop of steps and their hooks.
class Trainer {
 public:
  Trainer(const TrainArgs& a, ControlComm& world, const LaunchInfo& launch);
  void run();

 private:
  // setup, from the flags
  void build_model(const TrainArgs& a);
  void load_data(const TrainArgs& a);
  void pack_train_data(const TrainArgs& a, const DataArgs& da);
  void load_parameters(const TrainArgs& a);
  void describe(const TrainArgs& a);
  void resume(const TrainArgs& a);
  // the loop: a step, then its hooks
  StepResult step(int64_t step);
  void maybe_evaluate(int64_t step);
  bool maybe_save(int64_t step);
  bool stop_requested(int64_t step, bool saved);
  void finish();
  // what the hooks call
  double evaluate();
  void save_checkpoint(int64_t step) {
    ckpt_->save(step, metrics_->history(), total_flos_);
    last_saved_step_ = step;
  }
  std::string keep_trained_state(const std::string& why);
  nlohmann::json eval_record(double eval_loss, double eval_s, int64_t step) const;
  void write_results(const nlohmann::json& train, const nlohmann::json& eval);
  bool epoch_end(int64_t step) const { return (step + 1) % steps_per_epoch_ == 0; }

  ControlComm& world_;
  const LaunchInfo& launch_;
  LoopSettings ls_;
  const int W_ = world_.size();
  ModelConfig cfg_;
  Session session_;  // the backend, the data communicator, the model and its store (train/session.h)
  std::unique_ptr<LoraRun> lora_;  // --use_peft: the adapter trained on the frozen model (train/lora_run.h)
  std::unique_ptr<StepScalars> scalars_;  // the step's loss and norm sums, kept for the run
  std::unique_ptr<Tokenizer> tok_;
  std::string tokenizer_dir_;  // its files copied beside saved models
  std::string model_dir_;      // --model_name_or_path when a directory: its generation_config.json goes with them
  std::string save_dtype_ = "F32";  // what saved models are written in (--torch_dtype)
  TokenDataset train_, eval_;
  DataIdentity data_id_;  // the training data's identity, recorded in checkpoints and compared on resume
  int B_ = 0, T_ = 0, pad_id_ = 0;
  std::unique_ptr<Sampler> sampler_;
  int64_t steps_per_epoch_ = 1, total_steps_ = 0, first_step_ = 0;
  int64_t last_saved_step_ = -1;  // the newest checkpoint this run saved
  int64_t global_batch_ = 1;  // sequences per step over every rank: with the seed, it fixes the data order
  Schedule sched_;
  AdamWConfig adamw_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::unique_ptr<MetricsLogger> metrics_;
  // this rank's batch buffers, one per micro-batch
  std::vector<std::vector<int32_t>> tokens_, targets_, doc_start_;  // per micro-batch (doc_start_: packing)
  bool packing_ = false;
  PackedRows packed_;  // --packing: the rows the sampler draws instead of examples
  // the whole run's throughput and what its first step sent
  double run_start_ = 0.0, comm_before_ = 0.0, comm_first_step_ = 0.0, planned_comm_bytes_ = 0.0;
  double run_eval_s_ = 0.0;  // evaluation since run_start_, left out of the throughput
  int64_t run_tokens_ = 0;
  // what the Trainer reports at the end (train_results.json): this run's loop time from its first
  // step, the sum of its steps' losses, and the floating-point operations since step 1 (rank 0's x ranks)
  double loop_start_ = 0.0, train_loss_sum_ = 0.0, total_flos_ = 0.0;
  double lr_ = 0.0;
  int lock_fd_ = -1;  // rank 0: the open lock on output_dir (claim_output_dir), held for the run's life
  // Fault injection for the tests: LLMT_FAIL_AT_STEP=rank:step makes that rank fail at that step.
  int fail_rank_ = -1;
  long long fail_step_ = -1;
  // LLMT_TEST_SLOW_RANK=rank:ms makes that rank sleep that long in each step (a slow node).
  int slow_rank_ = -1, slow_ms_ = 0;
};

Trainer::Trainer(const TrainArgs& a, ControlComm& world, const LaunchInfo& launch) : world_(world), launch_(launch) {
  ls_.accum = a.gradient_accumulation_steps;
  ls_.learning_rate = a.learning_rate;
  ls_.max_grad_norm = a.max_grad_norm;
  ls_.seed = a.seed;
  ls_.throughput_warmup_steps = a.throughput_warmup_steps;
  ls_.evaluation_strategy = a.evaluation_strategy;
  ls_.eval_every = a.eval_steps > 0 ? a.eval_steps : a.logging_steps;  // Hugging Face's fallback
  ls_.save_strategy = a.save_strategy;
  ls_.save_steps = a.save_steps;
  ls_.do_eval = a.do_eval;
  ls_.eval_batch = a.per_device_eval_batch_size;
  ls_.output_dir = a.output_dir;
  ls_.nccl_log_dir = a.output_dir + "/nccl_logs";
  ls_.cpu_bf16 = a.device == "cpu" && a.bf16;
  if (a.tf32 && a.device == "cpu")
    log_info("note   --tf32 selects TF32 for fp32 matmuls on a GPU; the CPU has no TF32 and ignores it");
  install_stop_handlers();  // again, for callers other than `llmt train` (which installs them first thing)
  const int64_t ds_batch = a.deepspeed_train_batch_size, per_rank = (int64_t)a.per_device_train_batch_size *
                                                                     a.gradient_accumulation_steps;
  LLMT_CHECK(ds_batch == 0 || ds_batch == per_rank * world_.size(), "--deepspeed %s: train_batch_size %lld, but %d "
             "ranks x %d sequences x %d accumulation steps make %lld; write \"auto\"%s", a.deepspeed.c_str(),
             (long long)ds_batch, world_.size(), a.per_device_train_batch_size, a.gradient_accumulation_steps,
             (long long)per_rank * world_.size(),
             ds_batch % per_rank == 0 ? strformat(", or launch %lld ranks", (long long)(ds_batch / per_rank)).c_str() : "");
  lock_fd_ = claim_output_dir(world_, a.output_dir, !a.resume_from_checkpoint.empty(), a.overwrite_output_dir);
  log_info("%s", describe_layout(launch, a.device).c_str());
  build_model(a);
  load_data(a);
  load_parameters(a);
  describe(a);
  resume(a);
  if (const char* f = std::getenv("LLMT_FAIL_AT_STEP")) std::sscanf(f, "%d:%lld", &fail_rank_, &fail_step_);
  if (const char* f = std::getenv("LLMT_TEST_SLOW_RANK")) std::sscanf(f, "%d:%d", &slow_rank_, &slow_ms_);
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

// The model's configuration (agreed by every rank) and its tokenizer.
void Trainer::build_model(const TrainArgs& a) {
  cfg_ = resolve_model_config(!a.model_name_or_path.empty() ? a.model_name_or_path : a.model_config);
  {  // the same flags may still name different files on different nodes
    ConfigFields model;
    const nlohmann::json hf = config_to_hf_json(cfg_);
    for (auto it = hf.begin(); it != hf.end(); ++it) model.emplace_back("config.json " + it.key(), it.value().dump());
    check_ranks_agree(world_, "model configuration", model);
  }
  if (!a.fsdp_transformer_layer_cls_to_wrap.empty()) {
    const std::string want = cfg_.decoder_layer_class();  // transformers' own class: it finds no other
    LLMT_CHECK(a.fsdp_transformer_layer_cls_to_wrap == want, "--fsdp_transformer_layer_cls_to_wrap %s: a %s model's "
               "layers are %s", a.fsdp_transformer_layer_cls_to_wrap.c_str(),
               cfg_.model_type.empty() ? cfg_.arch_name() : cfg_.model_type.c_str(), want.c_str());
  }
  tok_ = model_tokenizer(tokenizer_source(a), a.llama3_special_tokens, cfg_);
  tokenizer_dir_ = tokenizer_dir(tokenizer_source(a));
  struct stat st;
  if (!a.model_name_or_path.empty() && stat(a.model_name_or_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    model_dir_ = a.model_name_or_path;
}

void Trainer::load_data(const TrainArgs& a) {
  DataArgs da = a.data;
  if (da.block_size <= 0) da.block_size = std::min(1024, cfg_.max_seq_len);
  LLMT_CHECK(da.block_size <= cfg_.max_seq_len, "--block_size %d exceeds the model's context of %d", da.block_size,
             cfg_.max_seq_len);
  const std::string tok_src = tokenizer_source(a);
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
  if (a.do_eval || a.evaluation_strategy != "no") {
    eval_ = load_eval_dataset(da, *tok_, world_.rank(), W_);
    LLMT_CHECK(!eval_.empty(), "--do_eval / --evaluation_strategy: there is no evaluation data (--validation_file, or "
                               "a dataset with a validation split)");
  }
  check_ranks_agree(world_, "data",
                    {{"tokenizer", strformat("%s, %d ids", tok_->kind().c_str(), tok_->vocab_size())},
                     {"train data", dataset_identity(train_)},
                     {"evaluation data", dataset_identity(eval_)}});
  pad_id_ = default_pad_id(*tok_);
  B_ = a.per_device_train_batch_size;
  T_ = (int)std::min<int64_t>(train_.max_length(), cfg_.max_seq_len);
  if (!eval_.empty()) T_ = (int)std::min<int64_t>(std::max<int64_t>(T_, eval_.max_length()), cfg_.max_seq_len);

  const int accum = a.gradient_accumulation_steps;
  packing_ = a.packing;
  if (packing_) pack_train_data(a, da);
  sampler_ = std::make_unique<Sampler>(packing_ ? (int64_t)packed_.rows.size() : train_.size(), W_, world_.rank(), B_,
                                       accum, a.seed);
  steps_per_epoch_ = sampler_->steps_per_epoch();
  global_batch_ = (int64_t)W_ * B_ * accum;
  total_steps_ = total_train_steps(a, steps_per_epoch_, global_batch_);
  sched_ = make_schedule(a.lr_scheduler_type, total_steps_, a.warmup_steps, a.warmup_ratio, a.lr_scheduler_kwargs,
                         a.learning_rate);
  adamw_.beta1 = (float)a.adam_beta1;
  adamw_.beta2 = (float)a.adam_beta2;
  adamw_.eps = (float)a.adam_epsilon;
  adamw_.weight_decay = (float)a.weight_decay;
  tokens_.resize((size_t)accum);
  targets_.resize((size_t)accum);
  doc_start_.resize((size_t)accum);
}

// --packing: the training examples packed into rows (data/packing.h) that the sampler draws in their
// place, rows of --model_max_length tokens for Alpaca data, of the block size for text, at most the
// model's context. A checkpoint records it with the data, so a resume cannot switch it silently.
void Trainer::pack_train_data(const TrainArgs& a, const DataArgs& da) {
  const int row_len = (int)std::min<int64_t>(da.data_path.empty() ? da.block_size : da.model_max_length, cfg_.max_seq_len);
  packed_ = pack_examples(train_, row_len);
  T_ = std::max<int>(T_, (int)packed_.longest);
  data_id_.key += " packed";
  data_id_.source += " (--packing)";
  const int64_t rows = (int64_t)packed_.rows.size();
  LLMT_CHECK(rows >= (int64_t)W_ * B_ * a.gradient_accumulation_steps, "--packing: the %lld examples fill %lld rows of "
             "%d tokens, fewer than one global batch of %lld rows (%d ranks x %d x %d accumulation); lower "
             "--per_device_train_batch_size or --gradient_accumulation_steps", (long long)train_.size(),
             (long long)rows, row_len, (long long)W_ * B_ * a.gradient_accumulation_steps, W_, B_,
             a.gradient_accumulation_steps);
  const double before = padding_fraction_unpacked(train_, epoch_permutation(train_.size(), a.seed, 0), B_);
  const double after = padding_fraction_packed(packed_, epoch_permutation(rows, a.seed, 0), B_);
  log_info("data   --packing: %lld examples (%lld tokens) in %lld rows of up to %d tokens; padding is %.1f%% of the "
           "tokens a batch of %d computes on, %.1f%% unpacked (each batch padded to its longest example)",
           (long long)train_.size(), (long long)packed_.tokens, (long long)rows, row_len, 100.0 * after, B_,
           100.0 * before);
}

// The run's session (backend, communicators, model, store; train/session.h), then every unit's
// parameters: read from the Hugging Face checkpoint or initialised, one unit at a time (no rank
// holds the whole model).
void Trainer::load_parameters(const TrainArgs& a) {
  SessionSettings ss = session_settings(a, a);
  ss.nccl_log_dir = ls_.nccl_log_dir;
  ss.batch = B_;
  ss.seq_len = T_;
  ss.check_memory = true;
  ss.accum = a.gradient_accumulation_steps;
  ss.packing = a.packing;
  if (a.use_peft) ss.lora = lora_run_config(a, cfg_);  // the memory check counts the adapter
  session_ = make_session(world_, launch_, ss, cfg_);
  scalars_ = std::make_unique<StepScalars>(*session_.backend);
  std::unique_ptr<SafetensorsCheckpoint> ckpt;
  if (!a.model_name_or_path.empty()) ckpt = std::make_unique<SafetensorsCheckpoint>(a.model_name_or_path);
  save_dtype_ = saved_model_dtype(a, ckpt.get());
  if (ckpt) {
    load_hf_parameters(session_, cfg_, *ckpt, a.model_name_or_path);
    if (a.use_peft) lora_ = start_lora(a, session_, cfg_);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t made = init_parameters(session_, cfg_, a.seed);
  log_info("init   this rank's shard of the random init (%.2fM values, seed %llu) in %.2f s", made / 1e6,
           (unsigned long long)a.seed, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// What this run holds and will send, as llmt plan predicts it (measured figures follow at the end).
void Trainer::describe(const TrainArgs& a) {
  const ModelLayout& L = session_.model->layout();
  const ShardGroups& g = session_.store->groups();
  const Plan plan = plan_run(cfg_, session_.plan);
  log_info("model  %s, %.2fM parameters (%s)", cfg_.describe().c_str(), L.total_numel / 1e6,
           a.model_name_or_path.empty() ? "random init" : a.model_name_or_path.c_str());
  log_info("fsdp   %s: shards over %d rank%s x %d replica%s; per rank %.1f MiB of state (%s%s), "
           "activations %.1f MiB%s; compute %s, gradients reduced in %s, models saved in %s",
           strategy_name(session_.store->strategy()), g.shard_size, g.shard_size == 1 ? "" : "s", g.replica_size,
           g.replica_size == 1 ? "" : "s", session_.store->persistent_bytes() / kMiB,
           lora_ ? "frozen: parameters only" : "master, grad, m, v", a.bf16 ? ", bf16 copy" : "",
           Transformer::activation_bytes(cfg_, B_, T_, a.gradient_checkpointing, session_.backend->compute_dtype(),
                                         session_.backend->vocab_pad(), a.logits_chunk_tokens) / kMiB,
           a.gradient_checkpointing ? " (gradient checkpointing)" : "", dtype_name(session_.backend->compute_dtype()),
           dtype_name(session_.store->reduce_dtype()), save_dtype_.c_str());
  if (lora_)
    log_info("lora   %s frozen (%.1f MiB of parameters per rank); adapter r %d, alpha %g, dropout %g, scaling %g on "
             "%zu projections a block%s: %.3fM parameters (%.1f MiB of state per rank)",
             a.model_name_or_path.c_str(), session_.store->persistent_bytes() / kMiB, lora_->config.r,
             lora_->config.alpha, lora_->config.dropout, lora_->config.scaling(), lora_->layout.slots.size(),
             lora_->layout.saved.empty() ? "" : " and modules_to_save", lora_->layout.total_numel / 1e6,
             lora_->store->persistent_bytes() / kMiB);
  if (!a.deepspeed_summary.empty()) log_info("config %s", a.deepspeed_summary.c_str());
  log_info("plan   per rank: gathered buffers at most %.1f MiB; %.1f MiB sent per step at the longest batches "
           "(llmt plan)",
           plan.gathered_peak_gib * 1024.0, plan.comm_total_bytes / kMiB);
  planned_comm_bytes_ = plan.comm_total_bytes;
  log_info("train  %lld steps (%lld per epoch), global batch %d x %d x %d = %lld sequences, lr %g (%s, %lld warmup), "
           "%d threads per rank; each line logs the lr its step used (HF 4.40 logged the next step's) and the loss "
           "averaged over the tokens of the global batch (as transformers since 4.46)",
           (long long)total_steps_, (long long)steps_per_epoch_, W_, B_, a.gradient_accumulation_steps,
           (long long)global_batch_, a.learning_rate, sched_.type.c_str(), (long long)sched_.warmup_steps, session_.threads);
}

void Trainer::resume(const TrainArgs& a) {
  CheckpointSettings cs;
  cs.output_dir = a.output_dir;
  cs.save_total_limit = a.save_total_limit;
  cs.save_only_model = a.save_only_model;
  cs.save_dtype = save_dtype_;
  cs.tokenizer_dir = tokenizer_dir_;
  cs.model_dir = model_dir_;
  cs.seed = a.seed;
  cs.steps_per_epoch = steps_per_epoch_;
  cs.global_batch = global_batch_;
  cs.data = data_id_;
  cs.max_steps = total_steps_;
  cs.save_steps = a.save_steps;
  cs.eval_steps = ls_.eval_every;
  cs.logging_steps = a.logging_steps;
  cs.train_batch_size = B_;
  ckpt_ = std::make_unique<Checkpointer>(world_, cs, cfg_, session_.model->layout(), *session_.store, lora_.get());
  Checkpointer::Resumed resumed = ckpt_->resume(a.resume_from_checkpoint, a.ignore_data_skip, total_steps_);
  first_step_ = resumed.step;
  total_flos_ = resumed.total_flos;

  MetricsSettings ms;
  ms.output_dir = a.output_dir;
  ms.tensorboard = a.report_tensorboard;
  ms.logging_dir = a.logging_dir;
  ms.logging_strategy = a.logging_strategy;
  ms.logging_steps = a.logging_steps;
  ms.logging_first_step = a.logging_first_step;
  // A live progress line on a terminal; not under mpirun or srun, whose ranks' output may look like a
  // terminal but ends up in logs.
  ms.live = world_.rank() == 0 && isatty(fileno(stdout)) && launch_.launcher == "single process";
  ms.world = W_;
  ms.host = launch_.hostname;
  ms.straggler_threshold = a.straggler_threshold;
  ms.first_step = first_step_;
  ms.total_steps = total_steps_;
  ms.steps_per_epoch = steps_per_epoch_;
  metrics_ = std::make_unique<MetricsLogger>(world_, ms);
  // metrics.jsonl: this run's records, after the resumed checkpoint's history
  metrics_->open(std::move(resumed.log_history));
}

void Trainer::run() {
  // A signal during setup (tokenizing a large corpus, loading a checkpoint): stop now, all ranks
  // together; the job can be requeued and start again.
  if (world_.all_reduce_sum(stop_signal() != 0 ? 1.0 : 0.0) > 0) {
    log_info("stopped before the first step by a signal; nothing to save");
    return;
  }
  metrics_->start();
  run_start_ = loop_start_ = now_s();
  comm_before_ = session_.store->comm_bytes() + session_.data->stats().total() +
                 (lora_ ? lora_->store->comm_bytes() : 0.0);
  for (int64_t s = first_step_; s < total_steps_; s++) {
    if (s - first_step_ == ls_.throughput_warmup_steps) run_start_ = now_s(), run_tokens_ = 0, run_eval_s_ = 0.0;
    watchdog_set_step(s + 1);  // steps are counted from 1 in the log
    StepResult r = step(s);
    if (s == first_step_) {
      comm_first_step_ = session_.store->comm_bytes() + session_.data->stats().total() +
                         (lora_ ? lora_->store->comm_bytes() : 0.0) - comm_before_;
      metrics_->set_first_step_comm(comm_first_step_, planned_comm_bytes_);
    }
    if (s == first_step_ && session_.nccl_logs) report_nccl_transports(world_, ls_.nccl_log_dir);
    metrics_->after_step(s, r, lr_);
    if (s == first_step_ && ls_.cpu_bf16)  // the layout's kernels, now that they have run
      log_info("layout bf16 matmul kernels by shape class (LLMT_CPU_BF16_MATMUL=auto|bf16|fp32): %s",
               describe_cpu_bf16_matmul_choices().c_str());
    maybe_evaluate(s);
    bool saved = maybe_save(s);
    if (stop_requested(s, saved)) {
      log_info("stopped at step %lld of %lld by a signal; checkpoint-%lld holds the %s", (long long)s + 1,
               (long long)total_steps_, (long long)s + 1, lora_ ? "adapter" : "model");
      metrics_->close();
      release_output_dir(lock_fd_, ls_.output_dir);
      return;
    }
  }
  finish();
  metrics_->close();
  release_output_dir(lock_fd_, ls_.output_dir);  // a clean end leaves no .llmt.lock behind
}

// This rank's micro-batches of step `s`, then one optimizer step over every rank.
StepResult Trainer::step(int64_t s) {
  LLMT_CHECK(!(world_.rank() == fail_rank_ && s + 1 == fail_step_), "injected failure (LLMT_FAIL_AT_STEP) at step %lld",
             (long long)s + 1);
  const double start = now_s(), waited_before = comm_wait_s();  // this step's compute and waits (straggler.h)
  if (world_.rank() == slow_rank_) std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms_));
  std::vector<MicroBatch> micro;
  int64_t step_tokens = 0;
  double flops = 0.0;
  for (int m = 0; m < ls_.accum; m++) {
    const std::vector<int64_t> idx = sampler_->indices(s, m);
    const int len = packing_ ? collate_packed(train_, packed_, idx, pad_id_, tokens_[m], targets_[m], doc_start_[m])
                             : collate(train_, idx, pad_id_, tokens_[m], targets_[m]);
    LLMT_CHECK(len <= T_, "internal: batch length %d over %d", len, T_);
    micro.push_back({tokens_[m].data(), targets_[m].data(), len, ((int64_t)m * W_ + world_.rank()) * B_,
                     packing_ ? doc_start_[m].data() : nullptr});
    int64_t real = 0;  // the examples' tokens, the rest is padding
    for (int64_t i : idx) real += packing_ ? packed_.row_tokens[(size_t)i] : train_.length(i);
    metrics_->add_padding((int64_t)B_ * len, real);
    step_tokens += (int64_t)B_ * len;
    const ModelLayout& L = session_.model->layout();
    flops += (double)B_ * len *
             (lora_ ? lora_flops_per_token(cfg_, L, lora_->config, lora_->layout, len)  // the base's dW skipped
                    : Transformer::flops_per_token(cfg_, L, len));
  }
  lr_ = ls_.learning_rate * sched_.multiplier(s);
  StepSettings ss;
  ss.lr = (float)lr_;
  ss.adamw = adamw_;
  ss.max_grad_norm = ls_.max_grad_norm;
  ss.seed = ls_.seed;
  ss.step = s;
  StepResult r = train_step(*session_.model, *session_.store, world_, *session_.data, *scalars_, micro, ss,
                            lora_ ? lora_->store.get() : nullptr);
  metrics_->add_step(r.loss, step_tokens * W_, flops, now_s() - start, comm_wait_s() - waited_before);
  train_loss_sum_ += r.loss;
  total_flos_ += flops * W_;
  run_tokens_ += step_tokens * W_;
  return r;
}

void Trainer::maybe_evaluate(int64_t s) {
  bool now = (ls_.evaluation_strategy == "steps" && (s + 1) % ls_.eval_every == 0) ||
             (ls_.evaluation_strategy == "epoch" && epoch_end(s));
  if (!now) return;
  // timed on its own (the Trainer's eval_runtime), out of the training throughput: the step after an
  // evaluation logged 17 tok/s against 8,550
  const double t0 = now_s();
  double el = evaluate();
  const double eval_s = now_s() - t0;
  metrics_->leave_out(eval_s);
  run_eval_s_ += eval_s;
  log_info("eval   step %lld | eval_loss %.4f | perplexity %.3f | %.2f s", (long long)s + 1, el, std::exp(el), eval_s);
  metrics_->record(eval_record(el, eval_s, s + 1));
}

bool Trainer::maybe_save(int64_t s) {
  bool now = (ls_.save_strategy == "steps" && (s + 1) % ls_.save_steps == 0) ||
             (ls_.save_strategy == "epoch" && epoch_end(s));
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
  const double run_s = now_s() - run_start_ - run_eval_s_;
  if (total_steps_ - first_step_ > ls_.throughput_warmup_steps)
    log_info("done   %.0f tok/s over steps %d..%lld (%.0f per rank); measured per rank: %.1f MiB sent in step 1, "
             "gathered buffers peaked at %.1f MiB, peak rss %.2f GiB",
             run_tokens_ / run_s, ls_.throughput_warmup_steps + 1, (long long)total_steps_, run_tokens_ / run_s / W_,
             comm_first_step_ / kMiB, session_.store->peak_gathered_bytes() / kMiB, peak_rss_gib());
  // the Trainer's last log_history record, and run_clm's train_results.json
  const int64_t steps_run = total_steps_ - first_step_;
  const double loop_s = now_s() - loop_start_, epoch = (double)total_steps_ / steps_per_epoch_;
  nlohmann::json train = {{"epoch", epoch},
                          {"total_flos", total_flos_},
                          {"train_loss", steps_run > 0 ? train_loss_sum_ / steps_run : NAN},
                          {"train_runtime", loop_s},
                          {"train_samples_per_second", (double)steps_run * global_batch_ / loop_s},
                          {"train_steps_per_second", steps_run / loop_s}};
  nlohmann::json summary = train;
  summary["step"] = total_steps_;
  metrics_->record(summary);
  train["train_samples"] = packing_ ? (int64_t)packed_.rows.size() : train_.size();
  nlohmann::json eval;
  if (ls_.do_eval) {
    const double t0 = now_s();
    double el = evaluate();
    const double eval_s = now_s() - t0;
    log_info("eval   eval_loss %.4f | perplexity %.3f | %.2f s", el, std::exp(el), eval_s);
    eval = eval_record(el, eval_s, total_steps_);
    metrics_->record(eval);
    eval.erase("step");
    eval["eval_samples"] = eval_.size();
  }
  // a signal arriving now changes nothing: this is the end of the run
  if (lora_) {  // output_dir is a PEFT adapter directory
    save_lora(world_, *lora_, ls_.output_dir, tokenizer_dir_);
    write_results(train, eval);
    log_info("saved  %s (adapter_config.json, adapter_model.safetensors in F32)", ls_.output_dir.c_str());
    return;
  }
  try {
    write_hf_model(world_, *session_.store, cfg_, session_.model->layout(), ls_.output_dir, save_dtype_,
                   tokenizer_dir_, model_dir_);
  } catch (const Error& e) {  // every rank, together (write_hf_model agrees on its errors)
    throw Error(keep_trained_state(e.what()));
  }
  write_results(train, eval);
  log_info("saved  %s (config.json, model.safetensors in %s)", ls_.output_dir.c_str(), save_dtype_.c_str());
}

// An evaluation's log_history record, as the Trainer logs it (with perplexity, as run_clm adds it).
nlohmann::json Trainer::eval_record(double eval_loss, double eval_s, int64_t step) const {
  const int B = ls_.eval_batch > 0 ? ls_.eval_batch : B_;
  const int64_t batches = (eval_.size() + (int64_t)W_ * B - 1) / ((int64_t)W_ * B);  // per rank, as evaluate()
  return {{"epoch", (double)step / steps_per_epoch_}, {"eval_loss", eval_loss}, {"eval_runtime", eval_s},
          {"eval_samples_per_second", eval_.size() / eval_s}, {"eval_steps_per_second", batches / eval_s},
          {"perplexity", std::exp(eval_loss)}, {"step", step}};
}

// What run_clm leaves beside the model: train_results.json, eval_results.json (with --do_eval) and
// all_results.json (both, merged into an earlier run's as Trainer.save_metrics does), and
// trainer_state.json (Trainer.save_state). Rank 0 writes; every rank learns of an error.
void Trainer::write_results(const nlohmann::json& train, const nlohmann::json& eval) {
  std::string error;
  if (world_.rank() == 0) try {
      const std::string dir = ls_.output_dir;
      auto write = [&](const std::string& name, const nlohmann::json& j) {
        write_file_atomic(dir + "/" + name, j.dump(4) + "\n");
      };
      nlohmann::json all = nlohmann::json::object();
      std::ifstream old(dir + "/all_results.json", std::ios::binary);
      if (old.good()) {
        const std::string text((std::istreambuf_iterator<char>(old)), std::istreambuf_iterator<char>());
        try {  // an unreadable one is replaced, as a new run's would be
          check_json_depth(text, dir + "/all_results.json");
          all = nlohmann::json::parse(text, nullptr, false);
        } catch (const Error&) {
        }
        if (!all.is_object()) all = nlohmann::json::object();
      }
      write("train_results.json", train);
      all.update(train);
      if (!eval.is_null()) {
        write("eval_results.json", eval);
        all.update(eval);
      }
      write("all_results.json", all);
      write("trainer_state.json", ckpt_->trainer_state(total_steps_, metrics_->history(), total_flos_));
    } catch (const Error& e) {
      error = e.what();
    }
  agree_or_throw(world_, error.empty(), error);
}

// The final model could not be written (a weight beyond float16's range, a full disk) after all the
// training: the trained state is saved as a checkpoint, its model in fp32, unless this step already
// has one, and the message says how to export it again. Collective. Returns the whole message.
std::string Trainer::keep_trained_state(const std::string& why) {
  // --save_only_model: the checkpoint's model.safetensors is all there is; else its state.h5 exports again
  auto kept = [&](const std::string& ck, const std::string& dtype) {
    return strformat("%s; the trained model is kept in %s (model.safetensors in %s)%s", why.c_str(), ck.c_str(),
                     dtype.c_str(),
                     ckpt_->settings().save_only_model ? "" : strformat("; export it again with `llmt export %s OUT_DIR "
                     "--dtype F32|BF16|F16` (its exact fp32 state)", ck.c_str()).c_str());
  };
  if (last_saved_step_ == total_steps_)
    return kept(strformat("%s/checkpoint-%lld", ls_.output_dir.c_str(), (long long)total_steps_), save_dtype_);
  try {
    return kept(ckpt_->save(total_steps_, metrics_->history(), total_flos_, "F32"), "F32");
  } catch (const Error& e) {
    return strformat("%s; saving the trained state as a checkpoint failed too: %s%s", why.c_str(), e.what(),
                     last_saved_step_ > 0 ? strformat("; the newest checkpoint is %s/checkpoint-%lld",
                                                      ls_.output_dir.c_str(), (long long)last_saved_step_).c_str()
                                          : "");
  }
}

// Mean loss over every token counted on every rank, without dropout.
double Trainer::evaluate() {
  // per_device_eval_batch_size examples per rank per round, run through the training-sized activations
  // B_ rows at a time: an eval batch larger than the training one takes several forwards (the loss is
  // a sum over tokens, so the pieces add up to the same mean)
  const int B = ls_.eval_batch > 0 ? ls_.eval_batch : B_;
  const int pieces = (B + B_ - 1) / B_;
  const int rank = world_.rank();
  const int64_t n = eval_.size(), per_round = (int64_t)W_ * B;
  const int64_t rounds = (n + per_round - 1) / per_round;  // the same on every rank: forward is collective
  std::vector<int32_t> tokens, targets;
  double counted = 0.0;
  BackendBuffer loss_sum(*session_.backend, DType::f64, {1});
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
    session_.model->forward(*session_.store, tok_full.data(), tgt_full.data(), T, loss_sum.tensor());
  }
  session_.data->all_reduce_async(loss_sum.tensor().data, 1, DType::f64, ReduceOp::sum)->wait();
  double total = 0.0;
  session_.backend->copy_to_host(&total, loss_sum.tensor().data, sizeof(total));
  counted = world_.all_reduce_sum(counted);
  return counted > 0 ? total / counted : NAN;
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
    sigaddset(&set, SIGINT);  // Ctrl-C ended the run without the checkpoint the other two give
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    // Ctrl-C under `llmt train ... | tee run.log` ends tee too: the next log line would then raise
    // SIGPIPE and kill the rank before the checkpoint the signal asked for. A write to a closed pipe
    // now just fails (the log's lines are lost; the run and its checkpoint are not).
    signal(SIGPIPE, SIG_IGN);
    std::thread([set] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        if (sig == SIGINT && stop_signal() == SIGINT) {  // Ctrl-C again: the user does not want to wait
          const char msg[] = "llmt: a second SIGINT: exiting now, without a checkpoint\n";
          const ssize_t wr = ::write(2, msg, sizeof(msg) - 1);
          (void)wr;  // nothing to do if stderr is gone
          _exit(128 + SIGINT);
        }
        set_stop_signal(sig);
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
  std::string problem;  // before anything is written: the progress records already go into output_dir
  if (world.rank() == 0) try {
      check_train_paths(a);
    } catch (const Error& e) {
      problem = e.what();
    }
  agree_or_throw(world, problem.empty(), problem);
  start_progress_records(world, launch, a.output_dir);
  Trainer t(a, world, launch);
  t.run();
}

}  // namespace llmt
