#include "engine/formats/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/tensor.h"

namespace llmt {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, before allocating anything.
static const uint64_t kMaxHeaderBytes = 100000000;

size_t st_dtype_size(const std::string& dt) {
  if (dt == "F64" || dt == "I64" || dt == "U64") return 8;
  if (dt == "F32" || dt == "I32" || dt == "U32") return 4;
  if (dt == "BF16" || dt == "F16" || dt == "I16" || dt == "U16") return 2;
  if (dt == "I8" || dt == "U8" || dt == "BOOL") return 1;
  return 0;
}

int64_t StTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // cannot overflow: checked when the file was opened
  return n;
}

static std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// reading

// One header entry -> StTensor, checking JSON types, dtype, shape and byte count (not the range).
static StTensor parse_entry(const std::string& path, const std::string& name, const json& v) {
  const char* p = path.c_str();
  const char* n = name.c_str();
  LLMT_CHECK(v.is_object(), "%s: tensor '%s': header entry must be a JSON object, found %s", p, n, v.type_name());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    LLMT_CHECK(v.contains(key), "%s: tensor '%s': header entry is missing \"%s\"", p, n, key);

  StTensor t;
  t.name = name;
  const json& dt = v["dtype"];
  LLMT_CHECK(dt.is_string(), "%s: tensor '%s': \"dtype\" must be a string, found %s", p, n, dt.type_name());
  t.dtype = dt.get<std::string>();
  size_t esize = st_dtype_size(t.dtype);
  LLMT_CHECK(esize > 0, "%s: tensor '%s': unknown dtype '%s' (expected F64, F32, F16, BF16, I64, I32, I16, I8, "
             "U64, U32, U16, U8 or BOOL)", p, n, t.dtype.c_str());

  const json& sh = v["shape"];
  LLMT_CHECK(sh.is_array(), "%s: tensor '%s': \"shape\" must be an array of integers, found %s", p, n, sh.type_name());
  int64_t numel = 1;
  for (const json& d : sh) {
    LLMT_CHECK(d.is_number_integer(), "%s: tensor '%s': \"shape\" must hold integers, found %s", p, n, d.type_name());
    // nlohmann stores non-negative integers as unsigned, negative ones as signed
    LLMT_CHECK(d.is_number_unsigned(), "%s: tensor '%s': negative dimension %lld in shape", p, n,
               (long long)d.get<int64_t>());
    uint64_t u = d.get<uint64_t>();
    LLMT_CHECK(u <= (uint64_t)INT64_MAX && !__builtin_mul_overflow(numel, (int64_t)u, &numel),
               "%s: tensor '%s': element count overflows 64 bits (shape %s)", p, n, clip_for_message(sh.dump()).c_str());
    t.shape.push_back((int64_t)u);
  }
  uint64_t nbytes;
  LLMT_CHECK(!__builtin_mul_overflow((uint64_t)numel, (uint64_t)esize, &nbytes),
             "%s: tensor '%s': byte count overflows 64 bits (shape %s, dtype %s)", p, n, clip_for_message(sh.dump()).c_str(),
             t.dtype.c_str());

  const json& off = v["data_offsets"];
  LLMT_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(),
             "%s: tensor '%s': \"data_offsets\" must be [begin, end] with non-negative integers, found %s", p, n,
             clip_for_message(off.dump()).c_str());
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  LLMT_CHECK(t.begin <= t.end, "%s: tensor '%s': data_offsets begin %llu > end %llu", p, n,
             (unsigned long long)t.begin, (unsigned long long)t.end);
  LLMT_CHECK(t.end - t.begin == nbytes,
             "%s: tensor '%s': size mismatch: data_offsets [%llu, %llu] hold %llu bytes, dtype %s shape %s needs %llu",
             p, n, (unsigned long long)t.begin, (unsigned long long)t.end, (unsigned long long)(t.end - t.begin),
             t.dtype.c_str(), shape_str(t.shape).c_str(), (unsigned long long)nbytes);
  return t;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const char* p = path.c_str();
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  LLMT_CHECK(fd >= 0, "%s: cannot open safetensors file: %s", p, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    fail("%s: not a regular file", p);
  }
  if (st.st_size < 8) {
    close(fd);
    fail("%s: truncated safetensors file: %lld bytes, expected at least 8 (the header length)", p,
         (long long)st.st_size);
  }
  void* m = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  close(fd);  // the mapping keeps the file open
  LLMT_CHECK(m != MAP_FAILED, "%s: mmap failed: %s", p, strerror(map_errno));
  map_ = (const uint8_t*)m;
  map_size_ = (size_t)st.st_size;

  // From here on a throw must unmap: the destructor does not run for a half-built object.
  try {
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | map_[i];  // little-endian on any host
    LLMT_CHECK(hlen <= kMaxHeaderBytes, "%s: header length %llu is absurdly large (limit %llu); not a safetensors file?",
               p, (unsigned long long)hlen, (unsigned long long)kMaxHeaderBytes);
    LLMT_CHECK(hlen <= map_size_ - 8, "%s: truncated: header length %llu but only %llu bytes follow the length field",
               p, (unsigned long long)hlen, (unsigned long long)(map_size_ - 8));
    data_ = map_ + 8 + hlen;
    uint64_t data_size = map_size_ - 8 - hlen;

    // nlohmann keeps the last of duplicate keys silently; a callback spots duplicate tensor names.
    std::set<std::string> keys;
    std::string dup;
    json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
      if (depth == 1 && ev == json::parse_event_t::key && !keys.insert(parsed.get<std::string>()).second && dup.empty())
        dup = parsed.get<std::string>();
      return true;
    };
    json h;
    try {
      check_json_depth((const char*)map_ + 8, (const char*)map_ + 8 + hlen, path_ + ": header");
      h = json::parse(map_ + 8, map_ + 8 + hlen, cb);
    } catch (const json::exception& e) {
      fail("%s: header is not valid JSON: %s", p, e.what());
    }
    LLMT_CHECK(h.is_object(), "%s: header must be a JSON object, found %s", p, h.type_name());
    LLMT_CHECK(dup.empty(), "%s: tensor '%s' appears twice in the header", p, dup.c_str());

    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it.key() == "__metadata__") {
        LLMT_CHECK(it->is_object(), "%s: \"__metadata__\" must be an object of strings, found %s", p,
                   it->type_name());
        for (auto m = it->begin(); m != it->end(); ++m) {
          LLMT_CHECK(m->is_string(), "%s: \"__metadata__\" value for '%s' must be a string, found %s", p,
                     m.key().c_str(), m->type_name());
          metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      StTensor t = parse_entry(path, it.key(), *it);
      LLMT_CHECK(t.end <= data_size,
                 "%s: tensor '%s': data_offsets [%llu, %llu] out of range: the data section holds %llu bytes", p,
                 t.name.c_str(), (unsigned long long)t.begin, (unsigned long long)t.end,
                 (unsigned long long)data_size);
      tensors_.push_back(std::move(t));
    }

    // Overlap: sort by begin and compare each non-empty range with the furthest end seen so far.
    std::vector<const StTensor*> byoff;
    for (const StTensor& t : tensors_) byoff.push_back(&t);
    std::sort(byoff.begin(), byoff.end(), [](const StTensor* a, const StTensor* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    // As the safetensors library validates: the tensors tile the data section exactly, from byte 0
    // to its end, with no overlap, no gap and nothing after the last one.
    const StTensor* last = nullptr;  // the non-empty tensor reaching furthest
    for (const StTensor* t : byoff) {
      if (t->begin == t->end) continue;  // zero bytes overlap nothing
      LLMT_CHECK(!last || t->begin >= last->end,
                 "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap in the data section", p,
                 last ? last->name.c_str() : "", last ? (unsigned long long)last->begin : 0ull,
                 last ? (unsigned long long)last->end : 0ull, t->name.c_str(), (unsigned long long)t->begin,
                 (unsigned long long)t->end);
      const uint64_t expected = last ? last->end : 0;
      LLMT_CHECK(t->begin == expected, "%s: %llu bytes of the data section before tensor '%s' (at %llu) belong to no "
                 "tensor", p, (unsigned long long)(t->begin - expected), t->name.c_str(), (unsigned long long)t->begin);
      last = t;
    }
    const uint64_t covered = last ? last->end : 0;
    LLMT_CHECK(covered == data_size, "%s: %llu bytes after the last tensor's data (which ends at %llu of %llu): not a "
               "safetensors file the safetensors library would load (truncated header or appended data?)", p,
               (unsigned long long)(data_size - covered), (unsigned long long)covered, (unsigned long long)data_size);

    // nlohmann objects iterate in key order, so tensors_ is sorted by name.
    for (size_t i = 0; i < tensors_.size(); i++) index_[tensors_[i].name] = i;
  } catch (...) {
    munmap((void*)map_, map_size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) munmap((void*)map_, map_size_);
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const void* SafetensorsFile::data(const StTensor& t) const { return data_ + t.begin; }

void SafetensorsFile::read_f32(const StTensor& t, float* dst) const {
  const uint8_t* src = data_ + t.begin;
  size_t n = (size_t)t.numel();
  // memcpy per element: the data section is not guaranteed to be aligned in files from other writers
  if (t.dtype == "F32") {
    std::memcpy(dst, src, n * 4);
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    bool bf16 = t.dtype == "BF16";
    for (size_t i = 0; i < n; i++) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      dst[i] = bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  } else {
    fail("%s: tensor '%s': cannot read dtype %s as f32 (expected F32, BF16 or F16)", path_.c_str(), t.name.c_str(),
         t.dtype.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// checkpoints: one file, or an index plus shards

static bool is_file(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

static bool is_dir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

static std::string read_text_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LLMT_CHECK(fd >= 0, "%s: cannot open: %s", path.c_str(), strerror(errno));
  std::string s;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int e = errno;
      close(fd);
      fail("%s: read failed: %s", path.c_str(), strerror(e));
    }
    if (r == 0) break;
    s.append(buf, (size_t)r);
  }
  close(fd);
  return s;
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir_or_file) {
  const char* p = dir_or_file.c_str();
  std::vector<std::string> shard_names;  // files named by the index, in first-seen order
  std::map<std::string, std::string> weight_map;
  std::string index_path, dir;

  if (is_file(dir_or_file)) {
    files_.emplace_back(new SafetensorsFile(dir_or_file));
  } else {
    LLMT_CHECK(is_dir(dir_or_file), "%s: no such safetensors file or model directory", p);
    dir = dir_or_file;
    if (dir.back() != '/') dir += '/';
    index_path = dir + "model.safetensors.index.json";
    if (is_file(dir + "model.safetensors")) {  // preferred over the index, as in transformers
      files_.emplace_back(new SafetensorsFile(dir + "model.safetensors"));
    } else {
      LLMT_CHECK(is_file(index_path), "%s: no model.safetensors or model.safetensors.index.json in this directory", p);
      const char* ip = index_path.c_str();
      json idx;
      try {
        const std::string text = read_text_file(index_path);
        check_json_depth(text, index_path);
        idx = json::parse(text);
      } catch (const json::exception& e) {
        fail("%s: not valid JSON: %s", ip, e.what());
      }
      LLMT_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(),
                 "%s: malformed index: expected an object with a \"weight_map\" object", ip);
      std::set<std::string> seen;
      for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
        LLMT_CHECK(it->is_string(), "%s: malformed index: weight_map value for tensor '%s' must be a file name, found %s",
                   ip, it.key().c_str(), it->type_name());
        std::string f = it->get<std::string>();
        // shards sit beside the index; a path there could reach outside the model directory
        LLMT_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
                   "%s: malformed index: tensor '%s' maps to '%s', expected a file name in the same directory", ip,
                   it.key().c_str(), f.c_str());
        LLMT_CHECK(is_file(dir + f), "%s: weight_map maps tensor '%s' to %s%s, which does not exist", ip,
                   it.key().c_str(), dir.c_str(), f.c_str());
        weight_map[it.key()] = f;
        if (seen.insert(f).second) shard_names.push_back(f);
      }
      LLMT_CHECK(!shard_names.empty(), "%s: malformed index: weight_map is empty", ip);
      for (const std::string& f : shard_names) files_.emplace_back(new SafetensorsFile(dir + f));
    }
  }

  for (const auto& f : files_) {
    for (const StTensor& t : f->tensors()) {
      auto ins = tensors_.insert({t.name, {f.get(), &t}});
      LLMT_CHECK(ins.second, "%s: tensor '%s' appears in two shards: %s and %s", p, t.name.c_str(),
                 ins.first->second.first->path().c_str(), f->path().c_str());
    }
  }
  for (const auto& kv : weight_map) {
    std::string want = dir + kv.second;
    auto it = tensors_.find(kv.first);
    LLMT_CHECK(it != tensors_.end() && it->second.first->path() == want,
               "%s: weight_map places tensor '%s' in %s, but that shard does not contain it", index_path.c_str(),
               kv.first.c_str(), want.c_str());
  }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> v;
  for (const auto& kv : tensors_) v.push_back(kv.first);  // std::map: already sorted
  return v;
}

const StTensor* SafetensorsCheckpoint::find(const std::string& name, const SafetensorsFile** file) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return nullptr;
  if (file) *file = it->second.first;
  return it->second.second;
}

// ---------------------------------------------------------------------------------------------
// writing

struct Chunk {
  const void* p;
  size_t n;
};

// Writes path + ".tmp", fsyncs it, renames it over path, then fsyncs the directory. On any failure the
// temporary is removed and path is left as it was.
static void write_atomic(const std::string& path, const std::vector<Chunk>& chunks) {
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LLMT_CHECK(fd >= 0, "%s: cannot create %s: %s", path.c_str(), tmp.c_str(), strerror(errno));
  auto bail = [&](const char* what) {
    int e = errno;
    close(fd);
    unlink(tmp.c_str());
    fail("%s: %s failed on %s: %s", path.c_str(), what, tmp.c_str(), strerror(e));
  };
  for (const Chunk& c : chunks) {
    const char* s = (const char*)c.p;
    size_t left = c.n;
    while (left > 0) {  // write() may be partial (and caps one call near 2 GB)
      ssize_t w = write(fd, s, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) bail("write");
      s += w;
      left -= (size_t)w;
    }
  }
  if (fsync(fd) != 0) bail("fsync");
  if (close(fd) != 0) {
    int e = errno;
    unlink(tmp.c_str());
    fail("%s: close failed on %s: %s", path.c_str(), tmp.c_str(), strerror(e));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    unlink(tmp.c_str());
    fail("%s: rename from %s failed: %s", path.c_str(), tmp.c_str(), strerror(e));
  }
  // make the rename itself durable; best effort (some filesystems refuse fsync on a directory)
  size_t slash = path.rfind('/');
  std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  int dfd = open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_atomic(path, {{bytes.data(), bytes.size()}});
}

// The reference writer orders tensors by dtype, widest first, then by name: with the header padded to
// 8 bytes this aligns every tensor to its element size. Rank as in its Dtype enum: F32 > I32 > BF16 > F16.
static int dtype_rank(const std::string& dt) {
  if (dt == "F32") return 3;
  if (dt == "I32") return 2;
  if (dt == "BF16") return 1;
  return 0;  // F16
}

// Validates an entry's dtype and shape and returns its byte count; with need_data, also that its data is there.
static uint64_t entry_bytes(const std::string& path, const StEntry& e, bool need_data = true) {
  const char* p = path.c_str();
  const char* n = e.name.c_str();
  LLMT_CHECK(e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16" || e.dtype == "I32",
             "%s: tensor '%s': cannot write dtype '%s' (expected F32, BF16, F16 or I32)", p, n, e.dtype.c_str());
  uint64_t numel = 1;
  for (int64_t d : e.shape) {
    LLMT_CHECK(d >= 0, "%s: tensor '%s': negative dimension %lld in shape", p, n, (long long)d);
    LLMT_CHECK(!__builtin_mul_overflow(numel, (uint64_t)d, &numel) && numel <= (uint64_t)INT64_MAX,
               "%s: tensor '%s': element count overflows 64 bits", p, n);
  }
  uint64_t bytes = numel * st_dtype_size(e.dtype);  // numel < 2^63, size <= 4: checked below
  LLMT_CHECK(bytes / st_dtype_size(e.dtype) == numel, "%s: tensor '%s': byte count overflows 64 bits", p, n);
  LLMT_CHECK(!need_data || bytes == 0 || e.data, "%s: tensor '%s': data is null", p, n);
  return bytes;
}

// The header of a file holding `entries`, laid out as the reference writer does: tensors sorted by
// dtype (widest first) then name, keys in its order (metadata first; dtype, shape, data_offsets), padded
// with spaces so the data section starts 8-byte aligned. Fills data_offset[i] (relative to the data
// section) for entries[i]; returns the 8-byte length prefix and the header as one string.
static std::string build_header(const std::string& path, const std::vector<StEntry>& entries,
                                const std::map<std::string, std::string>& metadata, std::vector<uint64_t>& data_offset) {
  const char* p = path.c_str();
  std::vector<size_t> order;
  std::set<std::string> names;
  for (size_t i = 0; i < entries.size(); i++) {
    const StEntry& e = entries[i];
    LLMT_CHECK(!e.name.empty() && e.name != "__metadata__", "%s: invalid tensor name '%s'", p, e.name.c_str());
    LLMT_CHECK(names.insert(e.name).second, "%s: tensor '%s' given twice", p, e.name.c_str());
    entry_bytes(path, e, false);  // validates
    order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int ra = dtype_rank(entries[a].dtype), rb = dtype_rank(entries[b].dtype);
    return ra != rb ? ra > rb : entries[a].name < entries[b].name;
  });

  // Built by hand to keep the reference's key order; nlohmann only escapes the strings.
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& kv : metadata) {
      h += (first ? "" : ",") + json(kv.first).dump() + ":" + json(kv.second).dump();
      first = false;
    }
    h += "}";
  }
  data_offset.assign(entries.size(), 0);
  uint64_t off = 0;
  for (size_t i : order) {
    const StEntry& e = entries[i];
    uint64_t bytes = entry_bytes(path, e, false);
    if (h.size() > 1) h += ",";
    h += json(e.name).dump() + ":{\"dtype\":\"" + e.dtype + "\",\"shape\":[";
    for (size_t k = 0; k < e.shape.size(); k++) h += (k ? "," : "") + std::to_string(e.shape[k]);
    h += "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + bytes) + "]}";
    data_offset[i] = off;
    off += bytes;
  }
  h += "}";
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; i++) out[i] = (char)(uint8_t)((uint64_t)h.size() >> (8 * i));
  return out + h;
}

void write_safetensors(const std::string& path, const std::vector<StEntry>& entries,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<uint64_t> offset;
  std::string header = build_header(path, entries, metadata, offset);
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); i++) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return offset[a] < offset[b]; });
  std::vector<Chunk> chunks = {{header.data(), header.size()}};
  for (size_t i : order) {
    uint64_t bytes = entry_bytes(path, entries[i]);
    if (bytes > 0) chunks.push_back({entries[i].data, (size_t)bytes});
  }
  write_atomic(path, chunks);
}

// model-00001-of-00003.safetensors: huggingface_hub's "model{suffix}.safetensors" with suffix
// "-{i:05d}-of-{n:05d}".
static std::string shard_name(size_t i, size_t n) {
  return strformat("model-%05zu-of-%05zu.safetensors", i + 1, n);
}

// model-DDDDD-of-DDDDD.safetensors, the only names an earlier save could have left
static bool is_shard_name(const std::string& f) {
  const char* pat = "model-#####-of-#####.safetensors";
  if (f.size() != strlen(pat)) return false;
  for (size_t i = 0; i < f.size(); i++)
    if (pat[i] == '#' ? !isdigit((unsigned char)f[i]) : f[i] != pat[i]) return false;
  return true;
}

// fsync a directory so renames in it are durable; best effort (some filesystems refuse).
static void fsync_dir(const std::string& dir) {
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
}

SafetensorsModelWriter::SafetensorsModelWriter(const std::string& dir, const std::vector<StEntry>& entries,
                                               uint64_t max_shard_bytes)
    : dir_(dir.back() == '/' ? dir.substr(0, dir.size() - 1) : dir), entries_(entries) {
  const char* d = dir_.c_str();
  if (mkdir(d, 0755) != 0 && errno != EEXIST) fail("%s: cannot create directory: %s", d, strerror(errno));
  LLMT_CHECK(is_dir(dir_), "%s: not a directory", d);
  std::set<std::string> names;
  for (const StEntry& e : entries_)
    LLMT_CHECK(names.insert(e.name).second, "%s: tensor '%s' given twice", d, e.name.c_str());

  // Split as huggingface_hub's split_state_dict_into_shards_factory does, including its one quirk:
  // a tensor over the limit is appended as its own shard at once, ahead of the shard being filled.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> cur;
  uint64_t cur_bytes = 0;
  for (size_t i = 0; i < entries_.size(); i++) {
    uint64_t bytes = entry_bytes(dir_ + "/model.safetensors", entries_[i], false);
    total_bytes_ += bytes;
    if (bytes > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (cur_bytes + bytes > max_shard_bytes) {
      shards.push_back(std::move(cur));
      cur.clear();
      cur_bytes = 0;
    }
    cur.push_back(i);
    cur_bytes += bytes;
  }
  if (!cur.empty() || shards.empty()) shards.push_back(std::move(cur));

  // Each file: its header now, its tensors' bytes as write() gets them, at precomputed positions.
  where_.assign(entries_.size(), {0, 0});
  try {
    for (size_t k = 0; k < shards.size(); k++) {
      File f;
      f.name = shards.size() == 1 ? "model.safetensors" : shard_name(k, shards.size());
      f.tmp = dir_ + "/" + f.name + ".tmp";
      std::vector<StEntry> in_file;
      for (size_t i : shards[k]) in_file.push_back(entries_[i]);
      std::vector<uint64_t> offset;
      std::string header = build_header(dir_ + "/" + f.name, in_file, {{"format", "pt"}}, offset);
      f.fd = open(f.tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      LLMT_CHECK(f.fd >= 0, "%s: cannot create %s: %s", d, f.tmp.c_str(), strerror(errno));
      files_.push_back(f);
      pwrite_all(files_.size() - 1, header.data(), header.size(), 0);
      for (size_t j = 0; j < shards[k].size(); j++) where_[shards[k][j]] = {files_.size() - 1, header.size() + offset[j]};
    }
  } catch (...) {
    abandon();  // the destructor does not run for a constructor that throws
    throw;
  }
  written_.assign(entries_.size(), false);
}

SafetensorsModelWriter::~SafetensorsModelWriter() {
  if (!finished_) abandon();
}

// Unfinished (an error here or elsewhere): leave nothing half-written behind.
void SafetensorsModelWriter::abandon() {
  for (File& f : files_) {
    if (f.fd >= 0) close(f.fd);
    f.fd = -1;
    unlink(f.tmp.c_str());
  }
}

void SafetensorsModelWriter::pwrite_all(size_t file, const void* data, size_t n, uint64_t pos) {
  File& f = files_[file];
  const char* s = (const char*)data;
  while (n > 0) {
    ssize_t w = pwrite(f.fd, s, n, (off_t)pos);
    if (w < 0 && errno == EINTR) continue;
    LLMT_CHECK(w > 0, "%s/%s: write failed: %s", dir_.c_str(), f.name.c_str(), strerror(errno));
    s += w;
    n -= (size_t)w;
    pos += (uint64_t)w;
  }
}

void SafetensorsModelWriter::write(size_t index, const void* data) {
  LLMT_CHECK(index < entries_.size() && !written_[index], "%s: tensor #%zu written twice or unknown", dir_.c_str(),
             index);
  uint64_t bytes = entry_bytes(dir_ + "/model.safetensors", entries_[index], false);
  LLMT_CHECK(bytes == 0 || data, "%s: tensor '%s': data is null", dir_.c_str(), entries_[index].name.c_str());
  if (bytes > 0) pwrite_all(where_[index].first, data, (size_t)bytes, where_[index].second);
  written_[index] = true;
}

void SafetensorsModelWriter::finish() {
  const char* d = dir_.c_str();
  for (size_t i = 0; i < entries_.size(); i++)
    LLMT_CHECK(written_[i], "%s: tensor '%s' was never written", d, entries_[i].name.c_str());
  std::set<std::string> keep;
  for (File& f : files_) {
    LLMT_CHECK(fsync(f.fd) == 0, "%s: fsync of %s failed: %s", d, f.tmp.c_str(), strerror(errno));
    LLMT_CHECK(close(f.fd) == 0, "%s: close of %s failed: %s", d, f.tmp.c_str(), strerror(errno));
    f.fd = -1;
  }
  for (File& f : files_) {
    LLMT_CHECK(rename(f.tmp.c_str(), (dir_ + "/" + f.name).c_str()) == 0, "%s: rename of %s failed: %s", d,
               f.tmp.c_str(), strerror(errno));
    keep.insert(f.name);
  }
  if (files_.size() > 1) {
    json wm = json::object();
    for (size_t i = 0; i < entries_.size(); i++) wm[entries_[i].name] = files_[where_[i].first].name;
    json idx = {{"metadata", {{"total_size", total_bytes_}}}, {"weight_map", wm}};
    std::string text = idx.dump(2, ' ', true) + "\n";  // as json.dumps(indent=2, sort_keys=True)
    write_atomic(dir_ + "/model.safetensors.index.json", {{text.data(), text.size()}});
    keep.insert("model.safetensors.index.json");
    // only now, with the new shards and index in place: an old single file would win over the index
    unlink((dir_ + "/model.safetensors").c_str());
  }
  // Remove what an earlier save left: the index and shards the new layout does not use.
  std::vector<std::string> stale;
  if (DIR* dp = opendir(d)) {
    while (struct dirent* de = readdir(dp)) {
      std::string f = de->d_name;
      if ((f == "model.safetensors.index.json" || is_shard_name(f)) && !keep.count(f)) stale.push_back(f);
    }
    closedir(dp);
  }
  for (const std::string& f : stale) unlink((dir_ + "/" + f).c_str());
  fsync_dir(dir_);
  finished_ = true;
}

void write_safetensors_model(const std::string& dir, const std::vector<StEntry>& entries, uint64_t max_shard_bytes) {
  SafetensorsModelWriter w(dir, entries, max_shard_bytes);
  for (size_t i = 0; i < entries.size(); i++) w.write(i, entries[i].data);
  w.finish();
}

}  // namespace llmt
