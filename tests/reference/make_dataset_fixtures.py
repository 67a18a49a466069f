#!/usr/bin/env python3
"""Reference datasets for tests/data/test_datasets.cpp, made with Hugging Face tokenizers and the
preprocessing of transformers' run_clm.py and Stanford Alpaca's train.py, replicated here from their
published code so that the `datasets` package is not needed.

    pip install transformers tokenizers sentencepiece protobuf
    python3 tests/reference/make_dataset_fixtures.py [--data ../shared/data]

Writes tests/reference/datasets/*.json (committed). Hashes are FNV-1a 64 over the little-endian int32
bytes of a sequence, written as 16 hex digits (tests/data/test_datasets.cpp computes the same).
"""
import argparse
import json
import os
import sys
from io import StringIO

import tokenizers
import transformers
from transformers import GPT2TokenizerFast, LlamaTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "datasets")

# ---- tokenizers, as the real checkpoints configure them ----


def load_tokenizers(data):
    gpt2 = GPT2TokenizerFast.from_pretrained(os.path.join(data, "tokenizers/gpt2"))  # vocab.json + merges.txt
    # meta-llama/Llama-2-*-hf: tokenizer_config.json sets add_bos_token=True, add_eos_token=False.
    llama = LlamaTokenizerFast.from_pretrained(
        os.path.join(data, "tokenizers/llama2"), add_bos_token=True, add_eos_token=False
    )
    assert llama("Hello world!").input_ids == [1, 15043, 3186, 29991], llama("Hello world!").input_ids
    assert gpt2("Hello world").input_ids == [15496, 995]
    return {"gpt2": gpt2, "llama2": llama}


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
    args = ap.parse_args()
    data = os.path.abspath(args.data)
    os.makedirs(OUT, exist_ok=True)
    toks = load_tokenizers(data)
    made_with = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__}

    block_size, n_blocks_checked, n_full = 128, 50, 2
    for tname, tok in toks.items():
        for rule, reader in (("text", text_loader_lines), ("wikitext", wikitext_lines)):
            lines = reader(os.path.join(data, "wikitext-2/valid.txt"))
            blocks, dropped = run_clm_blocks(lines, tok, block_size)
            write(
                f"wikitext2_valid_{rule}_{tname}_b{block_size}.json",
                {
                    "made_with": made_with,
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
                },
            )

    max_len, n_records, n_full = 512, 30, 3
    for fname in ("alpaca/alpaca_seed_tasks.json", "alpaca/gpteacher-codegen.json"):
        recs = alpaca_records(os.path.join(data, fname))[:n_records]
        for tname, tok in toks.items():
            ours = llmt_alpaca(recs, tok, max_len)
            theirs = stanford_alpaca(recs, tok, max_len)
            stem = os.path.splitext(os.path.basename(fname))[0].replace("-", "_")
            write(
                f"{stem}_{tname}.json",
                {
                    "made_with": made_with,
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
                },
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
