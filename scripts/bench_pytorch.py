#!/usr/bin/env python3
"""PyTorch peer for llmt's CPU benchmark: time whole GPT-2 training steps on the CPU.

One step = forward with labels, backward, torch.optim.AdamW step, zero_grad, on random tokens,
randomly initialised model, fp32, eager attention, dropout 0. Prints one JSON line.
--lora R: PEFT's LoRA of rank R on every linear projection (all-linear, lora_dropout 0), the model
frozen, AdamW over the adapter only: the peer of `llmt bench --use_peft True --lora_r R
--lora_target_modules all-linear --dropout 0`.

  pip install torch transformers [peft] && python3 scripts/bench_pytorch.py [--threads N] [--steps 10] ...
"""
import argparse
import json
import os
import statistics
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

PRESETS = {  # n_embd, n_layer, n_head
    "gpt2": (768, 12, 12),
    "gpt2-medium": (1024, 24, 16),
    "gpt2-large": (1280, 36, 20),
    "gpt2-xl": (1600, 48, 25),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2", choices=sorted(PRESETS))
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq_len", type=int, default=64)
    ap.add_argument("--bf16", action="store_true", help="torch.autocast(bfloat16), as llmt bench --bf16 is compared with")
    ap.add_argument("--lora", type=int, default=0, metavar="R", help="train a PEFT LoRA adapter of rank R (all-linear)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n_embd, n_layer, n_head = PRESETS[args.model]
    # no dropout: compare with llmt bench --dropout 0, the same arithmetic on both sides
    config = GPT2Config(n_embd=n_embd, n_layer=n_layer, n_head=n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config).to(torch.float32).train()
    if args.lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0,
                                                 target_modules="all-linear", task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq_len))

    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)

    median = statistics.median(times)
    print(json.dumps({
        "peer": "pytorch", "torch": torch.__version__, "model": args.model, "device": "cpu",
        "threads": torch.get_num_threads(), "batch": args.batch, "seq_len": args.seq_len,
        "precision": "bf16 autocast" if args.bf16 else "fp32", "lora_r": args.lora or None,
        "step_ms_median": round(median * 1e3, 2), "step_ms_min": round(min(times) * 1e3, 2),
        "tokens_per_s": round(args.batch * args.seq_len / median, 1),
    }))


if __name__ == "__main__":
    main()
