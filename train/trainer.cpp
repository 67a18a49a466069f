#include "train/trainer.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <functional>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "data/byte_tokenizer.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "engine/backend/backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/fsdp/fsdp.h"
#include "engine/optim/adamw.h"
#include "engine/optim/schedule.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"
#include "train/plan.h"
#include "train/step.h"

namespace llmt {

// Flags that only mean something to other launchers: accepted so their commands run unchanged,
// each with a warning that says it is ignored.
static const char* kIgnoredFlags[] = {"use_habana", "use_lazy_mode", "use_hpu_graphs", "use_hpu_graphs_for_inference",
                                      "use_hpu_graphs_for_training", "gaudi_config_name", "deepspeed", "report_to"};

TrainArgs parse_train_args(Flags& f) {
  TrainArgs a;
  a.device = f.get_string("device", a.device);
  a.threads = f.get_int("threads", a.threads);
  a.model_name_or_path = f.get_string("model_name_or_path", "");
  a.model_config = f.get_string("model_config", "");
  a.tokenizer_name_or_path = f.get_string("tokenizer_name_or_path", "");
  a.data.data_path = f.get_string("data_path", "");
  a.data.dataset_name = f.get_string("dataset_name", "");
  a.data.dataset_config_name = f.get_string("dataset_config_name", "");
  a.data.dataset_dir = f.get_string("dataset_dir", "");
  a.data.train_file = f.get_string("train_file", "");
  a.data.validation_file = f.get_string("validation_file", "");
  a.data.block_size = f.get_int("block_size", 0);
  a.data.model_max_length = f.get_int("model_max_length", a.data.model_max_length);
  a.data.instruction_field = f.get_string("alpaca_instruction_field", a.data.instruction_field);
  a.data.input_field = f.get_string("alpaca_input_field", a.data.input_field);
  a.data.output_field = f.get_string("alpaca_output_field", a.data.output_field);
  a.data.cache_dir = f.get_string("cache_dir", "");
  a.output_dir = f.get_string("output_dir", "");
  a.max_steps = f.get_int64("max_steps", a.max_steps);
  a.num_train_epochs = f.get_double("num_train_epochs", a.num_train_epochs);
  a.per_device_train_batch_size = f.get_int("per_device_train_batch_size", a.per_device_train_batch_size);
  a.per_device_eval_batch_size = f.get_int("per_device_eval_batch_size", a.per_device_eval_batch_size);
  a.gradient_accumulation_steps = f.get_int("gradient_accumulation_steps", a.gradient_accumulation_steps);
  a.learning_rate = f.get_double("learning_rate", a.learning_rate);
  a.weight_decay = f.get_double("weight_decay", a.weight_decay);
  a.adam_beta1 = f.get_double("adam_beta1", a.adam_beta1);
  a.adam_beta2 = f.get_double("adam_beta2", a.adam_beta2);
  a.adam_epsilon = f.get_double("adam_epsilon", a.adam_epsilon);
  a.max_grad_norm = f.get_double("max_grad_norm", a.max_grad_norm);
  a.lr_scheduler_type = f.get_string("lr_scheduler_type", a.lr_scheduler_type);
  a.warmup_ratio = f.get_double("warmup_ratio", a.warmup_ratio);
  a.warmup_steps = f.get_int64("warmup_steps", a.warmup_steps);
  a.logging_steps = f.get_int("logging_steps", a.logging_steps);
  a.throughput_warmup_steps = f.get_int("throughput_warmup_steps", a.throughput_warmup_steps);
  a.fsdp = f.get_string("fsdp", a.fsdp);
  a.fsdp_transformer_layer_cls_to_wrap = f.get_string("fsdp_transformer_layer_cls_to_wrap", "");
  a.hybrid_shard_group_size = f.get_int("hybrid_shard_group_size", 0);
  a.gradient_checkpointing = f.get_bool("gradient_checkpointing", false);
  a.do_eval = f.get_bool("do_eval", false);
  a.evaluation_strategy = f.get_string("evaluation_strategy", f.get_string("eval_strategy", a.evaluation_strategy));
  a.eval_steps = f.get_int64("eval_steps", 0);
  a.save_strategy = f.get_string("save_strategy", a.save_strategy);
  a.save_steps = f.get_int64("save_steps", a.save_steps);
  a.save_total_limit = f.get_int("save_total_limit", 0);
  a.resume_from_checkpoint = f.get_string("resume_from_checkpoint", "");
  if (a.resume_from_checkpoint == "False" || a.resume_from_checkpoint == "false") a.resume_from_checkpoint.clear();
  a.overwrite_output_dir = f.get_bool("overwrite_output_dir", false);
  a.seed = (uint64_t)f.get_int64("seed", (long long)a.seed);
  a.bf16 = f.get_bool("bf16", a.bf16);
  a.tf32 = f.get_bool("tf32", a.tf32);
  a.mixed_precision_reduce = f.get_string("mixed_precision_reduce", a.mixed_precision_reduce);
  LLMT_CHECK(f.get_bool("do_train", true), "--do_train False: llmt train always trains");
  for (const char* name : kIgnoredFlags)
    if (f.has(name)) {
      f.ignore(name);
      if (launcher_rank_from_env() <= 0) log_warn("--%s only matters to other launchers; llmt ignores it", name);
    }

  LLMT_CHECK(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got \"%s\"", a.device.c_str());
  LLMT_CHECK(a.model_name_or_path.empty() != a.model_config.empty(),
             "give exactly one of --model_name_or_path (a Hugging Face directory) or --model_config (a preset or "
             "config.json, randomly initialised)");
  int sources = !a.data.data_path.empty() + !a.data.dataset_name.empty() + !a.data.train_file.empty();
  LLMT_CHECK(sources == 1, "give exactly one training data source: --data_path (Alpaca JSON), --dataset_name "
                           "(wikitext, with --dataset_dir), or --train_file (plain text)");
  LLMT_CHECK(!a.output_dir.empty(), "--output_dir is required");
  LLMT_CHECK(a.per_device_train_batch_size > 0, "--per_device_train_batch_size must be positive, got %d",
             a.per_device_train_batch_size);
  LLMT_CHECK(a.per_device_eval_batch_size >= 0, "--per_device_eval_batch_size must not be negative");
  LLMT_CHECK(a.gradient_accumulation_steps > 0, "--gradient_accumulation_steps must be positive, got %d",
             a.gradient_accumulation_steps);
  LLMT_CHECK(a.learning_rate >= 0.0, "--learning_rate must not be negative, got %g", a.learning_rate);
  LLMT_CHECK(a.max_steps != 0 && (a.max_steps > 0 || a.num_train_epochs > 0.0),
             "nothing to train: --max_steps or --num_train_epochs must be positive");
  LLMT_CHECK(a.logging_steps > 0, "--logging_steps must be positive");
  LLMT_CHECK(a.max_grad_norm >= 0.0, "--max_grad_norm must not be negative");
  LLMT_CHECK(a.throughput_warmup_steps >= 0, "--throughput_warmup_steps must not be negative");
  LLMT_CHECK(a.evaluation_strategy == "no" || a.evaluation_strategy == "steps" || a.evaluation_strategy == "epoch",
             "--evaluation_strategy must be no, steps or epoch, got \"%s\"", a.evaluation_strategy.c_str());
  LLMT_CHECK(a.save_strategy == "no" || a.save_strategy == "steps" || a.save_strategy == "epoch",
             "--save_strategy must be no, steps or epoch, got \"%s\"", a.save_strategy.c_str());
  LLMT_CHECK(a.save_strategy != "steps" || a.save_steps > 0, "--save_steps must be positive");
  LLMT_CHECK(a.save_total_limit >= 0, "--save_total_limit must not be negative");
  // validate spellings now, before any rank starts work
  parse_fsdp(a.fsdp);
  parse_reduce_dtype(a.mixed_precision_reduce);
  make_schedule(a.lr_scheduler_type, 1, a.warmup_steps, a.warmup_ratio);
  return a;
}

DType parse_reduce_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return DType::f32;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  fail("--mixed_precision_reduce must be float32 or bfloat16, got \"%s\"", name.c_str());
}

namespace {

// SIGUSR1 (Slurm's --signal=USR1@120 before the time limit) or SIGTERM (scancel, preemption):
// finish the step, save a checkpoint, exit cleanly so the job can be requeued and resumed.
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int sig) { g_stop_signal = sig; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peak_rss_gib() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / (1024.0 * 1024.0);  // ru_maxrss is in KiB on Linux
}

void make_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    fail("cannot create output directory %s: %s", dir.c_str(), std::strerror(errno));
  std::string probe = dir + "/.llmt_write_test";
  FILE* f = std::fopen(probe.c_str(), "w");
  LLMT_CHECK(f, "output directory %s is not writable: %s", dir.c_str(), std::strerror(errno));
  std::fclose(f);
  std::remove(probe.c_str());
}

// --tokenizer_name_or_path, else the model directory: a directory, a tokenizer file, or "bytes".
std::string tokenizer_source(const TrainArgs& a) {
  return a.tokenizer_name_or_path.empty() ? a.model_name_or_path : a.tokenizer_name_or_path;
}

std::unique_ptr<Tokenizer> pick_tokenizer(const TrainArgs& a, const ModelConfig& cfg) {
  std::string name = tokenizer_source(a);
  LLMT_CHECK(!name.empty(), "no tokenizer: give --tokenizer_name_or_path (a tokenizer directory or file, or \"bytes\" "
                            "for byte-level ids 0..255)");
  std::unique_ptr<Tokenizer> tok = name == "bytes" ? make_byte_tokenizer() : load_tokenizer(name);
  LLMT_CHECK(tok->vocab_size() <= cfg.vocab_size,
             "the tokenizer (%s, %d ids) does not fit the model's vocabulary of %d", name.c_str(), tok->vocab_size(),
             cfg.vocab_size);
  return tok;
}

// Everything one run holds, so the loop below reads as the step it is.
struct Run {
  const TrainArgs& a;
  ControlComm& world;
  std::unique_ptr<DataComm> data;  // the store's collectives
  const LaunchInfo& launch;
  ModelConfig cfg;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<FsdpStore> store;
  std::unique_ptr<Tokenizer> tok;
  TokenDataset train, eval;
  int B = 0, T = 0, pad_id = 0;
  std::string tokenizer_dir;  // where the tokenizer's files are, to copy into saved models
  std::ofstream metrics;
  std::vector<nlohmann::json> log_history;  // what was logged, for trainer_state.json (rank 0)
  int64_t steps_per_epoch = 1;
  int64_t global_batch = 1;  // sequences per step over every rank: with the seed, it fixes the data order
};

// A metrics record: to metrics.jsonl and the log history (rank 0 only).
void record(Run& r, const nlohmann::json& j) {
  if (r.world.rank() != 0) return;
  r.log_history.push_back(j);
  r.metrics << j.dump() << "\n";
  r.metrics.flush();
}

// Mean loss over every token counted on every rank.
double evaluate(Run& r) {
  // per_device_eval_batch_size examples per rank per round, in rows of the training-sized activations
  const int B = r.a.per_device_eval_batch_size > 0 ? r.a.per_device_eval_batch_size : r.B;
  const int W = r.world.size(), rank = r.world.rank();
  const int64_t n = r.eval.size(), per_round = (int64_t)W * B;
  const int64_t rounds = (n + per_round - 1) / per_round;  // the same on every rank: forward is collective
  std::vector<int32_t> tokens, targets;
  double counted = 0.0;
  BackendBuffer loss_sum(*r.be, DType::f64, {1});
  for (int64_t round = 0; round < rounds; round++) {
    std::vector<int64_t> idx;
    for (int b = 0; b < B; b++) {
      int64_t i = round * per_round + (int64_t)rank * B + b;
      if (i < n) idx.push_back(i);
    }
    int T = 1;
    if (!idx.empty()) T = collate(r.eval, idx, r.pad_id, tokens, targets);
    LLMT_CHECK(T <= r.T, "internal: evaluation batch of %d tokens over the %d the model was sized for", T, r.T);
    // rows past the examples (the last round, and beyond the eval batch) are padding with no targets
    std::vector<int32_t> tok_full((size_t)r.B * T, r.pad_id), tgt_full((size_t)r.B * T, kIgnoreIndex);
    for (size_t b = 0; b < idx.size(); b++)
      for (int t = 0; t < T; t++) {
        tok_full[b * T + t] = tokens[b * T + t];
        tgt_full[b * T + t] = targets[b * T + t];
      }
    counted += (double)count_targets(tgt_full.data(), (int64_t)tgt_full.size());
    r.model->forward(*r.store, tok_full.data(), tgt_full.data(), T, loss_sum.tensor());
  }
  r.data->all_reduce_async(loss_sum.tensor().data, 1, DType::f64, ReduceOp::sum)->wait();
  double total = 0.0;
  r.be->copy_to_host(&total, loss_sum.tensor().data, sizeof(total));
  counted = r.world.all_reduce_sum(counted);
  return counted > 0 ? total / counted : NAN;
}

// Writes the model as a Hugging Face directory, one unit at a time: every rank takes part in the
// unit's gather, rank 0 writes it; then the tokenizer's files beside it.
// A failure writing (rank 0: a full disk, say) must not leave the other ranks waiting in the
// gathers: rank 0 keeps taking part, and every rank learns of the error at the end.
void save_model(Run& r, const std::string& dir) {
  const ModelLayout& L = r.model->layout();
  std::unique_ptr<HfExporter> ex;
  std::string error;
  auto attempt = [&](const std::function<void()>& fn) {
    if (!error.empty()) return;
    try {
      fn();
    } catch (const Error& e) {
      error = e.what();
      ex.reset();  // removes its temporary files
    }
  };
  if (r.world.rank() == 0) attempt([&] { ex = std::make_unique<HfExporter>(dir, r.cfg, L, r.a.bf16 ? "BF16" : "F32"); });
  std::vector<float> host;
  for (size_t u = 0; u < L.units.size(); u++) {
    host.resize((size_t)L.units[u].numel);
    r.store->get_unit((int)u, host.data());
    if (ex) attempt([&] { ex->write_unit((int)u, host.data()); });
  }
  if (ex) attempt([&] {
    ex->finish();
    if (!r.tokenizer_dir.empty()) copy_tokenizer_files(r.tokenizer_dir, dir);
  });
  agree_or_throw(r.world, error.empty(), error);
}

// output_dir/checkpoint-<step>: the Hugging Face export, the exact training state (state.h5) and
// trainer_state.json, written under a temporary name, checksummed into manifest.json and renamed,
// so a checkpoint is complete or absent; then the oldest beyond save_total_limit are removed.
void save_checkpoint(Run& r, int64_t step) {
  std::string dir = save_checkpoint_dir(r.a.output_dir, step, r.world, [&](const std::string& tmp) {
    save_model(r, tmp);
    nlohmann::json scalars = {{"global_step", step},
                              {"seed", r.a.seed},
                              {"steps_per_epoch", r.steps_per_epoch},
                              {"global_batch", r.global_batch}};
    save_train_state(tmp + "/state.h5", r.world, r.model->layout(), *r.store, step, scalars.dump(),
                     config_to_hf_json(r.cfg).dump());
    std::string error;
    if (r.world.rank() == 0) try {
      nlohmann::json ts = {{"global_step", step},
                           {"epoch", (double)step / r.steps_per_epoch},
                           {"max_steps", r.a.max_steps},
                           {"num_train_epochs", r.a.num_train_epochs},
                           {"logging_steps", r.a.logging_steps},
                           {"save_steps", r.a.save_steps},
                           {"train_batch_size", r.B},
                           {"model_config", config_to_hf_json(r.cfg)},
                           {"log_history", r.log_history}};
      write_file_atomic(tmp + "/trainer_state.json", ts.dump(2) + "\n");
    } catch (const Error& e) {
      error = e.what();
    }
    agree_or_throw(r.world, error.empty(), error);
  });
  if (r.world.rank() == 0) {
    for (const std::string& gone : apply_save_total_limit(r.a.output_dir, r.a.save_total_limit, dir))
      log_info("removed %s (--save_total_limit %d)", gone.c_str(), r.a.save_total_limit);
    log_info("saved  %s", dir.c_str());
  }
  r.world.barrier();
}

// The checkpoint --resume_from_checkpoint names ("latest"/"True": the newest complete one whose
// checksums verify), agreed on every rank; "" when not resuming.
std::string resume_path(Run& r) {
  const std::string& want = r.a.resume_from_checkpoint;
  if (want.empty()) return "";
  if (want != "latest" && want != "True" && want != "true") {
    if (r.world.rank() == 0) verify_checkpoint(want);
    r.world.barrier();
    return want;
  }
  // rank 0 looks (checksums cost a full read), every rank learns the step
  double step = 0.0;
  if (r.world.rank() == 0) {
    std::string latest = find_latest_checkpoint(r.a.output_dir, true);
    LLMT_CHECK(!latest.empty(), "--resume_from_checkpoint %s: %s holds no complete checkpoint", want.c_str(),
               r.a.output_dir.c_str());
    step = (double)std::stoll(latest.substr(latest.rfind('-') + 1));
  }
  step = r.world.all_reduce_sum(step);
  return checkpoint_path(r.a.output_dir, (int64_t)step);
}

}  // namespace

void run_training(const TrainArgs& a, ControlComm& world, const LaunchInfo& launch) {
  LLMT_CHECK(a.device == "cpu", "--device cuda: the CUDA backend is not built into llmt yet (only its first kernels); "
                                "use --device cpu");
  if (a.tf32) log_info("note   --tf32 selects TF32 for fp32 matmuls on a GPU; the CPU has no TF32 and ignores it");
  const DType reduce_dtype = parse_reduce_dtype(a.mixed_precision_reduce);
  Strategy strategy = parse_fsdp(a.fsdp);
  Run r{a, world, make_mpi_data_comm(world), launch, {}, nullptr, nullptr, nullptr, nullptr, {}, {}, 0, 0, 0, {}, {}, {}, 1, 1};
  if (world.rank() == 0) {
    make_dir(a.output_dir);
    std::vector<CheckpointEntry> old = list_checkpoint_dirs(a.output_dir);
    LLMT_CHECK(old.empty() || !a.resume_from_checkpoint.empty() || a.overwrite_output_dir,
               "%s already holds checkpoints: pass --resume_from_checkpoint latest to continue, or "
               "--overwrite_output_dir to start again there (it removes them)", a.output_dir.c_str());
    if (a.overwrite_output_dir && a.resume_from_checkpoint.empty())
      for (const CheckpointEntry& c : old) {  // a new run's checkpoints must not mix with the old run's steps
        log_info("remove %s (--overwrite_output_dir)", c.path.c_str());
        remove_dir_tree(c.path);
      }
  }
  world.barrier();
  log_info("%s", describe_layout(launch, a.device).c_str());

  // model
  const bool from_hf = !a.model_name_or_path.empty();
  r.cfg = resolve_model_config(from_hf ? a.model_name_or_path : a.model_config);
  const ModelConfig& cfg = r.cfg;
  if (!a.fsdp_transformer_layer_cls_to_wrap.empty()) {
    const char* want = cfg.arch == Arch::gpt2 ? "GPT2Block" : "LlamaDecoderLayer";
    LLMT_CHECK(a.fsdp_transformer_layer_cls_to_wrap == want,
               "--fsdp_transformer_layer_cls_to_wrap %s: a %s model's layers are %s", a.fsdp_transformer_layer_cls_to_wrap.c_str(),
               cfg.arch_name(), want);
  }
  r.tok = pick_tokenizer(a, cfg);
  const std::string tok_src = tokenizer_source(a);
  if (tok_src != "bytes") {  // the directory whose tokenizer files saved models carry
    struct stat st;
    size_t slash = tok_src.rfind('/');
    if (stat(tok_src.c_str(), &st) == 0)
      r.tokenizer_dir = S_ISDIR(st.st_mode) ? tok_src : slash == std::string::npos ? "." : tok_src.substr(0, slash);
  }
  int threads = a.threads;
  if (threads <= 0) threads = default_threads_per_rank(launch);
  r.be = make_cpu_backend(threads, a.bf16 ? DType::bf16 : DType::f32);

  // data
  DataArgs da = a.data;
  if (da.block_size <= 0) da.block_size = std::min(1024, cfg.max_seq_len);
  LLMT_CHECK(da.block_size <= cfg.max_seq_len, "--block_size %d exceeds the model's context of %d", da.block_size,
             cfg.max_seq_len);
  if (da.tokenizer_path.empty() && tok_src != "bytes") da.tokenizer_path = tok_src;
  // Alpaca examples longer than the model's context are cut at it, like those past model_max_length
  if (da.model_max_length > cfg.max_seq_len) {
    if (!da.data_path.empty())
      log_info("data   --model_max_length %d is beyond the model's context: examples are cut at %d tokens",
               da.model_max_length, cfg.max_seq_len);
    da.model_max_length = cfg.max_seq_len;
  }
  r.train = load_train_dataset(da, *r.tok, world.rank(), world.size());
  if (a.do_eval || a.evaluation_strategy != "no") {
    r.eval = load_eval_dataset(da, *r.tok, world.rank(), world.size());
    LLMT_CHECK(!r.eval.empty(), "--do_eval / --evaluation_strategy: there is no evaluation data (--validation_file, or "
                                "a dataset with a validation split)");
  }
  r.pad_id = default_pad_id(*r.tok);
  r.B = a.per_device_train_batch_size;
  r.T = (int)std::min<int64_t>(r.train.max_length(), cfg.max_seq_len);
  if (!r.eval.empty()) r.T = (int)std::min<int64_t>(std::max<int64_t>(r.T, r.eval.max_length()), cfg.max_seq_len);
  LLMT_CHECK(a.per_device_eval_batch_size <= r.B,
             "--per_device_eval_batch_size %d: llmt evaluates with the training activations, so at most "
             "--per_device_train_batch_size (%d)", a.per_device_eval_batch_size, r.B);

  r.model = std::make_unique<Transformer>(cfg, *r.be, r.B, r.T, a.gradient_checkpointing);
  const ModelLayout& L = r.model->layout();
  int local_size = a.hybrid_shard_group_size > 0 ? a.hybrid_shard_group_size : launch.local_size;
  // hybrid_shard's groups are runs of consecutive ranks: with a node's ranks they must be that node's
  if (strategy == Strategy::hybrid_shard && a.hybrid_shard_group_size <= 0)
    LLMT_CHECK(world.rank() / launch.local_size == launch.node,
               "hybrid_shard shards within a node, so each node's ranks must be consecutive (mpirun's default "
               "--map-by slot, or ppr:N:node); rank %d sits on node %d", world.rank(), launch.node);
  r.store = std::make_unique<FsdpStore>(*r.be, L, strategy, *r.data, local_size, reduce_dtype);
  {
    std::unique_ptr<SafetensorsCheckpoint> ckpt;
    if (from_hf) {
      ckpt = std::make_unique<SafetensorsCheckpoint>(a.model_name_or_path);
      check_hf_tensors(*ckpt, cfg, L, a.model_name_or_path);
    }
    std::vector<float> host;
    for (size_t u = 0; u < L.units.size(); u++) {  // one unit at a time: no rank holds the whole model
      host.assign((size_t)L.units[u].numel, 0.0f);
      if (ckpt) load_hf_unit(*ckpt, cfg, L, (int)u, host.data());
      else init_unit_params(cfg, L.units[u], (int)u, a.seed, host.data());
      r.store->set_unit((int)u, host.data());
    }
  }
  const ShardGroups& g = r.store->groups();
  PlanArgs pa;
  pa.world = world.size();
  pa.ranks_per_node = strategy == Strategy::hybrid_shard ? local_size : world.size();
  pa.fsdp = a.fsdp.empty() ? "no_shard" : a.fsdp;
  pa.batch = r.B;
  pa.seq_len = r.T;
  pa.accum = a.gradient_accumulation_steps;
  pa.gradient_checkpointing = a.gradient_checkpointing;
  pa.bf16 = a.bf16;
  pa.reduce_dtype = reduce_dtype;
  nlohmann::json plan = make_plan(cfg, pa);
  const double mib = 1024.0 * 1024.0, gib_to_mib = 1024.0;
  log_info("model  %s, %.2fM parameters (%s)", cfg.describe().c_str(), L.total_numel / 1e6,
           from_hf ? a.model_name_or_path.c_str() : "random init");
  log_info("fsdp   %s: shards over %d rank%s x %d replica%s; per rank %.1f MiB of state (master, grad, m, v%s), "
           "activations %.1f MiB%s; compute %s, gradients reduced in %s",
           strategy_name(strategy), g.shard_size, g.shard_size == 1 ? "" : "s", g.replica_size,
           g.replica_size == 1 ? "" : "s", r.store->persistent_bytes() / mib, a.bf16 ? ", bf16 copy" : "",
           Transformer::activation_bytes(cfg, r.B, r.T, a.gradient_checkpointing, r.be->compute_dtype()) / mib,
           a.gradient_checkpointing ? " (gradient checkpointing)" : "", dtype_name(r.be->compute_dtype()),
           dtype_name(reduce_dtype));
  log_info("plan   per rank: gathered buffers at most %.1f MiB; %.1f MiB sent per step at the longest batches "
           "(llmt plan)",
           plan["gathered_peak_gib"].get<double>() * gib_to_mib, plan["comm_total_gib"].get<double>() * gib_to_mib);

  // schedule
  const int accum = a.gradient_accumulation_steps, W = world.size();
  Sampler sampler(r.train.size(), W, world.rank(), r.B, accum, a.seed);
  const int64_t steps_per_epoch = sampler.steps_per_epoch();
  r.steps_per_epoch = steps_per_epoch;
  r.global_batch = (int64_t)W * r.B * accum;
  const int64_t total_steps =
      a.max_steps > 0 ? a.max_steps : (int64_t)std::ceil(a.num_train_epochs * (double)steps_per_epoch);
  Schedule sched = make_schedule(a.lr_scheduler_type, total_steps, a.warmup_steps, a.warmup_ratio);
  log_info("train  %lld steps (%lld per epoch), global batch %d x %d x %d = %d sequences, lr %g (%s, %lld warmup), "
           "%d threads per rank",
           (long long)total_steps, (long long)steps_per_epoch, W, r.B, accum, W * r.B * accum, a.learning_rate,
           sched.type.c_str(), (long long)sched.warmup_steps, threads);
  AdamWConfig oc;
  oc.beta1 = (float)a.adam_beta1;
  oc.beta2 = (float)a.adam_beta2;
  oc.eps = (float)a.adam_epsilon;
  oc.weight_decay = (float)a.weight_decay;

  // A live progress line on a terminal; not under mpirun or srun, whose ranks' output may look like a
  // terminal but ends up in logs.
  const bool live = world.rank() == 0 && isatty(fileno(stdout)) && launch.launcher == "single process";

  // FLOPs by the PaLM convention (DESIGN.md): per token 6 * N_matmul + 12 * layers * d_model * T, with T
  // each batch's own length. No peak figure exists for CPUs, so no MFU there.
  auto flops_per_token = [&](int T) { return Transformer::flops_per_token(cfg, L, T); };
  double window_flops = 0.0;  // this rank's
  std::vector<std::vector<int32_t>> tokens(accum), targets(accum);
  double window_start = now_s(), window_loss = 0.0, run_start = 0.0;
  int64_t window_tokens = 0, window_steps = 0, run_tokens = 0;
  const double comm_before = r.store->comm_bytes() + r.data->stats().total();
  double comm_first_step = 0.0;
  // Fault injection for the tests: LLMT_FAIL_AT_STEP=rank:step makes that rank fail at that step.
  int fail_rank = -1;
  long long fail_step = -1;
  if (const char* f = std::getenv("LLMT_FAIL_AT_STEP")) std::sscanf(f, "%d:%lld", &fail_rank, &fail_step);
  const int64_t eval_every = a.eval_steps > 0 ? a.eval_steps : a.logging_steps;  // Hugging Face's fallback
  std::signal(SIGUSR1, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  int64_t stopped_at = -1;
  int64_t first_step = 0;
  if (std::string ck = resume_path(r); !ck.empty()) {
    LoadedTrainState st = load_train_state(ck + "/state.h5", world, L, *r.store, config_to_hf_json(cfg).dump());
    first_step = st.global_step;
    if (world.rank() == 0) {  // the log so far, so trainer_state.json keeps the whole history
      std::ifstream f(ck + "/trainer_state.json");
      nlohmann::json ts = nlohmann::json::parse(f, nullptr, false);
      LLMT_CHECK(ts.is_object() && ts.contains("log_history") && ts["log_history"].is_array(),
                 "%s/trainer_state.json is missing or malformed", ck.c_str());
      LLMT_CHECK(!ts.contains("model_config") || ts["model_config"] == config_to_hf_json(cfg),
                 "%s/trainer_state.json belongs to another model (%s), not this %s", ck.c_str(),
                 ts["model_config"].dump().c_str(), cfg.describe().c_str());
      for (auto& rec : ts["log_history"]) r.log_history.push_back(rec);
    }
    world.barrier();
    nlohmann::json sc = nlohmann::json::parse(st.scalars_json, nullptr, false);
    LLMT_CHECK(sc.is_object() && sc.value("global_batch", r.global_batch) == r.global_batch &&
                   sc.value("seed", a.seed) == a.seed,
               "%s was trained with a global batch of %lld sequences and --seed %llu; this run has %lld and %llu, so "
               "it would not continue with the same data (keep ranks x per-device batch x accumulation, and the seed)",
               ck.c_str(), (long long)sc.value("global_batch", (int64_t)0), (unsigned long long)sc.value("seed", (uint64_t)0),
               (long long)r.global_batch, (unsigned long long)a.seed);
    log_info("resume %s: step %lld, Adam step %d; continuing to step %lld", ck.c_str(), (long long)first_step,
             st.adam_step, (long long)total_steps);
    LLMT_CHECK(first_step < total_steps, "%s is at step %lld, and the run ends at step %lld: nothing left to train",
               ck.c_str(), (long long)first_step, (long long)total_steps);
  }
  if (world.rank() == 0) {  // metrics.jsonl: this run's records, after the resumed checkpoint's history
    r.metrics.open(a.output_dir + "/metrics.jsonl", std::ios::trunc);
    for (const auto& rec : r.log_history) r.metrics << rec.dump() << "\n";
    r.metrics.flush();
  }
  window_start = now_s();
  for (int64_t step = first_step; step < total_steps; step++) {
    LLMT_CHECK(!(world.rank() == fail_rank && step + 1 == fail_step), "injected failure (LLMT_FAIL_AT_STEP) at step %lld",
               (long long)step + 1);
    if (step - first_step == a.throughput_warmup_steps) run_start = now_s(), run_tokens = 0;
    std::vector<MicroBatch> micro;
    int64_t step_tokens = 0;
    for (int m = 0; m < accum; m++) {
      int len = collate(r.train, sampler.indices(step, m), r.pad_id, tokens[m], targets[m]);
      LLMT_CHECK(len <= r.T, "internal: batch length %d over %d", len, r.T);
      micro.push_back({tokens[m].data(), targets[m].data(), len, ((int64_t)m * W + world.rank()) * r.B});
      step_tokens += (int64_t)r.B * len;
      window_flops += (double)r.B * len * flops_per_token(len);
    }
    double lr = a.learning_rate * sched.multiplier(step);
    StepSettings ss;
    ss.lr = (float)lr;
    ss.adamw = oc;
    ss.max_grad_norm = a.max_grad_norm;
    ss.seed = a.seed;
    ss.step = step;
    StepResult res = train_step(*r.model, *r.store, world, *r.data, micro, ss);
    const double loss = res.loss, grad_norm = res.grad_norm;
    if (step == first_step) comm_first_step = r.store->comm_bytes() + r.data->stats().total() - comm_before;

    const int64_t global_tokens = step_tokens * W;
    window_loss += loss;
    window_tokens += global_tokens;
    run_tokens += global_tokens;
    window_steps++;
    const double epoch = (double)(step + 1) / steps_per_epoch;
    if (live) {
      std::printf("\r  step %lld/%lld  loss %.4f  ", (long long)step + 1, (long long)total_steps, loss);
      std::fflush(stdout);
    }
    if ((step + 1) % a.logging_steps == 0 || step + 1 == total_steps) {
      double dt = now_s() - window_start, tps = window_tokens / dt, mean_loss = window_loss / window_steps;
      if (live) std::printf("\r");
      log_info("step %6lld/%lld | epoch %.2f | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s (%.0f per rank) | "
               "%.0f ms/step | rss %.2f GiB",
               (long long)step + 1, (long long)total_steps, epoch, mean_loss, lr, grad_norm, tps, tps / W,
               1000.0 * dt / window_steps, peak_rss_gib());
      record(r, {{"step", step + 1},
                 {"epoch", epoch},
                 {"loss", mean_loss},
                 {"learning_rate", lr},
                 {"grad_norm", grad_norm},
                 {"tokens_per_s", tps},
                 {"tokens_per_s_per_rank", tps / W},
                 {"gflops_rank0", window_flops / dt / 1e9},
                 {"flops_convention", Transformer::kFlopsConvention},
                 {"peak_rss_gib", peak_rss_gib()}});
      window_start = now_s();
      window_loss = window_flops = 0.0;
      window_tokens = window_steps = 0;
    }
    bool epoch_end = (step + 1) % steps_per_epoch == 0;
    bool eval_now = (a.evaluation_strategy == "steps" && (step + 1) % eval_every == 0) ||
                    (a.evaluation_strategy == "epoch" && epoch_end);
    if (eval_now) {
      double el = evaluate(r);
      log_info("eval   step %lld | eval_loss %.4f | perplexity %.3f", (long long)step + 1, el, std::exp(el));
      record(r, {{"step", step + 1}, {"eval_loss", el}, {"perplexity", std::exp(el)}});
    }
    bool save_now = (a.save_strategy == "steps" && (step + 1) % a.save_steps == 0) ||
                    (a.save_strategy == "epoch" && epoch_end);
    if (save_now) save_checkpoint(r, step + 1);
    // a signal reaches some ranks and not others: agree before acting, so every rank saves together
    if (step + 1 < total_steps && world.all_reduce_sum(g_stop_signal != 0 ? 1.0 : 0.0) > 0) {
      log_info("signal received: saving at step %lld and stopping", (long long)step + 1);
      if (!save_now) save_checkpoint(r, step + 1);
      stopped_at = step + 1;
      break;
    }
  }
  if (stopped_at > 0) {
    log_info("stopped at step %lld of %lld by a signal; checkpoint-%lld holds the model", (long long)stopped_at,
             (long long)total_steps, (long long)stopped_at);
    std::signal(SIGUSR1, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    return;
  }
  double run_s = now_s() - run_start;
  if (total_steps - first_step > a.throughput_warmup_steps)
    log_info("done   %.0f tok/s over steps %d..%lld (%.0f per rank); measured per rank: %.1f MiB sent in step 1, "
             "gathered buffers peaked at %.1f MiB, peak rss %.2f GiB",
             run_tokens / run_s, a.throughput_warmup_steps + 1, (long long)total_steps, run_tokens / run_s / W,
             comm_first_step / mib, r.store->peak_gathered_bytes() / mib, peak_rss_gib());
  if (a.do_eval) {
    double el = evaluate(r);
    log_info("eval   eval_loss %.4f | perplexity %.3f", el, std::exp(el));
    record(r, {{"step", total_steps}, {"eval_loss", el}, {"perplexity", std::exp(el)}});
  }
  save_model(r, a.output_dir);  // a signal arriving now changes nothing: this is the end of the run
  std::signal(SIGUSR1, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  log_info("saved  %s (config.json, model.safetensors)", a.output_dir.c_str());
}

}  // namespace llmt
