// encode_with_specials, and load_tokenizer: which file format a directory or path holds, and the
// BOS/EOS settings of tokenizer_config.json / special_tokens_map.json on top.
#include "data/tokenizer.h"

#include <sys/stat.h>

#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "data/bpe_bytelevel.h"
#include "data/byte_tokenizer.h"
#include "data/sentencepiece.h"
#include "data/tiktoken.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"
#include "engine/core/log.h"

namespace llmt {

std::vector<int32_t> Tokenizer::encode_prefix(std::string_view text, size_t max_tokens) const {
  std::vector<int32_t> ids = encode(text);
  if (ids.size() > max_tokens) ids.resize(max_tokens);
  return ids;
}

std::vector<int32_t> Tokenizer::encode_with_specials(std::string_view text) const {
  std::vector<int32_t> ids;
  if (adds_bos() && bos_id() >= 0) ids.push_back(bos_id());
  std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (adds_eos() && eos_id() >= 0) ids.push_back(eos_id());
  return ids;
}

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream f(path, std::ios::binary);
  LLMT_CHECK(f.good(), "cannot open %s %s", what.c_str(), path.c_str());
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  LLMT_CHECK(!f.bad(), "%s: read error in %s", what.c_str(), path.c_str());
  return text;
}

nlohmann::json read_json(const std::string& path, const std::string& what) {
  const std::string text = read_file(path, what);
  check_json_depth(text, path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("%s is not valid JSON: %s", path.c_str(), e.what());  // names line and column
  }
}

namespace {

bool is_file(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_dir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string base_name(const std::string& p) {
  size_t s = p.find_last_of('/');
  return s == std::string::npos ? p : p.substr(s + 1);
}

std::string dir_name(const std::string& p) {
  size_t s = p.find_last_of('/');
  return s == std::string::npos ? "." : s == 0 ? "/" : p.substr(0, s);
}

// Mistral's tekken.json: {"config": {"pattern", "version", ...}, "vocab": [{"rank", "token_bytes"}, ...]}.
bool is_tekken_json(const nlohmann::json& j) {
  return j.is_object() && j.contains("config") && j["config"].is_object() && j["config"].contains("pattern") &&
         j.contains("vocab") && j["vocab"].is_array() && !j.contains("model");
}

[[noreturn]] void refuse_tekken(const std::string& path, const nlohmann::json& j) {
  const nlohmann::json& v = j["config"].contains("version") ? j["config"]["version"] : nlohmann::json();
  fail("%s is Mistral's tekken tokenizer (tekken.json, version %s), a format llmt does not read: its pre-tokenizer "
       "pattern needs Unicode case classes (\\p{Lu}, \\p{Ll}, ...) that llmt's scanners lack. Give a model whose "
       "tokenizer is SentencePiece (tokenizer.model) or a byte-level tokenizer.json with the GPT-2, Llama 3 or Qwen2 "
       "pattern", path.c_str(), clip_for_message(v.dump()).c_str());
}

std::unique_ptr<Tokenizer> from_tokenizer_json(const std::string& path) {
  nlohmann::json j = read_json(path, "JSON file");
  if (is_tekken_json(j)) refuse_tekken(path, j);
  LLMT_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(),
             "%s: expected a Hugging Face tokenizer.json (an object with a \"model\")", path.c_str());
  const nlohmann::json& model = j["model"];
  LLMT_CHECK(!model.contains("type") || model["type"].is_string(), "%s: model.type must be a string such as "
             "\"BPE\", got %s", path.c_str(), clip_for_message(model["type"].dump()).c_str());
  const std::string type = model.contains("type") ? model["type"].get<std::string>() : "";
  if (type == "BPE") {
    if (is_bytelevel_bpe_json(j)) return load_bytelevel_bpe_json(j, path);
    return load_sentencepiece_json(j, path);  // byte_fallback / Metaspace / the legacy LLaMA normalizer
  }
  fail("%s: model type \"%s\" is not supported (llmt reads BPE tokenizers: byte-level as GPT-2, or "
       "SentencePiece-style as LLaMA)", path.c_str(), type.c_str());
}

// Which Llama 3 release the files beside a bare tokenizer.model show, as Meta (original/params.json)
// and Hugging Face (config.json, generation_config.json) lay them out: each file that tells votes,
// and votes that disagree are an error naming them. False when none tells.
bool llama3_release_of_dir(const std::string& dir, Llama3Release* release) {
  std::vector<std::pair<Llama3Release, std::string>> votes;
  auto load = [&](const char* name, nlohmann::json* j) {
    const std::string p = dir + "/" + name;
    if (!is_file(p)) return false;
    *j = read_json(p, "JSON file");
    return j->is_object();
  };
  auto is_int = [](const nlohmann::json& j, const char* key, int64_t v) {
    return j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() == v;
  };
  nlohmann::json j;
  if (load("params.json", &j)) {
    if (j.contains("use_scaled_rope")) votes.push_back({Llama3Release::k3_1, dir + "/params.json has \"use_scaled_rope\""});
    else if (is_int(j, "vocab_size", 128256))
      votes.push_back({Llama3Release::k3_0, dir + "/params.json is a Llama 3 model's without \"use_scaled_rope\""});
  }
  if (load("config.json", &j)) {
    bool llama3_rope = false;
    for (const char* key : {"rope_scaling", "rope_parameters"})
      if (j.contains(key) && j[key].is_object())
        for (const char* type : {"rope_type", "type"})
          llama3_rope = llama3_rope || (j[key].contains(type) && j[key][type] == "llama3");
    if (llama3_rope) votes.push_back({Llama3Release::k3_1, dir + "/config.json has Llama 3.1's \"llama3\" rope scaling"});
    else if (is_int(j, "vocab_size", 128256))
      votes.push_back({Llama3Release::k3_0, dir + "/config.json is a Llama 3 model's without Llama 3.1's rope scaling"});
  }
  if (load("generation_config.json", &j) && j.contains("eos_token_id") && j["eos_token_id"].is_array())
    for (const nlohmann::json& e : j["eos_token_id"])
      if (e.is_number_integer() && e.get<int64_t>() == 128008) {
        votes.push_back({Llama3Release::k3_1, dir + "/generation_config.json stops at <|eom_id|> (128008)"});
        break;
      }
  if (votes.empty()) return false;
  for (const auto& v : votes)
    LLMT_CHECK(v.first == votes[0].first, "which Llama 3 release is %s/tokenizer.model? %s (3.1), but %s (3.0): give "
               "--llama3_special_tokens 3.0 or 3.1", dir.c_str(),
               (votes[0].first == Llama3Release::k3_1 ? votes[0] : v).second.c_str(),
               (votes[0].first == Llama3Release::k3_1 ? v : votes[0]).second.c_str());
  *release = votes[0].first;
  return true;
}

std::unique_ptr<Tokenizer> from_rank_or_protobuf(const std::string& path, const std::string& llama3) {
  if (is_tiktoken_file(path)) {
    Llama3Release release = llama3 == "3.1" ? Llama3Release::k3_1 : Llama3Release::k3_0;
    const bool told = llama3 == "auto" && llama3_release_of_dir(dir_name(path), &release);
    std::unique_ptr<Tokenizer> t = load_tiktoken(path, release);
    // no line when the files told (llmt tokenize's stdout is the ids alone); a warning when none did
    if (llama3 == "auto" && t->vocab_size() == 128256 && !told)
      log_warn("%s: Llama 3 ranks, and no params.json, config.json or generation_config.json beside it says which "
               "release: Llama 3.0's special token names (--llama3_special_tokens 3.1 for those of 3.1, 3.2 and "
               "3.3: <|finetune_right_pad_id|>, <|eom_id|>, <|python_tag|>)", path.c_str());
    return t;
  }
  // A tokenizer.model tokenizes as the sentencepiece library (how LLaMA was trained), not as
  // transformers 5 rebuilds it: see docs/tokenizers.md, "SentencePiece".
  if (is_sentencepiece_model_file(path)) return load_sentencepiece_model(path, SentencePieceFlavor::kScoreMerges);
  fail("%s is neither a tiktoken rank file (`base64 rank` lines) nor a SentencePiece model protobuf", path.c_str());
}

// BOS/EOS ids and add_bos/add_eos as tokenizer_config.json and special_tokens_map.json set them,
// over what the tokenizer file itself implies.
class ConfiguredTokenizer : public Tokenizer {
 public:
  ConfiguredTokenizer(std::unique_ptr<Tokenizer> inner, int bos, int eos, bool add_bos, bool add_eos)
      : inner_(std::move(inner)), bos_(bos), eos_(eos), add_bos_(add_bos), add_eos_(add_eos) {}
  std::vector<int32_t> encode(std::string_view text) const override { return inner_->encode(text); }
  std::vector<int32_t> encode_prefix(std::string_view text, size_t max_tokens) const override {
    return inner_->encode_prefix(text, max_tokens);
  }
  size_t min_ids_for_bytes(size_t bytes) const override { return inner_->min_ids_for_bytes(bytes); }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    return inner_->decode(ids, skip_special);
  }
  std::string token_bytes(int32_t id) const override { return inner_->token_bytes(id); }
  int vocab_size() const override { return inner_->vocab_size(); }
  int bos_id() const override { return bos_; }
  int eos_id() const override { return eos_; }
  bool adds_bos() const override { return add_bos_; }
  bool adds_eos() const override { return add_eos_; }
  std::string kind() const override { return inner_->kind(); }

 private:
  std::unique_ptr<Tokenizer> inner_;
  int bos_, eos_;
  bool add_bos_, add_eos_;
};

// "bos_token": "<s>" | {"content": "<s>", ...} | null. Sets *id (-1 for null); false when absent.
// *id comes in as the tokenizer's own id for that role and stays when it is that token.
bool special_token_id(const Tokenizer& t, const nlohmann::json& cfg, const char* key, const std::string& path,
                      int* id) {
  if (!cfg.is_object() || !cfg.contains(key)) return false;
  const nlohmann::json& v = cfg[key];
  if (v.is_null()) {
    *id = -1;
    return true;
  }
  std::string content;
  if (v.is_string()) content = v.get<std::string>();
  else if (v.is_object() && v.contains("content") && v["content"].is_string()) content = v["content"].get<std::string>();
  else fail("%s: \"%s\" should be a token string or {\"content\": ...}, got %s", path.c_str(), key, clip_for_message(v.dump()).c_str());
  if (*id >= 0 && *id < t.vocab_size() && t.decode({*id}) == content) return true;  // the tokenizer's own choice
  std::vector<int32_t> ids = t.encode(content);  // special tokens are split out whole
  LLMT_CHECK(ids.size() == 1, "%s: %s \"%s\" is not a single token of the tokenizer (it encodes to %zu ids)",
             path.c_str(), key, content.c_str(), ids.size());
  *id = ids[0];
  return true;
}

std::unique_ptr<Tokenizer> apply_configs(std::unique_ptr<Tokenizer> t, const std::string& dir) {
  std::string cfg_path = dir + "/tokenizer_config.json", map_path = dir + "/special_tokens_map.json";
  nlohmann::json cfg = is_file(cfg_path) ? read_json(cfg_path, "JSON file") : nlohmann::json();
  nlohmann::json map = is_file(map_path) ? read_json(map_path, "JSON file") : nlohmann::json();
  if (cfg.is_null() && map.is_null()) return t;
  int bos = t->bos_id(), eos = t->eos_id();
  bool add_bos = t->adds_bos(), add_eos = t->adds_eos();
  if (!special_token_id(*t, cfg, "bos_token", cfg_path, &bos)) special_token_id(*t, map, "bos_token", map_path, &bos);
  if (!special_token_id(*t, cfg, "eos_token", cfg_path, &eos)) special_token_id(*t, map, "eos_token", map_path, &eos);
  for (const char* key : {"add_bos_token", "add_eos_token"}) {
    if (!cfg.is_object() || !cfg.contains(key) || cfg[key].is_null()) continue;
    LLMT_CHECK(cfg[key].is_boolean(), "%s: \"%s\" should be true or false, got %s", cfg_path.c_str(), key,
               clip_for_message(cfg[key].dump()).c_str());
    (key[4] == 'b' ? add_bos : add_eos) = cfg[key].get<bool>();
  }
  if (bos == t->bos_id() && eos == t->eos_id() && add_bos == t->adds_bos() && add_eos == t->adds_eos()) return t;
  return std::make_unique<ConfiguredTokenizer>(std::move(t), bos, eos, add_bos, add_eos);
}

std::unique_ptr<Tokenizer> load_file(const std::string& path, const std::string& llama3) {
  std::string name = base_name(path), dir = dir_name(path);
  if (name == "vocab.json" || name == "merges.txt") {
    std::string vocab = dir + "/vocab.json", merges = dir + "/merges.txt";
    LLMT_CHECK(is_file(vocab) && is_file(merges), "%s: a GPT-2 tokenizer needs both vocab.json and merges.txt in %s",
               path.c_str(), dir.c_str());
    return load_bytelevel_bpe_files(vocab, merges);
  }
  if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".json") == 0) return from_tokenizer_json(path);
  return from_rank_or_protobuf(path, llama3);  // tokenizer.model, *.tiktoken, *.model
}

}  // namespace

static std::unique_ptr<Tokenizer> load_tokenizer_unchecked(const std::string& dir_or_file, const std::string& llama3) {
  LLMT_CHECK(llama3 == "auto" || llama3 == "3.0" || llama3 == "3.1",
             "--llama3_special_tokens must be auto, 3.0 or 3.1, got \"%s\"", llama3.c_str());
  const std::string& p = dir_or_file;
  std::unique_ptr<Tokenizer> t;
  if (p == "bytes") {  // the name every command takes (a directory called "bytes" is ./bytes)
    t = make_byte_tokenizer();
  } else if (is_file(p)) {
    t = apply_configs(load_file(p, llama3), dir_name(p));
  } else {
    LLMT_CHECK(is_dir(p), "tokenizer path %s does not exist", p.c_str());
    if (is_file(p + "/tokenizer.json")) t = from_tokenizer_json(p + "/tokenizer.json");
    else if (is_file(p + "/vocab.json") && is_file(p + "/merges.txt"))
      t = load_bytelevel_bpe_files(p + "/vocab.json", p + "/merges.txt");
    else if (is_file(p + "/tokenizer.model")) t = from_rank_or_protobuf(p + "/tokenizer.model", llama3);
    else if (is_file(p + "/tekken.json")) t = from_tokenizer_json(p + "/tekken.json");  // refused, naming the format
    else
      fail("no tokenizer in %s: looked for tokenizer.json, vocab.json + merges.txt, and tokenizer.model "
           "(SentencePiece or tiktoken ranks)", p.c_str());
    t = apply_configs(std::move(t), p);
  }
  LLMT_CHECK(llama3 == "auto" || (t->kind() == "tiktoken" && t->vocab_size() == 128256),
             "--llama3_special_tokens %s names the special tokens of Llama 3's tokenizer.model (128000 tiktoken ranks), "
             "but %s is a %s tokenizer of %d ids", llama3.c_str(), p.c_str(), t->kind().c_str(), t->vocab_size());
  return t;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir_or_file, const std::string& llama3) {
  // Every JSON access below is checked and names its file and field; this net turns any that is not
  // into an error naming the tokenizer, never "internal error: [json.exception...]"
  try {
    return load_tokenizer_unchecked(dir_or_file, llama3);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: unexpected tokenizer file layout: %s", dir_or_file.c_str(), e.what());
  }
}

}  // namespace llmt
