#!/usr/bin/env bash
# The unit tests (llmt_tests) again with AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/.
# Slow to build (about 17 minutes on 2 cores, then 1.5 minutes of tests), so CI runs it after
# scripts/test.sh and a developer runs it before a change to memory handling lands.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMT_CUDA=OFF -DLLMT_SANITIZE=ON > /dev/null
ninja -C build-asan llmt_tests
# Every test runs in this one process: a test that hangs would hold CI until its limit, so the run
# has one of its own, and the log's last "[ RUN ]" line names the test that was running.
rc=0
ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  OMP_NUM_THREADS=2 timeout 1500 build-asan/bin/llmt_tests "$@" > build-asan/llmt_tests.log 2>&1 || rc=$?
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|Sanitizer|runtime error" build-asan/llmt_tests.log | tail -40
if [ $rc -eq 124 ]; then
  echo "test_asan: the unit tests did not finish within 25 minutes; the last test started:"
  grep "^\[ RUN" build-asan/llmt_tests.log | tail -1
fi
[ $rc -eq 0 ] || { echo "test_asan: exit $rc (the whole log: build-asan/llmt_tests.log; its last 60 lines follow)"; tail -60 build-asan/llmt_tests.log; }
exit $rc
