#!/usr/bin/env bash
# llmt export --merge_adapter True: PEFT's merge_and_unload as a Hugging Face directory. For the
# fixtures' final adapters (tests/reference/lora: GPT-2's Conv1D, LLaMA's q/v slices of the fused
# q|k|v, Qwen2's tied head with an lm_head copy) every tensor equals the merged model PEFT saved
# within tests/tolerances.h's kF32OpForward (1e-5 of the tensor's largest), with the same keys and
# tie_word_embeddings (false where the copy unties the head); transformers loads the export and gives
# PEFT's adapted logits (when a Python with torch is at hand). A LoRA run's checkpoint merges with its
# base found through adapter_config.json; a damaged one is refused, as are the flags' misuses. llmt
# generate --adapter_name_or_path unties a tied head as the export does: the same tokens. An embed_tokens
# copy trained on a tied base merges untied, with PEFT's logits.
# Usage: lora_export.sh path/to/llmt
set -uo pipefail
llmt=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
ref=$src/tests/reference
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
compare() {  # compare EXPORT_DIR PEFT_MERGED_DIR: keys, tie_word_embeddings, every tensor
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
import numpy as np
def load(d):
    b = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"])
    return out, json.load(open(d + "/config.json"))
(a, ca), (b, cb) = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))
assert ca.get("tie_word_embeddings") == cb.get("tie_word_embeddings"), (ca.get("tie_word_embeddings"), cb.get("tie_word_embeddings"))
worst = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(b[k]).max(), 1e-30)) for k in a)
assert worst <= 1e-5, worst  # tests/tolerances.h kF32OpForward
print(f"{len(a)} tensors, tie_word_embeddings {ca.get('tie_word_embeddings')}, worst {worst:.3g}")
PY
}

for c in gpt2_c_attn_c_proj:gpt2_tiny llama_q_v:llama_tiny qwen2_all_linear_lm_head:qwen2_tiny; do
  case=${c%%:*} base=${c##*:}
  "$llmt" export "$ref/lora/$case/adapter_final" "$work/$case" --merge_adapter True --model_name_or_path "$ref/$base" \
    > "$work/$case.log" 2>&1 || { cat "$work/$case.log"; fail "$case: export"; }
  got=$(compare "$work/$case" "$ref/lora/$case/merged") || { echo "$got"; fail "$case: the export differs from PEFT's merge"; }
  echo "$case: PEFT's merge_and_unload: $got"
done
grep -q "copy unties the base's tied lm_head" "$work/qwen2_all_linear_lm_head.log" || fail "no untying line"

# the misuses
expect_error() {  # expect_error "what the message names" args...
  local want=$1; shift
  if "$llmt" export "$@" > "$work/bad.log" 2>&1; then fail "accepted: $*"; fi
  grep -qF -- "$want" "$work/bad.log" || { tail -3 "$work/bad.log"; fail "$* did not say: $want"; }
}
expect_error "is not a directory here (llmt reads no hub ids)" "$ref/lora/llama_q_v/adapter_final" "$work/x" \
  --merge_adapter True
expect_error "it goes with --merge_adapter True" "$ref/lora/llama_q_v/adapter_final" "$work/x" \
  --model_name_or_path "$ref/llama_tiny"
expect_error "has no adapter_config.json" "$ref/llama_tiny" "$work/x" --merge_adapter True \
  --model_name_or_path "$ref/llama_tiny"
expect_error "does not fit the base model" "$ref/lora/llama_q_v/adapter_final" "$work/x" --merge_adapter True \
  --model_name_or_path "$ref/gpt2_tiny"
echo "refused: a base that is no directory here, --model_name_or_path alone, a whole model, another base's shapes"

# a LoRA run's checkpoint: its base found through adapter_config.json; a damaged one refused
for i in $(seq 100); do echo "lora line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
"$llmt" train --model_name_or_path "$ref/llama_tiny" --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" \
  --block_size 16 --threads 1 --cache_dir "$work/cache" --per_device_train_batch_size 2 --max_steps 2 --save_steps 2 \
  --learning_rate 1e-2 --use_peft True --lora_r 4 --lora_alpha 8 --lora_target_modules q_proj,v_proj \
  --output_dir "$work/run" > "$work/train.log" 2>&1 || { tail -5 "$work/train.log"; fail "training"; }
"$llmt" export "$work/run/checkpoint-2" "$work/ck" --merge_adapter True > "$work/ck.log" 2>&1 ||
  { cat "$work/ck.log"; fail "export of a checkpoint"; }
grep -q "merged into $ref/llama_tiny" "$work/ck.log" || { cat "$work/ck.log"; fail "the base was not adapter_config.json's"; }
"$llmt" export "$work/run" "$work/ck2" --merge_adapter True --model_name_or_path "$ref/llama_tiny" > /dev/null 2>&1 ||
  fail "export of output_dir"
cmp "$work/ck/model.safetensors" "$work/ck2/model.safetensors" || fail "checkpoint-2 and output_dir merge differently"
# a checkpoint onto another base (one weight byte changed): refused, naming the file, as a resume is
cp -r "$ref/llama_tiny" "$work/base2"
size=$(stat -c %s "$work/base2/model.safetensors")
printf '\x3f' | dd of="$work/base2/model.safetensors" bs=1 seek=$((size - 2)) conv=notrunc 2> /dev/null
expect_error "was trained on another base model than $work/base2: base model weights model.safetensors" \
  "$work/run/checkpoint-2" "$work/x" --merge_adapter True --model_name_or_path "$work/base2"
cp -r "$work/run/checkpoint-2" "$work/bad"
printf 'X' | dd of="$work/bad/adapter_model.safetensors" bs=1 seek=200 conv=notrunc 2> /dev/null
expect_error "adapter_model.safetensors" "$work/bad" "$work/x" --merge_adapter True
echo "a checkpoint merges onto adapter_config.json's base (as its output_dir does); onto another base or damaged, refused"
# generate: a LoRA checkpoint is an adapter for --adapter_name_or_path, not a model
if "$llmt" generate --model_name_or_path "$work/run/checkpoint-2" --tokenizer_name_or_path bytes --prompt "lora" \
    --max_new_tokens 2 > /dev/null 2> "$work/g.err"; then
  fail "generate took a LoRA checkpoint for a model"
fi
grep -q "is a LoRA run's checkpoint (an adapter): give the base model as --model_name_or_path" "$work/g.err" ||
  { cat "$work/g.err"; fail "generate: no clear refusal"; }
"$llmt" generate --model_name_or_path "$ref/llama_tiny" --adapter_name_or_path "$work/run/checkpoint-2" \
  --tokenizer_name_or_path bytes --prompt "lora line 7" --max_new_tokens 8 > "$work/g1.jsonl" 2> "$work/g.err" ||
  { cat "$work/g.err"; fail "generate with a checkpoint as the adapter"; }
"$llmt" generate --model_name_or_path "$work/ck" --tokenizer_name_or_path bytes --prompt "lora line 7" \
  --max_new_tokens 8 > "$work/g2.jsonl" 2> "$work/g.err" || { cat "$work/g.err"; fail "generate the merged checkpoint"; }
cmp "$work/g1.jsonl" "$work/g2.jsonl" || fail "generate: the checkpoint as an adapter and its merged export differ"
echo "generate: a LoRA checkpoint is refused as a model, and as an adapter gives its merged export's tokens"

# llmt generate --adapter_name_or_path with an lm_head copy on a tied base: untied as the export, the same tokens
gen() {
  "$llmt" generate --tokenizer_name_or_path bytes --prompt "lora line 7" --max_new_tokens 8 "$@" 2> "$work/gen.err" ||
    { cat "$work/gen.err"; fail "generate $*"; }
}
gen --model_name_or_path "$ref/qwen2_tiny" --adapter_name_or_path "$ref/lora/qwen2_all_linear_lm_head/adapter_final" \
  > "$work/adapted.jsonl"
grep -q "copy unties the base's tied lm_head" "$work/gen.err" || { cat "$work/gen.err"; fail "the untying line"; }
gen --model_name_or_path "$work/qwen2_all_linear_lm_head" > "$work/merged.jsonl"
cmp "$work/adapted.jsonl" "$work/merged.jsonl" || fail "generate with the adapter and with the merged export differ"
echo "generate: an lm_head copy on a tied base merged at load gives the export's tokens"

# modules_to_save embed_tokens trained on a tied base: the merge unties it (the copy is the input
# embeddings, lm_head the frozen base table), and the export reads back so
"$llmt" train --model_name_or_path "$ref/llama_tied_tiny" --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" \
  --block_size 16 --threads 1 --cache_dir "$work/cache" --per_device_train_batch_size 2 --max_steps 2 \
  --save_strategy no --learning_rate 1e-2 --use_peft True --lora_r 4 --lora_alpha 8 --lora_dropout 0 \
  --lora_target_modules q_proj,v_proj --lora_modules_to_save embed_tokens --output_dir "$work/emb" \
  > "$work/emb.log" 2>&1 || { tail -5 "$work/emb.log"; fail "training embed_tokens"; }
"$llmt" export "$work/emb" "$work/emb_merged" --merge_adapter True --model_name_or_path "$ref/llama_tied_tiny" \
  > "$work/emb_export.log" 2>&1 || { cat "$work/emb_export.log"; fail "export embed_tokens"; }
grep -q '"tie_word_embeddings": false' "$work/emb_merged/config.json" || fail "the embed_tokens merge is still tied"
echo "embed_tokens trained on a tied base; its merge is written untied"

peft_check="to load the exports"
. "$src/tests/cli/peft_python.sh"
"$py" - "$ref" "$work" <<'PY' 2> "$work/py.err" || { tail -5 "$work/py.err"; fail "transformers"; }
import sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
ref, work = sys.argv[1], sys.argv[2]
for case in ("gpt2_c_attn_c_proj", "llama_q_v", "qwen2_all_linear_lm_head"):
    r = load_file(f"{ref}/lora/{case}/reference.safetensors")
    model = AutoModelForCausalLM.from_pretrained(f"{work}/{case}", dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        got = model(input_ids=r["input_ids"].long()).logits
    want = r["logits_final"]  # PEFT's adapted model after the 5th step
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err <= 1e-5, (case, err)  # tests/tolerances.h kF32Logits
    print(f"{case}: transformers loads llmt's merged export; logits within {err:.3g} of PEFT's adapted model")
PY
"$py" - "$ref/llama_tied_tiny" "$work/emb" "$work/emb_merged" <<'PY' 2> "$work/py2.err" || { tail -5 "$work/py2.err"; fail "embed_tokens in PEFT"; }
import sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
base = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, attn_implementation="eager")
peft = PeftModel.from_pretrained(base, sys.argv[2]).eval()
merged = AutoModelForCausalLM.from_pretrained(sys.argv[3], dtype=torch.float32, attn_implementation="eager")
ids = torch.tensor([list(b"lora line 7: the quick")])
with torch.no_grad():
    want, got = peft(input_ids=ids).logits, merged(input_ids=ids).logits
err = ((got - want).abs().max() / want.abs().max()).item()
moved = (peft.base_model.model.model.embed_tokens.modules_to_save["default"].weight - base.lm_head.weight).abs().max().item()
assert moved > 0 and err <= 1e-5, (moved, err)
print(f"llama_tied_tiny + embed_tokens: PEFT loads llmt's adapter; the untied export gives its logits within {err:.3g}")
PY
echo "transformers loads the exports with PEFT's logits"
