// The subcommands, one file each. Each returns the process exit code.
#pragma once
#include <string>
#include <vector>

namespace llmt {

int cli_train(const std::vector<std::string>& args);
int cli_bench(const std::vector<std::string>& args);
int cli_plan(const std::vector<std::string>& args);
int cli_tokenize(const std::vector<std::string>& args);
int cli_netcheck(const std::vector<std::string>& args);
int cli_export(const std::vector<std::string>& args);
int cli_generate(const std::vector<std::string>& args);

// True when args ask for help (--help or -h anywhere).
bool wants_help(const std::vector<std::string>& args);

}  // namespace llmt
