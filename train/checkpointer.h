// The trainer's checkpoints: output_dir/checkpoint-<step> saved (the Hugging Face export, the exact
// training state, trainer_state.json) with --save_total_limit's retention, and a run resumed from
// one (--resume_from_checkpoint: which one, corrupt ones moved aside, the checks that it continues
// the same run). The directory format itself is engine/ckpt/checkpoint.h.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/dataset.h"
#include "engine/dist/communicator.h"
#include "engine/fsdp/fsdp.h"
#include "models/config.h"
#include "models/layout.h"
#include "train/lora_run.h"

namespace llmt {

struct CheckpointSettings {
  std::string output_dir;
  int save_total_limit = 0;        // 0 = keep every checkpoint
  bool save_only_model = false;    // no state.h5: nothing to resume from
  std::string save_dtype = "F32";  // the Hugging Face export's dtype
  std::string tokenizer_dir;       // its files copied into each checkpoint ("" for none)
  std::string model_dir;           // its generation_config.json copied into each checkpoint ("" for none)
  // what fixes the data order, recorded and compared on resume
  uint64_t seed = 42;
  int64_t steps_per_epoch = 1, global_batch = 1;
  DataIdentity data;
  // recorded in trainer_state.json as the Hugging Face Trainer does (max_steps: the run's steps)
  int64_t max_steps = -1, save_steps = 0, eval_steps = 0;
  int logging_steps = 0, train_batch_size = 0;
};

class Checkpointer {
 public:
  // lora: a LoRA run (--use_peft), whose checkpoints hold the adapter (PEFT's adapter directory, and
  // the adapter store's state in state.h5 with lora_state_identity as its config) instead of the
  // frozen model, which a resume reads again from --model_name_or_path.
  Checkpointer(ControlComm& world, const CheckpointSettings& s, const ModelConfig& cfg, const ModelLayout& layout,
               FsdpStore& store, LoraRun* lora = nullptr)
      : world_(world), s_(s), cfg_(cfg), layout_(layout), store_(store), lora_(lora) {}

  // Collective: output_dir/checkpoint-<step>, written under a temporary name, checksummed and
  // renamed (complete or absent), with `log_history` in its trainer_state.json; then the oldest
  // beyond save_total_limit are removed. Returns its path. model_dtype: its Hugging Face model's
  // dtype ("" = save_dtype).
  // total_flos: the run's floating-point operations so far (trainer_state.json's, over every rank).
  std::string save(int64_t step, const std::vector<nlohmann::json>& log_history, double total_flos,
                   const std::string& model_dtype = "");

  struct Resumed {
    int64_t step = 0;                        // the checkpoint's step (0: not resuming)
    std::vector<nlohmann::json> log_history;  // its records (rank 0)
    double total_flos = 0.0;                  // its trainer_state.json's (rank 0)
  };
  // Collective: --resume_from_checkpoint `want` (a directory, or "latest"/"True": the newest whose
  // checksums verify; "" = not resuming) loaded into the store, after checking it continues this
  // run (model, global batch, seed, data unless ignore_data_skip) and has steps left before
  // total_steps.
  Resumed resume(const std::string& want, bool ignore_data_skip, int64_t total_steps);
  const CheckpointSettings& settings() const { return s_; }
  // trainer_state.json at `step`, as transformers' TrainerState writes it (TrainerState.load_from_json
  // reads it: its fields only, no others), with `log_history`.
  nlohmann::json trainer_state(int64_t step, const std::vector<nlohmann::json>& log_history, double total_flos) const;

 private:
  std::string resume_path(const std::string& want);
  nlohmann::json data_identity_json() const;
  // The files this run's checkpoints always hold (a LoRA run's are PEFT's, a full fine-tune's the model's).
  const std::vector<std::string>& required_files() const;
  // "" when checkpoint `dir` is of this run's kind (LoRA or full), else why it cannot be resumed.
  std::string kind_problem(const std::string& dir) const;
  void check_resumed_data(const std::string& ck, const nlohmann::json& recorded, bool ignore_data_skip,
                          int64_t step);

  ControlComm& world_;
  const CheckpointSettings s_;
  const ModelConfig& cfg_;
  const ModelLayout& layout_;
  FsdpStore& store_;
  LoraRun* lora_;
};

}  // namespace llmt
