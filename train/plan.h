// `llmt plan`: what a run will hold and send per rank, computed from the model's layout, its
// activation table and the FSDP strategy without allocating anything, so it runs anywhere (a
// laptop, a login node).
#pragma once
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/fsdp/fsdp.h"
#include "models/config.h"
#include "models/lora.h"

namespace llmt {

struct PlanArgs {
  std::string model = "gpt2";  // preset, config.json or Hugging Face directory
  int world = 1;
  int ranks_per_node = 0;      // 0: all ranks on one node
  std::string fsdp = "full_shard auto_wrap";
  int batch = 1;               // per device
  int seq_len = 512;
  int accum = 1;
  bool gradient_checkpointing = false;
  bool bf16 = false;              // bf16 compute copy, gathers and activations
  DType reduce_dtype = DType::f32;  // what gradients travel in
  int vocab_pad = 1;                // the logits' row padding: 1 on the CPU, kDeviceVocabPad on a GPU
  int logits_chunk_tokens = 0;      // the LM head's rows at a time (0: the micro-batch)
  // --use_peft: the model's store frozen, this adapter (resolved against the model) trained beside it
  std::optional<LoraConfig> lora;
};

// What a run holds and sends per rank. Per rank: persistent state, peak gathered buffers,
// activations (by buffer too); per step: bytes each rank sends in all_gather / reduce_scatter /
// all_reduce (the ring convention of CommStats), the store's collectives and the step's loss and
// norm scalars.
struct Plan {
  std::string model;  // the config, described
  int64_t params = 0;
  std::string adapter;          // "LoRA r 16 on 6 projections a block" under --use_peft, else empty
  int64_t adapter_params = 0;   // the adapter's trained parameters
  int world = 1, ranks_per_node = 1, shard_group = 1, replicas = 1;
  Strategy strategy = Strategy::full_shard;
  int batch = 1, seq_len = 1, accum = 1;
  bool gradient_checkpointing = false;
  DType compute_dtype = DType::f32, reduce_dtype = DType::f32;
  double persistent_gib = 0, gathered_peak_gib = 0, activations_gib = 0, total_gib = 0;
  std::map<std::string, double> activations_by_buffer_gib;
  double comm_all_gather_bytes = 0, comm_reduce_scatter_bytes = 0, comm_all_reduce_bytes = 0, comm_total_bytes = 0;
  double flops_per_token = 0;
  // llmt generate's KV cache for `batch` sequences of seq_len tokens (prompt and new), unsharded:
  // generation runs on one process
  double kv_cache_gib = 0;
};
Plan plan_run(const ModelConfig& cfg, const PlanArgs& a);
// The plan as `llmt plan --json` prints it (and its table, format_plan, reads).
nlohmann::json plan_json(const Plan& plan);
nlohmann::json make_plan(const ModelConfig& cfg, const PlanArgs& a);  // plan_json(plan_run(cfg, a))
std::string format_plan(const nlohmann::json& plan);

// The memory one rank may use, GiB, to compare with a plan's total before allocating: its GPU's
// free memory over the node's ranks that share the GPU when `be` draws from a device, else (or
// with be == nullptr) the node's MemAvailable over its ranks; 0 when nothing can be read. *where
// says which, with figures, for the message.
double memory_per_rank_gib(Backend* be, int local_rank, int local_size, std::string* where);

}  // namespace llmt
