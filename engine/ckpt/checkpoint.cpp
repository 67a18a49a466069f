#include "engine/ckpt/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/dist/agree.h"


namespace llmt {

using json = nlohmann::json;


uint32_t crc32c_file(const std::string& path, int64_t begin, int64_t end) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LLMT_CHECK(fd >= 0, "%s: cannot open: %s", path.c_str(), strerror(errno));
  struct stat st;
  if (end < 0 && fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("%s: cannot stat: %s", path.c_str(), strerror(e));
  }
  if (end < 0) end = st.st_size;
  posix_fadvise(fd, begin, end - begin, POSIX_FADV_SEQUENTIAL);
  // 32 MiB chunks over the OpenMP threads (reading and hashing overlap), combined in order
  const int64_t kChunk = 32 << 20, kBuf = 4 << 20;
  const int64_t chunks = (end - begin + kChunk - 1) / kChunk;
  std::vector<uint32_t> crcs((size_t)chunks, 0);
  std::vector<std::string> errs((size_t)chunks);
#pragma omp parallel if (chunks > 1)
  {
    std::vector<uint8_t> buf((size_t)kBuf);
#pragma omp for schedule(dynamic)
    for (int64_t c = 0; c < chunks; c++) {
      const int64_t lo = begin + c * kChunk, hi = std::min(end, lo + kChunk);
      uint32_t crc = 0;
      for (int64_t off = lo; off < hi;) {
        ssize_t got = pread(fd, buf.data(), (size_t)std::min(kBuf, hi - off), off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          errs[(size_t)c] = strformat("%s: cannot read bytes %lld..%lld: %s", path.c_str(), (long long)off,
                                      (long long)hi, got < 0 ? strerror(errno) : "the file is shorter than expected");
          break;
        }
        crc = crc32c(crc, buf.data(), (size_t)got);
        off += got;
      }
      crcs[(size_t)c] = crc;
    }
  }
  ::close(fd);
  uint32_t crc = 0;
  for (int64_t c = 0; c < chunks; c++) {
    LLMT_CHECK(errs[(size_t)c].empty(), "%s", errs[(size_t)c].c_str());
    crc = crc32c_combine(crc, crcs[(size_t)c], (uint64_t)(std::min(end, begin + (c + 1) * kChunk) - begin - c * kChunk));
  }
  return crc;
}

std::vector<uint32_t> crc32c_files_over_ranks(ControlComm& world, const std::vector<std::string>& paths,
                                              const std::vector<int64_t>& sizes) {
  const int W = world.size(), me = world.rank();
  const size_t nf = paths.size();
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  // rank r hashes bytes [total * r / W, total * (r + 1) / W) of the files laid end to end
  auto share = [&](int r) { return total / W * r + total % W * r / W; };
  auto piece = [&](int r, int64_t file_begin, int64_t size, int64_t* b, int64_t* e) {
    *b = std::max(share(r), file_begin) - file_begin;
    *e = std::min(share(r + 1), file_begin + size) - file_begin;
    if (*e < *b) *e = *b;
  };
  std::vector<int32_t> mine(std::max<size_t>(nf, 1), 0), all(std::max<size_t>(nf, 1) * (size_t)W, 0);
  std::string err;
  try {
    int64_t at = 0;
    for (size_t i = 0; i < nf; i++) {
      int64_t b, e;
      piece(me, at, sizes[i], &b, &e);
      if (e > b) mine[i] = (int32_t)crc32c_file(paths[i], b, e);
      at += sizes[i];
    }
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_or_throw(world, err.empty(), err);
  world.all_gather(mine.data(), all.data(), (int64_t)mine.size(), DType::i32);
  std::vector<uint32_t> crcs(nf, 0);
  int64_t at = 0;
  for (size_t i = 0; i < nf; i++) {
    for (int r = 0; r < W; r++) {
      int64_t b, e;
      piece(r, at, sizes[i], &b, &e);
      if (e > b) crcs[i] = crc32c_combine(crcs[i], (uint32_t)all[(size_t)r * mine.size() + i], (uint64_t)(e - b));
    }
    at += sizes[i];
  }
  return crcs;
}

// ---- files and directories -------------------------------------------------------------------

namespace {

const char* kManifest = "manifest.json";

std::string hex32(uint32_t v) { return strformat("%08x", v); }

bool is_dir(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// fsync a file or directory by path; "" on success, else the reason.
std::string fsync_path(const std::string& p, bool dir) {
  int fd = ::open(p.c_str(), (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return strformat("%s: cannot open to fsync: %s", p.c_str(), strerror(errno));
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  // some file systems refuse fsync on a directory (EINVAL): nothing more can be done there
  if (rc != 0 && !(dir && (e == EINVAL || e == EBADF)))
    return strformat("%s: fsync failed: %s", p.c_str(), strerror(e));
  return "";
}

// Regular files under dir, relative paths, sorted; subdirectories into *subdirs (relative).
void walk(const std::string& dir, const std::string& rel, std::vector<std::string>& files,
          std::vector<std::string>* subdirs) {
  DIR* d = opendir((rel.empty() ? dir : dir + "/" + rel).c_str());
  LLMT_CHECK(d, "%s: cannot list: %s", (dir + "/" + rel).c_str(), strerror(errno));
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string r = rel.empty() ? name : rel + "/" + name;
    struct stat st;
    if (::lstat((dir + "/" + r).c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      if (subdirs) subdirs->push_back(r);
      walk(dir, r, files, subdirs);
    } else if (S_ISREG(st.st_mode)) {
      files.push_back(r);
    }
  }
  closedir(d);
  std::sort(files.begin(), files.end());
}

// Every entry under dir that is not a directory (regular files, links, anything else), relative
// paths: what a manifest must account for.
void list_entries(const std::string& dir, const std::string& rel, std::vector<std::string>& out) {
  const std::string here = rel.empty() ? dir : dir + "/" + rel;
  DIR* d = opendir(here.c_str());
  LLMT_CHECK(d, "%s: cannot list: %s", here.c_str(), strerror(errno));
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    std::string r = rel.empty() ? name : rel + "/" + name;
    struct stat st;
    if (::lstat((dir + "/" + r).c_str(), &st) == 0 && S_ISDIR(st.st_mode)) list_entries(dir, r, out);
    else out.push_back(r);
  }
  closedir(d);
}

void broadcast_string(ControlComm& world, std::string& s, int root) {
  int32_t len = (int32_t)s.size();
  world.broadcast(&len, 1, DType::i32, root);
  std::vector<int32_t> words((size_t)(len + 3) / 4 + 1, 0);
  if (world.rank() == root) std::memcpy(words.data(), s.data(), s.size());
  world.broadcast(words.data(), (int64_t)words.size(), DType::i32, root);
  s.assign((const char*)words.data(), (size_t)len);
}

// Runs f on rank 0 only (or every rank), then every rank learns whether it failed.
template <class F>
void on_rank0(ControlComm& world, F&& f) {
  std::string err;
  if (world.rank() == 0) {
    try {
      f();
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  agree_or_throw(world, err.empty(), err);
}

std::string unique_id() {
  std::random_device rd;
  uint64_t t = (uint64_t)std::chrono::system_clock::now().time_since_epoch().count();
  return strformat("%llx%04x%04x", (unsigned long long)(t / 1000), (unsigned)getpid() & 0xffff, rd() & 0xffff);
}

// "checkpoint-<digits>" exactly: its step, else -1
int64_t step_of(const std::string& name) {
  const char* prefix = "checkpoint-";
  if (name.compare(0, 11, prefix) != 0 || name.size() == 11) return -1;
  int64_t step = 0;
  for (size_t i = 11; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9' || step > (INT64_MAX - 9) / 10) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string parent_of(const std::string& p) {
  size_t s = p.find_last_of('/');
  return s == std::string::npos ? "." : s == 0 ? "/" : p.substr(0, s);
}

}  // namespace

void remove_dir_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = opendir(path.c_str())) {
      while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name != "." && name != "..") remove_dir_tree(path + "/" + name);
      }
      closedir(d);
    }
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

std::string checkpoint_path(const std::string& output_dir, int64_t step) {
  return output_dir + "/checkpoint-" + std::to_string(step);
}

std::string begin_checkpoint(const std::string& output_dir, int64_t step, ControlComm& world) {
  std::string tmp;
  on_rank0(world, [&] {
    LLMT_CHECK(!output_dir.empty(), "checkpoint: empty output directory");
    // create output_dir and its parents
    for (size_t pos = 1; pos <= output_dir.size(); pos++) {
      if (pos != output_dir.size() && output_dir[pos] != '/') continue;
      std::string part = output_dir.substr(0, pos);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
        fail("cannot create the output directory %s: %s", part.c_str(), strerror(errno));
    }
    LLMT_CHECK(is_dir(output_dir), "the output directory %s is not a directory", output_dir.c_str());
    // stale temporary directories: saves killed midway, deletions interrupted
    if (DIR* d = opendir(output_dir.c_str())) {
      std::vector<std::string> stale;
      while (dirent* e = readdir(d)) {
        std::string name = e->d_name;
        if (name.compare(0, 11, "checkpoint-") == 0 && name.find(".tmp-") != std::string::npos)
          stale.push_back(output_dir + "/" + name);
      }
      closedir(d);
      for (const std::string& s : stale) remove_dir_tree(s);
    }
    tmp = checkpoint_path(output_dir, step) + ".tmp-" + unique_id();
    LLMT_CHECK(::mkdir(tmp.c_str(), 0755) == 0, "cannot create the checkpoint directory %s: %s", tmp.c_str(),
               strerror(errno));
  });
  broadcast_string(world, tmp, 0);
  return tmp;
}

void abandon_checkpoint(const std::string& tmp_dir, ControlComm& world) {
  if (world.rank() == 0) remove_dir_tree(tmp_dir);
  world.barrier();
}

std::string commit_checkpoint(const std::string& tmp_dir, ControlComm& world) {
  size_t tmp_at = tmp_dir.rfind(".tmp-");
  LLMT_CHECK(tmp_at != std::string::npos, "commit_checkpoint: %s is not a temporary checkpoint directory",
             tmp_dir.c_str());
  const std::string final_dir = tmp_dir.substr(0, tmp_at);
  const int64_t step = step_of(final_dir.substr(final_dir.find_last_of('/') + 1));
  LLMT_CHECK(step >= 0, "commit_checkpoint: %s is not named checkpoint-<step>.tmp-<id>", tmp_dir.c_str());

  // rank 0 lists the files and their sizes; every rank checksums its share of the bytes
  std::string listing;
  on_rank0(world, [&] {
    std::vector<std::string> files;
    walk(tmp_dir, "", files, nullptr);
    json l = json::array();
    for (const std::string& f : files) {
      if (f == kManifest) continue;
      struct stat st;
      LLMT_CHECK(::stat((tmp_dir + "/" + f).c_str(), &st) == 0, "%s/%s: cannot stat: %s", tmp_dir.c_str(), f.c_str(),
                 strerror(errno));
      l.push_back({f, (int64_t)st.st_size});
    }
    listing = l.dump();
  });
  broadcast_string(world, listing, 0);
  json files = json::parse(listing);
  const size_t nf = files.size();
  std::vector<std::string> paths;
  std::vector<int64_t> sizes;
  for (const json& f : files) paths.push_back(tmp_dir + "/" + f[0].get<std::string>()), sizes.push_back(f[1].get<int64_t>());
  const std::vector<uint32_t> crcs = crc32c_files_over_ranks(world, paths, sizes);

  // rank 0: combine, fsync, manifest, fsync, rename, fsync
  on_rank0(world, [&] {
    json m;
    m["format"] = "llmt-checkpoint";
    m["version"] = 1;
    m["step"] = step;
    m["checksum"] = "crc32c";
    m["files"] = json::object();
    for (size_t i = 0; i < nf; i++) {
      const std::string name = files[i][0].get<std::string>();
      m["files"][name] = {{"size", sizes[i]}, {"crc32c", hex32(crcs[i])}};
      std::string e2 = fsync_path(tmp_dir + "/" + name, false);
      LLMT_CHECK(e2.empty(), "%s", e2.c_str());
    }
    std::vector<std::string> subdirs, ignored;
    walk(tmp_dir, "", ignored, &subdirs);
    for (const std::string& s : subdirs) {
      std::string e2 = fsync_path(tmp_dir + "/" + s, true);
      LLMT_CHECK(e2.empty(), "%s", e2.c_str());
    }

    // manifest.json, written and fsynced; a full disk or a file-size limit fails here, cleanly
    std::string text = m.dump(1) + "\n";
    std::string mpath = tmp_dir + "/" + kManifest;
    void (*old_xfsz)(int) = std::signal(SIGXFSZ, SIG_IGN);
    int fd = ::open(mpath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    std::string why = fd < 0 ? strformat("cannot create: %s", strerror(errno)) : "";
    for (size_t off = 0; why.empty() && off < text.size();) {
      ssize_t w = ::write(fd, text.data() + off, text.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        why = strformat("write failed: %s", w < 0 ? strerror(errno) : "no progress");
      else
        off += (size_t)w;
    }
    if (why.empty() && ::fsync(fd) != 0) why = strformat("fsync failed: %s", strerror(errno));
    if (fd >= 0 && ::close(fd) != 0 && why.empty()) why = strformat("close failed: %s", strerror(errno));
    std::signal(SIGXFSZ, old_xfsz);
    LLMT_CHECK(why.empty(), "%s: %s", mpath.c_str(), why.c_str());
    std::string e2 = fsync_path(tmp_dir, true);
    LLMT_CHECK(e2.empty(), "%s", e2.c_str());

    // into place: swap with an existing checkpoint of this step, or a plain rename
    if (is_dir(final_dir)) {
      if (renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
        // no RENAME_EXCHANGE on this file system: move the old one aside first
        std::string old = final_dir + ".tmp-old-" + unique_id();
        LLMT_CHECK(::rename(final_dir.c_str(), old.c_str()) == 0, "cannot move %s aside: %s", final_dir.c_str(),
                   strerror(errno));
        LLMT_CHECK(::rename(tmp_dir.c_str(), final_dir.c_str()) == 0, "cannot rename %s to %s: %s", tmp_dir.c_str(),
                   final_dir.c_str(), strerror(errno));
        remove_dir_tree(old);
      } else {
        remove_dir_tree(tmp_dir);  // now the old checkpoint
      }
    } else {
      LLMT_CHECK(::rename(tmp_dir.c_str(), final_dir.c_str()) == 0, "cannot rename %s to %s: %s", tmp_dir.c_str(),
                 final_dir.c_str(), strerror(errno));
    }
    e2 = fsync_path(parent_of(final_dir), true);
    LLMT_CHECK(e2.empty(), "%s", e2.c_str());
  });
  return final_dir;
}

std::string save_checkpoint_dir(const std::string& output_dir, int64_t step, ControlComm& world,
                                const std::function<void(const std::string& dir)>& write) {
  std::string tmp = begin_checkpoint(output_dir, step, world);
  try {
    std::string err;
    try {
      write(tmp);
    } catch (const std::exception& e) {
      err = e.what();
    }
    agree_or_throw(world, err.empty(), err);
    return commit_checkpoint(tmp, world);
  } catch (const std::exception& e) {
    // every rank is here together (each failure above was agreed)
    abandon_checkpoint(tmp, world);
    throw Error(strformat("saving checkpoint %s failed (earlier checkpoints are intact): %s",
                          checkpoint_path(output_dir, step).c_str(), e.what()));
  }
}

// ---- reading back ----------------------------------------------------------------------------

std::string checkpoint_problem(const std::string& dir, bool verify, const std::vector<std::string>& required) {
  std::string mpath = dir + "/" + kManifest;
  FILE* f = std::fopen(mpath.c_str(), "rb");
  if (!f) return strformat("%s: %s", mpath.c_str(), strerror(errno));
  std::string text;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) text.append(buf, n);
  std::fclose(f);
  try {
    check_json_depth(text, mpath);
  } catch (const Error& e) {
    return e.what();
  }
  json m = json::parse(text, nullptr, false);
  if (!m.is_object() || !m.contains("format") || m["format"] != "llmt-checkpoint" || !m.contains("files") ||
      !m["files"].is_object())
    return strformat("%s: not an llmt checkpoint manifest", mpath.c_str());
  // The step is the one recorded inside: a directory renamed to another step number would resume
  // at the wrong step and make save_total_limit delete the real newest.
  const size_t slash = dir.find_last_of('/');
  const int64_t named = step_of(slash == std::string::npos ? dir : dir.substr(slash + 1));
  if (named >= 0 && (!m.contains("step") || !m["step"].is_number_integer() || m["step"].get<int64_t>() != named))
    return strformat("%s: the manifest records step %s, but the directory is named checkpoint-%lld (renamed?)",
                     mpath.c_str(), m.contains("step") ? clip_for_message(m["step"].dump()).c_str() : "(none)",
                     (long long)named);
  // The manifest lists every file the directory holds, no more and no fewer: a file it leaves out
  // was never checksummed ("files": {} beside a replaced state.h5 passed as complete), and the files
  // every checkpoint must have are listed.
  std::vector<std::string> present;
  try {
    list_entries(dir, "", present);
  } catch (const Error& e) {
    return e.what();
  }
  std::sort(present.begin(), present.end());
  std::string unlisted;
  for (const std::string& p : present)
    if (p != kManifest && !m["files"].contains(p)) unlisted += (unlisted.empty() ? "" : ", ") + p;
  if (!unlisted.empty())
    return strformat("%s: %s not listed in the manifest, so never checksummed (added or replaced after the save?)",
                     dir.c_str(), clip_for_message(unlisted, 200).c_str());
  for (const std::string& need : required)
    if (!m["files"].contains(need))
      return strformat("%s: does not list %s, which every checkpoint holds", mpath.c_str(), need.c_str());
  for (auto& it : m["files"].items()) {
    const json& e = it.value();
    std::string path = dir + "/" + it.key();
    if (it.key().empty() || it.key()[0] == '/' || ("/" + it.key() + "/").find("/../") != std::string::npos ||
        it.key() == kManifest)
      return strformat("%s: entry \"%s\" is not a path inside the checkpoint", mpath.c_str(),
                       clip_for_message(it.key()).c_str());
    if (!e.is_object() || !e.contains("size") || !e["size"].is_number_integer() || !e.contains("crc32c") ||
        !e["crc32c"].is_string())
      return strformat("%s: entry \"%s\" needs an integer size and a crc32c string", mpath.c_str(), it.key().c_str());
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      return strformat("%s: listed in the manifest but %s", path.c_str(), strerror(errno));
    int64_t want = e["size"].get<int64_t>();
    if ((int64_t)st.st_size != want)
      return strformat("%s: %lld bytes, the manifest says %lld (truncated or rewritten)", path.c_str(),
                       (long long)st.st_size, (long long)want);
    if (verify) {
      std::string got;
      try {
        got = hex32(crc32c_file(path));
      } catch (const std::exception& ex) {
        return ex.what();
      }
      if (got != e["crc32c"].get<std::string>())
        return strformat("%s: CRC-32C %s, the manifest says %s (corrupt)", path.c_str(), got.c_str(),
                         e["crc32c"].get<std::string>().c_str());
    }
  }
  return "";
}

void verify_checkpoint(const std::string& dir, const std::vector<std::string>& required) {
  std::string why = checkpoint_problem(dir, true, required);
  LLMT_CHECK(why.empty(), "checkpoint %s is damaged: %s", dir.c_str(), why.c_str());
}

std::vector<CheckpointEntry> list_checkpoint_dirs(const std::string& output_dir) {
  std::vector<CheckpointEntry> out;
  DIR* d = opendir(output_dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    int64_t step = step_of(e->d_name);
    std::string path = output_dir + "/" + e->d_name;
    if (step >= 0 && is_dir(path)) out.push_back({step, path});
  }
  closedir(d);
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

std::string find_latest_checkpoint(const std::string& output_dir, bool verify,
                                   const std::vector<std::string>& required) {
  std::vector<CheckpointEntry> all = list_checkpoint_dirs(output_dir);
  for (size_t i = all.size(); i-- > 0;)
    if (checkpoint_problem(all[i].path, verify, required).empty()) return all[i].path;
  return "";
}

std::vector<std::string> apply_save_total_limit(const std::string& output_dir, int limit, const std::string& keep) {
  std::vector<std::string> deleted;
  if (limit <= 0) return deleted;
  std::vector<CheckpointEntry> all = list_checkpoint_dirs(output_dir);
  std::string newest_complete = find_latest_checkpoint(output_dir, false);
  auto same = [](const std::string& a, const std::string& b) {
    struct stat sa, sb;
    return !b.empty() && ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
  };
  size_t kept = 0;
  for (size_t i = all.size(); i-- > 0;) {
    const std::string& p = all[i].path;
    bool newest = kept < (size_t)limit;
    kept += newest;
    if (newest || p == newest_complete || same(p, keep)) continue;
    // out of the checkpoint namespace first: an interrupted deletion leaves only a .tmp- directory
    std::string doomed = p + ".tmp-del-" + unique_id();
    if (::rename(p.c_str(), doomed.c_str()) != 0) continue;
    remove_dir_tree(doomed);
    deleted.push_back(p);
  }
  if (!deleted.empty()) fsync_path(output_dir, true);
  return deleted;
}

}  // namespace llmt
