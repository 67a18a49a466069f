#!/usr/bin/env bash
# GPU self-test: build the CUDA backend for sm_90 into build-gpu/, show the GPUs, and run
# llmt_cuda_tests (every CUDA op against its CPU twin). The whole log goes to
# ${OUT:-.}/gpu_selftest.log; the exit status is the build's or the tests'.
#   scripts/gpu_selftest.sh [extra gtest flags, e.g. --gtest_filter=CudaOps.AdamW]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-gpu"
mkdir -p "${OUT:-.}"
LOG="$(cd "${OUT:-.}" && pwd)/gpu_selftest.log"

selftest() {
  # Runs on the left of `| tee ... ||`, where set -e does not apply: each step returns on failure.
  echo "== llmt gpu selftest: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi || echo "(nvidia-smi failed)"
  else
    echo "(nvidia-smi not found)"
  fi

  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  echo "== configure"
  cmake -S "$ROOT" -B "$BUILD" ${gen[@]+"${gen[@]}"} -DLLMT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 || return
  echo "== build"
  cmake --build "$BUILD" --target llmt_cuda llmt_cuda_tests -j "$(nproc 2>/dev/null || echo 8)" || return

  echo "== llmt_cuda_tests"
  local status=0
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" "$BUILD/bin/llmt_cuda_tests" --gtest_color=no "$@" || status=$?
  echo "== done: llmt_cuda_tests exit status $status"
  return "$status"
}

status=0
selftest "$@" 2>&1 | tee "$LOG" || status=$?
echo "log: $LOG"
exit "$status"
