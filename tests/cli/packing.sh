#!/usr/bin/env bash
# --packing as a fine-tuner runs it, on Alpaca records of mixed lengths through a real tokenizer
# (tests/reference/tokenizers_family/qwen2) and a tiny Qwen2: the same losses at 1 rank and at 2
# ranks fully sharded, padding reported far below the unpacked run's, loss tokens per second in
# metrics.jsonl, and a resume that would switch packing on or off refused by name.
# Usage: packing.sh path/to/llmt source_dir
set -uo pipefail
llmt=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
tokdir="$src/tests/reference/tokenizers_family/qwen2"
python3 - "$src" "$work" << 'PY'
import json, random, sys
src, work = sys.argv[1], sys.argv[2]
c = json.load(open(f"{src}/tests/reference/qwen2_tiny/config.json"))
c["vocab_size"] = json.load(open(f"{src}/tests/reference/tokenizers_family/cases.json"))["families"]["qwen2"]["vocab_size"]
c["max_position_embeddings"] = 512
json.dump(c, open(f"{work}/config.json", "w"))
rng = random.Random(5)
words = "the a model learns to follow short and long instructions with care about data".split()
recs = [{"instruction": " ".join(rng.choice(words) for _ in range(rng.randint(2, 12))),
         "input": " ".join(rng.choice(words) for _ in range(rng.randint(0, 20))),
         "output": " ".join(rng.choice(words) for _ in range(rng.randint(1, 20) if rng.random() < 0.7 else rng.randint(40, 120)))} for _ in range(96)]
json.dump(recs, open(f"{work}/alpaca.json", "w"))
PY
common=(--model_config "$work/config.json" --tokenizer_name_or_path "$tokdir" --data_path "$work/alpaca.json"
        --model_max_length 512 --learning_rate 1e-3 --logging_steps 1 --threads 1 --cache_dir none --max_steps 4
        --save_strategy no --seed 7)
run() {  # run <name> <ranks> flags...
  local name=$1 np=$2
  shift 2
  mpirun --oversubscribe -np "$np" "$llmt" train "${common[@]}" --output_dir "$work/$name" "$@" > "$work/$name.log" 2>&1 \
    || { tail -20 "$work/$name.log"; fail "$name"; }
}
run packed1 1 --packing True --per_device_train_batch_size 4
run packed2 2 --packing True --per_device_train_batch_size 2 --fsdp "full_shard auto_wrap"
run unpacked 1 --per_device_train_batch_size 4
line=$(grep "data   --packing: 96 examples" "$work/packed1.log") || { grep data "$work/packed1.log"; fail "no packing line"; }
echo "$line"
python3 - "$work" "$line" << 'PY' || exit 1
import json, re, sys
work = sys.argv[1]
packed, unpacked = map(float, re.search(r"padding is ([0-9.]+)% .*, ([0-9.]+)% unpacked", sys.argv[2]).groups())
assert packed < 0.5 * unpacked, ("an epoch's padding", packed, unpacked)
rec = lambda n: [json.loads(l) for l in open(f"{work}/{n}/metrics.jsonl") if '"loss"' in l]
a, b, u = rec("packed1"), rec("packed2"), rec("unpacked")
assert len(a) == len(b) == 4, (len(a), len(b))
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-5 * abs(x["loss"]), ("1 rank and 2 ranks differ", x["loss"], y["loss"])
pad_p = sum(r["padding_fraction_rank0"] for r in a) / len(a)
pad_u = sum(r["padding_fraction_rank0"] for r in u) / len(u)
assert pad_p < pad_u, ("the logged windows' padding", pad_p, pad_u)
assert all(r["loss_tokens_per_s"] > 0 for r in a + u)
print(f"packed: the same 4 losses at 1 and 2 ranks ({a[-1]['loss']:.5f}); padding {100 * pad_p:.1f}% packed, "
      f"{100 * pad_u:.1f}% unpacked")
PY
# a resume may not switch packing: the data order would change under the checkpoint's step
run first 1 --packing True --per_device_train_batch_size 4 --save_strategy steps --save_steps 2 --max_steps 2
if mpirun -np 1 "$llmt" train "${common[@]}" --output_dir "$work/first" --per_device_train_batch_size 4 \
     --resume_from_checkpoint latest > "$work/resume.log" 2>&1; then fail "resumed a packed checkpoint unpacked"; fi
grep -q "trained on other data: source .*--packing" "$work/resume.log" || { tail -5 "$work/resume.log"; fail "no reason"; }
echo "a resume without --packing from a packed checkpoint: refused, naming --packing"
echo PASS
