#!/usr/bin/env bash
# llmt train --use_peft True (TRL's ModelConfig flags): a few steps of LoRA on the tiny LLaMA fixture
# leave output_dir as a PEFT adapter directory (adapter_config.json, adapter_model.safetensors, no
# model.safetensors), which PeftModel.from_pretrained loads when a Python with peft and torch is at
# hand (LLMT_PEFT_PYTHON, /tmp/lora-venv, or python3; skipped otherwise), and whose greedy tokens
# llmt generate --adapter_name_or_path gives; 2 ranks give one process's losses; the flags PEFT has
# and llmt does not train are refused by name, and LoRA flags without --use_peft too.
# Usage: lora_train.sh path/to/llmt
set -uo pipefail
llmt=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 100); do echo "lora line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
common=(--model_name_or_path "$src/tests/reference/llama_tiny" --tokenizer_name_or_path bytes
        --train_file "$work/corpus.txt" --block_size 16 --threads 1 --cache_dir "$work/cache"
        --per_device_train_batch_size 2 --max_steps 3 --logging_steps 1 --learning_rate 1e-2)

"$llmt" train "${common[@]}" --save_strategy no --use_peft True --lora_r 4 --lora_alpha 8 \
  --lora_target_modules q_proj,v_proj --output_dir "$work/out" > "$work/train.log" 2>&1 ||
  { tail -5 "$work/train.log"; fail "LoRA training"; }
grep -q "^lora   .*r 4, alpha 8, dropout 0.05, scaling 2 on 2 projections" "$work/train.log" ||
  { grep "^lora" "$work/train.log"; fail "the lora line"; }
for f in adapter_config.json adapter_model.safetensors trainer_state.json; do
  [ -f "$work/out/$f" ] || fail "output_dir lacks $f"
done
[ ! -e "$work/out/model.safetensors" ] || fail "a LoRA run wrote the whole model"
echo "trained: output_dir is a PEFT adapter directory"
# --adapter_name_or_path: training continues from the saved adapter, its config kept
"$llmt" train "${common[@]}" --max_steps 1 --save_strategy no --use_peft True --adapter_name_or_path "$work/out" \
  --output_dir "$work/more" > "$work/more.log" 2>&1 || { tail -5 "$work/more.log"; fail "continuing the adapter"; }
grep -q "^lora   .*r 4, alpha 8, dropout 0.05, scaling 2 on 2 projections" "$work/more.log" ||
  { grep "^lora" "$work/more.log"; fail "the continued adapter's config"; }

# two ranks, full_shard: the frozen base and the adapter each sharded, the same losses as one process
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 \
  mpirun --oversubscribe -np 2 "$llmt" train "${common[@]}" --per_device_train_batch_size 1 --save_strategy no \
  --use_peft True --lora_r 4 --lora_alpha 8 --lora_dropout 0 --lora_target_modules q_proj,v_proj \
  --fsdp full_shard --output_dir "$work/out2" > "$work/train2.log" 2>&1 || { tail -5 "$work/train2.log"; fail "2 ranks"; }
"$llmt" train "${common[@]}" --save_strategy no --use_peft True --lora_r 4 --lora_alpha 8 --lora_dropout 0 \
  --lora_target_modules q_proj,v_proj --output_dir "$work/out1" > "$work/train1.log" 2>&1 ||
  { tail -5 "$work/train1.log"; fail "1 rank, no dropout"; }
python3 - "$work/out1/trainer_state.json" "$work/out2/trainer_state.json" <<'PY' || fail "2 ranks differ from 1"
import json, sys
a, b = ([r["loss"] for r in json.load(open(p))["log_history"] if "loss" in r] for p in sys.argv[1:])
assert len(a) == 3 and len(a) == len(b), (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-5 * abs(x), (a, b)  # tests/tolerances.h kF32Loss: sums in another order
print("2 ranks full_shard: losses", b, "as one process")
PY

expect_error() {  # expect_error "what the message names" flags...
  local want=$1; shift
  if "$llmt" train "${common[@]}" --output_dir "$work/bad" "$@" > "$work/bad.log" 2>&1; then
    fail "accepted: $*"
  fi
  grep -qF -- "$want" "$work/bad.log" || { tail -3 "$work/bad.log"; fail "$* did not say: $want"; }
  rm -rf "$work/bad"
}
expect_error "--lora_r without --use_peft True" --lora_r 8
expect_error "--lora_r 0: expected a positive rank" --use_peft True --save_strategy no --lora_r 0
expect_error "--lora_dropout 1: expected a value in [0, 1)" --use_peft True --save_strategy no --lora_dropout 1
expect_error "--lora_r with --adapter_name_or_path" --use_peft True --save_strategy no --lora_r 4 \
  --adapter_name_or_path "$work/out"
expect_error "--use_dora True: llmt does not implement it" --use_peft True --save_strategy no --use_dora True
expect_error "--load_in_4bit True: llmt does not implement it" --use_peft True --save_strategy no --load_in_4bit True
expect_error "a regular expression the whole module path must match" --use_peft True --save_strategy no \
  --lora_target_modules q_proj
echo "refused: LoRA flags without --use_peft, DoRA, 4-bit, a one-entry name that matches nothing"

# llmt generate with the adapter merged at load (PEFT's merge_and_unload): it changes what the model says
gen() {
  "$llmt" generate --model_name_or_path "$src/tests/reference/llama_tiny" --tokenizer_name_or_path bytes \
    --prompt "lora line 7" --max_new_tokens 8 "$@" 2> "$work/gen.err" || { cat "$work/gen.err"; fail "generate $*"; }
}
gen > "$work/base.jsonl"
gen --adapter_name_or_path "$work/out" > "$work/adapted.jsonl"
grep -q "^adapter $work/out merged (r 4, alpha 8, 2 projections a block)" "$work/gen.err" ||
  { cat "$work/gen.err"; fail "the adapter line"; }
cmp -s "$work/base.jsonl" "$work/adapted.jsonl" && fail "the adapter changed nothing in generation"
echo "generate: the adapter merged at load"

. "$src/tests/cli/peft_python.sh"
"$py" - "$src/tests/reference/llama_tiny" "$work/out" "$work/adapted.jsonl" <<'PY' 2> "$work/py.err" || { tail -5 "$work/py.err"; fail "PEFT"; }
import sys, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
base = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
model = PeftModel.from_pretrained(base, sys.argv[2])
cfg = model.peft_config["default"]
assert cfg.r == 4 and cfg.lora_alpha == 8 and set(cfg.target_modules) == {"q_proj", "v_proj"}, cfg
trained = sum(p.abs().sum().item() for n, p in model.named_parameters() if "lora_B" in n)
assert trained > 0, "lora_B still zero: the adapter did not train"
assert torch.isfinite(model(torch.tensor([[5, 6, 7]])).logits).all()
print(f"PeftModel.from_pretrained loaded it: r {cfg.r}, targets {sorted(cfg.target_modules)}, |B| {trained:.3g}")
# greedy generation through PEFT's adapted model gives llmt generate's tokens (byte ids)
import json
want = json.loads(open(sys.argv[3]).read())["ids"]
prompt = torch.tensor([list(b"lora line 7")])
got = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8,
                     do_sample=False)[0, prompt.shape[1]:].tolist()
assert got == want, f"PEFT generates {got}, llmt generate --adapter_name_or_path {want}"
print(f"PEFT's greedy tokens are llmt generate's: {got}")
PY
