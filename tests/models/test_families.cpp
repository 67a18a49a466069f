// The families as data (models/config.h's Family): what each model_type switches on, and what the
// switches lay out, beside the fixtures' numerics (test_hf_reference.cpp).
#include <gtest/gtest.h>

#include "models/config.h"
#include "models/layout.h"
#include "models/lora.h"
#include "models/transformer.h"
#include "tests/test_util.h"

using namespace llmt;

namespace {

ModelConfig fixture_config(const std::string& name) {
  return config_from_json_file(llmt_test::reference_dir() + "/" + name + "/config.json");
}

std::vector<std::string> block_names(const ModelConfig& c) {
  std::vector<std::string> out;
  const ModelLayout L = make_layout(c);
  for (const ParamSpec& p : L.units[1].params) out.push_back(p.hf_name);
  return out;
}

}  // namespace

TEST(Families, EachModelTypeSetsItsSwitches) {
  const ModelConfig gpt2 = fixture_config("gpt2_tiny"), llama = fixture_config("llama_tiny"),
                    qwen3 = fixture_config("qwen3_tiny"), phi3 = fixture_config("phi3_tiny");
  EXPECT_EQ(gpt2.family.norm, NormKind::layernorm);
  EXPECT_EQ(gpt2.family.mlp, MlpKind::gelu_tanh);
  EXPECT_TRUE(gpt2.family.learned_positions && !gpt2.family.rope && gpt2.family.scaled_out_init);
  EXPECT_TRUE(gpt2.qkv_bias && gpt2.o_bias && gpt2.mlp_bias);
  for (const ModelConfig* c : {&llama, &qwen3, &phi3}) {
    EXPECT_EQ(c->family.norm, NormKind::rmsnorm);
    EXPECT_EQ(c->family.mlp, MlpKind::swiglu);
    EXPECT_TRUE(!c->family.learned_positions && c->family.rope && !c->family.scaled_out_init);
  }
  EXPECT_TRUE(qwen3.family.qk_norm);
  EXPECT_FALSE(llama.family.qk_norm || phi3.family.qk_norm);
  EXPECT_EQ(qwen3.head_size(), 16);  // 4 heads of 16 beside a hidden size of 32
  EXPECT_EQ(qwen3.qkv_dim(), (4 + 2 * 2) * 16);
  EXPECT_TRUE(phi3.family.fused_qkv_tensor && phi3.family.fused_gate_up_tensor);
  EXPECT_FALSE(llama.family.fused_qkv_tensor || qwen3.family.fused_gate_up_tensor);
}

TEST(Families, TheSwitchesLayOutTheCheckpointsTensors) {
  EXPECT_EQ(block_names(fixture_config("qwen3_tiny")),
            (std::vector<std::string>{"model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
                                      "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                                      "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
                                      "model.layers.0.self_attn.o_proj.weight",
                                      "model.layers.0.post_attention_layernorm.weight",
                                      "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                                      "model.layers.0.mlp.down_proj.weight"}));
  EXPECT_EQ(block_names(fixture_config("phi3_tiny")),
            (std::vector<std::string>{"model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.qkv_proj.weight",
                                      "model.layers.0.self_attn.o_proj.weight",
                                      "model.layers.0.post_attention_layernorm.weight",
                                      "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.down_proj.weight"}));
  // a switch the naming scheme has no tensor for is an error, not a silent gap
  ModelConfig gpt2 = fixture_config("gpt2_tiny");
  gpt2.family.qk_norm = true;
  llmt_test::expect_error([&] { make_layout(gpt2); }, {"names no q/k norms"});
}

// LoRA's projections are the checkpoint's modules: Phi-3's fused qkv_proj and gate_up_proj
TEST(Families, LoraTargetsPhi3sFusedProjections) {
  const ModelConfig phi3 = fixture_config("phi3_tiny");
  LoraConfig lc;
  lc.r = 2;
  lc.target_modules = {"qkv_proj", "gate_up_proj"};
  const LoraLayout L = make_lora_layout(phi3, resolve_lora_config(lc, phi3));
  ASSERT_EQ(L.slots.size(), 2u);
  EXPECT_EQ(L.slots[0].proj.module, "self_attn.qkv_proj");
  EXPECT_EQ(L.slots[0].proj.out, phi3.qkv_dim());
  EXPECT_EQ(L.slots[1].proj.module, "mlp.gate_up_proj");
  EXPECT_EQ(L.slots[1].proj.out, phi3.mlp_in_dim());
  lc.target_modules = {"q_proj"};
  llmt_test::expect_error([&] { resolve_lora_config(lc, phi3); }, {"q_proj"});
}

// MFU counts the attention a sliding window computes: a layer whose band keeps a fraction of the
// causal pairs counts that fraction of PaLM's 12 q T; full layers and windows >= T count all of it.
TEST(Families, AttentionFlopsFollowTheWindows) {
  ModelConfig cfg = config_from_preset("llama-7b");
  const int T = 2048, q = cfg.q_dim();
  EXPECT_DOUBLE_EQ(Transformer::attention_flops_per_token(cfg, T), 12.0 * cfg.n_layer * q * T);
  cfg.layer_window.assign((size_t)cfg.n_layer, 0);
  cfg.layer_window[0] = 4096;  // wider than T: all of it
  cfg.layer_window[1] = 512;   // 512 keys for the last 1537 queries, 1..512 for the first 512
  const double pairs = 512.0 * 513.0 / 2.0 + (2048.0 - 512.0) * 512.0, full = 2048.0 * 2049.0 / 2.0;
  EXPECT_DOUBLE_EQ(Transformer::attention_flops_per_token(cfg, T),
                   12.0 * q * ((cfg.n_layer - 1) * (double)T + T * pairs / full));
  // a window of 1 keeps only the diagonal: T of the T (T + 1) / 2 pairs
  cfg.layer_window.assign((size_t)cfg.n_layer, 1);
  EXPECT_NEAR(Transformer::attention_flops_per_token(cfg, T), 12.0 * q * cfg.n_layer * 2.0 * T / (T + 1.0), 1e-6);
  const ModelLayout L = make_layout(cfg);
  EXPECT_DOUBLE_EQ(Transformer::flops_per_token(cfg, L, T),
                   6.0 * (double)L.matmul_numel + Transformer::attention_flops_per_token(cfg, T));
}
