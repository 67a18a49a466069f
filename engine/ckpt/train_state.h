// The exact training state in one parallel-HDF5 file (state.h5), written and read collectively
// by every rank, laid out by logical tensor so that any world size and strategy can resume it.
//
// File layout (HDF5 1.8 format or later; readable with h5py):
//   /master/<hf_name>   fp32, the tensor's shape as llmt stores it (ParamSpec::shape, no transpose)
//   /adam_m/<hf_name>   fp32, same shape: AdamW first moment
//   /adam_v/<hf_name>   fp32, same shape: AdamW second moment
//   /meta/scalars       string: the trainer's JSON (RNG, sampler, scheduler state; opaque here)
//   /meta/config        string: the model's config.json
//   /meta/layout        string: JSON [[hf_name, [shape...]], ...] in layout order (the fingerprint)
//   root attributes     format ("llmt-train-state"), version, global_step, adam_step (int64)
// Hugging Face names contain dots, never slashes, so each is one link name inside its group.
//
// Each rank holds a shard [lo, hi) of every unit's flat buffer; the shard overlaps parts of
// several tensors, and a matrix's part may begin and end mid-row. A rank writes (reads) exactly
// the overlapping elements as a union of at most three hyperslabs (a partial first row, whole rows,
// a partial last row) whose row-major order is the flat order. Only replica 0 writes; the other
// replicas select nothing but take part in every collective call. No rank ever holds the whole model.
//
// Transfers are MPI-IO collective (H5FD_MPIO_COLLECTIVE) over the given communicator; the file's
// space is reserved (posix_fallocate) before any data is written, so a full disk or a file-size
// limit is reported up front. Every failure is agreed between the ranks before anyone moves on:
// all ranks throw llmt::Error together, naming the file, the dataset and what was expected, and
// no rank is left waiting in a collective.
//
// The shards may live in device memory: each unit's shard is staged through host memory.
#pragma once
#include <cstdint>
#include <string>

#include "engine/dist/communicator.h"
#include "engine/fsdp/fsdp.h"
#include "engine/params/layout.h"

namespace llmt {

// Writes path (replacing any file there) from every rank's shards. Collective over `world`, which
// must be an "mpi" communicator holding every rank of the store. store.steps_done() is saved as
// the Adam step. The file is flushed to disk (MPI_File_sync) before this returns.
void save_train_state(const std::string& path, ControlComm& world, const ParamLayout& layout, const FsdpStore& store,
                      int64_t global_step, const std::string& scalars_json, const std::string& config_json);

struct LoadedTrainState {
  int64_t global_step = 0;
  int adam_step = 0;         // also set in the store (set_steps_done)
  std::string scalars_json;  // as saved
};

// Fills master, m and v of this rank's shards (padding zeroed) and the store's Adam step from path,
// whatever world size and strategy wrote it. Collective over `world`. Errors (all ranks throw):
// a missing, truncated or corrupt file; a file of another model configuration (names the differing
// config keys and the first tensor whose name or shape differs).
// What differs between a saved and the current config.json, key by key ("" when nothing that
// changes what is trained: the keys of how and by what it was saved, and the special tokens' ids).
std::string config_diff(const std::string& saved, const std::string& now);

// The config a training state was saved for (/meta/config), read by one process (no collective); an
// error names the file. For a check before using a checkpoint's other files.
std::string read_train_state_config(const std::string& path);

LoadedTrainState load_train_state(const std::string& path, ControlComm& world, const ParamLayout& layout,
                                  FsdpStore& store, const std::string& config_json);

}  // namespace llmt
