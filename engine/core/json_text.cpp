#include "engine/core/json_text.h"

#include "engine/core/error.h"

namespace llmt {

void check_json_depth(const char* begin, const char* end, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (const char* p = begin; p < end; p++) {
    const char c = *p;
    if (in_string) {
      if (c == '\\') p++;  // skip the escaped character (an escaped quote does not end the string)
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth)
        fail("%s: JSON nested more than %d levels deep at byte %lld: not a file llmt reads (a real one nests a few "
             "levels)", what.c_str(), kMaxJsonDepth, (long long)(p - begin));
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
}

std::string clip_for_message(const std::string& s, size_t limit) {
  if (s.size() <= limit) return s;
  return s.substr(0, limit) + strformat("... (%zu bytes)", s.size());
}

}  // namespace llmt
