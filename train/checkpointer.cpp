#include "train/checkpointer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "engine/ckpt/checkpoint.h"
#include "engine/dist/agree.h"
#include "engine/ckpt/train_state.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/log.h"
#include "models/hf_checkpoint.h"
#include "train/export.h"

namespace llmt {

std::string Checkpointer::save(int64_t step, const std::vector<nlohmann::json>& log_history, double total_flos,
                               const std::string& model_dtype) {
  const std::string lora_identity = lora_ ? lora_state_identity(world_, *lora_) : "";
  std::string dir = save_checkpoint_dir(s_.output_dir, step, world_, [&](const std::string& tmp) {
    if (lora_)  // PEFT's adapter directory, as the Trainer's checkpoints of a PeftModel
      save_lora(world_, *lora_, tmp, s_.tokenizer_dir);
    else
      write_hf_model(world_, store_, cfg_, layout_, tmp, model_dtype.empty() ? s_.save_dtype : model_dtype,
                     s_.tokenizer_dir, s_.model_dir);
    nlohmann::json scalars = {{"global_step", step},
                              {"seed", s_.seed},
                              {"steps_per_epoch", s_.steps_per_epoch},
                              {"global_batch", s_.global_batch},
                              {"train_data", data_identity_json()}};
    if (!s_.save_only_model && lora_)  // the adapter's state; the frozen base is read again on resume
      save_train_state(tmp + "/state.h5", world_, lora_->layout, *lora_->store, step, scalars.dump(), lora_identity);
    else if (!s_.save_only_model)  // --save_only_model: the model alone, as the Trainer's; nothing to resume from
      save_train_state(tmp + "/state.h5", world_, layout_, store_, step, scalars.dump(),
                       config_to_hf_json(cfg_).dump());
    std::string error;
    if (world_.rank() == 0) try {
        const nlohmann::json ts = trainer_state(step, log_history, total_flos);
        write_file_atomic(tmp + "/trainer_state.json", ts.dump(2) + "\n");
      } catch (const Error& e) {
        error = e.what();
      }
    agree_or_throw(world_, error.empty(), error);
  });
  if (world_.rank() == 0) {
    for (const std::string& gone : apply_save_total_limit(s_.output_dir, s_.save_total_limit, dir))
      log_info("removed %s (--save_total_limit %d)", gone.c_str(), s_.save_total_limit);
    log_info("saved  %s", dir.c_str());
  }
  world_.barrier();
  return dir;
}

nlohmann::json Checkpointer::trainer_state(int64_t step, const std::vector<nlohmann::json>& log_history,
                                           double total_flos) const {
  // No keys of llmt's own: TrainerState(**json) refuses any it does not have. What identifies the
  // model and the data for a resume is in state.h5 (its config and scalars).
  return {{"best_global_step", nullptr},
          {"best_metric", nullptr},
          {"best_model_checkpoint", nullptr},
          {"epoch", (double)step / s_.steps_per_epoch},
          {"eval_steps", s_.eval_steps},
          {"global_step", step},
          {"is_hyper_param_search", false},
          {"is_local_process_zero", true},
          {"is_world_process_zero", true},
          {"log_history", log_history},
          {"logging_steps", s_.logging_steps},
          {"max_steps", s_.max_steps},
          {"num_input_tokens_seen", 0},
          {"num_train_epochs", (s_.max_steps + s_.steps_per_epoch - 1) / s_.steps_per_epoch},
          {"save_steps", s_.save_steps},
          {"stateful_callbacks", nlohmann::json::object()},
          {"total_flos", total_flos},
          {"train_batch_size", s_.train_batch_size},
          {"trial_name", nullptr},
          {"trial_params", nullptr}};
}

Checkpointer::Resumed Checkpointer::resume(const std::string& want, bool ignore_data_skip, int64_t total_steps) {
  Resumed out;
  const std::string ck = resume_path(want);
  if (ck.empty()) return out;
  struct stat sb;
  LLMT_CHECK(::stat((ck + "/state.h5").c_str(), &sb) == 0,
             "%s holds no training state (it was saved with --save_only_model), so it cannot be resumed; start a "
             "new run from its %s with %s %s", ck.c_str(), lora_ ? "adapter" : "weights",
             lora_ ? "--adapter_name_or_path" : "--model_name_or_path", ck.c_str());
  LoadedTrainState st;
  if (lora_) {  // a base other than the one trained on: config_diff names the config key or weight file
    try {
      st = load_train_state(ck + "/state.h5", world_, lora_->layout, *lora_->store, lora_state_identity(world_, *lora_));
    } catch (const Error& e) {  // every rank, together
      fail("%s: resuming the LoRA run (base model --model_name_or_path %s): %s", ck.c_str(),
           lora_->base_dir.c_str(), e.what());
    }
  } else {
    st = load_train_state(ck + "/state.h5", world_, layout_, store_, config_to_hf_json(cfg_).dump());
  }
  out.step = st.global_step;
  if (world_.rank() == 0) {  // the log so far, so trainer_state.json keeps the whole history
    std::ifstream f(ck + "/trainer_state.json", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    check_json_depth(text, ck + "/trainer_state.json");
    nlohmann::json ts = nlohmann::json::parse(text, nullptr, false);
    LLMT_CHECK(ts.is_object() && ts.contains("log_history") && ts["log_history"].is_array(),
               "%s/trainer_state.json is missing or malformed", ck.c_str());
    LLMT_CHECK(!ts.contains("model_config") || config_diff(ts["model_config"].dump(), config_to_hf_json(cfg_).dump()).empty(),
               "%s/trainer_state.json belongs to another model (%s), not this %s", ck.c_str(),
               clip_for_message(ts["model_config"].dump()).c_str(), cfg_.describe().c_str());
    for (auto& rec : ts["log_history"]) out.log_history.push_back(rec);
    if (ts.contains("total_flos") && ts["total_flos"].is_number()) out.total_flos = ts["total_flos"].get<double>();
  }
  world_.barrier();
  nlohmann::json sc = nlohmann::json::parse(st.scalars_json, nullptr, false);
  for (const char* key : {"global_batch", "seed"})  // (sc.value would throw nlohmann's own error on a string)
    LLMT_CHECK(!sc.is_object() || !sc.contains(key) || sc[key].is_number_integer(),
               "%s/state.h5: /meta/scalars \"%s\" is %s, expected an integer", ck.c_str(), key,
               clip_for_message(sc[key].dump()).c_str());
  LLMT_CHECK(sc.is_object() && sc.value("global_batch", s_.global_batch) == s_.global_batch &&
                 sc.value("seed", s_.seed) == s_.seed,
             "%s was trained with a global batch of %lld sequences and --seed %llu; this run has %lld and %llu, so "
             "it would not continue with the same data (keep ranks x per-device batch x accumulation, and the seed)",
             ck.c_str(), (long long)sc.value("global_batch", (int64_t)0), (unsigned long long)sc.value("seed", (uint64_t)0),
             (long long)s_.global_batch, (unsigned long long)s_.seed);
  if (sc.contains("train_data"))  // (older checkpoints lack it)
    check_resumed_data(ck, sc["train_data"], ignore_data_skip, out.step);
  log_info("resume %s: step %lld, Adam step %d; continuing to step %lld", ck.c_str(), (long long)out.step,
           st.adam_step, (long long)total_steps);
  LLMT_CHECK(out.step < total_steps, "%s is at step %lld, and the run ends at step %lld: nothing left to train",
             ck.c_str(), (long long)out.step, (long long)total_steps);
  return out;
}

nlohmann::json Checkpointer::data_identity_json() const {
  return {{"key", s_.data.key},
          {"source", s_.data.source},
          {"block_size", s_.data.block_size},
          {"model_max_length", s_.data.model_max_length},
          {"examples", s_.data.examples},
          {"tokens", s_.data.tokens}};
}

// A resume with other data (another --train_file, --block_size, --model_max_length, tokenizer, or the
// file edited) continued silently at the checkpoint's step of a different order. The token cache key
// decides; the readable fields say what differs. --ignore_data_skip True accepts it.
void Checkpointer::check_resumed_data(const std::string& ck, const nlohmann::json& was, bool ignore_data_skip,
                                      int64_t step) {
  const nlohmann::json now = data_identity_json();
  if (was.is_object() && was.value("key", std::string()) == s_.data.key) return;
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
                    s_.data.key.c_str());
  LLMT_CHECK(ignore_data_skip, "%s was trained on other data: %s. Resuming would continue at step %lld of another "
             "data order; give the checkpoint's data, or --ignore_data_skip True to continue on this data anyway",
             ck.c_str(), diff.c_str(), (long long)step);
  log_info("warning %s was trained on other data: %s; continuing on this data (--ignore_data_skip True)", ck.c_str(),
           diff.c_str());
}

const std::vector<std::string>& Checkpointer::required_files() const {
  return lora_ ? kLoraCheckpointRequiredFiles : kCheckpointRequiredFiles;
}

std::string Checkpointer::kind_problem(const std::string& dir) const {
  struct stat sb;
  const bool adapter = ::stat((dir + "/adapter_config.json").c_str(), &sb) == 0;
  const bool model = ::stat((dir + "/config.json").c_str(), &sb) == 0;
  if (lora_ && !adapter && model)
    return strformat("%s is a checkpoint of a full fine-tune (config.json, no adapter_config.json); a --use_peft run "
                     "resumes a LoRA run's checkpoints only (start a LoRA run on it with --model_name_or_path %s)",
                     dir.c_str(), dir.c_str());
  if (!lora_ && adapter)
    return strformat("%s is a LoRA run's checkpoint (adapter_config.json): resume it with --use_peft True, the same "
                     "LoRA flags and the base model as --model_name_or_path", dir.c_str());
  return "";
}

// The checkpoint `want` names ("latest"/"True": the newest complete one whose checksums verify),
// agreed on every rank; "" when not resuming.
std::string Checkpointer::resume_path(const std::string& want) {
  if (want.empty()) return "";
  if (want != "latest" && want != "True" && want != "true") {
    std::string problem;
    if (world_.rank() == 0) try {
        problem = kind_problem(want);
        if (problem.empty()) verify_checkpoint(want, required_files());
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
    std::vector<CheckpointEntry> all = list_checkpoint_dirs(s_.output_dir);
    std::string latest;
    int failed = 0;
    for (size_t i = all.size(); i-- > 0 && latest.empty();) {
      // a checkpoint of the other kind is no damage: said, and left where it is
      problem = kind_problem(all[i].path);
      if (!problem.empty()) break;
      const std::string why = checkpoint_problem(all[i].path, true, required_files());
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
    if (!problem.empty())
      problem = strformat("--resume_from_checkpoint %s: %s", want.c_str(), problem.c_str());
    else if (latest.empty())
      problem = failed ? strformat("--resume_from_checkpoint %s: %s holds %d checkpoint%s and every one failed its "
                                   "checks (see the warnings above; they were moved aside as *.corrupt)",
                                   want.c_str(), s_.output_dir.c_str(), failed, failed == 1 ? "" : "s")
                       : strformat("--resume_from_checkpoint %s: %s holds no checkpoint", want.c_str(),
                                   s_.output_dir.c_str());
    else
      step = (double)std::stoll(latest.substr(latest.rfind('-') + 1));
  }
  agree_or_throw(world_, problem.empty(), problem);
  step = world_.all_reduce_sum(step);
  return checkpoint_path(s_.output_dir, (int64_t)step);
}

}  // namespace llmt
