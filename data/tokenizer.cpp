// encode_with_specials, and load_tokenizer: which file format a directory or path holds, and the
// BOS/EOS settings of tokenizer_config.json / special_tokens_map.json on top.
#include "data/tokenizer.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/bpe_bytelevel.h"
#include "data/sentencepiece.h"
#include "data/tiktoken.h"
#include "engine/core/error.h"
#include "engine/core/json_text.h"

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

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  LLMT_CHECK(f.good(), "cannot open %s", path.c_str());
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  check_json_depth(text, path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("%s is not valid JSON: %s", path.c_str(), e.what());  // names line and column
  }
}

std::unique_ptr<Tokenizer> from_tokenizer_json(const std::string& path) {
  nlohmann::json j = read_json(path);
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

std::unique_ptr<Tokenizer> from_rank_or_protobuf(const std::string& path) {
  if (is_tiktoken_file(path)) return load_tiktoken(path);
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
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    return inner_->decode(ids, skip_special);
  }
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
  nlohmann::json cfg = is_file(cfg_path) ? read_json(cfg_path) : nlohmann::json();
  nlohmann::json map = is_file(map_path) ? read_json(map_path) : nlohmann::json();
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

std::unique_ptr<Tokenizer> load_file(const std::string& path) {
  std::string name = base_name(path), dir = dir_name(path);
  if (name == "vocab.json" || name == "merges.txt") {
    std::string vocab = dir + "/vocab.json", merges = dir + "/merges.txt";
    LLMT_CHECK(is_file(vocab) && is_file(merges), "%s: a GPT-2 tokenizer needs both vocab.json and merges.txt in %s",
               path.c_str(), dir.c_str());
    return load_bytelevel_bpe_files(vocab, merges);
  }
  if (name.size() >= 5 && name.compare(name.size() - 5, 5, ".json") == 0) return from_tokenizer_json(path);
  return from_rank_or_protobuf(path);  // tokenizer.model, *.tiktoken, *.model
}

}  // namespace

static std::unique_ptr<Tokenizer> load_tokenizer_unchecked(const std::string& dir_or_file) {
  const std::string& p = dir_or_file;
  if (is_file(p)) return apply_configs(load_file(p), dir_name(p));
  LLMT_CHECK(is_dir(p), "tokenizer path %s does not exist", p.c_str());
  std::unique_ptr<Tokenizer> t;
  if (is_file(p + "/tokenizer.json")) t = from_tokenizer_json(p + "/tokenizer.json");
  else if (is_file(p + "/vocab.json") && is_file(p + "/merges.txt"))
    t = load_bytelevel_bpe_files(p + "/vocab.json", p + "/merges.txt");
  else if (is_file(p + "/tokenizer.model")) t = from_rank_or_protobuf(p + "/tokenizer.model");
  else
    fail("no tokenizer in %s: looked for tokenizer.json, vocab.json + merges.txt, and tokenizer.model "
         "(SentencePiece or tiktoken ranks)", p.c_str());
  return apply_configs(std::move(t), p);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir_or_file) {
  // Every JSON access below is checked and names its file and field; this net turns any that is not
  // into an error naming the tokenizer, never "internal error: [json.exception...]"
  try {
    return load_tokenizer_unchecked(dir_or_file);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: unexpected tokenizer file layout: %s", dir_or_file.c_str(), e.what());
  }
}

}  // namespace llmt
