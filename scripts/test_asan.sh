#!/usr/bin/env bash
# The unit tests (llmt_tests) again with AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/.
# Slow to build (about 17 minutes on 2 cores, then 1.5 minutes of tests), so CI runs it after
# scripts/test.sh and a developer runs it before a change to memory handling lands.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMT_CUDA=OFF -DLLMT_SANITIZE=ON > /dev/null
ninja -C build-asan llmt_tests
ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  OMP_NUM_THREADS=2 build-asan/bin/llmt_tests --gtest_brief=1 "$@"
