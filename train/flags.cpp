#include "train/flags.h"

#include <cerrno>
#include <cstdlib>

#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/launch.h"

namespace llmt {

static const char* kBareTrue = "\x01true";  // a boolean flag given without a value

Flags::Flags(const std::string& command, const std::vector<std::string>& args) : command_(command) {
  add(args, "");
}

Flags::Flags(const std::string& command, const std::vector<std::string>& file_args, const std::string& file,
             const std::vector<std::string>& args)
    : command_(command) {
  add(file_args, file);
  add(args, "");
}

void Flags::add(const std::vector<std::string>& args, const std::string& origin) {
  const std::string& command = command_;
  for (size_t i = 0; i < args.size(); i++) {
    const std::string& a = args[i];
    LLMT_CHECK(a.size() > 2 && a.compare(0, 2, "--") == 0, "llmt %s: unexpected argument \"%s\" (flags start with --%s)",
               command.c_str(), a.c_str(), i == 0 ? "; a config file, run.json or run.yaml, comes first" : "");
    std::string name = a.substr(2), value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < args.size() && args[i + 1].compare(0, 2, "--") != 0) {
      value = args[++i];
    } else {
      value = kBareTrue;
    }
    for (char& c : name)
      if (c == '-') c = '_';  // --max-steps and --max_steps are one flag, as in HfArgumentParser
    if (!values_.count(name)) order_.push_back(name);
    values_[name].push_back(value);
    origins_[name].push_back(origin);
  }
}

std::string Flags::where(const std::string& name) const {
  auto it = origins_.find(name);
  return it == origins_.end() || it->second.back().empty() ? "" : " (in " + it->second.back() + ")";
}

// A flag given again wins, as in argparse (HfArgumentParser): wrapper scripts append overrides.
const std::string* Flags::take(const std::string& name) {
  auto it = values_.find(name);
  if (it == values_.end()) return nullptr;
  const std::vector<std::string>& v = it->second;
  if (v.size() > 1 && !used_.count(name) && launcher_rank_from_env() <= 0) {
    auto shown = [](const std::string& x) { return x == kBareTrue ? std::string("True") : "\"" + x + "\""; };
    const std::vector<std::string>& from = origins_.at(name);
    if (!from[from.size() - 2].empty() && from.back().empty())
      log_info("flags  --%s %s on the command line overrides %s's %s", name.c_str(), shown(v.back()).c_str(),
               from[from.size() - 2].c_str(), shown(v[v.size() - 2]).c_str());
    else
      log_info("flags  --%s is given more than once%s: the last value, %s, wins (was %s)", name.c_str(),
               where(name).c_str(), shown(v.back()).c_str(), shown(v[v.size() - 2]).c_str());
  }
  used_[name] = true;
  return &v.back();
}

std::vector<std::string> Flags::get_all(const std::string& name) {
  auto it = values_.find(name);
  if (it == values_.end()) return {};
  used_[name] = true;
  for (const std::string& v : it->second)
    LLMT_CHECK(v != kBareTrue, "llmt %s: flag --%s needs a value%s", command_.c_str(), name.c_str(),
               where(name).c_str());
  return it->second;
}

std::string Flags::get_string(const std::string& name, const std::string& fallback) {
  const std::string* v = take(name);
  if (!v) return fallback;
  LLMT_CHECK(*v != kBareTrue, "llmt %s: flag --%s needs a value%s", command_.c_str(), name.c_str(),
             where(name).c_str());
  return *v;
}

long long Flags::get_int64(const std::string& name, long long fallback) {
  const std::string* v = take(name);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v->c_str(), &end, 10);
  LLMT_CHECK(*v != kBareTrue && !v->empty() && *end == 0 && errno == 0,
             "llmt %s: flag --%s expects an integer, got \"%s\"%s", command_.c_str(), name.c_str(),
             *v == kBareTrue ? "" : v->c_str(), where(name).c_str());
  return x;
}

int Flags::get_int(const std::string& name, int fallback) {
  long long x = get_int64(name, fallback);
  LLMT_CHECK(x >= -2147483647LL && x <= 2147483647LL, "llmt %s: flag --%s is out of range%s", command_.c_str(),
             name.c_str(), where(name).c_str());
  return (int)x;
}

double Flags::get_double(const std::string& name, double fallback) {
  const std::string* v = take(name);
  if (!v) return fallback;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  LLMT_CHECK(*v != kBareTrue && !v->empty() && *end == 0, "llmt %s: flag --%s expects a number, got \"%s\"%s",
             command_.c_str(), name.c_str(), *v == kBareTrue ? "" : v->c_str(), where(name).c_str());
  return x;
}

bool Flags::get_bool(const std::string& name, bool fallback) {
  const std::string* v = take(name);
  if (!v) return fallback;
  if (*v == kBareTrue) return true;
  // HfArgumentParser's string_to_bool
  std::string s;
  for (char c : *v) s += (char)std::tolower((unsigned char)c);
  if (s == "true" || s == "yes" || s == "t" || s == "y" || s == "1") return true;
  if (s == "false" || s == "no" || s == "f" || s == "n" || s == "0") return false;
  // YAML 1.1 (PyYAML, which HfArgumentParser.parse_yaml_file uses) also reads on and off as booleans
  const std::string& from = origins_.at(name).back();
  const bool yaml = from.size() > 5 && (from.compare(from.size() - 5, 5, ".yaml") == 0 ||
                                        from.compare(from.size() - 4, 4, ".yml") == 0);
  if (yaml && (s == "on" || s == "off")) return s == "on";
  fail("llmt %s: flag --%s expects True or False, got \"%s\"%s", command_.c_str(), name.c_str(), v->c_str(),
       where(name).c_str());
}

void Flags::finish() const {
  for (const std::string& name : order_)
    LLMT_CHECK(used_.count(name), "llmt %s: unknown or unsupported flag --%s%s (see llmt %s --help)", command_.c_str(),
               name.c_str(), where(name).c_str(), command_.c_str());
}

}  // namespace llmt
