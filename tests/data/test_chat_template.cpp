// Chat templates and chat data: llmt's evaluator against transformers' apply_chat_template on the
// fixtures of tests/reference/make_chat_fixtures.py (text, ids, assistant masks), refusals, and the
// --data_path chat formats (messages, ShareGPT, prompt-completion).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "data/chat_template.h"
#include "data/conversations.h"
#include "data/tokenizer.h"
#include "engine/core/error.h"

namespace llmt {
namespace {

using ojson = nlohmann::ordered_json;
const std::string kRef = std::string(LLMT_SOURCE_DIR) + "/tests/reference/";

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
const ojson& fixtures() {
  static const ojson j = ojson::parse(slurp(kRef + "chat/cases.json"));
  return j;
}
const Tokenizer& family(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> toks;
  auto& t = toks[name];
  if (!t) t = load_tokenizer(kRef + "tokenizers_family/" + name);
  return *t;
}
std::string throws(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, EqualsApplyChatTemplateOnEveryFixture) {
  std::map<std::string, std::unique_ptr<ChatTemplate>> tmpls;
  int n = 0, masks = 0;
  for (const ojson& c : fixtures()["cases"]) {
    const std::string name = c["template"].get<std::string>();
    auto& t = tmpls[name];
    if (!t) t = std::make_unique<ChatTemplate>(slurp(kRef + "chat/templates/" + name), name);
    const std::string what = name + " " + c["conversation"].get<std::string>() +
                             (c["variables"]["add_generation_prompt"].get<bool>() ? " +gen" : "");
    ChatRender r = t->render(c["variables"]);
    ASSERT_EQ(r.text, c["text"].get<std::string>()) << what;
    const Tokenizer& tok = family(c["tokenizer"].get<std::string>());
    const std::vector<int32_t> ids = tok.encode(r.text);
    ASSERT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << what;
    EXPECT_EQ(t->has_generation_blocks(), c.contains("assistant_masks")) << what;
    if (c.contains("assistant_masks")) {
      std::vector<char> m = span_mask(token_offsets(tok, r.text, ids), r.generation);
      std::vector<int> got(m.begin(), m.end());
      EXPECT_EQ(got, c["assistant_masks"].get<std::vector<int>>()) << what;
      masks++;
    }
    n++;
  }
  EXPECT_GE(n, 80);
  EXPECT_GE(masks, 20);
}

TEST(ChatTemplate, RaiseExceptionGivesTheTemplatesMessage) {
  for (const ojson& c : fixtures()["raises"]) {
    ChatTemplate t(slurp(kRef + "chat/templates/" + c["template"].get<std::string>()), c["template"]);
    const std::string m = throws([&] { t.render(c["variables"]); });
    EXPECT_NE(m.find(c["message"].get<std::string>()), std::string::npos) << m;
  }
}

TEST(ChatTemplate, UnsupportedConstructsAreRefusedNamingThemAndTheirLine) {
  const std::map<std::string, std::string> want = {
      {"macro.jinja", "line 1: unsupported construct: {% macro %}"},
      {"include.jinja", "line 1: unsupported construct: {% include %}"},
      {"filter.jinja", "line 2: unsupported construct: the filter 'indent2'"},
      {"method.jinja", "line 3: unsupported construct: the method .casefold()"},
      {"test.jinja", "line 1: unsupported construct: the test 'is odd_test'"},
      {"unclosed.jinja", "{% for %} opened at line 1 is never closed"}};
  for (const auto& [file, msg] : want) {
    const std::string m = throws([&] { ChatTemplate(slurp(kRef + "chat/refused/" + file), file); });
    EXPECT_NE(m.find(msg), std::string::npos) << file << ": " << m;
  }
}

TEST(ChatTemplate, StrftimeNowReadsTheClockOrTheGivenTime) {
  ChatTemplate t("{{ strftime_now('%d %b %Y') }}", "t");
  EXPECT_TRUE(t.uses_strftime_now());
  t.set_now(1796601600);  // 2026-12-07 00:00 UTC
  const std::string d = t.render(ojson::object()).text;
  EXPECT_TRUE(d == "07 Dec 2026" || d == "06 Dec 2026") << d;  // the local day
}

// ---- chat data ----

struct TempFile {
  std::string path;
  TempFile(const std::string& name, const std::string& content) {
    path = ::testing::TempDir() + name;
    std::ofstream(path, std::ios::binary) << content;
  }
  ~TempFile() { std::remove(path.c_str()); }
};

TEST(ChatData, DetectsEachFormatAndRefusesMixedOrUnknownRecords) {
  DataArgs a;
  TempFile m("m.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n");
  TempFile s("s.json", "[{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}]}]");
  TempFile p("p.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  TempFile al("a.jsonl", "{\"instruction\": \"a\", \"output\": \"b\"}\n");
  EXPECT_EQ(detect_record_format(m.path, a), RecordFormat::messages);
  EXPECT_EQ(detect_record_format(s.path, a), RecordFormat::sharegpt);
  EXPECT_EQ(detect_record_format(p.path, a), RecordFormat::prompt_completion);
  EXPECT_EQ(detect_record_format(al.path, a), RecordFormat::alpaca);
  TempFile mixed("x.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n\n{\"prompt\": \"a\", "
                            "\"completion\": \"b\"}\n");
  std::string e = throws([&] { detect_record_format(mixed.path, a); });
  EXPECT_NE(e.find("line 3 is prompt-completion"), std::string::npos) << e;
  TempFile unknown("u.jsonl", "{\"question\": \"a\", \"answer\": \"b\"}\n");
  e = throws([&] { detect_record_format(unknown.path, a); });
  EXPECT_NE(e.find("line 1 has keys \"question\", \"answer\""), std::string::npos) << e;
  TempFile bad("b.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"messages\": [{\"from\": "
                          "\"user\"}]}\n");
  e = throws([&] { read_chat_records(bad.path, RecordFormat::messages); });
  EXPECT_NE(e.find("b.jsonl: line 2: message 0 of \"messages\" has keys \"from\""), std::string::npos) << e;
  TempFile who("w.json", "[{\"conversations\": [{\"from\": \"narrator\", \"value\": \"x\"}]}]");
  e = throws([&] { read_chat_records(who.path, RecordFormat::sharegpt); });
  EXPECT_NE(e.find("record 0: turn 0 is from \"narrator\""), std::string::npos) << e;
}

// The fixture's multi-turn conversation as a messages record and as ShareGPT: labels are the ids
// where transformers' assistant mask is 1.
TEST(ChatData, AssistantOnlyLossLabelsAreTheAssistantMask) {
  const ojson* want = nullptr;
  for (const ojson& c : fixtures()["cases"])
    if (c["template"] == "qwen2_5_training.jinja" && c["conversation"] == "multi_turn" &&
        !c["variables"]["add_generation_prompt"].get<bool>())
      want = &c;
  ASSERT_TRUE(want);
  ojson rec = {{"messages", (*want)["variables"]["messages"]}};
  ojson share = {{"conversations", ojson::array()}};
  for (const auto& m : rec["messages"])
    share["conversations"].push_back({{"from", m["role"] == "user" ? "human" : "gpt"}, {"value", m["content"]}});
  TempFile m("m.jsonl", rec.dump() + "\n");
  TempFile s("s.json", "[" + share.dump() + "]");
  ChatTemplate t(slurp(kRef + "chat/templates/qwen2_5_training.jinja"), "qwen2_5_training.jinja");
  const Tokenizer& tok = family("qwen2");
  ChatTokenizeOptions opt;
  opt.specials = special_token_vars(tok, kRef + "tokenizers_family/qwen2");
  const std::vector<int32_t> ids = (*want)["ids"].get<std::vector<int32_t>>();
  const std::vector<int> mask = (*want)["assistant_masks"].get<std::vector<int>>();
  for (auto [path, fmt] : {std::make_pair(m.path, RecordFormat::messages), std::make_pair(s.path, RecordFormat::sharegpt)}) {
    TokenDataset ds = tokenize_chat(read_chat_records(path, fmt), t, tok, opt, nullptr, path);
    ASSERT_EQ(ds.size(), 1);
    ASSERT_EQ(std::vector<int32_t>(ds.ids(0), ds.ids(0) + ds.length(0)), ids);
    for (size_t k = 0; k < ids.size(); k++) EXPECT_EQ(ds.labels(0)[k], mask[k] ? ids[k] : -100) << k;
  }
  opt.assistant_only_loss = false;  // everything
  TokenDataset all = tokenize_chat(read_chat_records(m.path, RecordFormat::messages), t, tok, opt, nullptr, m.path);
  for (int64_t k = 0; k < all.length(0); k++) EXPECT_EQ(all.labels(0)[k], all.ids(0)[k]);
  opt.model_max_length = 10;  // cut, as Alpaca
  TokenDataset cut = tokenize_chat(read_chat_records(m.path, RecordFormat::messages), t, tok, opt, nullptr, m.path);
  EXPECT_EQ(cut.length(0), 10);
}

TEST(ChatData, PromptCompletionTrainsOnTheCompletion) {
  const Tokenizer& tok = family("llama3");
  ChatTemplate t(slurp(kRef + "chat/templates/llama3.jinja"), "llama3.jinja");
  ChatTokenizeOptions opt;
  opt.specials = special_token_vars(tok, kRef + "tokenizers_family/llama3");
  TempFile p("p.jsonl",
             "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"completion\": [{\"role\": "
             "\"assistant\", \"content\": \"4\"}]}\n{\"prompt\": \"The sky is\", \"completion\": \" blue.\"}\n");
  TokenDataset ds = tokenize_chat(read_chat_records(p.path, RecordFormat::prompt_completion), t, tok, opt, nullptr, p.path);
  ASSERT_EQ(ds.size(), 2);
  // conversational: the prompt with the generation prompt is the masked prefix
  const std::string prompt = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n";
  const size_t np = tok.encode(prompt).size();
  for (int64_t k = 0; k < ds.length(0); k++) EXPECT_EQ(ds.labels(0)[k] == -100, k < (int64_t)np) << k;
  EXPECT_EQ(tok.decode(std::vector<int32_t>(ds.ids(0) + np, ds.ids(0) + ds.length(0))), "4<|eot_id|>");
  // plain text: the tokenizer's BOS, then prompt + completion + the EOS text (TRL's add_eos)
  EXPECT_EQ(tok.decode(std::vector<int32_t>(ds.ids(1), ds.ids(1) + ds.length(1))),
            "<|begin_of_text|>The sky is blue.<|end_of_text|>");
  EXPECT_EQ(ds.labels(1)[0], -100);
  EXPECT_EQ(ds.labels(1)[ds.length(1) - 1], tok.eos_id());
}

TEST(ChatData, TemplateIsFoundOrItsAbsenceRefused) {
  std::string origin;
  const std::string e = throws([&] { find_chat_template("", kRef + "tokenizers_family/llama3", &origin); });
  EXPECT_NE(e.find("pass --chat_template FILE"), std::string::npos) << e;
  TempFile cfg("tokenizer_config.json", "{\"chat_template\": \"{{ messages[0].content }}\"}");
  EXPECT_EQ(find_chat_template(cfg.path, "", &origin), "{{ messages[0].content }}");
  EXPECT_EQ(find_chat_template(kRef + "chat/templates/llama3.jinja", "", &origin),
            slurp(kRef + "chat/templates/llama3.jinja"));
}

TEST(ChatData, AssistantOnlyLossWithoutGenerationBlocksIsRefused) {
  TempFile m("m.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                        "\"content\": \"yo\"}]}\n");
  DataArgs a;
  a.data_path = m.path;
  a.chat_template = kRef + "chat/templates/llama3.jinja";
  a.tokenizer_path = kRef + "tokenizers_family/llama3";
  a.cache_dir = "none";
  const std::string e = throws([&] { load_chat_dataset(a, RecordFormat::messages, family("llama3"), 0); });
  EXPECT_NE(e.find("{% generation %} blocks, and the template"), std::string::npos) << e;
  a.assistant_only_loss = false;
  TokenDataset ds = load_chat_dataset(a, RecordFormat::messages, family("llama3"), 0);
  EXPECT_EQ(ds.size(), 1);
}

}  // namespace
}  // namespace llmt
