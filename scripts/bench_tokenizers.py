#!/usr/bin/env python3
"""GPT-2 tokenizer speed, one thread: llmt beside tiktoken and Hugging Face tokenizers, same run.

    pip install tiktoken tokenizers transformers
    python3 scripts/bench_tokenizers.py [--llmt build/bin/llmt] [--data ../shared/data] [--repeats 5]

Each implementation encodes each file as one text (no special tokens in it), and then line by line
(each line without its newline, as `llmt tokenize` and the fixtures do; the peers get the list of
lines: tiktoken encode_ordinary in a loop, tokenizers encode_batch on one rayon thread):
one warm-up run, then --repeats timed runs; the median is reported. llmt runs through `llmt tokenize --bench FILE`
(which prints one JSON line) for both of its GPT-2 loaders: vocab.json + merges.txt and
gpt2.tiktoken. The peers: tiktoken.Encoding over gpt2.tiktoken with the GPT-2 pattern
(encode_ordinary), and the `tokenizers` Tokenizer behind GPT2TokenizerFast (encode, no specials;
RAYON_NUM_THREADS=1). MB = 10^6 bytes of UTF-8 input. Token counts must agree.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import tiktoken  # noqa: E402
import tokenizers  # noqa: E402
from tiktoken.load import load_tiktoken_bpe  # noqa: E402
from transformers import GPT2TokenizerFast  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def time_it(fn, arg, repeats):
    """fn(arg) returns a token count; the median seconds of `repeats` runs after a warm-up."""
    n = fn(arg)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        m = fn(arg)
        times.append(time.perf_counter() - t0)
        assert m == n
    times.sort()
    return n, times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llmt", default=os.path.join(ROOT, "build", "bin", "llmt"))
    ap.add_argument("--data", default=os.environ.get("LLMT_TEST_DATA") or os.path.join(ROOT, "..", "shared", "data"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    gdir = os.path.join(args.data, "tokenizers", "gpt2")
    files = [os.path.join(args.data, "tinyshakespeare", "input.txt"), os.path.join(args.data, "wikitext-2", "valid.txt")]

    t0 = time.perf_counter()
    ranks = load_tiktoken_bpe(os.path.join(gdir, "gpt2.tiktoken"))
    tk = tiktoken.Encoding("gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
    tk_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf = GPT2TokenizerFast.from_pretrained(gdir).backend_tokenizer
    hf_load = time.perf_counter() - t0

    print(f"# {datetime.date.today()} {platform.node()} {platform.processor() or platform.machine()}, "
          f"load average {os.getloadavg()[0]:.2f}; tiktoken {tiktoken.__version__}, tokenizers {tokenizers.__version__}")
    rows = []
    for f in files:
        with open(f, "rb") as fh:
            raw = fh.read()
        text = raw.decode("utf-8")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for tok_path, label in ((gdir, "llmt (vocab.json+merges.txt)"),
                                (os.path.join(gdir, "gpt2.tiktoken"), "llmt (gpt2.tiktoken)")):
            out = subprocess.run([args.llmt, "tokenize", "--tokenizer_name_or_path", tok_path, "--bench", f,
                                  "--bench_repeats", str(args.repeats)], check=True, capture_output=True, text=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((f, label, r["bytes"], r["tokens"], r["median_s"], r["line_tokens"], r["lines_median_s"],
                         r["load_s"]))
        n, s = time_it(lambda t: len(tk.encode_ordinary(t)), text, args.repeats)
        nl, sl = time_it(lambda ls: sum(len(tk.encode_ordinary(x)) for x in ls), lines, args.repeats)
        rows.append((f, "tiktoken " + tiktoken.__version__, len(raw), n, s, nl, sl, tk_load))
        n, s = time_it(lambda t: len(hf.encode(t, add_special_tokens=False).ids), text, args.repeats)
        nl, sl = time_it(lambda ls: sum(len(e.ids) for e in hf.encode_batch(ls, add_special_tokens=False)), lines,
                         args.repeats)
        rows.append((f, "HF tokenizers " + tokenizers.__version__, len(raw), n, s, nl, sl, hf_load))

    print(f"{'file':<26} {'implementation':<29} {'MB/s':>7} {'Mtok/s':>7} {'lines MB/s':>10} {'lines Mtok/s':>12} "
          f"{'tokens':>7} {'load s':>6}")
    for f, label, nbytes, ntok, s, nl, sl, load in rows:
        name = os.path.join(os.path.basename(os.path.dirname(f)), os.path.basename(f))
        print(f"{name:<26} {label:<29} {nbytes / s / 1e6:7.2f} {ntok / s / 1e6:7.3f} {nbytes / sl / 1e6:10.2f} "
              f"{nl / sl / 1e6:12.3f} {ntok:7d} {load:6.3f}")
    for f in files:
        counts = {(r[3], r[5]) for r in rows if r[0] == f}
        if len(counts) != 1:
            sys.exit(f"token counts differ on {f}: {counts}")

if __name__ == "__main__":
    main()
