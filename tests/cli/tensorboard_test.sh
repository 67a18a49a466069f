#!/usr/bin/env bash
# --report_to tensorboard through the executable: the event file lands in Hugging Face's default
# logging_dir, TensorBoard's own reader (the Python package, when installed) finds the Trainer's tags
# with the logged values, a run killed mid-way keeps its curve up to the last logged step, and other
# trackers are ignored with a warning. Usage: tensorboard_test.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 2000); do echo "tensorboard test line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
head -200 "$work/corpus.txt" > "$work/valid.txt"
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 64
        --per_device_train_batch_size 2 --logging_steps 1 --save_strategy no --threads 1 --cache_dir none)

"$llmt" train "${common[@]}" --validation_file "$work/valid.txt" --do_eval True --max_steps 6 \
  --output_dir "$work/a" --report_to tensorboard > "$work/a.log" 2>&1 || { echo "FAIL: training"; cat "$work/a.log"; exit 1; }
files=("$work"/a/runs/*/events.out.tfevents.*)
[ -f "${files[0]}" ] || { echo "FAIL: no event file under output_dir/runs/<date>_<host>"; ls -R "$work/a"; exit 1; }
grep -q "report tensorboard: ${files[0]}" "$work/a.log" || { echo "FAIL: the log does not name the file"; exit 1; }
echo "event file: ${files[0]#$work/}"

"$llmt" train "${common[@]}" --max_steps 2 --output_dir "$work/w" --report_to wandb > "$work/w.log" 2>&1 \
  || { echo "FAIL: --report_to wandb"; cat "$work/w.log"; exit 1; }
grep -q "warning: --report_to wandb: llmt writes tensorboard only; wandb is ignored" "$work/w.log" \
  || { echo "FAIL: no warning for wandb"; cat "$work/w.log"; exit 1; }
[ ! -d "$work/w/runs" ] || { echo "FAIL: wandb wrote TensorBoard files"; exit 1; }

if ! python3 -c "import tensorboard" 2> /dev/null; then
  echo "TensorBoard's Python package is not installed: its reader was not run (pip install -r scripts/requirements-tests.txt)"
  echo PASS
  exit 0
fi

# what TensorBoard reads: each tag's (step, value) pairs, as JSON
tb_read() {
  python3 - "$1" << 'PY'
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1])
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
PY
}
tb_read "$(dirname "${files[0]}")" > "$work/a.json" || { echo "FAIL: TensorBoard cannot read the file"; exit 1; }
python3 - "$work/a.json" "$work/a/metrics.jsonl" << 'PY' || exit 1
import json, sys
tb = json.load(open(sys.argv[1]))
records = [json.loads(l) for l in open(sys.argv[2])]
for tag in ["train/loss", "train/learning_rate", "train/grad_norm", "train/epoch", "eval/loss", "eval/perplexity"]:
    assert tag in tb, f"FAIL: no {tag} in {sorted(tb)}"
key = {"train/loss": "loss", "train/learning_rate": "learning_rate", "train/grad_norm": "grad_norm"}
for tag, k in key.items():
    want = [[r["step"], r[k]] for r in records if k in r]
    got = tb[tag]
    assert [s for s, _ in got] == [s for s, _ in want], f"FAIL: {tag} steps {got} vs {want}"
    for (s, g), (_, w) in zip(got, want):
        assert abs(g - w) <= 1e-6 * abs(w) + 1e-30, f"FAIL: {tag} step {s}: {g} vs {w} (float32 of the logged value)"
ev = [r for r in records if "eval_loss" in r][0]
assert abs(tb["eval/loss"][0][1] - ev["eval_loss"]) <= 1e-6 * ev["eval_loss"], "FAIL: eval/loss"
print(f"TensorBoard reads train/loss at steps {[s for s, _ in tb['train/loss']]}, eval/loss {tb['eval/loss'][0][1]:.4f}")
PY

# kill -9 mid-run: the curve up to the last logged step is in the file
"$llmt" train "${common[@]}" --max_steps 100000 --output_dir "$work/k" --report_to tensorboard > "$work/k.log" 2>&1 &
job=$!
for _ in $(seq 300); do grep -q "step .* 5/100000" "$work/k.log" && break; sleep 0.1; done
kill -9 $job
wait $job 2> /dev/null
logged=$(grep -c "^step " "$work/k.log")
tb_read "$work"/k/runs/* > "$work/k.json" || { echo "FAIL: the killed run's file does not read"; exit 1; }
got=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['train/loss']))" "$work/k.json")
[ "$got" -ge 5 ] && [ "$got" -ge $((logged - 1)) ] || { echo "FAIL: $got losses in the file, $logged logged"; exit 1; }
echo "kill -9 after $logged logged steps: $got of them in the event file"
echo PASS
