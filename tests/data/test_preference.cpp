// Preference data for DPO (data/preference.h) against TRL's DPOTrainer, on the fixtures of
// tests/reference/make_dpo_fixtures.py: the ids its _prepare_dataset makes and the sequences its collator
// feeds the model, for every training case (both tiny models, strings and messages, the implicit prompt,
// both truncation modes); bad and edge input as TRL takes it or refused by name.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "data/conversations.h"
#include "data/preference.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"

namespace llmt {
namespace {

using ojson = nlohmann::ordered_json;
const std::string kDpo = std::string(LLMT_SOURCE_DIR) + "/tests/reference/dpo/";

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
const ojson& cases() {
  static const ojson j = ojson::parse(slurp(kDpo + "cases.json"));
  return j["cases"];
}
const ojson& edge_cases() {
  static const ojson j = ojson::parse(slurp(kDpo + "tokenize.json"));
  return j["models"];
}

// a fixture model's tokenizer, its chat template (chat_template.jinja) and the template's special tokens
struct Model {
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ChatTemplate> tmpl;
  ojson specials;
};
const Model& model(const std::string& key) {
  static std::map<std::string, Model> models;
  Model& m = models[key];
  if (!m.tok) {
    m.tok = load_tokenizer(kDpo + key);
    m.tmpl = std::make_unique<ChatTemplate>(slurp(kDpo + key + "/chat_template.jinja"), key);
    m.specials = special_token_vars(*m.tok, kDpo + key);
  }
  return m;
}

std::string throws(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct PrefFile {
  std::string path;
  PrefFile(const std::string& name, const std::string& content) {
    path = ::testing::TempDir() + name;
    std::ofstream(path, std::ios::binary) << content;
  }
  ~PrefFile() { std::remove(path.c_str()); }
};

std::string jsonl(const ojson& records) {
  std::string s;
  for (const ojson& r : records) s += r.dump() + "\n";
  return s;
}

std::vector<int32_t> seq_ids(const TokenDataset& ds, int64_t i) { return {ds.ids(i), ds.ids(i) + ds.length(i)}; }
std::vector<int> seq_mask(const TokenDataset& ds, int64_t i) {
  std::vector<int> m;
  for (int64_t t = 0; t < ds.length(i); t++) m.push_back(ds.labels(i)[t] != kIgnoreIndex);
  return m;
}

PreferenceOptions options_of(const ojson& o) {
  PreferenceOptions opt;
  opt.max_length = o["max_length"].get<int>();
  opt.truncation_mode = parse_truncation_mode(o["truncation_mode"].get<std::string>());
  return opt;
}

// Every training case: the records read from the data file llmt reads, each one's prompt, chosen and
// rejected ids equal to TRL's, and the dataset's sequences equal to what TRL's collator gave the model
// (ids and completion mask), micro-batch by micro-batch.
TEST(Preference, IdsAndSequencesEqualTrlOnEveryTrainingCase) {
  int n = 0, rows = 0;
  for (auto it = cases().begin(); it != cases().end(); ++it) {
    const std::string name = it.key();
    const ojson& c = it.value();
    const Model& m = model(c["model"].get<std::string>());
    const std::vector<PreferenceRecord> recs = read_preference_records(kDpo + c["data"].get<std::string>());
    const ojson& prepared = c["prepared"];
    ASSERT_EQ(recs.size(), prepared.size()) << name;
    for (size_t i = 0; i < recs.size(); i++) {
      const PreferenceIds x = tokenize_preference(recs[i], m.tmpl.get(), *m.tok, m.specials);
      ASSERT_EQ(x.prompt, prepared[i]["prompt_ids"].get<std::vector<int32_t>>()) << name << " record " << i;
      ASSERT_EQ(x.chosen, prepared[i]["chosen_ids"].get<std::vector<int32_t>>()) << name << " record " << i;
      ASSERT_EQ(x.rejected, prepared[i]["rejected_ids"].get<std::vector<int32_t>>()) << name << " record " << i;
    }
    CacheStats st;
    std::vector<int64_t> pairs;
    const TokenDataset ds = tokenize_preferences(recs, m.tmpl.get(), *m.tok, m.specials, options_of(c["config"]), &st,
                                                 name, &pairs);
    ASSERT_EQ(ds.size(), 2 * (int64_t)recs.size()) << name;
    EXPECT_EQ(st.v[0], 1) << name;  // each data set has one pair longer than its max_length
    EXPECT_EQ(st.v[1], 0) << name;
    const int batch = c["config"]["per_device_train_batch_size"].get<int>();
    const ojson& mbs = c["micro_batches"];
    for (size_t k = 0; k < mbs.size(); k++) {
      for (int b = 0; b < batch; b++) {
        const int64_t pair = pairs[k * (size_t)batch + (size_t)b];
        for (int side = 0; side < 2; side++) {
          const ojson& row = mbs[k][side == 0 ? "chosen" : "rejected"][(size_t)b];
          const int64_t s = 2 * pair + side;
          EXPECT_EQ(seq_ids(ds, s), row["input_ids"].get<std::vector<int32_t>>()) << name << " pair " << pair;
          EXPECT_EQ(seq_mask(ds, s), row["completion_mask"].get<std::vector<int>>()) << name << " pair " << pair;
          rows++;
        }
      }
    }
    n++;
  }
  EXPECT_GE(n, 23);
  EXPECT_GE(rows, 23 * 8);
}

// collate() over a micro-batch's chosen and rejected sequences gives TRL's batch: rows chosen first, then
// rejected, and targets != -100 exactly where TRL's shifted completion mask (completion_mask[:, 1:]) is 1.
TEST(Preference, CollatedTargetsAreTrlsShiftedCompletionMask) {
  const ojson& c = cases()["llama_tiny_llama3.conversational"];
  const Model& m = model("llama_tiny_llama3");
  const auto recs = read_preference_records(kDpo + c["data"].get<std::string>());
  const TokenDataset ds = tokenize_preferences(recs, m.tmpl.get(), *m.tok, m.specials, options_of(c["config"]),
                                               nullptr, "conversational");
  const int pad = c["pad_token_id"].get<int>();
  std::vector<int32_t> tokens, targets;
  const int T = collate(ds, {0, 2, 1, 3}, pad, tokens, targets);  // pairs 0, 1: chosen, chosen, rejected, rejected
  const ojson& mb = c["micro_batches"][0];
  std::vector<ojson> rows = {mb["chosen"][0], mb["chosen"][1], mb["rejected"][0], mb["rejected"][1]};
  int64_t with_loss = 0;
  for (int r = 0; r < 4; r++) {
    const auto ids = rows[(size_t)r]["input_ids"].get<std::vector<int32_t>>();
    const auto mask = rows[(size_t)r]["completion_mask"].get<std::vector<int>>();
    for (int t = 0; t < T; t++) {
      const bool in = t + 1 < (int)ids.size() && mask[(size_t)t + 1];
      ASSERT_EQ(targets[(size_t)r * T + t] != kIgnoreIndex, in) << "row " << r << " position " << t;
      if (in) {
        EXPECT_EQ(targets[(size_t)r * T + t], ids[(size_t)t + 1]);
      }
      EXPECT_EQ(tokens[(size_t)r * T + t], t < (int)ids.size() ? ids[(size_t)t] : pad);
      with_loss += in;
    }
  }
  EXPECT_GT(with_loss, 10);
}

// Bad and edge input as TRL's DPOTrainer takes it (tokenize.json): where TRL trains, llmt makes the same
// ids, drops the same records and cuts the same way; where TRL raises, or trains on something no one
// meant (an empty completion list, a user turn as the completion, the prompt's last character moved into
// both completions), llmt refuses the record naming the file, its line and why.
TEST(Preference, EdgeInputAsTrlOrRefusedByName) {
  const std::map<std::string, std::string> refused = {
      {"empty_message_list", "\"chosen\" is an empty list: expected messages"},
      {"implicit_strings_differ_at_start", "chosen and rejected differ from their first character: they share no "
                                           "prompt"},
      {"implicit_strings_identical", "chosen and rejected are the same text"},
      {"implicit_strings_one_prefix_of_other", "chosen is the beginning of rejected"},
      {"implicit_messages_first_differ", "chosen and rejected differ from their first message: they share no prompt"},
      {"implicit_messages_user_turns_differ", "\"chosen\" starts with a \"user\" message, expected \"assistant\""},
      {"implicit_messages_identical", "chosen and rejected are the same messages"},
      {"mixed_prompt_string_messages", "\"prompt\" is a string but \"chosen\" is a list"},
      {"mixed_prompt_messages_strings", "\"prompt\" is a list but \"chosen\" is a string"},
  };
  int compared = 0, refusals = 0;
  for (auto mit = edge_cases().begin(); mit != edge_cases().end(); ++mit) {
    const Model& m = model(mit.key());
    for (auto it = mit.value().begin(); it != mit.value().end(); ++it) {
      const std::string what = mit.key() + " " + it.key();
      const ojson& c = it.value();
      PrefFile f("pref_edge.jsonl", jsonl(c["records"]));
      auto r = refused.find(it.key());
      if (r != refused.end()) {
        const std::string e = throws([&] { read_preference_records(f.path); });
        EXPECT_NE(e.find(f.path + ": line 1: " + r->second), std::string::npos) << what << ": " << e;
        refusals++;
        continue;
      }
      ASSERT_FALSE(c.contains("error")) << what << ": TRL raises " << c["error"] << ", llmt must refuse it";
      const auto recs = read_preference_records(f.path);
      CacheStats st;
      std::vector<int64_t> pairs;
      const TokenDataset ds =
          tokenize_preferences(recs, m.tmpl.get(), *m.tok, m.specials, options_of(c["options"]), &st, what, &pairs);
      const ojson& prepared = c["prepared"];
      ASSERT_EQ(pairs.size(), prepared.size()) << what;  // the records TRL kept
      EXPECT_EQ(st.v[1], (int64_t)(recs.size() - prepared.size())) << what;
      for (size_t i = 0; i < pairs.size(); i++) {
        const PreferenceIds x = tokenize_preference(recs[(size_t)pairs[i]], m.tmpl.get(), *m.tok, m.specials);
        EXPECT_EQ(x.prompt, prepared[i]["prompt_ids"].get<std::vector<int32_t>>()) << what;
        EXPECT_EQ(x.chosen, prepared[i]["chosen_ids"].get<std::vector<int32_t>>()) << what;
        EXPECT_EQ(x.rejected, prepared[i]["rejected_ids"].get<std::vector<int32_t>>()) << what;
        for (int side = 0; side < 2; side++) {
          const ojson& row = c["collated"][side == 0 ? "chosen" : "rejected"][i];
          EXPECT_EQ(seq_ids(ds, 2 * (int64_t)i + side), row["input_ids"].get<std::vector<int32_t>>()) << what;
          EXPECT_EQ(seq_mask(ds, 2 * (int64_t)i + side), row["completion_mask"].get<std::vector<int>>()) << what;
        }
      }
      compared++;
    }
  }
  EXPECT_EQ(refusals, 2 * (int)refused.size());
  EXPECT_GE(compared, 2 * 9);
}

// The cases' facts, spelled out on Llama 3's tokenizer (BOS added to strings, EOS text appended).
TEST(Preference, StringCompletionsGetTheEosAndPromptsTheBos) {
  const Model& m = model("llama_tiny_llama3");
  PrefFile f("pref_eos.jsonl",
             "{\"prompt\": \"The sky is\", \"chosen\": \"\", \"rejected\": \" green.<|end_of_text|>\"}\n");
  const auto recs = read_preference_records(f.path);
  const PreferenceIds x = tokenize_preference(recs[0], nullptr, *m.tok, m.specials);
  ASSERT_FALSE(x.prompt.empty());
  EXPECT_EQ(x.prompt[0], m.tok->bos_id());
  EXPECT_EQ(x.chosen, std::vector<int32_t>{m.tok->eos_id()});  // an empty completion is the EOS alone
  EXPECT_EQ(x.rejected.back(), m.tok->eos_id());
  EXPECT_NE(x.rejected[x.rejected.size() - 2], m.tok->eos_id());  // no second EOS
}

TEST(Preference, SequencesAreCutAsTheCollatorCutsThem) {
  const std::vector<int32_t> p = {1, 2, 3, 4}, c = {5, 6, 7};
  auto check = [&](int max_length, TruncationMode mode, std::vector<int32_t> ids, size_t prompt_len) {
    const PreferenceSequence s = preference_sequence(p, c, max_length, mode);
    EXPECT_EQ(s.ids, ids) << max_length << " " << truncation_mode_name(mode);
    EXPECT_EQ(s.prompt_len, prompt_len) << max_length << " " << truncation_mode_name(mode);
  };
  check(0, TruncationMode::keep_start, {1, 2, 3, 4, 5, 6, 7}, 4);  // no limit
  check(7, TruncationMode::keep_end, {1, 2, 3, 4, 5, 6, 7}, 4);
  check(5, TruncationMode::keep_start, {1, 2, 3, 4, 5}, 4);
  check(3, TruncationMode::keep_start, {1, 2, 3}, 3);
  check(5, TruncationMode::keep_end, {3, 4, 5, 6, 7}, 2);
  check(2, TruncationMode::keep_end, {6, 7}, 0);
  EXPECT_EQ(parse_truncation_mode("keep_end"), TruncationMode::keep_end);
  const std::string e = throws([] { parse_truncation_mode("keep_middle"); });
  EXPECT_NE(e.find("--truncation_mode keep_middle: expected keep_start or keep_end"), std::string::npos) << e;
}

TEST(Preference, ImplicitPromptIsTheCommonBeginningAsTrlExtractsIt) {
  auto strings = [](const std::string& c, const std::string& r) {
    PreferenceRecord x;
    x.implicit_prompt = true;
    x.chosen_text = c, x.rejected_text = r;
    extract_implicit_prompt(x);
    return std::vector<std::string>{x.prompt_text, x.chosen_text, x.rejected_text};
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(strings("The sky is blue.", "The sky is green."), (V{"The sky is", " blue.", " green."}));
  EXPECT_EQ(strings("2+2=4", "2+2=5"), (V{"2+2=", "4", "5"}));
  // characters, not bytes: é (C3 A9) and è (C3 A8) share their first byte
  EXPECT_EQ(strings("caf\xc3\xa9 au lait", "caf\xc3\xa8 noir"), (V{"caf", "\xc3\xa9 au lait", "\xc3\xa8 noir"}));
  EXPECT_NE(throws([&] { strings("", "x"); }).find("chosen is the beginning of rejected"), std::string::npos);
  EXPECT_NE(throws([&] { strings("ab.", "ab"); }).find("rejected is the beginning of chosen"), std::string::npos);
  // messages compare as values: the order of a message's keys does not matter
  PreferenceRecord m;
  m.conversational = m.implicit_prompt = true;
  m.chosen = ojson::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])");
  m.rejected = ojson::parse(R"([{"content": "Hi", "role": "user"}, {"role": "assistant", "content": "Go"}])");
  extract_implicit_prompt(m);
  EXPECT_EQ(m.prompt.size(), 1u);
  EXPECT_EQ(m.chosen[0]["content"], "Hello");
  EXPECT_EQ(m.rejected[0]["content"], "Go");
}

TEST(Preference, BadRecordsAreRefusedNamingFileAndLine) {
  auto refused = [](const std::string& content, const std::string& want) {
    PrefFile f("pref_bad.jsonl", content);
    const std::string e = throws([&] { read_preference_records(f.path); });
    EXPECT_NE(e.find(want), std::string::npos) << "want: " << want << "\ngot: " << e;
    EXPECT_NE(e.find(f.path), std::string::npos) << e;
  };
  const std::string ok = "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n";
  refused("{\"prompt\": \"a\", \"chosen\": \"b\"}\n", "line 1: keys \"prompt\", \"chosen\": expected \"prompt\"");
  refused(ok + "{\"prompt\": null, \"chosen\": \"b\", \"rejected\": \"c\"}\n", "line 2: \"prompt\" is null");
  refused(ok + "{\"prompt\": \"a\", \"chosen\": 3, \"rejected\": \"c\"}\n", "line 2: \"chosen\" is a JSON number");
  refused(ok + "[1]\n", "line 2: a JSON array, expected an object");
  refused(ok + "{\"chosen\": \"ab\", \"rejected\": \"ac\"}\n", "line 2: no \"prompt\" (the implicit form), but line 1 "
          "has one: one file holds one form");
  refused(ok + "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"chosen\": [{\"role\": \"assistant\", "
          "\"content\": \"b\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"c\"}]}\n",
          "line 2: lists of messages, but line 1 holds strings: one file holds one kind");
  refused("{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"chosen\": [{\"content\": \"b\"}], "
          "\"rejected\": [{\"role\": \"assistant\", \"content\": \"c\"}]}\n",
          "line 1: message 0 of \"chosen\" has keys \"content\", expected \"role\"");
  refused("{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\", \"tools\": \"[not json\"}\n",
          "line 1: \"tools\" is a string that is not JSON");
  refused("{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\", \"chat_template_kwargs\": 1}\n",
          "line 1: \"chat_template_kwargs\" is a JSON number, expected an object");
  refused("\n\n", "the file is empty");
  refused("[{\"prompt\": \"a\", \"chosen\": \"b\"}]", "record 0: keys");
}

// load_preference_dataset: through the token cache (written, then mapped) the same dataset as tokenizing
// directly; a pair whose prompt fills max_length is dropped as TRL drops it, and none left is an error.
TEST(Preference, LoadsThroughTheTokenCacheAndDropsAsTrl) {
  const Model& m = model("qwen2_tiny_qwen2");
  DataArgs args;
  args.data_path = kDpo + "data/conversational.jsonl";
  args.tokenizer_path = kDpo + "qwen2_tiny_qwen2";
  args.cache_dir = ::testing::TempDir() + "llmt-preference-cache";
  PreferenceOptions opt;
  opt.max_length = 64;
  const auto recs = read_preference_records(args.data_path);
  const TokenDataset want = tokenize_preferences(recs, m.tmpl.get(), *m.tok, m.specials, opt, nullptr, "x");
  std::string key1, key2;
  for (int pass = 0; pass < 2; pass++) {
    const TokenDataset ds = load_preference_dataset(args, opt, *m.tok, 0, pass ? &key2 : &key1);
    ASSERT_EQ(ds.size(), want.size());
    for (int64_t i = 0; i < ds.size(); i++) {
      EXPECT_EQ(seq_ids(ds, i), seq_ids(want, i));
      EXPECT_EQ(seq_mask(ds, i), seq_mask(want, i));
    }
  }
  EXPECT_EQ(key1, key2);
  opt.max_length = 40;  // two of the four prompts have 40 ids or more (41 and 54)
  std::string key3;
  const TokenDataset kept = load_preference_dataset(args, opt, *m.tok, 0, &key3);
  EXPECT_NE(key3, key1);
  EXPECT_EQ(kept.size(), 2 * 2);
  opt.max_length = 8;
  const std::string e = throws([&] { load_preference_dataset(args, opt, *m.tok, 0); });
  EXPECT_NE(e.find("no pair keeps a completion token within max_length 8"), std::string::npos) << e;
  std::filesystem::remove_all(args.cache_dir);
}

}  // namespace
}  // namespace llmt
