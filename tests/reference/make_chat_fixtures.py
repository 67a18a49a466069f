#!/usr/bin/env python3
"""Reference renderings of chat templates (data/chat_template.h, data/conversations.h), made with
transformers' apply_chat_template: its Jinja environment (trim_blocks, lstrip_blocks, loop controls,
the {% generation %} tracker, raise_exception, strftime_now, namespace), the tokenization it does
(add_special_tokens=False) and its assistant masks (return_assistant_tokens_mask).

    pip install transformers tokenizers jinja2
    python3 tests/reference/make_chat_fixtures.py

Templates (tests/reference/chat/templates/, committed; README.md there names their sources) are
rendered over the conversations below with the tiny family tokenizers of
tests/reference/tokenizers_family/. Writes tests/reference/chat/cases.json: for each case the
template, tokenizer, variables, the rendered text, the ids, and for templates with {% generation %}
blocks the assistant mask (transformers' return_assistant_tokens_mask), for the others the assistant
mask llmt makes without {% generation %} blocks (prefix_masks: each assistant message's text found by
rendering the messages before it with add_generation_prompt=True and the messages up to it without,
the turn being the difference, masked with transformers' overlap rule); the two methods side by side
where TRL has a training template of the same family (comparisons); and for each template of refused/ nothing but its name (llmt refuses it;
the test checks the message). Each rendering is also checked to equal plain Jinja2's with the same
environment settings, so the fixture states Jinja's semantics, not only transformers'.
"""
import json
import os

import jinja2
import transformers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from transformers import AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "chat")
TEMPLATES = os.path.join(OUT, "templates")
FAMILY = os.path.join(HERE, "tokenizers_family")

SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
CONVERSATIONS = {
    "one_turn": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}],
    "system": [SYSTEM, {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
    "multi_turn": [
        {"role": "user", "content": "  Hello there!\n"},
        {"role": "assistant", "content": "Hi. How can I help?  "},
        {"role": "user", "content": "Say 'yo'."},
        {"role": "assistant", "content": "yo"},
    ],
    "unicode": [
        {"role": "user", "content": "\u3000caf\u00e9 \u2014 \u00fcber na\u00efve \U0001F600\n\n"},
        {"role": "assistant", "content": "Ja: \u00e9t\u00e9, \u65e5\u672c\u8a9e.\u00a0"},
    ],
    "prompt_only": [SYSTEM, {"role": "user", "content": "Continue: once upon a time"}],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string", "description": "The city"}},
                                               "required": ["city"]}}}]

# (template file, tokenizer family, conversations, extra variables)
ALL = list(CONVERSATIONS)
CASES = [
    ("llama3.jinja", "llama3", ALL, {}),
    ("llama3_1.jinja", "llama3", ALL, {"date_string": "26 Jul 2024"}),
    ("llama3_1.jinja", "llama3", ["one_turn"], {"date_string": "26 Jul 2024", "tools": TOOLS}),
    ("llama3_2.jinja", "llama3", ALL, {"date_string": "07 Dec 2026"}),
    ("llama3_training.jinja", "llama3", ALL, {}),
    ("qwen2_5.jinja", "qwen2", ALL, {}),
    ("qwen2_5.jinja", "qwen2", ["system"], {"tools": TOOLS}),
    ("qwen2_5_training.jinja", "qwen2", ALL, {}),
    ("mistral_instruct.jinja", "mistral", ["one_turn", "system", "multi_turn", "unicode", "prompt_only"], {}),
    ("mistral_v0_3.jinja", "mistral", ALL, {}),
    ("mistral_v0_3.jinja", "mistral", ["one_turn"], {"tools": TOOLS}),
    ("qwen2.jinja", "qwen2", ALL, {}),
    ("constructs.jinja", "llama3", ALL, {}),
]
# conversations a template refuses with raise_exception: (template, family, messages, message)
RAISES = [
    ("mistral_instruct.jinja", "mistral",
     [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
     "After the optional system message, conversation roles must alternate user/assistant/user/assistant/..."),
]


# conversations whose turns a template does not render the same whatever follows, so the prefix
# method refuses them: (template, family, messages, extra variables). Mistral v0.3 puts the system
# prompt, and the tools, into the last user message only (so with a system prompt no conversation
# that ends with an answer is consistent: the answer's prefix ends with a user message, which then
# carries the system prompt).
NOT_PREFIX_CONSISTENT = [
    ("mistral_v0_3.jinja", "mistral", CONVERSATIONS["system"], {}),
    ("mistral_v0_3.jinja", "mistral", [SYSTEM] + CONVERSATIONS["multi_turn"], {}),
    ("mistral_v0_3.jinja", "mistral", CONVERSATIONS["multi_turn"], {"tools": TOOLS}),
]

# stock templates whose prefix masks are compared with TRL's {% generation %} training variants
TRAINING_VARIANTS = [("llama3.jinja", "llama3_training.jinja", "llama3"),
                     ("qwen2_5.jinja", "qwen2_5_training.jinja", "qwen2")]


def overlap_mask(tok, text, spans):
    """transformers' return_assistant_tokens_mask rule: a token is in the mask when it overlaps a span"""
    enc = tok(text, add_special_tokens=False)
    mask = [0] * len(enc["input_ids"])
    s = 0
    for t, (start, end) in enumerate(enc.encodings[0].offsets):
        while s < len(spans) and start >= spans[s][1]:
            s += 1
        if s == len(spans):
            break
        if end > spans[s][0]:
            mask[t] = 1
    return mask


def prefix_spans(tok, tmpl, messages, kw):
    """each assistant message's text: the rendering up to it after the rendering of what precedes it
    with add_generation_prompt=True; both must be prefixes of the whole rendering"""
    full = tok.apply_chat_template(messages, chat_template=tmpl, tokenize=False, **kw)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        p = tok.apply_chat_template(messages[:i], chat_template=tmpl, tokenize=False, add_generation_prompt=True,
                                    **kw)
        q = tok.apply_chat_template(messages[:i + 1], chat_template=tmpl, tokenize=False, **kw)
        assert q.startswith(p) and full.startswith(q), (i, p, q)
        if len(q) > len(p):
            spans.append((len(p), len(q)))
    return full, spans


def jinja_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


def main():
    env = jinja_env()
    toks = {f: AutoTokenizer.from_pretrained(os.path.join(FAMILY, f)) for f in ("llama3", "qwen2", "mistral")}
    cases = []
    for tmpl_name, family, convs, extra in CASES:
        tmpl = open(os.path.join(TEMPLATES, tmpl_name), encoding="utf-8").read()
        tok = toks[family]
        generation = "{% generation %}" in tmpl or "{%- generation %}" in tmpl
        for conv in convs:
            messages = CONVERSATIONS[conv]
            for agp in (False, True):
                kw = dict(extra)
                text = tok.apply_chat_template(messages, chat_template=tmpl, tokenize=False,
                                               add_generation_prompt=agp, **kw)
                out = tok.apply_chat_template(messages, chat_template=tmpl, tokenize=True, return_dict=True,
                                              add_generation_prompt=agp, return_assistant_tokens_mask=generation, **kw)
                # the variables the template saw: transformers passes the special tokens it has
                variables = {"messages": messages, "add_generation_prompt": agp, **kw}
                for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
                    value = getattr(tok, name, None)
                    if value is not None:
                        variables[name] = str(value)
                variables.setdefault("tools", None)
                variables.setdefault("documents", None)
                plain = env.from_string(tmpl.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
                                        .replace("{% generation %}", "").replace("{% endgeneration %}", ""))
                assert plain.render(**variables) == text, (tmpl_name, conv)
                case = {"template": tmpl_name, "tokenizer": family, "conversation": conv, "variables": variables,
                        "text": text, "ids": list(out["input_ids"])}
                if generation:
                    case["assistant_masks"] = list(out["assistant_masks"])
                elif (not agp and any(m["role"] == "assistant" for m in messages) and tmpl_name != "constructs.jinja"
                      and not any(t == tmpl_name and m == messages and k == kw
                                  for t, _, m, k in NOT_PREFIX_CONSISTENT)):
                    full, spans = prefix_spans(tok, tmpl, messages, kw)
                    assert full == text
                    case["prefix_masks"] = overlap_mask(tok, text, spans)
                cases.append(case)
    comparisons = []
    for stock, training, family in TRAINING_VARIANTS:
        tok = toks[family]
        t_stock = open(os.path.join(TEMPLATES, stock), encoding="utf-8").read()
        t_train = open(os.path.join(TEMPLATES, training), encoding="utf-8").read()
        for conv, messages in CONVERSATIONS.items():
            if not any(m["role"] == "assistant" for m in messages):
                continue
            text, spans = prefix_spans(tok, t_stock, messages, {})
            out = tok.apply_chat_template(messages, chat_template=t_train, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            assert tok.apply_chat_template(messages, chat_template=t_train, tokenize=False) == text
            prefix = overlap_mask(tok, text, spans)
            generation = list(out["assistant_masks"])
            ids = list(out["input_ids"])
            comparisons.append({
                "stock": stock, "training": training, "tokenizer": family, "conversation": conv, "ids": ids,
                "prefix_masks": prefix, "generation_masks": generation,
                # the tokens the two methods disagree on, as text
                "only_in_generation": [tok.decode([i]) for i, a, b in zip(ids, prefix, generation) if b and not a],
                "only_in_prefix": [tok.decode([i]) for i, a, b in zip(ids, prefix, generation) if a and not b]})
    inconsistent = []
    for tmpl_name, family, messages, kw in NOT_PREFIX_CONSISTENT:
        tmpl = open(os.path.join(TEMPLATES, tmpl_name), encoding="utf-8").read()
        try:
            prefix_spans(toks[family], tmpl, messages, kw)
            raise RuntimeError("expected the prefix method to fail")
        except AssertionError:
            pass
        variables = {"messages": messages, "add_generation_prompt": False, "bos_token": toks[family].bos_token,
                     "eos_token": toks[family].eos_token, "tools": kw.get("tools")}
        inconsistent.append({"template": tmpl_name, "tokenizer": family, "variables": variables,
                             "text": toks[family].apply_chat_template(messages, chat_template=tmpl, tokenize=False,
                                                                      **kw)})
    raises = []
    for tmpl_name, family, messages, message in RAISES:
        tmpl = open(os.path.join(TEMPLATES, tmpl_name), encoding="utf-8").read()
        try:
            toks[family].apply_chat_template(messages, chat_template=tmpl, tokenize=False)
            raise AssertionError("expected an exception")
        except jinja2.exceptions.TemplateError as e:
            assert str(e) == message, str(e)
        raises.append({"template": tmpl_name, "tokenizer": family,
                       "variables": {"messages": messages, "add_generation_prompt": False,
                                     "bos_token": toks[family].bos_token, "eos_token": toks[family].eos_token},
                       "message": message})
    doc = {"made_with": {"transformers": transformers.__version__, "jinja2": jinja2.__version__},
           "cases": cases, "comparisons": comparisons,
           "not_prefix_consistent": inconsistent, "raises": raises}
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases, {len(comparisons)} comparisons, {len(raises)} raises to {OUT}/cases.json")
    for c in comparisons:
        print(f"  {c['stock']} prefix mask vs {c['training']} on {c['conversation']}: only in the generation mask "
              f"{c['only_in_generation']}, only in the prefix mask {c['only_in_prefix']}")


if __name__ == "__main__":
    main()
