// What every command runs on, built in one function (make_session) the same way for `llmt train`,
// `llmt bench` and `llmt export`: the backend on this rank's device, the data communicator (MPI on
// the CPU; on a GPU NCCL, or MPI staged through host memory, chosen as --ddp_backend says), the
// model sized for its batch and the FSDP store of its parameters (shard and replica groups:
// hybrid_shard's from the node or --hybrid_shard_group_size). The parameters are left for the
// caller to set (init_parameters, a Hugging Face checkpoint, or a training state).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/backend/backend.h"
#include "engine/dist/communicator.h"
#include "engine/dist/launch.h"
#include "engine/formats/safetensors.h"
#include "engine/fsdp/fsdp.h"
#include "models/config.h"
#include "models/layout.h"
#include "models/transformer.h"
#include "train/plan.h"
#include "train/train_args.h"

namespace llmt {

class Tokenizer;

struct SessionSettings {
  // the device and its communicators
  std::string device = "cpu";  // cpu or cuda
  int threads = 0;             // CPU threads per rank; 0 = this rank's share of the node's cores
  bool bf16 = false;           // the compute dtype
  bool tf32 = false;
  std::string ddp_backend;     // nccl, mpi, or "" (NCCL on GPUs when each rank has its own, else MPI)
  double ddp_timeout = 1800;   // NCCL's set-up deadline
  std::string nccl_log_dir;    // NCCL writes its log here unless the user set NCCL_DEBUG ("" = as the user set)
  bool log = true;             // the gpu and comm lines on rank 0's stdout (llmt bench keeps it for JSON)
  // the model and its store
  int batch = 0;               // per rank; 0: no Transformer (its activations), the store alone (export)
  int seq_len = 0;
  bool gradient_checkpointing = false;
  int logits_chunk_tokens = 0;  // the model's head chunk (Transformer's head_chunk)
  bool packing = false;        // packed documents (which attention kernels take them, on the gpu line)
  Strategy strategy = Strategy::full_shard;
  DType reduce_dtype = DType::f32;
  // --use_peft: this adapter trained on the model, whose store then holds parameters only (frozen:
  // engine/fsdp/fsdp.h); the plan and the memory check count both
  std::optional<LoraConfig> lora;
  int shard_group_size = 0;    // hybrid_shard's shard group; 0 = the ranks of a node
  // Before the model is allocated: llmt plan's per-rank total against this rank's memory (with
  // `accum` micro-batches), an error naming the flags to lower when it does not fit.
  bool check_memory = false;
  int accum = 1;
};

struct Session {
  int threads = 0;                           // the backend's CPU threads
  int gpu = -1;                              // this rank's CUDA device (-1 on the CPU)
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DataComm> data;            // the data collectives
  std::string ddp_backend = "mpi";           // what moves them: "mpi" (on the host, or staged) or "nccl"
  bool nccl_logs = false;                    // NCCL writes its log into nccl_log_dir
  std::unique_ptr<Transformer> model;        // null when batch == 0
  std::unique_ptr<ModelLayout> own_layout;   // the layout when there is no model
  std::unique_ptr<FsdpStore> store;
  int shard_group = 1;                       // the store's local_size argument (another store shards alike)
  PlanArgs plan;                             // what `llmt plan` is asked for this session (make_plan)
  const ModelLayout& layout() const { return model ? model->layout() : *own_layout; }
};

// The settings the flags' parallelism and precision parts give (train and bench read them alike):
// device, threads, communicators, strategy, gradient checkpointing, dtypes. The model's batch and the
// rest are the caller's.
SessionSettings session_settings(const ParallelismConfig& p, const PrecisionConfig& q);

// llmt plan's question for a run of these settings over `world` ranks, `node_ranks` to a node: the
// one translation from settings to a plan, for make_session's memory check, bench's and llmt plan.
// hybrid_shard's shard group is --hybrid_shard_group_size, or the node.
PlanArgs plan_args(const SessionSettings& s, int world, int node_ranks);

// Collective over `world` (the store's groups; NCCL's set-up). `cfg` is the model every rank agreed on.
Session make_session(ControlComm& world, const LaunchInfo& launch, const SessionSettings& s, const ModelConfig& cfg);

// Every unit's parameters initialised from `seed` (as the model's family does), one unit at a time;
// each rank makes only its own shard (init_unit_range, in parallel over the OpenMP threads). Returns
// the number of values this rank made.
int64_t init_parameters(Session& session, const ModelConfig& cfg, uint64_t seed);
// Every unit's parameters from a Hugging Face checkpoint (read from `dir`, named in errors), one unit
// at a time, after checking that its tensors are the model's.
void load_hf_parameters(Session& session, const ModelConfig& cfg, const SafetensorsCheckpoint& ckpt,
                        const std::string& dir);

// The tokenizer a model runs with: "bytes", or a directory or file as load_tokenizer reads it; one
// with more ids than the model's vocabulary is refused.
std::unique_ptr<Tokenizer> model_tokenizer(const std::string& source, const std::string& llama3_special_tokens,
                                           const ModelConfig& cfg);

// One GPU per rank: the rank's index among its node's ranks, over the devices it can see
// (CUDA_VISIBLE_DEVICES applies).
int cuda_device_for_rank(const LaunchInfo& launch);

// After the first step, when NCCL has connected its channels: every rank's NCCL log (written into
// nccl_log_dir), gathered on rank 0 and summarised by the netcheck parser. Collective.
void report_nccl_transports(ControlComm& world, const std::string& nccl_log_dir);

}  // namespace llmt
