// One config file for a run, as the transformers example scripts and TRL read theirs:
// `llmt train run.json [--flag value ...]` or `llmt train run.yaml ...` (also TRL's `--config FILE`).
// The file is one mapping whose keys are the flags' names (HfArgumentParser's field names: no
// leading dashes; '-' and '_' are one), read as if given first on the command line, so the command
// line's flags override it. Values: a string, number or boolean as the flag's text; null leaves the
// flag unset (HfArgumentParser's None); a list of plain values joined by spaces (`fsdp: [full_shard,
// auto_wrap]`, `report_to: [tensorboard]`); a mapping, or a list holding one, as its JSON text
// (`lr_scheduler_kwargs`, `deepspeed` given inline).
#pragma once
#include <string>
#include <vector>

namespace llmt {

// Whether `arg` names a config file (it does not start with "--" and ends in .json, .yaml or .yml).
bool is_run_file(const std::string& arg);

// The file's keys as `--name=value` flags, in the file's order. Errors name the file and the key, or
// the line and column where it does not parse.
std::vector<std::string> run_file_args(const std::string& path);

// Splits a command's arguments into the config file they name (the first argument, or --config FILE;
// "" when none) and the rest.
std::string take_run_file(std::vector<std::string>& args);

}  // namespace llmt
