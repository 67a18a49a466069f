#include "train/tensorboard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>

#include "data/protobuf_reader.h"
#include "engine/core/crc32c.h"
#include "engine/core/error.h"

namespace llmt {

namespace {

uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t crc = crc32c(0, data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// ---- the protobuf wire format, the few pieces an Event needs ----
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += (char)((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += (char)v;
}
void put_key(std::string& out, uint32_t field, uint32_t wire) { put_varint(out, (uint64_t)field << 3 | wire); }
void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kWireBytes);
  put_varint(out, bytes.size());
  out += bytes;
}
template <typename T>
void put_fixed(std::string& out, uint32_t field, T v) {  // little-endian, as x86 and ARM hold it
  put_key(out, field, sizeof(T) == 8 ? kWireFixed64 : kWireFixed32);
  out.append((const char*)&v, sizeof(T));
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void make_dirs(const std::string& dir) {
  for (size_t at = 1; at <= dir.size(); at++) {
    if (at != dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      fail("--logging_dir: cannot create %s: %s", part.c_str(), std::strerror(errno));
  }
}

}  // namespace

std::string default_logging_dir(const std::string& output_dir) {
  const std::time_t t = std::time(nullptr);
  std::tm local;
  localtime_r(&t, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%b%d_%H-%M-%S", &local);  // transformers' "%b%d_%H-%M-%S"
  return output_dir + "/runs/" + stamp + "_" + host_name();
}

std::string tensorboard_tag(const std::string& key) {
  if (key.rfind("eval_", 0) == 0) return "eval/" + key.substr(5);
  if (key.rfind("test_", 0) == 0) return "test/" + key.substr(5);
  return "train/" + key;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  make_dirs(dir);
  path_ = strformat("%s/events.out.tfevents.%lld.%s.%lld.0", dir.c_str(), (long long)std::time(nullptr),
                    host_name().c_str(), (long long)getpid());
  f_ = std::fopen(path_.c_str(), "wb");
  LLMT_CHECK(f_, "--report_to tensorboard: cannot create %s: %s", path_.c_str(), std::strerror(errno));
  std::string event;
  put_fixed<double>(event, 1, unix_now());
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::close() {
  if (!f_) return;
  const int rc = std::fclose(f_);
  f_ = nullptr;
  LLMT_CHECK(rc == 0, "--report_to tensorboard: closing %s failed: %s", path_.c_str(), std::strerror(errno));
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_fixed<float>(v, 2, (float)value);
    put_bytes(summary, 1, v);
  }
  std::string event;
  put_fixed<double>(event, 1, unix_now());
  put_key(event, 2, kWireVarint);
  put_varint(event, (uint64_t)step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardWriter::write_record(const std::string& data) {
  LLMT_CHECK(f_, "--report_to tensorboard: %s is closed", path_.c_str());
  const uint64_t len = data.size();
  const uint32_t len_crc = masked_crc(&len, sizeof(len)), data_crc = masked_crc(data.data(), data.size());
  const bool ok = std::fwrite(&len, sizeof(len), 1, f_) == 1 && std::fwrite(&len_crc, 4, 1, f_) == 1 &&
                  std::fwrite(data.data(), 1, data.size(), f_) == data.size() && std::fwrite(&data_crc, 4, 1, f_) == 1 &&
                  std::fflush(f_) == 0;
  LLMT_CHECK(ok, "--report_to tensorboard: writing %s failed: %s", path_.c_str(), std::strerror(errno));
}

TbFile read_tensorboard_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LLMT_CHECK(in, "cannot open TensorBoard file %s", path.c_str());
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TbFile out;
  size_t at = 0;
  while (at < bytes.size()) {
    LLMT_CHECK(bytes.size() - at >= 12, "%s: offset %zu: a record header is cut short", path.c_str(), at);
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, bytes.data() + at, 8);
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    LLMT_CHECK(len_crc == masked_crc(&len, 8), "%s: offset %zu: the record length fails its CRC", path.c_str(), at);
    LLMT_CHECK(len <= bytes.size() - at - 12 && bytes.size() - at - 12 - len >= 4,
               "%s: offset %zu: a record of %llu bytes runs past the end of the file", path.c_str(), at,
               (unsigned long long)len);
    const char* data = bytes.data() + at + 12;
    std::memcpy(&data_crc, data + len, 4);
    LLMT_CHECK(data_crc == masked_crc(data, len), "%s: offset %zu: the record's data fails its CRC", path.c_str(), at);
    ProtoReader event((const uint8_t*)data, len, path + ": event", at + 12);
    double wall_time = 0;
    int64_t step = 0;
    uint32_t field, wire;
    std::vector<TbScalar> found;
    while (event.next(&field, &wire)) {
      if (field == 1 && wire == kWireFixed64) {
        const uint64_t bits = event.fixed64();
        std::memcpy(&wall_time, &bits, 8);
      } else if (field == 2 && wire == kWireVarint) {
        step = (int64_t)event.varint();
      } else if (field == 3 && wire == kWireBytes) {
        out.file_version = std::string(event.bytes());
      } else if (field == 5 && wire == kWireBytes) {
        ProtoReader summary = event.message(path + ": summary");
        while (summary.next(&field, &wire)) {
          if (field != 1 || wire != kWireBytes) {
            summary.skip(wire);
            continue;
          }
          ProtoReader value = summary.message(path + ": summary value");
          TbScalar s;
          while (value.next(&field, &wire)) {
            if (field == 1 && wire == kWireBytes) s.tag = std::string(value.bytes());
            else if (field == 2 && wire == kWireFixed32) s.value = value.float32();
            else value.skip(wire);
          }
          found.push_back(s);
        }
      } else {
        event.skip(wire);
      }
    }
    for (TbScalar& s : found) {
      s.step = step;
      s.wall_time = wall_time;
      out.scalars.push_back(s);
    }
    at += 12 + len + 4;
  }
  return out;
}

}  // namespace llmt
