#include "train/export.h"

#include <sys/stat.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/dist/agree.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "models/hf_checkpoint.h"
#include "train/session.h"

namespace llmt {

const std::vector<std::string> kCheckpointRequiredFiles = {"config.json", "trainer_state.json"};

void write_hf_model(ControlComm& world, FsdpStore& store, const ModelConfig& cfg, const ModelLayout& L,
                    const std::string& dir, const std::string& dtype, const std::string& tokenizer_dir) {
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
  });
  agree_or_throw(world, error.empty(), error);
}

// `llmt export CKPT CKPT` wrote over the checkpoint's own model.safetensors and config.json, and the
// next resume moved it aside as corrupt. An output directory that is the checkpoint, lies inside a
// checkpoint (or any directory holding a manifest.json), or holds a manifest itself is refused.
static void check_export_target(const std::string& checkpoint_dir, const std::string& out_dir) {
  // the part of out_dir that exists, as the kernel resolves it (links, "..")
  std::string existing = std::filesystem::path(out_dir).lexically_normal().string();
  struct stat st;
  while (!existing.empty() && ::stat(existing.c_str(), &st) != 0) {
    size_t slash = existing.find_last_of('/', existing.size() > 1 ? existing.size() - 2 : 0);
    existing = slash == std::string::npos ? "." : slash == 0 ? "/" : existing.substr(0, slash);
  }
  if (existing.empty()) existing = ".";
  char buf[PATH_MAX];
  const std::string real_out = ::realpath(existing.c_str(), buf) ? buf : existing;
  const std::string real_ck = ::realpath(checkpoint_dir.c_str(), buf) ? buf : checkpoint_dir;
  const bool same = real_out == real_ck && existing == std::filesystem::path(out_dir).lexically_normal().string();
  LLMT_CHECK(real_out != real_ck && real_out.compare(0, real_ck.size() + 1, real_ck + "/") != 0,
             "llmt export: the output directory %s %s the checkpoint %s, whose files it would overwrite: give "
             "another directory", out_dir.c_str(), same ? "is" : "lies inside", checkpoint_dir.c_str());
  for (std::string d = real_out;;) {
    LLMT_CHECK(::stat((d + "/manifest.json").c_str(), &st) != 0,
               "llmt export: %s holds a checkpoint manifest (%s/manifest.json), so %s would write into a checkpoint: "
               "give a directory outside every checkpoint", d == real_out ? out_dir.c_str() : d.c_str(), d.c_str(),
               out_dir.c_str());
    if (d == "/") break;
    size_t slash = d.find_last_of('/');
    d = slash == 0 ? "/" : d.substr(0, slash);
  }
}

void run_export(const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
                ControlComm& world, const LaunchInfo& launch) {
  std::string problem;
  if (world.rank() == 0) try {  // checksums first: never export a damaged state
      check_export_target(checkpoint_dir, out_dir);
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
  write_hf_model(world, *session.store, cfg, L, out_dir, dtype, checkpoint_dir);
  log_info("export %s (step %lld, %s) -> %s: config.json, model.safetensors (%s), tokenizer files", checkpoint_dir.c_str(),
           (long long)st.global_step, cfg.describe().c_str(), out_dir.c_str(), dtype.c_str());
}

}  // namespace llmt
