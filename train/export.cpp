#include "train/export.h"

#include <vector>

#include "engine/backend/backend.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/fsdp/fsdp.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/hf_checkpoint.h"

namespace llmt {

void run_export(const std::string& checkpoint_dir, const std::string& out_dir, const std::string& dtype,
                ControlComm& world) {
  if (world.rank() == 0) verify_checkpoint(checkpoint_dir);  // checksums first: never export a damaged state
  world.barrier();
  ModelConfig cfg = config_from_json_file(checkpoint_dir + "/config.json");
  ModelLayout L = make_layout(cfg);
  auto be = make_cpu_backend(0);
  std::unique_ptr<DataComm> data = make_mpi_data_comm(world);
  FsdpStore store(*be, L, Strategy::full_shard, *data, world.size());
  LoadedTrainState st = load_train_state(checkpoint_dir + "/state.h5", world, L, store, config_to_hf_json(cfg).dump());
  std::unique_ptr<HfExporter> ex;
  if (world.rank() == 0) ex = std::make_unique<HfExporter>(out_dir, cfg, L, dtype);
  std::vector<float> host;
  for (size_t u = 0; u < L.units.size(); u++) {
    host.resize((size_t)L.units[u].numel);
    store.get_unit((int)u, host.data());
    if (ex) ex->write_unit((int)u, host.data());
  }
  if (ex) {
    ex->finish();
    int n = copy_tokenizer_files(checkpoint_dir, out_dir);
    log_info("export %s (step %lld, %s) -> %s: config.json, model.safetensors (%s), %d tokenizer file%s",
             checkpoint_dir.c_str(), (long long)st.global_step, cfg.describe().c_str(), out_dir.c_str(),
             dtype.c_str(), n, n == 1 ? "" : "s");
  }
  world.barrier();
}

}  // namespace llmt
