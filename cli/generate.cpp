#include <cstdio>

#include "cli/commands.h"
#include "engine/core/error.h"
#include "engine/core/log.h"
#include "engine/dist/launch.h"
#include "train/flags.h"
#include "train/generate_text.h"

namespace llmt {

int cli_generate(const std::vector<std::string>& args) {
  if (wants_help(args)) {
    std::printf(
        "llmt generate: text from a model, one JSONL record per prompt (index, prompt, prompt_tokens, ids, text,\n"
        "finish_reason) on stdout or into --output; progress on stderr. One process, no mpirun.\n\n"
        "  --model_name_or_path DIR    a Hugging Face directory, or a checkpoint (its exact state.h5, checksums verified)\n"
        "  --adapter_name_or_path DIR  a PEFT LoRA adapter (llmt train --use_peft's output_dir), merged into the\n"
        "                              model's weights as PEFT's merge_and_unload does (a Hugging Face directory only)\n"
        "  --tokenizer_name_or_path P  the tokenizer (default: the model's directory; \"bytes\" for byte ids)\n"
        "  --llama3_special_tokens V   auto|3.0|3.1, as llmt train takes it\n"
        "  --prompt TEXT               a prompt (repeatable)\n"
        "  --prompts_file F            JSONL: {\"prompt\": ...} or Alpaca records ({\"instruction\", \"input\"})\n"
        "  --alpaca_template BOOL      wrap instructions in Stanford Alpaca's PROMPT_DICT, as training did (False)\n"
        "  --max_new_tokens N          at most N new tokens a prompt (128); stops earlier at an EOS id\n"
        "                              (generation_config.json's, config.json's and the tokenizer's)\n"
        "  --do_sample BOOL            sample instead of greedy (False, as transformers' do_sample)\n"
        "  --temperature T             (1.0)   --top_k K (50; 0 = off)   --top_p P (1.0 = off)\n"
        "  --seed S                    sampling's seed (42): a prompt's draws depend on S, its index and the step\n"
        "  --batch_size N              prompts run together, left-padded to the longest (8)\n"
        "  --output F                  write the JSONL to F instead of stdout, each record as its batch finishes\n"
        "  --device cpu|cuda           (cpu)   --bf16 BOOL (False: fp32)   --threads N (0: every core)\n");
    return 0;
  }
  log_info_to_stderr(true);  // progress on stderr, stdout for the records (the flags' notes come first)
  Flags f("generate", args);
  GenerateArgs a;
  a.model_name_or_path = f.get_string("model_name_or_path", "");
  a.tokenizer_name_or_path = f.get_string("tokenizer_name_or_path", "");
  a.adapter_name_or_path = f.get_string("adapter_name_or_path", "");
  a.llama3_special_tokens = f.get_string("llama3_special_tokens", a.llama3_special_tokens);
  a.prompts = f.get_all("prompt");
  a.prompts_file = f.get_string("prompts_file", "");
  a.alpaca_template = f.get_bool("alpaca_template", false);
  a.max_new_tokens = f.get_int("max_new_tokens", a.max_new_tokens);
  a.do_sample = f.get_bool("do_sample", false);
  a.temperature = f.get_double("temperature", a.temperature);
  a.top_k = f.get_int("top_k", a.top_k);
  a.top_p = f.get_double("top_p", a.top_p);
  a.seed = (uint64_t)f.get_int64("seed", (long long)a.seed);
  a.batch_size = f.get_int("batch_size", a.batch_size);
  a.output = f.get_string("output", "");
  a.device = f.get_string("device", a.device);
  a.bf16 = f.get_bool("bf16", false);
  a.threads = f.get_int("threads", 0);
  f.finish();
  LLMT_CHECK(a.device == "cpu" || a.device == "cuda", "llmt generate: --device must be cpu or cuda, got %s",
             a.device.c_str());
  std::unique_ptr<ControlComm> world;
  const LaunchInfo launch = init_launch(nullptr, nullptr, &world, "generate");
  run_generate(a, *world, launch);
  return 0;
}

}  // namespace llmt
