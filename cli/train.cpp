#include <cstdio>

#include "cli/commands.h"
#include "engine/dist/launch.h"
#include "train/run_file.h"
#include "train/trainer.h"

namespace llmt {

bool wants_help(const std::vector<std::string>& args) {
  for (auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

int cli_train(const std::vector<std::string>& args) {
  install_stop_handlers();  // first: a signal during start-up must not kill the rank
  if (wants_help(args)) {
    std::printf("%s", train_help().c_str());
    return 0;
  }
  if (args.size() == 1 && args[0] == "--help-markdown") {  // the README's flag list
    std::printf("%s", train_flags_markdown().c_str());
    return 0;
  }
  std::vector<std::string> rest = args;
  const std::string run_file = take_run_file(rest);  // run.json / run.yaml: its flags first, ours override
  Flags flags("train", run_file.empty() ? std::vector<std::string>() : run_file_args(run_file), run_file, rest);
  TrainArgs a = parse_train_args(flags);
  flags.finish();
  std::unique_ptr<ControlComm> world;
  LaunchInfo launch = init_launch(nullptr, nullptr, &world, "train", a.ddp_timeout);
  run_training(a, *world, launch);
  return 0;
}

}  // namespace llmt
