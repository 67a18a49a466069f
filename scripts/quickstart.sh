#!/usr/bin/env bash
# The main job on the embedded default: build if needed, assemble a small corpus from text every
# Debian/Ubuntu system carries (the licence texts) plus this project's docs, train a small GPT-2
# on the CPU for a minute or two, and write the model as a Hugging Face directory.
#   QUICKSTART_STEPS (default 600) and QUICKSTART_OUT (default out/quickstart) change the run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/llmt ] || scripts/setup.sh

out=${QUICKSTART_OUT:-out/quickstart}
mkdir -p "$out"
corpus="$out/corpus.txt"
cat /usr/share/common-licenses/* README.md docs/*.md ../shared/DESIGN.md 2>/dev/null > "$corpus" || true
[ -s "$corpus" ] || { echo "quickstart: could not assemble a corpus" >&2; exit 1; }
echo "quickstart: corpus $corpus ($(wc -c < "$corpus") bytes)"

build/bin/llmt train \
  --model_config gpt2-small-byte \
  --train_file "$corpus" \
  --block_size 128 \
  --per_device_train_batch_size 16 \
  --learning_rate 2e-3 \
  --weight_decay 0.1 \
  --lr_scheduler_type cosine \
  --warmup_ratio 0.05 \
  --max_steps "${QUICKSTART_STEPS:-600}" \
  --logging_steps 50 \
  --seed 42 \
  --output_dir "$out"
echo "quickstart: the trained model is in $out (config.json, model.safetensors); metrics in $out/metrics.jsonl"
