// A minimal reader of the protobuf wire format (no generated code, no libprotobuf): enough to walk
// a serialized message field by field, e.g. a SentencePiece ModelProto. Every read is bounds-checked
// and throws llmt::Error naming `what` (file and record) and the byte offset; nothing can overrun.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace llmt {

enum ProtoWire : uint32_t { kWireVarint = 0, kWireFixed64 = 1, kWireBytes = 2, kWireFixed32 = 5 };

class ProtoReader {
 public:
  // Reads the message in data[0, size). `what` names it in errors ("tokenizer.model: trainer_spec");
  // `base` is the message's offset in the file, so errors give file offsets.
  ProtoReader(const uint8_t* data, size_t size, std::string what, size_t base = 0)
      : p_(data), begin_(data), end_(data + size), what_(std::move(what)), base_(base) {}

  // The next field's number and wire type; false at the end of the message. Rejects field 0,
  // groups (wire types 3, 4) and the unused wire types 6, 7.
  bool next(uint32_t* field, uint32_t* wire);
  // The value of the field just returned by next(); the caller checks the wire type with expect().
  uint64_t varint();
  uint32_t fixed32();
  uint64_t fixed64();
  float float32();
  std::string_view bytes();
  // A length-delimited field read as an embedded message, named `what` in its errors.
  ProtoReader message(const std::string& what);
  // Skips the value of a field of wire type `wire` (an unknown field).
  void skip(uint32_t wire);
  // Throws unless the field just returned has wire type `want`.
  void expect(uint32_t field, uint32_t wire, uint32_t want, const char* field_name) const;

  size_t offset() const { return base_ + (size_t)(p_ - begin_); }
  const std::string& what() const { return what_; }

 private:
  [[noreturn]] void truncated(const char* reading) const;
  const uint8_t* p_;
  const uint8_t* begin_;
  const uint8_t* end_;
  std::string what_;
  size_t base_;
};

}  // namespace llmt
