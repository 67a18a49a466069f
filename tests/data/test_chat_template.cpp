// Chat templates and chat data: llmt's evaluator against transformers' apply_chat_template on the
// fixtures of tests/reference/make_chat_fixtures.py (text, ids, assistant masks), refusals, and the
// --data_path chat formats (messages, ShareGPT, prompt-completion).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "data/chat_template.h"
#include "data/conversations.h"
#include "data/packing.h"
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

// Stock templates (no {% generation %} blocks): the assistant turns found by rendering each turn's
// prefix equal make_chat_fixtures.py's, computed with transformers' apply_chat_template.
TEST(ChatTemplate, PrefixMasksEqualTransformersOnEveryStockTemplate) {
  std::map<std::string, int> per_template;
  for (const ojson& c : fixtures()["cases"]) {
    if (!c.contains("prefix_masks")) continue;
    const std::string name = c["template"].get<std::string>();
    const std::string what = name + " " + c["conversation"].get<std::string>();
    ChatTemplate t(slurp(kRef + "chat/templates/" + name), name);
    ASSERT_FALSE(t.has_generation_blocks()) << what;
    EXPECT_STREQ(assistant_turns_method(t), "rendering each turn's prefix");
    const std::string text = t.render(c["variables"]).text;
    const Tokenizer& tok = family(c["tokenizer"].get<std::string>());
    const std::vector<int32_t> ids = tok.encode(text);
    ASSERT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << what;
    std::vector<char> m = span_mask(token_offsets(tok, text, ids), assistant_spans_by_prefix(t, c["variables"], text));
    EXPECT_EQ(std::vector<int>(m.begin(), m.end()), c["prefix_masks"].get<std::vector<int>>()) << what;
    per_template[name]++;
  }
  for (const char* name : {"llama3.jinja", "llama3_1.jinja", "llama3_2.jinja", "qwen2_5.jinja", "qwen2.jinja",
                           "mistral_instruct.jinja", "mistral_v0_3.jinja"})
    EXPECT_GE(per_template[name], 4) << name;
}

// Mistral v0.3 writes the system prompt and the tools into the last user message only, so an
// answer's prefix (which ends with a user message) renders differently from the whole conversation:
// the prefix method refuses, as make_chat_fixtures.py found with transformers.
TEST(ChatTemplate, PrefixMethodRefusesTemplatesThatAreNotPrefixConsistent) {
  int n = 0;
  for (const ojson& c : fixtures()["not_prefix_consistent"]) {
    const std::string name = c["template"].get<std::string>();
    ChatTemplate t(slurp(kRef + "chat/templates/" + name), name);
    const std::string text = t.render(c["variables"]).text;
    ASSERT_EQ(text, c["text"].get<std::string>()) << name;
    const std::string e = throws([&] { assistant_spans_by_prefix(t, c["variables"], text); });
    EXPECT_NE(e.find("assistant message"), std::string::npos) << e;
    EXPECT_NE(e.find("--assistant_only_loss False"), std::string::npos) << e;
    n++;
  }
  EXPECT_EQ(n, 3);
}

// The two methods side by side where TRL has a training template of the family: Llama 3's masks are
// the same; Qwen2.5's generation blocks also hold the "\n" after "<|im_start|>assistant", which the
// prefix method leaves to the prompt (the generation prompt ends with it). docs/data.md says so.
TEST(ChatTemplate, PrefixMasksAgainstTheTrainingTemplatesGenerationMasks) {
  int n = 0;
  for (const ojson& c : fixtures()["comparisons"]) {
    const std::string what = c["stock"].get<std::string>() + " " + c["conversation"].get<std::string>();
    ChatTemplate stock(slurp(kRef + "chat/templates/" + c["stock"].get<std::string>()), "stock");
    ChatTemplate training(slurp(kRef + "chat/templates/" + c["training"].get<std::string>()), "training");
    const Tokenizer& tok = family(c["tokenizer"].get<std::string>());
    ojson vars = special_token_vars(tok, kRef + "tokenizers_family/" + c["tokenizer"].get<std::string>());
    for (const ojson& f : fixtures()["cases"])  // the conversation's messages, from any fixture of it
      if (f["conversation"] == c["conversation"]) vars["messages"] = f["variables"]["messages"];
    vars["add_generation_prompt"] = false;
    ChatRender g = training.render(vars);
    const std::string text = stock.render(vars).text;
    ASSERT_EQ(g.text, text) << what;
    const std::vector<int32_t> ids = tok.encode(text);
    ASSERT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << what;
    const auto off = token_offsets(tok, text, ids);
    std::vector<char> pm = span_mask(off, assistant_spans_by_prefix(stock, vars, text)), gm = span_mask(off, g.generation);
    EXPECT_EQ(std::vector<int>(pm.begin(), pm.end()), c["prefix_masks"].get<std::vector<int>>()) << what;
    EXPECT_EQ(std::vector<int>(gm.begin(), gm.end()), c["generation_masks"].get<std::vector<int>>()) << what;
    size_t turns = 0;
    for (const auto& m : vars["messages"]) turns += m["role"] == "assistant";
    for (size_t k = 0; k < ids.size(); k++) {
      EXPECT_TRUE(!pm[k] || gm[k]) << what << " token " << k;  // the prefix mask is within the generation mask
      if (gm[k] && !pm[k]) {
        EXPECT_EQ(c["stock"], "qwen2_5.jinja") << what;
        EXPECT_EQ(tok.decode({ids[k]}), "\n") << what;
      }
    }
    const size_t extra = (size_t)(std::count(gm.begin(), gm.end(), 1) - std::count(pm.begin(), pm.end(), 1));
    EXPECT_EQ(extra, c["stock"] == "qwen2_5.jinja" ? turns : 0) << what;
    n++;
  }
  EXPECT_EQ(n, 8);
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

// Hostile templates (a template is data: it comes with a tokenizer or a --chat_template file): each
// is refused with an error naming the template and the line, quickly, without a crash, an overflow
// (UBSan/ASan builds check), an endless loop or an allocation past the render limits.
TEST(ChatTemplate, HostileTemplatesAreRefusedNamingTheLine) {
  auto rep = [](const std::string& s, int n) {
    std::string o;
    for (int i = 0; i < n; i++) o += s;
    return o;
  };
  const std::vector<std::pair<std::string, std::string>> parse = {
      {"x\n{{ " + rep("(", 100000) + "1" + rep(")", 100000) + " }}", "line 2: nesting deeper than 256 levels"},
      {"{{ " + rep("not ", 100000) + "1 }}", "line 1: nesting deeper than 256 levels"},
      {"{{ " + rep("-", 100000) + "1 }}", "line 1: nesting deeper than 256 levels"},
      {"{{ " + rep("[", 100000) + rep("]", 100000) + " }}", "line 1: nesting deeper than 256 levels"},
      {rep("{% if 1 %}", 50000) + rep("{% endif %}", 50000), "line 1: nesting deeper than 256 levels"},
      {"{{ 1" + rep(" ~ 1", 100000) + " }}", "line 1: an expression nested deeper than 256 levels"},
      {"{{ x" + rep(".a", 100000) + " }}", "line 1: an expression nested deeper than 256 levels"},
      {"{{ x" + rep("|first", 100000) + " }}", "line 1: an expression nested deeper than 256 levels"},
      {"{{ 99999999999999999999 }}", "line 1: the integer 99999999999999999999 does not fit in 64 bits"},
      {"{{ 'a\\xZZ' }}", "line 1: a truncated \\x escape"},
      {"{{ 'a\\x4g' }}", "line 1: a truncated \\x escape"},
      {"\n{{ '\\U00110000' }}", "line 2: a \\U escape of U+110000, not a Unicode scalar value"},
      {"{{ '\\ud800' }}", "line 1: a \\u escape of U+D800"},
      {"{% break %}", "line 1: {% break %} outside a loop"},
      {"{% for x in [] %}{% else %}{% continue %}{% endfor %}", "line 1: {% continue %} outside a loop"},
      {"{% for m in [1] %}{% generation %}{% break %}{% endgeneration %}{% endfor %}", "line 1: {% break %} outside a loop"},
      {"{% set x %}{% break %}{% endset %}", "line 1: {% break %} outside a loop"},
      {"{{ x|round(2, 'common', 3) }}", "line 1: unsupported construct: the filter 'round' with 3 positional arguments"},
      {"{{ x|sort(key=1) }}", "line 1: unsupported construct: the argument 'key' of the filter 'sort'"},
      {"{{ x.splitlines(true) }}", "line 1: unsupported construct: the method .splitlines() with 1 positional arguments"},
      {"{{ x|tojson(indent=2, indent=3) }}", "line 1: the filter 'tojson' got 'indent' twice"},
      {"{{ x is divisibleby(2, 3) }}", "line 1: unsupported construct: the test 'divisibleby' with 2 arguments"},
  };
  for (const auto& [src, msg] : parse) {
    const std::string e = throws([&] { ChatTemplate t(src, "hostile.jinja"); });
    EXPECT_NE(e.find("chat template hostile.jinja, " + msg), std::string::npos) << src.substr(0, 80) << ": " << e;
  }
  const std::vector<std::pair<std::string, std::string>> render = {
      {"a\n{{ 'x' * 1000000000000 }}", "line 2: a string of more than"},
      {"{{ [1] * 1000000000000 }}", "line 1: a list of more than"},
      {"{{ 'x'|indent(100000000000) }}", "line 1: indent's padding of more than"},
      {"{{ {'a': 1}|tojson(indent=1000000000000) }}", "line 1: tojson's indent of more than"},
      {"{{ range(-9223372036854775807, 9223372036854775807) }}", "line 1: range() of more than 100000 numbers"},
      {"{{ (-9223372036854775807 - 1) // -1 }}", "line 1: integer overflow in '//'"},
      {"{{ 9223372036854775807 + 1 }}", "line 1: integer overflow in '+'"},
      {"{{ -(-9223372036854775807 - 1) }}", "line 1: integer overflow in '-'"},
      {"{{ (-9223372036854775807 - 1)|abs }}", "line 1: integer overflow in 'abs'"},
      {"{{ 3 ** 100 }}", "line 1: integer overflow in '**'"},
      {"{{ (1e308 * 10)|int }}", "line 1: int() of inf"},
      {"{{ 'abc'['a':] }}", "line 1: slice indices must be integers or None, not str"},
      {"{% set ns = namespace(s='x') %}\n{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
       "line 2: a string of more than"},
      {"{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}",
       "line 1: a value nested deeper than 256 levels"},
      {"{{ [{'n': 'a'}, {}]|map(attribute='n')|join }}", "line 1: map(attribute='n'): an item has no 'n'"},
      {"{{ '{:>3}'.format(1) }}", "line 1: format(): the field {:>3}"},
      {"{{ x|round(1, 'up') }}", "line 1: round's method must be 'common', 'ceil' or 'floor'"},
      {"{{ 1 is in 1 }}", "line 1: argument of type 'int' is not iterable"},
      {"{% set ns = namespace(a=1) %}{{ 'a' in ns }}", "line 1: argument of type 'namespace' is not iterable"},
  };
  for (const auto& [src, msg] : render) {
    ChatTemplate t(src, "hostile.jinja");
    const std::string e = throws([&] { t.render({{"x", 2.5}}); });
    EXPECT_NE(e.find("chat template hostile.jinja, " + msg), std::string::npos) << src.substr(0, 80) << ": " << e;
  }
  // overflow-prone arithmetic that is fine: clamped slices, counted ranges, a step past the end
  ChatTemplate ok("{{ 'abc'[1::9223372036854775807] }} {{ 'abc'[::-9223372036854775807] }} "
                  "{{ range(9223372036854775806, 9223372036854775807, 5)|length }} {{ 8 is divisibleby(-1) }} "
                  "{{ (-9223372036854775807 - 1) % -1 }} {{ 'ab'|indent(-1, true) }} {{ '' * 99999999999 }}"
                  "{{ [] * 99999999999 }}",
                  "ok.jinja");
  EXPECT_EQ(ok.render(ojson::object()).text, "b c 1 True 0 ab []");
}

// {% break %} inside a {% set %} block inside a loop: the loop stops, the block's output is dropped
// and the outer output is kept (Jinja: "AC"), however the block is left.
TEST(ChatTemplate, BreakInsideASetBlockRestoresTheOutput) {
  ChatTemplate t("A{% for i in [1] %}{% set x %}B{% break %}{% endset %}{% endfor %}C{{ x is defined }}", "t");
  EXPECT_EQ(t.render(ojson::object()).text, "ACFalse");
  ChatTemplate g("{% for i in [1, 2] %}{% generation %}<{{ i }}>{% endgeneration %}{% set y %}{% generation %}"
                 "no{% endgeneration %}{% continue %}{% endset %}{% endfor %}", "g");
  ChatRender r = g.render(ojson::object());
  EXPECT_EQ(r.text, "<1><2>");
  ASSERT_EQ(r.generation.size(), 2u);
  EXPECT_EQ(r.generation[1], std::make_pair(size_t(3), size_t(6)));
}

// A template's loops are bounded: a rendering past kMaxIterations is refused, naming the line.
TEST(ChatTemplate, EndlessLoopsAreRefused) {
  ChatTemplate t("\n\n{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "loop.jinja");
  const std::string e = throws([&] { t.render(ojson::object()); });
  EXPECT_NE(e.find("chat template loop.jinja, line 3: more than 1000000 loop iterations"), std::string::npos) << e;
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

// A stock template trains on the assistant turns by default; one that renders an earlier turn
// differently once later ones follow (here: it drops the reasoning of all but the last answer, as
// reasoning models' templates do) is refused, naming the record, the message and the fixes.
TEST(ChatData, AssistantOnlyLossWithoutGenerationBlocksFindsTheTurnsOrRefuses) {
  const std::string two = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                          "\"content\": \"<think>hm</think>yo\"}, {\"role\": \"user\", \"content\": \"again\"}, "
                          "{\"role\": \"assistant\", \"content\": \"<think>hm</think>yo\"}]}\n";
  TempFile m("m.jsonl", two);
  DataArgs a;
  a.data_path = m.path;
  a.chat_template = kRef + "chat/templates/llama3.jinja";
  a.tokenizer_path = kRef + "tokenizers_family/llama3";
  a.cache_dir = "none";
  const Tokenizer& tok = family("llama3");
  TokenDataset ds = load_chat_dataset(a, RecordFormat::messages, tok, 0);
  ASSERT_EQ(ds.size(), 1);
  std::string trained;
  for (int64_t k = 0; k < ds.length(0); k++)
    if (ds.labels(0)[k] != -100) trained += tok.decode({ds.labels(0)[k]});
  EXPECT_EQ(trained, "<think>hm</think>yo<|eot_id|><think>hm</think>yo<|eot_id|>");

  TempFile drops("drops.jinja",
                 "{%- for m in messages %}{%- if m.role == 'assistant' and not loop.last %}"
                 "{{ '<a>' + m.content.split('</think>')[-1] + '</a>' }}{%- elif m.role == 'assistant' %}"
                 "{{ '<a>' + m.content + '</a>' }}{%- else %}{{ '<u>' + m.content + '</u>' }}{%- endif %}{%- endfor %}"
                 "{%- if add_generation_prompt %}{{ '<a>' }}{%- endif %}");
  TempFile m2("m2.jsonl", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                          "\"content\": \"yo\"}]}\n" + two);
  a.data_path = m2.path;
  a.chat_template = drops.path;
  std::string e = throws([&] { load_chat_dataset(a, RecordFormat::messages, tok, 0); });
  EXPECT_NE(e.find("m2.jsonl: line 2: assistant message 1: the whole conversation renders as"), std::string::npos) << e;
  EXPECT_NE(e.find("it may drop earlier turns' reasoning"), std::string::npos) << e;
  EXPECT_NE(e.find("trl/chat_templates/*_training.jinja"), std::string::npos) << e;
  EXPECT_NE(e.find("--assistant_only_loss False"), std::string::npos) << e;
  a.assistant_only_loss = false;
  EXPECT_EQ(load_chat_dataset(a, RecordFormat::messages, tok, 0).size(), 2);

  // a template that fails on a prefix: one that wants the conversation to end with an answer
  a.assistant_only_loss = true;
  TempFile last("last.jinja", "{%- if messages[-1].role != 'assistant' %}{{ raise_exception('end with an answer') }}"
                              "{%- endif %}{%- for m in messages %}{{ m.content }}{%- endfor %}");
  a.chat_template = last.path;
  a.data_path = m.path;
  e = throws([&] { load_chat_dataset(a, RecordFormat::messages, tok, 0); });
  EXPECT_NE(e.find("m.jsonl: line 1: assistant message 1: the template fails on the 1 message before it (rendered "
                   "with add_generation_prompt=True): chat template"), std::string::npos) << e;
  EXPECT_NE(e.find("end with an answer"), std::string::npos) << e;
}

// Packed chat examples keep their masks: every row's targets are, example by example, what collate
// gives the example alone (the assistant turns' tokens, shifted inside the example), and the
// trained tokens over all rows are the assistant turns of every record.
TEST(ChatData, PackedExamplesKeepTheirAssistantMasks) {
  std::string jsonl;
  for (int i = 0; i < 9; i++) {
    ojson rec = {{"messages", ojson::array()}};
    if (i % 3 == 0) rec["messages"].push_back({{"role", "system"}, {"content", "Be brief."}});
    for (int turn = 0; turn <= i % 3; turn++) {
      rec["messages"].push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + "." + std::to_string(turn)}});
      rec["messages"].push_back({{"role", "assistant"}, {"content", std::string(1 + i % 4, 'a' + (char)turn)}});
    }
    jsonl += rec.dump() + "\n";
  }
  TempFile m("pack.jsonl", jsonl);
  const Tokenizer& tok = family("llama3");
  ChatTemplate t(slurp(kRef + "chat/templates/llama3.jinja"), "llama3.jinja");
  ChatTokenizeOptions opt;
  opt.specials = special_token_vars(tok, kRef + "tokenizers_family/llama3");
  const TokenDataset ds = tokenize_chat(read_chat_records(m.path, RecordFormat::messages), t, tok, opt, nullptr, m.path);
  ASSERT_EQ(ds.size(), 9);
  const PackedRows p = pack_examples(ds, (int)ds.max_length() * 2);
  ASSERT_LT(p.rows.size(), 9u);  // some rows hold several examples
  std::vector<int32_t> tokens, targets, doc;
  std::string trained_packed, trained_alone;
  for (size_t r = 0; r < p.rows.size(); r++) {
    const int T = collate_packed(ds, p, {(int64_t)r}, 0, tokens, targets, doc);
    int at = 0;
    for (int64_t e : p.rows[r]) {
      std::vector<int32_t> tk, tg;
      const int n = collate(ds, {e}, 0, tk, tg);
      ASSERT_EQ(n, ds.length(e));
      for (int k = 0; k < n; k++) {
        EXPECT_EQ(tokens[(size_t)(at + k)], tk[(size_t)k]) << "row " << r << " example " << e << " token " << k;
        EXPECT_EQ(targets[(size_t)(at + k)], tg[(size_t)k]) << "row " << r << " example " << e << " token " << k;
        EXPECT_EQ(doc[(size_t)(at + k)], at);
        if (tg[(size_t)k] != kIgnoreIndex) trained_alone += tok.decode({tg[(size_t)k]});
      }
      at += n;
    }
    ASSERT_LE(at, T);
    for (int k = 0; k < T; k++)
      if (targets[(size_t)k] != kIgnoreIndex) trained_packed += tok.decode({targets[(size_t)k]});
  }
  EXPECT_EQ(trained_packed, trained_alone);
  // each assistant turn is trained on (its answer and <|eot_id|>; the first token is the target of
  // the generation prompt's last), nothing else
  size_t answers = 0;
  for (size_t k = 0; (k = trained_packed.find("<|eot_id|>", k)) != std::string::npos; k++) answers++;
  EXPECT_EQ(answers, 18u);  // 9 records of 1, 2 or 3 turns: 3 * (1 + 2 + 3)
  EXPECT_EQ(trained_packed.find("Question"), std::string::npos);
  EXPECT_EQ(trained_packed.find("user"), std::string::npos);
}

}  // namespace
}  // namespace llmt
