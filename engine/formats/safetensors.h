// Hugging Face safetensors: read (mmap, validated on open) and write (atomic), single-file and sharded.
//
// File layout: u64 little-endian header length N, then N bytes of JSON header, then the data section.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with offsets
// relative to the start of the data section; the optional "__metadata__" maps strings to strings.
// Sharded models add model.safetensors.index.json: {"metadata": {...}, "weight_map": {name: file}}.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmt {

// Bytes per element of a safetensors dtype name ("F32", "BF16", ...); 0 when the name is unknown.
size_t st_dtype_size(const std::string& dtype);

struct StTensor {  // one entry of a safetensors header
  std::string name;
  std::string dtype;  // as in the file: "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the start of the data section
  int64_t numel() const;
};

// One file, memory-mapped read-only, fully validated on open: every tensor's bytes lie inside
// the data section, match its dtype and shape, and overlap no other tensor's.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StTensor>& tensors() const { return tensors_; }  // sorted by name
  const StTensor* find(const std::string& name) const;               // nullptr when absent
  const void* data(const StTensor& t) const;                         // may be unaligned
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // "__metadata__"

  // Converts a tensor to f32 into dst (t.numel() floats). F32, BF16 and F16 are supported;
  // another dtype is an error naming the file, the tensor and the dtype.
  void read_f32(const StTensor& t, float* dst) const;

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;  // the whole file
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section, inside map_
  std::vector<StTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A model's weights: a directory holding model.safetensors, or model.safetensors.index.json plus
// the shard files its weight_map names (model.safetensors wins when both exist, as in transformers).
// Also accepts the path of a single .safetensors file.
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& dir_or_file);
  SafetensorsCheckpoint(const SafetensorsCheckpoint&) = delete;
  SafetensorsCheckpoint& operator=(const SafetensorsCheckpoint&) = delete;

  std::vector<std::string> names() const;  // every tensor name, sorted
  // nullptr when absent; else the tensor, and the file that holds it in *file (when file is not null).
  const StTensor* find(const std::string& name, const SafetensorsFile** file) const;
  // The weight files it reads, in the order opened (model.safetensors, or the index's shards).
  std::vector<std::string> file_paths() const {
    std::vector<std::string> out;
    for (const auto& f : files_) out.push_back(f->path());
    return out;
  }

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const StTensor*>> tensors_;
};

struct StEntry {  // a tensor to write; dtype "F32", "BF16", "F16" or "I32"; bytes = numel * dtype size
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data;
};

// Writes any file atomically: to path + ".tmp", fsync, rename over path, fsync the directory; on a
// failure the temporary is removed and path is left as it was.
void write_file_atomic(const std::string& path, const std::string& bytes);

// Writes one file atomically (path + ".tmp", fsync, rename), laid out as the reference writer does:
// tensors sorted by dtype (widest first) then name, header padded with spaces to a multiple of 8 bytes,
// so every tensor is aligned to its element size. Empty metadata writes no "__metadata__".
void write_safetensors(const std::string& path, const std::vector<StEntry>& entries,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes dir/model.safetensors when everything fits in max_shard_bytes, else
// dir/model-00001-of-0000N.safetensors ... and dir/model.safetensors.index.json, named and split as
// transformers' save_pretrained does (huggingface_hub's split_state_dict_into_shards): entries are taken
// in the given order, a new shard starts when the next tensor would pass the limit, and a tensor larger
// than the limit gets a shard of its own. Creates dir if absent; removes weight files of an earlier
// save there that the new layout does not use.
void write_safetensors_model(const std::string& dir, const std::vector<StEntry>& entries, uint64_t max_shard_bytes);

// The same model layout written tensor by tensor, so a caller never holds every tensor at once (the
// trainer's export gathers one FSDP unit at a time). The constructor fixes names, dtypes, shapes and
// the shard split (the entries' data is not read) and writes the headers to temporary files; write(i)
// puts entry i's bytes in place, in any order; finish() checks every tensor arrived, fsyncs and
// renames the files into place and writes the index. Destroyed unfinished, it removes its files.
class SafetensorsModelWriter {
 public:
  SafetensorsModelWriter(const std::string& dir, const std::vector<StEntry>& entries, uint64_t max_shard_bytes);
  ~SafetensorsModelWriter();
  SafetensorsModelWriter(const SafetensorsModelWriter&) = delete;
  SafetensorsModelWriter& operator=(const SafetensorsModelWriter&) = delete;
  void write(size_t index, const void* data);  // numel * dtype size bytes
  void finish();

 private:
  struct File {
    std::string name, tmp;
    int fd = -1;
  };
  void pwrite_all(size_t file, const void* data, size_t n, uint64_t pos);
  void abandon();
  std::string dir_;
  std::vector<StEntry> entries_;
  std::vector<File> files_;
  std::vector<std::pair<size_t, uint64_t>> where_;  // entry -> (file, byte position)
  std::vector<bool> written_;
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace llmt
