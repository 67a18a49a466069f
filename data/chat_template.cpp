// The chat-template evaluator: a lexer that cuts the template into text and tags and applies
// Jinja's whitespace rules, a recursive-descent parser to a small tree (statements and expressions),
// and a tree walker over values that are JSON values (Python's none/bool/int/float/str/list/dict),
// undefined, a namespace or a callable. Python's semantics where templates can tell: truthiness,
// == between numbers of any type, code-point string length/slicing, str() and repr() of values,
// json.dumps for tojson.
#include "data/chat_template.h"

#include <algorithm>
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
  auto nl = [&](int d) {
    if (indent >= 0) o += "\n" + std::string((size_t)(indent * d), ' ');
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

std::string py_repr(const ojson& v);
std::string py_str(const Val& v) {
  if (v.k == Val::kUndef) return "";
  if (v.k == Val::kNs) return "<Namespace>";
  if (v.k == Val::kFunc) return "<function " + v.name + ">";
  if (v.j.is_string()) return v.str();
  return py_repr(v.j);
}
std::string py_repr(const ojson& v) {
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_float()) return py_float(v.get<double>());
  if (v.is_number()) return v.dump();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string o(1, q);
    for (char c : s) {
      if (c == q || c == '\\') o += '\\', o += c;
      else if (c == '\n') o += "\\n";
      else if (c == '\r') o += "\\r";
      else if (c == '\t') o += "\\t";
      else o += c;
    }
    return o + q;
  }
  std::string o;
  if (v.is_array()) {
    o = "[";
    for (size_t i = 0; i < v.size(); i++) o += (i ? ", " : "") + py_repr(v[i]);
    return o + "]";
  }
  o = "{";
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it, first = false)
    o += (first ? "" : ", ") + py_repr(ojson(it.key())) + ": " + py_repr(it.value());
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
  if (j.is_string() || j.is_array() || j.is_object()) return !j.empty();
  return true;
}

double num(const ojson& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); }
bool is_int(const ojson& j) { return j.is_boolean() || j.is_number_integer() || j.is_number_unsigned(); }
int64_t as_int(const ojson& j) { return j.is_boolean() ? (j.get<bool>() ? 1 : 0) : j.get<int64_t>(); }

bool json_eq(const ojson& a, const ojson& b) {
  const bool an = a.is_number() || a.is_boolean(), bn = b.is_number() || b.is_boolean();
  if (an && bn) return is_int(a) && is_int(b) ? as_int(a) == as_int(b) : num(a) == num(b);
  if (a.is_array() && b.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++)
      if (!json_eq(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object() && b.is_object()) {  // dict equality ignores order
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      auto f = b.find(it.key());
      if (f == b.end() || !json_eq(it.value(), *f)) return false;
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
  bool strip_before = false, strip_after = false, plus = false;
};

[[noreturn]] void syntax(const std::string& name, int line, const std::string& msg) {
  fail("chat template %s, line %d: %s", name.c_str(), line, msg.c_str());
}

std::vector<Tok> lex_tag(const std::string& s, size_t& p, bool var, int& line, const std::string& name, bool* strip) {
  std::vector<Tok> out;
  const std::string end = var ? "}}" : "%}";
  for (;;) {
    while (p < s.size() && std::isspace((unsigned char)s[p])) line += s[p] == '\n', p++;
    if (p >= s.size()) syntax(name, line, std::string("a tag opened with ") + (var ? "{{" : "{%") + " is never closed");
    if (s.compare(p, 3, "-" + end) == 0) {
      *strip = true;
      p += 3;
      return out;
    }
    if (s.compare(p, 2, end) == 0) {
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
      if (p + 1 < s.size() && s[p] == '.' && std::isdigit((unsigned char)s[p + 1])) {
        is_float = true;
        p++;
        while (p < s.size() && std::isdigit((unsigned char)s[p])) p++;
      }
      if (p < s.size() && (s[p] == 'e' || s[p] == 'E')) {
        is_float = true;
        p++;
        if (p < s.size() && (s[p] == '+' || s[p] == '-')) p++;
        while (p < s.size() && std::isdigit((unsigned char)s[p])) p++;
      }
      std::string lit = s.substr(b, p - b);
      lit.erase(std::remove(lit.begin(), lit.end(), '_'), lit.end());
      if (is_float) t.t = Tok::kFloat, t.f = std::strtod(lit.c_str(), nullptr);
      else t.t = Tok::kInt, t.i = std::strtoll(lit.c_str(), nullptr, 10);
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
          case '0': t.s += '\0'; break;
          case '\n': line++; break;
          case 'x': case 'u': case 'U': {
            const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (p + n > s.size()) syntax(name, t.line, "a short \\" + std::string(1, e) + " escape");
            const uint32_t cp = (uint32_t)std::strtoul(s.substr(p, n).c_str(), nullptr, 16);
            t.s += from_cps({cp}, 0, 1);
            p += n;
            break;
          }
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
      t.toks = lex_tag(s, p, kind == '{', line, name, &t.strip_after);
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
    if (before && t.strip_before) {
      std::string& d = before->data;
      size_t e = d.size();
      while (e > 0 && std::isspace((unsigned char)d[e - 1])) e--;
      d.resize(e);
    } else if (before && block && !t.plus) {  // lstrip_blocks
      std::string& d = before->data;
      const size_t nl = d.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      const bool at_start = nl != std::string::npos || line_start;
      if (at_start && d.find_first_not_of(" \t", from) == std::string::npos) d.resize(from);
    }
    line_start = false;
    Piece* after = i + 1 < out.size() && out[i + 1].t == Piece::kData ? &out[i + 1] : nullptr;
    if (after && t.strip_after) {
      std::string& d = after->data;
      size_t b = 0;
      while (b < d.size() && std::isspace((unsigned char)d[b])) b++;
      d.erase(0, b);
    } else if (after && block && !after->data.empty() && after->data[0] == '\n') {  // trim_blocks
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
  enum T { kLit, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNot, kNeg, kBin, kCond, kList, kDict } t;
  explicit Expr(T type) : t(type) {}
  ojson lit;
  std::string s;              // name, attribute, operator, filter or test name
  std::vector<ExprP> a;       // operands / arguments (null entries: omitted slice bounds)
  std::vector<std::string> kw;  // kCall/kFilter/kTest: names of the keyword arguments, aligned at the end of a
  bool negate = false;        // kTest: `is not`
  int line = 0;
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

const std::set<std::string> kFilters = {
    "trim", "length", "count", "tojson", "upper", "lower", "capitalize", "title", "default", "d", "join", "first",
    "last", "list", "string", "int", "float", "abs", "replace", "reject", "select", "rejectattr", "selectattr", "map",
    "items", "reverse", "safe", "unique", "sort", "dictsort", "wordcount", "min", "max", "sum", "round", "indent"};
const std::set<std::string> kTests = {"defined", "undefined", "none", "string", "number", "integer", "float", "mapping",
                                      "iterable", "sequence", "boolean", "true", "false", "equalto", "eq", "==", "ne",
                                      "!=", "even", "odd", "divisibleby", "in", "lower", "upper", "sameas",
                                      "callable", "gt", "ge", "lt", "le", ">", ">=", "<", "<="};
const std::set<std::string> kMethods = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper",
                                        "lower", "title", "capitalize", "replace", "items", "keys", "values", "get",
                                        "find", "count", "join", "splitlines", "index", "rsplit", "isdigit", "isalpha",
                                        "isspace", "format"};
const std::set<std::string> kGlobals = {"raise_exception", "strftime_now", "namespace", "range", "dict"};

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
    return ", found '" + (t.t == Tok::kInt ? std::to_string(t.i) : t.s) + "'";
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
        n.body = parse_body({"else", "endfor"}, &e);
        if (e.empty()) err("{% for %} opened at line " + std::to_string(n.line) + " is never closed");
        expect_end();
        if (e == "else") {
          n.else_body = parse_body({"endfor"}, &e);
          if (e.empty()) err("{% for %} opened at line " + std::to_string(n.line) + " is never closed");
          expect_end();
        }
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
        n.body = parse_body({"endgeneration"}, &e);
        if (e.empty()) err("{% generation %} opened at line " + std::to_string(n.line) + " is never closed");
        expect_end();
      } else if (kw == "break" || kw == "continue") {
        n.t = kw == "break" ? Node::kBreak : Node::kContinue;
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
      return n;
    }
    return e;
  }
  ExprP bin(const std::string& op, ExprP l, ExprP r) {
    ExprP n = mk(Expr::kBin);
    n->s = op;
    n->a.push_back(std::move(l));
    n->a.push_back(std::move(r));
    return n;
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
    if (at_name("not")) {
      k_++;
      ExprP n = mk(Expr::kNot);
      n->a.push_back(not_expr());
      return n;
    }
    return compare();
  }
  ExprP compare() {
    ExprP l = math1();
    for (;;) {
      if (peek().t == Tok::kOp && (peek().s == "==" || peek().s == "!=" || peek().s == "<" || peek().s == "<=" ||
                                   peek().s == ">" || peek().s == ">=")) {
        std::string op = (*toks_)[k_++].s;
        l = bin(op, std::move(l), math1());
      } else if (at_name("in")) {
        k_++;
        l = bin("in", std::move(l), math1());
      } else if (at_name("not") && at_name("in", 1)) {
        k_ += 2;
        l = bin("not in", std::move(l), math1());
      } else {
        return l;
      }
    }
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
      k_++;
      e = mk(Expr::kNeg);
      e->a.push_back(unary(false));
    } else if (at_op("+")) {
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
    return e;
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
        ExprP n = mk(Expr::kAttr);
        if (peek().t == Tok::kInt) n->s = std::to_string(peek().i), k_++;
        else n->s = expect_name();
        n->a.push_back(std::move(e));
        e = std::move(n);
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
        e = std::move(n);
      } else if (at_op("(")) {
        if (e->t == Expr::kName && !kGlobals.count(e->s)) unsupported("a call of '" + e->s + "' (macros and "
                                                                      "functions other than " "raise_exception, "
                                                                      "strftime_now, namespace, range and dict)");
        if (e->t == Expr::kAttr && !kMethods.count(e->s)) unsupported("the method ." + e->s + "()");
        if (e->t != Expr::kName && e->t != Expr::kAttr) unsupported("a call of a computed value");
        ExprP n = mk(Expr::kCall);
        n->a.push_back(std::move(e));
        call_args(n.get());
        e = std::move(n);
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
        e = postfix(std::move(n));
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
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
};

// ---- evaluation ----

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

 private:
  const std::string& name_;
  std::time_t now_;
  int line_ = 0;

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

  void exec(const Node& n) {
    line_ = n.line ? n.line : line_;
    switch (n.t) {
      case Node::kText: out.text += n.text; break;
      case Node::kOut: out.text += py_str(eval(*n.e)); break;
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
        std::string saved;
        saved.swap(out.text);
        const size_t gens = out.generation.size();
        run(n.body);
        std::string captured;
        captured.swap(out.text);
        out.text.swap(saved);
        out.generation.resize(gens);
        assign(n.targets[0], Val::of(captured));
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
    std::vector<Val> items = iterate(eval(*n.e));
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

  static std::vector<int64_t> slice_indices(int64_t n, const Val* lo, const Val* hi, const Val* st) {
    auto get = [](const Val* v, bool* has) -> int64_t {
      *has = v && v->k == Val::kJson && !v->j.is_null();
      return *has ? as_int(v->j) : 0;
    };
    bool hl, hh, hs;
    int64_t a = get(lo, &hl), b = get(hi, &hh), s = get(st, &hs);
    if (!hs) s = 1;
    if (s == 0) fail("slice step cannot be zero");
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
      case Expr::kAttr: return attr(eval(*e.a[0]), e.s);
      case Expr::kItem: return item(eval(*e.a[0]), eval(*e.a[1]));
      case Expr::kSlice: {
        Val o = eval(*e.a[0]);
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
        for (const auto& x : e.a) r.push_back(plain(eval(*x), "a list"));
        return Val::of(std::move(r));
      }
      case Expr::kDict: {
        ojson r = ojson::object();
        for (size_t i = 0; i + 1 < e.a.size(); i += 2) {
          Val k = eval(*e.a[i]);
          if (!k.is_str()) err("llmt's dicts take string keys");
          r[k.str()] = plain(eval(*e.a[i + 1]), "a dict");
        }
        return Val::of(std::move(r));
      }
      case Expr::kNot: return Val::of(!truthy(eval(*e.a[0])));
      case Expr::kNeg: {
        Val v = eval(*e.a[0]);
        if (!v.is_num()) err(std::string("bad operand type for unary -: '") + type_name(v) + "'");
        return is_int(v.j) ? Val::of(-as_int(v.j)) : Val::of(-num(v.j));
      }
      case Expr::kCond: {
        if (truthy(eval(*e.a[0]))) return eval(*e.a[1]);
        return e.a[2] ? eval(*e.a[2]) : Val::undef("the else of an inline if");
      }
      case Expr::kBin: return binary(e);
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
    if (op == "~") return Val::of(py_str(l) + py_str(r));
    if (op == "==") return Val::of(val_eq(l, r));
    if (op == "!=") return Val::of(!val_eq(l, r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.k == Val::kUndef) found = false;
      else if (r.k == Val::kNs) found = l.is_str() && r.ns->contains(l.str());
      else if (r.j.is_string()) {
        if (!l.is_str()) err(std::string("'in <string>' requires string as left operand, not ") + type_name(l));
        found = r.str().find(l.str()) != std::string::npos;
      } else if (r.j.is_object()) {
        found = l.is_str() && r.j.contains(l.str());
      } else if (r.j.is_array()) {
        for (const auto& x : r.j)
          if (l.k == Val::kJson && json_eq(l.j, x)) found = true;
      } else {
        err(std::string("argument of type '") + type_name(r) + "' is not iterable");
      }
      return Val::of(op == "in" ? found : !found);
    }
    if (l.is_undef() || r.is_undef())
      err("an undefined value in '" + op + "' (" + (l.is_undef() ? l.name : r.name) + ")");
    if (op == "<" || op == "<=" || op == ">" || op == ">=") {
      int c;
      if (l.is_num() && r.is_num()) c = num(l.j) < num(r.j) ? -1 : num(l.j) > num(r.j) ? 1 : 0;
      else if (l.is_str() && r.is_str()) c = to_cps(l.str()) < to_cps(r.str()) ? -1 : l.str() == r.str() ? 0 : 1;
      else err(std::string("'") + op + "' not supported between '" + type_name(l) + "' and '" + type_name(r) + "'");
      return Val::of(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
    }
    if (op == "+") {
      if (l.is_str() && r.is_str()) return Val::of(l.str() + r.str());
      if (l.k == Val::kJson && r.k == Val::kJson && l.j.is_array() && r.j.is_array()) {
        ojson a = l.j;
        for (const auto& x : r.j) a.push_back(x);
        return Val::of(std::move(a));
      }
    }
    if (op == "*" && ((l.is_str() && r.is_num() && is_int(r.j)) || (r.is_str() && l.is_num() && is_int(l.j)))) {
      const std::string& s = l.is_str() ? l.str() : r.str();
      std::string o;
      for (int64_t i = 0, n = as_int(l.is_str() ? r.j : l.j); i < n; i++) o += s;
      return Val::of(o);
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
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;  // Python floors
        return Val::of(op == "//" ? q : m);
      }
      const double q = std::floor(a / b);
      return Val::of(op == "//" ? q : a - q * b);
    }
    if (op == "**") return ints && as_int(r.j) >= 0 ? Val::of((int64_t)std::llround(std::pow(a, b))) : Val::of(std::pow(a, b));
    if (ints) {
      const int64_t x = as_int(l.j), y = as_int(r.j);
      return Val::of(op == "+" ? x + y : op == "-" ? x - y : x * y);
    }
    return Val::of(op == "+" ? a + b : op == "-" ? a - b : a * b);
  }

  // the positional and keyword arguments of a call, filter or test (skipping `skip` leading operands)
  void args(const Expr& e, size_t skip, std::vector<Val>* pos, std::map<std::string, Val>* kw) {
    const size_t nkw = e.kw.size(), n = e.a.size();
    for (size_t i = skip; i < n - nkw; i++) pos->push_back(eval(*e.a[i]));
    for (size_t i = 0; i < nkw; i++) (*kw)[e.kw[i]] = eval(*e.a[n - nkw + i]);
  }
  const Val* arg(const std::vector<Val>& pos, const std::map<std::string, Val>& kw, size_t i, const char* name) {
    if (i < pos.size()) return &pos[i];
    auto f = kw.find(name);
    return f == kw.end() ? nullptr : &f->second;
  }
  std::string str_arg(const Val* v, const std::string& what) {
    if (!v || !v->is_str()) err(what + " must be a string");
    return v->str();
  }

  Val call(const Expr& e) {
    const Expr& callee = *e.a[0];
    std::vector<Val> pos;
    std::map<std::string, Val> kw;
    if (callee.t == Expr::kName) {
      Val f = lookup(callee.s);
      args(e, 1, &pos, &kw);
      line_ = e.line;
      if (f.k != Val::kFunc) err("'" + callee.s + "' is a " + type_name(f) + ", not a function");
      const std::string& n = f.name;
      if (n == "raise_exception") {
        fail("chat template %s, line %d: the template raised an error: %s", name_.c_str(), line_,
             pos.empty() ? "" : py_str(pos[0]).c_str());
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
        for (auto& [k, v] : kw) o[k] = plain(v, "a namespace");
        if (n == "dict") return Val::of(std::move(o));
        Val r;
        r.k = Val::kNs;
        r.ns = std::make_shared<ojson>(std::move(o));
        return r;
      }
      if (n == "range") {
        std::vector<int64_t> v;
        for (const Val& p : pos) {
          if (!p.is_num() || !is_int(p.j)) err("range() takes integers");
          v.push_back(as_int(p.j));
        }
        if (v.empty() || v.size() > 3) err("range() takes 1 to 3 integers");
        int64_t a = v.size() == 1 ? 0 : v[0], b = v.size() == 1 ? v[0] : v[1], s = v.size() == 3 ? v[2] : 1;
        if (s == 0) err("range() step must not be zero");
        if ((b - a) / s > 100000) err("range() of more than 100000 numbers");
        ojson r = ojson::array();
        for (int64_t i = a; s > 0 ? i < b : i > b; i += s) r.push_back(i);
        return Val::of(std::move(r));
      }
      err("unknown function " + n);
    }
    // a method: callee is kAttr
    Val self = eval(*callee.a[0]);
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
    if (m == "startswith" || m == "endswith") {
      const Val* p = arg(pos, kw, 0, "prefix");
      std::vector<std::string> opts;
      if (p && p->is_str()) opts.push_back(p->str());
      else if (p && p->k == Val::kJson && p->j.is_array())
        for (const auto& x : p->j)
          if (x.is_string()) opts.push_back(x.get<std::string>());
      if (opts.empty()) err(m + "() takes a string or a tuple of strings");
      for (const std::string& o : opts)
        if (o.size() <= s.size() && (m == "startswith" ? s.compare(0, o.size(), o) == 0
                                                       : s.compare(s.size() - o.size(), o.size(), o) == 0))
          return Val::of(true);
      return Val::of(false);
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
          if (maxsplit >= 0 && splits == maxsplit) {
            size_t e2 = cps.size();
            while (e2 > i && py_space(cps[e2 - 1])) e2--;
            r.push_back(from_cps(cps, i, e2));
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
    if (m == "find" || m == "index" || m == "count") {
      std::string sub = str_arg(arg(pos, kw, 0, "sub"), m + "()'s argument");
      if (m == "count") {
        if (sub.empty()) return Val::of((int64_t)to_cps(s).size() + 1);
        int64_t c = 0;
        for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) c++;
        return Val::of(c);
      }
      size_t f = s.find(sub);
      if (f == std::string::npos) {
        if (m == "index") err("substring not found");
        return Val::of((int64_t)-1);
      }
      return Val::of((int64_t)to_cps(s.substr(0, f)).size());
    }
    if (m == "join") {
      const Val* it = arg(pos, kw, 0, "iterable");
      if (!it) err("join() takes an iterable");
      std::string o;
      bool first = true;
      for (const Val& x : iterate(*it)) {
        if (!x.is_str()) err("join() takes strings");
        o += (first ? "" : s) + x.str();
        first = false;
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

  static std::string replace_all(const std::string& s, const std::string& a, const std::string& b, int64_t count) {
    if (a.empty()) return s;  // Python inserts b between characters; no template does this
    std::string o;
    size_t p = 0;
    for (int64_t n = 0; count < 0 || n < count; n++) {
      size_t f = s.find(a, p);
      if (f == std::string::npos) break;
      o += s.substr(p, f - p) + b;
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
      const int64_t r = ((as_int(j) % d) + d) % d;
      return t == "odd" ? r == 1 : r == 0;
    }
    if (targs.empty()) err("the test '" + t + "' takes an argument");
    const Val& o = targs[0];
    if (t == "equalto" || t == "eq" || t == "==") return val_eq(v, o);
    if (t == "ne" || t == "!=") return !val_eq(v, o);
    if (t == "sameas") return val_eq(v, o) && (!js || j.type() == o.j.type());
    if (t == "in") {
      if (o.k != Val::kJson) return false;
      if (o.j.is_string()) return v.is_str() && o.str().find(v.str()) != std::string::npos;
      if (o.j.is_object()) return v.is_str() && o.j.contains(v.str());
      for (const auto& x : o.j)
        if (js && json_eq(j, x)) return true;
      return false;
    }
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
    Val v = eval(*e.a[0]);
    std::vector<Val> pos;
    std::map<std::string, Val> kw;
    args(e, 1, &pos, &kw);
    line_ = e.line;
    return apply_test(e.s, v, pos);
  }

  Val filter(const Expr& e) {
    Val v = eval(*e.a[0]);
    std::vector<Val> pos;
    std::map<std::string, Val> kw;
    args(e, 1, &pos, &kw);
    line_ = e.line;
    return apply_filter(e.s, v, pos, kw);
  }

  Val apply_filter(const std::string& f, const Val& v, const std::vector<Val>& pos, std::map<std::string, Val> kw) {
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
      return Val::of(py_strip(py_str(v), c && c->is_str() ? &chars : nullptr, true, true));
    }
    if (f == "upper" || f == "lower") {
      std::string r = py_str(v);
      for (char& c : r) c = (char)(f == "upper" ? std::toupper((unsigned char)c) : std::tolower((unsigned char)c));
      return Val::of(r);
    }
    if (f == "capitalize" || f == "title") return Val::of(case_words(py_str(v), f == "title"));
    if (f == "replace") {
      std::string a = str_arg(arg(pos, kw, 0, "old"), "replace's old"), b = str_arg(arg(pos, kw, 1, "new"), "replace's new");
      const Val* c = arg(pos, kw, 2, "count");
      return Val::of(replace_all(py_str(v), a, b, c && c->is_num() ? as_int(c->j) : -1));
    }
    if (f == "tojson") {
      const Val* ind = arg(pos, kw, 0, "indent");
      const Val* sk = kw.count("sort_keys") ? &kw["sort_keys"] : nullptr;
      const Val* ea = kw.count("ensure_ascii") ? &kw["ensure_ascii"] : nullptr;
      const Val* sep = kw.count("separators") ? &kw["separators"] : nullptr;
      const int indent = ind && ind->is_num() ? (int)as_int(ind->j) : -1;
      std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
      if (sep && sep->k == Val::kJson && sep->j.is_array() && sep->j.size() == 2 && sep->j[0].is_string() &&
          sep->j[1].is_string())
        item_sep = sep->j[0].get<std::string>(), key_sep = sep->j[1].get<std::string>();
      std::string o;
      dumps(plain(v, "tojson"), indent, item_sep, key_sep, sk && truthy(*sk), ea && truthy(*ea), 0, o);
      return Val::of(o);
    }
    if (f == "int") {
      if (v.is_num()) return Val::of(is_int(v.j) ? as_int(v.j) : (int64_t)num(v.j));
      if (v.is_str()) {
        char* end = nullptr;
        std::string s = py_strip(v.str(), nullptr, true, true);
        long long x = std::strtoll(s.c_str(), &end, 10);
        if (end && *end == 0 && !s.empty()) return Val::of((int64_t)x);
      }
      return arg(pos, kw, 0, "default") ? *arg(pos, kw, 0, "default") : Val::of((int64_t)0);
    }
    if (f == "float") {
      if (v.is_num()) return Val::of(num(v.j));
      if (v.is_str()) {
        char* end = nullptr;
        std::string s = py_strip(v.str(), nullptr, true, true);
        double x = std::strtod(s.c_str(), &end);
        if (end && *end == 0 && !s.empty()) return Val::of(x);
      }
      return Val::of(0.0);
    }
    if (f == "abs") {
      if (!v.is_num()) err("abs of a " + std::string(type_name(v)));
      return is_int(v.j) ? Val::of(std::llabs(as_int(v.j))) : Val::of(std::fabs(num(v.j)));
    }
    if (f == "round") {
      if (!v.is_num()) err("round of a " + std::string(type_name(v)));
      const Val* p = arg(pos, kw, 0, "precision");
      const double m = std::pow(10.0, p && p->is_num() ? (double)as_int(p->j) : 0.0);
      return Val::of(std::nearbyint(num(v.j) * m) / m);
    }
    if (f == "items") {
      if (v.is_undef()) return Val::of(ojson::array());
      if (v.k != Val::kJson || !v.j.is_object()) err("items of a " + std::string(type_name(v)) + ", not a dict");
      ojson r = ojson::array();
      for (auto it = v.j.begin(); it != v.j.end(); ++it) r.push_back(ojson::array({it.key(), it.value()}));
      return Val::of(std::move(r));
    }
    if (f == "dictsort") {
      if (v.k != Val::kJson || !v.j.is_object()) err("dictsort of a " + std::string(type_name(v)));
      std::vector<std::string> keys;
      for (auto it = v.j.begin(); it != v.j.end(); ++it) keys.push_back(it.key());
      std::sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
        std::string x = a, y = b;
        for (char& c : x) c = (char)std::tolower((unsigned char)c);
        for (char& c : y) c = (char)std::tolower((unsigned char)c);
        return x < y;
      });
      ojson r = ojson::array();
      for (const auto& k : keys) r.push_back(ojson::array({k, v.j.at(k)}));
      return Val::of(std::move(r));
    }
    if (f == "indent") {
      const Val* w = arg(pos, kw, 0, "width");
      const Val* first = arg(pos, kw, 1, "first");
      const Val* blank = arg(pos, kw, 2, "blank");
      std::string pad = w && w->is_str() ? w->str() : std::string(w && w->is_num() ? (size_t)as_int(w->j) : 4, ' ');
      std::string s = py_str(v), o;
      std::vector<std::string> lines;
      size_t b = 0;
      for (size_t i = 0; i <= s.size(); i++)
        if (i == s.size() || s[i] == '\n') lines.push_back(s.substr(b, i - b)), b = i + 1;
      for (size_t i = 0; i < lines.size(); i++) {
        if (i) o += "\n";
        const bool indent_it = (i > 0 || (first && truthy(*first))) && (!lines[i].empty() || (blank && truthy(*blank)));
        o += (indent_it ? pad : "") + lines[i];
      }
      return Val::of(o);
    }
    if (f == "wordcount") {
      std::vector<Val> none;
      return Val::of((int64_t)call_split_words(py_str(v)));
    }
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
      std::string s = sep ? py_str(*sep) : "", o;
      for (size_t i = 0; i < items.size(); i++) o += (i ? s : "") + py_str(at ? attr(items[i], py_str(*at)) : items[i]);
      return Val::of(o);
    }
    if (f == "unique" || f == "sort" || f == "min" || f == "max" || f == "sum") {
      const Val* at = kw.count("attribute") ? &kw["attribute"] : nullptr;
      auto key = [&](const Val& x) { return at ? attr(x, py_str(*at)) : x; };
      if (f == "sum") {
        Val acc = Val::of((int64_t)0);
        for (const Val& x : items) {
          Val k = key(x);
          if (!k.is_num()) err("sum of a " + std::string(type_name(k)));
          acc = is_int(acc.j) && is_int(k.j) ? Val::of(as_int(acc.j) + as_int(k.j)) : Val::of(num(acc.j) + num(k.j));
        }
        return acc;
      }
      auto less = [&](const Val& a, const Val& b) {
        Val x = key(a), y = key(b);
        if (x.is_num() && y.is_num()) return num(x.j) < num(y.j);
        if (x.is_str() && y.is_str()) return x.str() < y.str();
        err("sorting values of types " + std::string(type_name(x)) + " and " + type_name(y));
      };
      if (f == "min" || f == "max") {
        if (items.empty()) return Val::undef("min/max of an empty sequence");
        return f == "min" ? *std::min_element(items.begin(), items.end(), less)
                          : *std::max_element(items.begin(), items.end(), less);
      }
      std::vector<Val> r;
      if (f == "unique") {
        for (const Val& x : items) {
          bool seen = false;
          for (const Val& y : r) seen = seen || val_eq(key(x), key(y));
          if (!seen) r.push_back(x);
        }
      } else {
        r = items;
        std::stable_sort(r.begin(), r.end(), less);
        const Val* rev = arg(pos, kw, 0, "reverse");
        if (rev && truthy(*rev)) std::reverse(r.begin(), r.end());
      }
      ojson o = ojson::array();
      for (const Val& x : r) o.push_back(plain(x, "a list"));
      return Val::of(std::move(o));
    }
    if (f == "map") {
      ojson r = ojson::array();
      if (kw.count("attribute")) {
        const std::string a = py_str(kw["attribute"]);
        for (const Val& x : items) {
          Val y = attr(x, a);
          if (y.is_undef() && kw.count("default")) y = kw["default"];
          r.push_back(plain(y, "map's result"));
        }
        return Val::of(std::move(r));
      }
      if (pos.empty() || !pos[0].is_str()) err("map takes a filter name or attribute=");
      const std::string fname = pos[0].str();
      if (!kFilters.count(fname) || fname == "map") err("map with the filter '" + fname + "'");
      std::vector<Val> rest(pos.begin() + 1, pos.end());
      for (const Val& x : items) r.push_back(plain(apply_filter(fname, x, rest, kw), "map's result"));
      return Val::of(std::move(r));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool by_attr = f == "selectattr" || f == "rejectattr", keep_if = f == "select" || f == "selectattr";
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
      ojson r = ojson::array();
      for (const Val& x : items) {
        Val y = by_attr ? attr(x, a) : x;
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
  } catch (const BreakSignal&) {
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
