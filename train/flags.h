// Command-line flags in the Hugging Face TrainingArguments style: `--name value`, `--name=value`,
// and booleans as `--name`, `--name True` or `--name False`. Every flag given must be read by the
// subcommand: finish() reports the first one nobody asked for, so an unsupported flag is an
// error that names it, never silently ignored.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace llmt {

class Flags {
 public:
  // argv after the subcommand name. `command` names the subcommand in messages.
  Flags(const std::string& command, const std::vector<std::string>& args);
  // A config file's flags (train/run_file.h: `--name=value` each, from `file`), then the command
  // line's, which override them: messages name the file where a value came from it.
  Flags(const std::string& command, const std::vector<std::string>& file_args, const std::string& file,
        const std::vector<std::string>& args);

  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get_string(const std::string& name, const std::string& fallback);
  int get_int(const std::string& name, int fallback);
  long long get_int64(const std::string& name, long long fallback);
  double get_double(const std::string& name, double fallback);
  bool get_bool(const std::string& name, bool fallback);
  // Every value of a flag that may be repeated (--sweep), in order; the getters above take the last.
  std::vector<std::string> get_all(const std::string& name);
  // Marks a flag as read without looking at its value (flags accepted and ignored).
  void ignore(const std::string& name) { take(name); }
  // Throws naming the first flag that was given but never read.
  void finish() const;

 private:
  void add(const std::vector<std::string>& args, const std::string& origin);
  const std::string* take(const std::string& name);
  std::string where(const std::string& name) const;  // " (in run.yaml)" for a value from the file, else ""
  std::string command_;
  std::map<std::string, std::vector<std::string>> values_;
  std::map<std::string, std::vector<std::string>> origins_;  // each value's file, "" for the command line
  std::vector<std::string> order_;  // as given, for messages
  std::map<std::string, bool> used_;
};

}  // namespace llmt
