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
        "llmt export CHECKPOINT_DIR OUT_DIR [--dtype F32|BF16|F16]\n"
        "llmt export ADAPTER_DIR OUT_DIR --merge_adapter True [--model_name_or_path BASE_DIR] [--dtype ...]\n\n"
        "writes a Hugging Face directory (config.json, model.safetensors, tokenizer files) from a checkpoint's\n"
        "exact training state (fp32 master weights in state.h5), after verifying its checksums.\n"
        "--merge_adapter True: from a PEFT LoRA adapter directory or a LoRA run's checkpoint, the base model\n"
        "with the adapter merged in (PEFT's merge_and_unload); the base is --model_name_or_path, else the\n"
        "adapter_config.json's base_model_name_or_path. An lm_head copy (modules_to_save) on a base whose\n"
        "lm_head is tied to its embeddings writes an untied model (tie_word_embeddings false).\n");
    return wants_help(args) ? 0 : 2;
  }
  Flags f("export", std::vector<std::string>(args.begin() + 2, args.end()));
  std::string dtype = f.get_string("dtype", "F32");
  const bool merge = f.get_bool("merge_adapter", false);
  const std::string base = f.get_string("model_name_or_path", "");
  f.finish();
  LLMT_CHECK(merge || base.empty(), "llmt export: --model_name_or_path names the base an adapter is merged into: it "
             "goes with --merge_adapter True");
  LLMT_CHECK(dtype == "F32" || dtype == "BF16" || dtype == "F16", "llmt export: --dtype must be F32, BF16 or F16, got %s",
             dtype.c_str());
  std::unique_ptr<ControlComm> world;
  const LaunchInfo launch = init_launch(nullptr, nullptr, &world, "export");
  if (merge) run_merge_adapter_export(args[0], base, args[1], dtype, *world);
  else run_export(args[0], args[1], dtype, *world, launch);
  return 0;
}

}  // namespace llmt
