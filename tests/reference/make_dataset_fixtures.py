#!/usr/bin/env python3
"""Reference datasets for tests/data/test_datasets.cpp, made with Hugging Face tokenizers and the
preprocessing of transformers' run_clm.py and Stanford Alpaca's train.py, replicated here from their
published code so that the `datasets` package is not needed.

    pip install transformers tokenizers sentencepiece protobuf
    python3 tests/reference/make_dataset_fixtures.py [--data ../shared/data]

Writes tests/reference/datasets/*.json (committed). Hashes are FNV-1a 64 over the little-endian int32
bytes of a sequence, written as 16 hex digits (tests/data/test_datasets.cpp computes the same).

LLaMA-2 is tokenized as llmt tokenizes a tokenizer.model by default (SentencePieceFlavor::kScoreMerges):
LlamaTokenizerFast over the legacy tokenizer.json with merges ranked by piece score (the form of the
meta-llama/Llama-2-*-hf tokenizer.json, transformers 4), built from tests/reference/tokenizers_sp/ as
make_sentencepiece_fixtures.py builds its score_merges form; BOS added, no EOS. Its ids are checked
against that script's score_merges hashes and compared with the sentencepiece library's (printed, and
recorded under "sentencepiece" in the llama2 fixtures).

llama3, qwen2, mistral, qwen3 and gemma are the tiny tokenizers in those families' layouts that
make_family_tokenizers.py writes to tests/reference/tokenizers_family/ (run it first), loaded with
AutoTokenizer.from_pretrained: Llama 3 adds <|begin_of_text|> and its Alpaca targets end in
<|end_of_text|>; Qwen2 adds nothing and ends them in <|endoftext|>; Qwen3 (the post-trained
checkpoints' tokenizer_config.json) in <|im_end|>; Mistral as LLaMA-2 (<s>, </s>); Gemma adds <bos> and
ends them in <eos>. --only NAME[,NAME] writes those tokenizers' fixtures alone.
"""
import argparse
import json
import os
import sys
import tempfile
from io import StringIO

import sentencepiece as spm
import tokenizers
import transformers
from sentencepiece import sentencepiece_model_pb2
from transformers import AutoTokenizer, GPT2TokenizerFast, LlamaTokenizerFast
from transformers.tokenization_utils_base import generate_merges

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "datasets")
SP_FIXTURES = os.path.join(HERE, "tokenizers_sp")  # written by make_sentencepiece_fixtures.py
FAMILIES = ("llama3", "qwen2", "mistral", "qwen3", "gemma")  # tokenizers_family/, make_family_tokenizers.py

# ---- tokenizers, as the real checkpoints configure them ----


def fnv1a64_lines(list_of_ids):  # make_sentencepiece_fixtures.py's corpus hash: all lines, each followed by -1
    h = 0xCBF29CE484222325
    for ids in list_of_ids:
        for i in list(ids) + [-1]:
            for b in (i & 0xFFFFFFFF).to_bytes(4, "little"):
                h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def alpaca_strings(data):  # make_sentencepiece_fixtures.py's Alpaca corpus
    out = []
    for name in ("alpaca_seed_tasks.json", "gpteacher-codegen.json"):
        with open(os.path.join(data, "alpaca", name), encoding="utf-8") as f:
            for rec in json.load(f):
                out += [rec[k] for k in ("instruction", "input", "output", "response") if isinstance(rec.get(k), str)]
    return out


def llama2_score_merges(data):
    """LlamaTokenizerFast over the score-ordered legacy LLaMA-2 tokenizer.json: tokenizers_sp/tokenizer.json
    with variants.json's "legacy_normalizer" (Prepend "▁" + Replace " " -> "▁", no pre-tokenizer) and the
    merges ranked by piece score (generate_merges with the tokenizer.model's scores), i.e.
    make_sentencepiece_fixtures.py's score_merges form, which that script does not store."""
    with open(os.path.join(SP_FIXTURES, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    with open(os.path.join(SP_FIXTURES, "variants.json"), encoding="utf-8") as f:
        variants = json.load(f)
    proto = sentencepiece_model_pb2.ModelProto()
    with open(os.path.join(data, "tokenizers/llama2/tokenizer.model"), "rb") as f:
        proto.ParseFromString(f.read())
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    assert vocab == base["model"]["vocab"], "tokenizers_sp/tokenizer.json is not this tokenizer.model's"
    merges = [list(m) for m in generate_merges(vocab, {p.piece: p.score for p in proto.pieces})]
    score_json = {**base, **variants["legacy_normalizer"], "model": dict(base["model"], merges=merges)}
    d = tempfile.mkdtemp()
    path = os.path.join(d, "tokenizer.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(score_json, f, ensure_ascii=False)
    # meta-llama/Llama-2-*-hf: tokenizer_config.json sets add_bos_token=True, add_eos_token=False.
    llama = LlamaTokenizerFast(tokenizer_file=path, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                               add_bos_token=True, add_eos_token=False)
    # Same ids as make_sentencepiece_fixtures.py's score_merges form (its Alpaca corpus hash), so the
    # tokenizer was used as written (LlamaTokenizerFast did not rebuild its pipeline).
    with open(os.path.join(SP_FIXTURES, "corpora.json")) as f:
        want = json.load(f)["alpaca"]["fnv64"]["score_merges"]
    got = fnv1a64_lines(llama(alpaca_strings(data), add_special_tokens=False).input_ids)
    assert got == want, f"score-merge tokenizer differs from tokenizers_sp/corpora.json ({got} vs {want})"
    return llama


def load_tokenizers(data, only):
    toks = {}
    if "gpt2" in only:
        gpt2 = GPT2TokenizerFast.from_pretrained(os.path.join(data, "tokenizers/gpt2"))  # vocab.json + merges.txt
        assert gpt2("Hello world").input_ids == [15496, 995]
        toks["gpt2"] = gpt2
    if "llama2" in only:
        llama = llama2_score_merges(data)
        assert llama("Hello world!").input_ids == [1, 15043, 3186, 29991], llama("Hello world!").input_ids
        assert (llama.bos_token_id, llama.eos_token_id, llama.unk_token_id) == (1, 2, 0)
        assert llama("a").input_ids[0] == 1 and llama("a").input_ids[-1] != 2  # BOS added, no EOS
        toks["llama2"] = llama
    # the tiny Llama 3 / Qwen2 / Mistral / Qwen3 / Gemma tokenizers of make_family_tokenizers.py, as
    # AutoTokenizer loads them
    for name in FAMILIES:
        if name in only:
            toks[name] = AutoTokenizer.from_pretrained(os.path.join(HERE, "tokenizers_family", name))
    checks = {
        "llama3": lambda t: t("a").input_ids[0] == t.bos_token_id == 1000,  # <|begin_of_text|>
        "qwen2": lambda t: t.bos_token_id is None and t.eos_token == "<|endoftext|>",
        "qwen3": lambda t: t.bos_token_id is None and t.eos_token == "<|im_end|>",
        "gemma": lambda t: t("a").input_ids[0] == t.bos_token_id == 2 and t.eos_token_id == 1,  # <bos>, <eos>
    }
    for name, ok in checks.items():
        assert name not in toks or ok(toks[name]), f"{name}: not the family's BOS/EOS"
    return toks


# ---- hashing ----


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for v in ids:
        for b in (v & 0xFFFFFFFF).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


# ---- run_clm.py ----


def text_loader_lines(path, chunksize=10 << 20):
    """datasets/packaged_modules/text/text.py, sample_by="line", keep_linebreaks=True (run_clm's default)."""
    lines = []
    with open(path, encoding="utf-8") as f:  # text mode: universal newlines become "\n"
        while True:
            batch = f.read(chunksize)
            if not batch:
                break
            batch += f.readline()  # finish current line
            lines.extend(StringIO(batch).readlines())  # splits on "\n" only, keeps it
    return lines


def wikitext_lines(path):
    """The wikitext dataset's loading script: _generate_examples."""
    out = []
    with open(path, encoding="utf-8") as f:
        for row in f:
            out.append(row if row.strip() else "")
    return out


def run_clm_blocks(lines, tok, block_size, batch_size=1000):
    """tokenize_function then group_texts, each through datasets.map(batched=True) (batch_size 1000)."""
    ids = []
    for i in range(0, len(lines), batch_size):
        ids.extend(tok(lines[i : i + batch_size])["input_ids"])  # tokenize_function: tokenizer(examples["text"])
    blocks, dropped = [], 0
    for i in range(0, len(ids), batch_size):  # group_texts, one map batch at a time
        concatenated = [t for row in ids[i : i + batch_size] for t in row]
        total_length = (len(concatenated) // block_size) * block_size
        blocks.extend(concatenated[j : j + block_size] for j in range(0, total_length, block_size))
        dropped += len(concatenated) - total_length
    return blocks, dropped


# ---- Stanford Alpaca train.py ----

IGNORE_INDEX = -100
PROMPT_DICT = {
    "prompt_input": (
        "Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:"
    ),
    "prompt_no_input": (
        "Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.\n\n"
        "### Instruction:\n{instruction}\n\n### Response:"
    ),
}


def alpaca_records(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    recs = json.loads(text) if text.lstrip().startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
    out = []
    for r in recs:  # llmt's field mapping: "response" stands for a missing "output", "context" for "input"
        out.append(
            {
                "instruction": r["instruction"],
                "input": r.get("input", r.get("context", "")) or "",
                "output": r["output"] if "output" in r else r["response"],
            }
        )
    return out


def sources_targets(recs, tok):
    sources = [
        PROMPT_DICT["prompt_input"].format_map(e) if e.get("input", "") != "" else PROMPT_DICT["prompt_no_input"].format_map(e)
        for e in recs
    ]
    targets = [f"{e['output']}{tok.eos_token}" for e in recs]
    return sources, targets


def llmt_alpaca(recs, tok, max_len):
    """llmt's preprocessing: prompt with the default specials, output without, then the EOS id; cut to max_len."""
    sources, _ = sources_targets(recs, tok)
    out = []
    for s, e in zip(sources, recs):
        p = tok(s).input_ids
        t = tok(e["output"], add_special_tokens=False).input_ids + [tok.eos_token_id]
        ids = (p + t)[:max_len]
        labels = ([IGNORE_INDEX] * len(p) + t)[:max_len]
        out.append((ids, labels))
    return out


def stanford_alpaca(recs, tok, max_len):
    """train.py's preprocess(): source + target tokenized together, len(tokenize(source)) tokens masked."""
    sources, targets = sources_targets(recs, tok)
    out = []
    for s, t in zip(sources, targets):
        ids = tok(s + t, max_length=max_len, truncation=True).input_ids
        src_len = len(tok(s, max_length=max_len, truncation=True).input_ids)
        labels = [IGNORE_INDEX] * min(src_len, len(ids)) + ids[src_len:]
        out.append((ids, labels))
    return out


# ---- the sentencepiece library, for comparison ----

SPECIAL_LITERALS = ("<s>", "</s>", "<unk>")  # Hugging Face turns these into their ids; sentencepiece does not


def sentencepiece_alpaca(recs, tok, sp, max_len):
    """llmt_alpaca's records and the sentencepiece library's: [BOS] + prompt, response + [EOS]; counts of
    records whose prompt ids, response ids, and (cut) input_ids agree, and of those with special literals."""
    sources, _ = sources_targets(recs, tok)
    same = {"records": len(recs), "same_prompt_ids": 0, "same_response_ids": 0, "same_ids": 0,
            "with_special_literals": 0, "differ_without_special_literals": 0}
    for s, e in zip(sources, recs):
        p, t = tok(s).input_ids, tok(e["output"], add_special_tokens=False).input_ids
        sp_p, sp_t = [sp.bos_id()] + sp.encode(s), sp.encode(e["output"])
        ok = (p + t + [tok.eos_token_id])[:max_len] == (sp_p + sp_t + [sp.eos_id()])[:max_len]
        same["same_prompt_ids"] += p == sp_p
        same["same_response_ids"] += t == sp_t
        same["same_ids"] += ok
        special = any(x in s + e["output"] for x in SPECIAL_LITERALS)
        same["with_special_literals"] += special
        same["differ_without_special_literals"] += not ok and not special
    return same


def sentencepiece_lines(lines, tok, sp):
    same = {"lines": len(lines), "same_ids": 0, "with_special_literals": 0, "differ_without_special_literals": 0}
    for line, a, b in zip(lines, tok(lines).input_ids, sp.encode(lines)):
        ok, special = a == [sp.bos_id()] + b, any(x in line for x in SPECIAL_LITERALS)
        same["same_ids"] += ok
        same["with_special_literals"] += special
        same["differ_without_special_literals"] += not ok and not special
    return same


# ---- main ----


def write(name, obj):
    path = os.path.join(OUT, name)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", os.path.relpath(path), os.path.getsize(path), "bytes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(HERE, "../../../shared/data"))
    ap.add_argument("--only", default="", help="comma-separated tokenizer names (default: all)")
    args = ap.parse_args()
    data = os.path.abspath(args.data)
    os.makedirs(OUT, exist_ok=True)
    names = ("gpt2", "llama2") + FAMILIES
    only = args.only.split(",") if args.only else names
    unknown = set(only) - set(names)
    assert not unknown, f"--only: unknown tokenizers {sorted(unknown)} (known: {', '.join(names)})"
    toks = load_tokenizers(data, only)
    made_with = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data, "tokenizers/llama2/tokenizer.model"))
    sp_made_with = dict(made_with, sentencepiece=spm.__version__)

    block_size, n_blocks_checked, n_full = 128, 50, 2
    for tname, tok in toks.items():
        for rule, reader in (("text", text_loader_lines), ("wikitext", wikitext_lines)):
            lines = reader(os.path.join(data, "wikitext-2/valid.txt"))
            blocks, dropped = run_clm_blocks(lines, tok, block_size)
            extra = {}
            if tname == "llama2":  # line by line, [BOS] + sentencepiece's ids
                extra["sentencepiece"] = sentencepiece_lines(lines, tok, sp)
                print("sentencepiece, wikitext-2 valid,", rule, extra["sentencepiece"], file=sys.stderr)
            write(
                f"wikitext2_valid_{rule}_{tname}_b{block_size}.json",
                {
                    "made_with": sp_made_with if extra else made_with,
                    "tokenizer": tname,
                    "file": "wikitext-2/valid.txt",
                    "rule": rule,
                    "block_size": block_size,
                    "group": 1000,
                    "n_lines": len(lines),
                    "n_blocks": len(blocks),
                    "dropped_tokens": dropped,
                    "hash_all": fnv1a64([t for b in blocks for t in b]),
                    "block_hashes": [fnv1a64(b) for b in blocks[:n_blocks_checked]],
                    "first_blocks": blocks[:n_full],
                    **extra,
                },
            )

    max_len, n_records, n_full = 512, 30, 3
    for fname in ("alpaca/alpaca_seed_tasks.json", "alpaca/gpteacher-codegen.json"):
        all_recs = alpaca_records(os.path.join(data, fname))
        recs = all_recs[:n_records]
        for tname, tok in toks.items():
            ours = llmt_alpaca(recs, tok, max_len)
            theirs = stanford_alpaca(recs, tok, max_len)
            stem = os.path.splitext(os.path.basename(fname))[0].replace("-", "_")
            extra = {}
            if tname == "llama2":  # every record of the file, not only the first n_records
                extra["sentencepiece"] = sentencepiece_alpaca(all_recs, tok, sp, max_len)
                print("sentencepiece,", fname, extra["sentencepiece"], file=sys.stderr)
            write(
                f"{stem}_{tname}.json",
                {
                    "made_with": sp_made_with if extra else made_with,
                    "tokenizer": tname,
                    "file": fname,
                    "model_max_length": max_len,
                    "n": len(ours),
                    "lengths": [len(i) for i, _ in ours],
                    "prompt_lengths": [sum(1 for x in l if x == IGNORE_INDEX) for _, l in ours],
                    "ids_hashes": [fnv1a64(i) for i, _ in ours],
                    "labels_hashes": [fnv1a64(l) for _, l in ours],
                    "examples": [{"input_ids": i, "labels": l} for i, l in ours[:n_full]],
                    # how llmt's separate tokenization compares with Stanford's joint one (docs/data.md)
                    "stanford_same_ids": sum(a[0] == b[0] for a, b in zip(ours, theirs)),
                    "stanford_same_labels": sum(a[1] == b[1] for a, b in zip(ours, theirs)),
                    "stanford_same_loss_tokens": sum(
                        [x for x in a[1] if x != IGNORE_INDEX] == [x for x in b[1] if x != IGNORE_INDEX]
                        for a, b in zip(ours, theirs)
                    ),
                    **extra,
                },
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
