// Checkpoint directories: output_dir/checkpoint-<step>/, complete or absent.
//
// A save (collective over every rank):
//   begin_checkpoint   rank 0 removes stale checkpoint-*.tmp-* directories (killed runs, interrupted
//                      deletions) and creates checkpoint-<step>.tmp-<id>; id is picked by rank 0 and
//                      broadcast, unique per save.
//   ...                the caller writes its files there (save_train_state, the Hugging Face export, ...)
//   commit_checkpoint  checksums every file (CRC-32C; the bytes split over the ranks, the pieces
//                      combined), fsyncs every file, writes manifest.json, fsyncs the directory, renames
//                      it to checkpoint-<step> (atomically swapping out an existing one of that step)
//                      and fsyncs output_dir.
// save_checkpoint_dir does all three and removes the temporary directory on any failure, so a full
// disk or an unwritable directory is a clear error with every earlier checkpoint intact.
//
// manifest.json:
//   {"format": "llmt-checkpoint", "version": 1, "step": <step>, "checksum": "crc32c",
//    "files": {"<relative path>": {"size": <bytes>, "crc32c": "<8 hex digits>"}, ...}}
// A checkpoint is complete when its manifest parses, every file it lists exists with its size, and
// it lists every file in the directory; verify_checkpoint also recomputes every checksum.
//
// Every failure of a collective call is agreed between the ranks: all throw llmt::Error together.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/crc32c.h"
#include "engine/dist/communicator.h"

namespace llmt {

// The CRC-32C of a file's bytes [begin, end) (end = -1: to the end); throws naming the file.
uint32_t crc32c_file(const std::string& path, int64_t begin = 0, int64_t end = -1);
// The CRC-32C of each whole file, hashed by every rank of `world` together: the files' bytes laid end
// to end, rank r hashes its share of them, and the pieces are combined. paths and sizes (bytes) the
// same on every rank; every rank gets the result. Collective; a failure on any rank throws on all.
std::vector<uint32_t> crc32c_files_over_ranks(ControlComm& world, const std::vector<std::string>& paths,
                                              const std::vector<int64_t>& sizes);

std::string checkpoint_path(const std::string& output_dir, int64_t step);  // output_dir/checkpoint-<step>

// Collective. Returns the temporary directory's path (the same on every rank). Creates output_dir
// when absent.
std::string begin_checkpoint(const std::string& output_dir, int64_t step, ControlComm& world);
// Collective. Returns the final directory's path.
std::string commit_checkpoint(const std::string& tmp_dir, ControlComm& world);
// Collective: rank 0 removes the temporary directory (best effort; never throws).
void abandon_checkpoint(const std::string& tmp_dir, ControlComm& world);
// begin, write(tmp_dir) on every rank, commit; any rank's failure (an exception from write on any
// rank, after the collective parts of write are done) abandons the temporary directory and throws
// on every rank. write must itself be all-or-nothing in its collective calls (save_train_state is).
std::string save_checkpoint_dir(const std::string& output_dir, int64_t step, ControlComm& world,
                                const std::function<void(const std::string& dir)>& write);

// Checks that dir/manifest.json parses, lists every file the directory holds (a file it leaves out
// was never checksummed: an edited manifest with "files": {} beside a replaced state.h5 is refused),
// each listed file exists with its size, and the manifest lists every name in `required` (the files
// the caller's checkpoints always have: the trainer passes kCheckpointRequiredFiles, train/export.h);
// with `verify`, also recomputes every checksum. Returns "" when complete, else what is wrong.
std::string checkpoint_problem(const std::string& dir, bool verify, const std::vector<std::string>& required = {});
// Throws llmt::Error naming the checkpoint, the file and what differs (size, checksum, missing, unlisted).
void verify_checkpoint(const std::string& dir, const std::vector<std::string>& required = {});

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};
// Every output_dir/checkpoint-<step> directory (never a .tmp-*), oldest first, complete or not.
std::vector<CheckpointEntry> list_checkpoint_dirs(const std::string& output_dir);
// The complete checkpoint with the highest step ("" when none); with `verify`, checksums are
// recomputed and a corrupt checkpoint is skipped for the next older one.
std::string find_latest_checkpoint(const std::string& output_dir, bool verify = false,
                                   const std::vector<std::string>& required = {});
// Keeps the newest `limit` checkpoints (limit <= 0: keep all), and always the newest complete one
// and `keep` (a path, e.g. the best model's; "" for none); deletes the others, oldest first, each
// renamed to a .tmp- name before its files go, so an interrupted deletion is never taken for a
// checkpoint. Call on one rank, after commit_checkpoint. Returns the paths deleted.
std::vector<std::string> apply_save_total_limit(const std::string& output_dir, int limit, const std::string& keep = "");

// Removes a directory tree (best effort).
void remove_dir_tree(const std::string& path);

}  // namespace llmt
