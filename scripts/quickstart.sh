#!/usr/bin/env bash
# The main job on the embedded default: build if needed, assemble a small corpus from text every
# Debian/Ubuntu system carries (the licence texts) plus this project's docs, train a small GPT-2
# on the CPU with two ranks under mpirun, fully sharded ("full_shard auto_wrap"), for a minute or
# two, and write the model as a Hugging Face directory.
#   QUICKSTART_STEPS (default 300), QUICKSTART_RANKS (2) and QUICKSTART_OUT (out/quickstart) change the run;
#   arguments are more llmt train flags (e.g. scripts/quickstart.sh --bf16 True).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/llmt ] || scripts/setup.sh

out=${QUICKSTART_OUT:-out/quickstart}
ranks=${QUICKSTART_RANKS:-2}
mkdir -p "$out"
corpus="$out/corpus.txt"
cat /usr/share/common-licenses/* README.md docs/*.md > "$corpus" 2>/dev/null || true
[ -s "$corpus" ] || { echo "quickstart: could not assemble a corpus" >&2; exit 1; }
echo "quickstart: corpus $corpus ($(wc -c < "$corpus") bytes), $ranks ranks"

mpi_flags=(-np "$ranks")
[ "$(id -u)" -ne 0 ] || mpi_flags+=(--allow-run-as-root)  # Open MPI refuses root without it
[ "$ranks" -le "$(nproc)" ] || mpi_flags+=(--oversubscribe)

mpirun "${mpi_flags[@]}" build/bin/llmt train \
  --model_config gpt2-small-byte \
  --tokenizer_name_or_path bytes \
  --train_file "$corpus" \
  --block_size 128 \
  --per_device_train_batch_size 8 \
  --fsdp "full_shard auto_wrap" \
  --fsdp_transformer_layer_cls_to_wrap GPT2Block \
  --learning_rate 2e-3 \
  --weight_decay 0.1 \
  --lr_scheduler_type cosine \
  --warmup_ratio 0.05 \
  --max_steps "${QUICKSTART_STEPS:-300}" \
  --logging_steps 10 \
  --save_strategy no \
  --seed 42 \
  --output_dir "$out" \
  "$@"
echo "quickstart: the trained model is in the output directory (config.json, model.safetensors), with metrics.jsonl"
# the run's curves as a PNG, when matplotlib is there (it is never needed to train); an --output_dir
# among the arguments is where the run went
run_dir=$out
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --output_dir) run_dir=${args[$((i + 1))]:-$out} ;;
    --output_dir=*) run_dir=${args[$i]#*=} ;;
  esac
done
if python3 -c "import matplotlib" 2> /dev/null; then
  python3 scripts/plot.py run "$run_dir" --out "$run_dir/curves.png"
else
  echo "quickstart: for the curves as a PNG: pip install -r scripts/requirements-plot.txt; scripts/plot.py run $run_dir"
fi
