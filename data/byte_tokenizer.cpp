#include "data/byte_tokenizer.h"

#include "engine/core/error.h"

namespace llmt {

namespace {

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); i++) ids[i] = (unsigned char)text[i];
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); i++) {
      LLMT_CHECK(ids[i] >= 0 && ids[i] < 256, "byte tokenizer: id %d at position %zu is not a byte", ids[i], i);
      s[i] = (char)ids[i];
    }
    return s;
  }
  size_t min_ids_for_bytes(size_t bytes) const override { return bytes; }
  int vocab_size() const override { return 256; }
  int bos_id() const override { return -1; }
  int eos_id() const override { return -1; }
  bool adds_bos() const override { return false; }
  bool adds_eos() const override { return false; }
  std::string kind() const override { return "bytes"; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace llmt
