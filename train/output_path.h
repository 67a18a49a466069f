// The one rule for every path a command writes, checked before any work starts: llmt train's
// --output_dir, --logging_dir and token cache directory, generate's --output, export's OUT_DIR,
// bench's --results and netcheck's --write-env. Such a path must not be, or lie inside, a checkpoint
// (a directory holding manifest.json: one file added there and the next resume finds a file its
// manifest does not list and sets the checkpoint aside as corrupt); must not be one of the command's
// inputs; and must not overwrite a file an input directory is read for (a model directory's
// config.json, weights or tokenizer files), nor may an output directory hold an input under such a name.
#pragma once
#include <string>
#include <vector>

namespace llmt {

// A path as the user gave it, with the flag that gave it, both named in errors.
struct NamedPath {
  std::string flag;  // "--output_dir", "OUT_DIR"
  std::string path;  // "" = not given (skipped)
};

enum class OutputKind { file, directory };

// Throws llmt::Error naming `command`, the flag, the path and what it would damage. A file output
// must also have an existing, writable parent directory and not be a directory itself; a directory
// output must not be an existing file. Inputs that do not exist are skipped (reading them says so).
void check_output_path(const std::string& command, const NamedPath& out, OutputKind kind,
                       const std::vector<NamedPath>& inputs = {});

// The path as the kernel resolves it: absolute, links and ".." resolved in the part that exists, the
// rest appended.
std::string resolved_path(const std::string& path);
// Whether the resolved path `path` is the resolved directory `dir` or lies inside it.
bool path_within(const std::string& path, const std::string& dir);
// The llmt checkpoint directory (its manifest.json names the format, or state.h5 is beside it) that
// the resolved path is or lies inside,
// "" when none.
std::string enclosing_checkpoint(const std::string& resolved);

}  // namespace llmt
