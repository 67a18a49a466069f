#!/usr/bin/env python3
"""Reference numerics and token ids for llmt's DPO, made with TRL's DPOTrainer on the tiny fixture models.

    pip install torch transformers peft trl datasets safetensors numpy
    python3 tests/reference/make_dpo_fixtures.py

Writes tests/reference/dpo/ (README.md there lists every file):
  <model>/            the base model each case starts from: tests/reference/llama_tiny (qwen2_tiny) with its
                      vocabulary widened to the family tokenizer's (rows 0..258 the fixture's, the rest drawn
                      here), saved by save_pretrained, with the tokenizer's files and the family's stock chat
                      template (chat_template.jinja)
  data/*.jsonl        the preference records the cases train on, as llmt reads them (--data_path)
  cases.json          per training case: the DPOConfig fields that matter, the ids TRL's _prepare_dataset
                      made (prompt_ids, chosen_ids, rejected_ids), the sequences its collator fed the model
                      (per micro-batch, truncated, unpadded, with the completion masks), every logged value of
                      the 3 steps (loss, grad_norm, rewards/*, logps/*, logits/*, entropy, mean_token_accuracy,
                      num_tokens), the precomputed reference log-probs
  <case>.safetensors  (full fine-tunes listed in SAVE_PARAMS) every parameter after the 3 steps
  <case>/adapter_init, adapter_final   (LoRA cases) PEFT's adapter before and after the 3 steps
  tokenize.json       bad and edge input: what TRL's DPOTrainer makes of it (ids, dropped records, or the
                      exception it raises)

The runs are deterministic: fp32, eager attention, dropout 0, one CPU thread, seed 0, the sequential sampler
(train_sampling_strategy="sequential"), no shuffling; PYTHONHASHSEED is fixed (TRL's is_conversational pops
a key from a set, so for a record mixing strings and message lists its answer depends on the hash seed).

Every training case is also replayed by this script's own DPO loop (replay(): plain torch, the formulas
that dpo/README.md states), which must give TRL's logged values within 2e-5 (relative) and its final
parameters within 3% of the learning rate: the fixture states the formulas, not only TRL's numbers.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

if os.environ.get("PYTHONHASHSEED") != "0":  # see the docstring: re-run with a fixed hash seed
    os.environ["PYTHONHASHSEED"] = "0"
    sys.exit(subprocess.call([sys.executable] + sys.argv))
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import peft  # noqa: E402
import safetensors  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402

transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()
torch.set_num_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "dpo")
FAMILY = os.path.join(HERE, "tokenizers_family")
TEMPLATES = os.path.join(HERE, "chat", "templates")

LR, STEPS, BATCH, ACCUM, SEED = 1e-2, 3, 2, 2, 0
# max_length of each data set: every prompt is shorter (none is dropped), one pair is longer (cut); the tiny
# models' context is 64
MAX_LENGTH = {"strings": 40, "implicit_strings": 40, "conversational": 64, "implicit_conversational": 64}

# model key: (tiny fixture, family tokenizer, its stock chat template, LoRA targets)
MODELS = {
    "llama_tiny_llama3": ("llama_tiny", "llama3", "llama3.jinja", ["q_proj", "v_proj"]),
    "qwen2_tiny_qwen2": ("qwen2_tiny", "qwen2", "qwen2.jinja", "all-linear"),
}

# The preference records. Each set has 4 pairs (one global batch of 2 x 2) and one pair longer than
# MAX_LENGTH, so truncation is in every run; "Hel" + "lo" merge across the prompt/completion boundary in
# byte-level BPE (TRL then starts the completion where the ids diverge).
LONG = ("Once upon a time there lived a king who had three daughters, and the youngest was the fairest "
        "of them all, so fair that the sun itself marvelled")
DATA = {
    "strings": [
        {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
        {"prompt": "Two and two make", "chosen": " four.", "rejected": " five, I think."},
        {"prompt": "Hel", "chosen": "lo there, friend!", "rejected": "p me."},
        {"prompt": "Tell me a story.", "chosen": " " + LONG, "rejected": " No."},
    ],
    "conversational": [
        {"prompt": [{"role": "user", "content": "What color is the sky?"}],
         "chosen": [{"role": "assistant", "content": "It is blue."}],
         "rejected": [{"role": "assistant", "content": "It is green."}]},
        {"prompt": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a fruit."}],
         "chosen": [{"role": "assistant", "content": "Apple."}],
         "rejected": [{"role": "assistant", "content": "A car."}]},
        {"prompt": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": "How are you?"}],
         "chosen": [{"role": "assistant", "content": "Fine, thanks."}],
         "rejected": [{"role": "assistant", "content": "Go away."}]},
        {"prompt": [{"role": "user", "content": "Tell me a story."}],
         "chosen": [{"role": "assistant", "content": LONG}],
         "rejected": [{"role": "assistant", "content": "No."}]},
    ],
    # the implicit-prompt form: chosen and rejected only, the prompt their common prefix (TRL's extract_prompt)
    "implicit_strings": [
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "Two and two make four.", "rejected": "Two and two make five, I think."},
        {"chosen": "Question: is fire hot? Answer: yes", "rejected": "Question: is fire hot? Answer: no"},
        {"chosen": "Tell me a story. " + LONG, "rejected": "Tell me a story. No."},
    ],
    "implicit_conversational": [
        {"chosen": [{"role": "user", "content": "What color is the sky?"},
                    {"role": "assistant", "content": "It is blue."}],
         "rejected": [{"role": "user", "content": "What color is the sky?"},
                      {"role": "assistant", "content": "It is green."}]},
        {"chosen": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a fruit."},
                    {"role": "assistant", "content": "Apple."}],
         "rejected": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a fruit."},
                      {"role": "assistant", "content": "A car."}]},
        {"chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                    {"role": "user", "content": "How are you?"}, {"role": "assistant", "content": "Fine."}],
         "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                      {"role": "user", "content": "How are you?"}, {"role": "assistant", "content": "Go away."}]},
        {"chosen": [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": LONG}],
         "rejected": [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "No."}]},
    ],
}

# Training cases: (name, model, data, options). Options: beta, loss_type, label_smoothing, lora, precompute,
# truncation_mode, max_length. Each runs 3 steps of DPOTrainer, per-device batch 2, gradient accumulation 2.
CASES = []
for _m in MODELS:
    CASES += [
        (f"{_m}.strings", _m, "strings", {}),
        (f"{_m}.strings_beta0.5", _m, "strings", {"beta": 0.5}),
        (f"{_m}.conversational", _m, "conversational", {}),
        (f"{_m}.implicit_strings", _m, "implicit_strings", {}),
        (f"{_m}.implicit_conversational", _m, "implicit_conversational", {}),
        (f"{_m}.strings_keep_end", _m, "strings", {"truncation_mode": "keep_end"}),
        (f"{_m}.strings_precompute", _m, "strings", {"precompute": True}),
        (f"{_m}.lora_strings", _m, "strings", {"lora": True}),
        (f"{_m}.lora_conversational", _m, "conversational", {"lora": True}),
        (f"{_m}.lora_conversational_precompute", _m, "conversational", {"lora": True, "precompute": True}),
    ]
CASES += [
    ("llama_tiny_llama3.strings_ipo", "llama_tiny_llama3", "strings", {"loss_type": "ipo"}),
    ("llama_tiny_llama3.strings_hinge", "llama_tiny_llama3", "strings", {"loss_type": "hinge"}),
    ("llama_tiny_llama3.strings_robust", "llama_tiny_llama3", "strings", {"loss_type": "robust",
                                                                        "label_smoothing": 0.1}),
]
# full fine-tunes whose parameters after the 3 steps are saved (the others record the logged values only:
# steps 2 and 3 already depend on every update before them)
SAVE_PARAMS = {"llama_tiny_llama3.strings", "qwen2_tiny_qwen2.conversational"}
# pairs of cases that must agree: precomputed reference log-probs against the reference model run live
SAME_AS = {
    "llama_tiny_llama3.strings_precompute": "llama_tiny_llama3.strings",
    "qwen2_tiny_qwen2.strings_precompute": "qwen2_tiny_qwen2.strings",
    "llama_tiny_llama3.lora_conversational_precompute": "llama_tiny_llama3.lora_conversational",
    "qwen2_tiny_qwen2.lora_conversational_precompute": "qwen2_tiny_qwen2.lora_conversational",
}

METRICS = ["loss", "grad_norm", "learning_rate", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
           "rewards/margins", "logps/chosen", "logps/rejected", "logits/chosen", "logits/rejected", "entropy",
           "mean_token_accuracy", "num_tokens"]


# ---------------------------------------------------------------------------------------------------------
# the base models


def make_model(key):
    """tests/reference/<tiny> with the vocabulary of the family tokenizer, saved in dpo/<key>/."""
    tiny, family, template, _ = MODELS[key]
    out = os.path.join(OUT, key)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(FAMILY, family, f), out)
    shutil.copy(os.path.join(TEMPLATES, template), os.path.join(out, "chat_template.jinja"))
    tok = AutoTokenizer.from_pretrained(out)
    vocab = len(tok)

    src = os.path.join(HERE, tiny)
    config = AutoConfig.from_pretrained(src)
    old_vocab = config.vocab_size
    config.vocab_size = vocab
    config.bos_token_id = tok.bos_token_id
    config.eos_token_id = tok.eos_token_id
    config.pad_token_id = None
    state = load_file(os.path.join(src, "model.safetensors"))
    gen = torch.Generator().manual_seed(4848)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name not in state:
            continue  # tied
        w = state[name]
        extra = torch.randn(vocab - old_vocab, w.shape[1], generator=gen) * 0.08
        state[name] = torch.cat([w, extra])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    model.tie_weights()
    model.generation_config.bos_token_id = tok.bos_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = None
    model.save_pretrained(out)
    return out


def model_dir(key):
    return os.path.join(OUT, key)


def load_model(key):
    return AutoModelForCausalLM.from_pretrained(model_dir(key), dtype=torch.float32, attn_implementation="eager")


def load_tokenizer(key):
    return AutoTokenizer.from_pretrained(model_dir(key))


# ---------------------------------------------------------------------------------------------------------
# TRL runs


def dpo_config(tmp, opts, max_steps=STEPS):
    return DPOConfig(
        output_dir=tmp, per_device_train_batch_size=BATCH, gradient_accumulation_steps=ACCUM, max_steps=max_steps,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, optim="adamw_torch",
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, logging_steps=1, report_to="none",
        save_strategy="no", bf16=False, fp16=False, gradient_checkpointing=False, use_cpu=True, seed=SEED,
        data_seed=SEED, train_sampling_strategy="sequential", dataloader_num_workers=0, disable_dropout=True,
        beta=opts.get("beta", 0.1), loss_type=[opts.get("loss_type", "sigmoid")],
        label_smoothing=opts.get("label_smoothing", 0.0), precompute_ref_log_probs=opts.get("precompute", False),
        max_length=opts.get("max_length", 40), truncation_mode=opts.get("truncation_mode", "keep_start"),
    )


def lora_config(key):
    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=MODELS[key][3], task_type="CAUSAL_LM")


class RecordingCollator:
    """TRL's collator, keeping what it gives the model: each row unpadded, with its completion mask."""

    def __init__(self, inner):
        self.inner, self.batches = inner, []

    def __call__(self, examples):
        out = self.inner(examples)
        rows = []
        for ids, att, comp in zip(out["input_ids"], out["attention_mask"], out["completion_mask"]):
            n = int(att.sum())
            assert att[:n].all() and not att[n:].any()  # right padding
            rows.append({"input_ids": ids[:n].tolist(), "completion_mask": comp[:n].tolist()})
        b = len(examples)
        self.batches.append({"chosen": rows[:b], "rejected": rows[b:]})
        return out


def save_adapter(model, path, base):
    model.save_pretrained(path)
    cfg_path = os.path.join(path, "adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = base  # the fixture's name, not this machine's path
    if isinstance(cfg["target_modules"], list):
        cfg["target_modules"] = sorted(cfg["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    readme = os.path.join(path, "README.md")
    if os.path.exists(readme):
        os.remove(readme)


def run_case(name, key, data, opts):
    tok = load_tokenizer(key)
    model = load_model(key)
    with tempfile.TemporaryDirectory() as tmp:
        args = dpo_config(tmp, {"max_length": MAX_LENGTH[data], **opts})
        trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(DATA[data]),
                             processing_class=tok, peft_config=lora_config(key) if opts.get("lora") else None)
        for cb in (transformers.PrinterCallback, transformers.ProgressCallback):
            trainer.remove_callback(cb)
        rec = RecordingCollator(trainer.data_collator)
        trainer.data_collator = rec
        prepared = [dict(r) for r in trainer.train_dataset]
        init_state = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        if opts.get("lora"):
            save_adapter(trainer.model, os.path.join(OUT, name, "adapter_init"), key)
        trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and "train_runtime" not in h]
    assert len(logs) == STEPS, logs
    assert len(prepared) == len(DATA[data]), f"{name}: a record was dropped"
    case = {
        "model": key, "data": f"data/{data}.jsonl",
        "config": {"beta": args.beta, "loss_type": args.loss_type[0], "label_smoothing": args.label_smoothing,
                   "use_peft": bool(opts.get("lora")), "precompute_ref_log_probs": args.precompute_ref_log_probs,
                   "max_length": args.max_length, "truncation_mode": args.truncation_mode,
                   "per_device_train_batch_size": BATCH, "gradient_accumulation_steps": ACCUM, "max_steps": STEPS,
                   "learning_rate": LR, "lr_scheduler_type": "constant", "weight_decay": 0.0, "max_grad_norm": 1.0,
                   "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8, "seed": SEED},
        "pad_token_id": tok.pad_token_id,
        "prepared": [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in prepared],
        # micro-batch k of every step holds records [2k, 2k+1] (sequential sampler, 4 records = one step)
        "micro_batches": rec.batches[:ACCUM],
        "steps": [{m: h[m] for m in METRICS} for h in logs],
    }
    assert len(rec.batches) == STEPS * ACCUM, name
    for i, b in enumerate(rec.batches):  # every step was fed the same two micro-batches
        assert b == rec.batches[i % ACCUM], name
    if opts.get("precompute"):
        case["ref_logps"] = [{"chosen": r["ref_chosen_logps"], "rejected": r["ref_rejected_logps"]}
                             for r in trainer.train_dataset]
    if opts.get("lora"):
        case["lora"] = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": MODELS[key][3]}
        save_adapter(trainer.model, os.path.join(OUT, name, "adapter_final"), key)
        case["adapter_init"] = f"{name}/adapter_init"
        case["adapter_final"] = f"{name}/adapter_final"
    final = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    if name in SAVE_PARAMS:
        save_file({n: v.contiguous() for n, v in final.items()}, os.path.join(OUT, f"{name}.safetensors"))
        case["params_final"] = f"{name}.safetensors"
    replay(name, key, case, init_state, final)
    return case


# ---------------------------------------------------------------------------------------------------------
# the replay: DPO as the note describes it, in plain torch, from the ids the collator recorded


def sequence_stats(model, rows):
    """Per row: sum of the completion tokens' log-probs, and the per-token sums the metrics need."""
    out = []
    for r in rows:
        ids = torch.tensor([r["input_ids"]])
        mask = torch.tensor(r["completion_mask"][1:], dtype=torch.bool)  # position t predicts token t + 1
        logits = model(input_ids=ids).logits[0, :-1].float()
        lg = logits.detach()
        logp = torch.log_softmax(logits, -1)
        tgt = ids[0, 1:]
        tok_logp = logp.gather(-1, tgt[:, None])[:, 0]
        p = logp.detach().exp()
        out.append({
            "logps": (tok_logp * mask).sum(),
            "n": int(mask.sum()),
            "logits_sum": float(lg.mean(-1)[mask].sum()),
            "entropy_sum": float((-(p * logp.detach()).sum(-1))[mask].sum()),
            "top1": int((lg.argmax(-1) == tgt)[mask].sum()),
            "tokens": len(r["input_ids"]),
        })
    return out


def pair_losses(cfg, c, r, rc, rr, nc, nr):
    beta, ls = cfg["beta"], cfg["label_smoothing"]
    d = (c - rc) - (r - rr)
    t = cfg["loss_type"]
    if t == "sigmoid":
        return -F.logsigmoid(beta * d)
    if t == "hinge":
        return torch.relu(1 - beta * d)
    if t == "ipo":
        return ((c - rc) / max(nc, 1) - (r - rr) / max(nr, 1) - 1 / (2 * beta)) ** 2
    if t == "robust":
        return (-(1 - ls) * F.logsigmoid(beta * d) + ls * F.logsigmoid(-beta * d)) / (1 - 2 * ls)
    raise ValueError(t)


def replay(name, key, case, init_state, trl_final):
    cfg = case["config"]
    model = load_model(key)
    if cfg["use_peft"]:
        model = peft.get_peft_model(model, lora_config(key))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init_state[n])
    model.train()
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for _, p in params], lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    ref = None
    if not cfg["use_peft"]:
        ref = load_model(key).eval()

    def reference(rows):
        with torch.no_grad():
            if ref is not None:
                return sequence_stats(ref, rows)
            with model.disable_adapter():
                return sequence_stats(model, rows)

    mbs = case["micro_batches"]
    pre = None
    if cfg["precompute_ref_log_probs"]:  # computed once, before training, with the starting model
        pre = [(reference(mb["chosen"]), reference(mb["rejected"])) for mb in mbs]
    total_tokens = 0
    for step, want in enumerate(case["steps"]):
        opt.zero_grad()
        got = {k: [] for k in METRICS if k not in ("loss", "grad_norm", "learning_rate", "num_tokens")}
        loss_sum = 0.0
        for k, mb in enumerate(mbs):
            sc, sr = sequence_stats(model, mb["chosen"]), sequence_stats(model, mb["rejected"])
            rc, rr = pre[k] if pre else (reference(mb["chosen"]), reference(mb["rejected"]))
            c = torch.stack([x["logps"] for x in sc])
            r = torch.stack([x["logps"] for x in sr])
            cref = torch.stack([x["logps"] for x in rc]).detach()
            rref = torch.stack([x["logps"] for x in rr]).detach()
            losses = torch.stack([pair_losses(cfg, c[i], r[i], cref[i], rref[i], sc[i]["n"], sr[i]["n"])
                                  for i in range(len(sc))])
            loss = losses.mean() / len(mbs)  # the Trainer divides by gradient_accumulation_steps
            loss.backward()
            loss_sum += float(loss)
            cr, rw = cfg["beta"] * (c - cref).detach(), cfg["beta"] * (r - rref).detach()
            got["rewards/chosen"].append(float(cr.mean()))
            got["rewards/rejected"].append(float(rw.mean()))
            got["rewards/accuracies"].append(float((cr > rw).float().mean()))
            got["rewards/margins"].append(float((cr - rw).mean()))
            got["logps/chosen"].append(float(c.mean()))
            got["logps/rejected"].append(float(r.mean()))
            got["logits/chosen"].append(sum(x["logits_sum"] for x in sc) / sum(x["n"] for x in sc))
            got["logits/rejected"].append(sum(x["logits_sum"] for x in sr) / sum(x["n"] for x in sr))
            got["entropy"].append(sum(x["entropy_sum"] for x in sc + sr) / sum(x["n"] for x in sc + sr))
            got["mean_token_accuracy"].append(sum(x["top1"] for x in sc) / sum(x["n"] for x in sc))
            total_tokens += sum(x["tokens"] for x in sc + sr)
        norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        opt.step()
        check = {m: sum(v) / len(v) for m, v in got.items()}  # the mean over the step's micro-batches
        check.update(loss=loss_sum, grad_norm=float(norm), learning_rate=LR, num_tokens=total_tokens)
        for m in METRICS:
            tol = 2e-5 * max(1.0, abs(want[m]))
            assert abs(check[m] - want[m]) <= tol, f"{name} step {step + 1} {m}: replay {check[m]} TRL {want[m]}"
    # Adam amplifies differences of rounding where a parameter's gradients cancel over the steps (its m near
    # zero) and turns noise in a gradient that is nearly zero (a key bias: RoPE aside, adding a constant to
    # every score of a softmax row changes nothing) into steps of up to lr, so the parameters are held to 3%
    # of lr. Seen: up to 1.0e-4 (Qwen2's layer-0 k_proj at beta 0.5), most cases under 3e-5; cases.json
    # records each case's worst as replay_max_param_diff.
    worst, where = 0.0, ""
    for n, p in params:
        d = (p.detach() - trl_final[n]).abs().max().item()
        if d > worst:
            worst, where = d, n
    assert worst <= 3e-2 * LR, f"{name}: {where} after the steps differs from TRL's by {worst}"
    case["replay_max_param_diff"] = worst


# ---------------------------------------------------------------------------------------------------------
# bad and edge input: what TRL's DPOTrainer does with it


def prepare_only(key, records, opts):
    """DPOTrainer's preparation of `records`: each kept record's ids, and the collated sequences."""
    tok = load_tokenizer(key)
    model = load_model(key)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            trainer = DPOTrainer(model=model, args=dpo_config(tmp, opts, max_steps=1),
                                 train_dataset=Dataset.from_list(records), processing_class=tok)
        except Exception as e:  # noqa: BLE001  (what TRL raises is the fixture)
            return {"error": type(e).__name__, "message": str(e).splitlines()[0][:300]}
        prepared = [dict(r) for r in trainer.train_dataset]
        out = {"prepared": [{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in prepared]}
        if prepared:
            rec = RecordingCollator(trainer.data_collator)
            rec([{k: r[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")} for r in prepared])
            out["collated"] = rec.batches[0]
    return out


def tokenize_cases(key):
    tok = load_tokenizer(key)
    eos = tok.eos_token
    ok = {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}
    u = lambda s: {"role": "user", "content": s}  # noqa: E731
    a = lambda s: {"role": "assistant", "content": s}  # noqa: E731
    long_prompt = "Tell me a story. " + LONG  # more than 20 tokens
    cases = {
        # the EOS text is appended to a string completion unless it already ends with it
        "eos_already_there": ([{"prompt": "The sky is", "chosen": " blue." + eos, "rejected": " green."}], {}),
        # an empty string completion: the completion is the EOS alone
        "empty_string_completion": ([{"prompt": "The sky is", "chosen": "", "rejected": " green."}], {}),
        # an empty prompt string
        "empty_string_prompt": ([{"prompt": "", "chosen": "Blue.", "rejected": "Green."}], {}),
        # an assistant message with empty content: the template's header and end of turn remain
        "empty_assistant_content": ([{"prompt": [u("What color is the sky?")], "chosen": [a("")],
                                      "rejected": [a("Green.")]}], {}),
        # an empty list of completion messages
        "empty_message_list": ([{"prompt": [u("What color is the sky?")], "chosen": [],
                                 "rejected": [a("Green.")]}], {}),
        # a prompt longer than max_length: dropped by keep_start (datasets' filter, no message), kept by
        # keep_end, whose collator keeps the last max_length ids of prompt + completion
        "prompt_over_max_length_keep_start": ([ok, {"prompt": long_prompt, "chosen": " Yes.", "rejected": " No."}],
                                              {"max_length": 20}),
        "prompt_over_max_length_keep_end": ([ok, {"prompt": long_prompt, "chosen": " Yes.", "rejected": " No."}],
                                            {"max_length": 20, "truncation_mode": "keep_end"}),
        # the prompt alone exactly max_length ids: dropped too (the filter keeps len(prompt_ids) < max_length)
        "completion_over_max_length": ([ok, {"prompt": "Tell me a story.", "chosen": " " + LONG,
                                             "rejected": " No."}], {"max_length": 20}),
        # the implicit form with prompts that differ: the common prefix is what is shared
        "implicit_strings_differ_at_start": ([{"chosen": "Blue sky.", "rejected": "Green sky."}], {}),
        "implicit_strings_space_before_divergence": ([{"chosen": "The sky is blue.",
                                                       "rejected": "The sky is green."}], {}),
        "implicit_strings_identical": ([{"chosen": "The sky is blue.", "rejected": "The sky is blue."}], {}),
        "implicit_strings_one_prefix_of_other": ([{"chosen": "The sky is blue", "rejected": "The sky is blue."}],
                                                 {}),
        "implicit_messages_first_differ": ([{"chosen": [u("Hi"), a("Hello!")],
                                             "rejected": [u("Hey"), a("Go away.")]}], {}),
        "implicit_messages_user_turns_differ": ([{"chosen": [u("Hi"), a("Hello!"), u("Bye"), a("Ciao.")],
                                                  "rejected": [u("Hi"), a("Hello!"), u("See you"), a("No.")]}],
                                                {}),
        "implicit_messages_identical": ([{"chosen": [u("Hi"), a("Hello!")], "rejected": [u("Hi"), a("Hello!")]}],
                                        {}),
        # a prompt string with message-list completions (and the reverse)
        "mixed_prompt_string_messages": ([{"prompt": "Hi", "chosen": [a("Hello!")], "rejected": [a("Go.")]}], {}),
        "mixed_prompt_messages_strings": ([{"prompt": [u("Hi")], "chosen": "Hello!", "rejected": "Go."}], {}),
        # a conversational prompt that ends with an assistant message: TRL still adds the generation prompt
        "prompt_ends_with_assistant": ([{"prompt": [u("Hi"), a("Hello")], "chosen": [a("!")],
                                         "rejected": [a("?")]}], {}),
    }
    out = {}
    for name, (records, opts) in cases.items():
        # the data sets' max_length: 64 for records with message lists (no prompt of them is that long), else 40
        conv = any(isinstance(v, list) for rec in records for v in rec.values())
        opts = {"max_length": 64 if conv else 40, **opts}
        r = prepare_only(key, records, opts)
        r["records"] = records
        r["options"] = {"max_length": opts["max_length"],
                        "truncation_mode": opts.get("truncation_mode", "keep_start")}
        out[name] = r
    return out


# ---------------------------------------------------------------------------------------------------------


def main():
    os.makedirs(OUT, exist_ok=True)
    for d in os.listdir(OUT):
        p = os.path.join(OUT, d)
        if d != "README.md":
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    for key in MODELS:
        make_model(key)
    os.makedirs(os.path.join(OUT, "data"))
    for name, records in DATA.items():
        with open(os.path.join(OUT, "data", f"{name}.jsonl"), "w") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")

    cases = {}
    for name, key, data, opts in CASES:
        cases[name] = run_case(name, key, data, opts)
        s = cases[name]["steps"]
        print(f"{name}: losses {[round(x['loss'], 6) for x in s]}, margins "
              f"{[round(x['rewards/margins'], 6) for x in s]}")
    for a, b in SAME_AS.items():
        for sa, sb in zip(cases[a]["steps"], cases[b]["steps"]):
            for m in METRICS:
                if m != "num_tokens":
                    assert abs(sa[m] - sb[m]) <= 1e-5 * max(1, abs(sb[m])), (a, b, m, sa[m], sb[m])
        assert cases[a]["micro_batches"] == cases[b]["micro_batches"], (a, b)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                "trl": trl.__version__, "datasets": datasets.__version__, "safetensors": safetensors.__version__}
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump({"versions": versions, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    tok_cases = {key: tokenize_cases(key) for key in MODELS}
    with open(os.path.join(OUT, "tokenize.json"), "w") as f:
        json.dump({"versions": versions, "models": tok_cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for key, tc in tok_cases.items():
        for name, r in tc.items():
            what = r.get("error") or f"{len(r['prepared'])} kept of {len(r['records'])}"
            print(f"{key} {name}: {what}")
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, fs in os.walk(OUT) for f in fs)
    print(f"{OUT}: {total / 1024:.0f} KiB; {versions}")


if __name__ == "__main__":
    main()
