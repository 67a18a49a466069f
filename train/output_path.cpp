#include "train/output_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "engine/core/error.h"

namespace llmt {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The files a model directory is read for and the commands write into theirs: config.json, the
// weights, the tokenizer's files, generation_config.json.
bool is_model_file_name(const std::string& name) {
  for (const char* n : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json"})
    if (name == n) return true;
  return ends_with(name, ".safetensors") || ends_with(name, ".safetensors.index.json") || ends_with(name, ".tiktoken");
}

std::string parent_of(const std::string& resolved) {
  const size_t slash = resolved.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/" : resolved.substr(0, slash);
}

std::string name_of(const std::string& resolved) { return resolved.substr(resolved.find_last_of('/') + 1); }

}  // namespace

std::string resolved_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path, ec).lexically_normal();
  std::string s = p.string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();  // "dir/" resolves to "dir/" when dir is missing
  return s;
}

bool path_within(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

// An llmt checkpoint: manifest.json naming the format (engine/ckpt/checkpoint.cpp), or beside the
// training state (a manifest cut short still marks one). Other projects' manifest.json (a web
// project's, a browser extension's, one in $HOME) do not.
bool is_checkpoint_dir(const std::string& d) {
  struct stat st;
  const std::string manifest = d + "/manifest.json";
  if (::stat(manifest.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (::stat((d + "/state.h5").c_str(), &st) == 0) return true;
  std::FILE* f = std::fopen(manifest.c_str(), "rb");
  if (!f) return false;
  char head[4096];
  const size_t n = std::fread(head, 1, sizeof(head), f);
  std::fclose(f);
  return std::string(head, n).find("\"llmt-checkpoint\"") != std::string::npos;
}

std::string enclosing_checkpoint(const std::string& resolved) {
  for (std::string d = resolved;; d = parent_of(d)) {
    if (is_checkpoint_dir(d)) return d;
    if (d == "/") return "";
  }
}

void check_output_path(const std::string& command, const NamedPath& out, OutputKind kind,
                       const std::vector<NamedPath>& inputs) {
  if (out.path.empty()) return;
  const std::string o = resolved_path(out.path);
  const char* what = kind == OutputKind::file ? "file" : "directory";
  const std::string ck = enclosing_checkpoint(o);
  LLMT_CHECK(ck.empty(), "%s: %s %s %s the checkpoint %s (it holds a checkpoint manifest, manifest.json): a file "
             "written there is not in its manifest, and the next resume would set the checkpoint aside as corrupt; "
             "give a %s outside every checkpoint", command.c_str(), out.flag.c_str(), out.path.c_str(),
             o == ck ? "is" : "lies inside", ck.c_str(), what);
  struct stat st;
  const bool exists = ::stat(o.c_str(), &st) == 0;
  if (kind == OutputKind::file) {
    LLMT_CHECK(!exists || !S_ISDIR(st.st_mode), "%s: %s %s is a directory; give a file name", command.c_str(),
               out.flag.c_str(), out.path.c_str());
    const std::string dir = parent_of(o);
    struct stat ds;
    LLMT_CHECK(::stat(dir.c_str(), &ds) == 0 && S_ISDIR(ds.st_mode), "%s: %s %s: the directory %s does not exist",
               command.c_str(), out.flag.c_str(), out.path.c_str(), dir.c_str());
    if (exists)  // a file there already (/dev/null, a shared results file) needs only to be writable itself
      LLMT_CHECK(::access(o.c_str(), W_OK) == 0, "%s: %s %s: cannot write it: %s", command.c_str(), out.flag.c_str(),
                 out.path.c_str(), std::strerror(errno));
    else
      LLMT_CHECK(::access(dir.c_str(), W_OK) == 0, "%s: %s %s: cannot write in %s: %s", command.c_str(),
                 out.flag.c_str(), out.path.c_str(), dir.c_str(), std::strerror(errno));
  } else {
    LLMT_CHECK(!exists || S_ISDIR(st.st_mode), "%s: %s %s is a file, not a directory", command.c_str(),
               out.flag.c_str(), out.path.c_str());
  }
  for (const NamedPath& in : inputs) {
    struct stat is;
    if (in.path.empty() || ::stat(in.path.c_str(), &is) != 0) continue;
    const std::string i = resolved_path(in.path);
    LLMT_CHECK(o != i, "%s: %s %s is %s %s, which it would overwrite; give another %s", command.c_str(),
               out.flag.c_str(), out.path.c_str(), in.flag.c_str(), in.path.c_str(), what);
    // an output file in an input directory under a name that directory is read for
    if (kind == OutputKind::file && S_ISDIR(is.st_mode) && parent_of(o) == i)
      LLMT_CHECK(!is_model_file_name(name_of(o)), "%s: %s %s would overwrite %s of %s %s; give another file",
                 command.c_str(), out.flag.c_str(), out.path.c_str(), name_of(o).c_str(), in.flag.c_str(),
                 in.path.c_str());
    // an input file in the output directory under a name the command writes there
    if (kind == OutputKind::directory && !S_ISDIR(is.st_mode) && parent_of(i) == o)
      LLMT_CHECK(!is_model_file_name(name_of(i)), "%s: %s %s holds %s %s, which the saved model's %s would "
                 "overwrite; give another directory", command.c_str(), out.flag.c_str(), out.path.c_str(),
                 in.flag.c_str(), in.path.c_str(), name_of(i).c_str());
  }
}

}  // namespace llmt
