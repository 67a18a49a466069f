#include "train/export.h"

#include <sys/stat.h>

#include <functional>
#include <memory>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/dist/agree.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "models/hf_checkpoint.h"
#include "models/lora.h"
#include "train/lora_run.h"
#include "train/output_path.h"
#include "train/session.h"

namespace llmt {

const std::vector<std::string> kCheckpointRequiredFiles = {"config.json", "trainer_state.json"};

void write_hf_model(ControlComm& world, FsdpStore& store, const ModelConfig& cfg, const ModelLayout& L,
                    const std::string& dir, const std::string& dtype, const std::string& tokenizer_dir,
                    const std::string& model_dir) {
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
  if (world.rank() == 0) attempt([&] { ex = std::make_unique<HfExporter>(dir, cfg, L, dtype); });
  std::vector<float> host;
  for (size_t u = 0; u < L.units.size(); u++) {
    host.resize((size_t)L.units[u].numel);
    store.get_unit((int)u, host.data());
    if (ex) attempt([&] { ex->write_unit((int)u, host.data()); });
  }
  if (ex) attempt([&] {
    ex->finish();
    if (!tokenizer_dir.empty()) copy_tokenizer_files(tokenizer_dir, dir);
    write_generation_config(model_dir, dir, cfg);
  });
  agree_or_throw(world, error.empty(), error);
}

void run_export(const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
                ControlComm& world, const LaunchInfo& launch) {
  std::string problem;
  if (world.rank() == 0) try {  // checksums first: never export a damaged state
      // `llmt export CKPT CKPT` wrote over the checkpoint's own files, and the next resume moved it aside
      check_output_path("llmt export", {"OUT_DIR", out_dir}, OutputKind::directory,
                        {{"CHECKPOINT_DIR", checkpoint_dir}});
      struct stat st;
      LLMT_CHECK(::stat((checkpoint_dir + "/adapter_config.json").c_str(), &st) != 0, "llmt export: %s is a LoRA run's "
                 "checkpoint (an adapter, not a model): write the merged model with --merge_adapter True, or use it "
                 "as PEFT's adapter directory", checkpoint_dir.c_str());
      std::vector<std::string> required = kCheckpointRequiredFiles;
      required.push_back("state.h5");  // the exact weights it exports
      verify_checkpoint(checkpoint_dir, required);
    } catch (const Error& e) {
      problem = e.what();
    }
  agree_or_throw(world, problem.empty(), problem);
  ModelConfig cfg = config_from_json_file(checkpoint_dir + "/config.json");
  SessionSettings ss;  // the store alone (no activations), on the CPU, sharded over every rank
  ss.strategy = Strategy::full_shard;
  ss.shard_group_size = world.size();
  Session session = make_session(world, launch, ss, cfg);
  const ModelLayout& L = session.layout();
  LoadedTrainState st =
      load_train_state(checkpoint_dir + "/state.h5", world, L, *session.store, config_to_hf_json(cfg).dump());
  write_hf_model(world, *session.store, cfg, L, out_dir, dtype, checkpoint_dir, checkpoint_dir);
  log_info("export %s (step %lld, %s) -> %s: config.json, model.safetensors (%s), tokenizer files", checkpoint_dir.c_str(),
           (long long)st.global_step, cfg.describe().c_str(), out_dir.c_str(), dtype.c_str());
}

void run_merge_adapter_export(const std::string& src, const std::string& base_flag, const std::string& out_dir,
                              const std::string& dtype, ControlComm& world) {
  LLMT_CHECK(world.size() == 1, "llmt export --merge_adapter runs as one process (%d were started): run it without "
             "mpirun or srun", world.size());
  struct stat st;
  auto exists = [&](const std::string& p) { return ::stat(p.c_str(), &st) == 0; };
  const bool checkpoint = exists(src + "/manifest.json");
  LLMT_CHECK(exists(src + "/adapter_config.json"), "llmt export --merge_adapter: %s has no adapter_config.json; it "
             "merges a PEFT adapter directory or a LoRA run's checkpoint%s", src.c_str(),
             exists(src + "/config.json") ? " (this is a whole model: export it without --merge_adapter)" : "");
  if (checkpoint) verify_checkpoint(src, kLoraCheckpointRequiredFiles);  // never merge a damaged adapter
  const LoraConfig lora = read_adapter_config(src + "/adapter_config.json");
  std::string base = base_flag;
  if (base.empty()) {  // as PeftModel / AutoPeftModelForCausalLM.from_pretrained find the base
    LLMT_CHECK(!lora.base_model_name_or_path.empty(), "llmt export --merge_adapter: %s/adapter_config.json names no "
               "base_model_name_or_path; give the base model's directory with --model_name_or_path", src.c_str());
    LLMT_CHECK(exists(lora.base_model_name_or_path) && S_ISDIR(st.st_mode), "llmt export --merge_adapter: %s/"
               "adapter_config.json's base_model_name_or_path %s is not a directory here (llmt reads no hub ids); give "
               "the base model's directory with --model_name_or_path", src.c_str(),
               lora.base_model_name_or_path.c_str());
    base = lora.base_model_name_or_path;
  }
  check_output_path("llmt export", {"OUT_DIR", out_dir}, OutputKind::directory,
                    {{"ADAPTER_DIR", src}, {"--model_name_or_path", base}});
  const ModelConfig base_cfg = resolve_model_config(base);
  LoraLayout AL;
  SafetensorsFile file(src + "/adapter_model.safetensors");
  try {
    AL = make_lora_layout(base_cfg, lora);
    check_adapter_tensors(file, AL);
  } catch (const Error& e) {
    fail("llmt export --merge_adapter: the adapter %s does not fit the base model %s (%s): %s", src.c_str(),
         base.c_str(), base_cfg.describe().c_str(), e.what());
  }
  if (checkpoint && exists(src + "/state.h5")) {  // the base it was trained on, as a resume checks it
    LoraRun run;
    run.config = lora;
    run.base_config = base_cfg;
    run.base_dir = base;
    const std::string diff = config_diff(read_train_state_config(src + "/state.h5"), lora_state_identity(world, run));
    LLMT_CHECK(diff.empty(), "llmt export --merge_adapter: %s was trained on another base model than %s: %s", src.c_str(),
               base.c_str(), diff.c_str());
  }
  const ModelLayout BL = make_layout(base_cfg);
  SafetensorsCheckpoint ckpt(base);
  check_hf_tensors(ckpt, base_cfg, BL, base);
  const ModelConfig cfg = merged_model_config(base_cfg, AL);
  const ModelLayout L = make_layout(cfg);
  {
    HfExporter ex(out_dir, cfg, L, dtype);
    std::vector<float> host;
    for (size_t u = 0; u < L.units.size(); u++) {
      host.resize((size_t)L.units[u].numel);
      load_merged_unit(ckpt, base_cfg, BL, file, AL, lora.scaling(), L, (int)u, host.data());
      ex.write_unit((int)u, host.data());
    }
    ex.finish();
  }
  // the tokenizer the adapter was trained with (a run's output_dir and checkpoints carry it), else the base's
  if (copy_tokenizer_files(src, out_dir) == 0) copy_tokenizer_files(base, out_dir);
  write_generation_config(base, out_dir, cfg);
  log_info("export %s merged into %s (r %d, alpha %g, %zu projections a block%s) -> %s: config.json, "
           "model.safetensors (%s)%s", src.c_str(), base.c_str(), lora.r, lora.alpha, AL.slots.size(),
           AL.saved.empty() ? "" : ", modules_to_save", out_dir.c_str(), dtype.c_str(),
           cfg.tied_embeddings == base_cfg.tied_embeddings ? "" : "; the modules_to_save copy unties the base's tied lm_head "
           "(tie_word_embeddings false)");
}

}  // namespace llmt
