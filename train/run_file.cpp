#include "train/run_file.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "data/tokenizer.h"  // read_file
#include "engine/core/error.h"
#include "engine/core/json_text.h"

namespace llmt {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool is_yaml(const std::string& path) { return ends_with(path, ".yaml") || ends_with(path, ".yml"); }

// A YAML plain scalar as the JSON value PyYAML would give it (quoted scalars stay strings): for
// mappings inside a value, whose JSON the flag parses (lr_scheduler_kwargs' numbers).
nlohmann::json yaml_scalar(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  char* end = nullptr;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (*end == 0) return i;
  const double d = std::strtod(s.c_str(), &end);
  if (*end == 0) return d;
  return s;
}

nlohmann::json yaml_to_json(const YAML::Node& n, const std::string& path) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return yaml_scalar(n);
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const YAML::Node& e : n) a.push_back(yaml_to_json(e, path));
      return a;
    }
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) {
        LLMT_CHECK(kv.first.IsScalar(), "%s line %d: a key must be a plain name", path.c_str(), kv.first.Mark().line + 1);
        o[kv.first.Scalar()] = yaml_to_json(kv.second, path);
      }
      return o;
    }
  }
  return nullptr;
}

// A top-level value as the flag's text; false when it leaves the flag unset (null).
bool flag_text(const nlohmann::json& v, std::string* out) {
  if (v.is_null()) return false;
  if (v.is_string()) *out = v.get<std::string>();
  else if (v.is_boolean()) *out = v.get<bool>() ? "True" : "False";
  else if (v.is_number()) *out = v.dump();
  else if (v.is_array()) {
    bool plain = true;
    for (const auto& e : v) plain = plain && !e.is_structured() && !e.is_null();
    if (!plain) {
      *out = v.dump();
      return true;
    }
    out->clear();
    for (const auto& e : v) {
      std::string t;
      flag_text(e, &t);
      *out += (out->empty() ? "" : " ") + t;
    }
  } else {
    *out = v.dump();
  }
  return true;
}

}  // namespace

bool is_run_file(const std::string& arg) {
  return arg.compare(0, 2, "--") != 0 && (ends_with(arg, ".json") || is_yaml(arg));
}

std::vector<std::string> run_file_args(const std::string& path) {
  const std::string text = read_file(path, "config file");
  // The file, as (key, value) pairs in its order: JSON objects keep theirs with ordered_json.
  std::vector<std::pair<std::string, nlohmann::json>> items;
  if (is_yaml(path)) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      fail("%s line %d, column %d: not YAML: %s", path.c_str(), e.mark.line + 1, e.mark.column + 1, e.msg.c_str());
    }
    LLMT_CHECK(root.IsMap(), "%s: expected a mapping of flag names to values (learning_rate: 5e-5), got %s",
               path.c_str(), root.IsSequence() ? "a list" : root.IsScalar() ? "one value" : "nothing");
    for (const auto& kv : root) {
      LLMT_CHECK(kv.first.IsScalar(), "%s line %d: a key must be a flag name", path.c_str(), kv.first.Mark().line + 1);
      const YAML::Node& v = kv.second;  // a top-level plain value goes to its flag as written
      nlohmann::json value = v.IsScalar() && v.Tag() != "!"
                                 ? (yaml_scalar(v).is_null() ? nlohmann::json() : nlohmann::json(v.Scalar()))
                                 : yaml_to_json(v, path);
      items.push_back({kv.first.Scalar(), value});
    }
  } else {
    check_json_depth(text, path);
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, false);
    LLMT_CHECK(!j.is_discarded(), "%s: not valid JSON", path.c_str());
    LLMT_CHECK(j.is_object(), "%s: expected one JSON object of flag names to values ({\"learning_rate\": 5e-5}), got %s",
               path.c_str(), j.type_name());
    for (auto& [k, v] : j.items()) items.push_back({k, nlohmann::json::parse(v.dump())});
  }
  std::vector<std::string> args;
  for (const auto& [key, value] : items) {
    LLMT_CHECK(!key.empty() && key.compare(0, 1, "-") != 0 && key.find('=') == std::string::npos &&
                   key.find(' ') == std::string::npos,
               "%s: key \"%s\" is not a flag name (write learning_rate, not --learning_rate)", path.c_str(), key.c_str());
    std::string t;
    if (flag_text(value, &t)) args.push_back("--" + key + "=" + t);
  }
  return args;
}

std::string take_run_file(std::vector<std::string>& args) {
  std::string file;
  if (!args.empty() && is_run_file(args[0])) {
    file = args[0];
    args.erase(args.begin());
  }
  for (size_t i = 0; i < args.size(); i++) {
    if (args[i] != "--config" && args[i].compare(0, 9, "--config=") != 0) continue;
    LLMT_CHECK(file.empty(), "give one config file: %s and --config", file.c_str());
    const bool joined = args[i].size() > 8;
    LLMT_CHECK(joined || i + 1 < args.size(), "--config needs a file (run.json or run.yaml)");
    file = joined ? args[i].substr(9) : args[i + 1];
    args.erase(args.begin() + (long)i, args.begin() + (long)i + (joined ? 1 : 2));
    i--;
  }
  return file;
}

}  // namespace llmt
