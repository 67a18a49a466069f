#!/usr/bin/env bash
# Llama 3.1 (llama3 rope scaling), Mistral (sliding window), Qwen2 (q/k/v biases), LLaMA with
# attention_bias + mlp_bias, Qwen3 (q/k norms, head_dim apart from the hidden size), Phi-3 (fused
# qkv_proj and gate_up_proj), Gemma 3 and Gemma 2 (GeGLU, (1 + w) and sandwich norms, scaled embeddings,
# per-layer RoPE), from their Hugging Face fixture directories, through the executable:
# each trains, resumes bitwise from its checkpoint, and exports a directory that transformers loads
# with the same parameters (when torch and transformers are installed; the config check always runs).
# Usage: families_test.sh path/to/llmt SOURCE_DIR
set -uo pipefail
llmt=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 400); do echo "family test line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
losses() { grep '"loss"' "$1/metrics.jsonl" | sed 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\).*/\2 \1/' | sort -n; }
common=(--tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 16 --per_device_train_batch_size 2
        --learning_rate 1e-3 --logging_steps 1 --threads 1 --cache_dir none)
have_hf=0
python3 -c "import torch, transformers" 2> /dev/null && have_hf=1
for family in llama31_tiny mistral_tiny qwen2_tiny llama_bias_tiny qwen3_tiny phi3_tiny phi3_longrope_tiny gemma3_tiny gemma2_tiny; do
  fixture="$src/tests/reference/$family"
  "$llmt" train "${common[@]}" --model_name_or_path "$fixture" --max_steps 4 --save_steps 2 --output_dir "$work/$family-a" \
    > "$work/$family-a.log" 2>&1 || { echo "FAIL: $family: training"; tail "$work/$family-a.log"; exit 1; }
  "$llmt" train "${common[@]}" --model_name_or_path "$fixture" --max_steps 4 --save_strategy no --output_dir "$work/$family-b" \
    --resume_from_checkpoint "$work/$family-a/checkpoint-2" > "$work/$family-b.log" 2>&1 \
    || { echo "FAIL: $family: resume"; tail "$work/$family-b.log"; exit 1; }
  diff <(losses "$work/$family-a") <(losses "$work/$family-b") > /dev/null \
    || { echo "FAIL: $family: resumed losses differ"; paste <(losses "$work/$family-a") <(losses "$work/$family-b"); exit 1; }
  # what the export says about the family, as transformers needs it
  python3 - "$work/$family-a/config.json" "$fixture/config.json" << 'PY' || exit 1
import json, sys
mine, theirs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
for key in ("model_type", "architectures", "num_key_value_heads", "tie_word_embeddings", "head_dim"):
    assert mine.get(key) == theirs.get(key), f"FAIL: {key}: {mine.get(key)} vs {theirs.get(key)}"
rp = {k: v for k, v in theirs["rope_parameters"].items()}
assert {k: float(v) if isinstance(v, (int, float)) else v for k, v in mine["rope_parameters"].items()} == \
       {k: float(v) if isinstance(v, (int, float)) else v for k, v in rp.items()}, f"FAIL: rope {mine['rope_parameters']} vs {rp}"
longrope = theirs["rope_parameters"].get("rope_type") == "longrope"  # Phi-3 reads its original context top-level
keys = ("attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "resid_pdrop", "partial_rotary_factor")
for key in keys + (("original_max_position_embeddings",) if longrope else ()):
    if key in theirs:
        assert mine.get(key) == theirs[key], f"FAIL: {key}: {mine.get(key)} vs {theirs[key]}"
PY
  note="config as transformers wrote it"
  if [ $have_hf -eq 1 ]; then  # learning rate 0: the export must be the fixture's parameters exactly
    "$llmt" train "${common[@]}" --model_name_or_path "$fixture" --max_steps 1 --learning_rate 0 --save_strategy no \
      --output_dir "$work/$family-c" > "$work/$family-c.log" 2>&1 || { echo "FAIL: $family: lr 0"; exit 1; }
    python3 "$src/tests/reference/make_fixtures.py" --check-llmt "$work/$family-c" --against "$family" \
      > "$work/$family-check.log" 2>&1 || { echo "FAIL: $family: transformers"; tail "$work/$family-check.log"; exit 1; }
    note="$note; transformers loads the export: $(tail -n 1 "$work/$family-check.log")"
  fi
  echo "$family: 4 steps, resumed from checkpoint-2 bitwise; $note"
done
# Alpaca through each family's own tokenizer (tests/reference/tokenizers_family): the family's tiny model
# with the tokenizer's vocabulary, random init; the export carries the tokenizer, which reads back the same.
cat > "$work/alpaca.json" << 'EOF'
[{"instruction": "Give three tips for staying healthy.", "input": "", "output": "Eat well, sleep, and exercise."},
 {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
 {"instruction": "Add the numbers.", "input": "12 and 30", "output": "42"}]
EOF
# (Qwen3 uses Qwen2's byte-level BPE tokenizer: the same vocabulary, so qwen2's directory)
for pair in llama3:llama31_tiny qwen2:qwen2_tiny mistral:mistral_tiny qwen2:qwen3_tiny; do
  tok=${pair%%:*} family=${pair#*:}
  tokdir="$src/tests/reference/tokenizers_family/$tok"
  vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['families'][sys.argv[2]]['vocab_size'])" \
          "$src/tests/reference/tokenizers_family/cases.json" "$tok")
  # the family's tiny config with the tokenizer's vocabulary, room for 128 positions (Stanford's prompt
  # alone is ~60 tokens of these tiny vocabularies); mistral_tiny's sliding window of 5 stays
  python3 - "$src/tests/reference/$family/config.json" "$vocab" "$work/$tok-config.json" << 'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["vocab_size"] = int(sys.argv[2])
c["max_position_embeddings"] = max(c["max_position_embeddings"], 128)
json.dump(c, open(sys.argv[3], "w"))
PY
  "$llmt" train --model_config "$work/$tok-config.json" --tokenizer_name_or_path "$tokdir" --data_path "$work/alpaca.json" \
    --model_max_length 128 --per_device_train_batch_size 2 --max_steps 3 --learning_rate 1e-3 --logging_steps 1 \
    --threads 1 --cache_dir none --save_strategy no --output_dir "$work/$tok-alpaca" > "$work/$tok-alpaca.log" 2>&1 \
    || { echo "FAIL: $tok: Alpaca training"; tail "$work/$tok-alpaca.log"; exit 1; }
  [ "$(losses "$work/$tok-alpaca" | wc -l)" -eq 3 ] || { echo "FAIL: $tok: expected 3 logged losses"; exit 1; }
  for f in tokenizer.json tokenizer_config.json; do
    cmp -s "$tokdir/$f" "$work/$tok-alpaca/$f" || { echo "FAIL: $tok: the export's $f is not the tokenizer's"; exit 1; }
  done
  a=$(echo "Hello world<|endoftext|>" | "$llmt" tokenize --tokenizer_name_or_path "$tokdir")
  b=$(echo "Hello world<|endoftext|>" | "$llmt" tokenize --tokenizer_name_or_path "$work/$tok-alpaca")
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "FAIL: $tok: the exported tokenizer encodes '$b', the original '$a'"; exit 1; }
  echo "$tok tokenizer + $family: Alpaca, 3 steps, loss $(losses "$work/$tok-alpaca" | head -n 1 | cut -d' ' -f2) -> $(losses "$work/$tok-alpaca" | tail -n 1 | cut -d' ' -f2); the export's tokenizer encodes as the original ($a)"
done
[ $have_hf -eq 1 ] || echo "(torch and transformers are not installed: the exports were not loaded by transformers)"
echo PASS
