#!/usr/bin/env bash
# What dtype saved models are written in, as the Hugging Face Trainer saves them: fp32 under --bf16
# (autocast and FSDP's MixedPrecision keep fp32 parameters), unless --torch_dtype asks otherwise
# (bfloat16, float16, or auto: the --model_name_or_path checkpoint's). The final model and each
# checkpoint's; config.json's torch_dtype names what was written. A final save that fails (a weight
# beyond float16's range) keeps the trained state and says how to export it.
# Usage: saved_dtype.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 200); do echo "dtype test line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
common=(--tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 32 --threads 1
        --cache_dir "$work/cache" --per_device_train_batch_size 2 --max_steps 2 --save_steps 2)
run() {  # run <name> flags...: train into $work/<name>
  local name=$1
  shift
  "$llmt" train "${common[@]}" --output_dir "$work/$name" "$@" > "$work/$name.log" 2>&1 \
    || { echo "FAIL: $name"; tail -20 "$work/$name.log"; exit 1; }
}
# the dtypes in a safetensors header (8 bytes of length, then JSON), and config.json's torch_dtype
dtypes() { head -c 4096 "$1/model.safetensors" | grep -ao '"dtype":"[A-Z0-9]*"' | sed 's/.*:"\(.*\)"/\1/' | sort -u | tr '\n' ' '; }
torch_dtype() { sed -n 's/.*"torch_dtype": *"\([a-z0-9]*\)".*/\1/p' "$1/config.json"; }
expect() {  # expect <run> <safetensors dtype> <torch_dtype>
  for d in "$work/$1" "$work/$1/checkpoint-2"; do
    [ "$(dtypes "$d")" = "$2 " ] && [ "$(torch_dtype "$d")" = "$3" ] || {
      echo "FAIL: $1: $d holds $(dtypes "$d")(config.json torch_dtype $(torch_dtype "$d")), want $2 ($3)"; exit 1; }
  done
  echo "$1: the model and checkpoint-2 are $2, config.json says $3"
}

run bf16 --model_config gpt2-tiny --bf16 True
expect bf16 F32 float32
grep -q 'models saved in F32' "$work/bf16.log" || { echo "FAIL: the log does not say what models are saved in"; exit 1; }
run bf16_asked --model_config llama-tiny --bf16 True --torch_dtype bfloat16
expect bf16_asked BF16 bfloat16
run f16_asked --model_config gpt2-tiny --torch_dtype float16
expect f16_asked F16 float16
run f32_asked --model_config gpt2-tiny --bf16 True --torch_dtype float32
expect f32_asked F32 float32
run auto_scratch --model_config gpt2-tiny --bf16 True --torch_dtype auto
expect auto_scratch F32 float32
# auto: the checkpoint's own dtype, from config.json's torch_dtype ...
run auto_bf16 --model_name_or_path "$work/bf16_asked" --torch_dtype auto
expect auto_bf16 BF16 bfloat16
run auto_f32 --model_name_or_path "$work/bf16" --bf16 True --torch_dtype auto
expect auto_f32 F32 float32
# ... else its first floating-point tensor's
grep -v torch_dtype "$work/f16_asked/config.json" > "$work/cfg" && mv "$work/cfg" "$work/f16_asked/config.json"
run auto_f16 --model_name_or_path "$work/f16_asked" --torch_dtype auto
expect auto_f16 F16 float16
# a torch_dtype llmt cannot write is named
sed -i 's/"torch_dtype": *"float32"/"torch_dtype": "int8"/' "$work/bf16/config.json"
if "$llmt" train "${common[@]}" --output_dir "$work/bad" --model_name_or_path "$work/bf16" --torch_dtype auto \
     > "$work/bad.log" 2>&1; then echo "FAIL: auto with torch_dtype int8 ran"; exit 1; fi
grep -q 'config.json: "torch_dtype" is "int8"' "$work/bad.log" || { echo "FAIL: no message"; tail -3 "$work/bad.log"; exit 1; }
echo "auto with config.json's torch_dtype int8: refused, naming the file and field"

# A weight beyond float16's range at the final save (the wpe row of position 255, which no step of 32
# tokens uses, so training leaves it at 70000): the run used to end with config.json and no
# model.safetensors, the trained weights lost. The final model is not half written, the trained
# state is kept as a checkpoint (its model in F32), and the message says how to export it.
python3 - "$work/f32_asked/model.safetensors" <<'PY' || exit 1
import json, struct, sys
f = open(sys.argv[1], "r+b")
n = struct.unpack("<Q", f.read(8))[0]
t = json.loads(f.read(n))["transformer.wpe.weight"]
f.seek(8 + n + t["data_offsets"][0] + 4 * 64 * 255)  # row 255 of [256, 64] F32
f.write(struct.pack("<f", 70000.0))
PY
rm -rf "$work/f32_asked/checkpoint-2"
if "$llmt" train "${common[@]}" --output_dir "$work/range" --model_name_or_path "$work/f32_asked" --torch_dtype float16 \
     --save_strategy no > "$work/range.log" 2>&1; then echo "FAIL: a float16 save of 70000 succeeded"; exit 1; fi
grep -q 'beyond float16.s range (65504).*the trained model is kept in .*range/checkpoint-2 (model.safetensors in F32); export it again with `llmt export .*range/checkpoint-2 OUT_DIR' \
  "$work/range.log" || { echo "FAIL: the message does not say where the trained state is"; tail -3 "$work/range.log"; exit 1; }
[ ! -e "$work/range/config.json" ] && [ ! -e "$work/range/model.safetensors" ] ||
  { echo "FAIL: the failed final save left $(ls "$work/range")"; exit 1; }
[ "$(dtypes "$work/range/checkpoint-2")" = "F32 " ] || { echo "FAIL: the kept checkpoint is not F32"; exit 1; }
"$llmt" export "$work/range/checkpoint-2" "$work/range_export" --dtype BF16 > "$work/range_export.log" 2>&1 ||
  { echo "FAIL: export of the kept state"; tail -3 "$work/range_export.log"; exit 1; }
[ "$(dtypes "$work/range_export")" = "BF16 " ] || { echo "FAIL: the export is not BF16"; exit 1; }
echo "a float16 save beyond 65504: refused after training, the state kept in checkpoint-2 and exported as BF16"
