#include "train/lora_run.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "engine/ckpt/checkpoint.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/agree.h"
#include "engine/formats/safetensors.h"
#include "models/hf_checkpoint.h"

namespace llmt {

const std::vector<std::string> kLoraCheckpointRequiredFiles = {"adapter_config.json", "adapter_model.safetensors",
                                                               "trainer_state.json"};

LoraConfig lora_config_from_args(const LoraArgs& a, const ModelConfig& cfg) {
  LoraConfig c;
  c.r = a.lora_r;
  c.alpha = a.lora_alpha;
  c.dropout = a.lora_dropout;
  c.rslora = a.use_rslora;
  std::vector<std::string> targets = split_name_list(a.lora_target_modules);
  if (targets.empty())  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING for the families llmt trains
    targets = cfg.arch == Arch::gpt2 ? std::vector<std::string>{"c_attn"} : std::vector<std::string>{"q_proj", "v_proj"};
  else if (targets.size() == 1 && targets[0] != "all-linear")  // TRL's ModelConfig: one entry is a string
    c.target_regex = targets[0];
  if (c.target_regex.empty()) c.target_modules = targets;
  c.modules_to_save = split_name_list(a.lora_modules_to_save);
  return c;
}

LoraConfig lora_run_config(const LoraArgs& a, const ModelConfig& cfg) {
  const bool from_dir = !a.adapter_name_or_path.empty();
  LoraConfig c = from_dir ? read_adapter_config(a.adapter_name_or_path + "/adapter_config.json")
                          : lora_config_from_args(a, cfg);
  try {
    return resolve_lora_config(c, cfg);
  } catch (const Error& e) {
    if (from_dir || c.target_regex.empty()) throw;
    fail("--lora_target_modules %s: TRL hands PEFT a one-entry list as a string, a regular expression the whole "
         "module path must match (as model.layers.0.self_attn.q_proj): write .*%s, or name two or more modules (%s)",
         c.target_regex.c_str(), c.target_regex.c_str(), e.what());
  }
}

std::unique_ptr<LoraRun> start_lora(const TrainArgs& a, Session& session, const ModelConfig& cfg) {
  LLMT_CHECK(session.model && session.store->frozen(), "LoRA needs a session with a model and a frozen store");
  auto run = std::make_unique<LoraRun>();
  const bool from_dir = !a.adapter_name_or_path.empty();
  run->config = lora_run_config(a, cfg);
  run->config.base_model_name_or_path = a.model_name_or_path;  // recorded in adapter_config.json
  run->base_config = cfg;
  run->base_dir = a.model_name_or_path;
  run->layout = make_lora_layout(cfg, run->config);
  Backend& be = *session.backend;
  run->store = std::make_unique<FsdpStore>(be, run->layout, session.store->strategy(), *session.data,
                                           session.shard_group, session.store->reduce_dtype());
  std::unique_ptr<SafetensorsFile> file;
  if (from_dir) {
    file = std::make_unique<SafetensorsFile>(a.adapter_name_or_path + "/adapter_model.safetensors");
    check_adapter_tensors(*file, run->layout);
  }
  const ModelLayout& base = session.model->layout();
  std::vector<float> base_root;
  if (!from_dir && !run->layout.saved.empty()) {  // modules_to_save start as copies of the base's tensors
    base_root.resize((size_t)base.units[0].numel);
    session.store->get_unit(0, base_root.data());
  }
  std::vector<float> host;
  for (size_t u = 0; u < run->layout.units.size(); u++) {
    host.assign((size_t)run->layout.units[u].numel, 0.0f);
    if (file) load_adapter_unit(*file, run->layout, (int)u, host.data());
    else init_lora_unit(run->layout, (int)u, a.seed, base, base_root.data(), host.data());
    run->store->set_unit((int)u, host.data());
  }
  run->hook = std::make_unique<LoraAdapters>(cfg, run->config, run->layout, be, *run->store,
                                             session.model->batch(), session.model->seq_len());
  session.model->set_adapters(run->hook.get());
  return run;
}

void save_lora(ControlComm& world, LoraRun& run, const std::string& dir, const std::string& tokenizer_dir) {
  std::vector<std::vector<float>> units(run.layout.units.size());
  for (size_t u = 0; u < units.size(); u++) {
    units[u].resize((size_t)run.layout.units[u].numel);
    run.store->get_unit((int)u, units[u].data());  // collective over the shard group
  }
  std::string error;
  if (world.rank() == 0) try {
      std::vector<const float*> ptrs;
      for (auto& u : units) ptrs.push_back(u.data());
      save_adapter(dir, run.config, run.layout, ptrs);
      if (!tokenizer_dir.empty()) copy_tokenizer_files(tokenizer_dir, dir);
    } catch (const std::exception& e) {  // any failure (a JSON dump of a bad path too): every rank must hear
      error = e.what();
    }
  agree_or_throw(world, error.empty(), error);
}

const std::string& lora_state_identity(ControlComm& world, LoraRun& run) {
  if (!run.identity.empty()) return run.identity;
  nlohmann::json id = config_to_hf_json(run.base_config);
  nlohmann::json peft = adapter_config_json(run.config, run.base_config.arch == Arch::gpt2);
  peft.erase("base_model_name_or_path");
  peft.erase("inference_mode");
  for (auto it = peft.begin(); it != peft.end(); ++it) id["lora " + it.key()] = it.value();
  // the weight files' CRC-32C, every rank hashing a share (crc32c_files_over_ranks)
  std::vector<std::string> files;
  std::vector<int64_t> sizes;
  std::string error;
  try {
    files = SafetensorsCheckpoint(run.base_dir).file_paths();
    for (const std::string& f : files) {
      struct stat st;
      LLMT_CHECK(::stat(f.c_str(), &st) == 0, "%s: cannot stat: %s", f.c_str(), std::strerror(errno));
      sizes.push_back((int64_t)st.st_size);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  agree_or_throw(world, error.empty(), error);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uint32_t> crcs = crc32c_files_over_ranks(world, files, sizes);
  for (size_t i = 0; i < files.size(); i++) {
    const size_t slash = files[i].rfind('/');
    const std::string name = slash == std::string::npos ? files[i] : files[i].substr(slash + 1);
    id["base model weights " + name] = strformat("%lld bytes, CRC-32C %08x", (long long)sizes[i], crcs[i]);
  }
  int64_t bytes = 0;
  for (int64_t n : sizes) bytes += n;
  log_info("lora   the base's fingerprint for checkpoints: %zu weight file%s, %.1f MiB hashed (CRC-32C, a slice per "
           "rank) in %.2f s", files.size(), files.size() == 1 ? "" : "s", bytes / (1024.0 * 1024.0),
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  run.identity = id.dump();
  return run.identity;
}

}  // namespace llmt
