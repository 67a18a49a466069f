#include "models/hf_checkpoint.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "engine/core/error.h"
#include "engine/core/tensor.h"

namespace llmt {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The name under which `spec` is stored in this checkpoint: the official gpt2 files lack the
// "transformer." prefix that save_pretrained writes (GPT-2's naming scheme only).
const StTensor* find_spec(const SafetensorsCheckpoint& ckpt, const ModelConfig& cfg, const ParamSpec& spec,
                          const SafetensorsFile** file) {
  if (const StTensor* t = ckpt.find(spec.hf_name, file)) return t;
  const std::string prefix = "transformer.";
  if (cfg.arch == Arch::gpt2 && spec.hf_name.compare(0, prefix.size(), prefix) == 0)
    return ckpt.find(spec.hf_name.substr(prefix.size()), file);
  return nullptr;
}

// Tensors a Hugging Face file may carry that llmt has no parameter for, and rightly ignores.
// Both are buffers transformers once saved: GPT-2's causal masks, and RoPE's inverse frequencies.
bool skippable(const std::string& name, const ModelConfig& cfg) {
  if (cfg.tied_embeddings && name == "lm_head.weight") return true;
  if (cfg.arch == Arch::gpt2) return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
  return cfg.family.rope && ends_with(name, "rotary_emb.inv_freq");
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

void check_hf_tensors(const SafetensorsCheckpoint& ckpt, const ModelConfig& cfg, const ModelLayout& layout,
                      const std::string& dir) {
  std::set<std::string> used;
  for (const UnitLayout& u : layout.units) {
    for (const ParamSpec& p : u.params) {
      const SafetensorsFile* file = nullptr;
      const StTensor* t = find_spec(ckpt, cfg, p, &file);
      LLMT_CHECK(t, "%s: tensor \"%s\" is missing from the checkpoint (the config says %s)", dir.c_str(),
                 p.hf_name.c_str(), cfg.describe().c_str());
      LLMT_CHECK(t->shape == p.hf_shape(), "%s: tensor \"%s\" has shape %s, but the config needs %s",
                 file->path().c_str(), t->name.c_str(), shape_str(t->shape).c_str(), shape_str(p.hf_shape()).c_str());
      LLMT_CHECK(t->dtype == "F32" || t->dtype == "BF16" || t->dtype == "F16",
                 "%s: tensor \"%s\" has dtype %s (expected F32, BF16 or F16)", file->path().c_str(), t->name.c_str(),
                 t->dtype.c_str());
      used.insert(t->name);
    }
  }
  for (const std::string& name : ckpt.names()) {
    if (used.count(name) || skippable(name, cfg)) continue;
    const SafetensorsFile* file = nullptr;
    ckpt.find(name, &file);
    fail("%s: unexpected tensor \"%s\": a %s model with this config has no such parameter", file->path().c_str(),
         name.c_str(), cfg.arch_name());
  }
}

// A NaN or inf in the weights as loaded trains to NaN at the first step, which says nothing about
// where it came from; here the file and the tensor are known.
static void check_finite(const float* v, int64_t n, const SafetensorsFile& file, const StTensor& t) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++)
    if (!std::isfinite(v[i]) && bad++ == 0) first = i;
  LLMT_CHECK(bad == 0, "%s: tensor \"%s\" holds %lld non-finite value%s (the first, %g, at flat index %lld); a model "
             "loaded with it trains to NaN", file.path().c_str(), t.name.c_str(), (long long)bad, bad == 1 ? "" : "s",
             (double)v[first], (long long)first);
}

void load_hf_unit(const SafetensorsCheckpoint& ckpt, const ModelConfig& cfg, const ModelLayout& layout, int unit,
                  float* host) {
  std::vector<float> tmp;
  for (const ParamSpec& p : layout.units[unit].params) {
    const SafetensorsFile* file = nullptr;
    const StTensor* t = find_spec(ckpt, cfg, p, &file);
    LLMT_CHECK(t && t->shape == p.hf_shape(), "checkpoint tensor \"%s\" is missing or misshapen", p.hf_name.c_str());
    if (!p.hf_transposed) {
      file->read_f32(*t, host + p.offset);
      check_finite(host + p.offset, p.numel(), *file, *t);
      continue;
    }
    // Conv1D: the file holds [in, out]; llmt keeps [out, in].
    const int64_t out = p.shape[0], in = p.shape[1];
    tmp.resize((size_t)p.numel());
    file->read_f32(*t, tmp.data());
    check_finite(tmp.data(), p.numel(), *file, *t);  // flat index as in the file
    float* dst = host + p.offset;
    for (int64_t i = 0; i < in; i++)
      for (int64_t o = 0; o < out; o++) dst[o * in + i] = tmp[(size_t)(i * out + o)];
  }
}

HfExporter::HfExporter(const std::string& dir, const ModelConfig& cfg, const ModelLayout& layout,
                       const std::string& dtype, uint64_t max_shard_bytes)
    : dir_(dir), layout_(layout), dtype_(dtype) {
  LLMT_CHECK(dtype == "F32" || dtype == "BF16" || dtype == "F16", "save: dtype %s is not supported (F32, BF16 or F16)",
             dtype.c_str());
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) fail("cannot create %s: %s", dir.c_str(), std::strerror(errno));
  config_ = config_to_save(cfg, dtype == "BF16" ? "bfloat16" : dtype == "F16" ? "float16" : "float32");
  std::vector<StEntry> entries;
  for (const UnitLayout& u : layout.units) {
    entry_of_.emplace_back();
    for (const ParamSpec& p : u.params) {
      entry_of_.back().push_back(entries.size());
      entries.push_back({p.hf_name, dtype, p.hf_shape(), nullptr});
    }
  }
  writer_ = std::make_unique<SafetensorsModelWriter>(dir, entries, max_shard_bytes);
}

void HfExporter::write_unit(int unit, const float* host) {
  std::vector<float> t;
  std::vector<uint16_t> h;
  const UnitLayout& ul = layout_.units[unit];
  for (size_t k = 0; k < ul.params.size(); k++) {
    const ParamSpec& p = ul.params[k];
    const float* src = host + p.offset;
    if (p.hf_transposed) {  // llmt keeps [out, in]; the file holds Conv1D's [in, out]
      const int64_t out = p.shape[0], in = p.shape[1];
      t.resize((size_t)p.numel());
      for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) t[(size_t)(i * out + o)] = src[o * in + i];
      src = t.data();
    }
    if (dtype_ == "BF16" || dtype_ == "F16") {
      h.resize((size_t)p.numel());
      for (size_t i = 0; i < h.size(); i++) h[i] = dtype_ == "BF16" ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
      if (dtype_ == "F16")  // float16 tops out at 65504: a larger weight would be written as infinity
        for (size_t i = 0; i < h.size(); i++)
          LLMT_CHECK((h[i] & 0x7c00) != 0x7c00 || !std::isfinite(src[i]), "save: tensor \"%s\" element %zu is %g, "
                     "beyond float16's range (65504): save in float32 or bfloat16", p.hf_name.c_str(), i, (double)src[i]);
      writer_->write(entry_of_[unit][k], h.data());
    } else {
      writer_->write(entry_of_[unit][k], src);
    }
  }
}

// config.json last: a save that failed on the way (a weight beyond float16's range, a full disk) left
// config.json and no weights, a directory that looks like a model and is not one.
void HfExporter::finish() {
  writer_->finish();
  write_file_atomic(dir_ + "/config.json", config_.dump(2) + "\n");
}

void save_hf_model(const std::string& dir, const ModelConfig& cfg, const ModelLayout& layout,
                   const std::vector<const float*>& unit_host, const std::string& dtype, uint64_t max_shard_bytes) {
  LLMT_CHECK(unit_host.size() == layout.units.size(), "save: %zu unit buffers for %zu units", unit_host.size(),
             layout.units.size());
  HfExporter ex(dir, cfg, layout, dtype, max_shard_bytes);
  for (size_t u = 0; u < layout.units.size(); u++) ex.write_unit((int)u, unit_host[u]);
  ex.finish();
}

int copy_tokenizer_files(const std::string& src_dir, const std::string& dst_dir) {
  int copied = 0;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "tokenizer.model", "added_tokens.json"}) {
    std::ifstream in(src_dir + "/" + name, std::ios::binary);
    if (!in.good()) continue;
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    write_file_atomic(dst_dir + "/" + name, text);
    copied++;
  }
  return copied;
}

bool write_generation_config(const std::string& src_dir, const std::string& dst_dir, const ModelConfig& cfg) {
  std::ifstream in(src_dir + "/generation_config.json", std::ios::binary);
  if (!src_dir.empty() && in.good()) {
    write_file_atomic(dst_dir + "/generation_config.json",
                      std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
    return true;
  }
  nlohmann::ordered_json g = {{"_from_model_config", true}};
  if (cfg.bos_token_id >= 0) g["bos_token_id"] = cfg.bos_token_id;
  if (cfg.eos_token_ids.size() == 1) g["eos_token_id"] = cfg.eos_token_ids[0];
  if (cfg.eos_token_ids.size() > 1) g["eos_token_id"] = cfg.eos_token_ids;
  write_file_atomic(dst_dir + "/generation_config.json", g.dump(2) + "\n");
  return false;
}

}  // namespace llmt
