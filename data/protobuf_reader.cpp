#include "data/protobuf_reader.h"

#include <cstring>

#include "engine/core/error.h"

namespace llmt {

void ProtoReader::truncated(const char* reading) const {
  fail("%s: protobuf data ends inside %s at byte %zu (truncated or not a protobuf file)",
       what_.c_str(), reading, offset());
}

uint64_t ProtoReader::varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p_ >= end_) truncated("a varint");
    uint8_t b = *p_++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
  fail("%s: varint longer than 10 bytes at byte %zu (corrupt protobuf)", what_.c_str(), offset());
}

bool ProtoReader::next(uint32_t* field, uint32_t* wire) {
  if (p_ >= end_) return false;
  size_t at = offset();
  uint64_t key = varint();
  *field = (uint32_t)(key >> 3);
  *wire = (uint32_t)(key & 7);
  LLMT_CHECK(*field != 0 && (key >> 3) <= 0x1fffffff, "%s: invalid protobuf field number %llu at byte %zu",
             what_.c_str(), (unsigned long long)(key >> 3), at);
  LLMT_CHECK(*wire == kWireVarint || *wire == kWireFixed64 || *wire == kWireBytes || *wire == kWireFixed32,
             "%s: unsupported protobuf wire type %u (field %u) at byte %zu (corrupt, or not a protobuf file)",
             what_.c_str(), *wire, *field, at);
  return true;
}

uint32_t ProtoReader::fixed32() {
  if (end_ - p_ < 4) truncated("a fixed32 value");
  uint32_t v = (uint32_t)p_[0] | (uint32_t)p_[1] << 8 | (uint32_t)p_[2] << 16 | (uint32_t)p_[3] << 24;
  p_ += 4;
  return v;
}

uint64_t ProtoReader::fixed64() {
  if (end_ - p_ < 8) truncated("a fixed64 value");
  uint64_t lo = fixed32();
  uint64_t hi = fixed32();
  return lo | hi << 32;
}

float ProtoReader::float32() {
  uint32_t bits = fixed32();
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::string_view ProtoReader::bytes() {
  size_t at = offset();
  uint64_t n = varint();
  LLMT_CHECK(n <= (uint64_t)(end_ - p_), "%s: length-delimited field of %llu bytes at byte %zu runs past the end "
             "of its message (%zu bytes left; truncated or corrupt)", what_.c_str(), (unsigned long long)n, at,
             (size_t)(end_ - p_));
  std::string_view s((const char*)p_, (size_t)n);
  p_ += n;
  return s;
}

ProtoReader ProtoReader::message(const std::string& what) {
  std::string_view s = bytes();
  size_t base = offset() - s.size();
  return ProtoReader((const uint8_t*)s.data(), s.size(), what, base);
}

void ProtoReader::skip(uint32_t wire) {
  switch (wire) {
    case kWireVarint: varint(); break;
    case kWireFixed64: fixed64(); break;
    case kWireBytes: bytes(); break;
    case kWireFixed32: fixed32(); break;
    default: fail("%s: cannot skip protobuf wire type %u at byte %zu", what_.c_str(), wire, offset());
  }
}

void ProtoReader::expect(uint32_t field, uint32_t wire, uint32_t want, const char* field_name) const {
  LLMT_CHECK(wire == want, "%s: field %u (%s) has wire type %u, expected %u (corrupt or not this message type)",
             what_.c_str(), field, field_name, wire, want);
}

}  // namespace llmt
