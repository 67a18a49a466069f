#!/usr/bin/env bash
# GPU self-test, one go, under 8 minutes on one H200: the device's share of the test suite on a real
# GPU, the determinism check, and the throughput benchmarks. Everything it prints also goes to
# $OUT/gpu_selftest.log (OUT defaults to .), the benchmark lines to $OUT/gpu_bench.jsonl.
#
#   scripts/gpu_selftest.sh             build build-gpu/ for sm_90 here (a GPU node with scripts/setup.sh's
#                                       packages), then test
#   scripts/gpu_selftest.sh --bundle    use the programs scripts/gpu_bundle.sh packed into .gpu/ (a bare
#                                       GPU machine with the CUDA toolkit and nothing else: the lent H200)
#
# Steps: nvidia-smi; llmt_gpu_tests (every op against the CPU backend in fp32 and bf16, the CUDA op
# tests, the Hugging Face fixtures on the device) with matmuls through cuBLASLt, then again with
# the plain matmul kernel; the same bf16 training run twice, compared bitwise; the CUDA backend against
# the CPU under mpirun (tests/cli/cuda_matches_cpu.sh, when mpirun is there); llmt bench for GPT-2
# 124M at T=1024 and a LLaMA ~1B configuration at T=2048, bf16, printing tokens/s and MFU.
# The exit status is non-zero when any test step failed; the benchmarks never fail it.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-.}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_selftest.log"
BENCH="$OUT/gpu_bench.jsonl"
mode=build
[ "${1:-}" = --bundle ] && mode=bundle

failures=()
step() {  # step <name> <command...>: runs it, records a failure
  local name=$1
  shift
  echo "== $name"
  local t0=$SECONDS
  "$@"
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failures+=("$name (exit $rc)")
  return 0
}

selftest() {
  echo "== llmt gpu selftest: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown), mode $mode"
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi || echo "(nvidia-smi failed)"; else echo "(no nvidia-smi)"; fi

  local bin
  if [ $mode = bundle ]; then
    [ -f "$ROOT/.gpu/bundle.tar.xz" ] || { echo "no .gpu/bundle.tar.xz: run scripts/gpu_bundle.sh first"; return 1; }
    local dir=/tmp/llmt-gpu
    rm -rf "$dir" && mkdir -p "$dir" && tar -xJf "$ROOT/.gpu/bundle.tar.xz" -C "$dir" || return 1
    # shellcheck source=/dev/null
    source "$dir/env.sh" || return 1
    bin="$dir/bin"
  else
    export PATH=/usr/local/cuda/bin:$PATH
    local gen=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    step configure cmake -S "$ROOT" -B "$ROOT/build-gpu" ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${LLMT_CUDA_ARCH:-90}"
    step build cmake --build "$ROOT/build-gpu" --target llmt llmt_gpu_tests -j "$(nproc)"
    [ ${#failures[@]} -eq 0 ] || return 1
    bin="$ROOT/build-gpu/bin"
  fi
  "$bin/llmt" netcheck 2>&1 | grep -i -E "cuda|gpu|nccl" | head -8

  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
  export LLMT_SOURCE_DIR="$ROOT"  # the fixtures, wherever the programs were built
  step "op and fixture tests, cuBLASLt matmuls" "$bin/llmt_gpu_tests" --gtest_color=no --gtest_brief=1
  step "op and fixture tests, plain matmul kernel" env LLMT_MATMUL=native "$bin/llmt_gpu_tests" --gtest_color=no \
    --gtest_brief=1 --gtest_filter='*cuda*:HfReferenceCuda*:CudaOps*'

  # determinism: one process, bf16, the same run twice
  local work
  work=$(mktemp -d)
  cat "$ROOT"/docs/*.md "$ROOT"/README.md > "$work/corpus.txt"
  local train=("$bin/llmt" train --device cuda --bf16 True --model_config gpt2-tiny --tokenizer_name_or_path bytes
               --train_file "$work/corpus.txt" --save_strategy no --block_size 128 --per_device_train_batch_size 8
               --gradient_accumulation_steps 2 --learning_rate 3e-3 --max_steps 20 --logging_steps 1 --seed 5)
  determinism() {
    "${train[@]}" --output_dir "$work/a" > "$work/a.log" 2>&1 || { cat "$work/a.log"; return 1; }
    "${train[@]}" --output_dir "$work/b" > "$work/b.log" 2>&1 || { cat "$work/b.log"; return 1; }
    grep "^step" "$work/a.log" | tail -3
    cmp <(grep -o '"loss":[0-9.e+-]*' "$work/a/metrics.jsonl") <(grep -o '"loss":[0-9.e+-]*' "$work/b/metrics.jsonl") &&
      cmp "$work/a/model.safetensors" "$work/b/model.safetensors" && echo "bitwise the same losses and weights"
  }
  step "determinism (bf16, twice)" determinism
  if command -v mpirun >/dev/null 2>&1; then
    # one GPU: NCCL refuses two ranks on it, so the two ranks' collectives go through MPI
    step "cuda matches cpu under mpirun" bash "$ROOT/tests/cli/cuda_matches_cpu.sh" "$bin/llmt" "$bin/llmt" no-nccl
  else
    echo "== cuda matches cpu under mpirun: skipped (no mpirun here)"
  fi

  # throughput (benchmarks: they print figures, they do not fail the self-test)
  cat > "$work/llama1b.json" <<'EOF'
{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
 "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true}
EOF
  echo "== bench (one JSON line each, also in $BENCH)"
  : > "$BENCH"
  for b in "--model gpt2 --seq_len 1024 --per_device_train_batch_size 16" \
           "--model $work/llama1b.json --seq_len 2048 --per_device_train_batch_size 4 --gradient_checkpointing True" \
           "--model $work/llama1b.json --seq_len 2048 --per_device_train_batch_size 2"; do
    # shellcheck disable=SC2086
    timeout 240 "$bin/llmt" bench --device cuda --bf16 True --steps 10 --warmup 3 $b 2>&1 | tee -a "$BENCH" ||
      echo "bench failed: $b"
  done
  rm -rf "$work"

  echo "== summary"
  if [ ${#failures[@]} -eq 0 ]; then echo "every test step passed"; return 0; fi
  printf 'FAILED: %s\n' "${failures[@]}"
  return 1
}

status=0
selftest 2>&1 | tee "$LOG" || status=$?
echo "log: $LOG"
exit "$status"
