#!/usr/bin/env python3
"""llmt's tokenizer against tiktoken and sentencepiece on the real vocabularies PyPI wheels carry.

llama-models ships Meta's Llama 3 and Llama 4 tokenizer.model (tiktoken ranks); mistral-common ships
Mistral's SentencePiece models (v1, v2, v3, v7) and its tekken files. For each, every line of the
shared data's text (Tiny Shakespeare, WikiText-2 valid, the Alpaca seed tasks and GPTeacher codegen
fields, split at newlines) and a few hard strings are encoded by `llmt tokenize` and by the peer,
and the ids must be equal:

- Llama 3: tiktoken with Meta's pattern and Llama 3.1's special tokens (Meta's 3.1 tokenizer.py;
  the Hub's 3.1-3.3 tokenizer.json), special token text allowed as tiktoken's allowed_special="all"
  does (Hugging Face makes them tokens too). llmt reads the names from a params.json beside the file
  (use_scaled_rope) and from --llama3_special_tokens 3.1; llama-models' own Tokenizer class must give
  the same ids for every name it shares with 3.1.
- Mistral v1, v2, v3, v7: the sentencepiece library, and the choice llmt makes where they differ:
  text that spells a control or unknown piece (`<unk>`, `<s>`, `</s>`, `[INST]`, ...) is that token
  in llmt, as in transformers, while sentencepiece encodes it as text. So llmt is compared with
  sentencepiece applied between those pieces (each segment encoded alone, the piece's id between),
  and the lines where plain sentencepiece differs must be exactly the lines that spell such a piece.
- Llama 4 and tekken: llmt refuses them, naming the format (their pre-tokenizer pattern needs
  Unicode case classes llmt lacks).

Usage: compare_real_vocabularies.py path/to/llmt [data_dir]. Exits 77 (skipped) with a message when
the packages (pip install -r scripts/requirements-tests.txt) or the shared data are missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77


def skip(why):
    print(f"compare_real_vocabularies: skipped: {why}")
    sys.exit(SKIP)


try:
    import llama_models
    import mistral_common
    import sentencepiece
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
except ImportError as e:
    skip(f"{e.name} is not installed (pip install -r scripts/requirements-tests.txt)")

LLMT = sys.argv[1]
DATA = sys.argv[2] if len(sys.argv) > 2 else os.environ.get(
    "LLMT_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))
if not os.path.isfile(os.path.join(DATA, "tinyshakespeare", "input.txt")):
    skip(f"no shared data at {DATA} (set LLMT_TEST_DATA)")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Meta's Llama 3.1 tokenizer.py: 256 special tokens after the 128000 ranks
LLAMA31_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
LLAMA31_SPECIALS += [f"<|reserved_special_token_{3 + i}|>" for i in range(256 - len(LLAMA31_SPECIALS))]

HARD = ["", " ", "  two  spaces", "\ttab", "Hello world!", "a <s> b </s> c <unk> d", "<s>", "x<unk>", "<unk> lead",
        "[INST] what? [/INST] this", "naïve café 日本語 😀👍🏽", "a<|eom_id|>b<|python_tag|>c", "<|eot_id|>",
        "<|reserved_special_token_3|><|reserved_special_token_247|><|reserved_special_token_248|>",
        "<|finetune_right_pad_id|>", "<|begin_of_text|>Hi<|end_of_text|>", "don't I'LL 12345 3.14159"]


def corpora():
    out = {}
    with open(os.path.join(DATA, "tinyshakespeare", "input.txt"), encoding="utf-8") as f:
        out["tinyshakespeare"] = f.read().split("\n")
    with open(os.path.join(DATA, "wikitext-2", "valid.txt"), encoding="utf-8") as f:
        out["wikitext2_valid"] = f.read().split("\n")
    lines = []
    for name in ("alpaca_seed_tasks.json", "gpteacher-codegen.json"):
        with open(os.path.join(DATA, "alpaca", name), encoding="utf-8") as f:
            for rec in json.load(f):
                for key in ("instruction", "input", "output", "response"):
                    lines += rec.get(key, "").split("\n")
    out["alpaca_fields"] = lines
    out["hard"] = HARD
    return out


def llmt_ids(tok_path, lines, *flags):
    """`llmt tokenize`'s ids, one list per line (the tokenizer's default special tokens included)."""
    r = subprocess.run([LLMT, "tokenize", "--tokenizer_name_or_path", tok_path, *flags],
                       input="\n".join(lines) + "\n", capture_output=True, text=True, encoding="utf-8")
    if r.returncode != 0:
        sys.exit(f"FAIL: llmt tokenize {tok_path}: {r.stderr.strip()}")
    got = [[int(x) for x in line.split()] for line in r.stdout.split("\n")[:-1]]
    assert len(got) == len(lines), (len(got), len(lines))
    return got


def llmt_error(tok_path):
    r = subprocess.run([LLMT, "tokenize", "--tokenizer_name_or_path", tok_path], input="hi\n",
                       capture_output=True, text=True)
    return r.returncode, r.stderr.strip()


failures = 0


def compare(what, lines, got, want):
    global failures
    bad = [i for i in range(len(lines)) if got[i] != want[i]]
    print(f"{what}: {len(lines)} lines, {sum(len(w) for w in want)} tokens, {len(bad)} mismatches")
    for i in bad[:3]:
        print(f"  line {i}: {lines[i][:120]!r}\n    llmt: {got[i][:40]}\n    peer: {want[i][:40]}")
    failures += len(bad) > 0


def check_llama3(texts, pkg):
    path = os.path.join(pkg, "llama3", "tokenizer.model")
    ranks = load_tiktoken_bpe(path)
    assert len(ranks) == 128000, len(ranks)
    enc = tiktoken.Encoding("llama3.1", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks,
                            special_tokens={s: 128000 + i for i, s in enumerate(LLAMA31_SPECIALS)})
    # llama-models' own class: every name it shares with 3.1 has 3.1's id
    from llama_models.llama3.tokenizer import Tokenizer as MetaTokenizer
    meta = MetaTokenizer(__import__("pathlib").Path(path)).special_tokens
    # (its newest tokenizer.py also names 128005 <|step_id|> and 128011 <|image|>, so its reserved
    # numbers run 2 lower than 3.1's from 128012 on: the named tokens are what must agree)
    shared = [s for s in LLAMA31_SPECIALS if s in meta and "reserved" not in s]
    differ = [s for s in shared if meta[s] != 128000 + LLAMA31_SPECIALS.index(s)]
    print(f"llama3: llama-models' Tokenizer has 3.1's {len(shared)} named special tokens, "
          f"{len(differ)} with another id {differ[:3]}")
    global failures
    failures += len(differ) > 0 or len(shared) != 8
    with tempfile.TemporaryDirectory() as d:  # Meta's layout: original/ holds tokenizer.model and params.json
        os.symlink(os.path.abspath(path), os.path.join(d, "tokenizer.model"))
        with open(os.path.join(d, "params.json"), "w") as f:
            json.dump({"dim": 2048, "n_layers": 16, "vocab_size": 128256, "use_scaled_rope": True}, f)
        for name, lines in texts.items():
            want = [[128000] + enc.encode(s, allowed_special="all", disallowed_special=()) for s in lines]
            compare(f"llama3 (params.json) {name}", lines, llmt_ids(d, lines), want)
            if name == "hard":
                compare(f"llama3 (--llama3_special_tokens 3.1) {name}", lines,
                        llmt_ids(path, lines, "--llama3_special_tokens", "3.1"), want)


class Splitter:
    """Cuts text at every spelling of a piece (leftmost, longest first): [(segment, piece id or None)]."""

    def __init__(self, pieces):
        self.pieces = pieces
        self.first = set(p[0] for p in pieces)
        self.pattern = re.compile("|".join(re.escape(p) for p in sorted(pieces, key=len, reverse=True)))

    def split(self, text):
        if not any(c in text for c in self.first):  # the common case, quickly
            return [(text, None)]
        out, pos = [], 0
        for m in self.pattern.finditer(text):
            out.append((text[pos:m.start()], self.pieces[m.group(0)]))
            pos = m.end()
        out.append((text[pos:], None))
        return out


def check_sentencepiece(texts, name, path):
    sp = sentencepiece.SentencePieceProcessor(model_file=path)
    special = {sp.id_to_piece(i): i for i in range(sp.vocab_size()) if sp.IsControl(i) or sp.IsUnknown(i)}
    splitter = Splitter(special)
    lines_all, spelled_all, plain_differs = 0, 0, 0
    for corpus, lines in texts.items():
        got = llmt_ids(path, lines)
        want, plain_bad, spelled = [], [], []
        plain = sp.encode(lines)
        for i, s in enumerate(lines):
            parts = splitter.split(s)
            ids = [sp.bos_id()]
            if len(parts) == 1:
                ids += plain[i]
            else:
                for seg, piece in parts:
                    if seg:
                        ids += sp.encode(seg)
                    if piece is not None:
                        ids.append(piece)
            want.append(ids)
            spelled.append(len(parts) > 1)
            if [sp.bos_id()] + plain[i] != got[i]:
                plain_bad.append(i)
        compare(f"{name} {corpus}", lines, got, want)
        # sentencepiece alone differs exactly where the text spells a control or unknown piece
        spelled_lines = [i for i in range(len(lines)) if spelled[i]]
        global failures
        if plain_bad != spelled_lines:
            failures += 1
            extra = sorted(set(plain_bad) ^ set(spelled_lines))[:3]
            print(f"  FAIL: sentencepiece alone differs on {len(plain_bad)} lines, {len(spelled_lines)} spell a piece; "
                  f"e.g. lines {extra}")
        lines_all += len(lines)
        spelled_all += len(spelled_lines)
        plain_differs += len(plain_bad)
    print(f"{name}: sentencepiece alone spells `<unk>`/`<s>`/... as text on the {plain_differs} of {lines_all} lines "
          f"that write one ({spelled_all}); llmt makes them the token")
    if spelled_all == 0:
        failures += 1
        print(f"  FAIL: no line spells a special piece: the choice was not exercised")


def main():
    texts = corpora()
    llama_pkg = os.path.dirname(llama_models.__file__)
    mistral_data = os.path.join(os.path.dirname(mistral_common.__file__), "data")
    check_llama3(texts, llama_pkg)
    sp_models = {"mistral_v1": "tokenizer.model.v1", "mistral_v2": "mistral_instruct_tokenizer_240216.model.v2",
                 "mistral_v3": "mistral_instruct_tokenizer_240323.model.v3",
                 "mistral_v7": "mistral_instruct_tokenizer_241114.model.v7"}
    for name, file in sp_models.items():
        check_sentencepiece(texts, name, os.path.join(mistral_data, file))
    global failures
    refused = [(os.path.join(llama_pkg, "llama4", "tokenizer.model"), "Llama 4's tokenizer.model")]
    refused += [(os.path.join(mistral_data, f), "Mistral's tekken tokenizer")
                for f in sorted(os.listdir(mistral_data)) if f.startswith("tekken")]
    for path, want in refused:
        rc, err = llmt_error(path)
        ok = rc != 0 and want in err and "does not read" in err
        print(f"{os.path.basename(path)}: {'refused, naming the format' if ok else 'FAIL: ' + err[:200]}")
        failures += not ok
    if failures:
        sys.exit(f"FAIL: {failures} comparisons differ")
    print("PASS")


main()
