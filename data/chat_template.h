// Chat templates: the Jinja subset that the chat templates of Hugging Face tokenizers use, evaluated
// as transformers' apply_chat_template evaluates them (its Jinja environment: trim_blocks and
// lstrip_blocks on, a template's one trailing newline dropped, loop controls, the `{% generation %}`
// block that marks assistant text, and the globals raise_exception, strftime_now, namespace, dict).
// Our own evaluator, not a library: docs/design.md says why, docs/data.md lists what is supported.
//
// A template is parsed once; a construct outside the subset (a macro, an unknown filter or test or
// method, `{% include %}`, ...) is refused when it is parsed, naming the construct and its line.
// Rendering is deterministic except strftime_now, which reads the clock (or ChatTemplate::set_now).
#pragma once
#include <cstddef>
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace llmt {

struct ChatRender {
  std::string text;
  // [begin, end) byte ranges of text that `{% generation %}` blocks produced, in order
  std::vector<std::pair<size_t, size_t>> generation;
};

class ChatTemplate {
 public:
  // `name` (a file name) prefixes every error. Throws llmt::Error on a syntax error or an unsupported
  // construct: "chat template NAME, line L: ...".
  ChatTemplate(const std::string& source, const std::string& name);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with `vars` (a JSON object: messages, add_generation_prompt, bos_token, ...) as the
  // template's variables. Throws llmt::Error with the template's message on raise_exception, and on
  // errors Jinja raises too (an attribute of an undefined value, adding a string to a number, ...).
  ChatRender render(const nlohmann::ordered_json& vars) const;

  bool has_generation_blocks() const;  // `{% generation %}` appears (TRL's has_generation_markers)
  bool uses_strftime_now() const;      // the output may depend on today's date
  const std::string& source() const;
  // strftime_now's clock: 0 (the default) reads the time at each call, as transformers does.
  void set_now(std::time_t t);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llmt
