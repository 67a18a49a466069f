#!/usr/bin/env python3
"""Records what Hugging Face tokenizers and tiktoken produce for the GPT-2 tokenizer, for
tests/data/test_tokenizers_bytelevel.cpp. Writes tests/reference/tokenizers/gpt2_fixtures.json.

    pip install tokenizers transformers tiktoken
    python3 tests/reference/make_tokenizer_fixtures.py      # reads $LLMT_TEST_DATA or ../shared/data
    python3 tests/reference/make_tokenizer_fixtures.py --show CONFIG CORPUS N
        # prints string N (1-based) of a corpus and both peers' ids for it (what the C++ test
        # names when a corpus string mismatches)

Two configurations, each computed by both peers and required to agree on every string:
  gpt2         GPT2TokenizerFast.from_pretrained(tokenizers/gpt2)  (vocab.json + merges.txt)
               and tiktoken.Encoding(gpt2.tiktoken, the GPT-2 pattern, <|endoftext|> = 50256)
  gpt2_llama3  the same vocabulary behind the LLaMA-3 pre-tokenizer pattern: a tokenizers.Tokenizer
               with Sequence[Split(pattern, isolated), ByteLevel(use_regex=False)], and
               tiktoken.Encoding(gpt2.tiktoken, the LLaMA-3 pattern)
Special tokens written in the text are split out (HF's default; tiktoken allowed_special="all").

Corpora (one string per line, the newline not included; for Alpaca files the instruction, input,
output and response fields of each record in that order, those present): per string the low 8
bits of FNV-1a 64 over its ids as little-endian int32, and over the whole corpus FNV-1a 64 of
every string's ids each followed by -1. Hard strings: the full ids. Decode cases: ids (including
ones whose bytes are not valid UTF-8) and the text both peers decode them to.
"""
import hashlib
import json
import os
import random
import struct
import sys

import tiktoken
import tokenizers
import transformers
from tiktoken.load import load_tiktoken_bpe
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2TokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.environ.get("LLMT_TEST_DATA") or os.path.join(HERE, "..", "..", "..", "shared", "data")
OUT = os.path.join(HERE, "tokenizers", "gpt2_fixtures.json")

GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

HARD = [
    "", "Hello world", " Hello world", "Hello  world", "Hello   world  ", "   leading", "trailing   ",
    # mixed scripts
    "Привет, мир! Ελληνικά κείμενο", "こんにちは世界。中文字符测试", "مرحبا بالعالم שלום עולם",
    "नमस्ते दुनिया ภาษาไทย 한국어 텍스트", "Ünïcödé façade naïve coöperate", "ǅ ǈ ǋ titlecase",
    # emoji, ZWJ sequences, variation selectors, skin tones
    "👍🏽 👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "I ❤️ NY", "👩🏽‍💻👨🏿‍🚀", "😀😃😄😁" * 5,
    # combining marks
    "e\u0301 Cafe\u0301 a\u0308\u0304", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "\u0301leading mark", "x \u0301 y",
    # whitespace runs, tabs, CRLF, other spaces
    " " * 100 + "x", "\n" * 50, "a" + " " * 37 + "b", "\t\t\tindent", "x\u3000\u3000y \u3000z",
    "\u00a0nbsp\u00a0 \u00a0", "line\u2028sep\u2029para", "a\r\nb\r\n", "col1\tcol2\t\tcol3",
    "\r\n\r\n", " \r\n x", "trailing\r", "end with spaces  \n  ", "\n \n\t\n  x", "  \t \n",
    " \u00a0x", "\t\u3000\nword", "a \n\n b", "x\n\n\n\n", "!!\n\n??\r\n\r\n",
    # digits and numerals
    "1234567890", "3.14159 2.71828", "1,000,000 and 12,345.67", "x123456y", "٣٤٥ ۱۲۳ १२३", "Ⅻ ⅻ roman",
    "½ ¼ ²³ ₁₂", " 1 22 333 4444 55555", "0x1F600 0b1010", "v1.2.3-rc4",
    # contractions, apostrophes
    "I'm don't we've they'll he'd you're it's", "I'M DON'T WE'VE THEY'LL HE'D YOU'RE IT'S",
    "'s's''s", "''", "'", "rock 'n' roll", "it’s curly ’s", "It'S mixed'Ll 'Re", "it'ſ long s",
    "'hello 'world' 123'456", "o'clock O'Neil", " 's", "\n's",
    # control characters
    "\x00\x01\x02 nul", "bell\x07", "\x1b[31mred\x1b[0m", "del\x7f", "\u200b zero\u200bwidth",
    "\ufeffBOM", "\u0085nel\u0085", "\x1c\x1d\x1e\x1f seps", "\x0b\x0c vt ff",
    # special tokens in the text
    "<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>", " <|endoftext|> ", "<|endoftext",
    "<|endoftext|>The end", "x<|endoftext|>\n", "<|endoftext|>|>", "<<|endoftext|>>",
    # long words (the heap merge)
    "a" * 1000, "ab" * 300, "😀" * 100, "pneumonoultramicroscopicsilicovolcanoconiosis",
    "-" * 200 + ">", "=" * 80, "\u00e9" * 150,
    # code and URLs
    "def f(x):\n    return x**2  # square\n", "if (a&&b) { c++; } else { d--; }",
    "https://example.com/path?q=1&r=2#frag", "user@example.org", "C:\\Windows\\System32",
    # Unicode 16.0 letters (the table version both peers use)
    "\u1c89\u1c8a \U00010d4a\U00010d4b \U0001e5d0",
]


def lines_of(path):
    with open(path, "rb") as f:
        parts = f.read().split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()
    return [p.decode("utf-8") for p in parts]


def alpaca_strings(path):
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            records = [json.loads(l) for l in f if l.strip()]
    else:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    out = []
    for r in records:
        for k in ("instruction", "input", "output", "response"):
            if isinstance(r.get(k), str):
                out.append(r[k])
    return out


def fnv(ids, h=0xCBF29CE484222325):
    for b in struct.pack("<%di" % len(ids), *ids):
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main(show=None):
    gdir = os.path.join(DATA, "tokenizers", "gpt2")
    hf = GPT2TokenizerFast.from_pretrained(gdir)
    ranks = load_tiktoken_bpe(os.path.join(gdir, "gpt2.tiktoken"))
    specials = {"<|endoftext|>": 50256}
    tk_gpt2 = tiktoken.Encoding("gpt2_file", pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens=specials)
    tk_llama3 = tiktoken.Encoding("gpt2_llama3", pat_str=LLAMA3_PAT, mergeable_ranks=ranks, special_tokens=specials)
    hf3 = Tokenizer(models.BPE.from_file(os.path.join(gdir, "vocab.json"), os.path.join(gdir, "merges.txt")))
    hf3.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PAT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf3.decoder = decoders.ByteLevel()
    hf3.add_special_tokens(["<|endoftext|>"])
    assert hf3.token_to_id("<|endoftext|>") == 50256

    configs = {
        "gpt2": (lambda ts: hf(ts)["input_ids"], lambda ts: [tk_gpt2.encode(t, allowed_special="all") for t in ts]),
        "gpt2_llama3": (lambda ts: [e.ids for e in hf3.encode_batch(ts, add_special_tokens=False)],
                        lambda ts: [tk_llama3.encode(t, allowed_special="all") for t in ts]),
    }

    if show:
        config, rel, n = show[0], show[1], int(show[2])
        unit = "fields" if rel.startswith("alpaca/") else "lines"
        path = os.path.join(DATA, rel)
        text = (lines_of(path) if unit == "lines" else alpaca_strings(path))[n - 1]
        print(json.dumps(text))
        print("HF       ", configs[config][0]([text])[0])
        print("tiktoken ", configs[config][1]([text])[0])
        return

    def encode_both(name, texts):
        a, b = configs[name][0](texts), configs[name][1](texts)
        bad = [i for i in range(len(texts)) if a[i] != b[i]]
        for i in bad[:5]:
            print(f"{name}: HF and tiktoken differ on {texts[i]!r}: {a[i]} vs {b[i]}", file=sys.stderr)
        return a, len(bad)

    out = {
        "generated_by": "tests/reference/make_tokenizer_fixtures.py",
        "versions": {"tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
                     "tiktoken": tiktoken.__version__},
        "patterns": {"gpt2": GPT2_PAT, "gpt2_llama3": LLAMA3_PAT},
        "hard": [], "corpora": [], "decode": [],
    }
    disagreements = 0

    for name in configs:
        ids, bad = encode_both(name, HARD)
        disagreements += bad
        for t, i in zip(HARD, ids):
            assert hf.decode(i, clean_up_tokenization_spaces=False) == t, t
        if name == "gpt2":
            out["hard"] = [{"text": t, "gpt2": i} for t, i in zip(HARD, ids)]
        else:
            for rec, i in zip(out["hard"], ids):
                rec[name] = i

    corpora = [("wikitext-2/valid.txt", "lines"), ("tinyshakespeare/input.txt", "lines"),
               ("alpaca/alpaca_seed_tasks.json", "fields"), ("alpaca/alpaca_seed_tasks.jsonl", "fields"),
               ("alpaca/gpteacher-codegen.json", "fields")]
    for rel, unit in corpora:
        path = os.path.join(DATA, rel)
        texts = lines_of(path) if unit == "lines" else alpaca_strings(path)
        for name in configs:
            ids, bad = encode_both(name, texts)
            disagreements += bad
            h, low, total = 0xCBF29CE484222325, [], 0
            for i in ids:
                low.append("%02x" % (fnv(i) & 0xFF))
                h = fnv(i + [-1], h)
                total += len(i)
            out["corpora"].append({"config": name, "corpus": rel, "unit": unit, "count": len(texts), "tokens": total,
                                   "fnv64": "%016x" % h, "low8": "".join(low), "hf_tiktoken_disagree": bad})
            print(f"{name} {rel}: {len(texts)} strings, {total} tokens, HF vs tiktoken disagree on {bad}",
                  file=sys.stderr)

    # decode: bytes that are not valid UTF-8, special tokens, and random id runs (GPT-2 has many
    # tokens that are a part of a multi-byte character)
    enc = hf.backend_tokenizer.model
    b2u = {}
    n = 0
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            b2u[b] = chr(b)
        else:
            b2u[b] = chr(256 + n)
            n += 1
    byte_id = {b: hf.convert_tokens_to_ids(b2u[b]) for b in range(256)}
    raw_cases = [b"\xff", b"\x80", b"\xe2\x82", b"\xe2\x82a", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                 b"\xf0\x80\x80", b"a\xf0\x9f\x98b", b"\xf0\x9f\x98\x80", b"\xe0\x80\xaf", b"\xf8\x88\x80\x80\x80",
                 b"\xc3", b"\xc3\xa9\xa9", b"\xef\xbf\xbd", b"\xf0\x9f", b"\xe1\x80\xe1\x80\x80"]
    cases = [[byte_id[b] for b in r] for r in raw_cases]
    cases += [[15496, 50256, 995], [50256], [], [220, 50256, 220]]
    rng = random.Random(1234)
    for _ in range(300):
        cases.append([rng.randrange(50257) for _ in range(rng.randint(1, 6))])
    for ids in cases:
        a = hf.decode(ids, clean_up_tokenization_spaces=False)
        b = tk_gpt2.decode(ids)
        assert a == b, (ids, a, b)
        c = hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        out["decode"].append({"ids": ids, "text": a, "skip_special": c})

    assert disagreements == 0, f"{disagreements} strings where HF tokenizers and tiktoken disagree"
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    # one record a line: readable diffs, no line per id
    with open(OUT, "w") as f:
        f.write("{\n")
        keys = list(out)
        for k in keys:
            v = out[k]
            if isinstance(v, list):
                body = ",\n".join(json.dumps(x, ensure_ascii=True) for x in v)
                f.write(f'"{k}": [\n{body}\n]')
            else:
                f.write(f'"{k}": {json.dumps(v, ensure_ascii=True)}')
            f.write(",\n" if k != keys[-1] else "\n")
        f.write("}\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--show":
        main(sys.argv[2:])
    elif len(sys.argv) == 1:
        main()
    else:
        sys.exit(__doc__)
