#include <cstdio>

#include "cli/commands.h"
#include "engine/core/error.h"
#include "engine/dist/launch.h"
#include "train/export.h"
#include "train/flags.h"

namespace llmt {

int cli_export(const std::vector<std::string>& args) {
  if (wants_help(args) || args.size() < 2) {
    std::printf(
        "llmt export CHECKPOINT_DIR OUT_DIR [--dtype F32|BF16|F16]\n\n"
        "writes a Hugging Face directory (config.json, model.safetensors, tokenizer files) from a checkpoint's\n"
        "exact training state (fp32 master weights in state.h5), after verifying its checksums.\n");
    return wants_help(args) ? 0 : 2;
  }
  Flags f("export", std::vector<std::string>(args.begin() + 2, args.end()));
  std::string dtype = f.get_string("dtype", "F32");
  f.finish();
  LLMT_CHECK(dtype == "F32" || dtype == "BF16" || dtype == "F16", "llmt export: --dtype must be F32, BF16 or F16, got %s",
             dtype.c_str());
  std::unique_ptr<ControlComm> world;
  const LaunchInfo launch = init_launch(nullptr, nullptr, &world, "export");
  run_export(args[0], args[1], dtype, *world, launch);
  return 0;
}

}  // namespace llmt
