// The chat-template evaluator: a lexer that cuts the template into text and tags and applies
// Jinja's whitespace rules, a recursive-descent parser to a small tree (statements and expressions),
// and a tree walker over values that are JSON values (Python's none/bool/int/float/str/list/dict),
// undefined, a namespace or a callable. Python's semantics where templates can tell: truthiness,
// == between numbers of any type, code-point string length/slicing, str() and repr() of values,
// json.dumps for tojson.
#include "data/chat_template.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <set>

#include "engine/core/error.h"

namespace llmt {

using ojson = nlohmann::ordered_json;

namespace {

// Nesting deeper than this (brackets, `not`s, blocks, chains like a ~ b ~ c ~ ...) is refused when
// the template is parsed, and values nested deeper are refused when rendered: the parser and the tree
// walker recurse, and a hostile template must get an error, not a stack overflow. Python's own
// parser refuses 200 nested brackets.
constexpr int kMaxDepth = 256;
// Render limits (a template is data: a hostile one must fail cleanly, not take the machine): the
// size of any string or list made, and the loop iterations of one rendering.
constexpr size_t kMaxBytes = size_t(1) << 26, kMaxItems = size_t(1) << 22;  // 64 MiB, 4M items
constexpr int64_t kMaxIterations = 1000000;
// a limit hit where the line is not known (deep values in repr, tojson, ==); render() adds the line
struct RenderLimit {
  std::string msg;
};
[[noreturn]] void too_deep() {
  throw RenderLimit{"a value nested deeper than " + std::to_string(kMaxDepth) + " levels"};
}

// ---- values ----

struct Val {
  enum Kind { kUndef, kJson, kNs, kFunc } k = kUndef;
  ojson j;                      // kJson; kFunc: the bound receiver of a method
  std::shared_ptr<ojson> ns;    // kNs: the namespace's attributes (shared: ns.x = ... is seen by all)
  std::string name;             // kUndef: what was looked up (for errors); kFunc: the function or method
  static Val of(ojson v) {
    Val r;
    r.k = kJson;
    r.j = std::move(v);
    return r;
  }
  static Val undef(std::string what) {
    Val r;
    r.name = std::move(what);
    return r;
  }
  static Val func(std::string n, ojson self = nullptr) {
    Val r;
    r.k = kFunc;
    r.name = std::move(n);
    r.j = std::move(self);
    return r;
  }
  bool is_undef() const { return k == kUndef; }
  bool is_str() const { return k == kJson && j.is_string(); }
  bool is_num() const { return k == kJson && (j.is_number() || j.is_boolean()); }
  const std::string& str() const { return j.get_ref<const std::string&>(); }
};

// UTF-8 <-> code points (Python str semantics for len, indexing, slicing, strip)
std::vector<uint32_t> to_cps(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = (unsigned char)s[i];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n && i + k < s.size(); k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}
std::string from_cps(const std::vector<uint32_t>& cps, size_t b, size_t e) {
  std::string s;
  for (size_t i = b; i < e; i++) {
    uint32_t c = cps[i];
    if (c < 0x80) s += (char)c;
    else if (c < 0x800) s += (char)(0xC0 | (c >> 6)), s += (char)(0x80 | (c & 0x3F));
    else if (c < 0x10000)
      s += (char)(0xE0 | (c >> 12)), s += (char)(0x80 | ((c >> 6) & 0x3F)), s += (char)(0x80 | (c & 0x3F));
    else
      s += (char)(0xF0 | (c >> 18)), s += (char)(0x80 | ((c >> 12) & 0x3F)), s += (char)(0x80 | ((c >> 6) & 0x3F)),
          s += (char)(0x80 | (c & 0x3F));
  }
  return s;
}
// str.isspace()
bool py_space(uint32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || (c >= 0x1C && c <= 0x1F) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
// the code point of the UTF-8 sequence at s[i] and its length (0: not valid UTF-8)
uint32_t utf8_at(const std::string& s, size_t i, size_t* len) {
  const unsigned char c = (unsigned char)s[i];
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  *len = 0;
  if (!n || i + n > s.size()) return 0;
  uint32_t cp = n == 1 ? c : c & (0x7F >> n);
  for (size_t k = 1; k < n; k++) {
    if (((unsigned char)s[i + k] >> 6) != 2) return 0;
    cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
  }
  *len = n;
  return cp;
}
// how many bytes of Python whitespace s starts with (from_end: ends with); other bytes are untouched
size_t ws_run(const std::string& s, bool from_end) {
  size_t n = 0, len = 0;
  if (!from_end) {
    while (n < s.size() && py_space(utf8_at(s, n, &len)) && len) n += len;
    return n;
  }
  while (n < s.size()) {
    size_t b = s.size() - n - 1;
    while (b > 0 && ((unsigned char)s[b] >> 6) == 2 && s.size() - n - b < 4) b--;
    const uint32_t cp = utf8_at(s, b, &len);
    if (!len || b + len != s.size() - n || !py_space(cp)) break;
    n += len;
  }
  return n;
}
// str.strip / lstrip / rstrip, with `chars` (null: whitespace)
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> cps = to_cps(s), set;
  if (chars) set = to_cps(*chars);
  auto drop = [&](uint32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_space(c); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && drop(cps[b])) b++;
  if (right)
    while (e > b && drop(cps[e - 1])) e--;
  return from_cps(cps, b, e);
}

std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  int prec = 1;
  for (; prec <= 17; prec++) {  // the shortest that reads back, as Python's repr
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  std::string s = buf;  // d.ddde[+-]XX
  const size_t e = s.find('e');
  const int exp10 = std::atoi(s.c_str() + e + 1);
  if (exp10 < -4 || exp10 >= 16) {  // Python: 1e-05, 1.5e+16
    std::string mant = s.substr(0, e);
    if (mant.find('.') != std::string::npos) {
      while (mant.back() == '0') mant.pop_back();
      if (mant.back() == '.') mant.pop_back();
    }
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    return mant + ex;
  }
  std::snprintf(buf, sizeof buf, "%.*f", std::max(0, prec - 1 - exp10), d);
  s = buf;
  if (s.find('.') == std::string::npos && s.find('e') == std::string::npos) s += ".0";
  return s;
}

std::string json_quote(const std::string& s, bool ensure_ascii) {
  std::string o = "\"";
  std::vector<uint32_t> cps = to_cps(s);
  for (uint32_t c : cps) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          char buf[16];
          if (c >= 0x10000) {
            uint32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
          }
          o += buf;
        } else {
          o += from_cps({c}, 0, 1);
        }
    }
  }
  return o + "\"";
}

// json.dumps(v, ensure_ascii, indent, separators, sort_keys); indent < 0: None
void dumps(const ojson& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys,
           bool ensure_ascii, int depth, std::string& o) {
  if (depth > kMaxDepth) too_deep();
  auto nl = [&](int d) {
    if (indent >= 0) o += "\n" + std::string((size_t)indent * (size_t)d, ' ');
    if (o.size() > kMaxBytes) throw RenderLimit{"tojson of more than " + std::to_string(kMaxBytes) + " bytes"};
  };
  if (v.is_null()) o += "null";
  else if (v.is_boolean()) o += v.get<bool>() ? "true" : "false";
  else if (v.is_number_integer() || v.is_number_unsigned()) o += v.dump();
  else if (v.is_number_float()) {
    const double d = v.get<double>();
    o += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py_float(d);
  } else if (v.is_string()) o += json_quote(v.get_ref<const std::string&>(), ensure_ascii);
  else if (v.is_array()) {
    if (v.empty()) { o += "[]"; return; }
    o += "[";
    for (size_t i = 0; i < v.size(); i++) {
      if (i) o += item_sep;
      nl(depth + 1);
      dumps(v[i], indent, item_sep, key_sep, sort_keys, ensure_ascii, depth + 1, o);
    }
    nl(depth);
    o += "]";
  } else {
    if (v.empty()) { o += "{}"; return; }
    std::vector<std::string> keys;
    for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(it.key());
    if (sort_keys) std::sort(keys.begin(), keys.end());
    o += "{";
    for (size_t i = 0; i < keys.size(); i++) {
      if (i) o += item_sep;
      nl(depth + 1);
      o += json_quote(keys[i], ensure_ascii) + key_sep;
      dumps(v.at(keys[i]), indent, item_sep, key_sep, sort_keys, ensure_ascii, depth + 1, o);
    }
    nl(depth);
    o += "}";
  }
}

std::string py_repr(const ojson& v, int depth = 0);
std::string py_str(const Val& v) {
  if (v.k == Val::kUndef) return "";
  if (v.k == Val::kNs) return "<Namespace>";
  if (v.k == Val::kFunc) return "<function " + v.name + ">";
  if (v.j.is_string()) return v.str();
  return py_repr(v.j);
}
std::string py_repr(const ojson& v, int depth) {
  if (depth > kMaxDepth) too_deep();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return py_float(v.get<double>());
  if (v.is_number()) return v.dump();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string o(1, q);
    for (char c : s) {
      const unsigned char u = (unsigned char)c;
      if (c == q || c == '\\') o += '\\', o += c;
      else if (c == '\n') o += "\\n";
      else if (c == '\r') o += "\\r";
      else if (c == '\t') o += "\\t";
      else if (u < 0x20 || u == 0x7F) o += strformat("\\x%02x", u);  // Python's repr of a control character
      else o += c;
    }
    return o + q;
  }
  std::string o;
  if (v.is_array()) {
    o = "[";
    for (size_t i = 0; i < v.size(); i++) o += (i ? ", " : "") + py_repr(v[i], depth + 1);
    return o + "]";
  }
  o = "{";
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it, first = false)
    o += (first ? "" : ", ") + py_repr(ojson(it.key())) + ": " + py_repr(it.value(), depth + 1);
  return o + "}";
}

bool truthy(const Val& v) {
  if (v.k == Val::kUndef) return false;
  if (v.k != Val::kJson) return true;
  const ojson& j = v.j;
  if (j.is_null()) return false;
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_float()) return j.get<double>() != 0.0;
  if (j.is_number()) return j.get<int64_t>() != 0;
  if (j.is_string()) return !j.get_ref<const std::string&>().empty();  // nlohmann's empty() is false for any string
  if (j.is_array() || j.is_object()) return !j.empty();
  return true;
}

double num(const ojson& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); }
bool is_int(const ojson& j) { return j.is_boolean() || j.is_number_integer() || j.is_number_unsigned(); }
int64_t as_int(const ojson& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<int64_t>(); }

bool json_eq(const ojson& a, const ojson& b, int depth = 0) {
  if (depth > kMaxDepth) too_deep();
  const bool an = a.is_number() || a.is_boolean(), bn = b.is_number() || b.is_boolean();
  if (an && bn) return is_int(a) && is_int(b) ? as_int(a) == as_int(b) : num(a) == num(b);
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++)
      if (!json_eq(a[i], b[i], depth + 1)) return false;
    return true;
  }
  if (a.is_object() && b.is_object()) {  // dict equality ignores order
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto f = b.find(it.key());
      if (f == b.end() || !json_eq(it.value(), *f, depth + 1)) return false;
    }
    return true;
  }
  return a == b;
}
bool val_eq(const Val& a, const Val& b) {
  if (a.k == Val::kJson && b.k == Val::kJson) return json_eq(a.j, b.j);
  if (a.k == Val::kUndef && b.k == Val::kUndef) return true;
  if (a.k == Val::kNs && b.k == Val::kNs) return a.ns == b.ns;
  return false;
}

const char* type_name(const Val& v) {
  if (v.k == Val::kUndef) return "undefined";
  if (v.k == Val::kNs) return "namespace";
  if (v.k == Val::kFunc) return "function";
  const ojson& j = v.j;
  if (j.is_null()) return "NoneType";
  if (j.is_boolean()) return "bool";
  if (j.is_number_float()) return "float";
  if (j.is_number()) return "int";
  if (j.is_string()) return "str";
  if (j.is_array()) return "list";
  return "dict";
}

// ---- lexer ----

struct Tok {
  enum T { kName, kStr, kInt, kFloat, kOp, kEnd } t = kEnd;
  std::string s;  // name, string value, operator
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

struct Piece {
  enum T { kData, kVar, kBlock, kComment } t = kData;
  std::string data;
  std::vector<Tok> toks;  // kVar, kBlock: the tag's tokens
  int line = 0;
  bool strip_before = false, strip_after = false, plus = false, plus_after = false;  // '-' and '+' marks
};

[[noreturn]] void syntax(const std::string& name, int line, const std::string& msg) {
  fail("chat template %s, line %d: %s", name.c_str(), line, msg.c_str());
}

std::vector<Tok> lex_tag(const std::string& s, size_t& p, bool var, int& line, const std::string& name, bool* strip,
                         bool* plus) {
  std::vector<Tok> out;
  const std::string end = var ? "}}" : "%}";
  int open = 0;  // brackets open: inside them '}}' closes two dicts, not the tag (Jinja's balancing)
  for (;;) {
    while (p < s.size() && std::isspace((unsigned char)s[p])) line += s[p] == '\n', p++;
    if (p >= s.size()) syntax(name, line, std::string("a tag opened with ") + (var ? "{{" : "{%") + " is never closed");
    if (open > 0) {  // not the end
    } else if (s.compare(p, 3, "-" + end) == 0 || (!var && s.compare(p, 3, "+%}") == 0)) {
      (s[p] == '-' ? *strip : *plus) = true;  // {% ... +%}: no trim_blocks after this tag
      p += 3;
      return out;
    } else if (s.compare(p, 2, end) == 0) {
      p += 2;
      return out;
    }
    Tok t;
    t.line = line;
    const char c = s[p];
    if (std::isalpha((unsigned char)c) || c == '_') {
      size_t b = p;
      while (p < s.size() && (std::isalnum((unsigned char)s[p]) || s[p] == '_')) p++;
      t.t = Tok::kName;
      t.s = s.substr(b, p - b);
    } else if (std::isdigit((unsigned char)c)) {
      size_t b = p;
      while (p < s.size() && (std::isdigit((unsigned char)s[p]) || s[p] == '_')) p++;
      bool is_float = false;
      const bool after_dot = b > 0 && s[b - 1] == '.';  // x.0.1 is x[0][1] (Jinja: no float right after a '.')
      if (after_dot) {
      } else if (p + 1 < s.size() && s[p] == '.' && std::isdigit((unsigned char)s[p + 1])) {
        is_float = true;
        p++;
        while (p < s.size() && std::isdigit((unsigned char)s[p])) p++;
      }
      if (!after_dot && p < s.size() && (s[p] == 'e' || s[p] == 'E')) {
        is_float = true;
        p++;
        if (p < s.size() && (s[p] == '+' || s[p] == '-')) p++;
        while (p < s.size() && std::isdigit((unsigned char)s[p])) p++;
      }
      std::string lit = s.substr(b, p - b);
      lit.erase(std::remove(lit.begin(), lit.end(), '_'), lit.end());
      if (is_float) t.t = Tok::kFloat, t.f = std::strtod(lit.c_str(), nullptr);
      else {
        errno = 0;
        t.t = Tok::kInt, t.i = std::strtoll(lit.c_str(), nullptr, 10);
        if (errno == ERANGE) syntax(name, line, "the integer " + lit + " does not fit in 64 bits (llmt's integers)");
      }
    } else if (c == '\'' || c == '"') {
      t.t = Tok::kStr;
      p++;
      for (;;) {
        if (p >= s.size()) syntax(name, t.line, "a string literal is never closed");
        char d = s[p++];
        if (d == c) break;
        line += d == '\n';
        if (d != '\\') {
          t.s += d;
          continue;
        }
        if (p >= s.size()) syntax(name, t.line, "a string literal is never closed");
        char e = s[p++];
        switch (e) {  // Python's escapes
          case 'n': t.s += '\n'; break;
          case 't': t.s += '\t'; break;
          case 'r': t.s += '\r'; break;
          case '\\': t.s += '\\'; break;
          case '\'': t.s += '\''; break;
          case '"': t.s += '"'; break;
          case 'b': t.s += '\b'; break;
          case 'f': t.s += '\f'; break;
          case 'v': t.s += '\v'; break;
          case 'a': t.s += '\a'; break;
          case '\n': line++; break;
          case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {  // octal, 1 to 3 digits
            uint32_t cp = (uint32_t)(e - '0');
            for (int k = 0; k < 2 && p < s.size() && s[p] >= '0' && s[p] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[p++] - '0');
            t.s += from_cps({cp}, 0, 1);
            break;
          }
          case 'x': case 'u': case 'U': {  // exactly 2, 4 or 8 hex digits, as Python
            const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < n; k++, p++) {
              if (p >= s.size() || !std::isxdigit((unsigned char)s[p]))
                syntax(name, t.line, "a truncated \\" + std::string(1, e) + " escape (it takes " + std::to_string(n) +
                                         " hex digits)");
              const char h = s[p];
              cp = cp * 16 + (uint32_t)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
              syntax(name, t.line, "a \\" + std::string(1, e) + " escape of U+" + strformat("%X", cp) +
                                       ", not a Unicode scalar value (a surrogate or beyond U+10FFFF)");
            t.s += from_cps({cp}, 0, 1);
            break;
          }
          case 'N': syntax(name, t.line, "unsupported construct: a \\N{...} escape");
          default: t.s += '\\', t.s += e;  // Python keeps unknown escapes
        }
      }
    } else {
      static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".", ",", ":",
                                  "|", "~", "+", "-", "*", "/", "%", "<", ">", "="};
      bool found = false;
      for (const char* op : ops) {
        const size_t n = std::strlen(op);
        if (s.compare(p, n, op) == 0) {
          t.t = Tok::kOp;
          t.s = op;
          p += n;
          found = true;
          if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) open++;
          if (n == 1 && (*op == ')' || *op == ']' || *op == '}') && open > 0) open--;
          break;
        }
      }
      if (!found) syntax(name, line, std::string("unexpected character '") + c + "' in a tag");
    }
    out.push_back(std::move(t));
  }
}

std::vector<Piece> lex(std::string s, const std::string& name) {
  // Jinja's lexer: newlines normalized to \n; keep_trailing_newline=False drops one trailing newline
  std::string n;
  for (size_t i = 0; i < s.size(); i++) {
    if (s[i] == '\r') {
      n += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') i++;
    } else {
      n += s[i];
    }
  }
  s.swap(n);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  std::vector<Piece> out;
  size_t p = 0;
  int line = 1;
  while (p < s.size()) {
    size_t q = p;
    for (;;) {
      q = s.find('{', q);
      if (q == std::string::npos || (q + 1 < s.size() && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) break;
      q++;
    }
    if (q == std::string::npos) q = s.size();
    if (q > p) {
      Piece d;
      d.t = Piece::kData;
      d.data = s.substr(p, q - p);
      d.line = line;
      line += (int)std::count(d.data.begin(), d.data.end(), '\n');
      out.push_back(std::move(d));
    }
    if (q >= s.size()) break;
    Piece t;
    t.line = line;
    const char kind = s[q + 1];
    p = q + 2;
    if (p < s.size() && s[p] == '-') t.strip_before = true, p++;
    else if (p < s.size() && s[p] == '+' && kind != '{') t.plus = true, p++;
    if (kind == '#') {
      t.t = Piece::kComment;
      size_t e = s.find("#}", p);
      if (e == std::string::npos) syntax(name, line, "a comment opened with {# is never closed");
      t.strip_after = e > p && s[e - 1] == '-';
      line += (int)std::count(s.begin() + (long)p, s.begin() + (long)e, '\n');
      p = e + 2;
    } else {
      t.t = kind == '{' ? Piece::kVar : Piece::kBlock;
      t.toks = lex_tag(s, p, kind == '{', line, name, &t.strip_after, &t.plus_after);
      if (t.toks.empty()) syntax(name, t.line, kind == '{' ? "an empty {{ }}" : "an empty {% %}");
      if (t.t == Piece::kBlock && t.toks[0].t == Tok::kName && t.toks[0].s == "raw")
        syntax(name, t.line, "unsupported construct: {% raw %}");
    }
    out.push_back(std::move(t));
  }
  // whitespace: trim_blocks, lstrip_blocks, and the '-' marks
  bool line_start = true;  // the next data piece starts a line (lstrip_blocks looks at it)
  for (size_t i = 0; i < out.size(); i++) {
    Piece& t = out[i];
    if (t.t == Piece::kData) continue;
    const bool block = t.t != Piece::kVar;
    Piece* before = i > 0 && out[i - 1].t == Piece::kData ? &out[i - 1] : nullptr;
    // whitespace is Python's (str.isspace, re's \s): U+00A0, U+3000, ... too
    if (before && t.strip_before) {
      before->data.resize(before->data.size() - ws_run(before->data, true));
    } else if (before && block && !t.plus) {  // lstrip_blocks
      std::string& d = before->data;
      const size_t nl = d.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      const bool at_start = nl != std::string::npos || line_start;
      if (at_start && ws_run(d, true) >= d.size() - from) d.resize(from);
    }
    line_start = false;
    Piece* after = i + 1 < out.size() && out[i + 1].t == Piece::kData ? &out[i + 1] : nullptr;
    if (after && t.strip_after) {
      after->data.erase(0, ws_run(after->data, false));
    } else if (after && block && !t.plus_after && !after->data.empty() && after->data[0] == '\n') {  // trim_blocks
      after->data.erase(0, 1);
      line_start = true;
    }
  }
  return out;
}

// ---- syntax tree ----

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum T { kLit, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBin, kCompare, kCond, kList, kDict } t;
  explicit Expr(T type) : t(type) {}
  ojson lit;
  std::string s;              // name, attribute, operator, filter or test name
  std::vector<ExprP> a;       // operands / arguments (null entries: omitted slice bounds)
  std::vector<std::string> kw;  // kCall/kFilter/kTest: names of the keyword arguments, aligned at the end of a
  std::vector<std::string> ops;  // kCompare: a[0] ops[0] a[1] ops[1] a[2] ..., a Python chain
  bool negate = false;        // kTest: `is not`
  int line = 0;
  int depth = 1;              // of the tree below (the parser refuses trees deeper than kMaxDepth)
};

struct Node;
using Body = std::vector<Node>;
struct Node {
  enum T { kText, kOut, kIf, kFor, kSet, kSetAttr, kSetBlock, kGen, kBreak, kContinue } t;
  explicit Node(T type) : t(type) {}
  std::string text;                      // kText; kSetAttr: the namespace's name
  std::string attr;                      // kSetAttr
  std::vector<std::string> targets;      // kFor, kSet, kSetBlock
  ExprP e, cond;                         // value / iterable; kFor: its `if` filter
  std::vector<std::pair<ExprP, Body>> branches;  // kIf (null cond: else)
  Body body, else_body;                  // kFor, kGen, kSetBlock
  int line = 0;
};

// The filters, methods, tests and functions llmt implements, with the parameters it implements, in
// Python's positional order ("*": any arguments, checked when called). A call with another keyword
// or more positional arguments is refused when the template is parsed, naming the argument: llmt
// never ignores an argument.
using Sigs = std::map<std::string, std::vector<std::string>>;
const Sigs kFilters = {
    {"trim", {"chars"}}, {"length", {}}, {"count", {}},
    {"tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}},  // transformers' tojson
    {"upper", {}}, {"lower", {}}, {"capitalize", {}}, {"title", {}}, {"default", {"default_value", "boolean"}},
    {"d", {"default_value", "boolean"}}, {"join", {"d", "attribute"}}, {"first", {}}, {"last", {}}, {"list", {}},
    {"string", {}}, {"int", {"default", "base"}}, {"float", {"default"}}, {"abs", {}},
    {"replace", {"old", "new", "count"}}, {"reject", {"*"}}, {"select", {"*"}}, {"rejectattr", {"*"}},
    {"selectattr", {"*"}}, {"map", {"*"}}, {"items", {}}, {"reverse", {}}, {"safe", {}},
    {"unique", {"case_sensitive", "attribute"}}, {"sort", {"reverse", "case_sensitive", "attribute"}},
    {"dictsort", {"case_sensitive", "by", "reverse"}}, {"wordcount", {}}, {"min", {"case_sensitive", "attribute"}},
    {"max", {"case_sensitive", "attribute"}}, {"sum", {"attribute", "start"}}, {"round", {"precision", "method"}},
    {"indent", {"width", "first", "blank"}}};
const std::set<std::string> kTests = {"defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
                                      "iterable", "sequence", "boolean", "true", "false", "equalto", "eq", "==", "ne",
                                      "!=", "even", "odd", "divisibleby", "in", "lower", "upper", "sameas",
                                      "callable", "gt", "ge", "lt", "le", ">", ">=", "<", "<="};
// the tests that take one argument (the others take none)
const std::set<std::string> kTestsWithArg = {"equalto", "eq", "==", "ne", "!=", "divisibleby", "in", "sameas",
                                             "gt", "ge", "lt", "le", ">", ">=", "<", "<="};
// str methods, and dict's items/keys/values/get
const Sigs kMethods = {
    {"strip", {"chars"}}, {"lstrip", {"chars"}}, {"rstrip", {"chars"}}, {"startswith", {"prefix", "start", "end"}},
    {"endswith", {"suffix", "start", "end"}}, {"split", {"sep", "maxsplit"}}, {"rsplit", {"sep", "maxsplit"}},
    {"upper", {}}, {"lower", {}}, {"title", {}}, {"capitalize", {}}, {"replace", {"old", "new", "count"}},
    {"items", {}}, {"keys", {}}, {"values", {}}, {"get", {"key", "default"}}, {"find", {"sub", "start", "end"}},
    {"count", {"sub", "start", "end"}}, {"index", {"sub", "start", "end"}}, {"join", {"iterable"}},
    {"splitlines", {}}, {"isdigit", {}}, {"isalpha", {}}, {"isspace", {}}, {"format", {"*"}}};
const Sigs kGlobals = {{"raise_exception", {"message"}}, {"strftime_now", {"format"}}, {"namespace", {"*"}},
                       {"range", {"start", "stop", "step"}}, {"dict", {"*"}}};

class Parser {
 public:
  Parser(std::vector<Piece> pieces, std::string name) : pc_(std::move(pieces)), name_(std::move(name)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, &end);
    return b;
  }
  bool saw_generation = false, saw_strftime = false;

 private:
  std::vector<Piece> pc_;
  std::string name_;
  size_t i_ = 0;
  // the tag being parsed
  const std::vector<Tok>* toks_ = nullptr;
  size_t k_ = 0;
  int line_ = 0;
  int depth_ = 0;        // recursion depth of the parser
  bool in_loop_ = false;  // {% break %} / {% continue %} are allowed here (Jinja's loop frame)

  // counts one level of the parser's recursion; refuses nesting deeper than kMaxDepth
  struct Deeper {
    Parser* p;
    explicit Deeper(Parser* parser) : p(parser) {
      if (++p->depth_ > kMaxDepth) p->err("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
    }
    ~Deeper() { p->depth_--; }
  };
  // a node's tree depth from its operands'; refuses trees deeper than kMaxDepth (a ~ b ~ c ~ ... chains)
  ExprP deep(ExprP n) {
    for (const ExprP& c : n->a)
      if (c) n->depth = std::max(n->depth, c->depth + 1);
    if (n->depth > kMaxDepth) err("an expression nested deeper than " + std::to_string(kMaxDepth) + " levels");
    return n;
  }
  // the arguments of a call of `what` against the parameters llmt implements
  void check_args(const std::string& what, const std::vector<std::string>& params, const Expr& c, size_t skip) {
    if (!params.empty() && params[0] == "*") return;
    const size_t npos = c.a.size() - skip - c.kw.size();
    std::string list;
    for (const std::string& p : params) list += (list.empty() ? "" : ", ") + p;
    if (npos > params.size())
      unsupported(what + " with " + std::to_string(npos) + " positional arguments (llmt implements " +
                  (list.empty() ? std::string("none") : list) + ")");
    for (size_t i = 0; i < c.kw.size(); i++) {
      const auto f = std::find(params.begin(), params.end(), c.kw[i]);
      if (f == params.end()) unsupported("the argument '" + c.kw[i] + "' of " + what);
      if ((size_t)(f - params.begin()) < npos) err(what + " got '" + c.kw[i] + "' twice");
      for (size_t k = 0; k < i; k++)
        if (c.kw[k] == c.kw[i]) err(what + " got '" + c.kw[i] + "' twice");
    }
  }

  [[noreturn]] void err(const std::string& m) const { syntax(name_, line_, m); }
  [[noreturn]] void unsupported(const std::string& what) const {
    syntax(name_, line_, "unsupported construct: " + what +
                             " (llmt evaluates the part of Jinja that chat templates use; docs/data.md lists it)");
  }
  const Tok& peek(size_t ahead = 0) const {
    static const Tok end;
    return k_ + ahead < toks_->size() ? (*toks_)[k_ + ahead] : end;
  }
  bool at_op(const char* op) const { return peek().t == Tok::kOp && peek().s == op; }
  bool at_name(const char* n, size_t ahead = 0) const { return peek(ahead).t == Tok::kName && peek(ahead).s == n; }
  void expect_op(const char* op) {
    if (!at_op(op)) err(std::string("expected '") + op + "'" + found());
    k_++;
  }
  std::string found() const {
    const Tok& t = peek();
    if (t.t == Tok::kEnd) return ", found the end of the tag";
    return ", found '" + (t.t == Tok::kInt ? std::to_string(t.i) : t.t == Tok::kFloat ? py_float(t.f) : t.s) + "'";
  }
  std::string expect_name() {
    if (peek().t != Tok::kName) err("expected a name" + found());
    return (*toks_)[k_++].s;
  }
  void expect_end() {
    if (peek().t != Tok::kEnd) err("unexpected" + found().substr(1));
  }

  // Statements until a block tag whose keyword is in `ends`; *end gets it ("" at the end of the template).
  Body parse_body(const std::set<std::string>& ends, std::string* end) {
    Deeper guard(this);
    Body body;
    while (i_ < pc_.size()) {
      Piece& p = pc_[i_++];
      line_ = p.line;
      if (p.t == Piece::kComment) continue;
      if (p.t == Piece::kData) {
        if (!p.data.empty()) {
          Node n(Node::kText);
          n.text = p.data;
          body.push_back(std::move(n));
        }
        continue;
      }
      toks_ = &p.toks;
      k_ = 0;
      if (p.t == Piece::kVar) {
        Node n(Node::kOut);
        n.line = line_;
        n.e = expr();
        expect_end();
        body.push_back(std::move(n));
        continue;
      }
      if (peek().t != Tok::kName) err("a block tag must start with a keyword" + found());
      const std::string kw = (*toks_)[k_++].s;
      if (ends.count(kw)) {
        *end = kw;
        return body;
      }
      Node n(Node::kText);
      n.line = line_;
      if (kw == "if") {
        n.t = Node::kIf;
        ExprP c = expr();
        expect_end();
        for (;;) {
          std::string e;
          Body b = parse_body({"elif", "else", "endif"}, &e);
          n.branches.emplace_back(std::move(c), std::move(b));
          if (e.empty()) err("{% if %} opened at line " + std::to_string(n.line) + " is never closed");
          if (e == "endif") { expect_end(); break; }
          if (e == "else") {
            expect_end();
            Body eb = parse_body({"endif"}, &e);
            if (e.empty()) err("{% if %} opened at line " + std::to_string(n.line) + " is never closed");
            expect_end();
            n.branches.emplace_back(nullptr, std::move(eb));
            break;
          }
          c = expr();  // elif
          expect_end();
        }
      } else if (kw == "for") {
        n.t = Node::kFor;
        n.targets.push_back(expect_name());
        while (at_op(",")) k_++, n.targets.push_back(expect_name());
        if (!at_name("in")) err("expected 'in'" + found());
        k_++;
        n.e = expr(false);
        if (at_name("if")) k_++, n.cond = expr(false);
        if (at_name("recursive")) unsupported("a recursive for loop");
        expect_end();
        std::string e;
        const bool was_in_loop = in_loop_;
        in_loop_ = true;
        n.body = parse_body({"else", "endfor"}, &e);
        in_loop_ = false;  // Jinja: {% break %} in a for's else is outside the loop
        if (e.empty()) err("{% for %} opened at line " + std::to_string(n.line) + " is never closed");
        expect_end();
        if (e == "else") {
          n.else_body = parse_body({"endfor"}, &e);
          if (e.empty()) err("{% for %} opened at line " + std::to_string(n.line) + " is never closed");
          expect_end();
        }
        in_loop_ = was_in_loop;
      } else if (kw == "set") {
        std::string first = expect_name();
        if (at_op(".")) {
          k_++;
          n.t = Node::kSetAttr;
          n.text = first;
          n.attr = expect_name();
          expect_op("=");
          n.e = expr();
          expect_end();
        } else {
          n.targets.push_back(first);
          while (at_op(",")) k_++, n.targets.push_back(expect_name());
          if (at_op("=")) {
            k_++;
            n.t = Node::kSet;
            n.e = expr();
            expect_end();
          } else {
            if (at_op("|")) unsupported("a filtered {% set %} block");
            expect_end();
            if (n.targets.size() != 1) err("a {% set %} block takes one name");
            n.t = Node::kSetBlock;
            std::string e;
            n.body = parse_body({"endset"}, &e);
            if (e.empty()) err("{% set %} opened at line " + std::to_string(n.line) + " is never closed");
            expect_end();
          }
        }
      } else if (kw == "generation") {
        n.t = Node::kGen;
        saw_generation = true;
        expect_end();
        std::string e;
        const bool was_in_loop = in_loop_;
        in_loop_ = false;  // transformers: a {% break %} in a generation block is outside the loop
        n.body = parse_body({"endgeneration"}, &e);
        in_loop_ = was_in_loop;
        if (e.empty()) err("{% generation %} opened at line " + std::to_string(n.line) + " is never closed");
        expect_end();
      } else if (kw == "break" || kw == "continue") {
        n.t = kw == "break" ? Node::kBreak : Node::kContinue;
        if (!in_loop_) err("{% " + kw + " %} outside a loop (Jinja refuses it in a for's else and in a generation block)");
        expect_end();
      } else if (kw == "elif" || kw == "else" || kw == "endif" || kw == "endfor" || kw == "endset" ||
                 kw == "endgeneration") {
        err("{% " + kw + " %} without its opening tag");
      } else {
        unsupported("{% " + kw + " %}");
      }
      body.push_back(std::move(n));
    }
    *end = "";
    return body;
  }

  ExprP mk(Expr::T t) {
    ExprP e(new Expr(t));
    e->line = line_;
    return e;
  }

  // expression grammar, lowest precedence first (Jinja's parser)
  ExprP expr(bool with_cond = true) {
    Deeper guard(this);
    ExprP e = or_expr();
    if (with_cond && at_name("if")) {  // a if c else b
      k_++;
      ExprP c = or_expr();
      ExprP alt;
      if (at_name("else")) k_++, alt = expr();
      ExprP n = mk(Expr::kCond);
      n->a.push_back(std::move(c));
      n->a.push_back(std::move(e));
      n->a.push_back(std::move(alt));
      return deep(std::move(n));
    }
    return e;
  }
  ExprP bin(const std::string& op, ExprP l, ExprP r) {
    ExprP n = mk(Expr::kBin);
    n->s = op;
    n->a.push_back(std::move(l));
    n->a.push_back(std::move(r));
    return deep(std::move(n));
  }
  ExprP or_expr() {
    ExprP l = and_expr();
    while (at_name("or")) k_++, l = bin("or", std::move(l), and_expr());
    return l;
  }
  ExprP and_expr() {
    ExprP l = not_expr();
    while (at_name("and")) k_++, l = bin("and", std::move(l), not_expr());
    return l;
  }
  ExprP not_expr() {
    if (at_name("not") && !at_name("in", 1)) {
      Deeper guard(this);
      k_++;
      ExprP n = mk(Expr::kNot);
      n->a.push_back(not_expr());
      return deep(std::move(n));
    }
    return compare();
  }
  // a < b < c is Python's chain: a < b and b < c, b evaluated once
  ExprP compare() {
    ExprP l = math1();
    ExprP n;
    for (;;) {
      std::string op;
      if (peek().t == Tok::kOp && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == "<=" ||
                                   peek().s == ">" || peek().s == ">=")) {
        op = (*toks_)[k_++].s;
      } else if (at_name("in")) {
        k_++;
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        k_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!n) {
        n = mk(Expr::kCompare);
        n->a.push_back(std::move(l));
      }
      n->ops.push_back(op);
      n->a.push_back(math1());
    }
    return n ? deep(std::move(n)) : std::move(l);
  }
  ExprP math1() {
    ExprP l = concat();
    while (at_op("+") || at_op("-")) {
      std::string op = (*toks_)[k_++].s;
      l = bin(op, std::move(l), concat());
    }
    return l;
  }
  ExprP concat() {
    ExprP l = math2();
    while (at_op("~")) k_++, l = bin("~", std::move(l), math2());
    return l;
  }
  ExprP math2() {
    ExprP l = power();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = (*toks_)[k_++].s;
      l = bin(op, std::move(l), power());
    }
    return l;
  }
  ExprP power() {
    ExprP l = unary(true);
    while (at_op("**")) k_++, l = bin("**", std::move(l), unary(true));
    return l;
  }
  ExprP unary(bool with_filter) {
    ExprP e;
    if (at_op("-")) {
      Deeper guard(this);
      k_++;
      e = mk(Expr::kNeg);
      e->a.push_back(unary(false));
      e = deep(std::move(e));
    } else if (at_op("+")) {
      Deeper guard(this);
      k_++;
      e = unary(false);
    } else {
      e = postfix(primary());
    }
    if (with_filter) e = filters(std::move(e));
    return e;
  }
  ExprP primary() {
    const Tok& t = peek();
    ExprP e;
    if (t.t == Tok::kStr) {
      e = mk(Expr::kLit);
      e->lit = t.s;
      k_++;
      while (peek().t == Tok::kStr) e->lit = e->lit.get<std::string>() + peek().s, k_++;  // adjacent literals join
    } else if (t.t == Tok::kInt) {
      e = mk(Expr::kLit);
      e->lit = t.i;
      k_++;
    } else if (t.t == Tok::kFloat) {
      e = mk(Expr::kLit);
      e->lit = t.f;
      k_++;
    } else if (t.t == Tok::kName) {
      k_++;
      if (t.s == "true" || t.s == "True") (e = mk(Expr::kLit))->lit = true;
      else if (t.s == "false" || t.s == "False") (e = mk(Expr::kLit))->lit = false;
      else if (t.s == "none" || t.s == "None") (e = mk(Expr::kLit))->lit = nullptr;
      else {
        e = mk(Expr::kName);
        e->s = t.s;
        if (t.s == "strftime_now") saw_strftime = true;
      }
    } else if (t.t == Tok::kOp && t.s == "(") {
      k_++;
      e = expr();
      if (at_op(",")) {  // a tuple: a list here
        ExprP l = mk(Expr::kList);
        l->a.push_back(std::move(e));
        while (at_op(",")) {
          k_++;
          if (at_op(")")) break;
          l->a.push_back(expr());
        }
        e = std::move(l);
      }
      expect_op(")");
    } else if (t.t == Tok::kOp && t.s == "[") {
      k_++;
      e = mk(Expr::kList);
      while (!at_op("]")) {
        e->a.push_back(expr());
        if (!at_op(",")) break;
        k_++;
      }
      expect_op("]");
    } else if (t.t == Tok::kOp && t.s == "{") {
      k_++;
      e = mk(Expr::kDict);
      while (!at_op("}")) {
        e->a.push_back(expr());
        expect_op(":");
        e->a.push_back(expr());
        if (!at_op(",")) break;
        k_++;
      }
      expect_op("}");
    } else {
      err("expected a value" + found());
    }
    return deep(std::move(e));
  }
  // (args, kwargs) after '('
  void call_args(Expr* c) {
    expect_op("(");
    std::vector<ExprP> pos, named;
    while (!at_op(")")) {
      if (peek().t == Tok::kName && peek(1).t == Tok::kOp && peek(1).s == "=") {
        c->kw.push_back(peek().s);
        k_ += 2;
        named.push_back(expr());
      } else {
        if (!c->kw.empty()) err("a positional argument after a keyword argument");
        pos.push_back(expr());
      }
      if (!at_op(",")) break;
      k_++;
    }
    expect_op(")");
    for (auto& p : pos) c->a.push_back(std::move(p));
    for (auto& p : named) c->a.push_back(std::move(p));
  }
  ExprP postfix(ExprP e) {
    for (;;) {
      if (at_op(".")) {
        k_++;
        ExprP n;
        if (peek().t == Tok::kInt) {  // x.0 is x[0] (Jinja's Getitem)
          n = mk(Expr::kItem);
          ExprP i = mk(Expr::kLit);
          i->lit = peek().i;
          k_++;
          n->a.push_back(std::move(e));
          n->a.push_back(std::move(i));
        } else {
          n = mk(Expr::kAttr);
          n->s = expect_name();
          n->a.push_back(std::move(e));
        }
        e = deep(std::move(n));
      } else if (at_op("[")) {
        k_++;
        ExprP lo, hi, step;
        bool slice = false;
        if (!at_op(":")) lo = expr();
        if (at_op(":")) {
          slice = true;
          k_++;
          if (!at_op("]") && !at_op(":")) hi = expr();
          if (at_op(":")) {
            k_++;
            if (!at_op("]")) step = expr();
          }
        }
        expect_op("]");
        ExprP n = mk(slice ? Expr::kSlice : Expr::kItem);
        n->a.push_back(std::move(e));
        n->a.push_back(std::move(lo));
        if (slice) n->a.push_back(std::move(hi)), n->a.push_back(std::move(step));
        e = deep(std::move(n));
      } else if (at_op("(")) {
        if (e->t == Expr::kName && !kGlobals.count(e->s)) unsupported("a call of '" + e->s + "' (macros and "
                                                                      "functions other than " "raise_exception, "
                                                                      "strftime_now, namespace, range and dict)");
        if (e->t == Expr::kAttr && !kMethods.count(e->s)) unsupported("the method ." + e->s + "()");
        if (e->t != Expr::kName && e->t != Expr::kAttr) unsupported("a call of a computed value");
        ExprP n = mk(Expr::kCall);
        const std::string callee = e->s;
        const bool method = e->t == Expr::kAttr;
        n->a.push_back(std::move(e));
        call_args(n.get());
        check_args(method ? "the method ." + callee + "()" : callee + "()",
                   method ? kMethods.at(callee) : kGlobals.at(callee), *n, 1);
        e = deep(std::move(n));
      } else {
        return e;
      }
    }
  }
  ExprP filters(ExprP e) {
    for (;;) {
      if (at_op("|")) {
        k_++;
        ExprP n = mk(Expr::kFilter);
        n->s = expect_name();
        if (!kFilters.count(n->s)) unsupported("the filter '" + n->s + "'");
        n->a.push_back(std::move(e));
        if (at_op("(")) call_args(n.get());
        check_args("the filter '" + n->s + "'", kFilters.at(n->s), *n, 1);
        e = postfix(deep(std::move(n)));
      } else if (at_name("is")) {
        k_++;
        ExprP n = mk(Expr::kTest);
        if (at_name("not")) k_++, n->negate = true;
        if (peek().t == Tok::kName) n->s = (*toks_)[k_++].s;
        else if (peek().t == Tok::kOp && kTests.count(peek().s)) n->s = (*toks_)[k_++].s;
        else err("expected a test name after 'is'" + found());
        if (!kTests.count(n->s)) unsupported("the test 'is " + n->s + "'");
        n->a.push_back(std::move(e));
        if (at_op("(")) {
          call_args(n.get());
        } else {
          const Tok& t = peek();  // one argument without parentheses: `is equalto 3`, `is divisibleby 2`
          const bool starts_value = t.t == Tok::kStr || t.t == Tok::kInt || t.t == Tok::kFloat ||
                                    (t.t == Tok::kOp && (t.s == "[" || t.s == "{")) ||
                                    (t.t == Tok::kName && t.s != "and" && t.s != "or" && t.s != "else" &&
                                     t.s != "if" && t.s != "in" && t.s != "is" && t.s != "not");
          if (starts_value) n->a.push_back(postfix(primary()));
        }
        if (!n->kw.empty()) unsupported("the argument '" + n->kw[0] + "' of the test '" + n->s + "'");
        const size_t want = kTestsWithArg.count(n->s) ? 1 : 0;
        if (n->a.size() - 1 > want)
          unsupported("the test '" + n->s + "' with " + std::to_string(n->a.size() - 1) + " arguments");
        e = deep(std::move(n));
      } else {
        return e;
      }
    }
  }
};

// ---- evaluation ----

using Kwargs = std::vector<std::pair<std::string, Val>>;  // in call order (dict(b=1, a=2) keeps it)

struct BreakSignal {};
struct ContinueSignal {};

class Renderer {
 public:
  Renderer(const std::string& name, std::time_t now) : name_(name), now_(now) {}
  std::vector<std::map<std::string, Val>> scopes;
  ChatRender out;

  void run(const Body& b) {
    for (const Node& n : b) exec(n);
  }
  int line() const { return line_; }

 private:
  const std::string& name_;
  std::time_t now_;
  int line_ = 0;
  int64_t iterations_ = 0;  // loop iterations so far (kMaxIterations)

  void count_iteration() {
    if (++iterations_ > kMaxIterations)
      err("more than " + std::to_string(kMaxIterations) + " loop iterations in one rendering (llmt's limit)");
  }
  // a string or list about to be `n` bytes or items long: refused past the render limits
  void check_size(size_t n, bool items, const char* what) const {
    if (n > (items ? kMaxItems : kMaxBytes))
      err(std::string(what) + " of more than " + std::to_string(items ? kMaxItems : kMaxBytes) +
          (items ? " items" : " bytes") + " (llmt's limit on what a template makes)");
  }
  // Python's int arithmetic where it fits in 64 bits; beyond, an error (Python's ints are unbounded)
  int64_t checked(bool overflow, int64_t r, const char* op) const {
    if (overflow) err(std::string("integer overflow in '") + op + "' (llmt's integers are 64-bit)");
    return r;
  }
  int64_t add(int64_t a, int64_t b, const char* op) const {
    int64_t r;
    const bool o = __builtin_add_overflow(a, b, &r);
    return checked(o, r, op);
  }
  int64_t mul(int64_t a, int64_t b, const char* op) const {
    int64_t r;
    const bool o = __builtin_mul_overflow(a, b, &r);
    return checked(o, r, op);
  }
  // nested lists/dicts as deep as kMaxDepth at most (copies and destructors of JSON values recurse)
  static int nesting(const ojson& v, int limit) {
    if (limit <= 0) return 1;
    int d = 0;
    if (v.is_array())
      for (const auto& x : v) d = std::max(d, nesting(x, limit - 1));
    else if (v.is_object())
      for (auto it = v.begin(); it != v.end(); ++it) d = std::max(d, nesting(it.value(), limit - 1));
    else
      return 0;
    return d + 1;
  }
  ojson nested(ojson v) const {
    if (nesting(v, kMaxDepth + 1) > kMaxDepth) err("a value nested deeper than " + std::to_string(kMaxDepth) + " levels");
    return v;
  }

  [[noreturn]] void err(const std::string& m) const { fail("chat template %s, line %d: %s", name_.c_str(), line_, m.c_str()); }

  Val lookup(const std::string& n) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto f = it->find(n);
      if (f != it->end()) return f->second;
    }
    if (kGlobals.count(n)) return Val::func(n);
    return Val::undef("'" + n + "' is undefined");
  }
  void assign(const std::string& n, Val v) { scopes.back()[n] = std::move(v); }
  // e's value without copying a variable's (messages[i], messages|length: no deep copy of messages);
  // other expressions are evaluated into tmp. Expressions assign nothing, so the reference lasts.
  const Val& ref(const Expr& e, Val& tmp) {
    if (e.t == Expr::kName) {
      line_ = e.line ? e.line : line_;
      for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
        auto f = it->find(e.s);
        if (f != it->end()) return f->second;
      }
    }
    tmp = eval(e);
    return tmp;
  }

  void exec(const Node& n) {
    line_ = n.line ? n.line : line_;
    switch (n.t) {
      case Node::kText:
        check_size(out.text.size() + n.text.size(), false, "an output");
        out.text += n.text;
        break;
      case Node::kOut: {
        const std::string s = py_str(eval(*n.e));
        check_size(out.text.size() + s.size(), false, "an output");
        out.text += s;
        break;
      }
      case Node::kIf:
        for (const auto& br : n.branches)
          if (!br.first || truthy(eval(*br.first))) {
            run(br.second);
            break;
          }
        break;
      case Node::kFor: exec_for(n); break;
      case Node::kSet: {
        Val v = eval(*n.e);
        if (n.targets.size() == 1) {
          assign(n.targets[0], std::move(v));
        } else {
          std::vector<Val> parts = unpack(v, n.targets.size());
          for (size_t i = 0; i < parts.size(); i++) assign(n.targets[i], std::move(parts[i]));
        }
        break;
      }
      case Node::kSetAttr: {
        Val ns = lookup(n.text);
        if (ns.k != Val::kNs) err("cannot assign the attribute '" + n.attr + "' of '" + n.text + "', a " +
                                  type_name(ns) + ", not a namespace()");
        Val v = eval(*n.e);
        if (v.k != Val::kJson) err("llmt's namespaces hold plain values; '" + n.text + "." + n.attr + "' was given a " +
                                   type_name(v));
        (*ns.ns)[n.attr] = v.j;
        break;
      }
      case Node::kSetBlock: {
        // the block renders into its own buffer; the guard puts the output back however the block
        // ends ({% break %} inside a loop: Jinja drops the capture and assigns nothing)
        struct Capture {
          ChatRender& out;
          std::string saved;
          size_t gens;
          explicit Capture(ChatRender& o) : out(o), gens(o.generation.size()) { saved.swap(out.text); }
          ~Capture() {
            out.text.swap(saved);
            out.generation.resize(gens);
          }
        };
        std::string captured;
        {
          Capture c(out);
          run(n.body);
          captured.swap(out.text);
        }
        assign(n.targets[0], Val::of(std::move(captured)));
        break;
      }
      case Node::kGen: {
        const size_t b = out.text.size();
        run(n.body);
        out.generation.emplace_back(b, out.text.size());
        break;
      }
      case Node::kBreak: throw BreakSignal{};
      case Node::kContinue: throw ContinueSignal{};
    }
  }

  std::vector<Val> iterate(const Val& v) {
    std::vector<Val> items;
    if (v.k == Val::kUndef) return items;
    if (v.k != Val::kJson) err(std::string("cannot iterate over a ") + type_name(v));
    if (v.j.is_array()) {
      for (const auto& x : v.j) items.push_back(Val::of(x));
    } else if (v.j.is_object()) {
      for (auto it = v.j.begin(); it != v.j.end(); ++it) items.push_back(Val::of(it.key()));
    } else if (v.j.is_string()) {
      std::vector<uint32_t> cps = to_cps(v.str());
      check_size(cps.size(), true, "a string's characters, as a list,");
      for (size_t i = 0; i < cps.size(); i++) items.push_back(Val::of(from_cps(cps, i, i + 1)));
    } else {
      err(std::string("'") + type_name(v) + "' object is not iterable");
    }
    return items;
  }
  std::vector<Val> unpack(const Val& v, size_t n) {
    std::vector<Val> parts = iterate(v);
    if (parts.size() != n)
      err("cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(n) + " names");
    return parts;
  }

  void exec_for(const Node& n) {
    Val tmp;
    std::vector<Val> items = iterate(ref(*n.e, tmp));
    auto bind = [&](const Val& item) {
      if (n.targets.size() == 1) {
        assign(n.targets[0], item);
      } else {
        std::vector<Val> parts = unpack(item, n.targets.size());
        for (size_t k = 0; k < parts.size(); k++) assign(n.targets[k], parts[k]);
      }
    };
    if (n.cond) {  // `for x in y if c`: filtered first, loop.length counts what is kept
      std::vector<Val> kept;
      for (const Val& it : items) {
        count_iteration();
        scopes.emplace_back();
        bind(it);
        const bool keep = truthy(eval(*n.cond));
        scopes.pop_back();
        if (keep) kept.push_back(it);
      }
      items.swap(kept);
    }
    if (items.empty()) {
      scopes.emplace_back();
      run(n.else_body);
      scopes.pop_back();
      return;
    }
    const int64_t len = (int64_t)items.size();
    for (int64_t i = 0; i < len; i++) {
      count_iteration();
      scopes.emplace_back();  // a fresh scope each iteration: a {% set %} inside lasts one iteration
      ojson loop = {{"index0", i}, {"index", i + 1}, {"revindex0", len - 1 - i}, {"revindex", len - i},
                    {"first", i == 0}, {"last", i == len - 1}, {"length", len}, {"depth", 1}, {"depth0", 0}};
      if (i > 0 && items[(size_t)i - 1].k == Val::kJson) loop["previtem"] = items[(size_t)i - 1].j;
      if (i + 1 < len && items[(size_t)i + 1].k == Val::kJson) loop["nextitem"] = items[(size_t)i + 1].j;
      assign("loop", Val::of(std::move(loop)));
      bind(items[(size_t)i]);
      bool stop = false;
      try {
        run(n.body);
      } catch (const BreakSignal&) {
        stop = true;
      } catch (const ContinueSignal&) {
      }
      scopes.pop_back();
      if (stop) break;
    }
  }

  // getattr(obj, name) as Jinja's sandbox does it: a dict's key, else Undefined
  Val attr(const Val& o, const std::string& name) {
    if (o.k == Val::kUndef) err("an attribute '" + name + "' of an undefined value (" + o.name + ")");
    if (o.k == Val::kNs) {
      auto f = o.ns->find(name);
      return f == o.ns->end() ? Val::undef("namespace has no attribute '" + name + "'") : Val::of(*f);
    }
    if (o.k != Val::kJson) return Val::undef("no attribute '" + name + "'");
    const ojson& j = o.j;
    if (j.is_object()) {
      static const std::set<std::string> dict_methods = {"items", "keys", "values", "get"};
      if (dict_methods.count(name)) return Val::func("." + name, j);
      auto f = j.find(name);
      if (f != j.end()) return Val::of(*f);
      return Val::undef("'dict object' has no attribute '" + name + "'");
    }
    if (j.is_string() && kMethods.count(name)) return Val::func("." + name, j);
    return Val::undef(std::string("'") + type_name(o) + " object' has no attribute '" + name + "'");
  }
  Val item(const Val& o, const Val& key) {
    if (o.k == Val::kUndef) err("a subscript of an undefined value (" + o.name + ")");
    if (o.k == Val::kNs && key.is_str()) return attr(o, key.str());
    if (o.k != Val::kJson) return Val::undef("not subscriptable");
    const ojson& j = o.j;
    if (j.is_object()) {
      if (key.is_str()) {
        auto f = j.find(key.str());
        if (f != j.end()) return Val::of(*f);
      }
      return Val::undef("'dict object' has no attribute " + py_repr(key.j));
    }
    if ((j.is_array() || j.is_string()) && key.k == Val::kJson && is_int(key.j)) {
      int64_t i = as_int(key.j);
      if (j.is_array()) {
        const int64_t n = (int64_t)j.size();
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Val::undef("list index out of range");
        return Val::of(j[(size_t)i]);
      }
      std::vector<uint32_t> cps = to_cps(j.get_ref<const std::string&>());
      const int64_t n = (int64_t)cps.size();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Val::undef("string index out of range");
      return Val::of(from_cps(cps, (size_t)i, (size_t)i + 1));
    }
    if (key.is_str()) return attr(o, key.str());
    return Val::undef("no item " + py_str(key));
  }

  // Jinja's make_attrgetter: "function.name" looks up function, then name; a part of digits indexes
  Val attr_path(const Val& x, const std::string& path) {
    Val v = x;
    for (size_t b = 0;;) {
      const size_t e = path.find('.', b);
      const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        errno = 0;
        const long long i = std::strtoll(part.c_str(), nullptr, 10);
        if (errno == ERANGE) err("the index " + part + " in the attribute '" + path + "'");
        v = item(v, Val::of((int64_t)i));
      } else {
        v = item(v, Val::of(part));
      }
      if (e == std::string::npos) return v;
      b = e + 1;
    }
  }

  // the indices s[lo:hi:st] selects of a sequence of n, as Python's slice.indices; no overflow
  std::vector<int64_t> slice_indices(int64_t n, const Val* lo, const Val* hi, const Val* st) const {
    auto get = [&](const Val* v, bool* has) -> int64_t {
      *has = v && !(v->k == Val::kJson && v->j.is_null());
      if (!*has) return 0;
      if (!v->is_num() || !is_int(v->j))
        err(std::string("slice indices must be integers or None, not ") + type_name(*v));
      return as_int(v->j);
    };
    bool hl, hh, hs;
    int64_t a = get(lo, &hl), b = get(hi, &hh), s = get(st, &hs);
    if (!hs) s = 1;
    if (s == 0) err("slice step cannot be zero");
    if (s > n) s = n + 1;  // a step past the sequence selects one item at most: clamped, i += s cannot overflow
    if (s < -n - 1) s = -n - 1;
    std::vector<int64_t> idx;
    if (s > 0) {
      a = !hl ? 0 : a < 0 ? std::max<int64_t>(0, a + n) : std::min(a, n);
      b = !hh ? n : b < 0 ? std::max<int64_t>(0, b + n) : std::min(b, n);
      for (int64_t i = a; i < b; i += s) idx.push_back(i);
    } else {
      a = !hl ? n - 1 : a < 0 ? std::max<int64_t>(-1, a + n) : std::min(a, n - 1);
      b = !hh ? -1 : b < 0 ? std::max<int64_t>(-1, b + n) : std::min(b, n - 1);
      for (int64_t i = a; i > b; i += s) idx.push_back(i);
    }
    return idx;
  }

  Val eval(const Expr& e) {
    line_ = e.line ? e.line : line_;
    switch (e.t) {
      case Expr::kLit: return Val::of(e.lit);
      case Expr::kName: return lookup(e.s);
      case Expr::kAttr: {
        Val tmp;
        return attr(ref(*e.a[0], tmp), e.s);
      }
      case Expr::kItem: {
        Val tmp;
        const Val& o = ref(*e.a[0], tmp);
        return item(o, eval(*e.a[1]));
      }
      case Expr::kSlice: {
        Val tmp;
        const Val& o = ref(*e.a[0], tmp);
        Val lo, hi, st;
        if (e.a[1]) lo = eval(*e.a[1]);
        if (e.a[2]) hi = eval(*e.a[2]);
        if (e.a[3]) st = eval(*e.a[3]);
        if (o.k != Val::kJson || !(o.j.is_array() || o.j.is_string()))
          err(std::string("cannot slice a ") + type_name(o));
        if (o.j.is_array()) {
          ojson r = ojson::array();
          for (int64_t i : slice_indices((int64_t)o.j.size(), e.a[1] ? &lo : nullptr, e.a[2] ? &hi : nullptr,
                                         e.a[3] ? &st : nullptr))
            r.push_back(o.j[(size_t)i]);
          return Val::of(std::move(r));
        }
        std::vector<uint32_t> cps = to_cps(o.str()), sel;
        for (int64_t i : slice_indices((int64_t)cps.size(), e.a[1] ? &lo : nullptr, e.a[2] ? &hi : nullptr,
                                       e.a[3] ? &st : nullptr))
          sel.push_back(cps[(size_t)i]);
        return Val::of(from_cps(sel, 0, sel.size()));
      }
      case Expr::kList: {
        ojson r = ojson::array();
        for (const auto& x : e.a) r.push_back(nested(plain(eval(*x), "a list")));
        return Val::of(std::move(r));
      }
      case Expr::kDict: {
        ojson r = ojson::object();
        for (size_t i = 0; i + 1 < e.a.size(); i += 2) {
          Val k = eval(*e.a[i]);
          if (!k.is_str()) err("llmt's dicts take string keys");
          r[k.str()] = nested(plain(eval(*e.a[i + 1]), "a dict"));
        }
        return Val::of(std::move(r));
      }
      case Expr::kNot: return Val::of(!truthy(eval(*e.a[0])));
      case Expr::kNeg: {
        Val v = eval(*e.a[0]);
        if (!v.is_num()) err(std::string("bad operand type for unary -: '") + type_name(v) + "'");
        if (!is_int(v.j)) return Val::of(-num(v.j));
        const int64_t x = as_int(v.j);
        return Val::of(x == INT64_MIN ? checked(true, 0, "-") : -x);
      }
      case Expr::kCond: {
        if (truthy(eval(*e.a[0]))) return eval(*e.a[1]);
        return e.a[2] ? eval(*e.a[2]) : Val::undef("the else of an inline if");
      }
      case Expr::kBin: return binary(e);
      case Expr::kCompare: {  // a < b < c: a < b and b < c, each operand evaluated once, as Python
        Val l = eval(*e.a[0]);
        for (size_t i = 0; i < e.ops.size(); i++) {
          Val r = eval(*e.a[i + 1]);
          line_ = e.line;
          if (!compare(e.ops[i], l, r)) return Val::of(false);
          l = std::move(r);
        }
        return Val::of(true);
      }
      case Expr::kCall: return call(e);
      case Expr::kFilter: return filter(e);
      case Expr::kTest: {
        const bool r = test(e);
        return Val::of(e.negate ? !r : r);
      }
    }
    return Val();
  }

  ojson plain(const Val& v, const char* where) {
    if (v.k == Val::kJson) return v.j;
    if (v.k == Val::kUndef) err(std::string("an undefined value (") + v.name + ") inside " + where);
    err(std::string("a ") + type_name(v) + " inside " + where);
  }

  bool compare(const std::string& op, const Val& l, const Val& r) {
    if (op == "==") return val_eq(l, r);
    if (op == "!=") return !val_eq(l, r);
    if (op == "in" || op == "not in") return contains(r, l) == (op == "in");
    if (l.is_undef() || r.is_undef())
      err("an undefined value in '" + op + "' (" + (l.is_undef() ? l.name : r.name) + ")");
    int c;
    if (l.is_num() && r.is_num()) c = num(l.j) < num(r.j) ? -1 : num(l.j) > num(r.j) ? 1 : 0;
    else if (l.is_str() && r.is_str()) c = l.str() < r.str() ? -1 : l.str() == r.str() ? 0 : 1;  // UTF-8 bytes sort as code points
    else err(std::string("'") + op + "' not supported between '" + type_name(l) + "' and '" + type_name(r) + "'");
    return op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
  }
  // `x in c` (and the test `x is in c`) as Python: a substring, a dict's key, a list's item
  bool contains(const Val& c, const Val& x) {
    if (c.k == Val::kUndef) return false;  // Jinja's Undefined iterates as empty
    if (c.k == Val::kJson && c.j.is_string()) {
      if (!x.is_str()) err(std::string("'in <string>' requires string as left operand, not ") + type_name(x));
      return c.str().find(x.str()) != std::string::npos;
    }
    if (c.k == Val::kJson && c.j.is_object()) return x.is_str() && c.j.contains(x.str());
    if (c.k == Val::kJson && c.j.is_array()) {
      for (const auto& y : c.j)
        if (x.k == Val::kJson && json_eq(x.j, y)) return true;
      return false;
    }
    err(std::string("argument of type '") + type_name(c) + "' is not iterable");
  }

  Val binary(const Expr& e) {
    const std::string& op = e.s;
    if (op == "and") {
      Val l = eval(*e.a[0]);
      return truthy(l) ? eval(*e.a[1]) : l;
    }
    if (op == "or") {
      Val l = eval(*e.a[0]);
      return truthy(l) ? l : eval(*e.a[1]);
    }
    Val l = eval(*e.a[0]), r = eval(*e.a[1]);
    line_ = e.line;
    if (op == "~") {
      std::string a = py_str(l), b = py_str(r);
      check_size(a.size() + b.size(), false, "a string");
      return Val::of(a + b);
    }
    if (l.is_undef() || r.is_undef())
      err("an undefined value in '" + op + "' (" + (l.is_undef() ? l.name : r.name) + ")");
    const bool lists = l.k == Val::kJson && r.k == Val::kJson && l.j.is_array() && r.j.is_array();
    if (op == "+") {
      if (l.is_str() && r.is_str()) {
        check_size(l.str().size() + r.str().size(), false, "a string");
        return Val::of(l.str() + r.str());
      }
      if (lists) {
        check_size(l.j.size() + r.j.size(), true, "a list");
        ojson a = l.j;
        for (const auto& x : r.j) a.push_back(x);
        return Val::of(std::move(a));
      }
    }
    if (op == "*") {  // a sequence repeated: s * n, n * s
      const Val& seq = l.is_num() ? r : l;
      const Val& times = l.is_num() ? l : r;
      if (times.is_num() && is_int(times.j) && seq.k == Val::kJson && (seq.j.is_string() || seq.j.is_array())) {
        const size_t each = seq.j.is_string() ? seq.str().size() : seq.j.size();
        const int64_t n = each ? std::max<int64_t>(0, as_int(times.j)) : 0;  // '' * 10**11: no loop
        const bool items = seq.j.is_array();
        if (each && (uint64_t)n > (items ? kMaxItems : kMaxBytes) / each)  // before allocating
          check_size((items ? kMaxItems : kMaxBytes) + 1, items, items ? "a list" : "a string");
        if (!items) {
          std::string o;
          o.reserve(each * (size_t)n);
          for (int64_t i = 0; i < n; i++) o += seq.str();
          return Val::of(std::move(o));
        }
        ojson o = ojson::array();
        for (int64_t i = 0; i < n; i++)
          for (const auto& x : seq.j) o.push_back(x);
        return Val::of(std::move(o));
      }
    }
    if (!l.is_num() || !r.is_num())
      err(std::string("unsupported operand types for ") + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
    const bool ints = is_int(l.j) && is_int(r.j);
    const double a = num(l.j), b = num(r.j);
    if (op == "/") {
      if (b == 0) err("division by zero");
      return Val::of(a / b);
    }
    if (op == "//" || op == "%") {
      if (b == 0) err("integer division or modulo by zero");
      if (ints) {
        const int64_t x = as_int(l.j), y = as_int(r.j);
        if (y == -1) return op == "%" ? Val::of((int64_t)0) : Val::of(x == INT64_MIN ? checked(true, 0, "//") : -x);
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;  // Python floors
        return Val::of(op == "//" ? q : m);
      }
      const double q = std::floor(a / b);
      return Val::of(op == "//" ? q : a - q * b);
    }
    if (op == "**") {
      if (!ints || as_int(r.j) < 0) return Val::of(std::pow(a, b));
      int64_t base = as_int(l.j), p = as_int(r.j), acc = 1;
      while (p > 0) {  // by squaring, each product checked
        if (p & 1) acc = mul(acc, base, "**");
        p >>= 1;
        if (p) base = mul(base, base, "**");
      }
      return Val::of(acc);
    }
    if (ints) {
      const int64_t x = as_int(l.j), y = as_int(r.j);
      int64_t z = 0;
      const bool o = op == "+" ? __builtin_add_overflow(x, y, &z) : op == "-" ? __builtin_sub_overflow(x, y, &z)
                                                                              : __builtin_mul_overflow(x, y, &z);
      return Val::of(checked(o, z, op.c_str()));  // o is computed before z is read
    }
    return Val::of(op == "+" ? a + b : op == "-" ? a - b : a * b);
  }

  // the positional and keyword arguments of a call, filter or test (skipping `skip` leading operands)
  void args(const Expr& e, size_t skip, std::vector<Val>* pos, Kwargs* kw) {
    const size_t nkw = e.kw.size(), n = e.a.size();
    for (size_t i = skip; i < n - nkw; i++) pos->push_back(eval(*e.a[i]));
    for (size_t i = 0; i < nkw; i++) kw->emplace_back(e.kw[i], eval(*e.a[n - nkw + i]));
  }
  static const Val* kwarg(const Kwargs& kw, const char* name) {
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
  // parameter `name`, the i-th positional one; null when not given
  static const Val* arg(const std::vector<Val>& pos, const Kwargs& kw, size_t i, const char* name) {
    return i < pos.size() ? &pos[i] : kwarg(kw, name);
  }
  std::string str_arg(const Val* v, const std::string& what) {
    if (!v || !v->is_str()) err(what + " must be a string");
    return v->str();
  }

  Val call(const Expr& e) {
    const Expr& callee = *e.a[0];
    std::vector<Val> pos;
    Kwargs kw;
    if (callee.t == Expr::kName) {
      Val f = lookup(callee.s);
      args(e, 1, &pos, &kw);
      line_ = e.line;
      if (f.k != Val::kFunc) err("'" + callee.s + "' is a " + type_name(f) + ", not a function");
      const std::string& n = f.name;
      if (n == "raise_exception") {
        const Val* msg = arg(pos, kw, 0, "message");
        fail("chat template %s, line %d: the template raised an error: %s", name_.c_str(), line_,
             msg ? py_str(*msg).c_str() : "");
      }
      if (n == "strftime_now") {
        std::string fmt = str_arg(arg(pos, kw, 0, "format"), "strftime_now's format");
        std::time_t t = now_ ? now_ : std::time(nullptr);
        std::tm tm{};
        localtime_r(&t, &tm);
        char buf[256];
        const size_t len = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
        return Val::of(std::string(buf, len));
      }
      if (n == "namespace" || n == "dict") {
        ojson o = ojson::object();
        for (const Val& p : pos) {  // namespace(dict) / dict(dict)
          if (p.k != Val::kJson || !p.j.is_object()) err(n + "() takes keyword arguments or a dict");
          for (auto it = p.j.begin(); it != p.j.end(); ++it) o[it.key()] = it.value();
        }
        for (const auto& [k, v] : kw) o[k] = plain(v, "a namespace");  // in call order
        if (n == "dict") return Val::of(std::move(o));
        Val r;
        r.k = Val::kNs;
        r.ns = std::make_shared<ojson>(std::move(o));
        return r;
      }
      if (n == "range") {
        std::vector<int64_t> v;
        if (!kw.empty()) err("range() takes no keyword arguments");
        for (const Val& p : pos) {
          if (!p.is_num() || !is_int(p.j)) err("range() takes integers");
          v.push_back(as_int(p.j));
        }
        if (v.empty() || v.size() > 3) err("range() takes 1 to 3 integers");
        int64_t a = v.size() == 1 ? 0 : v[0], b = v.size() == 1 ? v[0] : v[1], s = v.size() == 3 ? v[2] : 1;
        if (s == 0) err("range() step must not be zero");
        __int128 count = 0;  // counted first, in 128 bits: no overflow, no endless loop
        if (s > 0 && b > a) count = ((__int128)b - a - 1) / s + 1;
        if (s < 0 && a > b) count = ((__int128)a - b - 1) / -(__int128)s + 1;
        if (count > 100000) err("range() of more than 100000 numbers");
        ojson r = ojson::array();
        for (int64_t k = 0; k < (int64_t)count; k++) r.push_back((int64_t)((__int128)a + (__int128)k * s));
        return Val::of(std::move(r));
      }
      err("unknown function " + n);
    }
    // a method: callee is kAttr
    Val tmp;
    const Val& self = ref(*callee.a[0], tmp);
    args(e, 1, &pos, &kw);
    line_ = e.line;
    const std::string& m = callee.s;
    if (self.k == Val::kUndef) err("the method ." + m + "() of an undefined value (" + self.name + ")");
    if (self.k != Val::kJson) err("the method ." + m + "() of a " + type_name(self));
    const ojson& j = self.j;
    if (j.is_object()) {
      if (m == "items") {
        ojson r = ojson::array();
        for (auto it = j.begin(); it != j.end(); ++it) r.push_back(ojson::array({it.key(), it.value()}));
        return Val::of(std::move(r));
      }
      if (m == "keys" || m == "values") {
        ojson r = ojson::array();
        for (auto it = j.begin(); it != j.end(); ++it) r.push_back(m == "keys" ? ojson(it.key()) : it.value());
        return Val::of(std::move(r));
      }
      if (m == "get") {
        std::string k = str_arg(arg(pos, kw, 0, "key"), "get()'s key");
        auto f = j.find(k);
        if (f != j.end()) return Val::of(*f);
        const Val* d = arg(pos, kw, 1, "default");
        return d ? *d : Val::of(nullptr);
      }
      if (j.contains(m)) err("'" + m + "' is a key of the dict, not a method");
      err("dict has no method ." + m + "()");
    }
    if (!j.is_string()) err(std::string("the method .") + m + "() of a " + type_name(self));
    const std::string& s = j.get_ref<const std::string&>();
    if (m == "strip" || m == "lstrip" || m == "rstrip") {
      const Val* c = arg(pos, kw, 0, "chars");
      std::string chars;
      const bool has = c && c->is_str();
      if (has) chars = c->str();
      return Val::of(py_strip(s, has ? &chars : nullptr, m != "rstrip", m != "lstrip"));
    }
    if (m == "upper" || m == "lower") {
      std::string r = s;
      for (char& c : r) c = (char)(m == "upper" ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
      return Val::of(r);
    }
    if (m == "title" || m == "capitalize") return Val::of(case_words(s, m == "title"));
    if (m == "startswith" || m == "endswith" || m == "find" || m == "index" || m == "count") {
      // s[start:end] (code points, Python's clamping); a start past the end matches nothing, not even ''
      const std::vector<uint32_t> cps = to_cps(s);
      const int64_t n = (int64_t)cps.size();
      auto bound = [&](const Val* v, int64_t dflt) -> int64_t {
        if (!v || (v->k == Val::kJson && v->j.is_null())) return dflt;
        if (!v->is_num() || !is_int(v->j)) err(m + "()'s start and end must be integers or None");
        const int64_t x = as_int(v->j);
        return x < 0 ? std::max<int64_t>(0, x + n) : std::min<int64_t>(x, n + 1);
      };
      const int64_t b = bound(arg(pos, kw, 1, "start"), 0), e = std::min(bound(arg(pos, kw, 2, "end"), n), n);
      const bool none = b > n || e < b;
      const std::string part = none ? "" : from_cps(cps, (size_t)b, (size_t)e);
      if (m == "startswith" || m == "endswith") {
        const Val* p = arg(pos, kw, 0, m == "startswith" ? "prefix" : "suffix");
        std::vector<std::string> opts;
        if (p && p->is_str()) opts.push_back(p->str());
        else if (p && p->k == Val::kJson && p->j.is_array())
          for (const auto& x : p->j)
            if (x.is_string()) opts.push_back(x.get<std::string>());
            else err(m + "() takes a string or a tuple of strings");
        else err(m + "() takes a string or a tuple of strings");
        for (const std::string& o : opts)
          if (!none && o.size() <= part.size() &&
              (m == "startswith" ? part.compare(0, o.size(), o) == 0
                                 : part.compare(part.size() - o.size(), o.size(), o) == 0))
            return Val::of(true);
        return Val::of(false);
      }
      std::string sub = str_arg(arg(pos, kw, 0, "sub"), m + "()'s argument");
      if (m == "count") {
        if (none) return Val::of((int64_t)0);
        if (sub.empty()) return Val::of(e - b + 1);
        int64_t c = 0;
        for (size_t f = part.find(sub); f != std::string::npos; f = part.find(sub, f + sub.size())) c++;
        return Val::of(c);
      }
      const size_t f = none ? std::string::npos : part.find(sub);
      if (f == std::string::npos) {
        if (m == "index") err("substring not found");
        return Val::of((int64_t)-1);
      }
      return Val::of(b + (int64_t)to_cps(part.substr(0, f)).size());
    }
    if (m == "split" || m == "rsplit") {
      const Val* sep = arg(pos, kw, 0, "sep");
      const Val* mx = arg(pos, kw, 1, "maxsplit");
      int64_t maxsplit = mx && mx->is_num() ? as_int(mx->j) : -1;
      ojson r = ojson::array();
      if (!sep || (sep->k == Val::kJson && sep->j.is_null())) {  // runs of whitespace
        if (m == "rsplit" && maxsplit >= 0) err("rsplit() with maxsplit and no separator");
        std::vector<uint32_t> cps = to_cps(s);
        size_t i = 0;
        int64_t splits = 0;
        while (i < cps.size()) {
          while (i < cps.size() && py_space(cps[i])) i++;
          if (i >= cps.size()) break;
          if (maxsplit >= 0 && splits == maxsplit) {  // the rest, its trailing whitespace kept (Python)
            r.push_back(from_cps(cps, i, cps.size()));
            break;
          }
          size_t b = i;
          while (i < cps.size() && !py_space(cps[i])) i++;
          r.push_back(from_cps(cps, b, i));
          splits++;
        }
        return Val::of(std::move(r));
      }
      std::string d = str_arg(sep, "split()'s separator");
      if (d.empty()) err("empty separator");
      std::vector<std::string> parts;
      size_t b = 0;
      for (;;) {
        size_t f = s.find(d, b);
        if (f == std::string::npos) break;
        parts.push_back(s.substr(b, f - b));
        b = f + d.size();
      }
      parts.push_back(s.substr(b));
      if (maxsplit >= 0 && (int64_t)parts.size() > maxsplit + 1) {
        std::vector<std::string> joined;
        if (m == "split") {
          joined.assign(parts.begin(), parts.begin() + maxsplit);
          std::string rest = parts[(size_t)maxsplit];
          for (size_t k = (size_t)maxsplit + 1; k < parts.size(); k++) rest += d + parts[k];
          joined.push_back(rest);
        } else {
          const size_t keep = parts.size() - (size_t)maxsplit;
          std::string rest = parts[0];
          for (size_t k = 1; k < keep; k++) rest += d + parts[k];
          joined.push_back(rest);
          joined.insert(joined.end(), parts.begin() + (long)keep, parts.end());
        }
        parts.swap(joined);
      }
      for (auto& p : parts) r.push_back(p);
      return Val::of(std::move(r));
    }
    if (m == "splitlines") {
      ojson r = ojson::array();
      size_t b = 0;
      for (size_t i = 0; i < s.size(); i++)
        if (s[i] == '\n' || s[i] == '\r') {
          r.push_back(s.substr(b, i - b));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') i++;
          b = i + 1;
        }
      if (b < s.size()) r.push_back(s.substr(b));
      return Val::of(std::move(r));
    }
    if (m == "replace") {
      std::string a = str_arg(arg(pos, kw, 0, "old"), "replace()'s old"), b = str_arg(arg(pos, kw, 1, "new"), "replace()'s new");
      const Val* c = arg(pos, kw, 2, "count");
      return Val::of(replace_all(s, a, b, c && c->is_num() ? as_int(c->j) : -1));
    }
    if (m == "join") {
      const Val* it = arg(pos, kw, 0, "iterable");
      if (!it) err("join() takes an iterable");
      std::string o;
      bool first = true;
      for (const Val& x : iterate(*it)) {
        if (!x.is_str()) err("join() takes strings");
        o += (first ? "" : s) + x.str();
        check_size(o.size(), false, "join()'s result");
        first = false;
      }
      return Val::of(o);
    }
    if (m == "format") {  // str.format's plain fields: {}, {0}, {name}, {{, }}; a field with more is refused
      std::string o;
      size_t next = 0;
      for (size_t i = 0; i < s.size(); i++) {
        if ((s[i] == '{' || s[i] == '}') && i + 1 < s.size() && s[i + 1] == s[i]) {
          o += s[i++];
        } else if (s[i] == '}') {
          err("format(): a single '}' in the format string");
        } else if (s[i] == '{') {
          const size_t e = s.find('}', i);
          if (e == std::string::npos) err("format(): a single '{' in the format string");
          const std::string field = s.substr(i + 1, e - i - 1);
          const Val* v = nullptr;
          if (field.empty()) {
            if (next >= pos.size()) err("format(): more {} fields than arguments");
            v = &pos[next++];
          } else if (std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; })) {
            const size_t k = field.size() > 9 ? pos.size() : (size_t)std::stoul(field);
            if (k >= pos.size()) err("format(): no argument " + field);
            v = &pos[k];
          } else if (field.find_first_of(":!.[") == std::string::npos) {
            v = kwarg(kw, field.c_str());
            if (!v) err("format(): no keyword argument '" + field + "'");
          } else {
            err("format(): the field {" + field + "} (llmt implements {}, {N} and {name}, no format specs)");
          }
          o += py_str(*v);
          check_size(o.size(), false, "format()'s result");
          i = e;
        } else {
          o += s[i];
        }
      }
      return Val::of(o);
    }
    if (m == "isdigit" || m == "isalpha" || m == "isspace") {
      std::vector<uint32_t> cps = to_cps(s);
      bool ok = !cps.empty();
      for (uint32_t c : cps) {
        if (m == "isspace") ok = ok && py_space(c);
        else if (c >= 0x80) err(m + "() of non-ASCII text");
        else ok = ok && (m == "isdigit" ? std::isdigit((int)c) : std::isalpha((int)c));
      }
      return Val::of(ok);
    }
    err("the method ." + m + "() on a string");
  }

  std::string replace_all(const std::string& s, const std::string& a, const std::string& b, int64_t count) const {
    std::string o;
    if (a.empty()) {  // Python: b before each character and at the end, count times at most
      const std::vector<uint32_t> cps = to_cps(s);
      size_t i = 0;
      for (int64_t n = 0; (count < 0 || n < count) && i <= cps.size(); n++, i++) {
        o += b + (i < cps.size() ? from_cps(cps, i, i + 1) : "");
        check_size(o.size(), false, "replace()'s result");
      }
      return o + (i < cps.size() ? from_cps(cps, i, cps.size()) : "");
    }
    size_t p = 0;
    for (int64_t n = 0; count < 0 || n < count; n++) {
      size_t f = s.find(a, p);
      if (f == std::string::npos) break;
      o += s.substr(p, f - p) + b;
      check_size(o.size(), false, "replace()'s result");
      p = f + a.size();
    }
    return o + s.substr(p);
  }
  static std::string case_words(const std::string& s, bool title) {
    std::string r = s;
    bool start = true;
    for (char& c : r) {
      const unsigned char u = (unsigned char)c;
      if (std::isalpha(u)) {
        c = (char)(start ? std::toupper(u) : std::tolower(u));
        start = false;
      } else {
        if (title) start = true;
        else if (start && u < 0x80) start = false;  // capitalize: only the first character
      }
    }
    return r;
  }

  int64_t length(const Val& v) {
    if (v.k == Val::kUndef) return 0;
    if (v.k == Val::kNs) return (int64_t)v.ns->size();
    if (v.k != Val::kJson) err(std::string("object of type '") + type_name(v) + "' has no len()");
    if (v.j.is_string()) return (int64_t)to_cps(v.str()).size();
    if (v.j.is_array() || v.j.is_object()) return (int64_t)v.j.size();
    err(std::string("object of type '") + type_name(v) + "' has no len()");
  }

  bool apply_test(const std::string& t, const Val& v, const std::vector<Val>& targs) {
    const ojson& j = v.j;
    const bool js = v.k == Val::kJson;
    if (t == "defined") return !v.is_undef();
    if (t == "undefined") return v.is_undef();
    if (t == "none") return js && j.is_null();
    if (t == "string") return js && j.is_string();
    if (t == "boolean") return js && j.is_boolean();
    if (t == "true") return js && j.is_boolean() && j.get<bool>();
    if (t == "false") return js && j.is_boolean() && !j.get<bool>();
    if (t == "number") return js && (j.is_number() || j.is_boolean());
    if (t == "integer") return js && (j.is_number_integer() || j.is_number_unsigned());
    if (t == "float") return js && j.is_number_float();
    if (t == "mapping") return (js && j.is_object()) || v.k == Val::kNs;
    if (t == "iterable") return v.is_undef() || (js && (j.is_string() || j.is_array() || j.is_object()));
    if (t == "sequence") return js && (j.is_string() || j.is_array() || j.is_object());
    if (t == "callable") return v.k == Val::kFunc;
    if (t == "lower" || t == "upper") {
      if (!v.is_str()) return false;
      std::string s = v.str();
      bool any = false;
      for (char c : s)
        if (std::isalpha((unsigned char)c)) {
          any = true;
          if (t == "lower" ? std::isupper((unsigned char)c) : std::islower((unsigned char)c)) return false;
        }
      return any;
    }
    if (t == "even" || t == "odd" || t == "divisibleby") {
      if (!v.is_num() || !is_int(j)) err("the test '" + t + "' takes an integer");
      int64_t d = 2;
      if (t == "divisibleby") {
        if (targs.empty() || !targs[0].is_num()) err("divisibleby takes a number");
        d = as_int(targs[0].j);
        if (d == 0) err("divisibleby 0");
      }
      if (d == -1) return t != "odd";  // INT64_MIN % -1 traps
      const int64_t r = as_int(j) % d;
      if (t == "odd") return r != 0;
      return t == "odd" ? r == 1 : r == 0;
    }
    if (targs.empty()) err("the test '" + t + "' takes an argument");
    const Val& o = targs[0];
    if (t == "equalto" || t == "eq" || t == "==") return val_eq(v, o);
    if (t == "ne" || t == "!=") return !val_eq(v, o);
    if (t == "sameas") return val_eq(v, o) && (!js || j.type() == o.j.type());
    if (t == "in") return contains(o, v);
    // gt ge lt le
    if (!(v.is_num() && o.is_num()) && !(v.is_str() && o.is_str())) err("the test '" + t + "' compares numbers or strings");
    const int c = v.is_num() ? (num(j) < num(o.j) ? -1 : num(j) > num(o.j) ? 1 : 0)
                             : (v.str() < o.str() ? -1 : v.str() == o.str() ? 0 : 1);
    if (t == "gt" || t == ">") return c > 0;
    if (t == "ge" || t == ">=") return c >= 0;
    if (t == "lt" || t == "<") return c < 0;
    return c <= 0;
  }

  bool test(const Expr& e) {
    Val tmp;
    const Val& v = ref(*e.a[0], tmp);
    std::vector<Val> pos;
    Kwargs kw;
    args(e, 1, &pos, &kw);
    line_ = e.line;
    return apply_test(e.s, v, pos);
  }

  Val filter(const Expr& e) {
    Val tmp;
    const Val& v = ref(*e.a[0], tmp);
    std::vector<Val> pos;
    Kwargs kw;
    args(e, 1, &pos, &kw);
    line_ = e.line;
    return apply_filter(e.s, v, pos, kw);
  }

  // Python's order of two sort keys (numbers, strings; strings folded to lower case unless
  // case_sensitive, as Jinja's ignore_case): -1, 0, 1
  int order(const Val& x, const Val& y, bool case_sensitive) {
    if (x.is_num() && y.is_num()) return num(x.j) < num(y.j) ? -1 : num(x.j) > num(y.j) ? 1 : 0;
    if (x.is_str() && y.is_str()) {
      if (case_sensitive) return x.str() < y.str() ? -1 : x.str() == y.str() ? 0 : 1;
      const std::string a = ascii_lower(x.str()), b = ascii_lower(y.str());
      return a < b ? -1 : a == b ? 0 : 1;
    }
    err(std::string("'<' not supported between '") + type_name(x) + "' and '" + type_name(y) + "'");
  }
  static std::string ascii_lower(std::string s) {
    for (char& c : s) c = (char)std::tolower((unsigned char)c);
    return s;
  }
  bool flag(const Val* v) { return v && truthy(*v); }
  int64_t int_arg(const Val* v, int64_t dflt, const std::string& what) {
    if (!v) return dflt;
    if (!v->is_num() || !is_int(v->j)) err(what + " must be an integer");
    return as_int(v->j);
  }
  // a float's integer part as Python's int(); past 64 bits an error
  int64_t to_int(double d) {
    if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0)) err("int() of " + py_float(d) + " (llmt's integers are 64-bit)");
    return (int64_t)d;
  }
  // a number in a string, as Python's float() reads it: decimal, inf, nan (not C's hex floats)
  static bool parse_float(const std::string& s, double* d) {
    if (s.empty() || s.find_first_of("xX") != std::string::npos) return false;
    char* end = nullptr;
    *d = std::strtod(s.c_str(), &end);
    return end && *end == 0;
  }
  // Jinja's do_title: words begin after whitespace, '-', '(', '{', '[' and '<'; each word's first
  // character upper-cased, the rest lower-cased (ASCII; other characters are kept)
  static std::string jinja_title(const std::string& s) {
    std::string r = s;
    bool start = true;
    for (char& c : r) {
      const unsigned char u = (unsigned char)c;
      if (std::isspace(u) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
        start = true;
        continue;
      }
      c = (char)(start ? std::toupper(u) : std::tolower(u));
      start = false;
    }
    return r;
  }

  Val apply_filter(const std::string& f, const Val& v, const std::vector<Val>& pos, const Kwargs& kw) {
    if (f == "safe") return v;
    if (f == "default" || f == "d") {
      const Val* def = arg(pos, kw, 0, "default_value");
      const Val* boolean = arg(pos, kw, 1, "boolean");
      const bool use = v.is_undef() || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (def ? *def : Val::of("")) : v;
    }
    if (f == "length" || f == "count") return Val::of(length(v));
    if (f == "string") return Val::of(py_str(v));
    if (f == "trim") {
      const Val* c = arg(pos, kw, 0, "chars");
      std::string chars;
      if (c && c->is_str()) chars = c->str();
      else if (c && !(c->k == Val::kJson && c->j.is_null())) err("trim's chars must be a string or None");
      return Val::of(py_strip(py_str(v), c && c->is_str() ? &chars : nullptr, true, true));
    }
    if (f == "upper" || f == "lower") {
      std::string r = py_str(v);
      for (char& c : r) c = (char)(f == "upper" ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
      return Val::of(r);
    }
    if (f == "capitalize") return Val::of(case_words(py_str(v), false));
    if (f == "title") return Val::of(jinja_title(py_str(v)));
    if (f == "replace") {
      std::string a = str_arg(arg(pos, kw, 0, "old"), "replace's old"), b = str_arg(arg(pos, kw, 1, "new"), "replace's new");
      const Val* c = arg(pos, kw, 2, "count");
      return Val::of(replace_all(py_str(v), a, b, c && !(c->k == Val::kJson && c->j.is_null()) ? int_arg(c, -1, "replace's count") : -1));
    }
    if (f == "tojson") {  // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
      const Val* ea = arg(pos, kw, 0, "ensure_ascii");
      const Val* ind = arg(pos, kw, 1, "indent");
      const Val* sep = arg(pos, kw, 2, "separators");
      const Val* sk = arg(pos, kw, 3, "sort_keys");
      int indent = -1;
      std::string pad;
      if (ind && ind->is_str()) err("tojson with a string indent");
      if (ind && !(ind->k == Val::kJson && ind->j.is_null())) {
        const int64_t n = int_arg(ind, 0, "tojson's indent");
        check_size((size_t)std::max<int64_t>(0, std::min<int64_t>(n, INT32_MAX)), false, "tojson's indent");
        indent = (int)std::max<int64_t>(0, n);  // json.dumps: a negative indent is 0 (newlines, no spaces)
      }
      std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
      if (sep && !(sep->k == Val::kJson && sep->j.is_null())) {
        if (!(sep->k == Val::kJson && sep->j.is_array() && sep->j.size() == 2 && sep->j[0].is_string() &&
              sep->j[1].is_string()))
          err("tojson's separators must be two strings");
        item_sep = sep->j[0].get<std::string>(), key_sep = sep->j[1].get<std::string>();
      }
      std::string o;
      dumps(plain(v, "tojson"), indent, item_sep, key_sep, flag(sk), flag(ea), 0, o);
      return Val::of(o);
    }
    if (f == "int") {  // Jinja: int(x, base) for a string, else int(x); failing that int(float(x)); failing that the default
      const Val* def = arg(pos, kw, 0, "default");
      const int64_t base = int_arg(arg(pos, kw, 1, "base"), 10, "int's base");
      if (base < 2 || base > 36) err("int's base must be 2 to 36 (llmt does not implement base 0)");
      if (v.is_num()) return Val::of(is_int(v.j) ? as_int(v.j) : to_int(num(v.j)));
      if (v.is_str()) {
        std::string s = py_strip(v.str(), nullptr, true, true);
        std::string digits;  // Python allows one '_' between digits
        for (size_t i = 0; i < s.size(); i++)
          if (!(s[i] == '_' && i > 0 && i + 1 < s.size() && std::isalnum((unsigned char)s[i - 1]) &&
                std::isalnum((unsigned char)s[i + 1])))
            digits += s[i];
        char* end = nullptr;
        errno = 0;
        const long long x = digits.empty() || std::isspace((unsigned char)digits[0]) ? 0 : std::strtoll(digits.c_str(), &end, (int)base);
        if (end && *end == 0) {
          if (errno == ERANGE) err("int() of '" + s + "' (llmt's integers are 64-bit)");
          return Val::of((int64_t)x);
        }
        double d;
        if (parse_float(digits, &d) && std::isfinite(d)) return Val::of(to_int(d));
      }
      return def ? *def : Val::of((int64_t)0);
    }
    if (f == "float") {
      const Val* def = arg(pos, kw, 0, "default");
      if (v.is_num()) return Val::of(num(v.j));
      double d;
      if (v.is_str() && parse_float(py_strip(v.str(), nullptr, true, true), &d)) return Val::of(d);
      return def ? *def : Val::of(0.0);
    }
    if (f == "abs") {
      if (!v.is_num()) err("abs of a " + std::string(type_name(v)));
      if (!is_int(v.j)) return Val::of(std::fabs(num(v.j)));
      const int64_t x = as_int(v.j);
      return Val::of(x == INT64_MIN ? checked(true, 0, "abs") : x < 0 ? -x : x);
    }
    if (f == "round") {  // Jinja: round(x, precision) for 'common' (Python's: half to even, an int stays an int)
      if (!v.is_num()) err("round of a " + std::string(type_name(v)));
      const int64_t prec = std::max<int64_t>(-400, std::min<int64_t>(400, int_arg(arg(pos, kw, 0, "precision"), 0, "round's precision")));
      const Val* mv = arg(pos, kw, 1, "method");
      const std::string method = mv ? str_arg(mv, "round's method") : "common";
      if (method != "common" && method != "ceil" && method != "floor")
        err("round's method must be 'common', 'ceil' or 'floor', not '" + method + "'");
      if (method == "common" && is_int(v.j)) {
        const int64_t x = as_int(v.j);
        if (prec >= 0) return Val::of(x);
        if (prec < -18) return Val::of((int64_t)0);
        int64_t p10 = 1;
        for (int64_t k = 0; k < -prec; k++) p10 *= 10;
        int64_t q = x / p10, r = x % p10;
        if (r < 0) q--, r += p10;  // floor
        if (2 * (__int128)r > p10 || (2 * (__int128)r == p10 && (q & 1))) q++;
        return Val::of(mul(q, p10, "round"));
      }
      const double d = num(v.j);
      if (!std::isfinite(d)) return Val::of(d);
      if (method == "common") {
        if (prec >= 0) {  // correctly rounded, half to even on the exact binary value, as Python's round
          std::string buf((size_t)std::snprintf(nullptr, 0, "%.*f", (int)prec, d) + 1, '\0');
          std::snprintf(&buf[0], buf.size(), "%.*f", (int)prec, d);
          return Val::of(std::strtod(buf.c_str(), nullptr));
        }
        const double m = std::pow(10.0, (double)-prec);
        return Val::of(std::nearbyint(d / m) * m);
      }
      const double m = std::pow(10.0, (double)prec);
      return Val::of((method == "ceil" ? std::ceil(d * m) : std::floor(d * m)) / m);
    }
    if (f == "items") {
      if (v.is_undef()) return Val::of(ojson::array());
      if (v.k != Val::kJson || !v.j.is_object()) err("items of a " + std::string(type_name(v)) + ", not a dict");
      ojson r = ojson::array();
      for (auto it = v.j.begin(); it != v.j.end(); ++it) r.push_back(ojson::array({it.key(), it.value()}));
      return Val::of(std::move(r));
    }
    if (f == "dictsort") {  // sorted(items, key=key or value, case-folded unless case_sensitive; reverse stable)
      if (v.k != Val::kJson || !v.j.is_object()) err("dictsort of a " + std::string(type_name(v)));
      const bool cs = flag(arg(pos, kw, 0, "case_sensitive")), rev = flag(arg(pos, kw, 2, "reverse"));
      const Val* byv = arg(pos, kw, 1, "by");
      const std::string by = byv ? str_arg(byv, "dictsort's by") : "key";
      if (by != "key" && by != "value") err("dictsort's by must be 'key' or 'value', not '" + by + "'");
      std::vector<std::pair<Val, Val>> kv;
      for (auto it = v.j.begin(); it != v.j.end(); ++it) kv.emplace_back(Val::of(it.key()), Val::of(it.value()));
      std::stable_sort(kv.begin(), kv.end(), [&](const auto& a, const auto& b) {
        const Val& x = by == "key" ? a.first : a.second;
        const Val& y = by == "key" ? b.first : b.second;
        return rev ? order(y, x, cs) < 0 : order(x, y, cs) < 0;
      });
      ojson r = ojson::array();
      for (const auto& [k, x] : kv) r.push_back(ojson::array({k.j, x.j}));
      return Val::of(std::move(r));
    }
    if (f == "indent") {
      const Val* w = arg(pos, kw, 0, "width");
      const Val* first = arg(pos, kw, 1, "first");
      const Val* blank = arg(pos, kw, 2, "blank");
      std::string pad;
      if (w && w->is_str()) {
        pad = w->str();
      } else {
        const int64_t n = int_arg(w, 4, "indent's width");  // Python: ' ' * n, nothing for n < 0
        check_size((size_t)std::max<int64_t>(0, std::min<int64_t>(n, INT32_MAX)), false, "indent's padding");
        pad.assign((size_t)std::max<int64_t>(0, n), ' ');
      }
      std::string s = py_str(v), o;
      std::vector<std::string> lines;
      size_t b = 0;
      for (size_t i = 0; i <= s.size(); i++)
        if (i == s.size() || s[i] == '\n') lines.push_back(s.substr(b, i - b)), b = i + 1;
      check_size(s.size() + (pad.size() ? lines.size() : 0) * pad.size(), false, "indent's result");
      for (size_t i = 0; i < lines.size(); i++) {
        if (i) o += "\n";
        const bool indent_it = (i > 0 || flag(first)) && (!lines[i].empty() || flag(blank));
        o += (indent_it ? pad : "") + lines[i];
      }
      return Val::of(o);
    }
    if (f == "wordcount") return Val::of((int64_t)call_split_words(py_str(v)));
    // filters over sequences
    std::vector<Val> items = iterate(v);
    if (f == "list") {
      ojson r = ojson::array();
      for (const Val& x : items) r.push_back(plain(x, "a list"));
      return Val::of(std::move(r));
    }
    if (f == "first") return items.empty() ? Val::undef("first of an empty sequence") : items.front();
    if (f == "last") return items.empty() ? Val::undef("last of an empty sequence") : items.back();
    if (f == "reverse") {
      if (v.is_str()) {
        std::vector<uint32_t> cps = to_cps(v.str());
        std::reverse(cps.begin(), cps.end());
        return Val::of(from_cps(cps, 0, cps.size()));
      }
      ojson r = ojson::array();
      for (auto it = items.rbegin(); it != items.rend(); ++it) r.push_back(plain(*it, "a list"));
      return Val::of(std::move(r));
    }
    if (f == "join") {
      const Val* sep = arg(pos, kw, 0, "d");
      const Val* at = arg(pos, kw, 1, "attribute");
      if (at && at->k == Val::kJson && at->j.is_null()) at = nullptr;
      std::string s = sep ? py_str(*sep) : "", o;
      for (size_t i = 0; i < items.size(); i++) {
        o += (i ? s : "") + py_str(at ? attr_path(items[i], py_str(*at)) : items[i]);
        check_size(o.size(), false, "join's result");
      }
      return Val::of(o);
    }
    if (f == "unique" || f == "sort" || f == "min" || f == "max" || f == "sum") {
      const size_t at_i = f == "sum" ? 0 : f == "sort" ? 2 : 1;
      const Val* at = arg(pos, kw, at_i, "attribute");
      if (at && at->k == Val::kJson && at->j.is_null()) at = nullptr;
      std::vector<std::string> paths;  // sort(attribute='a,b'): several keys (Jinja's make_multi_attrgetter)
      if (at) {
        const std::string a = py_str(*at);
        for (size_t b = 0;;) {
          const size_t e = a.find(',', b);
          paths.push_back(a.substr(b, e == std::string::npos ? std::string::npos : e - b));
          if (e == std::string::npos || f != "sort") break;
          b = e + 1;
        }
        if (f != "sort") paths.assign(1, a);
      }
      auto keys = [&](const Val& x) {
        std::vector<Val> k;
        if (paths.empty()) k.push_back(x);
        for (const std::string& p : paths) k.push_back(attr_path(x, p));
        return k;
      };
      if (f == "sum") {
        const Val* st = arg(pos, kw, 1, "start");
        Val acc = st ? *st : Val::of((int64_t)0);
        if (!acc.is_num()) err("sum's start must be a number (llmt sums numbers)");
        for (const Val& x : items) {
          Val k = keys(x)[0];
          if (!k.is_num()) err("sum of a " + std::string(type_name(k)));
          if (is_int(acc.j) && is_int(k.j)) {
            acc = Val::of(add(as_int(acc.j), as_int(k.j), "sum"));
          } else {
            acc = Val::of(num(acc.j) + num(k.j));
          }
        }
        return acc;
      }
      const bool cs = flag(arg(pos, kw, f == "sort" ? 1 : 0, "case_sensitive"));
      auto cmp = [&](const Val& a, const Val& b) {  // -1, 0, 1 over the keys in turn
        const std::vector<Val> x = keys(a), y = keys(b);
        for (size_t i = 0; i < x.size(); i++)
          if (int c = order(x[i], y[i], cs)) return c;
        return 0;
      };
      if (f == "min" || f == "max") {  // the first of the smallest / largest, as Python's min() and max()
        if (items.empty()) return Val::undef("min/max of an empty sequence");
        size_t best = 0;
        for (size_t i = 1; i < items.size(); i++)
          if (f == "min" ? cmp(items[i], items[best]) < 0 : cmp(items[i], items[best]) > 0) best = i;
        return items[best];
      }
      std::vector<Val> r;
      if (f == "unique") {  // the first of each group of equal keys (strings case-folded unless case_sensitive)
        std::vector<Val> seen;
        for (const Val& x : items) {
          Val k = keys(x)[0];
          if (!cs && k.is_str()) k = Val::of(ascii_lower(k.str()));
          bool dup = false;
          for (const Val& y : seen) dup = dup || val_eq(k, y);
          if (!dup) seen.push_back(k), r.push_back(x);
        }
      } else {  // Python's sorted(): stable, and reverse keeps equal items in their order
        const bool rev = flag(arg(pos, kw, 0, "reverse"));
        r = items;
        std::stable_sort(r.begin(), r.end(), [&](const Val& a, const Val& b) { return rev ? cmp(b, a) < 0 : cmp(a, b) < 0; });
      }
      ojson o = ojson::array();
      for (const Val& x : r) o.push_back(plain(x, "a list"));
      return Val::of(std::move(o));
    }
    if (f == "map") {
      ojson r = ojson::array();
      if (const Val* at = kwarg(kw, "attribute")) {
        for (const auto& [k, x] : kw)
          if (k != "attribute" && k != "default") err("map(attribute=...) with the argument '" + k + "'");
        if (!pos.empty()) err("map(attribute=...) with positional arguments");
        const std::string a = py_str(*at);
        const Val* def = kwarg(kw, "default");
        for (const Val& x : items) {
          Val y = attr_path(x, a);
          if (y.is_undef() && def) y = *def;
          // Jinja yields Undefined here; llmt's lists hold values only, so it refuses
          if (y.is_undef()) err("map(attribute='" + a + "'): an item has no '" + a + "' (" + y.name +
                                "); llmt refuses what Jinja would make Undefined: pass default=");
          r.push_back(plain(y, "map's result"));
        }
        return Val::of(std::move(r));
      }
      if (pos.empty() || !pos[0].is_str()) err("map takes a filter name or attribute=");
      const std::string fname = pos[0].str();
      auto sig = kFilters.find(fname);
      if (sig == kFilters.end() || (sig->second.size() == 1 && sig->second[0] == "*"))
        err("map with the filter '" + fname + "'");
      if (pos.size() - 1 > sig->second.size()) err("map('" + fname + "') with too many arguments");
      for (const auto& [k, x] : kw)
        if (std::find(sig->second.begin(), sig->second.end(), k) == sig->second.end())
          err("map('" + fname + "') with the argument '" + k + "'");
      std::vector<Val> rest(pos.begin() + 1, pos.end());
      for (const Val& x : items) r.push_back(plain(apply_filter(fname, x, rest, kw), "map's result"));
      return Val::of(std::move(r));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool by_attr = f == "selectattr" || f == "rejectattr", keep_if = f == "select" || f == "selectattr";
      if (!kw.empty()) err(f + " with the keyword argument '" + kw[0].first + "'");
      size_t k = 0;
      std::string a;
      if (by_attr) {
        if (pos.empty()) err(f + " takes an attribute name");
        a = py_str(pos[k++]);
      }
      std::string t;
      if (k < pos.size()) t = py_str(pos[k++]);
      if (!t.empty() && !kTests.count(t)) err(f + " with the test '" + t + "'");
      std::vector<Val> targs(pos.begin() + (long)std::min(k, pos.size()), pos.end());
      if (!t.empty() && targs.size() > (kTestsWithArg.count(t) ? 1u : 0u)) err(f + " with too many arguments for '" + t + "'");
      ojson r = ojson::array();
      for (const Val& x : items) {
        Val y = by_attr ? attr_path(x, a) : x;
        const bool pass = t.empty() ? truthy(y) : apply_test(t, y, targs);
        if (pass == keep_if) r.push_back(plain(x, "a list"));
      }
      return Val::of(std::move(r));
    }
    err("the filter '" + f + "'");
  }
  static size_t call_split_words(const std::string& s) {
    size_t n = 0;
    bool in = false;
    for (char c : s) {
      const bool w = std::isalnum((unsigned char)c) || c == '_' || (unsigned char)c >= 0x80;
      if (w && !in) n++;
      in = w;
    }
    return n;
  }
};

}  // namespace

struct ChatTemplate::Impl {
  std::string source, name;
  Body body;
  bool generation = false, strftime = false;
  std::time_t now = 0;
};

ChatTemplate::ChatTemplate(const std::string& source, const std::string& name) : impl_(new Impl) {
  impl_->source = source;
  impl_->name = name;
  Parser p(lex(source, name), name);
  impl_->body = p.parse_all();
  impl_->generation = p.saw_generation;
  impl_->strftime = p.saw_strftime;
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

ChatRender ChatTemplate::render(const ojson& vars) const {
  LLMT_CHECK(vars.is_object(), "chat template %s: the variables must be a JSON object", impl_->name.c_str());
  Renderer r(impl_->name, impl_->now);
  r.scopes.emplace_back();
  for (auto it = vars.begin(); it != vars.end(); ++it) r.scopes.back()[it.key()] = Val::of(it.value());
  r.scopes.emplace_back();  // the template's own {% set %}s shadow the variables
  try {
    r.run(impl_->body);
  } catch (const RenderLimit& e) {
    fail("chat template %s, line %d: %s", impl_->name.c_str(), r.line(), e.msg.c_str());
  } catch (const BreakSignal&) {  // the parser refuses these outside a loop
    fail("chat template %s: {%% break %%} outside a loop", impl_->name.c_str());
  } catch (const ContinueSignal&) {
    fail("chat template %s: {%% continue %%} outside a loop", impl_->name.c_str());
  }
  return std::move(r.out);
}

bool ChatTemplate::has_generation_blocks() const { return impl_->generation; }
bool ChatTemplate::uses_strftime_now() const { return impl_->strftime; }
const std::string& ChatTemplate::source() const { return impl_->source; }
void ChatTemplate::set_now(std::time_t t) { impl_->now = t; }

}  // namespace llmt
