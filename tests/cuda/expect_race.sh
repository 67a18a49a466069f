#!/usr/bin/env bash
# Runs one planted-defect test of the ThreadSanitizer build (tests/cuda/planted_test.cpp) and passes
# when ThreadSanitizer reported a data race whose stacks name the kernel.
#   expect_race.sh PROGRAM GTEST_FILTER KERNEL
set -uo pipefail
program=$1 filter=$2 kernel=$3
out=$("$program" --gtest_filter="$filter" 2>&1)
if grep -q "WARNING: ThreadSanitizer: data race" <<<"$out" && grep -q "$kernel" <<<"$out"; then
  echo "racecheck found the planted race in $kernel:"
  grep -E "WARNING: ThreadSanitizer|^  (Read|Write|Previous)|#0 .*$kernel" <<<"$out" | head -12
  exit 0
fi
echo "racecheck did not report a data race naming $kernel; the output:"
echo "$out" | tail -40
exit 1
