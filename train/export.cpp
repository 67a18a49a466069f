#include "train/export.h"

#include <functional>
#include <memory>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/dist/agree.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "models/hf_checkpoint.h"
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

}  // namespace llmt
