// Gemma 2 and Gemma 3 (text) as configs: the family's switches, layer pattern and per-layer RoPE read
// from config.json (both transformers' spellings), the checkpoint names of the sandwich norms, the
// gemma3-1b preset's published size, and what llmt does not compute refused by name. The numerics are
// tests/models/test_hf_reference.cpp's (gemma3_tiny, gemma2_tiny).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "models/config.h"
#include "models/layout.h"
#include "models/transformer.h"
#include "tests/test_util.h"

using namespace llmt;
using llmt_test::expect_error;

namespace {

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// the hf_name of the unit's parameter at offset `off`
std::string name_at(const UnitLayout& u, int64_t off) {
  for (const ParamSpec& p : u.params)
    if (p.offset == off) return p.hf_name;
  return "";
}

const char* kGemma3 = "{\"model_type\": \"gemma3_text\", \"vocab_size\": 10, \"hidden_size\": 32, "
                      "\"intermediate_size\": 8, \"num_hidden_layers\": 6, \"num_attention_heads\": 4, "
                      "\"num_key_value_heads\": 2, \"head_dim\": 16, \"query_pre_attn_scalar\": 16, ";
const char* kGemma2 = "{\"model_type\": \"gemma2\", \"vocab_size\": 10, \"hidden_size\": 32, "
                      "\"intermediate_size\": 8, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "
                      "\"num_key_value_heads\": 2, \"head_dim\": 16, \"query_pre_attn_scalar\": 16, ";

}  // namespace

TEST(ModelConfig, GemmaFixturesReadAsTheFamily) {
  const ModelConfig g3 = config_from_json_file(llmt_test::reference_dir() + "/gemma3_tiny/config.json");
  EXPECT_EQ(g3.family.mlp, MlpKind::geglu);
  EXPECT_EQ(g3.family.norm_offset, 1.0f);
  EXPECT_TRUE(g3.family.sandwich_norms && g3.family.scaled_embeddings && g3.family.qk_norm);
  EXPECT_TRUE(g3.tied_embeddings);
  EXPECT_EQ(g3.head_size(), 16);
  EXPECT_EQ(g3.mlp_in_dim(), 2 * 56);
  EXPECT_EQ(g3.layer_window, (std::vector<int>{5, 0}));
  // the full layer: 1e6 with linear x2; the sliding ones: 1e4 unscaled
  EXPECT_EQ(g3.rope_theta, 1000000.0f);
  EXPECT_EQ(g3.rope_scaling, "linear");
  EXPECT_EQ(g3.rope_factor, 2.0f);
  EXPECT_EQ(g3.rope_local_theta, 10000.0f);
  EXPECT_EQ(g3.decoder_layer_class(), "Gemma3DecoderLayer");
  // what llmt writes back reads as the same model, and names Gemma3ForCausalLM
  const nlohmann::json j3 = config_to_hf_json(g3);
  EXPECT_EQ(j3["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_EQ(j3["rope_parameters"]["sliding_attention"]["rope_theta"], 10000.0f);
  EXPECT_EQ(j3["rope_parameters"]["full_attention"]["rope_type"], "linear");
  EXPECT_EQ(config_to_hf_json(config_from_json(j3, "written back")), j3);

  const ModelConfig g2 = config_from_json_file(llmt_test::reference_dir() + "/gemma2_tiny/config.json");
  EXPECT_FALSE(g2.family.qk_norm);
  EXPECT_TRUE(g2.family.sandwich_norms);
  EXPECT_EQ(g2.layer_window, (std::vector<int>{5, 0}));  // Gemma2Config's alternation, sliding first
  EXPECT_EQ(g2.rope_local_theta, 0.0f);                    // one RoPE for every layer
  EXPECT_EQ(g2.attn_softcap, 0.5f);
  EXPECT_EQ(g2.final_softcap, 2.0f);
  EXPECT_EQ(g2.query_pre_attn_scalar, 24.0f);
  const nlohmann::json j2 = config_to_hf_json(g2);
  EXPECT_EQ(j2["architectures"][0], "Gemma2ForCausalLM");
  EXPECT_EQ(j2["final_logit_softcapping"], 2.0);
  EXPECT_EQ(j2["attn_logit_softcapping"], 0.5);
  EXPECT_TRUE(j3["final_logit_softcapping"].is_null() && j3["attn_logit_softcapping"].is_null());
  EXPECT_EQ(config_to_hf_json(config_from_json(j2, "written back")), j2);

  // Gemma's post_attention_layernorm is the attention branch's output norm, and its pre-MLP norm is
  // pre_feedforward_layernorm (LLaMA's post_attention_layernorm)
  const ModelLayout L = make_layout(g3);
  const UnitLayout& b1 = L.units[2];
  EXPECT_EQ(name_at(b1, L.block.ln1_w), "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(name_at(b1, L.block.post_attn_norm_w), "model.layers.1.post_attention_layernorm.weight");
  EXPECT_EQ(name_at(b1, L.block.ln2_w), "model.layers.1.pre_feedforward_layernorm.weight");
  EXPECT_EQ(name_at(b1, L.block.post_mlp_norm_w), "model.layers.1.post_feedforward_layernorm.weight");
  EXPECT_EQ(name_at(b1, L.block.q_norm_w), "model.layers.1.self_attn.q_norm.weight");
  std::vector<std::string> names;
  for (const ParamSpec& p : L.units[1].params) names.push_back(p.hf_name.substr(std::string("model.layers.0.").size()));
  EXPECT_EQ(names, (std::vector<std::string>{"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                             "self_attn.v_proj.weight", "self_attn.q_norm.weight",
                                             "self_attn.k_norm.weight", "self_attn.o_proj.weight",
                                             "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
                                             "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                                             "post_feedforward_layernorm.weight"}));
  // the random init: norm weights 0 (the norms multiply by 1 + w), as transformers' Gemma init
  std::vector<float> w((size_t)L.units[1].numel, -1.0f);
  init_unit_params(g3, L.units[1], 1, 7, w.data());
  EXPECT_EQ(w[(size_t)L.block.ln1_w], 0.0f);
  EXPECT_EQ(w[(size_t)L.block.post_mlp_norm_w + 31], 0.0f);
  EXPECT_EQ(w[(size_t)L.block.q_norm_w + 15], 0.0f);
}

TEST(ModelConfig, GemmaDefaultsAndTransformers4Spelling) {
  llmt_test::TempDir dir_tmp("gemma");
  const std::string dir = dir_tmp.path;
  // transformers 4's keys: rope_theta and rope_local_base_freq apart, rope_scaling the full layers',
  // sliding_window_pattern 3: layers 2 and 5 full
  write_file(dir + "/v4.json", std::string(kGemma3) + "\"rope_theta\": 500000, \"rope_local_base_freq\": 20000, "
                               "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}, "
                               "\"sliding_window\": 7, \"sliding_window_pattern\": 3}");
  const ModelConfig c = config_from_json_file(dir + "/v4.json");
  EXPECT_EQ(c.layer_window, (std::vector<int>{7, 7, 0, 7, 7, 0}));
  EXPECT_EQ(c.rope_theta, 500000.0f);
  EXPECT_EQ(c.rope_local_theta, 20000.0f);
  EXPECT_EQ(c.rope_scaling, "linear");
  EXPECT_EQ(c.rope_factor, 8.0f);
  // written back in both spellings, which read the same
  const nlohmann::json j = config_to_hf_json(c);
  EXPECT_EQ(j["rope_local_base_freq"], 20000.0f);
  EXPECT_EQ(j["rope_scaling"]["factor"], 8.0f);
  EXPECT_EQ(config_to_hf_json(config_from_json(j, "written back")), j);
  // Gemma3TextConfig's defaults: window 4096 on five layers of six, bases 1e6 and 1e4
  write_file(dir + "/defaults.json", std::string(kGemma3) + "\"rope_theta\": null}");
  const ModelConfig d = config_from_json_file(dir + "/defaults.json");
  EXPECT_EQ(d.layer_window, (std::vector<int>{4096, 4096, 4096, 4096, 4096, 0}));
  EXPECT_EQ(d.rope_theta, 1000000.0f);
  EXPECT_EQ(d.rope_local_theta, 10000.0f);
  EXPECT_TRUE(d.tied_embeddings);

  // the preset: Gemma 3 1B's published sizes, 999,885,952 parameters (lm_head tied)
  const ModelConfig p = config_from_preset("gemma3-1b");
  EXPECT_EQ(make_layout(p).total_numel, 999885952);
  EXPECT_EQ(p.window(0), 512);
  EXPECT_EQ(p.window(5), 0);
  EXPECT_EQ(p.window(25), 512);
  EXPECT_EQ(p.q_dim(), 1024);
  const nlohmann::json pj = config_to_hf_json(p);
  EXPECT_EQ(pj["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_EQ(config_to_hf_json(config_from_json(pj, "preset")), pj);
  // Gemma 2 2B's published 2,614,341,888 (tied), with its soft-caps and windows on the even layers
  const ModelConfig p2 = config_from_preset("gemma2-2b");
  EXPECT_EQ(make_layout(p2).total_numel, 2614341888);
  EXPECT_EQ(p2.attn_softcap, 50.0f);
  EXPECT_EQ(p2.final_softcap, 30.0f);
  EXPECT_EQ(p2.window(0), 4096);
  EXPECT_EQ(p2.window(1), 0);
  const nlohmann::json p2j = config_to_hf_json(p2);
  EXPECT_EQ(p2j["attn_logit_softcapping"], 50.0);
  EXPECT_EQ(config_to_hf_json(config_from_json(p2j, "preset")), p2j);
}

TEST(ModelConfig, GemmaFieldsAreCheckedAndWhatLlmtLacksRefusedByName) {
  llmt_test::TempDir dir_tmp("gemma");
  const std::string dir = dir_tmp.path;
  const std::string g3 = kGemma3, g2 = kGemma2;
  const std::pair<std::string, std::vector<std::string>> refused[] = {
      {g2 + "\"attn_logit_softcapping\": 0}", {"\"attn_logit_softcapping\": 0 must be a positive number or null"}},
      {g3 + "\"final_logit_softcapping\": -30.0}", {"\"final_logit_softcapping\": -30 must be a positive number"}},
      {g3 + "\"hidden_activation\": \"gelu\"}", {"hidden_activation \"gelu\" is not supported"}},
      {g3 + "\"attention_bias\": true}", {"\"attention_bias\": true is not supported"}},
      {g3 + "\"use_bidirectional_attention\": true}", {"\"use_bidirectional_attention\": true is not supported"}},
      {g3 + "\"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2.0}}}",
       {"rope_parameters.sliding_attention", "unscaled"}},
      {g3 + "\"rope_parameters\": {\"rope_type\": \"default\"}}", {"rope_parameters", "\"rope_type\"", "layer type"}},
      {g3 + "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"yarn\", \"factor\": 2.0}}}",
       {"rope_parameters.full_attention", "\"yarn\""}},
      {g3 + "\"layer_types\": [\"sliding_attention\"]}", {"layer_types", "one kind per layer"}},
      {g3 + "\"sliding_window\": null}", {"sliding_window is null"}},
  };
  for (size_t i = 0; i < std::size(refused); i++) {
    const std::string f = dir + strformat("/refused%zu.json", i);
    write_file(f, refused[i].first);
    expect_error([&] { config_from_json_file(f); }, refused[i].second);
  }
  // Gemma 2's soft-caps null: none; absent: Gemma2Config's 50 and 30; Gemma 3's absent: none; an
  // attention scale apart from head_dim (Gemma 2 27B's 144 beside 128) read as given
  write_file(dir + "/g2.json", g2 + "\"final_logit_softcapping\": null, \"attn_logit_softcapping\": null}");
  const ModelConfig off = config_from_json_file(dir + "/g2.json");
  EXPECT_EQ(off.layer_window, (std::vector<int>{4096, 0, 4096, 0}));
  EXPECT_EQ(off.attn_softcap, 0.0f);
  EXPECT_EQ(off.final_softcap, 0.0f);
  std::string g2_144 = g2;
  g2_144.replace(g2_144.find("\"query_pre_attn_scalar\": 16"), 27, "\"query_pre_attn_scalar\": 144");
  write_file(dir + "/g2d.json", g2_144 + "\"rms_norm_eps\": 1e-6}");
  const ModelConfig on = config_from_json_file(dir + "/g2d.json");
  EXPECT_EQ(on.attn_softcap, 50.0f);
  EXPECT_EQ(on.final_softcap, 30.0f);
  EXPECT_EQ(on.query_pre_attn_scalar, 144.0f);
  write_file(dir + "/g3.json", g3 + "\"rms_norm_eps\": 1e-6}");
  EXPECT_EQ(config_from_json_file(dir + "/g3.json").attn_softcap, 0.0f);
}
