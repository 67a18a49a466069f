#include "data/utf8.h"

namespace llmt {

int64_t find_invalid_utf8(std::string_view s) {
  const uint8_t* p = (const uint8_t*)s.data();
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      i++;
      continue;
    }
    uint32_t cp;
    int bad;
    const int len = utf8_decode(p + i, n - i, &cp, &bad);
    if (len == 0) return (int64_t)i;
    i += (size_t)len;
  }
  return -1;
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const uint8_t* p = (const uint8_t*)s.data();
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    uint32_t cp;
    int bad = 0;
    const int len = utf8_decode(p + i, n - i, &cp, &bad);
    if (len > 0) {
      out.append(s.data() + i, (size_t)len);
      i += (size_t)len;
    } else {
      out += "\xef\xbf\xbd";  // U+FFFD
      i += (size_t)bad;
    }
  }
  return out;
}

}  // namespace llmt
