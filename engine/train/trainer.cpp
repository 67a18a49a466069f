#include "engine/train/trainer.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "data/text_blocks.h"
#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/optim/adamw.h"
#include "engine/optim/schedule.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"

namespace llmt {

TrainArgs parse_train_args(Flags& f) {
  TrainArgs a;
  a.device = f.get_string("device", a.device);
  a.threads = f.get_int("threads", a.threads);
  a.model_name_or_path = f.get_string("model_name_or_path", "");
  a.model_config = f.get_string("model_config", "");
  a.train_file = f.get_string("train_file", "");
  a.output_dir = f.get_string("output_dir", "");
  a.max_steps = f.get_int64("max_steps", a.max_steps);
  a.num_train_epochs = f.get_double("num_train_epochs", a.num_train_epochs);
  a.per_device_train_batch_size = f.get_int("per_device_train_batch_size", a.per_device_train_batch_size);
  a.gradient_accumulation_steps = f.get_int("gradient_accumulation_steps", a.gradient_accumulation_steps);
  a.block_size = f.get_int("block_size", a.block_size);
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
  a.seed = (uint64_t)f.get_int64("seed", (long long)a.seed);
  a.bf16 = f.get_bool("bf16", a.bf16);
  a.tf32 = f.get_bool("tf32", a.tf32);
  f.get_bool("do_train", true);  // training is what `llmt train` does; accepted for command compatibility

  LLMT_CHECK(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got \"%s\"", a.device.c_str());
  LLMT_CHECK(a.model_name_or_path.empty() != a.model_config.empty(),
             "give exactly one of --model_name_or_path (a Hugging Face directory) or --model_config (a preset or "
             "config.json, randomly initialised)");
  LLMT_CHECK(!a.train_file.empty(), "--train_file is required (a plain text file)");
  LLMT_CHECK(!a.output_dir.empty(), "--output_dir is required");
  LLMT_CHECK(a.per_device_train_batch_size > 0, "--per_device_train_batch_size must be positive, got %d",
             a.per_device_train_batch_size);
  LLMT_CHECK(a.gradient_accumulation_steps > 0, "--gradient_accumulation_steps must be positive, got %d",
             a.gradient_accumulation_steps);
  LLMT_CHECK(a.learning_rate >= 0.0, "--learning_rate must not be negative, got %g", a.learning_rate);
  LLMT_CHECK(a.max_steps != 0 && (a.max_steps > 0 || a.num_train_epochs > 0.0),
             "nothing to train: --max_steps or --num_train_epochs must be positive");
  LLMT_CHECK(a.logging_steps > 0, "--logging_steps must be positive");
  LLMT_CHECK(a.max_grad_norm >= 0.0, "--max_grad_norm must not be negative");
  return a;
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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

}  // namespace

void run_training(const TrainArgs& a) {
  LLMT_CHECK(a.device == "cpu", "--device cuda: the CUDA backend is not built into llmt yet (only its first kernels); "
                                "use --device cpu");
  if (a.bf16 || a.tf32)
    log_warn("--bf16/--tf32 select CUDA compute precisions; the CPU backend computes in fp32%s",
             a.bf16 ? " (the saved model is still written in bf16)" : "");
  make_dir(a.output_dir);

  // model
  const bool from_hf = !a.model_name_or_path.empty();
  ModelConfig cfg = resolve_model_config(from_hf ? a.model_name_or_path : a.model_config);
  LLMT_CHECK(cfg.vocab_size >= 256, "the byte-level text data needs a vocabulary of at least 256 ids, the model has %d",
             cfg.vocab_size);
  const int T = a.block_size > 0 ? a.block_size : std::min(1024, cfg.max_seq_len);
  const int B = a.per_device_train_batch_size;
  LLMT_CHECK(T <= cfg.max_seq_len, "--block_size %d exceeds the model's context of %d", T, cfg.max_seq_len);
  std::unique_ptr<Backend> be = make_cpu_backend(a.threads);
  Transformer model(cfg, *be, B, T);
  const ModelLayout& L = model.layout();
  FullUnitStore store(*be, L);
  if (from_hf) {
    SafetensorsCheckpoint ckpt(a.model_name_or_path);
    check_hf_tensors(ckpt, cfg, L, a.model_name_or_path);
    for (size_t u = 0; u < L.units.size(); u++) load_hf_unit(ckpt, cfg, L, (int)u, store.params((int)u));
  } else {
    for (size_t u = 0; u < L.units.size(); u++) init_unit_params(cfg, L.units[u], (int)u, a.seed, store.params((int)u));
  }
  log_info("model  %s, %.2fM parameters (%s)", cfg.describe().c_str(), L.total_numel / 1e6,
           from_hf ? a.model_name_or_path.c_str() : "random init");

  // data and schedule
  TextBlocks data(a.train_file, T);
  const int64_t micro_per_epoch = data.steps_per_epoch(B);
  LLMT_CHECK(micro_per_epoch >= a.gradient_accumulation_steps,
             "%s: %lld blocks of %d tokens fill fewer than one step of %d x %d sequences", a.train_file.c_str(),
             (long long)data.num_blocks(), T, B, a.gradient_accumulation_steps);
  const int64_t steps_per_epoch = micro_per_epoch / a.gradient_accumulation_steps;
  const int64_t total_steps =
      a.max_steps > 0 ? a.max_steps : (int64_t)std::ceil(a.num_train_epochs * (double)steps_per_epoch);
  Schedule sched = make_schedule(a.lr_scheduler_type, total_steps, a.warmup_steps, a.warmup_ratio);
  log_info("data   %s: %lld tokens, %lld blocks of %d, %lld steps/epoch of %d x %d sequences", a.train_file.c_str(),
           (long long)data.num_tokens(), (long long)data.num_blocks(), T, (long long)steps_per_epoch, B,
           a.gradient_accumulation_steps);
  log_info("train  %lld steps, lr %g (%s, %lld warmup), device cpu, %d threads", (long long)total_steps,
           a.learning_rate, sched.type.c_str(), (long long)sched.warmup_steps, be->threads());

  AdamWConfig oc;
  oc.beta1 = (float)a.adam_beta1;
  oc.beta2 = (float)a.adam_beta2;
  oc.eps = (float)a.adam_epsilon;
  oc.weight_decay = (float)a.weight_decay;
  AdamW opt(*be, L, oc);
  std::vector<float*> params, grads;
  for (size_t u = 0; u < L.units.size(); u++) params.push_back(store.params((int)u)), grads.push_back(store.grads((int)u));

  std::ofstream metrics(a.output_dir + "/metrics.jsonl", std::ios::app);
  const int accum = a.gradient_accumulation_steps;
  std::vector<int32_t> tokens((size_t)accum * B * T), targets((size_t)accum * B * T);
  const double flops_per_token = 6.0 * (double)L.matmul_numel + 12.0 * cfg.n_layer * cfg.d_model * T;
  double window_start = now_s(), window_loss = 0.0;
  int64_t window_tokens = 0, window_steps = 0;
  for (int64_t step = 0; step < total_steps; step++) {
    // fetch the step's micro-batches first: the loss is a mean over every counted token of the step
    int64_t epoch = 0, counted = 0;
    for (int m = 0; m < accum; m++) {
      int64_t off = (int64_t)m * B * T;
      epoch = data.batch(step * accum + m, B, a.seed, tokens.data() + off, targets.data() + off);
    }
    for (int32_t t : targets) counted += t != -100;
    store.zero_grads();
    double loss_sum = 0.0;
    for (int m = 0; m < accum; m++) {
      int64_t off = (int64_t)m * B * T;
      loss_sum += model.forward(store, tokens.data() + off, targets.data() + off, true, 1.0f / (float)counted);
      model.backward(store);
    }
    double sq = 0.0;
    for (size_t u = 0; u < L.units.size(); u++) sq += be->sum_squares(Tensor(grads[u], DType::f32, {L.units[u].numel}), L.units[u].numel);
    double grad_norm = std::sqrt(sq);
    LLMT_CHECK(std::isfinite(grad_norm) && std::isfinite(loss_sum),
               "step %lld: the loss or gradient is not finite (loss %g, grad norm %g); stopping", (long long)step + 1,
               loss_sum / counted, grad_norm);
    float clip = a.max_grad_norm > 0.0 && grad_norm > a.max_grad_norm ? (float)(a.max_grad_norm / (grad_norm + 1e-6)) : 1.0f;
    double lr = a.learning_rate * sched.multiplier(step);
    opt.step(params, grads, (float)lr, clip);

    window_loss += loss_sum / counted;
    window_tokens += (int64_t)accum * B * T;
    window_steps++;
    if ((step + 1) % a.logging_steps == 0 || step + 1 == total_steps) {
      double dt = now_s() - window_start;
      double tps = window_tokens / dt;
      double loss = window_loss / window_steps;
      log_info("step %6lld/%lld | epoch %.2f | loss %.4f | lr %.3e | grad_norm %.3f | %.0f tok/s | %.0f ms/step",
               (long long)step + 1, (long long)total_steps, (double)(step + 1) / steps_per_epoch, loss, lr, grad_norm,
               tps, 1000.0 * dt / window_steps);
      metrics << nlohmann::json{{"step", step + 1},       {"epoch", (double)(step + 1) / steps_per_epoch},
                                {"loss", loss},           {"learning_rate", lr},
                                {"grad_norm", grad_norm}, {"tokens_per_s", tps},
                                {"data_epoch", epoch},    {"flops_per_token", flops_per_token}}
                     .dump()
              << "\n";
      metrics.flush();
      window_start = now_s();
      window_loss = 0.0;
      window_tokens = window_steps = 0;
    }
  }

  std::vector<const float*> host;
  for (size_t u = 0; u < L.units.size(); u++) host.push_back(store.params((int)u));
  save_hf_model(a.output_dir, cfg, L, host, a.bf16 ? "BF16" : "F32");
  log_info("saved  %s (config.json, model.safetensors)", a.output_dir.c_str());
}

}  // namespace llmt
