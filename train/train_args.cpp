#include "train/train_args.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/launch.h"
#include "engine/fsdp/fsdp.h"
#include "engine/optim/schedule.h"
#include "train/deepspeed_config.h"

namespace llmt {

namespace {

// A flag's value read with the member's own type, the member's current value as the default.
std::string get(Flags& f, const char* n, const std::string& d) { return f.get_string(n, d); }
int get(Flags& f, const char* n, int d) { return f.get_int(n, d); }
int64_t get(Flags& f, const char* n, int64_t d) { return f.get_int64(n, d); }
uint64_t get(Flags& f, const char* n, uint64_t d) { return (uint64_t)f.get_int64(n, (long long)d); }
double get(Flags& f, const char* n, double d) { return f.get_double(n, d); }
bool get(Flags& f, const char* n, bool d) { return f.get_bool(n, d); }

std::string text(const std::string& v) { return v.empty() ? "" : v; }
std::string text(bool v) { return v ? "True" : "False"; }
std::string text(double v) { return strformat("%g", v); }
template <class T>
std::string text(T v) {
  return std::to_string(v);
}

template <auto M>
void read_arg(Flags& f, const char* name, TrainArgs& a) {
  a.*M = get(f, name, a.*M);
}
template <auto M>
void read_data(Flags& f, const char* name, TrainArgs& a) {
  a.data.*M = get(f, name, a.data.*M);
}
template <auto M>
std::string show_arg(const TrainArgs& a) {
  return text(a.*M);
}
template <auto M>
std::string show_data(const TrainArgs& a) {
  return text(a.data.*M);
}

// Flags that only mean something to other launchers: accepted so their commands run unchanged, each
// with a warning that says it is ignored.
void read_ignored(Flags& f, const char* name, TrainArgs&) {
  if (!f.has(name)) return;
  f.ignore(name);
  if (launcher_rank_from_env() <= 0) log_warn("--%s only matters to other launchers; llmt ignores it", name);
}

#define ARG(member) &read_arg<&TrainArgs::member>, &show_arg<&TrainArgs::member>
#define ARG_UNSET(member) &read_arg<&TrainArgs::member>, nullptr  // the help says what unset means
#define DATA(member) &read_data<&DataArgs::member>, &show_data<&DataArgs::member>
#define DATA_UNSET(member) &read_data<&DataArgs::member>, nullptr
#define IGNORED(name, help) {name, "accepted and ignored, with a warning", "", help, &read_ignored, nullptr}

// What PEFT or TRL offer and llmt does not train: refused by name when set (their defaults pass, so
// TRL's commands that spell them out run unchanged).
void read_refused(Flags& f, const char* name, TrainArgs&) {
  if (!f.has(name)) return;
  const std::string v = f.get_string(name, "");
  static const std::map<std::string, std::string> defaults = {
      {"use_dora", "False"}, {"load_in_4bit", "False"}, {"load_in_8bit", "False"}, {"use_bnb_nested_quant", "False"},
      {"lora_task_type", "CAUSAL_LM"}, {"bnb_4bit_quant_type", "nf4"}};
  auto d = defaults.find(name);
  const bool is_default = d != defaults.end() && (v == d->second || (d->second == "False" && v == "false"));
  LLMT_CHECK(is_default, "--%s %s: llmt does not implement it (LoRA as PEFT's LoraConfig with use_dora False, "
             "bias none, task_type CAUSAL_LM, on an unquantized base)", name, v.c_str());
}
#define REFUSED(name, help) {name, "LoRA", "", help, &read_refused, nullptr}

}  // namespace

const std::vector<TrainFlag>& train_flags() {
  static const std::vector<TrainFlag> flags = {
      // model
      {"model_name_or_path", "model", "DIR", "a Hugging Face directory (config.json, safetensors, tokenizer files)",
       ARG(model_name_or_path)},
      {"model_config", "model", "NAME|FILE",
       "instead: a preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-7b, llama-13b, llama2-7b, llama3-8b, "
       "llama3.1-8b, llama3.1-70b, llama3.2-1b, llama3.2-3b, qwen3-0.6b, phi3-mini-4k, phi4-mini, gemma2-2b, gemma3-1b, gpt2-tiny, "
       "gpt2-small-byte, llama-tiny) or a config.json, randomly initialised",
       ARG(model_config)},
      {"tokenizer_name_or_path", "model", "DIR|FILE|bytes",
       "the tokenizer (default: the model directory); bytes = byte-level ids 0..255", ARG(tokenizer_name_or_path)},
      {"llama3_special_tokens", "model", "auto|3.0|3.1",
       "names of the special tokens of a bare Llama 3 tokenizer.model (3.1: also 3.2, 3.3); auto: as the files "
       "beside it show, else 3.0", ARG(llama3_special_tokens)},
      // LoRA, TRL's ModelConfig names
      {"use_peft", "LoRA", "True|False",
       "train a PEFT LoRA adapter on the frozen --model_name_or_path; output_dir and each checkpoint become PEFT "
       "adapter directories (checkpoints also hold the adapter's training state)",
       ARG(use_peft)},
      {"lora_r", "LoRA", "N", "the adapters' rank", ARG(lora_r)},
      {"lora_alpha", "LoRA", "X", "scaling alpha / r (alpha / sqrt(r) with --use_rslora)", ARG(lora_alpha)},
      {"lora_dropout", "LoRA", "X", "dropout on the adapters' input", ARG(lora_dropout)},
      {"lora_target_modules", "LoRA", "NAMES",
       "the projections adapted, a space or comma list as PEFT matches it (one entry: TRL hands PEFT a string, a "
       "regular expression the whole module path must match, or all-linear); unset: PEFT's default for the model "
       "type (c_attn for GPT-2, q_proj v_proj for LLaMA, Mistral, Qwen2)",
       ARG_UNSET(lora_target_modules)},
      {"lora_modules_to_save", "LoRA", "NAMES", "modules trained whole beside the adapters: lm_head, embed_tokens (GPT-2: wte)",
       ARG_UNSET(lora_modules_to_save)},
      {"use_rslora", "LoRA", "True|False", "rank-stabilized scaling alpha / sqrt(r)", ARG(use_rslora)},
      {"adapter_name_or_path", "LoRA", "DIR",
       "continue training this PEFT adapter (its adapter_config.json sets r, alpha, dropout and the targets)",
       ARG(adapter_name_or_path)},
      REFUSED("use_dora", "refused when True: DoRA"),
      REFUSED("load_in_4bit", "refused when True: a quantized base"),
      REFUSED("load_in_8bit", "refused when True: a quantized base"),
      REFUSED("use_bnb_nested_quant", "refused when True"),
      REFUSED("bnb_4bit_quant_type", "refused unless nf4 (its default): a quantized base"),
      REFUSED("bnb_4bit_quant_storage", "refused: a quantized base"),
      REFUSED("lora_target_parameters", "refused: PEFT's target_parameters"),
      REFUSED("lora_task_type", "refused unless CAUSAL_LM"),
      // data
      {"data_path", "data", "FILE", "Alpaca or chat records (messages, conversations, prompt/completion), JSON or "
       "JSON Lines; the format is read from the records", DATA(data_path)},
      {"dataset_name", "data", "wikitext", "WikiText from local files under --dataset_dir (nothing is downloaded)",
       DATA(dataset_name)},
      {"dataset_config_name", "data", "NAME", "wikitext-2-raw-v1, wikitext-103-raw-v1, wikitext-2-v1, wikitext-103-v1",
       DATA(dataset_config_name)},
      {"dataset_dir", "data", "DIR", "where the WikiText files are", DATA(dataset_dir)},
      {"train_file", "data", "FILE", "run_clm's data: .txt (a record a line), .json/.jsonl or .csv (the \"text\" column, "
       "else the first), tokenized and grouped into --block_size tokens", DATA(train_file)},
      {"validation_file", "data", "FILE", "for evaluation, of --train_file's types", DATA(validation_file)},
      {"block_size", "data", "N", "tokens per run_clm block (unset: min(1024, the model's context))",
       [](Flags& f, const char* n, TrainArgs& a) {
         if (!f.has(n)) return;  // unset: load_data takes min(1024, the model's context)
         a.data.block_size = f.get_int(n, 0);
         LLMT_CHECK(a.data.block_size > 0, "--block_size %d: expected a positive number of tokens (leave it out for "
                    "min(1024, the model's context))", a.data.block_size);
       },
       nullptr},
      {"model_max_length", "data", "N", "Alpaca examples are cut at this many tokens", DATA(model_max_length)},
      {"packing", "data", "True|False",
       "pack whole examples into rows of --model_max_length (TRL's SFTConfig packing): no padding between them, "
       "attention inside each example, positions restarting at each", ARG(packing)},
      {"chat_template", "data", "FILE", "chat data's template: a Jinja file or a tokenizer_config.json (default: the "
       "tokenizer's chat_template.jinja or tokenizer_config.json)", DATA(chat_template)},
      {"assistant_only_loss", "data", "True|False", "chat data (messages, conversations): loss on the assistant "
       "turns (True: those the template's {% generation %} blocks mark, else the text each assistant message adds "
       "to the rendering before it), or on every token", DATA(assistant_only_loss)},
      {"completion_only_loss", "data", "True|False", "prompt-completion data: loss on the completion only (True)",
       DATA(completion_only_loss)},
      {"alpaca_instruction_field", "data", "NAME", "the Alpaca record's instruction field", DATA(instruction_field)},
      {"alpaca_input_field", "data", "NAME", "the Alpaca record's input field", DATA(input_field)},
      {"alpaca_output_field", "data", "NAME", "the Alpaca record's response field", DATA(output_field)},
      {"cache_dir", "data", "DIR|none", "the token cache (default ~/.cache/llmt)", DATA(cache_dir)},
      {"overwrite_cache", "data", "True|False", "tokenize again and rewrite the token cache", DATA(overwrite_cache)},
      {"keep_linebreaks", "data", "True|False", "run_clm: each line of a .txt --train_file keeps its line break (True)",
       DATA(keep_linebreaks)},
      {"preprocessing_num_workers", "data", "N", "threads that tokenize, at most the node's CPUs (0: the rank's threads)",
       DATA_UNSET(preprocessing_num_workers)},
      {"validation_split_percentage", "data", "N",
       "run_clm: with --train_file and no --validation_file, the first N% of its lines become the validation split",
       DATA_UNSET(validation_split_percentage)},
      {"dataloader_drop_last", "data", "True",
       "accepted as True: an epoch's last incomplete global batch is always dropped",
       [](Flags& f, const char* n, TrainArgs&) {
         LLMT_CHECK(f.get_bool(n, true), "--dataloader_drop_last False: llmt always drops the last incomplete global "
                    "batch of an epoch (every step has the same global batch, so a resumed run sees the same data)");
       },
       nullptr},
      {"dataloader_num_workers", "data", "N", "accepted: the tokenized data is memory-mapped; there are no loader "
       "processes",
       [](Flags& f, const char* n, TrainArgs&) {
         LLMT_CHECK(f.get_int(n, 0) >= 0, "--dataloader_num_workers must not be negative");
       },
       nullptr},
      // training
      {"output_dir", "training", "DIR", "where checkpoints, metrics.jsonl and the final model go (required; made with its parents)",
       ARG(output_dir)},
      {"max_steps", "training", "N", "optimizer steps; > 0 overrides --num_train_epochs", ARG_UNSET(max_steps)},
      {"num_train_epochs", "training", "X", "passes over the training data", ARG(num_train_epochs)},
      {"per_device_train_batch_size", "training", "N", "sequences per rank per micro-batch",
       ARG(per_device_train_batch_size)},
      {"gradient_accumulation_steps", "training", "N", "micro-batches per optimizer step",
       ARG(gradient_accumulation_steps)},
      {"learning_rate", "training", "X", "AdamW's peak learning rate", ARG(learning_rate)},
      {"weight_decay", "training", "X", "AdamW weight decay (not on biases and norm weights)", ARG(weight_decay)},
      {"adam_beta1", "training", "X", "AdamW beta1", ARG(adam_beta1)},
      {"adam_beta2", "training", "X", "AdamW beta2", ARG(adam_beta2)},
      {"adam_epsilon", "training", "X", "AdamW epsilon", ARG(adam_epsilon)},
      {"max_grad_norm", "training", "X", "clip the global gradient norm to this (0: no clipping)", ARG(max_grad_norm)},
      {"lr_scheduler_type", "training", "linear|cosine|cosine_with_restarts|polynomial|constant|constant_with_warmup",
       "the learning-rate schedule, as transformers' get_scheduler", ARG(lr_scheduler_type)},
      {"lr_scheduler_kwargs", "training", "JSON",
       "the schedule's arguments: num_cycles (cosine, cosine_with_restarts), lr_end and power (polynomial)",
       ARG_UNSET(lr_scheduler_kwargs)},
      {"optim", "training", "adamw_torch|adamw_torch_fused|adamw_hf", "the optimizer: AdamW, whichever name",
       ARG(optim)},
      {"warmup_ratio", "training", "X", "warm-up as a fraction of the steps", ARG(warmup_ratio)},
      {"warmup_steps", "training", "N", "warm-up steps (overrides --warmup_ratio)", ARG(warmup_steps)},
      {"seed", "training", "N", "initialisation, data order and dropout masks", ARG(seed)},
      // parallelism and precision
      {"fsdp", "parallelism and precision", "\"full_shard auto_wrap\"|shard_grad_op|hybrid_shard|no_shard",
       "how parameters, gradients and optimizer state are split over the ranks (empty: no_shard)", ARG(fsdp)},
      {"fsdp_transformer_layer_cls_to_wrap", "parallelism and precision", "GPT2Block|LlamaDecoderLayer",
       "checked against the model: one unit per transformer block", ARG(fsdp_transformer_layer_cls_to_wrap)},
      {"hybrid_shard_group_size", "parallelism and precision", "N",
       "ranks a hybrid_shard shard spans (0: the ranks of a node)", ARG_UNSET(hybrid_shard_group_size)},
      {"gradient_checkpointing", "parallelism and precision", "True|False",
       "keep only each block's input; recompute the block in backward", ARG(gradient_checkpointing)},
      {"logits_chunk_tokens", "parallelism and precision", "N",
       "the LM head and loss over N tokens at a time: a logits buffer of N rows instead of the micro-batch's, "
       "each chunk's logits recomputed in backward (0: the whole micro-batch)", ARG(logits_chunk_tokens)},
      {"fp16", "parallelism and precision", "False",
       "not implemented (fp16 needs loss scaling): use --bf16 True",
       [](Flags& f, const char* n, TrainArgs&) {
         LLMT_CHECK(!f.get_bool(n, false), "--fp16: llmt has no fp16 training (it needs loss scaling); use --bf16 True, "
                    "which keeps fp32 master weights and needs none");
       },
       nullptr},
      {"torch_dtype", "parallelism and precision", "float32|bfloat16|float16|auto",
       "dtype the model (and each checkpoint's model) is saved in, as transformers saves a model loaded in it "
       "(unset: float32, also under --bf16; auto: the --model_name_or_path checkpoint's); training keeps fp32 masters",
       [](Flags& f, const char* n, TrainArgs& a) {
         const std::string v = f.get_string(n, "");
         LLMT_CHECK(v.empty() || v == "auto" || v == "float32" || v == "bfloat16" || v == "float16",
                    "--torch_dtype must be auto, float32, bfloat16 or float16, got \"%s\"", v.c_str());
         a.torch_dtype = v;
       },
       nullptr},
      {"ddp_find_unused_parameters", "parallelism and precision", "True|False",
       "accepted: every parameter gets a gradient in every step, so there is nothing to find",
       [](Flags& f, const char* n, TrainArgs&) { (void)f.get_bool(n, false); }, nullptr},
      {"bf16", "parallelism and precision", "True|False",
       "bf16 compute copy, gathers and activations; fp32 master weights, moments, norms, softmax and loss",
       ARG(bf16)},
      {"mixed_precision_reduce", "parallelism and precision", "float32|bfloat16",
       "what gradients are reduced in (torchtitan's name)", ARG(mixed_precision_reduce)},
      {"tf32", "parallelism and precision", "True|False", "TF32 for fp32 matmuls on a GPU (the CPU has none)",
       ARG(tf32)},
      {"device", "parallelism and precision", "cpu|cuda", "where each rank computes", ARG(device)},
      {"threads", "parallelism and precision", "N",
       "CPU threads per rank, at most the node's CPUs (0: the node's cores / ranks per node)",
       ARG_UNSET(threads)},
      {"ddp_backend", "parallelism and precision", "nccl|mpi",
       "what moves the data between ranks (default: nccl with --device cuda when each rank has its own GPU, "
       "else mpi)", ARG_UNSET(ddp_backend)},
      {"ddp_timeout", "parallelism and precision", "SECONDS",
       "a collective that takes longer ends the job on every rank, naming it (a dead or stopped peer)",
       ARG(ddp_timeout)},
      // evaluation
      {"do_eval", "evaluation", "True|False", "evaluate once at the end", ARG(do_eval)},
      {"evaluation_strategy", "evaluation", "no|steps|epoch", "when to evaluate (also --eval_strategy)",
       [](Flags& f, const char* n, TrainArgs& a) {
         a.evaluation_strategy = f.get_string(n, f.get_string("eval_strategy", a.evaluation_strategy));
       },
       &show_arg<&TrainArgs::evaluation_strategy>},
      {"eval_steps", "evaluation", "N", "evaluate every N steps (0: --logging_steps)", ARG_UNSET(eval_steps)},
      {"per_device_eval_batch_size", "evaluation", "N", "sequences per rank per evaluation batch, any size (0: the train one)",
       ARG_UNSET(per_device_eval_batch_size)},
      // checkpoints
      {"save_strategy", "checkpoints", "no|steps|epoch", "when to write output_dir/checkpoint-<step>",
       ARG(save_strategy)},
      {"save_steps", "checkpoints", "N", "save every N steps", ARG(save_steps)},
      {"save_total_limit", "checkpoints", "N", "keep the newest N checkpoints (0: all)", ARG(save_total_limit)},
      {"resume_from_checkpoint", "checkpoints", "DIR|latest",
       "continue from a checkpoint at any world size and strategy (latest: the newest complete one)",
       [](Flags& f, const char* n, TrainArgs& a) {
         a.resume_from_checkpoint = f.get_string(n, a.resume_from_checkpoint);
         if (a.resume_from_checkpoint == "False" || a.resume_from_checkpoint == "false") a.resume_from_checkpoint.clear();
       },
       nullptr},
      {"overwrite_output_dir", "checkpoints", "True|False", "start again in an output_dir that holds checkpoints",
       ARG(overwrite_output_dir)},
      {"ignore_data_skip", "checkpoints", "True|False",
       "resume with other data than the checkpoint's (train file, block size, model_max_length, tokenizer): the "
       "run continues at the checkpoint's step in the new data's order",
       ARG(ignore_data_skip)},
      {"save_only_model", "checkpoints", "True|False",
       "checkpoints hold the model only, not the training state: smaller, and they cannot be resumed",
       ARG(save_only_model)},
      {"save_safetensors", "checkpoints", "True", "accepted as True: models are always written as safetensors",
       [](Flags& f, const char* n, TrainArgs&) {
         LLMT_CHECK(f.get_bool(n, true), "--save_safetensors False: llmt writes models as safetensors only");
       },
       nullptr},
      // logging
      {"logging_strategy", "logging", "steps|epoch|no", "when to print and record a line (and always the last step "
       "unless no)", ARG(logging_strategy)},
      {"logging_steps", "logging", "N", "print and record a line every N steps", ARG(logging_steps)},
      {"logging_first_step", "logging", "True|False", "also log the first step", ARG(logging_first_step)},
      {"throughput_warmup_steps", "logging", "N", "steps left out of the final throughput", ARG(throughput_warmup_steps)},
      {"straggler_threshold", "logging", "X",
       "at each logging step, name a rank whose compute per step is more than X above the median of every rank's, "
       "two logging windows in a row (0: never)", ARG(straggler_threshold)},
      {"do_train", "logging", "True", "accepted: llmt train always trains",
       [](Flags& f, const char* n, TrainArgs&) {
         LLMT_CHECK(f.get_bool(n, true), "--do_train False: llmt train always trains");
       },
       nullptr},
      {"report_to", "logging", "none|tensorboard|all",
       "tensorboard (or all): event files under --logging_dir, rank 0; other trackers (wandb, ...) are ignored "
       "with a warning",
       [](Flags& f, const char* n, TrainArgs& a) {
         // HF takes a list: "tensorboard,wandb" or "tensorboard wandb"
         std::string list = f.get_string(n, "none");
         for (char& c : list)
           if (c == ',') c = ' ';
         std::istringstream in(list);
         for (std::string t; in >> t;) {
           if (t == "tensorboard" || t == "all") a.report_tensorboard = true;
           else if (t != "none" && launcher_rank_from_env() <= 0)
             log_warn("--report_to %s: llmt writes tensorboard only; %s is ignored", t.c_str(), t.c_str());
         }
       },
       nullptr},
      {"logging_dir", "logging", "DIR", "where --report_to tensorboard writes (default output_dir/runs/<date>_<host>)",
       ARG_UNSET(logging_dir)},
      IGNORED("use_habana", "optimum-habana"),
      IGNORED("use_lazy_mode", "optimum-habana"),
      IGNORED("use_hpu_graphs", "optimum-habana"),
      IGNORED("use_hpu_graphs_for_inference", "optimum-habana"),
      IGNORED("use_hpu_graphs_for_training", "optimum-habana"),
      IGNORED("gaudi_config_name", "optimum-habana"),
      // last: it reads the flags above, refusing a value that contradicts one given
      {"deepspeed", "config files", "FILE|JSON",
       "a DeepSpeed config, read as the Trainer fills it: ZeRO stage (3: full_shard, 1 and 2: shard_grad_op), bf16, "
       "batch sizes, clipping, AdamW and WarmupLR/WarmupDecayLR become the flags above (\"auto\": the flag's); "
       "offload, fp16 and what llmt lacks are refused by name",
       [](Flags& f, const char* n, TrainArgs& a) {
         a.deepspeed = f.get_string(n, "");
         read_deepspeed_flag(a.deepspeed, [&f](const char* flag) { return f.has(flag); }, a);
       },
       nullptr},
  };
  return flags;
}

#undef ARG
#undef ARG_UNSET
#undef DATA
#undef DATA_UNSET
#undef IGNORED

ConfigFields train_config_fields(const TrainArgs& a) {
  auto d = [](double v) { return strformat("%.17g", v); };  // exact: 1e-3 and 0.001 are one value
  auto b = [](bool v) { return std::string(v ? "True" : "False"); };
  auto i = [](int64_t v) { return std::to_string(v); };
  const DataArgs& x = a.data;
  // Left out, because a rank may differ there without harm: --threads and
  // --preprocessing_num_workers (its own cores), --cache_dir and --overwrite_cache (a node-local
  // token cache); each rank's data is compared by its content after loading (Trainer::load_data).
  return {
      {"--device", a.device}, {"--ddp_backend", a.ddp_backend}, {"--ddp_timeout", d(a.ddp_timeout)},
      {"--model_name_or_path", a.model_name_or_path}, {"--model_config", a.model_config},
      {"--tokenizer_name_or_path", a.tokenizer_name_or_path}, {"--data_path", x.data_path},
      {"--dataset_name", x.dataset_name}, {"--dataset_config_name", x.dataset_config_name},
      {"--dataset_dir", x.dataset_dir}, {"--train_file", x.train_file}, {"--validation_file", x.validation_file},
      {"--block_size", i(x.block_size)}, {"--model_max_length", i(x.model_max_length)}, {"--packing", b(a.packing)},
      {"--alpaca_instruction_field", x.instruction_field}, {"--alpaca_input_field", x.input_field},
      {"--alpaca_output_field", x.output_field},
      {"--chat_template", x.chat_template}, {"--assistant_only_loss", b(x.assistant_only_loss)},
      {"--completion_only_loss", b(x.completion_only_loss)}, {"--validation_split_percentage", i(x.validation_split_percentage)},
      {"--use_peft", b(a.use_peft)}, {"--lora_r", i(a.lora_r)}, {"--lora_alpha", d(a.lora_alpha)},
      {"--lora_dropout", d(a.lora_dropout)}, {"--lora_target_modules", a.lora_target_modules},
      {"--lora_modules_to_save", a.lora_modules_to_save}, {"--use_rslora", b(a.use_rslora)},
      {"--adapter_name_or_path", a.adapter_name_or_path},
      {"--output_dir", a.output_dir}, {"--max_steps", i(a.max_steps)}, {"--num_train_epochs", d(a.num_train_epochs)},
      {"--per_device_train_batch_size", i(a.per_device_train_batch_size)},
      {"--per_device_eval_batch_size", i(a.per_device_eval_batch_size)},
      {"--gradient_accumulation_steps", i(a.gradient_accumulation_steps)}, {"--learning_rate", d(a.learning_rate)},
      {"--weight_decay", d(a.weight_decay)}, {"--adam_beta1", d(a.adam_beta1)}, {"--adam_beta2", d(a.adam_beta2)},
      {"--adam_epsilon", d(a.adam_epsilon)}, {"--max_grad_norm", d(a.max_grad_norm)},
      {"--lr_scheduler_type", a.lr_scheduler_type}, {"--lr_scheduler_kwargs", a.lr_scheduler_kwargs},
      {"--optim", a.optim}, {"--warmup_ratio", d(a.warmup_ratio)}, {"--warmup_steps", i(a.warmup_steps)},
      {"--logging_steps", i(a.logging_steps)}, {"--logging_strategy", a.logging_strategy},
      {"--logging_first_step", b(a.logging_first_step)}, {"--throughput_warmup_steps", i(a.throughput_warmup_steps)},
      {"--straggler_threshold", d(a.straggler_threshold)},
      {"--report_to tensorboard", b(a.report_tensorboard)}, {"--logging_dir", a.logging_dir}, {"--fsdp", a.fsdp},
      {"--fsdp_transformer_layer_cls_to_wrap", a.fsdp_transformer_layer_cls_to_wrap},
      {"--hybrid_shard_group_size", i(a.hybrid_shard_group_size)},
      {"--gradient_checkpointing", b(a.gradient_checkpointing)},
      {"--logits_chunk_tokens", i(a.logits_chunk_tokens)}, {"--do_eval", b(a.do_eval)},
      {"--evaluation_strategy", a.evaluation_strategy}, {"--eval_steps", i(a.eval_steps)},
      {"--save_strategy", a.save_strategy}, {"--save_steps", i(a.save_steps)},
      {"--save_total_limit", i(a.save_total_limit)}, {"--resume_from_checkpoint", a.resume_from_checkpoint},
      {"--overwrite_output_dir", b(a.overwrite_output_dir)}, {"--save_only_model", b(a.save_only_model)},
      {"--seed", std::to_string(a.seed)}, {"--bf16", b(a.bf16)}, {"--tf32", b(a.tf32)},
      {"--mixed_precision_reduce", a.mixed_precision_reduce},
  };
}

namespace {

// The flags of train's table that set a part's members.
const std::vector<const char*> kParallelismFlags = {"device", "threads", "ddp_backend", "ddp_timeout", "fsdp",
                                                    "hybrid_shard_group_size", "gradient_checkpointing",
                                                    "logits_chunk_tokens"};
const std::vector<const char*> kPrecisionFlags = {"bf16", "tf32", "mixed_precision_reduce"};
const std::vector<const char*> kLoraFlags = {
    "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save", "use_rslora",
    "adapter_name_or_path", "use_dora", "load_in_4bit", "load_in_8bit", "use_bnb_nested_quant", "bnb_4bit_quant_type",
    "bnb_4bit_quant_storage", "lora_target_parameters", "lora_task_type"};

// Reads the named flags of train's table into `a` (each as llmt train reads it).
void read_named(Flags& f, TrainArgs& a, const std::vector<const char*>& names) {
  for (const char* name : names) {
    const TrainFlag* flag = nullptr;
    for (const TrainFlag& t : train_flags())
      if (std::string(t.name) == name) flag = &t;
    LLMT_CHECK(flag, "internal: --%s is not in the train flag table", name);
    flag->read(f, flag->name, a);
  }
}

void check_parallelism(const ParallelismConfig& a) {
  LLMT_CHECK(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got \"%s\"", a.device.c_str());
  LLMT_CHECK(a.ddp_backend.empty() || a.ddp_backend == "nccl" || a.ddp_backend == "mpi",
             "--ddp_backend must be nccl or mpi, got \"%s\"", a.ddp_backend.c_str());
  LLMT_CHECK(a.ddp_backend != "nccl" || a.device == "cuda", "--ddp_backend nccl needs --device cuda (NCCL moves GPU "
             "memory); the CPU backend uses mpi");
  LLMT_CHECK(std::isfinite(a.ddp_timeout) && a.ddp_timeout > 0, "--ddp_timeout must be a positive number of "
             "seconds, got %g", a.ddp_timeout);
  check_threads(a.threads);
  LLMT_CHECK(a.hybrid_shard_group_size >= 0, "--hybrid_shard_group_size %d: expected 0 (the ranks of a node) or a "
             "positive number of ranks", a.hybrid_shard_group_size);
  LLMT_CHECK(a.logits_chunk_tokens >= 0, "--logits_chunk_tokens %d: expected 0 (the whole micro-batch) or a positive "
             "number of tokens", a.logits_chunk_tokens);
  parse_fsdp(a.fsdp);  // its spelling, before any rank starts work
}

void check_precision(const PrecisionConfig& a) { parse_reduce_dtype(a.mixed_precision_reduce); }

}  // namespace

// Thread counts: 0 means the default, a negative count is an error (--threads -1 was silently 0), and
// more threads than CPUs only slows OpenMP down; a huge count crashes libgomp (100000: SIGSEGV).
void check_threads(int threads) {
  const int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
  LLMT_CHECK(threads >= 0 && threads <= cpus, "--threads %d: expected 0 (the node's cores shared by its ranks) to %d "
             "(this node's CPUs)", threads, cpus);
}

void read_parallelism(Flags& f, ParallelismConfig& part) {
  TrainArgs a;
  static_cast<ParallelismConfig&>(a) = part;
  read_named(f, a, kParallelismFlags);
  check_parallelism(a);
  part = a;
}

// The LoRA flags on their own (llmt train checks the rest of a LoRA run beside the other flags).
static void check_lora(Flags& f, const TrainArgs& a) {
  // they mean nothing without --use_peft (they would be silently ignored)
  for (const char* n : {"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save",
                        "use_rslora", "adapter_name_or_path"})
    LLMT_CHECK(a.use_peft || !f.has(n), "--%s without --use_peft True: nothing would use it", n);
  if (!a.use_peft) return;
  for (const char* n : {"lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save",
                        "use_rslora"})
    LLMT_CHECK(a.adapter_name_or_path.empty() || !f.has(n), "--%s with --adapter_name_or_path: the adapter's "
               "adapter_config.json sets it", n);
  LLMT_CHECK(a.lora_r > 0, "--lora_r %d: expected a positive rank", a.lora_r);
  LLMT_CHECK(std::isfinite(a.lora_alpha) && a.lora_alpha > 0, "--lora_alpha %g: expected a positive value",
             a.lora_alpha);
  LLMT_CHECK(a.lora_dropout >= 0.0 && a.lora_dropout < 1.0, "--lora_dropout %g: expected a value in [0, 1)",
             a.lora_dropout);
}

void read_lora(Flags& f, LoraArgs& part) {
  TrainArgs a;
  static_cast<LoraArgs&>(a) = part;
  read_named(f, a, kLoraFlags);
  check_lora(f, a);
  part = a;
}

void read_precision(Flags& f, PrecisionConfig& part) {
  TrainArgs a;
  static_cast<PrecisionConfig&>(a) = part;
  read_named(f, a, kPrecisionFlags);
  check_precision(a);
  part = a;
}

TrainArgs parse_train_args(Flags& f) {
  TrainArgs a;
  for (const TrainFlag& flag : train_flags()) flag.read(f, flag.name, a);

  check_parallelism(a);
  check_precision(a);
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
  // Optimizer settings up front, with their valid ranges (inf, nan and out-of-range values used to
  // train to NaN, or silently to nothing).
  auto in_range = [](const char* flag, double v, double lo, double hi, bool hi_open) {
    LLMT_CHECK(std::isfinite(v) && v >= lo && (hi_open ? v < hi : v <= hi), "%s %g: expected a value in [%g, %g%s",
               flag, v, lo, hi, hi_open ? ")" : "]");
  };
  in_range("--learning_rate", a.learning_rate, 0.0, 10.0, false);
  in_range("--adam_beta1", a.adam_beta1, 0.0, 1.0, true);
  in_range("--adam_beta2", a.adam_beta2, 0.0, 1.0, true);
  LLMT_CHECK(std::isfinite(a.adam_epsilon) && a.adam_epsilon > 0.0 && a.adam_epsilon <= 1.0,
             "--adam_epsilon %g: expected a value in (0, 1]", a.adam_epsilon);
  in_range("--weight_decay", a.weight_decay, 0.0, 10.0, false);
  in_range("--warmup_ratio", a.warmup_ratio, 0.0, 1.0, false);
  LLMT_CHECK(std::isfinite(a.max_grad_norm), "--max_grad_norm %g: expected a finite value", a.max_grad_norm);
  LLMT_CHECK(a.max_steps != 0 && (a.max_steps > 0 || a.num_train_epochs > 0.0),
             "nothing to train: --max_steps or --num_train_epochs must be positive");
  LLMT_CHECK(a.logging_steps > 0, "--logging_steps must be positive");
  LLMT_CHECK(a.max_grad_norm >= 0.0, "--max_grad_norm must not be negative");
  LLMT_CHECK(a.throughput_warmup_steps >= 0, "--throughput_warmup_steps must not be negative");
  LLMT_CHECK(std::isfinite(a.straggler_threshold) && a.straggler_threshold >= 0,
             "--straggler_threshold %g: expected 0 (never) or a fraction above the median, e.g. 0.15", a.straggler_threshold);
  LLMT_CHECK(a.evaluation_strategy == "no" || a.evaluation_strategy == "steps" || a.evaluation_strategy == "epoch",
             "--evaluation_strategy must be no, steps or epoch, got \"%s\"", a.evaluation_strategy.c_str());
  LLMT_CHECK(a.save_strategy == "no" || a.save_strategy == "steps" || a.save_strategy == "epoch",
             "--save_strategy must be no, steps or epoch, got \"%s\"", a.save_strategy.c_str());
  LLMT_CHECK(a.save_strategy != "steps" || a.save_steps > 0, "--save_steps must be positive");
  LLMT_CHECK(a.save_total_limit >= 0, "--save_total_limit must not be negative");
  check_lora(f, a);
  if (a.use_peft) {
    LLMT_CHECK(!a.model_name_or_path.empty(), "--use_peft trains an adapter on a pretrained model: give "
               "--model_name_or_path (a Hugging Face directory), not --model_config");
  }
  // validate spellings now, before any rank starts work
  make_schedule(a.lr_scheduler_type, 1, a.warmup_steps, a.warmup_ratio, a.lr_scheduler_kwargs, a.learning_rate);
  // torch.optim.AdamW under every name the Trainer gives it (adamw_hf was transformers' own AdamW, the
  // same update with correct_bias=True)
  LLMT_CHECK(a.optim == "adamw_torch" || a.optim == "adamw_torch_fused" || a.optim == "adamw_hf",
             "--optim %s: llmt implements AdamW (adamw_torch, adamw_torch_fused, adamw_hf)", a.optim.c_str());
  LLMT_CHECK(a.logging_strategy == "steps" || a.logging_strategy == "epoch" || a.logging_strategy == "no",
             "--logging_strategy must be steps, epoch or no, got \"%s\"", a.logging_strategy.c_str());
  const int cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
  LLMT_CHECK(a.data.preprocessing_num_workers >= 0 && a.data.preprocessing_num_workers <= cpus,
             "--preprocessing_num_workers %d: expected 0 (the rank's threads) to %d (this node's CPUs)",
             a.data.preprocessing_num_workers, cpus);
  LLMT_CHECK(a.eval_steps >= 0, "--eval_steps %lld: expected 0 (--logging_steps) or a positive number of steps",
             (long long)a.eval_steps);
  // epochs are multiplied into a step count: nan and inf are no number of steps
  LLMT_CHECK(std::isfinite(a.num_train_epochs), "--num_train_epochs %g: expected a finite number of passes",
             a.num_train_epochs);
  LLMT_CHECK(a.data.validation_split_percentage >= 0 && a.data.validation_split_percentage < 100,
             "--validation_split_percentage must lie in [0, 100), got %d", a.data.validation_split_percentage);
  return a;
}

int64_t total_train_steps(const TrainArgs& a, int64_t steps_per_epoch, int64_t global_batch) {
  // The sequences a run consumes, steps x global batch, must stay exact in a double (2^53): the epoch,
  // the sampler's positions and the logs are computed from them. 1e15 epochs used to overflow the
  // step count to -9223372036854775808, train nothing and save the untrained model.
  const double limit = 9007199254740992.0;  // 2^53
  const double steps = a.max_steps > 0 ? (double)a.max_steps : std::ceil(a.num_train_epochs * (double)steps_per_epoch);
  LLMT_CHECK(steps >= 1 && steps * (double)global_batch <= limit,
             "%s: %.4g optimizer steps of %lld sequences each, beyond what llmt can count (at most 2^53 sequences "
             "in a run); give fewer", a.max_steps > 0 ? strformat("--max_steps %lld", (long long)a.max_steps).c_str()
             : strformat("--num_train_epochs %g x %lld steps per epoch", a.num_train_epochs,
                         (long long)steps_per_epoch).c_str(), steps, (long long)global_batch);
  return (int64_t)steps;
}

std::vector<std::string> split_name_list(const std::string& list) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : list + " ") {
    if (c == ' ' || c == ',') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

DType parse_reduce_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return DType::f32;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  fail("--mixed_precision_reduce must be float32 or bfloat16, got \"%s\"", name.c_str());
}

std::string train_help() {
  const TrainArgs defaults;
  std::string s =
      "llmt train: train a GPT-2 or LLaMA model; flags are Hugging Face TrainingArguments names\n"
      "run it alone, or on every rank: mpirun -hostfile H -np N llmt train ... / srun --mpi=pmix llmt train ...\n"
      "flags may come from one config file first: llmt train run.json|run.yaml [--flag value ...] (or --config FILE),\n"
      "its keys the flags' names (learning_rate: 5e-5); flags given after it override its values.\n"
      "give one model (--model_name_or_path or --model_config) and one data source (--data_path, --dataset_name or\n"
      "--train_file); any flag not listed here is an error.\n";
  std::string group;
  for (const TrainFlag& f : train_flags()) {
    if (group != f.group) s += strformat("\n%s:\n", (group = f.group).c_str());
    std::string head = strformat("  --%s %s", f.name, f.value);
    std::string d = f.show ? f.show(defaults) : "";
    if (head.size() >= 44) head += "\n" + std::string(44, ' ');  // a long value list: the help goes below
    s += strformat("%-44s %s%s\n", head.c_str(), f.help, d.empty() ? "" : (" (" + d + ")").c_str());
  }
  return s;
}

std::string train_flags_markdown() {
  const TrainArgs defaults;
  std::string s, group;
  for (const TrainFlag& f : train_flags()) {
    if (group != f.group) {
      s += strformat("%s| %s | | |\n", group.empty() ? "| flag | value (default) | what it does |\n| --- | --- | --- |\n" : "",
                     (group = f.group).c_str());
    }
    std::string d = f.show ? f.show(defaults) : "";
    std::string value = f.value;
    for (size_t i = 0; (i = value.find('|', i)) != std::string::npos; i += 2) value.replace(i, 1, "\\|");
    s += strformat("| `--%s` | %s%s | %s |\n", f.name, value.empty() ? "" : ("`" + value + "`").c_str(),
                   d.empty() ? "" : (" (" + d + ")").c_str(), f.help);
  }
  return s;
}

}  // namespace llmt
