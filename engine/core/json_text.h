// Limits on JSON text from files, before any JSON library sees it. Real files nest a few levels
// (tokenizer.json about 5, a safetensors header 3); a hostile or broken one can nest 100k deep,
// and printing such a value back recurses until the stack overflows. So every JSON text llmt reads
// is checked for depth first, and values quoted in messages are clipped.
#pragma once
#include <cstddef>
#include <string>

namespace llmt {

constexpr int kMaxJsonDepth = 100;

// Throws llmt::Error naming `what` and the byte offset where [begin, end) nests deeper than
// kMaxJsonDepth arrays and objects (brackets inside strings do not count).
void check_json_depth(const char* begin, const char* end, const std::string& what);
inline void check_json_depth(const std::string& text, const std::string& what) {
  check_json_depth(text.data(), text.data() + text.size(), what);
}

// A value quoted in an error message: at most `limit` characters, then "... (N bytes)".
std::string clip_for_message(const std::string& s, size_t limit = 80);

}  // namespace llmt
