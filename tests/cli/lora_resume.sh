#!/usr/bin/env bash
# Checkpoints of a LoRA run (--use_peft True) on the tiny LLaMA fixture: each checkpoint-N is PEFT's
# adapter directory plus the adapter store's state (state.h5: masters, m, v) and a fingerprint of the
# base. A resume at the same world size gives the uninterrupted run's losses and final adapter
# bitwise; 1 -> 2 ranks and 2 -> 1 rank within the reorder bound (1e-5 relative); another base (a
# weight file changed, a config key changed) or other LoRA flags are refused naming what differs; a
# corrupt newest checkpoint is moved aside and the one before resumed; a full fine-tune does not take
# a LoRA checkpoint for a damaged one; SIGTERM mid-run leaves a checkpoint that resumes; PEFT loads a
# checkpoint (when a Python with peft is at hand). Usage: lora_resume.sh path/to/llmt
set -uo pipefail
set -m  # background jobs keep their signals
llmt=$1
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
mpi=(mpirun --oversubscribe -np 2)
for i in $(seq 100); do echo "lora line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
base=(--model_name_or_path "$src/tests/reference/llama_tiny" --tokenizer_name_or_path bytes
      --train_file "$work/corpus.txt" --block_size 16 --threads 1 --cache_dir "$work/cache" --logging_steps 1)
lora=(--use_peft True --lora_r 4 --lora_alpha 8 --lora_target_modules q_proj,v_proj)
sched=(--max_steps 8 --learning_rate 1e-2 --lr_scheduler_type cosine --warmup_steps 2 --weight_decay 0.1)
one=(--per_device_train_batch_size 2)
two=(--per_device_train_batch_size 1)
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\).*/\2 \1/' | sort -n; }
train() {  # train LOG args...
  local log=$1; shift
  "$@" > "$log" 2>&1 || { tail -5 "$log"; fail "$(basename "$log" .log): training"; }
}
# the largest relative difference of two adapter_model.safetensors
adapter_diff() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
import numpy as np
def load(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
print(max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a))
PY
}

# A: one process, 8 steps, a checkpoint every 4 (dropout 0.05: the masks must resume too)
train "$work/a.log" "$llmt" train "${base[@]}" "${lora[@]}" "${sched[@]}" "${one[@]}" --save_steps 4 --output_dir "$work/a"
for f in adapter_config.json adapter_model.safetensors state.h5 trainer_state.json manifest.json; do
  [ -f "$work/a/checkpoint-4/$f" ] || fail "checkpoint-4 lacks $f"
done
[ ! -e "$work/a/checkpoint-4/model.safetensors" ] || fail "a LoRA checkpoint holds the whole model"
[ "$(losses "$work/a" | wc -l)" -eq 8 ] || fail "expected 8 logged losses"
echo "checkpoint-4: PEFT's adapter directory, state.h5, manifest.json"

# B: resumed from checkpoint-4 in one process: bitwise
train "$work/b.log" "$llmt" train "${base[@]}" "${lora[@]}" "${sched[@]}" "${one[@]}" --save_strategy no \
  --output_dir "$work/b" --resume_from_checkpoint "$work/a/checkpoint-4"
grep -q "resume .*checkpoint-4: step 4" "$work/b.log" || fail "B did not say it resumed"
diff <(losses "$work/a") <(losses "$work/b") > /dev/null ||
  { paste <(losses "$work/a") <(losses "$work/b"); fail "resumed losses differ"; }
cmp "$work/a/adapter_model.safetensors" "$work/b/adapter_model.safetensors" || fail "the resumed final adapter differs"
echo "resume at 1 process: steps 5..8 and the final adapter bitwise equal"

# C: resumed from the same checkpoint at 2 ranks (full_shard): within the reorder bound
train "$work/c.log" "${mpi[@]}" "$llmt" train "${base[@]}" "${lora[@]}" "${sched[@]}" "${two[@]}" --fsdp full_shard \
  --save_strategy no --output_dir "$work/c" --resume_from_checkpoint "$work/a/checkpoint-4"
cmp_losses() {  # cmp_losses DIR_A DIR_B what
  paste <(losses "$1" | awk '$1 > 4') <(losses "$2" | awk '$1 > 4') |
    awk -v what="$3" '{ d = $2 - $4; if (d < 0) d = -d; if (d > 1e-5 * $2) { print "FAIL: " what " step " $1 ": " $2 " vs " $4; bad = 1 } }
                      END { if (NR != 4) { print "FAIL: " what ": " NR " steps compared"; bad = 1 } exit bad }' || exit 1
}
cmp_losses "$work/a" "$work/c" "1 -> 2 ranks"
d=$(adapter_diff "$work/a/adapter_model.safetensors" "$work/c/adapter_model.safetensors") || fail "reading the adapters"
python3 -c "import sys; sys.exit(0 if float('$d') <= 1e-4 else 1)" || fail "1 -> 2 ranks: final adapter differs by $d"
echo "resume 1 -> 2 ranks: steps 5..8 within 1e-5, final adapter within $d (relative to each tensor's largest)"

# D: 2 ranks throughout, then resumed from its checkpoint-4 in one process
train "$work/d.log" "${mpi[@]}" "$llmt" train "${base[@]}" "${lora[@]}" "${sched[@]}" "${two[@]}" --fsdp full_shard \
  --save_steps 4 --output_dir "$work/d"
train "$work/e.log" "$llmt" train "${base[@]}" "${lora[@]}" "${sched[@]}" "${one[@]}" --save_strategy no \
  --output_dir "$work/e" --resume_from_checkpoint "$work/d/checkpoint-4"
cmp_losses "$work/d" "$work/e" "2 -> 1 rank"
d=$(adapter_diff "$work/d/adapter_model.safetensors" "$work/e/adapter_model.safetensors") || fail "reading the adapters"
python3 -c "import sys; sys.exit(0 if float('$d') <= 1e-4 else 1)" || fail "2 -> 1 rank: final adapter differs by $d"
echo "resume 2 -> 1 rank: steps 5..8 within 1e-5, final adapter within $d"

# another base, other LoRA flags: refused, naming what differs
expect_refused() {  # expect_refused "what the message names" flags...
  local want=$1; shift
  rm -rf "$work/x"
  if "$llmt" train "$@" --save_strategy no --output_dir "$work/x" --resume_from_checkpoint "$work/a/checkpoint-4" \
      > "$work/x.log" 2>&1; then
    fail "resumed: $*"
  fi
  grep -qF -- "$want" "$work/x.log" || { tail -3 "$work/x.log"; fail "the refusal does not say: $want"; }
}
cp -r "$src/tests/reference/llama_tiny" "$work/base2"
size=$(stat -c %s "$work/base2/model.safetensors")
printf '\x3f' | dd of="$work/base2/model.safetensors" bs=1 seek=$((size - 2)) conv=notrunc 2> /dev/null
cmp -s "$work/base2/model.safetensors" "$src/tests/reference/llama_tiny/model.safetensors" && fail "the copy is unchanged"
rest=("${base[@]:2}")
expect_refused "base model weights model.safetensors" --model_name_or_path "$work/base2" "${rest[@]}" "${lora[@]}" \
  "${sched[@]}" "${one[@]}"
cp -r "$src/tests/reference/llama_tiny" "$work/base3"
python3 - "$work/base3/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["rms_norm_eps"] = 1e-5; json.dump(c, open(sys.argv[1], "w"))
PY
expect_refused "rms_norm_eps" --model_name_or_path "$work/base3" "${rest[@]}" "${lora[@]}" "${sched[@]}" "${one[@]}"
expect_refused "lora r 4 in the file, 8 here" "${base[@]}" --use_peft True --lora_r 8 --lora_alpha 8 \
  --lora_target_modules q_proj,v_proj "${sched[@]}" "${one[@]}"
echo "refused: another base's weights, another base's config, another rank"

# a corrupt newest checkpoint: moved aside, the one before resumed (and the run ends as A's)
cp -r "$work/a" "$work/f"
rm -f "$work/f/metrics.jsonl"
printf 'X' | dd of="$work/f/checkpoint-8/state.h5" bs=1 seek=3000 conv=notrunc 2> /dev/null
train "$work/f.log" "$llmt" train "${base[@]}" "${lora[@]}" "${sched[@]}" "${one[@]}" --save_strategy no \
  --output_dir "$work/f" --resume_from_checkpoint latest
grep -q "checkpoint-8 failed its checks.*moved aside" "$work/f.log" || { grep warning "$work/f.log"; fail "no warning"; }
[ -d "$work/f/checkpoint-8.corrupt" ] || fail "checkpoint-8 was not moved aside"
cmp "$work/a/adapter_model.safetensors" "$work/f/adapter_model.safetensors" || fail "resumed from checkpoint-4, another adapter"
echo "a corrupt checkpoint-8: moved aside, checkpoint-4 resumed, the final adapter bitwise A's"

# a full fine-tune's resume of latest in a LoRA run's output_dir: refused, nothing moved aside
if "$llmt" train "${base[@]}" "${sched[@]}" "${one[@]}" --save_strategy no --output_dir "$work/a" \
    --resume_from_checkpoint latest > "$work/g.log" 2>&1; then
  fail "a full fine-tune resumed a LoRA checkpoint"
fi
grep -q "checkpoint-8 is a LoRA run's checkpoint (adapter_config.json): resume it with --use_peft True" "$work/g.log" ||
  { tail -3 "$work/g.log"; fail "no clear refusal"; }
[ -d "$work/a/checkpoint-8" ] || fail "the LoRA checkpoint was moved"
echo "a full fine-tune refuses a LoRA checkpoint by name and moves nothing"

# SIGTERM mid-run: a checkpoint of the adapter, exit 0, and it resumes
"$llmt" train "${base[@]}" "${lora[@]}" "${one[@]}" --max_steps 100000 --save_strategy no --output_dir "$work/s" \
  > "$work/s.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "step .*5/" "$work/s.log" && break; sleep 0.1; done
kill -TERM $job
wait $job
rc=$?
[ $rc -eq 0 ] || { tail -5 "$work/s.log"; fail "SIGTERM: status $rc"; }
ck=$(ls "$work/s" | grep -E '^checkpoint-[0-9]+$' | head -1)
[ -n "$ck" ] || { tail -5 "$work/s.log"; fail "SIGTERM: no checkpoint"; }
grep -q "holds the adapter" "$work/s.log" || fail "SIGTERM: no stop line"
n=${ck#checkpoint-}
train "$work/t.log" "$llmt" train "${base[@]}" "${lora[@]}" "${one[@]}" --max_steps $((n + 1)) --save_strategy no \
  --output_dir "$work/s" --resume_from_checkpoint latest
grep -q "resume .*$ck: step $n" "$work/t.log" || fail "the signal's checkpoint did not resume"
echo "SIGTERM at step $n: $ck written, exit 0, resumed"

. "$src/tests/cli/peft_python.sh"
"$py" - "$src/tests/reference/llama_tiny" "$work/a/checkpoint-4" <<'PY' 2> "$work/py.err" || { tail -5 "$work/py.err"; fail "PEFT"; }
import sys, torch
from transformers import AutoModelForCausalLM
from peft import PeftModel
from safetensors.torch import load_file
base = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
model = PeftModel.from_pretrained(base, sys.argv[2])
saved = load_file(sys.argv[2] + "/adapter_model.safetensors")
state = {k: v for k, v in model.state_dict().items() if "lora_" in k}
assert len(state) == len(saved) and len(saved) > 0, (len(state), len(saved))
for k, v in saved.items():
    mk = k.replace(".weight", ".default.weight")
    assert torch.equal(state[mk], v), k
print(f"PeftModel.from_pretrained loaded checkpoint-4: {len(saved)} tensors as saved")
PY
echo "PEFT loads a checkpoint as an adapter directory"
