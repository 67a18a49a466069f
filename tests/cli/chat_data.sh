#!/usr/bin/env bash
# Chat data through the executable (issue 35, item 2): `llmt train --data_path chat.jsonl` with a tiny
# LLaMA and the Llama 3 family tokenizer whose directory holds the stock chat template trains on the
# assistant turns by default (found by each turn's prefix), with and without --packing; the same
# records as ShareGPT with TRL's {% generation %} training template give the same losses (the two
# methods' masks are equal for Llama 3); the data line names the format, the template and the method;
# a bad record fails naming the file and its line.
# Usage: chat_data.sh path/to/llmt SOURCE_DIR
set -uo pipefail
llmt=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }

# the family tokenizer, with the stock Llama 3 template beside it as transformers saves it
mkdir tok
cp "$src/tests/reference/tokenizers_family/llama3/"{tokenizer.json,tokenizer_config.json} tok/
cp "$src/tests/reference/chat/templates/llama3.jinja" tok/chat_template.jinja
# tests/reference/llama_tiny with the tokenizer's 1256 ids and its BOS/EOS
sed -e 's/"vocab_size": 259/"vocab_size": 1256/' -e 's/"bos_token_id": 1,/"bos_token_id": 1000,/' \
    -e 's/"eos_token_id": 2,/"eos_token_id": 1001,/' -e 's/"max_position_embeddings": 64/"max_position_embeddings": 128/' \
    "$src/tests/reference/llama_tiny/config.json" > config.json
grep -q '"vocab_size": 1256' config.json || fail "config.json not made"

# 24 conversations of 1 to 3 turns, every fourth with a system prompt: as messages and as ShareGPT
: > chat.jsonl
: > sharegpt.jsonl
for i in $(seq 0 23); do
  m=""
  s=""
  if [ $((i % 4)) = 0 ]; then
    m='{"role": "system", "content": "Be brief."}, '
    s='{"from": "system", "value": "Be brief."}, '
  fi
  for t in $(seq 0 $((i % 3))); do
    m+="{\"role\": \"user\", \"content\": \"What is $i+$t?\"}, {\"role\": \"assistant\", \"content\": \"$((i + t))\"}, "
    s+="{\"from\": \"human\", \"value\": \"What is $i+$t?\"}, {\"from\": \"gpt\", \"value\": \"$((i + t))\"}, "
  done
  echo "{\"messages\": [${m%, }]}" >> chat.jsonl
  echo "{\"conversations\": [${s%, }]}" >> sharegpt.jsonl
done

common=(--model_config config.json --tokenizer_name_or_path tok --model_max_length 128 --max_steps 4
        --per_device_train_batch_size 2 --learning_rate 1e-3 --logging_steps 1 --save_strategy no --cache_dir none
        --threads 1)
losses() { grep -o '"loss":[^,]*' "$1/metrics.jsonl" | tr '\n' ' '; }
trains() {  # trains <name> args...: llmt train succeeds, logging 4 finite losses
  local name=$1
  shift
  "$llmt" train "${common[@]}" --output_dir "$name" "$@" > "$name.log" 2>&1 || { tail "$name.log"; fail "$name: training"; }
  [ "$(grep -c '"loss"' "$name/metrics.jsonl")" = 4 ] || fail "$name: not 4 logged losses"
  losses "$name" | grep -qiE 'nan|inf' && fail "$name: a loss is not finite: $(losses "$name")"
  grep -q '^step      4/4 | epoch [0-9.]* | loss [0-9]' "$name.log" || fail "$name: no step line with a loss"
}
data_line() {  # data_line <name> <text>: the log's data line says it
  grep -qF -- "$2" "$1.log" || { grep '^data' "$1.log"; fail "$1: no data line with \"$2\""; }
}

trains messages --data_path chat.jsonl
data_line messages "data   chat chat.jsonl: conversational (messages) records, the chat template of tok/chat_template.jinja; loss on the assistant turns, found by rendering each turn's prefix"
data_line messages "24 examples, 1271 tokens (126 with loss: assistant turns)"
echo "messages, the tokenizer's stock template: 4 steps, losses $(losses messages)"

trains packed --data_path chat.jsonl --packing True
data_line packed "loss on the assistant turns, found by rendering each turn's prefix"
data_line packed "data   --packing: 24 examples (1271 tokens) in"
echo "messages --packing True: 4 steps, losses $(losses packed)"

# the token cache: a second run maps the first's file; --overwrite_cache removes it and tokenizes again
trains cached1 --data_path chat.jsonl --cache_dir cache
trains cached2 --data_path chat.jsonl --cache_dir cache
data_line cached2 "from the token cache"
trains cached3 --data_path chat.jsonl --cache_dir cache --overwrite_cache True
data_line cached3 "--overwrite_cache: removed"
grep -q "from the token cache" cached3.log && fail "--overwrite_cache True still read the cache"
echo "chat data: cached, and --overwrite_cache tokenizes again"

trains sharegpt --data_path sharegpt.jsonl --chat_template "$src/tests/reference/chat/templates/llama3_training.jinja"
data_line sharegpt "data   chat sharegpt.jsonl: ShareGPT (conversations) records, the chat template of $src/tests/reference/chat/templates/llama3_training.jinja; loss on the assistant turns, found by {% generation %} blocks"
[ "$(losses sharegpt)" = "$(losses messages)" ] || fail "ShareGPT + generation blocks: $(losses sharegpt), messages + prefixes: $(losses messages)"
echo "ShareGPT with llama3_training.jinja ({% generation %}): the same losses"

trains everything --data_path chat.jsonl --assistant_only_loss False
data_line everything "loss on every token"
data_line everything "1271 tokens (1271 with loss: every token)"
echo "--assistant_only_loss False: loss on every token"

# a bad record fails naming the file and its line
refused() {  # refused <name> <expected text> args...
  local name=$1 want=$2
  shift 2
  if "$llmt" train "${common[@]}" --output_dir "$name" "$@" > "$name.log" 2>&1; then fail "$name: accepted"; fi
  grep -qF -- "$want" "$name.log" || { tail -3 "$name.log"; fail "$name: no \"$want\""; }
  echo "refused $name: $(grep -m1 error "$name.log")"
}
{ head -2 chat.jsonl; echo '{"messages": [{"from": "user", "value": "hi"}]}'; tail -1 chat.jsonl; } > bad.jsonl
refused bad_message "bad.jsonl: line 3: message 0 of \"messages\" has keys \"from\", \"value\"" --data_path bad.jsonl
{ head -4 chat.jsonl; echo '{"messages": [{"role": "user", "content": "hi"}'; } > broken.jsonl
refused broken_json "broken.jsonl: line 5 is not valid JSON" --data_path broken.jsonl
echo "PASS"
