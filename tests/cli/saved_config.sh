#!/usr/bin/env bash
# The config.json and generation_config.json a saved model carries (the final model, each checkpoint,
# llmt export): what the source config.json said, in its form (1e-06 stays 1e-06, not
# 9.999999974752427e-07; use_cache, initializer_range, reorder_and_upcast_attn kept), an
# eos_token_id list kept (Llama 3.1 Instruct's three ids were dropped, and transformers' generate on
# the fine-tune never stopped), the source's generation_config.json copied; and generate stopping at
# config.json's list. Usage: saved_config.sh path/to/llmt
set -uo pipefail
llmt=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for i in $(seq 200); do echo "config test line $i: the quick brown fox jumps over the lazy dog"; done > "$work/corpus.txt"
common=(--tokenizer_name_or_path bytes --train_file "$work/corpus.txt" --block_size 32 --threads 1
        --cache_dir "$work/cache" --per_device_train_batch_size 2 --max_steps 2 --save_steps 2)
"$llmt" train "${common[@]}" --model_config gpt2-tiny --output_dir "$work/base" > "$work/base.log" 2>&1 ||
  { tail -5 "$work/base.log"; fail "training the base model"; }
grep -q '"layer_norm_epsilon": 1e-05,' "$work/base/config.json" ||
  fail "a preset's eps is not written as 1e-05: $(grep epsilon "$work/base/config.json")"

# the source: keys llmt does not use, floats in their own form, a list of EOS ids, a generation config
mkdir "$work/src"
cp "$work/base/model.safetensors" "$work/src/"
python3 - "$work/base/config.json" "$work/src" <<'PY' || exit 1
import json, sys
c = json.load(open(sys.argv[1]))
c.update({"eos_token_id": [5, 7], "use_cache": True, "initializer_range": 0.02, "layer_norm_epsilon": 1e-06,
          "reorder_and_upcast_attn": True, "transformers_version": "4.44.0", "summary_type": "cls_index"})
open(sys.argv[2] + "/config.json", "w").write(json.dumps(c, indent=2))
open(sys.argv[2] + "/generation_config.json", "w").write(json.dumps({"eos_token_id": [5, 7, 9], "do_sample": False}))
PY
"$llmt" train "${common[@]}" --model_name_or_path "$work/src" --output_dir "$work/ft" > "$work/ft.log" 2>&1 ||
  { tail -5 "$work/ft.log"; fail "fine-tuning the source"; }
"$llmt" export "$work/ft/checkpoint-2" "$work/exported" --dtype BF16 > "$work/export.log" 2>&1 ||
  { tail -5 "$work/export.log"; fail "export"; }
for d in ft ft/checkpoint-2 exported; do
  python3 - "$work/src" "$work/$d" <<'PY' || exit 1
import json, sys
src, out = sys.argv[1], sys.argv[2]
text = open(out + "/config.json").read()
c, s = json.loads(text), json.load(open(src + "/config.json"))
for k, v in s.items():
    if k != "torch_dtype":
        assert c.get(k) == v, f"{out}/config.json: {k} is {c.get(k)!r}, the source said {v!r}"
assert '"layer_norm_epsilon": 1e-06,' in text, f"{out}/config.json: eps not in the source's form: {text}"
assert c["eos_token_id"] == [5, 7], c
want = "bfloat16" if out.endswith("exported") else "float32"
assert c["torch_dtype"] == want, (out, c["torch_dtype"])
g = json.load(open(out + "/generation_config.json"))
assert g == json.load(open(src + "/generation_config.json")), (out, g)
print(f"{out}: every source key in its form, eos_token_id [5, 7], generation_config.json copied")
PY
done

# generate stops at config.json's ids (without a generation_config.json too)
rm "$work/exported/generation_config.json"
"$llmt" generate --model_name_or_path "$work/exported" --tokenizer_name_or_path bytes --prompt x --max_new_tokens 2 \
  > /dev/null 2> "$work/gen.err" || { cat "$work/gen.err"; fail "generate"; }
grep -q "stopping at 5, 7;" "$work/gen.err" || { cat "$work/gen.err"; fail "config.json's EOS list is not used"; }
echo "generate: stopping at config.json's eos_token_id [5, 7]"
echo PASS
