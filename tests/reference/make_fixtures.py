#!/usr/bin/env python3
"""Reference numerics for llmt's model tests, made with Hugging Face transformers.

Makes tiny, randomly initialised models under tests/reference/:
  gpt2_tiny/        GPT2LMHeadModel, gelu_new, tied embeddings
  llama_tiny/       LlamaForCausalLM, grouped-query attention (4 heads, 2 kv heads), untied lm_head
  llama_tied_tiny/  the same LLaMA with tied embeddings, 4 kv heads, rope_theta 500000
  llama31_tiny/     Llama 3.1's config shape: llama3 rope scaling (factor 8, original context 16), head_dim
  mistral_tiny/     MistralForCausalLM, 1 kv head, sliding_window 5 (within the 13-token batch: every layer's
                    attention is banded)
  qwen2_tiny/       Qwen2ForCausalLM: q, k, v biases, tied embeddings
  qwen2_window_tiny/ the same Qwen2 with use_sliding_window, sliding_window 4 and max_window_layers 1:
                    layer 0 full attention, layer 1 a window of 4 keys (local and global layers mixed)
  llama_bias_tiny/  LlamaForCausalLM with attention_bias and mlp_bias
  qwen3_tiny/       Qwen3ForCausalLM: per-head q/k RMSNorm, head_dim 16 apart from hidden 32 / 4 heads, tied
  phi3_tiny/        Phi3ForCausalLM: q, k, v stored as one qkv_proj, gate and up as one gate_up_proj
  phi3_longrope_tiny/ the same Phi-3 with Phi-4-mini's rope: longrope (short and long factors, original
                    context 8 < the batch's 13 tokens, so the long factors apply, attention factor
                    sqrt(2)) and partial_rotary_factor 0.75 (6 of a head's 8 channels rotate)
  gemma3_tiny/      Gemma3ForCausalLM: GeGLU, (1 + w) norms, sandwich norms, scaled embeddings, q/k norms,
                    a sliding layer (window 5, RoPE base 1e4) and a full one (1e6, linear x2)
  gemma2_tiny/      Gemma2ForCausalLM: the same block without q/k norms, default layer pattern,
                    query_pre_attn_scalar 24, soft-caps 0.5 (scores) and 2 (logits)
Each directory holds the Hugging Face export (config.json, model.safetensors, float32),
reference.safetensors: one fixed batch, its logits, loss and gradients, and the parameters after
3 AdamW steps on that batch (see README.md for the exact contents and conventions), and
reference_bf16.safetensors: the same under torch.autocast(bfloat16).

Everything is deterministic: torch.manual_seed, float32, attn_implementation="eager", every
dropout probability 0, and the model in train() mode (with dropout 0 this equals eval mode).

Regenerate (CPU is enough, takes seconds):
  pip install torch transformers safetensors numpy && python3 tests/reference/make_fixtures.py

Check a model that llmt exported in Hugging Face format against a fixture:
  python3 tests/reference/make_fixtures.py --check-llmt PATH --against gpt2_tiny|llama_tiny|llama_tied_tiny
"""
import argparse
import copy
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM,
                          Gemma3TextConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
B, T, VOCAB = 2, 13, 259
LR, BETAS, EPS, WEIGHT_DECAY, STEPS = 1e-2, (0.9, 0.999), 1e-8, 0.1, 3


def gpt2_config():
    return GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                      activation_function="gelu_new", layer_norm_epsilon=1e-5,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                      tie_word_embeddings=True, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)


def llama_config(tied=False):
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4 if tied else 2,
                       max_position_embeddings=64, rms_norm_eps=1e-6,
                       rope_theta=500000.0 if tied else 10000.0, tie_word_embeddings=tied,
                       hidden_act="silu", attention_bias=False, mlp_bias=False, attention_dropout=0.0)


def llama31_config():
    """Llama 3.1's shape of config, tiny: llama3 rope scaling over an original context of 16, so the
    13-token batch spans the blended band (wavelength 6.3 between 16/4 and 16/1) and the scaled ones."""
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
                       rms_norm_eps=1e-5, rope_theta=500000.0,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                       tie_word_embeddings=False, hidden_act="silu", attention_bias=False, mlp_bias=False,
                       attention_dropout=0.0)


def mistral_config():
    """Mistral: LLaMA with grouped-query attention and a sliding window of 5 keys, shorter than the batch's
    13 tokens and than generate.json's prompts plus new tokens: query i sees keys i-4 .. i."""
    return MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=5, tie_word_embeddings=False,
                         hidden_act="silu", attention_dropout=0.0)


def qwen2_config():
    """Qwen2: LLaMA with biases on the q, k and v projections (not o), tied embeddings here."""
    return Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
                       hidden_act="silu", attention_dropout=0.0)


def qwen2_window_config():
    """Qwen2 with a sliding window on the layers from max_window_layers on (Qwen2Config's rule): layer 0
    attends causally to everything, layer 1 to its last 4 keys."""
    c = qwen2_config()
    c.use_sliding_window = True
    c.sliding_window = 4
    c.max_window_layers = 1
    c.layer_types = ["full_attention", "sliding_attention"]  # what Qwen2Config derives from the above
    return c


def qwen3_config():
    """Qwen3: LLaMA with an RMSNorm over each head of q and of k before RoPE, and a head_dim (16) that
    is not hidden_size / num_attention_heads (8): q_proj's out and o_proj's in are 4 x 16 = 64."""
    return Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False,
                       use_sliding_window=False, hidden_act="silu", attention_dropout=0.0)


def phi3_config():
    """Phi-3 (mini 4k's shape of config, tiny): LLaMA's block with q, k, v in one qkv_proj tensor and
    gate, up in one gate_up_proj; no padding_idx (pad_token_id None), so every embedding row learns."""
    return Phi3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      original_max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
                      sliding_window=None, hidden_act="silu", bos_token_id=1, eos_token_id=VOCAB - 1,
                      pad_token_id=None)


def phi3_longrope_config():
    """Phi-4-mini's rope on the tiny Phi-3: longrope with an original context of 8 (max 64: factor 8,
    attention factor sqrt(1 + ln 8 / ln 8) = sqrt 2), per-frequency factors all distinct, and
    partial_rotary_factor 0.75: rotary_dim int(8 * 0.75) = 6, three factors a set."""
    c = phi3_config()
    c.original_max_position_embeddings = 8
    c.rope_parameters = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "short_factor": [1.0, 1.25, 2.5], "long_factor": [1.5, 4.0, 11.0],
                         "original_max_position_embeddings": 8}
    c.partial_rotary_factor = 0.75
    c.validate_rope()
    return c


def gemma3_config():
    """Gemma 3's text model, tiny: GeGLU, (1 + w) RMSNorms, sandwich norms, embeddings times sqrt(32),
    q/k norms, head_dim 16 apart from hidden 32 / 4 heads; layer 0 slides over a window of 5 keys
    (shorter than the 13-token batch) with its own RoPE base 10000, layer 1 is full with base 1e6 and
    linear scaling x2. query_pre_attn_scalar = head_dim and no soft-caps (what llmt computes yet); no
    padding_idx, so every embedding row learns."""
    return Gemma3TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                            max_position_embeddings=64, rms_norm_eps=1e-6, sliding_window=5,
                            layer_types=["sliding_attention", "full_attention"],
                            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                "rope_theta": 1000000.0},
                                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                            final_logit_softcapping=None, attn_logit_softcapping=None,
                            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, attention_bias=False,
                            attention_dropout=0.0, bos_token_id=1, eos_token_id=VOCAB - 1, pad_token_id=None)


def gemma2_config():
    """Gemma 2, tiny: Gemma 3's block without q/k norms, one RoPE base, transformers' default layer
    pattern (layer 0 slides over 5 keys, layer 1 full); an attention scale of 24^-0.5 apart from
    head_dim 16, and soft-caps small enough to bite on these weights (scores capped at 0.5 move the
    logits by 3%, logits capped at 2 by 18%; the published 50 and 30 would move them by 0.1%)."""
    return Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
                        max_position_embeddings=64, rms_norm_eps=1e-6, sliding_window=5,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        final_logit_softcapping=2.0, attn_logit_softcapping=0.5,
                        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, attention_bias=False,
                        attention_dropout=0.0, bos_token_id=1, eos_token_id=VOCAB - 1, pad_token_id=None)


def llama_bias_config():
    """A LLaMA config with attention_bias and mlp_bias: biases on q, k, v, o, gate, up and down."""
    c = llama_config(tied=False)
    c.attention_bias = True
    c.mlp_bias = True
    return c


MODELS = {
    "gpt2_tiny": (GPT2LMHeadModel, gpt2_config),
    "llama_tiny": (LlamaForCausalLM, lambda: llama_config(tied=False)),
    "llama_tied_tiny": (LlamaForCausalLM, lambda: llama_config(tied=True)),
    "llama31_tiny": (LlamaForCausalLM, llama31_config),
    "mistral_tiny": (MistralForCausalLM, mistral_config),
    "qwen2_tiny": (Qwen2ForCausalLM, qwen2_config),
    "qwen2_window_tiny": (Qwen2ForCausalLM, qwen2_window_config),
    "llama_bias_tiny": (LlamaForCausalLM, llama_bias_config),
    "qwen3_tiny": (Qwen3ForCausalLM, qwen3_config),
    "phi3_tiny": (Phi3ForCausalLM, phi3_config),
    "phi3_longrope_tiny": (Phi3ForCausalLM, phi3_longrope_config),
    "gemma3_tiny": (Gemma3ForCausalLM, gemma3_config),
    "gemma2_tiny": (Gemma2ForCausalLM, gemma2_config),
}


def no_decay_names(model):
    """Hugging Face Trainer rule: no weight decay for biases and LayerNorm/RMSNorm weights."""
    names = set()
    for mod_name, mod in model.named_modules():
        is_norm = isinstance(mod, torch.nn.LayerNorm) or type(mod).__name__.endswith("RMSNorm")
        for p_name, _ in mod.named_parameters(recurse=False):
            if is_norm or p_name == "bias":
                names.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    return names


def randomize(model, gen):
    """Overwrite every parameter (tied ones once) so that no code path sees a 0 or a 1."""
    no_decay = no_decay_names(model)
    norm_centre = 0.0 if model.config.model_type.startswith("gemma") else 1.0  # Gemma's norms are (1 + w)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith(".bias"):
                p.copy_(0.05 * noise)
            elif name in no_decay:  # norm weight
                p.copy_(norm_centre + 0.1 * noise)
            else:
                p.copy_(0.08 * noise)


def build(name):
    cls, make_config = MODELS[name]
    torch.manual_seed(1234)
    config = make_config()
    config._attn_implementation = "eager"
    model = cls(config).to(torch.float32)
    randomize(model, torch.Generator().manual_seed(hash_name(name)))
    model.train()
    return model


def hash_name(name):
    return sum((i + 1) * ord(c) for i, c in enumerate(name))  # stable across runs (unlike hash())


def make_batch():
    gen = torch.Generator().manual_seed(42)
    input_ids = torch.randint(0, VOCAB, (B, T), generator=gen)
    labels = input_ids.clone()
    labels[0, :3] = -100
    labels[1, 9:] = -100
    return input_ids, labels


def param_groups(model):
    no_decay = no_decay_names(model)
    # Cross-check against the Trainer's own rule where transformers provides it.
    try:
        from transformers import Trainer
        names = {n for n, _ in model.named_parameters()}  # the Trainer's list also names tied duplicates
        decay = set(Trainer.get_decay_parameter_names(None, model)) & names
        assert decay == names - no_decay, "decay rule differs from Trainer"
    except (ImportError, AttributeError, TypeError):
        pass
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if n not in no_decay], "weight_decay": WEIGHT_DECAY},
        {"params": [p for n, p in named if n in no_decay], "weight_decay": 0.0},
    ]


def train_steps(model, input_ids, labels, bf16):
    """STEPS AdamW steps on one batch, under torch.autocast(bfloat16) when bf16: the first step's
    logits, loss and gradients, the loss before each step, and every parameter after the last."""
    ref = {}
    opt = torch.optim.AdamW(param_groups(model), lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=input_ids, labels=labels)
        out.loss.backward()
        losses.append(out.loss.item())
        if step == 0:
            ref["logits"] = out.logits.detach().float()
            ref["loss"] = out.loss.detach().float().reshape(1)
            for n, p in model.named_parameters():
                ref[f"grad.{n}"] = p.grad.detach().float().clone()
        opt.step()
    ref["losses"] = torch.tensor(losses, dtype=torch.float32)
    for n, p in model.named_parameters():
        ref[f"step3.{n}"] = p.detach().clone()
    return ref


def make_fixture(name):
    model = build(name)
    out_dir = os.path.join(HERE, name)
    model.save_pretrained(out_dir)  # transformers >= 5 always writes safetensors
    input_ids, labels = make_batch()
    ref = {"input_ids": input_ids.to(torch.int32), "labels": labels.to(torch.int32)}
    model64 = copy.deepcopy(model).double()  # float64 twin: a sanity bound on the float32 logits
    ref.update(train_steps(model, input_ids, labels, bf16=False))
    with torch.no_grad():
        err = (model64(input_ids=input_ids).logits - ref["logits"].double()).abs().max().item()
    assert err < 1e-5, f"{name}: float32 logits are {err:.3g} away from float64"
    print(f"{name}: float32 logits within {err:.2g} of float64")
    ref = {k: v.contiguous() for k, v in ref.items()}
    save_file(ref, os.path.join(out_dir, "reference.safetensors"))
    return ref, out_dir


def make_bf16_fixture(name):
    """The same model, batch and AdamW steps under torch.autocast(bfloat16): matmuls (and attention's
    score and value products) in bf16, norms, softmax and the loss in fp32, fp32 parameters stepped
    by AdamW. llmt's --bf16 is compared with this (tests/models/test_hf_reference.cpp)."""
    input_ids, labels = make_batch()
    ref = train_steps(build(name), input_ids, labels, bf16=True)
    ref = {k: v.contiguous() for k, v in ref.items()}
    save_file(ref, os.path.join(HERE, name, "reference_bf16.safetensors"))
    losses = [round(x, 6) for x in ref["losses"].tolist()]
    print(f"{name}: bf16 autocast loss {ref['loss'].item():.6f}  losses {losses}")


def summary(name, ref, out_dir):
    back = load_file(os.path.join(out_dir, "reference.safetensors"))
    assert back.keys() == ref.keys() and all(torch.equal(back[k], ref[k]) for k in ref), "reload mismatch"
    weights = load_file(os.path.join(out_dir, "model.safetensors"))
    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, attn_implementation="eager")
    n_grad = sum(k.startswith("grad.") for k in ref)
    initial = dict(build(name).named_parameters())  # deterministic: the same weights as were saved
    worst = max((p - initial[n]).abs().max().item() for n, p in reloaded.named_parameters())
    assert worst == 0.0, f"{name}: reloaded export differs from the built model by {worst}"
    sizes = {f: os.path.getsize(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
    print(f"{name}: {len(ref)} reference tensors ({n_grad} grads), {len(weights)} tensors in model.safetensors")
    print(f"  loss {ref['loss'].item():.6f}  losses {[round(x, 6) for x in ref['losses'].tolist()]}")
    print("  files " + ", ".join(f"{f} {s / 1024:.1f} KiB" for f, s in sizes.items()))


def check_llmt(path, against):
    fixture = AutoModelForCausalLM.from_pretrained(os.path.join(HERE, against), dtype=torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    mine, other = dict(fixture.named_parameters()), dict(theirs.named_parameters())
    if mine.keys() != other.keys():
        print(f"parameter names differ: missing {sorted(mine.keys() - other.keys())}, "
              f"extra {sorted(other.keys() - mine.keys())}")
        return 1
    worst = 0.0
    for n, p in mine.items():
        if p.shape != other[n].shape:
            print(f"{n}: shape {tuple(other[n].shape)}, expected {tuple(p.shape)}")
            return 1
        diff = (p.detach() - other[n].detach()).abs().max().item()
        print(f"{n}: max abs diff {diff:.3g}")
        worst = max(worst, diff)
    if worst > 1e-6:
        print(f"FAIL: max abs diff {worst:.3g} > 1e-6")
        return 1
    print(f"OK ({len(mine)} parameters, max abs diff {worst:.3g})")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check-llmt", metavar="PATH", help="Hugging Face export written by llmt to compare")
    ap.add_argument("--against", choices=sorted(MODELS), help="fixture model to compare --check-llmt with")
    ap.add_argument("--only", choices=sorted(MODELS), action="append", help="make these fixtures only")
    args = ap.parse_args()
    if args.check_llmt:
        if not args.against:
            ap.error("--check-llmt needs --against")
        return check_llmt(args.check_llmt, args.against)
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)  # one fixed reduction order; seen: rare multi-threaded runs off by 2e-5
    for name in args.only or MODELS:
        ref, out_dir = make_fixture(name)
        summary(name, ref, out_dir)
        make_bf16_fixture(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
