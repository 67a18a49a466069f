#!/usr/bin/env python3
"""Reference numerics for llmt's LoRA, made with Hugging Face PEFT on the tiny fixture models.

For each case below, starting from a tiny model of make_fixtures.py (read back with transformers from
tests/reference/<model>/), wraps it with PEFT (get_peft_model, r 4, alpha 8, lora_dropout 0), and writes
tests/reference/lora/<case>/:
  adapter_init/       save_pretrained of the fresh adapter (adapter_config.json, adapter_model.safetensors)
  adapter_final/      save_pretrained after 5 AdamW steps
  reference.safetensors  the batch, step 1's logits, the loss before each step, step 1's gradients,
                      the logits after the last step
  merged/             (MERGED_CASES only) merge_and_unload() of the final adapter, save_pretrained
  reference_bf16.safetensors  the same 5 steps from adapter_init under torch.autocast(bfloat16) (the
                      parameters and AdamW in fp32, as the Trainer's --bf16): step 1's logits and
                      gradients, the 5 losses
See README.md ("LoRA") for the exact conventions.

Regenerate (CPU, seconds):
  pip install torch transformers peft safetensors numpy && python3 tests/reference/make_lora_fixtures.py

Check an adapter directory llmt wrote (PeftModel.from_pretrained loads it; its tensors against a fixture's):
  python3 tests/reference/make_lora_fixtures.py --check DIR --case CASE [--against init|final]
"""
import argparse
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "lora")
B, T, VOCAB = 2, 13, 259  # make_fixtures.py's batch
R, ALPHA, LR, BETAS, EPS, STEPS = 4, 8, 1e-2, (0.9, 0.999), 1e-8, 5

# case: (base fixture, LoraConfig arguments beyond r, alpha and dropout)
CASES = {
    # GPT-2's Conv1D: fan_in_fan_out; "c_proj" is both attn.c_proj and mlp.c_proj
    "gpt2_c_attn_c_proj": ("gpt2_tiny", dict(target_modules=["c_attn", "c_proj"], fan_in_fan_out=True)),
    "llama_q_v": ("llama_tiny", dict(target_modules=["q_proj", "v_proj"])),
    "llama_all_linear_rslora": ("llama_tiny", dict(target_modules="all-linear", use_rslora=True)),
    # qwen2_tiny ties lm_head to embed_tokens: PEFT's modules_to_save copy of lm_head unties it
    "qwen2_all_linear_lm_head": ("qwen2_tiny", dict(target_modules="all-linear", modules_to_save=["lm_head"])),
    # a trained copy of the token embeddings; on the tied base PEFT's copy feeds the input only, and the
    # head keeps the frozen base embeddings (merge_and_unload then unties the model)
    "llama_q_v_embed_tokens": ("llama_tiny", dict(target_modules=["q_proj", "v_proj"], modules_to_save=["embed_tokens"])),
    "llama_tied_q_v_embed_tokens": ("llama_tied_tiny", dict(target_modules=["q_proj", "v_proj"],
                                                            modules_to_save=["embed_tokens"])),
}
# merge_and_unload() saved for these: Conv1D, LLaMA's fused projections, a tied head untied by its copy
MERGED_CASES = ("gpt2_c_attn_c_proj", "llama_q_v", "qwen2_all_linear_lm_head")


def make_batch():
    """make_fixtures.py's batch, generator for generator."""
    gen = torch.Generator().manual_seed(42)
    input_ids = torch.randint(0, VOCAB, (B, T), generator=gen)
    labels = input_ids.clone()
    labels[0, :3] = -100
    labels[1, 9:] = -100
    return input_ids, labels


def load_base(model_dir):
    return AutoModelForCausalLM.from_pretrained(os.path.join(HERE, model_dir), dtype=torch.float32,
                                                attn_implementation="eager")


def peft_key(name):
    """named_parameters()' name of a trainable tensor as save_pretrained writes it (adapter name dropped)."""
    return name.replace(".default", "").replace(".modules_to_save", "")


def save_adapter(model, path, base_dir):
    model.save_pretrained(path)
    cfg_path = os.path.join(path, "adapter_config.json")  # the base as the fixture's name, not this machine's path
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = base_dir
    if isinstance(cfg["target_modules"], list):  # a set in PEFT: its order changes with PYTHONHASHSEED
        cfg["target_modules"] = sorted(cfg["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    readme = os.path.join(path, "README.md")  # a model card, nothing llmt reads
    if os.path.exists(readme):
        os.remove(readme)


def make_case(case):
    base_dir, extra = CASES[case]
    out = os.path.join(OUT, case)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    base = load_base(base_dir)
    torch.manual_seed(1234)  # lora_A's Kaiming-uniform draws
    model = get_peft_model(base, LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, task_type="CAUSAL_LM",
                                            **extra))
    model.train()
    save_adapter(model, os.path.join(out, "adapter_init"), base_dir)

    input_ids, labels = make_batch()
    ref = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32)}
    ref.update(train_steps(model, autocast=False))
    losses = ref["losses"].tolist()
    with torch.no_grad():  # the trained adapter's logits on the whole batch: what a merged model must give
        ref["logits_final"] = model(input_ids=input_ids).logits.float()
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference.safetensors"))
    save_adapter(model, os.path.join(out, "adapter_final"), base_dir)

    scaling = next(m.scaling["default"] for m in model.modules() if isinstance(m, LoraLayer))
    if case in MERGED_CASES:
        merged = model.merge_and_unload()
        merged.save_pretrained(os.path.join(out, "merged"))
        for f in ("generation_config.json",):
            p = os.path.join(out, "merged", f)
            if os.path.exists(p):
                os.remove(p)

    # every saved tensor has its gradient recorded under the same key, and reloads
    final = load_file(os.path.join(out, "adapter_final", "adapter_model.safetensors"))
    assert sorted(final) == sorted(k[5:] for k in ref if k.startswith("grad.")), (sorted(final), sorted(ref))
    check(os.path.join(out, "adapter_final"), case, "final", quiet=True)
    sizes = {}
    for root, _, files in os.walk(out):
        for f in files:
            sizes[os.path.relpath(os.path.join(root, f), out)] = os.path.getsize(os.path.join(root, f))
    print(f"{case}: {len(final)} adapter tensors, scaling {scaling:g}, losses {[round(x, 6) for x in losses]}")
    print("  files " + ", ".join(f"{f} {s / 1024:.1f} KiB" for f, s in sorted(sizes.items())))


def train_steps(model, autocast):
    """The fixtures' 5 steps (accumulation 2, AdamW, no clipping) on a PEFT model in train mode: step 1's
    logits and trainable gradients, and the loss before each step."""
    input_ids, labels = make_batch()
    targets = labels[:, 1:]                   # the model's shift: position t predicts labels[t + 1]
    counted = int((targets != -100).sum())   # the step's target tokens, over both micro-batches
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in named], lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    ref = {}
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss_sum = 0.0
        logits = []
        for mb in range(B):  # gradient accumulation 2: micro-batch k is the batch's sequence k
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                lg = model(input_ids=input_ids[mb:mb + 1]).logits
            loss = F.cross_entropy(lg[0, :-1].float(), targets[mb], ignore_index=-100, reduction="sum") / counted
            loss.backward()
            loss_sum += loss.item()
            logits.append(lg.detach())
        losses.append(loss_sum)
        if step == 0:
            ref["logits"] = torch.cat(logits).float()
            for n, p in named:
                ref["grad." + peft_key(n)] = p.grad.detach().clone()
        opt.step()
    ref["losses"] = torch.tensor(losses, dtype=torch.float32)
    return ref


def make_bf16(case):
    """reference_bf16.safetensors: the case's steps from its adapter_init under bf16 autocast."""
    base_dir, _ = CASES[case]
    out = os.path.join(OUT, case)
    model = PeftModel.from_pretrained(load_base(base_dir), os.path.join(out, "adapter_init"), is_trainable=True)
    model.train()
    ref = train_steps(model, autocast=True)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(out, "reference_bf16.safetensors"))
    print(f"{case} bf16 autocast: losses {[round(x, 6) for x in ref['losses'].tolist()]}")


def check(path, case, against="final", quiet=False):
    """Loads an adapter directory with PeftModel.from_pretrained onto the case's base model and compares
    its tensors (and the logits of the batch) with the fixture's adapter_<against>."""
    base_dir, _ = CASES[case]
    want_dir = os.path.join(OUT, case, "adapter_" + against)
    theirs = PeftModel.from_pretrained(load_base(base_dir), path)
    mine = PeftModel.from_pretrained(load_base(base_dir), want_dir)
    a = {peft_key(n): p for n, p in theirs.named_parameters() if "lora_" in n or "modules_to_save" in n}
    b = {peft_key(n): p for n, p in mine.named_parameters() if "lora_" in n or "modules_to_save" in n}
    if a.keys() != b.keys():
        print(f"adapter tensors differ: missing {sorted(b.keys() - a.keys())}, extra {sorted(a.keys() - b.keys())}")
        return 1
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    input_ids, _ = make_batch()
    with torch.no_grad():
        dl = (theirs(input_ids=input_ids).logits - mine(input_ids=input_ids).logits).abs().max().item()
    if not quiet:
        print(f"{len(a)} adapter tensors: max abs diff {worst:.3g}; logits max abs diff {dl:.3g}")
    if worst > 1e-6 or dl > 1e-5:
        print(f"FAIL: adapter diff {worst:.3g} (limit 1e-6), logits diff {dl:.3g} (limit 1e-5)")
        return 1
    if not quiet:
        print("OK")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", metavar="DIR", help="adapter directory (llmt's) to load with PeftModel.from_pretrained")
    ap.add_argument("--case", choices=sorted(CASES), help="the fixture case --check compares with")
    ap.add_argument("--against", choices=["init", "final"], default="final")
    ap.add_argument("--only", choices=sorted(CASES), action="append", help="make these cases only")
    ap.add_argument("--bf16_only", action="store_true", help="only reference_bf16.safetensors, from adapter_init")
    args = ap.parse_args()
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)  # one fixed reduction order
    if args.check:
        if not args.case:
            ap.error("--check needs --case")
        return check(args.check, args.case, args.against)
    for case in args.only or CASES:
        if not args.bf16_only:
            make_case(case)
        make_bf16(case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
