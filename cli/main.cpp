// llmt: one executable, one file per subcommand. main dispatches and reports errors: before the
// ranks know each other (argument errors, the same on every rank) rank 0 alone prints and every
// rank exits 1; after, the failing rank prints its message and ends the whole job, so no rank
// is left waiting in a collective (a single process started without a launcher just exits: its
// error line is all it prints).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "engine/core/crash.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/launch.h"

static void usage() {
  std::printf(
      "llmt: a native trainer for GPT-2 and LLaMA models\n\n"
      "usage: llmt <command> [--flag value ...]\n"
      "       mpirun -np N llmt train ...   (or srun --mpi=pmix llmt train ...)\n\n"
      "commands:\n"
      "  train   train a model (Hugging Face TrainingArguments flag names)\n"
      "  bench   time whole training steps on synthetic tokens, print one JSON line\n"
      "  tokenize text on stdin to token ids and back; --bench FILE measures encoding speed\n"
      "  plan    per-rank memory and communication of a run, computed without allocating\n"
      "  export  a Hugging Face directory from a checkpoint's exact training state\n"
      "  generate text from a model or checkpoint for prompts (greedy or sampled, a KV cache), as JSONL\n"
      "  netcheck RDMA/NCCL network report and settings on every rank; --bench times the collectives\n\n"
      "llmt <command> --help describes each command's flags.\n");
}

static int report(const char* what) {
  if (llmt::launch_initialized()) {
    llmt::log_error("%s", what);
    llmt::abort_job(1);
  }
  if (llmt::launcher_rank_from_env() <= 0) llmt::log_error("%s", what);
  return 1;
}

int main(int argc, char** argv) {
  llmt::install_crash_report();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    int rc = 2;
    if (cmd == "train") rc = llmt::cli_train(args);
    else if (cmd == "bench") rc = llmt::cli_bench(args);
    else if (cmd == "plan") rc = llmt::cli_plan(args);
    else if (cmd == "tokenize") rc = llmt::cli_tokenize(args);
    else if (cmd == "export") rc = llmt::cli_export(args);
    else if (cmd == "generate") rc = llmt::cli_generate(args);
    else if (cmd == "netcheck") rc = llmt::cli_netcheck(args);
    else {
      llmt::log_error("unknown command \"%s\"", cmd.c_str());
      usage();
    }
    llmt::finalize_launch();
    // What a command printed (plan --json, bench, tokenize, help) must have reached its file: a full
    // disk or /dev/full gave exit 0 with nothing written.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      const int e = errno;
      std::fprintf(stderr, "error: writing standard output failed: %s\n", std::strerror(e));
      return 1;
    }
    return rc;
  } catch (const llmt::Error& e) {
    return report(e.what());
  } catch (const std::exception& e) {
    return report((std::string("internal error: ") + e.what()).c_str());
  }
}
