// Hugging Face checkpoint I/O: lossless save and reload, and clear errors for bad input.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/rng.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/hf_checkpoint.h"
#include "models/transformer.h"
#include "tests/test_util.h"

using namespace llmt;

namespace {


void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// Loads every unit of a Hugging Face directory into host buffers.
std::vector<std::vector<float>> load_all(const std::string& dir, const ModelConfig& cfg, const ModelLayout& L) {
  SafetensorsCheckpoint ckpt(dir);
  check_hf_tensors(ckpt, cfg, L, dir);
  std::vector<std::vector<float>> units;
  for (size_t u = 0; u < L.units.size(); u++) {
    units.emplace_back((size_t)L.units[u].numel);
    load_hf_unit(ckpt, cfg, L, (int)u, units.back().data());
  }
  return units;
}

std::vector<const float*> ptrs(const std::vector<std::vector<float>>& units) {
  std::vector<const float*> p;
  for (auto& u : units) p.push_back(u.data());
  return p;
}

using llmt_test::expect_error;

}  // namespace

TEST(HfCheckpoint, SaveAndReloadIsLosslessForEveryFixture) {
  for (std::string name : {"gpt2_tiny", "llama_tiny", "llama_tied_tiny", "qwen3_tiny", "phi3_tiny", "gemma3_tiny",
                           "gemma2_tiny"}) {
    std::string src = llmt_test::reference_dir() + "/" + name;
    ModelConfig cfg = config_from_json_file(src + "/config.json");
    ModelLayout L = make_layout(cfg);
    auto units = load_all(src, cfg, L);
    llmt_test::TempDir out_tmp("hfck");
    std::string out = out_tmp.path;
    save_hf_model(out, cfg, L, ptrs(units), "F32");
    ModelConfig cfg2 = config_from_json_file(out + "/config.json");
    EXPECT_EQ(cfg2.describe(), cfg.describe()) << name;
    auto again = load_all(out, cfg2, L);
    for (size_t u = 0; u < units.size(); u++) EXPECT_EQ(units[u], again[u]) << name << " unit " << u;

    // and split into shards: the same tensors come back
    llmt_test::TempDir sharded_tmp("hfck");
    std::string sharded = sharded_tmp.path;
    save_hf_model(sharded, cfg, L, ptrs(units), "F32", 20000);
    struct stat st;
    EXPECT_EQ(stat((sharded + "/model.safetensors.index.json").c_str(), &st), 0);
    auto from_shards = load_all(sharded, cfg, L);
    for (size_t u = 0; u < units.size(); u++) EXPECT_EQ(units[u], from_shards[u]) << name << " sharded unit " << u;
  }
}

TEST(HfCheckpoint, Bf16SaveRoundsToNearestEven) {
  std::string src = llmt_test::reference_dir() + "/llama_tiny";
  ModelConfig cfg = config_from_json_file(src + "/config.json");
  ModelLayout L = make_layout(cfg);
  auto units = load_all(src, cfg, L);
  llmt_test::TempDir out_tmp("hfck");
  std::string out = out_tmp.path;
  save_hf_model(out, cfg, L, ptrs(units), "BF16");
  auto again = load_all(out, cfg, L);
  for (size_t u = 0; u < units.size(); u++)
    for (size_t i = 0; i < units[u].size(); i++)
      ASSERT_EQ(again[u][i], bf16_to_f32(f32_to_bf16(units[u][i])));
}

// --torch_dtype float16: IEEE half, round to nearest even; a weight beyond its range is an error,
// never an infinity in the file.
TEST(HfCheckpoint, F16SaveRoundsAndRefusesOverflow) {
  std::string src = llmt_test::reference_dir() + "/llama_tiny";
  ModelConfig cfg = config_from_json_file(src + "/config.json");
  ModelLayout L = make_layout(cfg);
  auto units = load_all(src, cfg, L);
  llmt_test::TempDir out_tmp("hfck");
  std::string out = out_tmp.path;
  save_hf_model(out, cfg, L, ptrs(units), "F16");
  SafetensorsFile f(out + "/model.safetensors");
  for (const StTensor& t : f.tensors()) ASSERT_EQ(t.dtype, "F16") << t.name;
  auto again = load_all(out, cfg, L);
  for (size_t u = 0; u < units.size(); u++)
    for (size_t i = 0; i < units[u].size(); i++) ASSERT_EQ(again[u][i], f16_to_f32(f32_to_f16(units[u][i])));
  units[1][7] = 70000.0f;
  llmt_test::TempDir bad_tmp("hfck");
  expect_error([&] { save_hf_model(bad_tmp.path, cfg, L, ptrs(units), "F16"); },
               {"element 7 is 70000, beyond float16's range (65504)"});
  // nothing of the failed save is left: config.json came first and stayed, beside no weights
  struct stat st;
  EXPECT_NE(::stat((bad_tmp.path + "/config.json").c_str(), &st), 0) << "a failed save left config.json";
  EXPECT_NE(::stat((bad_tmp.path + "/model.safetensors").c_str(), &st), 0);
}

// A saved config.json writes back what the source said, in its form, plus what llmt sets: eps 1e-06
// became 9.999999974752427e-07, and use_cache, initializer_range, max_window_layers, head_dim,
// pretraining_tp and GPT-2's reorder_and_upcast_attn were dropped; an eos_token_id list was dropped.
TEST(ModelConfig, ASavedConfigKeepsTheSourcesKeysInTheirForm) {
  const nlohmann::json src = nlohmann::json::parse(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 32,
      "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "use_cache": true, "initializer_range": 0.02,
      "max_window_layers": 21, "head_dim": 8, "pretraining_tp": 1, "use_sliding_window": false,
      "sliding_window": 4096, "eos_token_id": [3, 4], "torch_dtype": "bfloat16", "transformers_version": "4.44.0"})");
  const ModelConfig c = config_from_json(src, "src.json");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{3, 4}));
  const nlohmann::json out = config_to_save(c, "float32");
  for (const auto& [k, v] : src.items()) {
    if (k == "torch_dtype") continue;
    EXPECT_EQ(out.at(k), v) << k;
  }
  EXPECT_EQ(out.at("torch_dtype"), "float32");
  EXPECT_NE(out.dump().find("\"rms_norm_eps\":1e-06"), std::string::npos) << out.dump();
  EXPECT_EQ(out.at("architectures"), nlohmann::json::array({"Qwen2ForCausalLM"}));  // llmt's, the source had none
  // read back: the same model, and the same identity checkpoints compare
  const ModelConfig again = config_from_json(out, "out.json");
  EXPECT_EQ(config_to_hf_json(again).dump(), config_to_hf_json(c).dump());
  // a preset (no source): llmt's floats as the decimals they stand for
  const std::string preset = config_to_save(config_from_preset("llama-7b"), "float32").dump();
  EXPECT_NE(preset.find("\"rms_norm_eps\":1e-06"), std::string::npos) << preset;
  EXPECT_EQ(preset.find("9.99999"), std::string::npos) << preset;
  // a value llmt computes differently from the source's (changed after reading) is llmt's
  ModelConfig changed = c;
  changed.attn_pdrop = 0.25f;
  EXPECT_EQ(config_to_save(changed, "float32").at("attention_dropout"), 0.25);
  // transformers 5's dtype names the saved dtype too
  nlohmann::json v5 = src;
  v5.erase("torch_dtype");
  v5["dtype"] = "bfloat16";
  EXPECT_EQ(config_to_save(config_from_json(v5, "v5.json"), "float16").at("dtype"), "float16");
}

TEST(HfCheckpoint, MissingUnexpectedMisshapenTensorsAreNamed) {
  std::string src = llmt_test::reference_dir() + "/gpt2_tiny";
  ModelConfig cfg = config_from_json_file(src + "/config.json");
  ModelLayout L = make_layout(cfg);
  auto units = load_all(src, cfg, L);
  SafetensorsFile good(src + "/model.safetensors");

  // rewrite the file with one tensor changed, dropped or added
  std::vector<std::unique_ptr<llmt_test::TempDir>> dirs;  // removed when the test ends
  auto rewrite = [&](const std::string& drop, const std::string& add, std::vector<int64_t> add_shape) {
    dirs.push_back(std::make_unique<llmt_test::TempDir>("hfck"));
    const std::string dir = dirs.back()->path;
    std::vector<StEntry> entries;
    for (const StTensor& t : good.tensors())
      if (t.name != drop) entries.push_back({t.name, t.dtype, t.shape, good.data(t)});
    std::vector<float> extra(4096, 0.5f);
    if (!add.empty()) entries.push_back({add, "F32", add_shape, extra.data()});
    write_safetensors(dir + "/model.safetensors", entries);
    return dir;
  };
  std::string d1 = rewrite("transformer.h.1.mlp.c_fc.bias", "", {});
  expect_error([&] { SafetensorsCheckpoint c(d1); check_hf_tensors(c, cfg, L, d1); },
               {d1, "transformer.h.1.mlp.c_fc.bias", "missing"});
  std::string d2 = rewrite("", "transformer.h.0.attn.extra.weight", {4});
  expect_error([&] { SafetensorsCheckpoint c(d2); check_hf_tensors(c, cfg, L, d2); },
               {"model.safetensors", "transformer.h.0.attn.extra.weight", "unexpected"});
  std::string d3 = rewrite("transformer.ln_f.bias", "transformer.ln_f.bias", {31});
  expect_error([&] { SafetensorsCheckpoint c(d3); check_hf_tensors(c, cfg, L, d3); },
               {"model.safetensors", "transformer.ln_f.bias", "[31]", "[32]"});
  llmt_test::TempDir d4_tmp("hfck");
  std::string d4 = d4_tmp.path;
  {
    std::vector<StEntry> entries;
    std::vector<int32_t> ints(32 * 32, 1);
    for (const StTensor& t : good.tensors())
      entries.push_back(t.name == "transformer.ln_f.weight" ? StEntry{t.name, "I32", t.shape, ints.data()}
                                                            : StEntry{t.name, t.dtype, t.shape, good.data(t)});
    write_safetensors(d4 + "/model.safetensors", entries);
  }
  expect_error([&] { SafetensorsCheckpoint c(d4); check_hf_tensors(c, cfg, L, d4); },
               {"transformer.ln_f.weight", "I32"});
}

TEST(HfCheckpoint, OfficialGpt2NamesWithoutPrefixAndBuffersLoad) {
  // The official gpt2 files name tensors without "transformer." and carry attn.bias buffers.
  std::string src = llmt_test::reference_dir() + "/gpt2_tiny";
  ModelConfig cfg = config_from_json_file(src + "/config.json");
  ModelLayout L = make_layout(cfg);
  auto units = load_all(src, cfg, L);
  SafetensorsFile good(src + "/model.safetensors");
  llmt_test::TempDir dir_tmp("hfck");
  std::string dir = dir_tmp.path;
  std::vector<StEntry> entries;
  for (const StTensor& t : good.tensors()) entries.push_back({t.name.substr(12), t.dtype, t.shape, good.data(t)});
  std::vector<float> mask(13 * 13, 1.0f), masked(1, -1e4f);
  entries.push_back({"h.0.attn.bias", "F32", {1, 1, 13, 13}, mask.data()});
  entries.push_back({"h.0.attn.masked_bias", "F32", {}, masked.data()});
  write_safetensors(dir + "/model.safetensors", entries);
  write_file(dir + "/config.json", "{\"model_type\": \"gpt2\", \"vocab_size\": 259, \"n_positions\": 32, \"n_embd\": 32, "
                                   "\"n_layer\": 2, \"n_head\": 4}");
  auto again = load_all(dir, cfg, L);
  for (size_t u = 0; u < units.size(); u++) EXPECT_EQ(units[u], again[u]);
}

TEST(ModelConfig, BadConfigsAreClearErrors) {
  llmt_test::TempDir dir_tmp("hfck");
  std::string dir = dir_tmp.path;
  expect_error([&] { config_from_json_file(dir + "/nope.json"); }, {"nope.json", "cannot open"});
  write_file(dir + "/bad.json", "{\"model_type\": \"gpt2\", ");
  expect_error([&] { config_from_json_file(dir + "/bad.json"); }, {"bad.json", "malformed JSON"});
  write_file(dir + "/nokey.json", "{\"model_type\": \"gpt2\", \"vocab_size\": 10}");
  expect_error([&] { config_from_json_file(dir + "/nokey.json"); }, {"nokey.json", "n_layer"});
  write_file(dir + "/type.json", "{\"model_type\": \"gpt2\", \"vocab_size\": \"many\", \"n_layer\": 1}");
  expect_error([&] { config_from_json_file(dir + "/type.json"); }, {"type.json", "vocab_size", "must be an integer"});
  // Types as transformers' classes need them (each was accepted before: 32.5 as 32, true as 1, "yes"
  // as true), and sizes beyond reason refused with the value the file holds (1e12 was reported as
  // vocab -727379968; n_layer 1e9 grew memory without end).
  const std::string gpt2 = "{\"model_type\": \"gpt2\", \"vocab_size\": 256, \"n_layer\": 2, \"n_head\": 2, ";
  const std::pair<std::string, std::vector<std::string>> strict[] = {
      {gpt2 + "\"n_embd\": 32.5}", {"n_embd", "must be an integer, got 32.5"}},
      {gpt2 + "\"n_embd\": true}", {"n_embd", "must be an integer, got true"}},
      {"{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 32, \"intermediate_size\": 8, "
       "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"tie_word_embeddings\": \"yes\"}",
       {"tie_word_embeddings", "must be true or false, got \"yes\""}},
      {"{\"model_type\": \"gpt2\", \"vocab_size\": 1000000000000, \"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32}",
       {"vocab_size", "1000000000000", "beyond"}},
      {"{\"model_type\": \"gpt2\", \"vocab_size\": 256, \"n_layer\": 1000000000, \"n_head\": 2, \"n_embd\": 64, \"n_positions\": 64}",
       {"parameters", "layers 1000000000"}},
      {gpt2 + "\"n_embd\": 32, \"layer_norm_epsilon\": \"small\"}", {"layer_norm_epsilon", "finite number"}},
  };
  for (size_t i = 0; i < std::size(strict); i++) {
    const std::string f = dir + strformat("/strict%zu.json", i);
    write_file(f, strict[i].first);
    expect_error([&] { config_from_json_file(f); }, strict[i].second);
  }
  write_file(dir + "/arch.json", "{\"model_type\": \"bert\"}");
  expect_error([&] { config_from_json_file(dir + "/arch.json"); }, {"arch.json", "bert"});
  write_file(dir + "/heads.json", "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 30, "
                                  "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 4}");
  expect_error([&] { config_from_json_file(dir + "/heads.json"); }, {"heads.json", "not divisible"});
  write_file(dir + "/gqa.json", "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 32, "
                                "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
                                "\"num_key_value_heads\": 3}");
  expect_error([&] { config_from_json_file(dir + "/gqa.json"); }, {"gqa.json", "kv heads"});
  // rope_scaling and the rest of Llama 3's and Mistral's fields: what llmt cannot compute exactly is
  // refused by name (rope_scaling used to be refused whole)
  const std::string phi3 = "{\"model_type\": \"phi3\", \"vocab_size\": 10, \"hidden_size\": 32, "
                           "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, ";
  const std::string llama = "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 32, "
                            "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, ";
  const std::pair<std::string, std::vector<std::string>> refused[] = {
      {llama + "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}", {"rope_scaling", "\"yarn\""}},
      {llama + "\"rope_parameters\": {\"rope_type\": \"longrope\", \"rope_theta\": 10000}}",
       {"rope_parameters", "\"longrope\""}},
      {llama + "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, "
               "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 16, \"beta_fast\": 32}}",
       {"\"beta_fast\": 32 is not supported"}},
      {llama + "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8}}", {"low_freq_factor"}},
      {llama + "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 0.5}}", {"factor 0.5 must be at least 1"}},
      {llama + "\"head_dim\": 0}", {"head_dim 0 must be positive"}},
      {"{\"model_type\": \"qwen3\", \"vocab_size\": 10, \"hidden_size\": 32, \"intermediate_size\": 8, "
       "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"mlp_bias\": true}",
       {"\"mlp_bias\": true is not supported"}},
      {"{\"model_type\": \"mistral\", \"vocab_size\": 10, \"hidden_size\": 32, \"intermediate_size\": 8, "
       "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"sliding_window\": 0}",
       {"sliding_window 0 must be positive"}},
      {"{\"model_type\": \"gemma\"}",
       {"\"gemma\" is not supported (gpt2, llama, mistral, qwen2, qwen3, phi3, gemma2, gemma3_text, mixtral, qwen2_moe or "
        "qwen3_moe)"}},
      {llama + "\"attention_bias\": \"yes\"}", {"attention_bias", "must be true or false"}},
      // partial rotary and longrope: Phi-3 only, factor lists of rotary_dim / 2 (8 x 0.75 = 6: 3), the
      // two places of partial_rotary_factor and of original_max_position_embeddings agreeing
      {llama + "\"partial_rotary_factor\": 0.75}", {"\"partial_rotary_factor\": 0.75 is not supported", "phi3"}},
      {llama + "\"rope_parameters\": {\"rope_type\": \"longrope\", \"short_factor\": [1], \"long_factor\": [1]}}",
       {"rope_type \"longrope\" is not supported", "longrope for phi3"}},
      {phi3 + "\"partial_rotary_factor\": 0.625}", {"partial_rotary_factor 0.625 rotates 5 of a head's 8 channels"}},
      {phi3 + "\"partial_rotary_factor\": 0.75, "
       "\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5}}",
       {"partial_rotary_factor 0.75 and the rope parameters' 0.5 disagree"}},
      {phi3 + "\"partial_rotary_factor\": 0.75, \"rope_scaling\": {\"type\": \"longrope\", "
       "\"short_factor\": [1, 2, 3, 4], \"long_factor\": [1, 2, 3]}}",
       {"short_factor and long_factor hold 4 and 3 numbers; expected rotary_dim / 2 = 3"}},
      {phi3 + "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 2, 3, 4], "
       "\"long_factor\": [1, 2, 3, -4]}}", {"long_factor holds -4; expected positive numbers"}},
      {phi3 + "\"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 2, 3, 4]}}",
       {"longrope needs \"long_factor\""}},
      {phi3 + "\"original_max_position_embeddings\": 16, \"rope_scaling\": {\"type\": \"longrope\", "
       "\"short_factor\": [1, 2, 3, 4], \"long_factor\": [1, 2, 3, 4], \"original_max_position_embeddings\": 8}}",
       {"original_max_position_embeddings 8 differs from the top-level 16"}},
      {phi3 + "\"rope_scaling\": {\"type\": \"default\", \"short_factor\": [1, 2, 3, 4]}}",
       {"\"short_factor\"", "is not supported"}},
  };
  for (size_t i = 0; i < std::size(refused); i++) {
    const std::string f = dir + strformat("/refused%zu.json", i);
    write_file(f, refused[i].first);
    expect_error([&] { config_from_json_file(f); }, refused[i].second);
  }
  // both spellings read the same, and what llmt writes back reads the same again
  write_file(dir + "/v4.json", llama + "\"rope_theta\": 500000, \"rope_scaling\": {\"rope_type\": \"llama3\", "
                               "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                               "\"original_max_position_embeddings\": 16}}");
  write_file(dir + "/v5.json", llama + "\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000, "
                               "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                               "\"original_max_position_embeddings\": 16}}");
  for (const char* name : {"/v4.json", "/v5.json"}) {
    ModelConfig c = config_from_json_file(dir + name);
    EXPECT_EQ(c.rope_scaling, "llama3") << name;
    EXPECT_EQ(c.rope_theta, 500000.0f);
    EXPECT_EQ(c.rope_factor, 8.0f);
    EXPECT_EQ(c.rope_original_max, 16);
    write_file(dir + "/back.json", config_to_hf_json(c).dump());
    ModelConfig back = config_from_json_file(dir + "/back.json");
    EXPECT_EQ(config_to_hf_json(back), config_to_hf_json(c));
    EXPECT_EQ(config_to_hf_json(c)["rope_scaling"]["rope_type"], "llama3");
  }
  // Phi-3's longrope and partial rotary as transformers 4 (rope_scaling, top-level
  // partial_rotary_factor, the old name "su") and 5 (rope_parameters) spell them, an explicit
  // attention_factor, and the derived one: sqrt(1 + ln(64 / 8) / ln 8) = sqrt 2
  write_file(dir + "/phi3_v4.json", phi3 + "\"max_position_embeddings\": 64, \"original_max_position_embeddings\": 8, "
                                    "\"partial_rotary_factor\": 0.75, \"rope_scaling\": {\"type\": \"su\", "
                                    "\"short_factor\": [1.0, 1.25, 2.5], \"long_factor\": [1.5, 4, 11]}}");
  write_file(dir + "/phi3_v5.json", phi3 + "\"max_position_embeddings\": 64, \"original_max_position_embeddings\": 8, "
                                    "\"rope_parameters\": {\"rope_type\": \"longrope\", \"partial_rotary_factor\": "
                                    "0.75, \"short_factor\": [1.0, 1.25, 2.5], \"long_factor\": [1.5, 4, 11], "
                                    "\"attention_factor\": 1.25}}");
  for (const char* name : {"/phi3_v4.json", "/phi3_v5.json"}) {
    SCOPED_TRACE(name);
    ModelConfig c = config_from_json_file(dir + name);
    EXPECT_EQ(c.rope_scaling, "longrope");
    EXPECT_EQ(c.rotary_dim(), 6);
    EXPECT_EQ(c.rope_original_max, 8);
    EXPECT_EQ(c.rope_short_factor, (std::vector<float>{1.0f, 1.25f, 2.5f}));
    EXPECT_EQ(c.rope_long_factor, (std::vector<float>{1.5f, 4.0f, 11.0f}));
    EXPECT_FLOAT_EQ(c.longrope_attention_factor(), std::string(name) == "/phi3_v4.json" ? std::sqrt(2.0f) : 1.25f);
    const nlohmann::json j = config_to_hf_json(c);
    EXPECT_EQ(j["original_max_position_embeddings"], 8);
    EXPECT_EQ(j["partial_rotary_factor"], 0.75);
    EXPECT_EQ(j["rope_parameters"]["rope_type"], "longrope");
    write_file(dir + "/back.json", j.dump());
    EXPECT_EQ(config_to_hf_json(config_from_json_file(dir + "/back.json")), j);
  }
  expect_error([&] { config_from_preset("gpt3"); }, {"gpt3", "presets"});
  // head_dim apart from hidden_size / num_attention_heads: q_proj's out and o_proj's in are heads x
  // head_dim; Qwen3's is 128 when the file has none (Qwen3Config's default), and always written back
  write_file(dir + "/head_dim.json", llama + "\"head_dim\": 16}");
  const ModelConfig hd = config_from_json_file(dir + "/head_dim.json");
  EXPECT_EQ(hd.head_size(), 16);
  EXPECT_EQ(hd.q_dim(), 64);
  EXPECT_EQ(config_to_hf_json(hd)["head_dim"], 16);
  const ModelLayout hl = make_layout(hd);
  EXPECT_EQ(hl.units[1].params[1].hf_name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(hl.units[1].params[1].shape, (std::vector<int64_t>{64, 32}));
  write_file(dir + "/qwen3.json", "{\"model_type\": \"qwen3\", \"vocab_size\": 10, \"hidden_size\": 32, "
                                  "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 4}");
  const ModelConfig q3 = config_from_json_file(dir + "/qwen3.json");
  EXPECT_EQ(q3.head_size(), 128);
  EXPECT_TRUE(q3.family.qk_norm);
  EXPECT_FALSE(q3.tied_embeddings);
  EXPECT_EQ(config_to_hf_json(q3)["head_dim"], 128);
  EXPECT_EQ(config_to_hf_json(q3)["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(q3.decoder_layer_class(), "Qwen3DecoderLayer");  // --fsdp_transformer_layer_cls_to_wrap's
  EXPECT_EQ(hd.decoder_layer_class(), "LlamaDecoderLayer");
  // the preset: Qwen3-0.6B's published sizes
  const ModelConfig q06 = config_from_preset("qwen3-0.6b");
  EXPECT_EQ(q06.head_size(), 128);
  EXPECT_EQ(q06.q_dim(), 2048);
  EXPECT_EQ(make_layout(q06).total_numel, 596049920);  // Qwen3-0.6B's parameters, lm_head tied
  // Phi-3-mini-4k's published sizes: 3,821,079,552 parameters (3.8B), its window on every layer, and
  // the config.json a Phi3ForCausalLM reads back
  const ModelConfig phi = config_from_preset("phi3-mini-4k");
  EXPECT_EQ(make_layout(phi).total_numel, 3821079552);
  EXPECT_EQ(phi.window(0), 2047);
  EXPECT_EQ(phi.window(31), 2047);
  const nlohmann::json pj = config_to_hf_json(phi);
  EXPECT_EQ(pj["architectures"][0], "Phi3ForCausalLM");
  EXPECT_EQ(pj["sliding_window"], 2047);
  write_file(dir + "/phi3_preset.json", pj.dump());
  EXPECT_EQ(config_to_hf_json(config_from_json_file(dir + "/phi3_preset.json")), pj);
  // Phi-4-mini's published sizes: 3,836,021,760 parameters (3.8B; lm_head tied), 96 of a head's 128
  // channels rotating, and its config.json read back
  const ModelConfig phi4 = config_from_preset("phi4-mini");
  EXPECT_EQ(make_layout(phi4).total_numel, 3836021760);
  EXPECT_EQ(phi4.head_size(), 128);
  EXPECT_EQ(phi4.rotary_dim(), 96);
  const nlohmann::json p4 = config_to_hf_json(phi4);
  EXPECT_EQ(p4["partial_rotary_factor"], 0.75);
  EXPECT_EQ(p4["rope_parameters"]["partial_rotary_factor"], 0.75);
  write_file(dir + "/phi4_preset.json", p4.dump());
  EXPECT_EQ(config_to_hf_json(config_from_json_file(dir + "/phi4_preset.json")), p4);
  // a config.json of Phi-4-mini's form (transformers 4: rope_scaling of type longrope with 48 factors
  // a set, top-level partial_rotary_factor and original context; the factors here made up): the
  // preset's sizes, 131072 positions, attention factor sqrt(1 + ln 32 / ln 4096)
  nlohmann::json hub = {{"model_type", "phi3"}, {"vocab_size", 200064}, {"hidden_size", 3072},
                        {"intermediate_size", 8192}, {"num_hidden_layers", 32}, {"num_attention_heads", 24},
                        {"num_key_value_heads", 8}, {"max_position_embeddings", 131072},
                        {"original_max_position_embeddings", 4096}, {"partial_rotary_factor", 0.75},
                        {"rope_theta", 10000.0}, {"tie_word_embeddings", true}, {"rms_norm_eps", 1e-5}};
  std::vector<double> shorts, longs;
  for (int i = 0; i < 48; i++) shorts.push_back(1.0 + 0.01 * i), longs.push_back(1.0 + 0.5 * i);
  hub["rope_scaling"] = {{"type", "longrope"}, {"short_factor", shorts}, {"long_factor", longs}};
  write_file(dir + "/phi4_hub.json", hub.dump());
  const ModelConfig ph = config_from_json_file(dir + "/phi4_hub.json");
  EXPECT_EQ(make_layout(ph).total_numel, 3836021760);
  EXPECT_EQ(ph.rotary_dim(), 96);
  EXPECT_EQ(ph.rope_long_factor.size(), 48u);
  EXPECT_FLOAT_EQ(ph.longrope_attention_factor(), (float)std::sqrt(1.0 + std::log(32.0) / std::log(4096.0)));
}

// Issue 23: rope_scaling was ignored whenever rope_parameters was present, even when invalid; a factor
// of 1e300 became inf ("xinf"); rope_theta 0 or negative gave NaN at the first step.
TEST(ModelConfig, RopeFieldsAreCheckedWhicheverSpellingTheyUse) {
  llmt_test::TempDir dir_tmp("hfck");
  std::string dir = dir_tmp.path;
  const std::string llama = "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 32, "
                            "\"intermediate_size\": 8, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, ";
  const std::string l3 = "\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                         "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 16";
  const std::pair<std::string, std::vector<std::string>> refused[] = {
      {llama + "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000}, "
               "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}",
       {"rope_scaling", "\"yarn\" is not supported"}},
      {llama + "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000}, "
               "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 4}}",
       {"rope_scaling", "rope_parameters", "disagree"}},
      {llama + "\"rope_parameters\": {" + l3 + ", \"rope_theta\": 500000}, \"rope_scaling\": {\"rope_type\": "
               "\"llama3\", \"factor\": 4.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
               "\"original_max_position_embeddings\": 16}}",
       {"disagree"}},
      {llama + "\"rope_theta\": 10000, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000}}",
       {"rope_theta 10000 and rope_parameters.rope_theta 500000 disagree"}},
      {llama + "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 1e300}}",
       {"rope_scaling", "\"factor\" is 1e+300, beyond the range of a float"}},
      {llama + "\"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 1e300, \"rope_theta\": 10000}}",
       {"rope_parameters", "\"factor\" is 1e+300"}},
      {llama + "\"rope_theta\": 0}", {"rope_theta must be a positive number, got 0"}},
      {llama + "\"rope_theta\": -10000}", {"rope_theta must be a positive number, got -10000"}},
      {llama + "\"rope_theta\": 1e39}", {"\"rope_theta\" is 1e+39, beyond the range of a float"}},
      {llama + "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 0}}", {"rope_theta must be a positive"}},
  };
  for (size_t i = 0; i < std::size(refused); i++) {
    const std::string f = dir + strformat("/refused%zu.json", i);
    write_file(f, refused[i].first);
    expect_error([&] { config_from_json_file(f); }, refused[i].second);
  }
  // both spellings present and equal (what llmt exports) read as one
  write_file(dir + "/both.json", llama + "\"rope_theta\": 500000, \"rope_scaling\": {" + l3 +
                                     "}, \"rope_parameters\": {" + l3 + ", \"rope_theta\": 500000}}");
  ModelConfig c = config_from_json_file(dir + "/both.json");
  EXPECT_EQ(c.rope_scaling, "llama3");
  EXPECT_EQ(c.rope_factor, 8.0f);
  EXPECT_EQ(c.rope_theta, 500000.0f);
}

// Issue 23's audit of config.json: a field whose other values change the model is implemented or
// refused by name, never ignored. GPT-2's scale_attn_weights false and scale_attn_by_inverse_layer_idx
// true were ignored (loss off by 5e-4 against transformers) and dropped from exports.
TEST(ModelConfig, FieldsThatChangeTheModelAreReadOrRefusedByName) {
  llmt_test::TempDir dir_tmp("hfck");
  const std::string dir = dir_tmp.path;
  const std::string gpt2 = "{\"model_type\": \"gpt2\", \"vocab_size\": 256, \"n_layer\": 2, \"n_head\": 2, "
                           "\"n_embd\": 32, \"n_positions\": 64, ";
  const std::string llama = "{\"model_type\": \"llama\", \"vocab_size\": 10, \"hidden_size\": 32, "
                            "\"intermediate_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, ";
  const std::string mistral = "{\"model_type\": \"mistral\", \"vocab_size\": 10, \"hidden_size\": 32, "
                              "\"intermediate_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, ";
  const std::string qwen2 = "{\"model_type\": \"qwen2\", \"vocab_size\": 10, \"hidden_size\": 32, "
                            "\"intermediate_size\": 8, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, ";
  const std::pair<std::string, std::vector<std::string>> refused[] = {
      {gpt2 + "\"scale_attn_weights\": false}", {"\"scale_attn_weights\": false is not supported"}},
      {gpt2 + "\"scale_attn_by_inverse_layer_idx\": true}",
       {"\"scale_attn_by_inverse_layer_idx\": true is not supported"}},
      {gpt2 + "\"add_cross_attention\": true}", {"\"add_cross_attention\": true is not supported"}},
      {gpt2 + "\"pruned_heads\": {\"0\": [1]}}", {"\"pruned_heads\"", "not supported"}},
      {llama + "\"pruned_heads\": {\"1\": [0, 2]}}", {"\"pruned_heads\""}},
      {gpt2 + "\"initializer_range\": 0}", {"initializer_range must be positive"}},
      {mistral + "\"attention_bias\": true}", {"\"attention_bias\": true is not supported", "without biases"}},
      {mistral + "\"mlp_bias\": true}", {"\"mlp_bias\": true is not supported"}},
      {qwen2 + "\"layer_types\": [\"full_attention\"]}", {"\"layer_types\" must list one kind per layer (2)"}},
      {qwen2 + "\"layer_types\": [\"full_attention\", \"chunked_attention\"]}", {"\"chunked_attention\" is not supported"}},
      {qwen2 + "\"layer_types\": [\"full_attention\", \"sliding_attention\"]}", {"no positive sliding_window"}},
      // transformers' Qwen2 reads sliding_window only with use_sliding_window (and then fails its mask)
      {qwen2 + "\"layer_types\": [\"full_attention\", \"sliding_attention\"], \"sliding_window\": 16}",
       {"no positive sliding_window", "use_sliding_window"}},
      // transformers' Mistral gives every layer its window, whatever layer_types says
      {mistral + "\"sliding_window\": 8, \"layer_types\": [\"full_attention\", \"sliding_attention\"]}",
       {"makes layer 0 full", "ignore layer_types"}},
      {llama + "\"layer_types\": [\"full_attention\", \"sliding_attention\"]}", {"LLaMA has no sliding window"}},
  };
  for (size_t i = 0; i < std::size(refused); i++) {
    const std::string f = dir + strformat("/refused%zu.json", i);
    write_file(f, refused[i].first);
    expect_error([&] { config_from_json_file(f); }, refused[i].second);
  }
  // the defaults spelled out, and fields that change nothing llmt computes, are accepted
  write_file(dir + "/ok.json", gpt2 + "\"scale_attn_weights\": true, \"scale_attn_by_inverse_layer_idx\": false, "
                                      "\"add_cross_attention\": false, \"pruned_heads\": {}, \"reorder_and_upcast_attn\": "
                                      "true, \"initializer_range\": 0.05, \"tie_word_embeddings\": false}");
  ModelConfig c = config_from_json_file(dir + "/ok.json");
  EXPECT_FALSE(c.tied_embeddings);  // GPT-2 with a head of its own (it was tied regardless)
  EXPECT_FLOAT_EQ(c.init_std, 0.05f);
  EXPECT_EQ(config_to_hf_json(c)["tie_word_embeddings"], false);
  ModelConfig t = c;
  t.tied_embeddings = true;
  EXPECT_EQ(make_layout(c).total_numel, make_layout(t).total_numel + 256 * 32);  // lm_head.weight [V, C]
  // per-layer windows: Qwen2's layer_types, else its max_window_layers (Qwen2Config: layers from it
  // on slide), only with use_sliding_window; Mistral's window on every layer
  write_file(dir + "/qwen_sliding.json", qwen2 + "\"layer_types\": [\"full_attention\", \"sliding_attention\"], "
                                                 "\"use_sliding_window\": true, \"sliding_window\": 16}");
  ModelConfig q = config_from_json_file(dir + "/qwen_sliding.json");
  EXPECT_EQ(q.sliding_window, 16);
  EXPECT_EQ(q.layer_window, (std::vector<int>{0, 16}));
  EXPECT_EQ(config_to_hf_json(q)["layer_types"], nlohmann::json({"full_attention", "sliding_attention"}));
  write_file(dir + "/qwen_max_window.json", qwen2 + "\"use_sliding_window\": true, \"sliding_window\": 4, "
                                                    "\"max_window_layers\": 1}");
  EXPECT_EQ(config_from_json_file(dir + "/qwen_max_window.json").layer_window, (std::vector<int>{0, 4}));
  write_file(dir + "/qwen_default_layers.json", qwen2 + "\"use_sliding_window\": true, \"sliding_window\": 4}");
  EXPECT_TRUE(config_from_json_file(dir + "/qwen_default_layers.json").layer_window.empty())
      << "max_window_layers defaults to 28: neither of 2 layers slides";
  write_file(dir + "/qwen_off.json", qwen2 + "\"layer_types\": [\"full_attention\", \"full_attention\"], "
                                             "\"sliding_window\": 16}");
  EXPECT_TRUE(config_from_json_file(dir + "/qwen_off.json").layer_window.empty());
  // Qwen3Config reads its window as Qwen2Config does (layers from max_window_layers on, with
  // use_sliding_window), and a saved config says the same
  std::string qwen3 = qwen2;
  qwen3.replace(qwen3.find("qwen2"), 5, "qwen3");
  write_file(dir + "/qwen3_max_window.json", qwen3 + "\"use_sliding_window\": true, \"sliding_window\": 4, "
                                                     "\"max_window_layers\": 1, \"head_dim\": 8}");
  const ModelConfig q3 = config_from_json_file(dir + "/qwen3_max_window.json");
  EXPECT_EQ(q3.layer_window, (std::vector<int>{0, 4}));
  const nlohmann::json q3_saved = config_to_hf_json(q3);
  EXPECT_EQ(q3_saved["use_sliding_window"], true);
  EXPECT_EQ(q3_saved["sliding_window"], 4);
  EXPECT_EQ(q3_saved["layer_types"], nlohmann::json({"full_attention", "sliding_attention"}));
  write_file(dir + "/qwen3_off.json", qwen3 + "\"use_sliding_window\": false, \"sliding_window\": 4, "
                                              "\"max_window_layers\": 0, \"head_dim\": 8}");
  EXPECT_TRUE(config_from_json_file(dir + "/qwen3_off.json").layer_window.empty());
  write_file(dir + "/mistral_window.json", mistral + "\"sliding_window\": 8}");
  EXPECT_EQ(config_from_json_file(dir + "/mistral_window.json").layer_window, (std::vector<int>{8, 8}));
  write_file(dir + "/mistral_ok.json", mistral + "\"attention_bias\": false, \"mlp_bias\": null}");
  EXPECT_NO_THROW(config_from_json_file(dir + "/mistral_ok.json"));
}

// Weight decay skips every bias and every norm weight, for every family, by what the tensor is: as
// transformers' Trainer does since it matched norms by name (4.49, PR 35927). transformers 4.44
// decided by the norm's class, and its list lacked Qwen2RMSNorm and MistralRMSNorm, so it decayed
// those two families' norm weights (README, Status).
TEST(ModelConfig, WeightDecaySkipsBiasesAndNormWeightsOfEveryFamily) {
  for (const char* type : {"gpt2", "llama", "mistral", "qwen2", "qwen3", "phi3"}) {
    nlohmann::json j = std::string(type) == "gpt2"
                           ? nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 16}, {"n_layer", 2}, {"n_head", 2},
                                            {"n_embd", 8}, {"n_positions", 16}, {"tie_word_embeddings", false}}
                           : nlohmann::json{{"model_type", type}, {"vocab_size", 16}, {"hidden_size", 8},
                                            {"intermediate_size", 12}, {"num_hidden_layers", 2},
                                            {"num_attention_heads", 2}, {"num_key_value_heads", 1}};
    if (std::string(type) == "llama") j["attention_bias"] = j["mlp_bias"] = true;
    const ModelLayout L = make_layout(config_from_json(j, type));
    int decayed = 0, kept = 0;
    for (const UnitLayout& u : L.units)
      for (const ParamSpec& p : u.params) {
        const std::string& n = p.hf_name;
        const bool norm_or_bias = n.find("norm") != std::string::npos || n.find("ln_") != std::string::npos ||
                                  (n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0);
        EXPECT_EQ(p.decay, !norm_or_bias) << type << " " << n;
        (p.decay ? decayed : kept)++;
      }
    EXPECT_GT(decayed, 0) << type;
    EXPECT_GT(kept, 0) << type;
  }
}

// Every tensor of a unit starts 16-byte aligned (kParamAlign elements), but for the parts of one
// fused matrix, which follow each other with no gap; the gaps hold no parameter, so total_numel is
// the parameters alone. Shapes whose sizes are not multiples of 8 (7 heads of 6, vocabulary 17, GQA
// with biases) so that gaps appear.
TEST(ModelConfig, EveryTensorStartsAlignedAndTheFusedPartsFollowEachOther) {
  for (const char* type : {"gpt2", "llama"}) {
    nlohmann::json j = std::string(type) == "gpt2"
                           ? nlohmann::json{{"model_type", "gpt2"}, {"vocab_size", 17}, {"n_layer", 2}, {"n_head", 7},
                                            {"n_embd", 42}, {"n_positions", 9}, {"tie_word_embeddings", false}}
                           : nlohmann::json{{"model_type", type}, {"vocab_size", 17}, {"hidden_size", 42},
                                            {"intermediate_size", 13}, {"num_hidden_layers", 2},
                                            {"num_attention_heads", 7}, {"num_key_value_heads", 1},
                                            {"attention_bias", true}, {"mlp_bias", true}};
    const ModelLayout L = make_layout(config_from_json(j, type));
    int64_t params = 0, gaps = 0;
    for (const UnitLayout& u : L.units) {
      int64_t end = 0;
      for (const ParamSpec& p : u.params) {
        const std::string& n = p.hf_name;
        const bool fused_part = n.find("k_proj") != std::string::npos || n.find("v_proj") != std::string::npos ||
                                n.find("up_proj") != std::string::npos;
        if (fused_part) EXPECT_EQ(p.offset, end) << type << " " << n << " follows the part before it";
        else EXPECT_EQ(p.offset % kParamAlign, 0) << type << " " << n << " at " << p.offset;
        EXPECT_GE(p.offset, end) << type << " " << n << " overlaps";
        gaps += p.offset - end;
        end = p.offset + p.numel();
        params += p.numel();
      }
      EXPECT_EQ(u.numel, end) << type << " " << u.name;
    }
    EXPECT_EQ(L.total_numel, params) << type;
    EXPECT_GT(gaps, 0) << type << ": the shape was meant to leave gaps";
  }
}

TEST(ModelConfig, PresetsMatchPublishedParameterCounts) {
  // Published sizes: GPT-2 124M / 355M / 774M / 1.5B (tied head), LLaMA-7B 6.74B, LLaMA-13B 13.0B.
  auto count = [](const char* name) { return (double)make_layout(config_from_preset(name)).total_numel; };
  EXPECT_EQ(count("gpt2"), 124439808.0);
  EXPECT_EQ(count("gpt2-medium"), 354823168.0);
  EXPECT_EQ(count("gpt2-large"), 774030080.0);
  EXPECT_EQ(count("gpt2-xl"), 1557611200.0);
  EXPECT_EQ(count("llama-7b"), 6738415616.0);
  EXPECT_EQ(count("llama2-7b"), 6738415616.0);
  EXPECT_EQ(count("llama-13b"), 13015864320.0);
  // Llama 3.x, as the safetensors index of each Hugging Face repository gives them (total_size / 2
  // bytes of bf16): 3 8B and 3.1 8B 8,030,261,248; 3.1 70B 70,553,706,496; 3.2 1B 1,235,814,400 and
  // 3.2 3B 3,212,749,824 (tied embeddings)
  EXPECT_EQ(count("llama3-8b"), 8030261248.0);
  EXPECT_EQ(count("llama3.1-8b"), 8030261248.0);
  EXPECT_EQ(count("llama3.1-70b"), 70553706496.0);
  EXPECT_EQ(count("llama3.2-1b"), 1235814400.0);
  EXPECT_EQ(count("llama3.2-3b"), 3212749824.0);
}

TEST(ModelInit, UnitsAndBlocksAreIndependentDraws) {
  // Two blocks' weights must not be shifted copies of each other (a seeding mistake makes them so).
  ModelConfig cfg = config_from_preset("gpt2-small-byte");  // 4 blocks: units 1..4
  ModelLayout L = make_layout(cfg);
  std::vector<float> b0((size_t)L.units[1].numel), b1((size_t)L.units[3].numel);
  init_unit_params(cfg, L.units[1], 1, 42, b0.data());
  init_unit_params(cfg, L.units[3], 3, 42, b1.data());
  int64_t off = L.block.qkv_w, n = 3 * cfg.d_model * cfg.d_model;
  for (int shift = -3; shift <= 3; shift++) {
    int same = 0;
    for (int64_t i = 8; i < n - 8; i++) same += b0[(size_t)(off + i)] == b1[(size_t)(off + i + shift)];
    EXPECT_LT(same, 3) << "block 1 is block 0 shifted by " << shift;
  }
  std::vector<float> again((size_t)L.units[1].numel);
  init_unit_params(cfg, L.units[1], 1, 42, again.data());
  EXPECT_EQ(b0, again);  // deterministic
}

// The sequential definition of the init (one SplitMix64 stream per unit, weights in params order,
// two draws per normal): init_unit_params and any range of init_unit_range give exactly its values,
// so a rank can make only its shard, in parallel, and get what the whole unit would have held.
static std::vector<float> sequential_init(const ModelConfig& cfg, const UnitLayout& unit, int index, uint64_t seed) {
  std::vector<float> out((size_t)unit.numel, 0.0f);
  SplitMix64 rng{stream_state(seed, (uint64_t)index)};
  for (const ParamSpec& p : unit.params) {
    const bool bias = p.hf_name.find("bias") != std::string::npos;
    for (int64_t i = 0; i < p.numel(); i++) {
      float& v = out[(size_t)(p.offset + i)];
      if (p.shape.size() == 1) {
        v = bias ? 0.0f : 1.0f;
      } else {
        const bool proj = cfg.arch == Arch::gpt2 && p.hf_name.find("c_proj.weight") != std::string::npos;
        v = (float)(rng.normal() * (proj ? cfg.init_std / std::sqrt(2.0f * cfg.n_layer) : cfg.init_std));
      }
    }
  }
  return out;
}

TEST(ModelInit, AnyRangeEqualsTheSequentialStream) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    ModelConfig cfg = config_from_preset(preset);
    ModelLayout L = make_layout(cfg);
    std::mt19937 rng(5);
    for (int u : {0, 1}) {
      SCOPED_TRACE(std::string(preset) + " unit " + std::to_string(u));
      const UnitLayout& unit = L.units[(size_t)u];
      const std::vector<float> want = sequential_init(cfg, unit, u, 42);
      std::vector<float> whole((size_t)unit.numel);
      init_unit_params(cfg, unit, u, 42, whole.data());
      EXPECT_EQ(whole, want);
      for (int trial = 0; trial < 20; trial++) {  // shards: random ranges, edges inside and between weights
        int64_t lo = std::uniform_int_distribution<int64_t>(0, unit.numel)(rng);
        int64_t hi = std::uniform_int_distribution<int64_t>(lo, unit.numel)(rng);
        std::vector<float> part((size_t)(hi - lo), -7.0f);
        init_unit_range(cfg, unit, u, 42, lo, hi, part.data());
        ASSERT_TRUE(std::equal(part.begin(), part.end(), want.begin() + lo)) << "[" << lo << ", " << hi << ")";
      }
      EXPECT_THROW(init_unit_range(cfg, unit, u, 42, 0, unit.numel + 1, whole.data()), Error);
    }
  }
}

// What llmt cannot compute exactly at a training length is refused when the model is built for it:
// a sequence beyond the context within which dynamic rope scaling changes nothing. (A sequence beyond
// Mistral's sliding window was refused before attention took the window; it trains now.)
TEST(ModelConfig, LengthsBeyondWhatIsExactAreRefused) {
  auto be = make_cpu_backend(1);
  ModelConfig m = config_from_preset("llama-tiny");
  m.model_type = "mistral";
  m.sliding_window = 16;
  m.layer_window.assign((size_t)m.n_layer, 16);
  EXPECT_NO_THROW(Transformer(m, *be, 1, 17, false));
  ModelConfig d = config_from_preset("llama-tiny");  // context 256
  d.rope_scaling = "dynamic";
  d.rope_factor = 2.0f;
  d.rope_original_max = 64;
  EXPECT_NO_THROW(Transformer(d, *be, 1, 64, false));
  expect_error([&] { Transformer(d, *be, 1, 65, false); }, {"65 exceeds the 64 tokens", "dynamic rope scaling"});
}
