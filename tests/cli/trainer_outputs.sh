#!/usr/bin/env bash
# What a run leaves in its output directory, as the Hugging Face Trainer and run_clm leave it (issue
# 35, item 6): trainer_state.json in each checkpoint and beside the model, loadable by transformers'
# TrainerState.load_from_json when transformers is installed (its own fields only, else its
# constructor refuses the file); train_results.json, eval_results.json and all_results.json (with
# perplexity); generation_config.json beside the model; no .llmt.lock after a clean end; a resume
# whose checkpoint has such a trainer_state.json; and a failing run outside mpirun prints one line.
# Usage: trainer_outputs.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 400); do echo "outputs test line $i: the quick brown fox"; done > corpus.txt
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file corpus.txt --block_size 32
        --validation_split_percentage 10 --per_device_train_batch_size 2 --logging_steps 2 --save_steps 2
        --cache_dir none --threads 1)
"$llmt" train "${common[@]}" --max_steps 4 --do_eval True --output_dir out > out.log 2>&1 || { tail out.log; fail run; }
for f in trainer_state.json train_results.json eval_results.json all_results.json generation_config.json \
         checkpoint-2/trainer_state.json checkpoint-4/trainer_state.json checkpoint-4/generation_config.json; do
  [ -f "out/$f" ] || fail "no $f"
done
[ ! -e out/.llmt.lock ] || fail ".llmt.lock left after a clean end"
python3 - <<'PY' || exit 1
import json, math
r = {n: json.load(open(f"out/{n}_results.json")) for n in ("train", "eval", "all")}
want_train = {"epoch", "total_flos", "train_loss", "train_runtime", "train_samples", "train_samples_per_second",
              "train_steps_per_second"}
want_eval = {"epoch", "eval_loss", "eval_runtime", "eval_samples", "eval_samples_per_second", "eval_steps_per_second",
             "perplexity"}
assert set(r["train"]) == want_train, sorted(r["train"])
assert set(r["eval"]) == want_eval, sorted(r["eval"])
assert r["all"] == {**r["train"], **r["eval"]}, r["all"]
assert abs(r["eval"]["perplexity"] - math.exp(r["eval"]["eval_loss"])) < 1e-9 * r["eval"]["perplexity"]
losses = [json.loads(l)["loss"] for l in open("out/metrics.jsonl") if '"loss"' in l]
assert len(losses) == 2, losses  # logged at steps 2 and 4
assert r["train"]["train_samples"] > 0 and r["eval"]["eval_samples"] > 0 and r["train"]["total_flos"] > 0
ts = json.load(open("out/trainer_state.json"))
assert ts["global_step"] == 4 and ts["max_steps"] == 4 and ts["log_history"][-1]["eval_loss"] == r["eval"]["eval_loss"]
assert "train_loss" in ts["log_history"][-2], ts["log_history"][-2]
print("train_results.json, eval_results.json (perplexity), all_results.json = both; trainer_state.json: step 4")
try:
    from transformers import TrainerState
except Exception as e:  # an optional test package (scripts/requirements-tests.txt)
    print(f"transformers not importable ({type(e).__name__}): TrainerState.load_from_json not checked")
else:
    for p in ("out/trainer_state.json", "out/checkpoint-2/trainer_state.json", "out/checkpoint-4/trainer_state.json"):
        s = TrainerState.load_from_json(p)
        assert s.global_step == int(p.split("checkpoint-")[1][0]) if "checkpoint" in p else s.global_step == 4, p
    print("TrainerState.load_from_json reads the output's and both checkpoints' trainer_state.json")
PY

# a resume from such a checkpoint: its history kept, the lock gone again at the end
"$llmt" train "${common[@]}" --max_steps 6 --output_dir out --resume_from_checkpoint latest > resume.log 2>&1 \
  || { tail resume.log; fail resume; }
python3 -c "
import json; ts = json.load(open('out/trainer_state.json'))
steps = [h['step'] for h in ts['log_history'] if 'loss' in h]
assert ts['global_step'] == 6 and steps == [2, 4, 6], (ts['global_step'], steps)
print('resumed at 4 to 6: trainer_state.json logs steps', steps)" || exit 1
[ ! -e out/.llmt.lock ] || fail ".llmt.lock left after the resumed run"

# a failing run outside mpirun: the error, one line, and nothing from Open MPI after it
if "$llmt" train "${common[@]}" --max_steps 2 --train_file missing.txt --output_dir bad > bad.out 2> bad.err; then
  fail "a missing --train_file was accepted"
fi
[ "$(wc -l < bad.err)" = 1 ] && grep -q "^error: .*missing.txt" bad.err || { cat bad.err; fail "not one error line"; }
echo "a failing single process: one line on stderr ($(cat bad.err))"
echo ok
