#!/usr/bin/env bash
# llmt generate as a user runs it: from a checkpoint and from the Hugging Face directory the same
# training wrote (the same weights, so the same greedy ids), on the CPU and on the CUDA backend
# (the SIMT emulator), JSONL on stdout with the progress on stderr, seeded sampling repeated, bad
# input refused naming the file and line before any batch runs and without touching an existing
# output, each finished batch's records written at once, ids the tokenizer cannot decode, a tiny temperature.
# Usage: generate.sh path/to/llmt path/to/llmt_simt
set -uo pipefail
llmt=$1
simt=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 300); do echo "line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
"$llmt" train --model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 32 \
  --threads 1 --cache_dir "$work/cache" --per_device_train_batch_size 4 --learning_rate 3e-3 --max_steps 40 \
  --save_steps 40 --output_dir "$work/out" > "$work/train.log" 2>&1 || { tail -20 "$work/train.log"; fail "train"; }
gen() { "$1" generate --tokenizer_name_or_path bytes --max_new_tokens 12 --threads 1 "${@:2}"; }
prompts=(--prompt "line 7: the quick" --prompt "line 12" --prompt "the lazy")

# the final model and its checkpoint (state.h5, verified) give the same greedy ids
gen "$llmt" --model_name_or_path "$work/out" "${prompts[@]}" > "$work/final.jsonl" 2> "$work/final.err" \
  || { cat "$work/final.err"; fail "generate from the final model"; }
gen "$llmt" --model_name_or_path "$work/out/checkpoint-40" "${prompts[@]}" --output "$work/ckpt.jsonl" \
  > "$work/ckpt.log" 2>&1 || { cat "$work/ckpt.log"; fail "generate from checkpoint-40"; }
python3 - "$work/final.jsonl" "$work/ckpt.jsonl" <<'PY' || exit 1
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]  # stdout must hold nothing but the records
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["index"] for r in a] == [0, 1, 2], a
assert [r["ids"] for r in a] == [r["ids"] for r in b], (a, b)
for r in a:
    assert r["finish_reason"] == "length" and len(r["ids"]) == 12, r
    assert r["text"] == bytes(r["ids"]).decode("utf-8", "replace"), r
print("final model and checkpoint-40: the same ids;", repr(a[0]["prompt"] + a[0]["text"]))
PY
grep -q "prefill .* tokens/s, decode .* tokens/s" "$work/final.err" || fail "no tokens/s on stderr"

# the CUDA backend on the emulator: the same greedy ids as the CPU
gen "$simt" --model_name_or_path "$work/out" "${prompts[@]}" --device cuda > "$work/cuda.jsonl" 2> "$work/cuda.err" \
  || { cat "$work/cuda.err"; fail "generate --device cuda"; }
python3 -c "
import json, sys
ids = lambda p: [json.loads(l)['ids'] for l in open(p)]
assert ids('$work/cuda.jsonl') == ids('$work/final.jsonl'), (ids('$work/cuda.jsonl'), ids('$work/final.jsonl'))
print('--device cuda (emulated): the same ids as the CPU')" || exit 1

# an instruct model's generation_config.json lists several EOS ids: any of them stops a prompt (kept last)
first=$(python3 -c "import json; print(json.loads(open('$work/final.jsonl').readline())['ids'][2])")
echo "{\"eos_token_id\": [5, $first]}" > "$work/out/generation_config.json"
gen "$llmt" --model_name_or_path "$work/out" "${prompts[@]}" > "$work/eos.jsonl" 2> "$work/eos.err" || fail "with EOS ids"
python3 - "$work/eos.jsonl" "$work/final.jsonl" "$first" <<'PY' || exit 1
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
full = [json.loads(l) for l in open(sys.argv[2])]
stop = int(sys.argv[3])
for g, f in zip(got, full):
    want = f["ids"][:f["ids"].index(stop) + 1] if stop in f["ids"] else f["ids"]
    assert g["ids"] == want, (g["ids"], want)
    assert g["finish_reason"] == ("eos" if stop in f["ids"] else "length"), g
print(f"generation_config.json eos_token_id [5, {stop}]: prompt 0 stops after 3 tokens, EOS kept")
PY
rm "$work/out/generation_config.json"
grep -q "stopping at 5, $first" "$work/eos.err" || { cat "$work/eos.err"; fail "the EOS ids are not logged"; }

# sampling with a seed repeats; one prompt per batch or all in one, the same draws
s=(--model_name_or_path "$work/out" "${prompts[@]}" --do_sample True --temperature 0.8 --top_p 0.9 --seed 5)
gen "$llmt" "${s[@]}" > "$work/s1.jsonl" 2>/dev/null && gen "$llmt" "${s[@]}" --batch_size 1 > "$work/s2.jsonl" 2>/dev/null \
  || fail "sampling"
cmp -s "$work/s1.jsonl" "$work/s2.jsonl" || fail "seeded sampling differs between batch sizes"
gen "$llmt" "${s[@]/--seed 5/}" --seed 6 > "$work/s3.jsonl" 2>/dev/null
cmp -s "$work/s1.jsonl" "$work/s3.jsonl" && fail "seeds 5 and 6 sampled the same"
echo "sampling: seed 5 repeats across batch sizes, seed 6 differs"

# bad input: named, and an existing --output untouched
echo '{"instruction": "Say hi", "input": ""}' > "$work/alpaca.jsonl"
echo '{"prompt": "ok"}' > "$work/bad.jsonl"
echo '{"prompt": 5}' >> "$work/bad.jsonl"
echo "keep me" > "$work/keep.jsonl"
expect_error() {  # expect_error <message> flags...
  local msg=$1
  shift
  if gen "$llmt" --model_name_or_path "$work/out" --output "$work/keep.jsonl" "$@" > "$work/err.log" 2>&1; then
    fail "ran: $*"; fi
  grep -qF -- "$msg" "$work/err.log" || { cat "$work/err.log"; fail "no \"$msg\" for $*"; }
  [ "$(cat "$work/keep.jsonl")" = "keep me" ] || fail "$* touched the existing output"
  ! grep -q "batch 1/" "$work/err.log" || { cat "$work/err.log"; fail "$* was refused only after a batch ran"; }
  echo "refused: $msg"
}
expect_error "alpaca.jsonl:1: an Alpaca record" --prompts_file "$work/alpaca.jsonl"
expect_error 'bad.jsonl:2: "prompt" is 5, expected a string' --prompts_file "$work/bad.jsonl"
expect_error "no prompts" --prompts_file /dev/null
expect_error "exceed the model's context of" --prompt "x" --max_new_tokens 100000
# (issue 33) every input checked before any work: a prompt too long for the context in batch 2 ran batch 1
# first and wrote nothing; --output into a missing directory failed after every batch; --output over
# the prompts file, the model's config.json or a checkpoint's file was written over; --threads -5 ran
long=$(printf 'x%.0s' $(seq 240))
expect_error "prompt of 240 tokens (batch 2)" --prompt x --prompt "$long" --batch_size 1 --max_new_tokens 20
expect_error "--output $work/missing/dir/out.jsonl: the directory $work/missing/dir does not exist" --prompt x \
  --output "$work/missing/dir/out.jsonl"
expect_error "is --prompts_file $work/keep.jsonl, which it would overwrite" --prompts_file "$work/keep.jsonl"
expect_error "would overwrite config.json of --model_name_or_path" --prompt x --output "$work/out/config.json"
expect_error "lies inside the checkpoint" --prompt x --output "$work/out/checkpoint-40/trainer_state.json"
expect_error "--threads -5: expected 0" --prompt x --threads -5
printf '{"prompt": "ok"}\n{"prompt": "caf\xe9 au lait"}\n' > "$work/latin1.jsonl"
expect_error "latin1.jsonl:2: invalid UTF-8 at column 16 (byte 0xe9)" --prompts_file "$work/latin1.jsonl"
# each finished batch's records are in --output at once (it was written at the end): killed after the
# third batch's line (logged after its records), the three are there
for i in $(seq 400); do echo "{\"prompt\": \"line $i: the\"}"; done > "$work/many.jsonl"
gen "$llmt" --model_name_or_path "$work/out" --prompts_file "$work/many.jsonl" --batch_size 1 --max_new_tokens 240 \
  --output "$work/stream.jsonl" > "$work/stream.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "batch 3/400" "$work/stream.log" && break; sleep 0.05; done
kill -9 $job 2> /dev/null
wait $job 2> /dev/null
grep -q "batch 3/400" "$work/stream.log" || { cat "$work/stream.log"; fail "the run did not reach batch 3"; }
! grep -q "wrote 400 records" "$work/stream.log" || fail "the run ended before it was killed: nothing tested"
python3 -c "
import json
recs = [json.loads(l) for l in open('$work/stream.jsonl')]
assert len(recs) >= 3 and [r['index'] for r in recs] == list(range(len(recs))), recs
print(f'killed during batch {len(recs) + 1} or so: its {len(recs)} finished records are in --output')" || fail "records lost"
# a model emits ids its tokenizer has no text for (a vocabulary of 259 over the bytes, EOS 256, as a
# GPT-2 padded to 50304 emits 50300): they decode to nothing, as transformers decodes them (exit 1, no record)
python3 - "$work/out/config.json" "$work/v259.json" <<'PY' || exit 1
import json, sys
c = json.load(open(sys.argv[1]))
c.update({"vocab_size": 259, "eos_token_id": 256, "bos_token_id": 256})
json.dump(c, open(sys.argv[2], "w"))
PY
"$llmt" train --model_config "$work/v259.json" --tokenizer_name_or_path bytes --train_file "$work/corpus.txt" \
  --block_size 32 --threads 1 --cache_dir "$work/cache" --per_device_train_batch_size 4 --max_steps 1 --save_strategy no \
  --output_dir "$work/v259" > "$work/v259.log" 2>&1 || { tail -5 "$work/v259.log"; fail "train the 259-id model"; }
gen "$llmt" --model_name_or_path "$work/v259" --prompt "the quick" --prompt "lazy dog" --prompt "fox" --do_sample True \
  --max_new_tokens 60 --seed 1 > "$work/v259.jsonl" 2> "$work/v259.err" || { cat "$work/v259.err"; fail "ids past the bytes"; }
python3 -c "
import json
recs = [json.loads(l) for l in open('$work/v259.jsonl')]
assert any(i >= 256 for r in recs for i in r['ids']), 'seed 1 drew no id past the bytes: the case is not tested'
for r in recs:
    assert r['text'] == bytes(i for i in r['ids'] if i < 256).decode('utf-8', 'replace'), r
print('ids past the tokenizer (EOS 256 among them): decoded to nothing;', [r['finish_reason'] for r in recs])" || exit 1
# a temperature of 1e-40: the greedy ids (x / T overflowed to NaN and gave the last token, 255, each step)
gen "$llmt" --model_name_or_path "$work/out" "${prompts[@]}" --do_sample True --temperature 1e-40 > "$work/cold.jsonl" \
  2>/dev/null || fail "--temperature 1e-40"
python3 -c "
import json
ids = lambda p: [json.loads(l)['ids'] for l in open(p)]
assert ids('$work/cold.jsonl') == ids('$work/final.jsonl'), (ids('$work/cold.jsonl'), ids('$work/final.jsonl'))
print('--do_sample True --temperature 1e-40: the greedy ids')" || exit 1
gen "$llmt" --model_name_or_path "$work/out" --prompts_file "$work/alpaca.jsonl" --alpaca_template True \
  > "$work/alpaca.out" 2>/dev/null || fail "--alpaca_template"
python3 -c "
import json; r = json.loads(open('$work/alpaca.out').read())
assert r['prompt'].startswith('Below is an instruction') and r['prompt'].endswith('### Response:'), r['prompt']
print('--alpaca_template: Stanford\'s prompt,', r['prompt_tokens'], 'tokens')" || exit 1
# a damaged checkpoint is refused by its checksums
printf 'X' | dd of="$work/out/checkpoint-40/state.h5" bs=1 seek=3000 conv=notrunc 2>/dev/null
if gen "$llmt" --model_name_or_path "$work/out/checkpoint-40" --prompt x > "$work/bad.log" 2>&1; then
  fail "a damaged checkpoint generated"; fi
grep -q "state.h5" "$work/bad.log" || { cat "$work/bad.log"; fail "the damaged file is not named"; }
echo "a damaged checkpoint: refused, naming state.h5"
# one process
if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 "$llmt" generate --model_name_or_path "$work/out" --tokenizer_name_or_path bytes \
     --prompt x > "$work/mpi.log" 2>&1; then fail "ran under mpirun -np 2"; fi
grep -q "runs as one process" "$work/mpi.log" || { cat "$work/mpi.log"; fail "no message under mpirun"; }
echo "mpirun -np 2: refused"
echo PASS
