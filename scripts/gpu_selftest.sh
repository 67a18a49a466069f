#!/usr/bin/env bash
# GPU self-test, sized for one device lease: one `run` call of 540 s covers it, the bundle's unpacking
# included. Every step has its own time limit (--plan prints them; they add up to at most 7 minutes),
# runs in order of value, and writes to $OUT as it goes, so a run cut short still brings back what
# finished. OUT defaults to . ; the files (at most 8 come back from a lease):
#   gpu_selftest.log   everything, as it happens
#   gpu_bench.jsonl    llmt bench: one JSON line per training-step point
#   gpu_ops.jsonl      llmt bench --ops: one JSON line per op (attention whole and packed, the
#                      memory-bound kernels with GB/s, each matmul shape)
#
#   scripts/gpu_selftest.sh --plan      print the steps with their limits, run nothing
#   scripts/gpu_selftest.sh --bundle    use .gpu/bundle.tar.xz from scripts/gpu_bundle.sh (a bare GPU
#                                       machine with the driver and CUDA's libraries: the lent H200);
#                                       LLMT_GPU_BUNDLE names another bundle file
#   scripts/gpu_selftest.sh             build build-gpu/ for sm_90 here first (a GPU node with
#                                       scripts/setup.sh's packages), then the same steps
#
# The first step checks the machine: the programs' libraries (ldd), the loader cache's libcuda,
# libnvidia-ml, libcudnn and libnccl, nvidia-smi, the driver and runtime versions. A missing library
# stops the self-test there, in one line naming it and where it was looked for. The exit status is
# non-zero when a test step failed; the benchmarks print figures and never fail it.
# docs/gpu-results.md, "How to run it in a lease", has the exact calls.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# name|limit in seconds|function. In order of value: what only a GPU can show comes first.
STEPS=(
  "environment: libraries, driver, runtime|15|step_environment"
  "tensor-core fragment layouts (mma.sync, ldmatrix) on silicon|15|step_layouts"
  "op suite and fixtures on the GPU, cuBLASLt matmuls|45|step_ops_cublaslt"
  "op suite on the GPU, plain matmul kernel|30|step_ops_native"
  "compute-sanitizer memcheck: the CUDA op cases|35|step_memcheck"
  "compute-sanitizer racecheck + synccheck: tensor-core kernels, reductions|30|step_racecheck"
  "determinism: one bf16 training run twice, bitwise|25|step_determinism"
  "bench: GPT-2 124M, bf16, B=16 T=1024, no dropout|55|step_bench_gpt2"
  "bench: LLaMA 1.2B, bf16, B=4 T=2048|105|step_bench_llama"
  "ops: attention (cuDNN, flash; whole rows and packed), memory-bound kernels, matmul shapes; both models|60|step_ops_bench"
)
MAX_TOTAL_S=420  # 7 minutes: a 540 s run leaves two for the machine's start-up work and the unpacking

plan() {
  local total=0 entry name limit
  echo "llmt gpu self-test: steps and their time limits"
  for entry in "${STEPS[@]}"; do
    IFS='|' read -r name limit _ <<< "$entry"
    printf '  %4d s  %s\n' "$limit" "$name"
    total=$((total + limit))
  done
  printf '  %4d s  in all (at most %d s)\n' "$total" "$MAX_TOTAL_S"
  [ "$total" -le "$MAX_TOTAL_S" ]
}

mode=build
case "${1:-}" in
  --plan) plan; exit $? ;;
  --bundle) mode=bundle ;;
  "") ;;
  *) echo "usage: scripts/gpu_selftest.sh [--plan | --bundle]" >&2; exit 2 ;;
esac

OUT="${OUT:-.}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOG="$OUT/gpu_selftest.log"
BENCH="$OUT/gpu_bench.jsonl"
OPS="$OUT/gpu_ops.jsonl"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export OUT LOG BENCH OPS WORK ROOT mode
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
export LLMT_SOURCE_DIR="$ROOT"  # the fixtures, wherever the programs were built

# ---- the steps (each runs in its own bash under `timeout`, so everything it needs is exported) ----

# The libraries a program will load, as its loader resolves them; "not found" lines are missing ones.
resolve_libs() {  # resolve_libs <program>
  if [ "$mode" = bundle ]; then
    "$BUNDLE/lib/ld-linux.so" --list --library-path "$BUNDLE/lib${LLMT_CUDA_LIBS:+:$LLMT_CUDA_LIBS}" "$BUNDLE/real/$1"
  else
    ldd "$BIN/$1"
  fi
}

# Where a library is: the first folder of the search path that holds it, else the loader's cache.
find_lib() {  # find_lib <soname> <folders, colon-separated>
  local d
  local -a dirs
  IFS=':' read -r -a dirs <<< "$2"
  for d in "${dirs[@]}"; do [ -n "$d" ] && [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }; done
  ldconfig -p 2>/dev/null | awk -v l="$1" '$1 == l {print $NF; found = 1; exit} END {exit !found}'
}

step_environment() {
  echo "host $(hostname), $(getconf _NPROCESSORS_ONLN) cores, $(uname -r); commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown); mode $mode"
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi || echo "(nvidia-smi failed)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv || true
  else
    echo "(no nvidia-smi on PATH)"
  fi
  echo "-- the loader's cache:"
  ldconfig -p 2>/dev/null | grep -E 'lib(cuda|nvidia-ml|cudnn|nccl)\.so' || echo "(none of libcuda, libnvidia-ml, libcudnn, libnccl)"
  local search p missing=()
  if [ "$mode" = bundle ]; then search="$BUNDLE/lib:${LLMT_CUDA_LIBS:-}"; else search="${LD_LIBRARY_PATH:-}"; fi
  for p in llmt llmt_gpu_tests; do
    echo "-- ldd $p:"
    resolve_libs "$p" 2>&1 | sed 's/^/   /'
    while read -r lib; do missing+=("$lib (needed by $p)"); done < <(resolve_libs "$p" 2>&1 | awk '/not found/ {print $1}')
  done
  # loaded at run time, not linked: the driver's libraries
  for lib in libcuda.so.1 libnvidia-ml.so.1; do
    local at
    if at=$(find_lib "$lib" "$search"); then echo "-- $lib: $at"; else missing+=("$lib (the NVIDIA driver's)"); fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    local dirs="${search//:/, }"
    local what
    what=$(printf '%s, ' "${missing[@]}")
    echo "MISSING: ${what%, }; looked in ${dirs:-(no folders)}, then the loader's cache and /lib, /usr/lib"
    return 1
  fi
  echo "-- the device as llmt sees it (driver and runtime versions):"
  "$BIN/llmt" netcheck 2>&1 | grep -i -E "cuda|gpu|nccl" | head -8
}

step_layouts() {
  local filter='*Mma*:*Ldmatrix*:*FragmentLayout*'
  if [ -z "$("$BIN/llmt_gpu_tests" --gtest_list_tests --gtest_filter="$filter" | grep '^  ')" ]; then
    echo "skipped: llmt_gpu_tests has no tensor-core layout tests yet (docs/gpu-results.md)"
    return 0
  fi
  "$BIN/llmt_gpu_tests" --gtest_color=no --gtest_brief=1 --gtest_filter="$filter"
}

GPU_CASES='Backends/Ops.*/cuda_*:HfReferenceCuda.*:CudaOps.*:Fixtures/GenerateVsTransformers.*:Generate.*:Packing.*'
step_ops_cublaslt() { "$BIN/llmt_gpu_tests" --gtest_color=no --gtest_brief=1 --gtest_filter="$GPU_CASES"; }
step_ops_native() {
  # the cuda_lt_* cases pick cuBLASLt themselves: the plain kernel runs in cuda_f32 and cuda_bf16. Unset,
  # LLMT_ATTENTION is cuDNN on a GPU (the step above, and cuda_dnn_bf16); here cuda_bf16 runs flash.
  LLMT_MATMUL=native LLMT_ATTENTION=flash "$BIN/llmt_gpu_tests" --gtest_color=no --gtest_brief=1 \
    --gtest_filter='Backends/Ops.*/cuda_f32:Backends/Ops.*/cuda_bf16:CudaOps.*'
}

sanitizer() {  # sanitizer <tool> <gtest filter>: llmt's own kernels (flash attention; cuDNN's are not ours)
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null) ||
    { echo "skipped: no compute-sanitizer on this machine"; return 0; }
  LLMT_ATTENTION=flash "$cs" --tool "$1" --error-exitcode 9 --print-limit 20 "$BIN/llmt_gpu_tests" --gtest_color=no \
    --gtest_brief=1 --gtest_filter="$2-*/cuda_dnn_bf16"
}
step_memcheck() { sanitizer memcheck 'Backends/Ops.*/cuda_*:CudaOps.*'; }
step_racecheck() {
  # A short list: ctest's racecheck (ThreadSanitizer over the emulator), schedules and poison check
  # every kernel on every change (docs/design.md); silicon adds what they cannot see. The
  # tensor-core kernels (flash attention forward and backward, the mma/ldmatrix probes) and the
  # reductions (norms with their weight gradients, the loss, sums of squares).
  local kernels='Backends/Ops.AttentionForwardHeadSizes64And128OverTiles/cuda_bf16'
  kernels+=':Backends/Ops.AttentionBackwardHeadSizes64And128OverTiles/cuda_bf16:CudaOps.Mma*:CudaOps.Ldmatrix*'
  kernels+=':Backends/Ops.NormAndBiasGradientsOverManyRows/cuda_f32'
  kernels+=':Backends/Ops.CrossEntropyLossAndGradientVsFiniteDifferencesWithIgnored/cuda_f32:CudaOps.SumSquares'
  local rc=0
  sanitizer racecheck "$kernels" || rc=$?
  sanitizer synccheck "$kernels" || rc=$?
  return $rc
}

step_determinism() {
  cat "$ROOT"/docs/*.md "$ROOT"/README.md > "$WORK/corpus.txt"
  # one process, so --ddp_backend mpi: no NCCL communicator to start for a single rank
  local train=("$BIN/llmt" train --device cuda --bf16 True --model_config gpt2-tiny --tokenizer_name_or_path bytes
               --train_file "$WORK/corpus.txt" --save_strategy no --block_size 128 --per_device_train_batch_size 8
               --gradient_accumulation_steps 2 --learning_rate 3e-3 --max_steps 20 --logging_steps 1 --seed 5
               --ddp_backend mpi)
  "${train[@]}" --output_dir "$WORK/a" > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; return 1; }
  "${train[@]}" --output_dir "$WORK/b" > "$WORK/b.log" 2>&1 || { cat "$WORK/b.log"; return 1; }
  grep "^step" "$WORK/a.log" | tail -3
  cmp <(grep -o '"loss":[0-9.e+-]*' "$WORK/a/metrics.jsonl") <(grep -o '"loss":[0-9.e+-]*' "$WORK/b/metrics.jsonl") &&
    cmp "$WORK/a/model.safetensors" "$WORK/b/model.safetensors" && echo "bitwise the same losses and weights"
}

# LLaMA 3.2 1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV heads, d_ff 8192, vocab 128256, tied)
llama1b() {
  cat > "$WORK/llama1b.json" <<'EOF'
{"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
 "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, "max_position_embeddings": 2048,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": true}
EOF
  echo "$WORK/llama1b.json"
}
# Benchmarks: JSON lines to their own file, progress to the log. Never a failure.
bench() {
  "$BIN/llmt" bench --device cuda --bf16 True --steps 3 --warmup 1 --dropout 0 --results "$BENCH" "$@" > /dev/null ||
    echo "bench failed: $*"
  return 0
}
step_bench_gpt2() { bench --model gpt2 --seq_len 1024 --per_device_train_batch_size 16; }
step_bench_llama() { bench --model "$(llama1b)" --seq_len 2048 --per_device_train_batch_size 4; }
step_ops_bench() {
  local m impl
  for impl in cudnn flash; do  # the plain kernel is the reference, not a contender
    for m in "gpt2 --seq_len 1024 --per_device_train_batch_size 16" \
             "$(llama1b) --seq_len 2048 --per_device_train_batch_size 4"; do
      # shellcheck disable=SC2086
      LLMT_ATTENTION=$impl "$BIN/llmt" bench --ops True --device cuda --bf16 True --steps 5 --warmup 1 --model $m \
        >> "$OPS" || echo "ops bench failed: LLMT_ATTENTION=$impl $m"
    done
  done
  return 0
}

# ---- the run ----

failures=()
run_step() {  # run_step <name> <limit> <function>: under its limit; records a failure
  local name=$1 limit=$2 fn=$3 t0=$SECONDS rc
  echo "== $name (limit ${limit} s)"
  timeout -k 5 "$limit" bash -c "$fn"
  rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "== $name: stopped at its limit of ${limit} s"
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failures+=("$name (exit $rc)")
  return $rc
}

selftest() {
  echo "== llmt gpu selftest: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  plan || { echo "the plan's limits add up to more than $MAX_TOTAL_S s"; return 1; }
  if [ "$mode" = bundle ]; then
    local file="${LLMT_GPU_BUNDLE:-$ROOT/.gpu/bundle.tar.xz}"
    [ -f "$file" ] || { echo "no $file: run scripts/gpu_bundle.sh first"; return 1; }
    export BUNDLE="$WORK/bundle"
    mkdir -p "$BUNDLE" && tar -xJf "$file" -C "$BUNDLE" || { echo "could not unpack $file"; return 1; }
    # shellcheck source=/dev/null
    source "$BUNDLE/env.sh" || return 1
    export BIN="$BUNDLE/bin"
  else
    export PATH=/usr/local/cuda/bin:$PATH
    local gen=()
    command -v ninja > /dev/null 2>&1 && gen=(-G Ninja)
    cmake -S "$ROOT" -B "$ROOT/build-gpu" ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=Release -DLLMT_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${LLMT_CUDA_ARCH:-90}" > /dev/null &&
      cmake --build "$ROOT/build-gpu" --target llmt llmt_gpu_tests -j "$(nproc)" || { echo "the build failed"; return 1; }
    export BIN="$ROOT/build-gpu/bin"
  fi
  export -f resolve_libs find_lib sanitizer llama1b bench "${STEPS[@]##*|}"
  export GPU_CASES
  : > "$BENCH"
  : > "$OPS"
  local entry name limit fn first=1
  for entry in "${STEPS[@]}"; do
    IFS='|' read -r name limit fn <<< "$entry"
    if ! run_step "$name" "$limit" "$fn" && [ $first -eq 1 ]; then
      echo "stopped: nothing else can run on this machine until the environment step passes"
      break
    fi
    first=0
  done
  echo "== summary"
  if [ ${#failures[@]} -eq 0 ]; then echo "every test step passed"; return 0; fi
  printf 'FAILED: %s\n' "${failures[@]}"
  return 1
}

status=0
selftest 2>&1 | tee "$LOG" || status=$?
echo "log: $LOG; benchmarks: $BENCH, $OPS"
exit "$status"
