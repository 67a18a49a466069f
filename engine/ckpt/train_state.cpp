#include "engine/ckpt/train_state.h"

#include <fcntl.h>
#include <hdf5.h>
#include <mpi.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/dist/agree.h"

namespace llmt {

using json = nlohmann::json;

namespace {

const char* kFormat = "llmt-train-state";
const int64_t kVersion = 1;
const char* kKinds[3] = {"master", "adam_m", "adam_v"};
// datasets transferred between two agreements on success (a failure stops every rank soon after)
const size_t kAgreeEvery = 64;
// objects of at least this many bytes start at a multiple of it in the file
const int64_t kAlign = 1 << 20;
// config.json keys that do not change what is trained (how it was saved, by what, the special tokens'
// ids: llmt before 2026-12-07 dropped an eos_token_id list, so its checkpoints lack one)
const char* kIgnoredConfigKeys[] = {"torch_dtype", "transformers_version", "_name_or_path", "eos_token_id",
                                    "bos_token_id"};

// ---- HDF5 plumbing ---------------------------------------------------------------------------

// Closes an HDF5 handle on scope exit (in reverse order of opening: datasets before their file).
struct H5Handle {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  H5Handle() = default;
  H5Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  H5Handle(H5Handle&& o) noexcept : id(o.id), close(o.close) { o.id = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    std::swap(id, o.id);
    std::swap(close, o.close);
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() {
    if (id >= 0 && close) close(id);
  }
  operator hid_t() const { return id; }
  bool ok() const { return id >= 0; }
};

// HDF5's own description of the last failure (innermost first), for error messages.
herr_t collect_error(unsigned n, const H5E_error2_t* e, void* data) {
  std::string& s = *(std::string*)data;
  if (n < 3 && e->desc && *e->desc) s += std::string(s.empty() ? "" : "; ") + e->desc;
  return 0;
}
std::string h5_error() {
  std::string s;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect_error, &s);
  H5Eclear2(H5E_DEFAULT);
  return s.empty() ? "HDF5 gave no reason" : "HDF5: " + s;
}

// Silences HDF5's automatic error printing while in scope (failures are reported as llmt::Error),
// and turns a file-size limit into an error (EFBIG) instead of the SIGXFSZ that kills the process.
struct QuietHdf5 {
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  void (*old_xfsz)(int) = SIG_DFL;
  QuietHdf5() {
    H5Eget_auto2(H5E_DEFAULT, &func, &data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    old_xfsz = std::signal(SIGXFSZ, SIG_IGN);
  }
  ~QuietHdf5() {
    H5Eset_auto2(H5E_DEFAULT, func, data);
    std::signal(SIGXFSZ, old_xfsz);
  }
};

MPI_Comm mpi_comm(ControlComm& world, const char* what, const std::string& path) {
  LLMT_CHECK(world.native_handle(), "%s %s: parallel HDF5 needs an MPI communicator", what, path.c_str());
  return *(MPI_Comm*)world.native_handle();
}

H5Handle file_access(MPI_Comm comm) {
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  LLMT_CHECK(fapl.ok() && H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) >= 0, "cannot set up parallel HDF5 (MPI-IO): %s",
             h5_error().c_str());
  // the 1.8 file format: checksummed superblock and object headers, readable by any HDF5 since 1.8
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  // big tensors start on aligned boundaries (file system blocks, stripes)
  H5Pset_alignment(fapl, kAlign, kAlign);
  return fapl;
}

H5Handle collective_transfer() {
  H5Handle dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  LLMT_CHECK(dxpl.ok() && H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE) >= 0, "cannot set up collective MPI-IO: %s",
             h5_error().c_str());
  return dxpl;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Selects elements [a, b) of the row-major flattening of a dataspace with dimensions `dims`, as a
// union of hyperslabs (at most 2 * rank - 1); HDF5 visits a selection in row-major order, which is
// the flat order. `start` holds the fixed leading coordinates; `first` says whether the next
// hyperslab replaces the selection (H5S_SELECT_SET) or joins it (H5S_SELECT_OR).
void select_range(hid_t space, const std::vector<hsize_t>& dims, size_t d, std::vector<hsize_t>& start, hsize_t a,
                  hsize_t b, bool& first) {
  if (a >= b) return;
  hsize_t stride = 1;
  for (size_t k = d + 1; k < dims.size(); k++) stride *= dims[k];
  auto slab = [&](hsize_t i0, hsize_t i1) {  // indices [i0, i1) of dimension d, every later one whole
    std::vector<hsize_t> st(dims.size(), 0), count(dims.size(), 1);
    for (size_t k = 0; k < d; k++) st[k] = start[k];
    st[d] = i0;
    count[d] = i1 - i0;
    for (size_t k = d + 1; k < dims.size(); k++) count[k] = dims[k];
    H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, st.data(), nullptr, count.data(), nullptr);
    first = false;
  };
  hsize_t i0 = a / stride, i1 = b / stride;
  if (i0 == i1) {  // inside one index of this dimension
    start[d] = i0;
    select_range(space, dims, d + 1, start, a - i0 * stride, b - i0 * stride, first);
    return;
  }
  if (a % stride) {  // the partial first index
    start[d] = i0;
    select_range(space, dims, d + 1, start, a % stride, stride, first);
    i0++;
  }
  if (i1 > i0) slab(i0, i1);
  if (b % stride) {  // the partial last index
    start[d] = i1;
    select_range(space, dims, d + 1, start, 0, b % stride, first);
  }
}

// One tensor's dataset and this rank's part of it: flat elements [a, b) of the tensor, at
// `offset` floats into the shard (master, m and v alike). a == b: nothing (this rank selects none).
struct Part {
  const ParamSpec* spec = nullptr;
  int unit = 0;
  int64_t a = 0, b = 0, offset = 0;
};

std::vector<Part> parts_of(const ParamLayout& layout, const FsdpStore& store, bool selects) {
  std::vector<Part> parts;
  for (size_t u = 0; u < layout.units.size(); u++) {
    FsdpStore::ShardState s = store.shard_state((int)u);
    for (const ParamSpec& p : layout.units[u].params) {
      Part part;
      part.spec = &p;
      part.unit = (int)u;
      int64_t lo = std::max(s.lo, p.offset), hi = std::min(s.hi, p.offset + p.numel());
      if (selects && lo < hi) {
        part.a = lo - p.offset;
        part.b = hi - p.offset;
        part.offset = lo - s.lo;
      }
      parts.push_back(part);
    }
  }
  return parts;
}

// Reads or writes one rank's part of a dataset, collectively (every rank calls it, with or without elements).
herr_t transfer(hid_t dset, const Part& part, float* shard, hid_t dxpl, bool write) {
  std::vector<hsize_t> dims(part.spec->shape.begin(), part.spec->shape.end());
  H5Handle fspace(H5Screate_simple((int)dims.size(), dims.data(), nullptr), H5Sclose);
  hsize_t n = (hsize_t)std::max<int64_t>(part.b - part.a, 1);
  H5Handle mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
  if (!fspace.ok() || !mspace.ok()) return -1;
  static float dummy = 0.0f;
  float* buf = &dummy;
  if (part.b > part.a) {
    bool first = true;
    std::vector<hsize_t> start(dims.size(), 0);
    select_range(fspace, dims, 0, start, (hsize_t)part.a, (hsize_t)part.b, first);
    buf = shard + part.offset;
  } else {
    H5Sselect_none(fspace);
    H5Sselect_none(mspace);
  }
  return write ? H5Dwrite(dset, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, buf)
               : H5Dread(dset, H5T_NATIVE_FLOAT, mspace, fspace, dxpl, buf);
}

Tensor shard_tensor(const FsdpStore::ShardState& s, int kind) { return kind == 0 ? s.master : kind == 1 ? s.m : s.v; }

// One unit's shard of one kind in host memory: HDF5 reads and writes host buffers, the shards live
// where the backend keeps them. Saving stages a unit's shard down before its parts are written;
// loading fills the host copy (padding zero) and sends it up after the unit's last part.
struct ShardStaging {
  explicit ShardStaging(const FsdpStore& s) : store(s) {}
  const FsdpStore& store;
  int kind = 0, unit = -1;
  std::vector<float> host;
  float* down(int k, int u) {
    if (k != kind || u != unit) {
      kind = k, unit = u;
      Tensor t = shard_tensor(store.shard_state(u), k);
      host.resize((size_t)t.numel());
      store.backend().copy_to_host(host.data(), t.data, t.nbytes());
    }
    return host.data();
  }
  float* begin_up(int k, int u) {
    if (k != kind || u != unit) {
      up();
      kind = k, unit = u;
      host.assign((size_t)store.shard_numel(u), 0.0f);
    }
    return host.data();
  }
  void up() {
    if (unit < 0) return;
    Tensor t = shard_tensor(store.shard_state(unit), kind);
    store.backend().copy_from_host(t.data, host.data(), t.nbytes());
    unit = -1;
  }
};

json layout_json(const ParamLayout& layout) {
  json j = json::array();
  for (const UnitLayout& u : layout.units)
    for (const ParamSpec& p : u.params) j.push_back({p.hf_name, p.shape});
  return j;
}

// A string as a scalar dataset /meta/<name> (fixed-length, null-padded: h5py reads it as bytes).
H5Handle string_type(const std::string& text) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(text.size(), 1));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  return type;
}

H5Handle create_string(hid_t file, const char* name, const std::string& text) {
  H5Handle type = string_type(text);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle dset(H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
  LLMT_CHECK(dset.ok(), "cannot create dataset %s: %s", name, h5_error().c_str());
  return dset;
}

void write_string(hid_t dset, const char* name, const std::string& text, bool selects, hid_t dxpl) {
  H5Handle type = string_type(text);
  std::string buf = text.empty() ? std::string(1, '\0') : text;
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose), mspace(H5Screate(H5S_SCALAR), H5Sclose);
  if (!selects) {
    H5Sselect_none(space);
    H5Sselect_none(mspace);
  }
  LLMT_CHECK(H5Dwrite(dset, type, mspace, space, dxpl, buf.data()) >= 0, "cannot write dataset %s: %s", name,
             h5_error().c_str());
}

std::string read_string(hid_t file, const char* name, const std::string& path) {
  H5Handle dset(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  LLMT_CHECK(dset.ok(), "%s: no dataset %s (not an llmt training state?): %s", path.c_str(), name, h5_error().c_str());
  H5Handle type(H5Dget_type(dset), H5Tclose);
  LLMT_CHECK(type.ok() && H5Tget_class(type) == H5T_STRING && !H5Tis_variable_str(type),
             "%s: dataset %s: expected a fixed-length string", path.c_str(), name);
  size_t size = H5Tget_size(type);
  std::string buf(size, '\0');
  LLMT_CHECK(H5Dread(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &buf[0]) >= 0, "%s: cannot read dataset %s: %s",
             path.c_str(), name, h5_error().c_str());
  buf.resize(strnlen(buf.c_str(), size));
  return buf;
}

void write_attr_i64(hid_t obj, const char* name, int64_t v) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  LLMT_CHECK(attr.ok() && H5Awrite(attr, H5T_NATIVE_INT64, &v) >= 0, "cannot write attribute %s: %s", name,
             h5_error().c_str());
}

int64_t read_attr_i64(hid_t obj, const char* name, const std::string& path) {
  H5Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  int64_t v = 0;
  LLMT_CHECK(attr.ok() && H5Aread(attr, H5T_NATIVE_INT64, &v) >= 0, "%s: cannot read attribute %s: %s", path.c_str(),
             name, h5_error().c_str());
  return v;
}

void write_attr_str(hid_t obj, const char* name, const std::string& s) {
  H5Handle type = string_type(s);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  LLMT_CHECK(attr.ok() && H5Awrite(attr, type, s.c_str()) >= 0, "cannot write attribute %s: %s", name,
             h5_error().c_str());
}

std::string read_attr_str(hid_t obj, const char* name) {
  H5Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) return "";
  H5Handle type(H5Aget_type(attr), H5Tclose);
  if (!type.ok() || H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type)) return "";
  size_t size = H5Tget_size(type);
  std::string buf(size, '\0');
  if (H5Aread(attr, type, &buf[0]) < 0) return "";
  buf.resize(strnlen(buf.c_str(), size));
  return buf;
}

}  // namespace

std::string read_train_state_config(const std::string& path) {
  QuietHdf5 quiet;
  H5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  LLMT_CHECK(file.ok(), "training state %s: cannot open as HDF5 (missing, truncated or corrupt): %s", path.c_str(),
             h5_error().c_str());
  return read_string(file, "/meta/config", path);
}

std::string config_diff(const std::string& saved, const std::string& now) {
  if (saved.empty() || now.empty() || saved == now) return "";
  check_json_depth(saved, "the model config saved in the checkpoint");
  json a = json::parse(saved, nullptr, false), b = json::parse(now, nullptr, false);
  if (!a.is_object() || !b.is_object()) return "config.json text differs";
  std::string diff;
  auto ignored = [](const std::string& k) {
    for (const char* i : kIgnoredConfigKeys)
      if (k == i) return true;
    return false;
  };
  json keys = json::object();
  for (auto& it : a.items()) keys[it.key()] = true;
  for (auto& it : b.items()) keys[it.key()] = true;
  for (auto& it : keys.items()) {
    const std::string& k = it.key();
    if (ignored(k)) continue;
    std::string va = a.contains(k) ? a[k].dump() : "(absent)", vb = b.contains(k) ? b[k].dump() : "(absent)";
    if (va != vb) diff += (diff.empty() ? "" : ", ") + k + " " + va + " in the file, " + vb + " here";
  }
  return diff;
}

namespace {

// The first tensor whose name or shape differs ("" when the layouts match).
std::string layout_diff(const json& saved, const json& now) {
  size_t n = std::max(saved.size(), now.size());
  for (size_t i = 0; i < n; i++) {
    std::string s = i < saved.size() ? saved[i][0].get<std::string>() + " " + saved[i][1].dump() : "(none)";
    std::string c = i < now.size() ? now[i][0].get<std::string>() + " " + now[i][1].dump() : "(none)";
    if (s != c)
      return strformat("tensor %zu is %s in the file, %s here (%zu tensors there, %zu here)", i, s.c_str(), c.c_str(),
                       saved.size(), now.size());
  }
  return "";
}

// Runs one phase on every rank, then agrees: if any rank failed, every rank throws its message.
template <class F>
void phase(ControlComm& world, F&& f) {
  std::string err;
  try {
    f();
  } catch (const std::exception& e) {
    err = e.what();
  }
  agree_or_throw(world, err.empty(), err);
}

}  // namespace

void save_train_state(const std::string& path, ControlComm& world, const ParamLayout& layout, const FsdpStore& store,
                      int64_t global_step, const std::string& scalars_json, const std::string& config_json) {
  MPI_Comm comm = mpi_comm(world, "saving the training state to", path);
  QuietHdf5 quiet;
  const char* p = path.c_str();
  const bool selects = store.replica_index() == 0;
  std::vector<Part> parts = parts_of(layout, store, selects);
  const std::string layout_text = layout_json(layout).dump();
  const std::pair<const char*, const std::string*> strings[3] = {
      {"/meta/scalars", &scalars_json}, {"/meta/config", &config_json}, {"/meta/layout", &layout_text}};

  // Room for the whole file first (an upper bound, on a scratch file): a full disk or a file-size
  // limit is then one clear error before HDF5 writes anything (HDF5 1.10 cannot close a parallel
  // file cleanly once its writes have failed).
  phase(world, [&] {
    if (world.rank() != 0) return;
    int64_t bound = 1 << 20;
    for (const Part& part : parts) {
      int64_t bytes = part.spec->numel() * (int64_t)sizeof(float);
      bound += 3 * (bytes + 4096 + (bytes >= kAlign ? kAlign : 0));
    }
    for (auto& s : strings) bound += (int64_t)s.second->size() + 4096;
    std::string scratch = path + ".space-check";
    int fd = ::open(scratch.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    LLMT_CHECK(fd >= 0, "cannot create the training state %s: %s", p, strerror(errno));
    int rc = posix_fallocate(fd, 0, (off_t)bound);
    ::close(fd);
    ::unlink(scratch.c_str());
    LLMT_CHECK(rc == 0 || rc == EOPNOTSUPP || rc == EINVAL, "%s: no room for the training state (%.3f GB): %s", p,
               (double)bound / 1e9, strerror(rc));
  });

  H5Handle fapl = file_access(comm), dxpl = collective_transfer(), file;
  phase(world, [&] {
    file = H5Handle(H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, fapl), H5Fclose);
    LLMT_CHECK(file.ok(), "cannot create the training state %s: %s", p, h5_error().c_str());
  });

  // Every dataset, with its space allocated now and never filled: the data comes from the shards.
  std::vector<H5Handle> dsets;
  phase(world, [&] {
    H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);
    for (const char* g : {"/master", "/adam_m", "/adam_v", "/meta"}) {
      H5Handle group(H5Gcreate2(file, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
      LLMT_CHECK(group.ok(), "%s: cannot create group %s: %s", p, g, h5_error().c_str());
    }
    for (int kind = 0; kind < 3; kind++)
      for (const Part& part : parts) {
        std::string name = std::string("/") + kKinds[kind] + "/" + part.spec->hf_name;
        LLMT_CHECK(!part.spec->shape.empty(), "%s: tensor %s has no shape", p, part.spec->hf_name.c_str());
        std::vector<hsize_t> dims(part.spec->shape.begin(), part.spec->shape.end());
        H5Handle space(H5Screate_simple((int)dims.size(), dims.data(), nullptr), H5Sclose);
        dsets.emplace_back(H5Dcreate2(file, name.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                           H5Dclose);
        LLMT_CHECK(dsets.back().ok(), "%s: cannot create dataset %s: %s", p, name.c_str(), h5_error().c_str());
      }
    write_attr_str(file, "format", kFormat);
    write_attr_i64(file, "version", kVersion);
    write_attr_i64(file, "global_step", global_step);
    write_attr_i64(file, "adam_step", store.steps_done());
    for (auto& s : strings) dsets.push_back(create_string(file, s.first, *s.second));
  });

  // Reserve the file's space now that its layout is known, so that no data write runs out of room.
  phase(world, [&] {
    // where the last dataset ends (the space was allocated on creation)
    hsize_t size = 0;
    for (const H5Handle& d : dsets) {
      haddr_t at = H5Dget_offset(d);
      LLMT_CHECK(at != HADDR_UNDEF, "%s: a dataset has no space allocated: %s", p, h5_error().c_str());
      size = std::max(size, (hsize_t)at + H5Dget_storage_size(d));
    }
    if (world.rank() != 0) return;
    int fd = ::open(p, O_WRONLY);
    LLMT_CHECK(fd >= 0, "%s: cannot open to reserve %llu bytes: %s", p, (unsigned long long)size, strerror(errno));
    int rc = posix_fallocate(fd, 0, (off_t)size);
    ::close(fd);
    // file systems without fallocate: the writes themselves will tell
    LLMT_CHECK(rc == 0 || rc == EOPNOTSUPP || rc == EINVAL, "%s: cannot reserve %.3f GB for the training state: %s", p,
               (double)size / 1e9, strerror(rc));
  });

  // The small strings (rank 0 writes), then the data in file order: each rank its part of every dataset, collectively.
  // A rank that fails keeps taking part in the collective calls until the next agreement point, where all stop.
  phase(world, [&] {
    for (size_t k = 0; k < 3; k++)
      write_string(dsets[parts.size() * 3 + k], strings[k].first, *strings[k].second, world.rank() == 0, dxpl);
  });
  std::string err;
  size_t i = 0;
  ShardStaging staging(store);
  for (int kind = 0; kind < 3; kind++)
    for (const Part& part : parts) {
      float* shard = staging.down(kind, part.unit);
      if (transfer(dsets[i++], part, shard, dxpl, true) < 0 && err.empty())
        err = strformat("%s: cannot write dataset /%s/%s (%lld floats): %s", p, kKinds[kind],
                        part.spec->hf_name.c_str(), (long long)(part.b - part.a), h5_error().c_str());
      if (i % kAgreeEvery == 0 || i == parts.size() * 3) agree_or_throw(world, err.empty(), err);
    }
  dsets.clear();
  phase(world, [&] {
    // MPI_File_sync: the data is on disk before anyone records the checkpoint as complete
    LLMT_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL) >= 0, "%s: cannot flush to disk: %s", p, h5_error().c_str());
    herr_t rc = H5Fclose(file.id);
    file.id = -1;
    LLMT_CHECK(rc >= 0, "%s: cannot close: %s", p, h5_error().c_str());
  });
}

LoadedTrainState load_train_state(const std::string& path, ControlComm& world, const ParamLayout& layout,
                                  FsdpStore& store, const std::string& config_json) {
  MPI_Comm comm = mpi_comm(world, "loading the training state from", path);
  QuietHdf5 quiet;
  const char* p = path.c_str();
  LoadedTrainState out;

  phase(world, [&] {
    struct stat st;
    LLMT_CHECK(::stat(p, &st) == 0, "training state %s: %s", p, strerror(errno));
    LLMT_CHECK(S_ISREG(st.st_mode), "training state %s: not a regular file", p);
  });
  H5Handle fapl = file_access(comm), dxpl = collective_transfer(), file;
  phase(world, [&] {
    file = H5Handle(H5Fopen(p, H5F_ACC_RDONLY, fapl), H5Fclose);
    LLMT_CHECK(file.ok(), "training state %s: cannot open as HDF5 (missing, truncated or corrupt): %s", p,
               h5_error().c_str());
  });

  phase(world, [&] {
    std::string format = read_attr_str(file, "format");
    LLMT_CHECK(format == kFormat, "%s: not an llmt training state (attribute format is \"%s\", expected \"%s\")", p,
               format.c_str(), kFormat);
    int64_t version = read_attr_i64(file, "version", path);
    LLMT_CHECK(version == kVersion, "%s: training state format version %lld, this llmt reads version %lld", p,
               (long long)version, (long long)kVersion);
    out.global_step = read_attr_i64(file, "global_step", path);
    out.adam_step = (int)read_attr_i64(file, "adam_step", path);
    out.scalars_json = read_string(file, "/meta/scalars", path);
    std::string saved_config = read_string(file, "/meta/config", path);
    const std::string layout_text = read_string(file, "/meta/layout", path);
    check_json_depth(layout_text, path + ": /meta/layout");
    json saved_layout = json::parse(layout_text, nullptr, false);
    LLMT_CHECK(saved_layout.is_array(), "%s: /meta/layout is not a JSON array", p);
    for (const json& e : saved_layout)
      LLMT_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_array(),
                 "%s: /meta/layout: expected [name, shape] entries, found %s", p, clip_for_message(e.dump()).c_str());
    std::string cdiff = config_diff(saved_config, config_json);
    std::string ldiff = layout_diff(saved_layout, layout_json(layout));
    LLMT_CHECK(cdiff.empty() && ldiff.empty(), "%s was saved for another model configuration: %s%s%s", p,
               cdiff.empty() ? "" : ("config differs: " + cdiff).c_str(), !cdiff.empty() && !ldiff.empty() ? "; " : "",
               ldiff.c_str());
  });

  // Open and check every dataset first (metadata only), then every rank reads its own shards'
  // ranges (all replicas: each needs the values), collectively.
  std::vector<Part> parts = parts_of(layout, store, true);
  std::vector<H5Handle> dsets;
  phase(world, [&] {
    for (int kind = 0; kind < 3; kind++)
      for (const Part& part : parts) {
        std::string name = std::string("/") + kKinds[kind] + "/" + part.spec->hf_name;
        dsets.emplace_back(H5Dopen2(file, name.c_str(), H5P_DEFAULT), H5Dclose);
        LLMT_CHECK(dsets.back().ok(), "%s: no dataset %s: %s", p, name.c_str(), h5_error().c_str());
        H5Handle space(H5Dget_space(dsets.back()), H5Sclose);
        H5Handle type(H5Dget_type(dsets.back()), H5Tclose);
        int rank = space.ok() ? H5Sget_simple_extent_ndims(space) : -1;
        std::vector<hsize_t> dims((size_t)std::max(rank, 0));
        if (rank > 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
        std::vector<int64_t> got(dims.begin(), dims.end());
        LLMT_CHECK(got == part.spec->shape, "%s: dataset %s has shape %s, expected %s", p, name.c_str(),
                   shape_str(got).c_str(), shape_str(part.spec->shape).c_str());
        LLMT_CHECK(type.ok() && H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4,
                   "%s: dataset %s: expected fp32", p, name.c_str());
      }
  });
  // the padding past the unit's end (the last shards) stays zero, as set_unit leaves it
  std::string err;
  size_t i = 0;
  ShardStaging staging(store);
  for (int kind = 0; kind < 3; kind++)
    for (const Part& part : parts) {
      float* shard = staging.begin_up(kind, part.unit);
      if (transfer(dsets[i++], part, shard, dxpl, false) < 0 && err.empty())
        err = strformat("%s: cannot read dataset /%s/%s: %s", p, kKinds[kind], part.spec->hf_name.c_str(),
                        h5_error().c_str());
      if (i % kAgreeEvery == 0 || i == dsets.size()) agree_or_throw(world, err.empty(), err);
    }
  dsets.clear();
  phase(world, [&] {
    herr_t rc = H5Fclose(file.id);
    file.id = -1;
    LLMT_CHECK(rc >= 0, "%s: cannot close: %s", p, h5_error().c_str());
  });

  staging.up();
  store.masters_changed();
  store.set_steps_done(out.adam_step);
  return out;
}

}  // namespace llmt
