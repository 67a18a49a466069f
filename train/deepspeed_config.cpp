#include "train/deepspeed_config.h"

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"  // read_file
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/log.h"
#include "engine/fsdp/fsdp.h"

namespace llmt {

namespace {

using nlohmann::json;

class DeepSpeedReader {
 public:
  DeepSpeedReader(const std::string& what, const std::function<bool(const char*)>& given, TrainArgs& a)
      : what_(what), given_(given), a_(a) {}

  void read(const json& ds);
  std::string summary() const;

 private:
  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }
  [[noreturn]] void refuse(const std::string& field, const std::string& why) const {
    fail("--deepspeed %s: %s: %s", what_.c_str(), field.c_str(), why.c_str());
  }
  double number(const std::string& field, const json& v) const {
    if (!v.is_number()) refuse(field, "expected a number or \"auto\", got " + clip_for_message(v.dump()));
    return v.get<double>();
  }
  int64_t integer(const std::string& field, const json& v) const {
    const double x = number(field, v);
    if (x != std::floor(x) || std::fabs(x) > 1e15) refuse(field, "expected a whole number, got " + v.dump());
    return (int64_t)x;
  }
  bool boolean(const std::string& field, const json& v) const {
    if (!v.is_boolean()) refuse(field, "expected true, false or \"auto\", got " + clip_for_message(v.dump()));
    return v.get<bool>();
  }
  // A field whose value sets a flag: "auto" keeps the flag's; a flag given with another value is refused.
  template <class T>
  void map(const std::string& field, const json& v, const char* flag, T& member, T value, const std::string& shown) {
    if (given_(flag) && member != value)
      refuse(field, strformat("%s, but --%s is %s; give one of them (or write \"auto\" in the file to take the "
                              "flag's)", shown.c_str(), flag, show(member).c_str()));
    auto earlier = set_by_.find(flag);  // two fields of the file for one flag (lr and warmup_max_lr)
    if (earlier != set_by_.end() && member != value)
      refuse(field, strformat("%s, but %s gave --%s %s", shown.c_str(), earlier->second.c_str(), flag,
                              show(member).c_str()));
    set_by_[flag] = field;
    member = value;
    taken_ += strformat("%s%s %s -> --%s %s", taken_.empty() ? "" : "; ", field.c_str(), clip_for_message(v.dump()).c_str(),
                        flag, shown.c_str());
  }
  void automatic(const std::string& field, const char* flag, const std::string& value) {
    taken_ += strformat("%s%s auto -> --%s %s", taken_.empty() ? "" : "; ", field.c_str(), flag, value.c_str());
  }
  static std::string show(const std::string& s) { return "\"" + s + "\""; }
  static std::string show(double x) { return strformat("%g", x); }
  static std::string show(int x) { return std::to_string(x); }
  static std::string show(int64_t x) { return std::to_string(x); }
  static std::string show(bool x) { return x ? "True" : "False"; }
  void unused(const std::string& field) { unused_ += (unused_.empty() ? "" : ", ") + field; }

  void read_zero(const json& z);
  void read_precision(const std::string& key, const json& v);
  void read_optimizer(const json& o);
  void read_scheduler(const json& s);

  std::string what_;
  const std::function<bool(const char*)>& given_;
  TrainArgs& a_;
  std::string taken_, unused_;
  std::map<std::string, std::string> set_by_;  // flag -> the file's field that set it
  bool has_scheduler_ = false;
};

// The knobs that tune how DeepSpeed moves and buckets data, not what the step computes: llmt schedules
// its own gathers and reduce-scatters (one unit at a time, one prefetched), so they have nothing to set.
const char* const kZeroTuning[] = {
    "overlap_comm", "contiguous_gradients", "reduce_bucket_size", "allgather_bucket_size", "allgather_partitions",
    "reduce_scatter", "round_robin_gradients", "sub_group_size", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save", "memory_efficient_linear",
    "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters", "use_multi_rank_bucket_allreduce",
    "stage3_module_granularity_threshold", "log_trace_cache_warnings"};
// Top-level fields that only log, profile or tune DeepSpeed itself.
const char* const kTopTuning[] = {"steps_per_print", "wall_clock_breakdown", "dump_state", "memory_breakdown",
                                  "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger",
                                  "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "prescale_gradients",
                                  "gradient_predivide_factor", "activation_checkpointing", "data_types"};

bool listed(const char* const* list, size_t n, const std::string& key) {
  for (size_t i = 0; i < n; i++)
    if (key == list[i]) return true;
  return false;
}

void DeepSpeedReader::read(const json& ds) {
  if (!ds.is_object()) refuse("the file", std::string("expected a JSON object, got ") + ds.type_name());
  for (auto& [key, v] : ds.items()) {
    if (key == "zero_optimization") read_zero(v);
    else if (key == "bf16" || key == "bfloat16" || key == "fp16" || key == "amp") read_precision(key, v);
    else if (key == "optimizer") read_optimizer(v);
    else if (key == "scheduler") read_scheduler(v);
    else if (key == "train_micro_batch_size_per_gpu") {
      if (is_auto(v)) automatic(key, "per_device_train_batch_size", show(a_.per_device_train_batch_size));
      else map(key, v, "per_device_train_batch_size", a_.per_device_train_batch_size, (int)integer(key, v),
               show((int)integer(key, v)));
    } else if (key == "gradient_accumulation_steps") {
      if (is_auto(v)) automatic(key, "gradient_accumulation_steps", show(a_.gradient_accumulation_steps));
      else map(key, v, "gradient_accumulation_steps", a_.gradient_accumulation_steps, (int)integer(key, v),
               show((int)integer(key, v)));
    } else if (key == "gradient_clipping") {
      if (is_auto(v)) automatic(key, "max_grad_norm", show(a_.max_grad_norm));
      else map(key, v, "max_grad_norm", a_.max_grad_norm, number(key, v), show(number(key, v)));
    } else if (key == "train_batch_size") {
      if (is_auto(v)) {
        taken_ += strformat("%s%s auto (ranks x micro-batch x accumulation)", taken_.empty() ? "" : "; ", key.c_str());
      } else {
        a_.deepspeed_train_batch_size = integer(key, v);
        if (a_.deepspeed_train_batch_size <= 0) refuse(key, "expected a positive number of sequences");
        taken_ += strformat("%s%s %lld (checked: ranks x micro-batch x accumulation)", taken_.empty() ? "" : "; ",
                            key.c_str(), (long long)a_.deepspeed_train_batch_size);
      }
    } else if (key == "communication_data_type") {
      const std::string t = v.is_string() ? v.get<std::string>() : "";
      if (t == "fp32" || t == "float32" || t == "bf16" || t == "bfloat16") {
        std::string name = t == "fp32" || t == "float32" ? "float32" : "bfloat16";
        map(key, v, "mixed_precision_reduce", a_.mixed_precision_reduce, name, name);
      } else {
        refuse(key, "llmt reduces gradients in fp32 or bf16 (\"fp32\", \"bf16\"), got " + clip_for_message(v.dump()));
      }
    } else if (key == "prescale_gradients" && v != json(false)) {
      refuse(key, "llmt divides the summed gradients once, after the reduction; write false");
    } else if (key == "gradient_predivide_factor" && !(v.is_number() && v.get<double>() == 1.0)) {
      refuse(key, "llmt divides the summed gradients once, after the reduction; write 1.0");
    } else if (key == "activation_checkpointing" && v.is_object() &&
               (v.value("cpu_checkpointing", false) || v.value("partition_activations", false))) {
      refuse(key + ".cpu_checkpointing/partition_activations",
             "llmt keeps checkpointed activations on the device, unpartitioned; use --gradient_checkpointing True");
    } else if (key == "data_types" && v.is_object() && v.contains("grad_accum_dtype") &&
               v["grad_accum_dtype"] != json("fp32")) {
      refuse(key + ".grad_accum_dtype", "llmt accumulates gradients in fp32; write \"fp32\"");
    } else if (listed(kTopTuning, std::size(kTopTuning), key)) {
      unused(key);
    } else {
      refuse(key, "not a field llmt knows how to honour, so the run would not be the one it describes; remove it "
                  "or give the equivalent llmt flag (llmt train --help)");
    }
  }
  if (!ds.contains("zero_optimization")) {  // DeepSpeed's default stage is 0: data parallel
    json zero = {{"stage", 0}};
    read_zero(zero);
  }
}

void DeepSpeedReader::read_zero(const json& z) {
  if (!z.is_object()) refuse("zero_optimization", "expected an object");
  const json stage = z.value("stage", json(0));
  const int64_t s = is_auto(stage) ? -1 : integer("zero_optimization.stage", stage);
  if (s < 0 || s > 3) refuse("zero_optimization.stage", "expected 0, 1, 2 or 3, got " + stage.dump());
  const char* fsdp = s == 3 ? "full_shard auto_wrap" : s >= 1 ? "shard_grad_op" : "no_shard";
  if (given_("fsdp") && parse_fsdp(a_.fsdp) != parse_fsdp(fsdp))
    refuse("zero_optimization.stage", strformat("%lld is --fsdp \"%s\", but --fsdp is \"%s\"; give one of them",
                                                (long long)s, fsdp, a_.fsdp.c_str()));
  if (!given_("fsdp")) a_.fsdp = fsdp;
  taken_ += strformat("%szero_optimization.stage %lld -> --fsdp \"%s\"%s", taken_.empty() ? "" : "; ", (long long)s,
                      a_.fsdp.c_str(), s == 1 ? " (ZeRO-1 shards only optimizer state; shard_grad_op shards the "
                      "gradients too: the same updates in less memory)" : "");
  for (auto& [key, v] : z.items()) {
    const std::string field = "zero_optimization." + key;
    if (key == "stage") continue;
    if (key == "offload_param" || key == "offload_optimizer") {
      const std::string device = v.is_object() ? v.value("device", std::string("none")) : "";
      if (device != "none")
        refuse(field, "llmt keeps parameters and optimizer state on the rank's device, sharded over the ranks, with "
                      "no offload to CPU or NVMe; remove it (llmt plan shows the memory each rank needs)");
      continue;
    }
    if (key == "cpu_offload" && v == json(false)) continue;
    if (listed(kZeroTuning, std::size(kZeroTuning), key)) {
      unused(field);
      continue;
    }
    refuse(field, key == "cpu_offload" ? "llmt has no CPU offload" :
           key.find("zero_quantized") == 0 || key == "zero_hpz_partition_size" || key == "mics_shard_size"
               ? "ZeRO++ / MiCS are not implemented; for sharding inside a node, --fsdp hybrid_shard"
               : "not a ZeRO option llmt knows how to honour; remove it");
  }
}

void DeepSpeedReader::read_precision(const std::string& key, const json& v) {
  if (!v.is_object()) refuse(key, "expected an object with \"enabled\"");
  const json enabled = v.value("enabled", json(false));
  if (key == "bf16" || key == "bfloat16") {
    if (is_auto(enabled)) automatic(key + ".enabled", "bf16", show(a_.bf16));
    else map(key + ".enabled", enabled, "bf16", a_.bf16, boolean(key + ".enabled", enabled), show(boolean(key + ".enabled", enabled)));
    for (auto& [k, x] : v.items())
      if (k != "enabled") {
        if (k == "immediate_grad_update" || k == "check_grad_overflow") unused(key + "." + k);
        else refuse(key + "." + k, "not a bf16 option llmt knows how to honour; remove it");
      }
    return;
  }
  // fp16 and amp: "auto" follows --fp16, which llmt refuses when True; enabled true is refused here
  if (!is_auto(enabled) && boolean(key + ".enabled", enabled))
    refuse(key + ".enabled", "llmt has no fp16 training (it needs loss scaling); use bf16: {\"enabled\": true}, "
                             "which keeps fp32 master weights and needs none");
  unused(key + " (disabled)");
}

void DeepSpeedReader::read_optimizer(const json& o) {
  if (!o.is_object()) refuse("optimizer", "expected an object with \"type\" and \"params\"");
  const std::string type = o.value("type", std::string());
  const json params = o.value("params", json::object());
  const bool adamw = type == "AdamW" || type == "adamw" ||
                     ((type == "Adam" || type == "adam" || type == "FusedAdam") && params.value("adam_w_mode", true));
  if (!adamw)
    refuse("optimizer.type", "llmt implements AdamW (type AdamW, or Adam with adam_w_mode true); got " +
                             clip_for_message(o.value("type", json()).dump()));
  for (auto& [k, v] : o.items())
    if (k != "type" && k != "params") refuse("optimizer." + k, "not an optimizer field llmt knows; remove it");
  for (auto& [k, v] : params.items()) {
    const std::string field = "optimizer.params." + k;
    if (k == "lr") {
      if (is_auto(v)) automatic(field, "learning_rate", show(a_.learning_rate));
      else map(field, v, "learning_rate", a_.learning_rate, number(field, v), show(number(field, v)));
    } else if (k == "eps") {
      if (is_auto(v)) automatic(field, "adam_epsilon", show(a_.adam_epsilon));
      else map(field, v, "adam_epsilon", a_.adam_epsilon, number(field, v), show(number(field, v)));
    } else if (k == "weight_decay") {
      if (is_auto(v)) automatic(field, "weight_decay", show(a_.weight_decay));
      else map(field, v, "weight_decay", a_.weight_decay, number(field, v), show(number(field, v)));
    } else if (k == "betas") {
      if (is_auto(v)) {
        automatic(field, "adam_beta1/2", show(a_.adam_beta1) + ", " + show(a_.adam_beta2));
        continue;
      }
      if (!v.is_array() || v.size() != 2) refuse(field, "expected [beta1, beta2] or \"auto\"");
      map(field, v[0], "adam_beta1", a_.adam_beta1, number(field, v[0]), show(number(field, v[0])));
      map(field, v[1], "adam_beta2", a_.adam_beta2, number(field, v[1]), show(number(field, v[1])));
    } else if (k == "adam_w_mode" || k == "torch_adam" || k == "fused") {
      continue;  // adam_w_mode decided the type above; the others pick DeepSpeed's kernel
    } else if ((k == "bias_correction" && v == json(true)) || (k == "amsgrad" && v == json(false))) {
      continue;
    } else {
      refuse(field, "llmt's AdamW has no such setting (bias correction on, no amsgrad); remove it");
    }
  }
  if (a_.weight_decay > 0)
    log_info("note   --deepspeed %s: weight decay as the Trainer applies it, not on biases and norm weights "
             "(DeepSpeed's own optimizer would decay every parameter)", what_.c_str());
}

void DeepSpeedReader::read_scheduler(const json& s) {
  if (!s.is_object()) refuse("scheduler", "expected an object with \"type\" and \"params\"");
  const std::string type = s.value("type", std::string());
  const char* sched = type == "WarmupLR" ? "constant_with_warmup" : type == "WarmupDecayLR" ? "linear" : nullptr;
  if (!sched)
    refuse("scheduler.type", strformat("llmt follows WarmupLR (constant_with_warmup) and WarmupDecayLR (linear); "
                                       "for %s, remove the scheduler and give --lr_scheduler_type (cosine, "
                                       "polynomial, ...)", clip_for_message(s.value("type", json()).dump()).c_str()));
  has_scheduler_ = true;
  map("scheduler.type", json(type), "lr_scheduler_type", a_.lr_scheduler_type, std::string(sched), show(std::string(sched)));
  const json params = s.value("params", json::object());
  bool warms_up = given_("warmup_steps") ? a_.warmup_steps > 0 : a_.warmup_steps > 0 || a_.warmup_ratio > 0;
  for (auto& [k, v] : params.items()) {
    const std::string field = "scheduler.params." + k;
    if (k == "warmup_min_lr") {
      if (!is_auto(v) && number(field, v) != 0.0)
        refuse(field, "llmt's schedules warm up from 0 (the Trainer's); write 0 or \"auto\"");
    } else if (k == "warmup_max_lr") {
      if (is_auto(v)) automatic(field, "learning_rate", show(a_.learning_rate));
      else map(field, v, "learning_rate", a_.learning_rate, number(field, v), show(number(field, v)));
    } else if (k == "warmup_num_steps") {
      if (is_auto(v)) {
        automatic(field, "warmup_steps", given_("warmup_steps") || a_.warmup_ratio == 0 ? show(a_.warmup_steps)
                                                                                       : "from --warmup_ratio");
      } else {
        map(field, v, "warmup_steps", a_.warmup_steps, integer(field, v), show(integer(field, v)));
        warms_up = a_.warmup_steps > 0;
      }
    } else if (k == "total_num_steps") {
      if (!is_auto(v) && (a_.max_steps <= 0 || integer(field, v) != a_.max_steps))
        refuse(field, strformat("%s, but the run's steps are %s; write \"auto\" (the run's steps) or give --max_steps "
                                "%s", v.dump().c_str(), a_.max_steps > 0 ? show(a_.max_steps).c_str()
                                : "counted from --num_train_epochs", v.dump().c_str()));
    } else if (k == "warmup_type") {
      if (v != json("linear") && warms_up)
        refuse(field, "llmt warms up linearly; write \"linear\"");
    } else {
      refuse(field, "not a scheduler setting llmt knows; remove it");
    }
  }
  // DeepSpeed's warm-up is logarithmic unless warmup_type says linear
  if (warms_up && !params.contains("warmup_type"))
    refuse("scheduler.params.warmup_type", "absent, so DeepSpeed would warm up logarithmically; llmt warms up "
                                           "linearly: write \"warmup_type\": \"linear\"");
}

std::string DeepSpeedReader::summary() const {
  return strformat("deepspeed %s: %s%s%s", what_.c_str(), taken_.c_str(), unused_.empty() ? "" : "; not used: ",
                   unused_.c_str());
}

}  // namespace

void apply_deepspeed_config(const std::string& text, const std::string& what,
                            const std::function<bool(const char*)>& given, TrainArgs& a) {
  check_json_depth(text, "--deepspeed " + what);
  const json ds = json::parse(text, nullptr, false);
  LLMT_CHECK(!ds.is_discarded(), "--deepspeed %s: not valid JSON", what.c_str());
  DeepSpeedReader r(what, given, a);
  r.read(ds);
  a.deepspeed_summary = r.summary();
}

void read_deepspeed_flag(const std::string& value, const std::function<bool(const char*)>& given, TrainArgs& a) {
  if (value.empty()) return;
  const bool inline_json = value[0] == '{';
  apply_deepspeed_config(inline_json ? value : read_file(value, "DeepSpeed config"), inline_json ? "(inline)" : value,
                         given, a);
}

}  // namespace llmt
