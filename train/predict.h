// `llmt plan --predict`: a step-time model for a named cluster, from the plan's FLOPs and bytes.
//
// Per rank and step (docs/performance.md, "The step-time model", has the derivation and the
// comparison with published figures):
//   compute    matmul FLOPs / (peak x matmul_efficiency) + causal attention FLOPs / (peak x
//              attention_efficiency) + the elementwise ops' bytes / (HBM bandwidth x 0.8); forward
//              once more for the recomputed part under activation checkpointing
//   optimizer  AdamW's, the gradient norm's and the zeroing's bytes over this rank's shard / HBM
//   comm       each collective's bytes sent (the plan's ring convention) / bus bandwidth (nccl-tests'
//              busbw): NVLink within a node, and across nodes the node's NICs together, at most NVLink
//   overlap    FSDP's prefetch: a unit's gather (and in backward the previous unit's reduce-scatter)
//              runs while the current unit computes; only what is longer than that compute, the first
//              gather and the last reduce-scatters are exposed
// The time is the sum of compute, optimizer and exposed communication.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "models/config.h"
#include "train/plan.h"

namespace llmt {

struct ClusterSpec {
  std::string gpu;                    // the preset's name
  double peak_tflops = 0;             // dense bf16 (what MFU divides by)
  double hbm_tbps = 0;                // HBM bandwidth, TB/s
  double matmul_efficiency = 0.7;     // achieved fraction of peak on the step's GEMMs
  double attention_efficiency = 0.5;  // the same for fused causal attention, forward and backward
  int gpus_per_node = 8;
  double nvlink_busbw_gbps = 0;       // GB/s, nccl-tests all_gather / reduce_scatter busbw within a node
  double nic_gbits_per_gpu = 400;     // Gb/s of network per GPU between nodes
  double nic_efficiency = 0.9;        // of the line rate, as busbw
  std::string recompute = "none";     // none, selective (torchtitan's op-level policy), full
};

// A preset by GPU name (a100, h100, h100-hbm2e, h200), with the values above filled in from the
// datasheets; throws listing the names.
ClusterSpec cluster_preset(const std::string& gpu);
std::string cluster_preset_names();

// The prediction: step time and its parts (seconds), tokens/s per GPU, MFU, and the inputs used.
nlohmann::json predict_step(const ModelConfig& cfg, const PlanArgs& a, const ClusterSpec& c);
std::string format_prediction(const nlohmann::json& p);

}  // namespace llmt
