// llmt: one executable, one file per subcommand. main only dispatches and reports errors.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/log.h"

static void usage() {
  std::printf(
      "llmt: a native trainer for GPT-2 and LLaMA models\n\n"
      "usage: llmt <command> [--flag value ...]\n\n"
      "commands:\n"
      "  train   train a model (Hugging Face TrainingArguments flag names)\n"
      "  bench   time whole training steps on synthetic tokens, print one JSON line\n\n"
      "llmt <command> --help describes each command's flags.\n");
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (cmd == "train") return llmt::cli_train(args);
    if (cmd == "bench") return llmt::cli_bench(args);
    llmt::log_error("unknown command \"%s\"", cmd.c_str());
    usage();
    return 2;
  } catch (const llmt::Error& e) {
    llmt::log_error("%s", e.what());
    return 1;
  } catch (const std::exception& e) {
    llmt::log_error("internal error: %s", e.what());
    return 1;
  }
}
