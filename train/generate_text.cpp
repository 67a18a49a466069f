#include "train/generate_text.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "data/alpaca.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "engine/ckpt/checkpoint.h"
#include "engine/ckpt/train_state.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/log.h"
#include "engine/formats/safetensors.h"
#include "models/generate.h"
#include "models/hf_checkpoint.h"
#include "models/lora.h"
#include "train/export.h"
#include "train/output_path.h"
#include "train/session.h"
#include "train/train_args.h"

namespace llmt {

namespace {

bool is_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A record's string field, or "" when absent or null; anything else is an error naming the line.
std::string text_field(const nlohmann::json& r, const char* key, const std::string& where) {
  if (!r.contains(key) || r[key].is_null()) return "";
  LLMT_CHECK(r[key].is_string(), "%s: \"%s\" is %s, expected a string", where.c_str(), key,
             clip_for_message(r[key].dump()).c_str());
  return r[key].get<std::string>();
}

// transformers' generation_config.json eos_token_id (an id or a list: instruct models stop at
// several), config.json's (also an id or a list), and the tokenizer's own EOS.
std::vector<int32_t> eos_ids(const std::string& dir, const ModelConfig& cfg, const Tokenizer& tok) {
  std::vector<int32_t> ids;
  auto add = [&](long long id) {
    if (id >= 0 && id < cfg.vocab_size && std::find(ids.begin(), ids.end(), (int32_t)id) == ids.end())
      ids.push_back((int32_t)id);
  };
  const std::string path = dir + "/generation_config.json";
  if (is_file(path)) {
    const nlohmann::json j = read_json(path, "generation config");
    LLMT_CHECK(j.is_object(), "%s: not a JSON object", path.c_str());
    if (j.contains("eos_token_id")) {
      const nlohmann::json& e = j["eos_token_id"];
      if (e.is_number_integer()) add(e.get<long long>());
      if (e.is_array())
        for (const auto& v : e)
          if (v.is_number_integer()) add(v.get<long long>());
    }
  }
  for (int id : cfg.eos_token_ids) add(id);
  add(tok.eos_id());
  return ids;
}

std::string describe_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s.empty() ? "none" : s;
}

}  // namespace

// A prompts file is read whole, up to this size: a pipe (--prompts_file <(jq ...)) is fine, /dev/zero
// is not.
constexpr size_t kMaxPromptsFileBytes = 256u << 20;

std::vector<std::string> read_generate_prompts(const GenerateArgs& a) {
  std::vector<std::string> out;
  for (const std::string& p : a.prompts) {
    if (!a.alpaca_template) {
      out.push_back(p);
      continue;
    }
    AlpacaRecord r;
    r.instruction = p;
    out.push_back(alpaca_prompt(r));
  }
  if (a.prompts_file.empty()) return out;
  FILE* f = std::fopen(a.prompts_file.c_str(), "rb");
  LLMT_CHECK(f, "llmt generate: cannot open --prompts_file %s: %s", a.prompts_file.c_str(), std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof(buf), f)) > 0 && text.size() <= kMaxPromptsFileBytes) text.append(buf, got);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  LLMT_CHECK(!bad, "llmt generate: reading %s failed after %zu bytes", a.prompts_file.c_str(), text.size());
  LLMT_CHECK(text.size() <= kMaxPromptsFileBytes, "llmt generate: --prompts_file %s is longer than %zu MiB; split "
             "the prompts into several files", a.prompts_file.c_str(), kMaxPromptsFileBytes >> 20);
  const int64_t invalid = find_invalid_utf8(text);
  if (invalid >= 0) {  // named as the Alpaca reader names it, not as "not a JSON object"
    int64_t line, col;
    line_and_column(text, invalid, &line, &col);
    fail("%s:%lld: invalid UTF-8 at column %lld (byte 0x%02x): prompts must be UTF-8 JSON", a.prompts_file.c_str(),
         (long long)line, (long long)col, (unsigned)(uint8_t)text[(size_t)invalid]);
  }
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    line_no++;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    const std::string where = a.prompts_file + ":" + std::to_string(line_no);
    check_json_depth(line, where);
    nlohmann::json r = nlohmann::json::parse(line, nullptr, false);
    LLMT_CHECK(!r.is_discarded() && r.is_object(), "%s: expected a JSON object ({\"prompt\": ...} or an Alpaca record) "
               "on each line, got: %s", where.c_str(), clip_for_message(line).c_str());
    if (r.contains("prompt")) {
      std::string p = text_field(r, "prompt", where);
      out.push_back(a.alpaca_template ? alpaca_prompt(AlpacaRecord{p, "", ""}) : p);
      continue;
    }
    LLMT_CHECK(r.contains("instruction"), "%s: the record has neither \"prompt\" nor \"instruction\"", where.c_str());
    LLMT_CHECK(a.alpaca_template, "%s: an Alpaca record (\"instruction\"): give --alpaca_template True to format it "
               "as training did (Stanford's PROMPT_DICT), or write {\"prompt\": ...} records", where.c_str());
    AlpacaRecord rec;
    rec.instruction = text_field(r, "instruction", where);
    rec.input = r.contains("input") ? text_field(r, "input", where) : text_field(r, "context", where);
    out.push_back(alpaca_prompt(rec));
  }
  return out;
}

namespace {

// The records' destination: stdout, or --output, made when the first batch is done (every input was
// checked before), each record written and flushed as its batch finishes, so an error or a signal
// later loses none of them.
class RecordWriter {
 public:
  explicit RecordWriter(const std::string& path) : path_(path) {}
  ~RecordWriter() {
    if (f_ && f_ != stdout) std::fclose(f_);
  }
  void write(const std::string& lines, size_t records) {
    if (!f_) {
      f_ = path_.empty() ? stdout : std::fopen(path_.c_str(), "w");
      LLMT_CHECK(f_, "llmt generate: cannot create --output %s: %s", path_.c_str(), std::strerror(errno));
    }
    const bool ok = std::fwrite(lines.data(), 1, lines.size(), f_) == lines.size() && std::fflush(f_) == 0;
    LLMT_CHECK(ok, "llmt generate: writing %s failed after %zu records: %s", name().c_str(), written_,
               std::strerror(errno));
    written_ += records;
  }
  void close() {
    if (!f_ || f_ == stdout) return;
    const int rc = std::fclose(f_);
    f_ = nullptr;
    LLMT_CHECK(rc == 0, "llmt generate: closing %s failed: %s", path_.c_str(), std::strerror(errno));
  }
  std::string name() const { return path_.empty() ? std::string("standard output") : path_; }
  size_t written() const { return written_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  size_t written_ = 0;
};

}  // namespace

// The base model's weights with a PEFT LoRA adapter merged in, unit by unit (load_merged_unit: PEFT's
// merge_and_unload, summed in double), after checking the adapter's tensors against its config. The
// session is the merged model's (merged_model_config: an lm_head copy on a tied base unties it).
static void load_merged_adapter(Session& session, const ModelConfig& base_cfg, const std::string& dir,
                                const std::string& adapter) {
  const LoraConfig lora = read_adapter_config(adapter + "/adapter_config.json");
  const LoraLayout AL = make_lora_layout(base_cfg, lora);
  const ModelLayout BL = make_layout(base_cfg);
  SafetensorsFile file(adapter + "/adapter_model.safetensors");
  check_adapter_tensors(file, AL);
  SafetensorsCheckpoint ckpt(dir);
  check_hf_tensors(ckpt, base_cfg, BL, dir);
  const ModelLayout& L = session.layout();
  std::vector<float> host;
  for (size_t u = 0; u < L.units.size(); u++) {
    host.resize((size_t)L.units[u].numel);
    load_merged_unit(ckpt, base_cfg, BL, file, AL, lora.scaling(), L, (int)u, host.data());
    session.store->set_unit((int)u, host.data());
  }
  log_info("adapter %s merged (r %d, alpha %g, %zu projections a block%s)%s", adapter.c_str(), lora.r, lora.alpha,
           AL.slots.size(), AL.saved.empty() ? "" : ", modules_to_save",
           base_cfg.tied_embeddings && L.root.lm_head != L.root.wte ? "; its modules_to_save copy unties the base's tied lm_head" : "");
}

void run_generate(const GenerateArgs& a, ControlComm& world, const LaunchInfo& launch) {
  LLMT_CHECK(world.size() == 1, "llmt generate runs as one process (%d were started): run it without mpirun or srun",
             world.size());
  LLMT_CHECK(!a.model_name_or_path.empty(), "llmt generate: --model_name_or_path is required (a Hugging Face "
             "directory or a checkpoint)");
  LLMT_CHECK(a.max_new_tokens >= 1, "llmt generate: --max_new_tokens %d, expected at least 1", a.max_new_tokens);
  LLMT_CHECK(a.batch_size >= 1, "llmt generate: --batch_size %d, expected at least 1", a.batch_size);
  LLMT_CHECK(a.temperature > 0, "llmt generate: --temperature %g, expected > 0", a.temperature);
  LLMT_CHECK(a.top_p > 0 && a.top_p <= 1, "llmt generate: --top_p %g, expected in (0, 1]", a.top_p);
  LLMT_CHECK(a.top_k >= 0, "llmt generate: --top_k %d, expected >= 0 (0: off)", a.top_k);
  check_threads(a.threads);
  const std::string& dir = a.model_name_or_path;
  const std::string tok_source = a.tokenizer_name_or_path.empty() ? dir : a.tokenizer_name_or_path;
  // --output over the checkpoint's trainer_state.json, the model's config.json or the prompts file
  // itself was written without a word
  check_output_path("llmt generate", {"--output", a.output}, OutputKind::file,
                    {{"--model_name_or_path", dir},
                     {"--tokenizer_name_or_path", tok_source == "bytes" ? "" : tok_source},
                     {"--prompts_file", a.prompts_file}});
  const std::vector<std::string> texts = read_generate_prompts(a);
  LLMT_CHECK(!texts.empty(), "llmt generate: no prompts: give --prompt TEXT or --prompts_file FILE");

  // the model: a checkpoint's exact training state, or a Hugging Face directory's weights
  const bool checkpoint = is_file(dir + "/state.h5") && is_file(dir + "/manifest.json");
  LLMT_CHECK(!checkpoint || !is_file(dir + "/adapter_config.json"), "llmt generate: %s is a LoRA run's checkpoint (an "
             "adapter): give the base model as --model_name_or_path and it as --adapter_name_or_path", dir.c_str());
  LLMT_CHECK(!checkpoint || a.adapter_name_or_path.empty(), "llmt generate: --adapter_name_or_path goes with the "
             "base model's Hugging Face directory, not a checkpoint");
  if (checkpoint) {
    std::vector<std::string> required = kCheckpointRequiredFiles;
    required.push_back("state.h5");
    verify_checkpoint(dir, required);
  }
  const ModelConfig base_cfg = config_from_json_file(dir + "/config.json");
  const ModelConfig cfg = a.adapter_name_or_path.empty() ? base_cfg : merged_model_config(base_cfg,
      make_lora_layout(base_cfg, read_adapter_config(a.adapter_name_or_path + "/adapter_config.json")));
  const std::unique_ptr<Tokenizer> tok = model_tokenizer(tok_source, a.llama3_special_tokens, cfg);

  // every prompt and batch checked before any runs: a prompt too long for the context in the second
  // batch stopped the run after the first had been decoded, with nothing written
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < texts.size(); i++) {
    prompts.push_back(tok->encode_with_specials(texts[i]));
    LLMT_CHECK(!prompts.back().empty(), "llmt generate: prompt %zu encodes to no tokens", i);
  }
  const size_t nb = (texts.size() + a.batch_size - 1) / a.batch_size;
  std::vector<size_t> longest(nb, 0);  // each batch's longest prompt
  for (size_t i = 0; i < prompts.size(); i++) longest[i / a.batch_size] = std::max(longest[i / a.batch_size], prompts[i].size());
  for (size_t k = 0; k < nb; k++)
    LLMT_CHECK((int64_t)longest[k] + a.max_new_tokens <= cfg.max_seq_len, "llmt generate: prompt of %zu tokens (batch "
               "%zu) and %d new tokens exceed the model's context of %d; lower --max_new_tokens or shorten the prompt",
               longest[k], k + 1, a.max_new_tokens, cfg.max_seq_len);

  SessionSettings ss;  // the store alone, unsharded; each batch sizes its own model
  ss.device = a.device;
  ss.threads = a.threads;
  ss.bf16 = a.bf16;
  ss.strategy = Strategy::no_shard;
  Session session = make_session(world, launch, ss, cfg);
  if (checkpoint)
    load_train_state(dir + "/state.h5", world, session.layout(), *session.store, config_to_hf_json(cfg).dump());
  else if (a.adapter_name_or_path.empty())
    load_hf_parameters(session, cfg, SafetensorsCheckpoint(dir), dir);
  else
    load_merged_adapter(session, base_cfg, dir, a.adapter_name_or_path);

  GenerateOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.do_sample = a.do_sample;
  o.temperature = a.temperature;
  o.top_k = a.top_k;
  o.top_p = (float)a.top_p;
  o.seed = a.seed;
  o.eos_ids = eos_ids(dir, cfg, *tok);
  o.pad_id = o.eos_ids.empty() ? 0 : o.eos_ids[0];
  log_info("generate %s (%s), %zu prompt%s in batches of %d, %s, at most %d new tokens, stopping at %s; %s%s",
           dir.c_str(), cfg.describe().c_str(), texts.size(), texts.size() == 1 ? "" : "s", a.batch_size,
           a.do_sample ? strformat("sampling (temperature %g, top_k %d, top_p %g, seed %llu)", a.temperature, a.top_k,
                                   a.top_p, (unsigned long long)a.seed).c_str()
                       : "greedy",
           a.max_new_tokens, describe_ids(o.eos_ids).c_str(), a.device.c_str(), a.bf16 ? ", bf16" : ", fp32");

  RecordWriter out(a.output);
  GenerateTimes total;
  for (size_t k = 0; k < nb; k++) {
    const size_t first = k * a.batch_size, end = std::min(texts.size(), first + a.batch_size);
    std::vector<std::vector<int32_t>> batch(prompts.begin() + first, prompts.begin() + end);
    const size_t P = longest[k];
    Transformer model(cfg, *session.backend, (int)batch.size(), (int)P);
    const double kv_mib = Transformer::kv_cache_bytes(cfg, (int)batch.size(), (int)P + a.max_new_tokens,
                                                      session.backend->compute_dtype()) / 1048576.0;
    GenerateTimes t;
    std::vector<Generated> got = generate(model, *session.store, batch, o, (int64_t)first, &t);
    std::string jsonl;
    for (size_t i = 0; i < got.size(); i++) {
      nlohmann::ordered_json r;  // keys in this order
      r["index"] = first + i;
      r["prompt"] = texts[first + i];
      r["prompt_tokens"] = batch[i].size();
      r["ids"] = got[i].ids;
      // A model's vocabulary may be larger than its tokenizer's (GPT-2 padded to 50304; an EOS id past
      // the bytes): such ids decode to nothing, as transformers decodes them, instead of ending the run.
      std::vector<int32_t> known;
      for (int32_t id : got[i].ids)
        if (id >= 0 && id < tok->vocab_size()) known.push_back(id);
      r["text"] = tok->decode(known, true);
      r["finish_reason"] = got[i].stopped_at_eos ? "eos" : "length";
      jsonl += r.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
    out.write(jsonl, got.size());
    log_info("batch %zu/%zu: %zu prompt%s of up to %zu tokens, KV cache %.2f MiB; prefill %.0f tokens/s, decode %.1f "
             "tokens/s", k + 1, nb, batch.size(), batch.size() == 1 ? "" : "s", P, kv_mib,
             t.prefill_tokens / std::max(t.prefill_s, 1e-9), t.decode_tokens / std::max(t.decode_s, 1e-9));
    total.prefill_s += t.prefill_s, total.decode_s += t.decode_s;
    total.prefill_tokens += t.prefill_tokens, total.decode_tokens += t.decode_tokens;
  }
  out.close();
  log_info("generated: prefill %lld tokens in %.2f s (%.0f tokens/s), decode %lld tokens in %.2f s (%.1f tokens/s)",
           (long long)total.prefill_tokens, total.prefill_s, total.prefill_tokens / std::max(total.prefill_s, 1e-9),
           (long long)total.decode_tokens, total.decode_s, total.decode_tokens / std::max(total.decode_s, 1e-9));
  if (!a.output.empty()) log_info("wrote %zu records to %s", out.written(), a.output.c_str());
}

}  // namespace llmt
