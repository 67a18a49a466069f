#!/usr/bin/env python3
"""Reference ids for llmt's SentencePiece BPE tokenizer (data/sentencepiece.cpp), from the real LLaMA-2
tokenizer.model in the shared data folder.

  pip install transformers tokenizers sentencepiece protobuf
  python3 tests/reference/make_sentencepiece_fixtures.py      # writes tests/reference/tokenizers_sp/

The reference is Hugging Face: LlamaTokenizerFast built from tokenizer.model (add_bos_token=True, the
LLaMA default), and tokenizers.Tokenizer for the tokenizer.json variants. The sentencepiece library is
run alongside and its disagreements with Hugging Face are counted and printed (they are documented in
docs/tokenizers.md); the fixtures hold Hugging Face's ids.

Outputs (tests/reference/tokenizers_sp/):
  tokenizer.json          what LlamaTokenizerFast.save_pretrained writes for this model (compact JSON)
  variants.json           the other tokenizer.json forms, as replacements of its normalizer/pre_tokenizer
  hard.json               hand-made hard strings: input bytes (hex), ids per form, sentencepiece's ids,
                          Hugging Face's decoded text; decode-only id sequences
  <corpus>.hashes         one line per input string: FNV-1a 32 of the ids (int32 little-endian), hex, of
                          the default form, then of the score_merges form
  corpora.json            per corpus: line count, and FNV-1a 64 of all ids per form
  tiny.model, tiny.json   a hand-made 280-piece BPE model whose piece ids and scores disagree (ties,
                          whitespace pieces, a user-defined piece) and ids of test strings in both forms
Forms: default (LlamaTokenizerFast from tokenizer.model; tokenizer.json), legacy (legacy=True),
legacy_normalizer (transformers 4's legacy tokenizer.json pipeline with these merges), score_merges
(transformers 4's legacy pipeline with merges ranked by piece score, as the LLaMA-2 tokenizer.json on
the Hub: built here from the tokenizer.model, not stored; llmt's SentencePieceFlavor::kScoreMerges).
Strings: wikitext-2/valid.txt and tinyshakespeare/input.txt split on "\\n" (no final empty line); Alpaca:
alpaca_seed_tasks.json then gpteacher-codegen.json, each record's instruction, input, output/response.
"""
import json
import os
import random
import sys
import tempfile
import time

import sentencepiece as spm
import tokenizers
import transformers
from sentencepiece import sentencepiece_model_pb2
from transformers import LlamaTokenizerFast
from transformers.tokenization_utils_base import generate_merges

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.environ.get("LLMT_TEST_DATA") or os.path.join(ROOT, "..", "shared", "data")
MODEL = os.path.join(DATA, "tokenizers", "llama2", "tokenizer.model")
OUT = os.path.join(ROOT, "tests", "reference", "tokenizers_sp")


def fnv1a32(ids):
    h = 0x811C9DC5
    for i in ids:
        for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def fnv1a64_lines(list_of_ids):  # all lines, each followed by -1
    h = 0xCBF29CE484222325
    for ids in list_of_ids:
        for i in list(ids) + [-1]:
            for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
                h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def read_lines(path):
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def alpaca_strings():
    out = []
    for name in ("alpaca_seed_tasks.json", "gpteacher-codegen.json"):
        with open(os.path.join(DATA, "alpaca", name), encoding="utf-8") as f:
            for rec in json.load(f):
                for key in ("instruction", "input", "output", "response"):
                    if isinstance(rec.get(key), str):
                        out.append(rec[key])
    return out


HARD = [
    "", " ", "  ", "   ", "\t", "\n", "\r\n", "a\r\nb\r\n", "Hello world!", "I believe the meaning of life is",
    " Hello", "  Hello", "   Hello", "Hello ", "Hello  ", " leading and trailing ", "a  b", "a   b    c",
    " " * 40 + "x", "x" + " " * 33, "tabs\tand\t\ttabs", "\t\tindented", "line1\nline2\n\nline4", "CRLF\r\nline\r\n",
    " \n \n ", "\n" * 30, "1234567890", "3.14159 and 2,718", "100000000000000", "year 2023-12-31, 10:45pm",
    "Hello мир 世界 مرحبا שלום नमस्ते", "日本語のテキストです。", "中文分词测试", "한국어 텍스트", "ภาษาไทย", "Ελληνικά",
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "I ❤️ NY", "🤖🚀✨", "🙂" * 50,
    "e\u0301", "Z\u0351\u0352a\u0353l\u0354g\u0355o", "Å vs A\u030a", "ﬁ ligature", "ｆｕｌｌｗｉｄｔｈ",
    "\x00", "\x01\x02\x03", "a\x7fb", "\x1b[31mred\x1b[0m", "\u200b\u200c\u200d", "\ufeffBOM", "\u2028\u2029", "\x0b\x0c",
    "<s>", "</s>", "<unk>", "<s>Hello</s>", "Hello <s> world </s> !", " <s> ", "<s><s></s>", "<s", "s>", "<</s>>",
    "<<s>>", "<S>", "<pad>", "<0x0A>", "<0x41><0x42>", "x<unk>y", "  <s>  a", "<s> ", "</s>\n",
    "▁", "▁▁hello", "hello▁world", " ▁ ",
    "def f(x):\n    return x * 2\n", "if (a && b) { return; }", "\"quoted\" 'single'", "http://example.com/path?q=1&r=2",
    "a" * 1000, "ab" * 500, "the " * 200, "\U0001F600\U00010348", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\ue000 private use", "\U0010ffff",
    " = Valkyria Chronicles III = ", " @-@ 1 @,@ 000 @.@ 5 ",
]
HARD_BYTES = [b"\xff", b"a\xffb", b"\xe4\xb8", b"\xe4\xb8x", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
              b"abc\xe2\x82", b"\x80\x80\x80", b"\xf0\x9f\x98", b" \xfe\xfe "]


TINY_PIECES = [("▁", -100), ("a", -50), ("b", -51), ("c", -52), ("x", -60), ("é", -61), ("▁▁", -1000),
               ("ab", -1), ("bc", -1), ("abc", -2), ("▁a", -3), ("aa", -4), ("aaa", -4), ("▁▁▁▁", -1000),
               ("ca", -1), ("cab", -1), ("▁ab", -5), ("▁▁a", -6), ("éa", -7), ("<", -70), ("s>", -71)]
TINY_STRINGS = ["abc", "aabc", "abcabc", "a b", "a  b", " ab", "  aaa", "cab", "xyz", "<tool>ab<s>", "é", "éa é",
                "aaaa", "bcab", "    a", "a<tool>", "<s>", "<s>a", "", " ", "ab  "]


def make_tiny(tmp):
    """A small SentencePiece BPE model with byte fallback, written with the protobuf classes."""
    m = sentencepiece_model_pb2.ModelProto()
    for text, score, kind in [("<unk>", 0, 2), ("<s>", 0, 3), ("</s>", 0, 3)] + \
            [("<0x%02X>" % b, 0, 6) for b in range(256)] + [(t, sc, 1) for t, sc in TINY_PIECES] + [("<tool>", 0, 4)]:
        p = m.pieces.add()
        p.piece, p.score, p.type = text, score, kind
    m.trainer_spec.model_type = 2
    m.trainer_spec.vocab_size = len(m.pieces)
    m.trainer_spec.byte_fallback = True
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    d = os.path.join(tmp, "tiny")
    os.makedirs(d)
    path = os.path.join(d, "tokenizer.model")
    with open(path, "wb") as f:
        f.write(m.SerializeToString())
    with open(os.path.join(OUT, "tiny.model"), "wb") as f:
        f.write(m.SerializeToString())
    hf = LlamaTokenizerFast.from_pretrained(d, add_bos_token=True)
    vocab = {p.piece: i for i, p in enumerate(m.pieces)}
    base = json.loads(hf.backend_tokenizer.to_str())
    score_model = dict(base["model"], merges=[list(x) for x in generate_merges(vocab, {p.piece: p.score for p in m.pieces})])
    score = tokenizers.Tokenizer.from_str(json.dumps({**base, "model": score_model, "pre_tokenizer": None,
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                       {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}}))
    sp = spm.SentencePieceProcessor(model_file=path)
    recs = []
    for text in TINY_STRINGS:
        ids = hf(text, add_special_tokens=False).input_ids
        recs.append({"text": text, "ids": ids, "ids_score_merges": score.encode(text, add_special_tokens=False).ids,
                     "sp_ids": sp.encode(text), "decoded": hf.decode(ids)})
    with open(os.path.join(OUT, "tiny.json"), "w", encoding="utf-8") as f:
        json.dump(recs, f, ensure_ascii=False, indent=0)


def main():
    assert os.path.exists(MODEL), f"{MODEL} not found (set LLMT_TEST_DATA)"
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp()
    os.symlink(os.path.abspath(MODEL), os.path.join(tmp, "tokenizer.model"))

    # Hugging Face from tokenizer.model: the default (legacy=False) and legacy=True forms
    hf = LlamaTokenizerFast.from_pretrained(tmp, add_bos_token=True)
    hf_legacy = LlamaTokenizerFast.from_pretrained(tmp, add_bos_token=True, legacy=True)
    assert hf("I believe the meaning of life is").input_ids == [1, 306, 4658, 278, 6593, 310, 2834, 338]
    assert hf("Hello world!").input_ids == [1, 15043, 3186, 29991] and hf("").input_ids == [1]
    saved = {}
    for name, t in (("default", hf), ("legacy", hf_legacy)):
        d = os.path.join(tmp, "saved_" + name)
        t.save_pretrained(d)
        with open(os.path.join(d, "tokenizer.json"), encoding="utf-8") as f:
            saved[name] = json.load(f)
    base = saved["default"]
    with open(os.path.join(OUT, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(base, f, ensure_ascii=False, separators=(",", ":"))

    # The variants, as replacements of top-level keys of tokenizer.json:
    # legacy: what save_pretrained writes with legacy=True (checked below);
    # legacy_normalizer: the form of transformers 4 (legacy) files, e.g. meta-llama/Llama-2-7b-hf's.
    variants = {
        "legacy": {"pre_tokenizer": saved["legacy"]["pre_tokenizer"]},
        "legacy_normalizer": {
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
            "pre_tokenizer": None,
        },
    }
    assert {**base, **variants["legacy"]} == saved["legacy"], "legacy tokenizer.json differs in more than the patch"
    with open(os.path.join(OUT, "variants.json"), "w", encoding="utf-8") as f:
        json.dump(variants, f, ensure_ascii=False, indent=1)
    tk = {"default": tokenizers.Tokenizer.from_str(json.dumps(base))}
    for name, patch in variants.items():
        tk[name] = tokenizers.Tokenizer.from_str(json.dumps({**base, **patch}))
    proto = sentencepiece_model_pb2.ModelProto()
    with open(MODEL, "rb") as f:
        proto.ParseFromString(f.read())
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    score_model = dict(base["model"], merges=[list(m) for m in generate_merges(vocab, {p.piece: p.score for p in proto.pieces})])
    tk["score_merges"] = tokenizers.Tokenizer.from_str(json.dumps({**base, **variants["legacy_normalizer"], "model": score_model}))
    sp = spm.SentencePieceProcessor(model_file=MODEL)
    make_tiny(tmp)

    def enc(name, texts):
        return [e.ids for e in tk[name].encode_batch(texts, add_special_tokens=False)]

    # Hard strings
    hard = []
    for item in HARD + HARD_BYTES:
        raw = item if isinstance(item, bytes) else item.encode("utf-8")
        text = raw.decode("utf-8", errors="replace")  # what Hugging Face is given for invalid UTF-8
        ids = hf(text, add_special_tokens=False).input_ids
        assert ids == enc("default", [text])[0]
        rec = {"hex": raw.hex(), "ids": ids, "ids_legacy": enc("legacy", [text])[0],
               "ids_legacy_normalizer": enc("legacy_normalizer", [text])[0],
               "ids_score_merges": enc("score_merges", [text])[0],
               "sp_ids": sp.encode(raw) if raw else [],
               "decoded": hf.decode(ids), "decoded_skip": hf.decode(ids, skip_special_tokens=True)}
        assert hf_legacy(text, add_special_tokens=False).input_ids == rec["ids_legacy"]
        hard.append(rec)
    rng = random.Random(1234)
    decode_only = [[1, 15043, 2], [3 + 0xE4, 3 + 0xB8], [3 + 0xE4, 3 + 0xB8, 3 + 0xAD], [3 + 0xE4, 15043, 3 + 0xB8],
                   [29871], [29871, 29871], [259, 15043], [0], [13], [3 + 0x0A], [2, 1, 0], [3 + 0xFF, 3 + 0xFE],
                   [3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80, 3 + 0xF0], [1, 29871, 1, 29871], []]
    decode_only += [[rng.randrange(32000) for _ in range(rng.randrange(1, 40))] for _ in range(40)]
    decode_only += [[rng.randrange(3, 259) for _ in range(rng.randrange(1, 12))] for _ in range(40)]
    decode_recs = [{"ids": ids, "decoded": hf.decode(ids), "decoded_skip": hf.decode(ids, skip_special_tokens=True)}
                   for ids in decode_only]
    with open(os.path.join(OUT, "hard.json"), "w", encoding="utf-8") as f:
        json.dump({"encode": hard, "decode": decode_recs}, f, ensure_ascii=False, indent=0)

    # Corpora
    corpora = {"wikitext2_valid": read_lines(os.path.join(DATA, "wikitext-2", "valid.txt")),
               "tinyshakespeare": read_lines(os.path.join(DATA, "tinyshakespeare", "input.txt")),
               "alpaca": alpaca_strings()}
    summary = {}
    for cname, lines in corpora.items():
        ids = hf(lines, add_special_tokens=False).input_ids
        assert ids == enc("default", lines)
        score_ids = enc("score_merges", lines)
        with open(os.path.join(OUT, cname + ".hashes"), "w") as f:
            f.write("".join("%08x %08x\n" % (fnv1a32(x), fnv1a32(y)) for x, y in zip(ids, score_ids)))
        rec = {"lines": len(lines), "tokens": sum(map(len, ids)), "fnv64": {"default": "%016x" % fnv1a64_lines(ids)}}
        for name in list(variants) + ["score_merges"]:
            rec["fnv64"][name] = "%016x" % fnv1a64_lines(enc(name, lines))
        # decode(encode(line)) is the line, less one leading space (the Strip decoder)
        for line, x in zip(lines, ids[:2000]):
            assert hf.decode(x) == (line[1:] if line.startswith(" ") else line), repr(line)
        sp_ids = sp.encode(lines)
        rec["sentencepiece_mismatches"] = sum(a != b for a, b in zip(ids, sp_ids))
        special = ("<s>", "</s>", "<unk>")  # Hugging Face splits these out of the text, sentencepiece does not
        rec["sentencepiece_mismatches_score_merges_without_specials"] = sum(
            a != b for line, a, b in zip(lines, score_ids, sp_ids) if not any(t in line for t in special))
        for name in list(variants) + ["score_merges"]:
            rec["sentencepiece_mismatches_" + name] = sum(a != b for a, b in zip(enc(name, lines), sp_ids))
        summary[cname] = rec
        print(cname, rec, file=sys.stderr)
    # One-thread sentencepiece speed on Tiny Shakespeare, line by line (for docs/tokenizers.md)
    lines = corpora["tinyshakespeare"]
    t0 = time.perf_counter()
    sp.encode(lines, num_threads=1)
    t_batch = time.perf_counter() - t0
    t0 = time.perf_counter()
    for line in lines:
        sp.encode(line)
    t_loop = time.perf_counter() - t0
    print("sentencepiece %s, Tiny Shakespeare line by line: batch %.3f s, python loop %.3f s" %
          (spm.__version__, t_batch, t_loop), file=sys.stderr)
    summary["made_with"] = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                            "sentencepiece": spm.__version__}
    with open(os.path.join(OUT, "corpora.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
