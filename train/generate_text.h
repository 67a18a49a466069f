// `llmt generate`: text from a Hugging Face directory or a checkpoint, for prompts given on the
// command line or in a JSONL file, written as JSONL (models/generate.h does the token work).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/dist/launch.h"

namespace llmt {

struct GenerateArgs {
  std::string model_name_or_path;      // a Hugging Face directory, or a checkpoint (its exact state.h5)
  std::string adapter_name_or_path;    // a PEFT LoRA adapter merged into the weights at load ("" = none)
  std::string tokenizer_name_or_path;  // "" = the model's directory
  std::string llama3_special_tokens = "auto";
  std::vector<std::string> prompts;    // --prompt, repeatable
  std::string prompts_file;            // JSONL: {"prompt": ...} or Alpaca records
  bool alpaca_template = false;        // Stanford's PROMPT_DICT around instructions, as training did
  int max_new_tokens = 128;
  bool do_sample = false;
  double temperature = 1.0;
  int top_k = 50;
  double top_p = 1.0;
  uint64_t seed = 42;
  int batch_size = 8;                  // prompts run together (left-padded to the longest)
  std::string output;                  // JSONL file, each record written as its batch finishes; "" = stdout
  std::string device = "cpu";
  bool bf16 = false;
  int threads = 0;
};

// The prompts' text, in order: args.prompts, then the file's records. A record is {"prompt": TEXT},
// or an Alpaca record ({"instruction", optional "input" or "context"}) which needs
// --alpaca_template; errors name the file and line.
std::vector<std::string> read_generate_prompts(const GenerateArgs& a);

// Runs the generation as one process (world of one) and writes the JSONL records: index, prompt,
// prompt_tokens, ids, text, finish_reason ("eos" or "length"). Every input is checked before any
// work (--output against the inputs and every checkpoint, each batch's prompts against the context),
// and each batch's records are written as it finishes.
void run_generate(const GenerateArgs& a, ControlComm& world, const LaunchInfo& launch);

}  // namespace llmt
