#!/usr/bin/env bash
# One config file and DeepSpeed configs through the executable (issue 35, items 3 and 4):
# `llmt train run.yaml|run.json` with command-line overrides and the file named in errors; --deepspeed
# with ZeRO-3 + bf16 + "auto" (the optimum-habana style) gives the same losses as the equivalent flags
# at 2 ranks; each field llmt cannot honour is refused by name, and a value that contradicts a flag.
# Usage: config_files.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
for i in $(seq 400); do echo "config test line $i: the quick brown fox"; done > corpus.txt
common=(--model_config gpt2-tiny --tokenizer_name_or_path bytes --train_file corpus.txt --block_size 32
        --per_device_train_batch_size 2 --gradient_accumulation_steps 2 --logging_steps 1 --save_strategy no
        --cache_dir none --threads 1)
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | tr '\n' ' '; }
fail() { echo "FAIL: $*"; exit 1; }
refused() {  # refused <name> <expected text> args...: llmt train fails, naming the expected text
  local name=$1 want=$2
  shift 2
  if "$llmt" train "$@" > "$name.log" 2>&1; then fail "$name: accepted"; fi
  grep -qF -- "$want" "$name.log" || { tail -3 "$name.log"; fail "$name: no \"$want\""; }
  echo "refused $name: $(grep -m1 error "$name.log")"
}

# a YAML config: lists joined, mappings as JSON, null left unset; the command line overrides it
cat > run.yaml <<'Y'
model_config: gpt2-tiny
tokenizer_name_or_path: bytes
train_file: corpus.txt
block_size: 32
max_steps: 3
per_device_train_batch_size: 2
learning_rate: 1e-3
lr_scheduler_type: cosine
lr_scheduler_kwargs: {num_cycles: 2}
report_to: [none]
logging_dir: null
logging_steps: 1
tf32: on
save_strategy: no
cache_dir: none
threads: 1
Y
"$llmt" train run.yaml --output_dir yaml --learning_rate 2e-3 > yaml.log 2>&1 || { tail yaml.log; fail "run.yaml"; }
grep -q 'flags  --learning_rate "2e-3" on the command line overrides run.yaml'"'"'s "1e-3"' yaml.log || fail "no override line"
grep -q 'lr 0.002 (cosine' yaml.log || fail "the override did not take"
grep -q 'note   --tf32 selects TF32' yaml.log || fail "tf32: on (YAML 1.1's boolean) was not read as True"
[ "$(grep -c '"loss"' yaml/metrics.jsonl)" = 3 ] || fail "run.yaml: not 3 steps"
echo "run.yaml + --learning_rate 2e-3: 3 steps at lr 0.002, cosine with num_cycles from a mapping, tf32: on, save_strategy: no"

# the same run from JSON (HfArgumentParser's args.json), given as --config (TRL's)
cat > run.json <<'J'
{"model_config": "gpt2-tiny", "tokenizer_name_or_path": "bytes", "train_file": "corpus.txt", "block_size": 32,
 "max_steps": 3, "per_device_train_batch_size": 2, "learning_rate": 2e-3, "lr_scheduler_type": "cosine",
 "lr_scheduler_kwargs": {"num_cycles": 2}, "report_to": ["none"], "logging_steps": 1, "save_strategy": "no",
 "cache_dir": "none", "threads": 1, "output_dir": "json"}
J
"$llmt" train --config run.json > json.log 2>&1 || { tail json.log; fail "--config run.json"; }
[ "$(losses json)" = "$(losses yaml)" ] || fail "run.json and run.yaml differ: $(losses json) / $(losses yaml)"
echo "--config run.json: the same losses as run.yaml"

echo '{"max_steps": 2, "output_dir": "x", "bogus_key": 1}' > bad_key.json
refused bad_key 'unknown or unsupported flag --bogus_key (in bad_key.json)' bad_key.json "${common[@]}"
echo '{"max_steps": "many"}' > bad_value.json
refused bad_value 'flag --max_steps expects an integer, got "many" (in bad_value.json)' bad_value.json "${common[@]}" --output_dir x
printf 'max_steps: 2\n  bad: [\n' > bad.yaml
refused bad_yaml 'bad.yaml line' bad.yaml "${common[@]}" --output_dir x
echo '[1, 2]' > list.json
refused list_json 'list.json: expected one JSON object of flag names' list.json

# DeepSpeed: ZeRO-3 + bf16 + "auto" equals --fsdp "full_shard auto_wrap" --bf16 True at 2 ranks
cat > ds.json <<'J'
{"steps_per_print": 64, "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
 "gradient_accumulation_steps": "auto", "bf16": {"enabled": true}, "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 3, "overlap_comm": false, "reduce_scatter": false, "contiguous_gradients": false,
                       "stage3_gather_16bit_weights_on_model_save": true}}
J
mpi=(mpirun --allow-run-as-root --oversubscribe -np 2)
"${mpi[@]}" "$llmt" train "${common[@]}" --max_steps 4 --deepspeed ds.json --output_dir ds > ds.log 2>&1 \
  || { tail ds.log; fail "--deepspeed ds.json"; }
"${mpi[@]}" "$llmt" train "${common[@]}" --max_steps 4 --fsdp "full_shard auto_wrap" --bf16 True --output_dir flags \
  > flags.log 2>&1 || { tail flags.log; fail "the equivalent flags"; }
[ -n "$(losses ds)" ] && [ "$(losses ds)" = "$(losses flags)" ] || fail "ds.json: $(losses ds); flags: $(losses flags)"
grep -q 'config deepspeed ds.json: .*bf16.enabled true -> --bf16 True.*zero_optimization.stage 3 -> --fsdp "full_shard auto_wrap"; not used: steps_per_print' ds.log \
  || { grep config ds.log; fail "the config line"; }
grep -q "fsdp   full_shard: shards over 2 ranks" ds.log || fail "ds.json did not shard"
echo "--deepspeed ZeRO-3 + bf16 + auto at 2 ranks: losses equal the flags' ($(losses ds))"

# a DeepSpeed config inline in a YAML config, with an optimizer and WarmupDecayLR mapped to flags
cat > inline.yaml <<'Y'
deepspeed:
  zero_optimization: {stage: 2}
  optimizer: {type: AdamW, params: {lr: 0.002, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: auto}}
  scheduler: {type: WarmupDecayLR, params: {warmup_min_lr: 0, warmup_max_lr: auto, warmup_num_steps: 1,
                                            total_num_steps: auto, warmup_type: linear}}
Y
"$llmt" train inline.yaml "${common[@]}" --max_steps 3 --output_dir inline > inline.log 2>&1 || { tail inline.log; fail inline; }
"$llmt" train "${common[@]}" --max_steps 3 --output_dir inline_flags --fsdp shard_grad_op --learning_rate 0.002 \
  --adam_beta2 0.95 --lr_scheduler_type linear --warmup_steps 1 > inline_flags.log 2>&1 || fail inline_flags
[ "$(losses inline)" = "$(losses inline_flags)" ] || fail "inline: $(losses inline); flags: $(losses inline_flags)"
echo "deepspeed inline in run.yaml (stage 2, AdamW, WarmupDecayLR): losses equal the flags'"

ds() { echo "$1" > "$2.json"; refused "$2" "$3" "${common[@]}" --max_steps 2 --output_dir x --deepspeed "$2.json"; }
ds '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}' offload \
  'zero_optimization.offload_optimizer: llmt keeps parameters and optimizer state on the rank'
ds '{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}' offload_param 'zero_optimization.offload_param'
ds '{"fp16": {"enabled": true}}' fp16 'fp16.enabled: llmt has no fp16 training'
ds '{"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8}}' hpz 'zero_optimization.zero_hpz_partition_size: ZeRO++'
ds '{"zero_optimization": {"stage": 4}}' stage4 'zero_optimization.stage: expected 0, 1, 2 or 3'
ds '{"zero_optimization": {"stage": 3}, "pipeline": {"stages": 2}}' unknown 'pipeline: not a field llmt knows'
ds '{"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}' lamb 'optimizer.type: llmt implements AdamW'
ds '{"scheduler": {"type": "WarmupCosineLR", "params": {}}}' cosine 'scheduler.type: llmt follows WarmupLR'
ds '{"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}' logwarm \
  'scheduler.params.warmup_type: absent, so DeepSpeed would warm up logarithmically'
ds '{"train_micro_batch_size_per_gpu": 4}' micro_conflict \
  'train_micro_batch_size_per_gpu: 4, but --per_device_train_batch_size is 2'
ds '{"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 2e-3}}}' \
  two_lrs 'scheduler.params.warmup_max_lr: 0.002, but optimizer.params.lr gave --learning_rate 0.001'
ds '{"train_batch_size": 6}' total_batch 'train_batch_size 6, but 1 ranks x 2 sequences x 2 accumulation steps make 4'
echo '{"zero_optimization": {"stage": 3}}' > z3.json
refused fsdp_conflict 'zero_optimization.stage: 3 is --fsdp "full_shard auto_wrap", but --fsdp is "no_shard"' \
  "${common[@]}" --max_steps 2 --output_dir x --deepspeed z3.json --fsdp no_shard
echo "ok"
