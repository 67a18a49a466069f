#!/usr/bin/env bash
# The GPU self-test's parts that need no GPU (scripts/gpu_selftest.sh, scripts/gpu_env.sh):
#  1. --plan: every step has a limit and they add up to at most 7 minutes (one lease's command);
#  2. the bundle's library search on a fake layout of Python's nvidia wheels (CUDA 13's shared
#     nvidia/cu13/lib, NCCL's nvidia/nccl/lib), keeping LD_LIBRARY_PATH;
#  3. a bundle on a machine without the NVIDIA driver stops at the first step, within seconds, with
#     one line naming libcuda.so.1 and where it was looked for (skipped where a driver is installed).
# Usage: gpu_selftest_test.sh <source dir>
set -uo pipefail
src=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. the plan
plan=$("$src/scripts/gpu_selftest.sh" --plan) || fail "--plan exits non-zero: $plan"
echo "$plan"
total=$(echo "$plan" | awk '/in all/ {print $1}')
steps=$(echo "$plan" | grep -c -E '^ +[0-9]+ s  ' )
[ -n "$total" ] && [ "$total" -le 420 ] || fail "the plan adds up to ${total:-nothing} s, over 420"
[ "$steps" -ge 9 ] || fail "the plan lists $steps lines"
echo "$plan" | head -2 | grep -q "environment" || fail "the first step is not the environment check"

# 2. the library search on a fake wheel layout
site="$work/site"
mkdir -p "$site/nvidia/cu13/lib" "$site/nvidia/nccl/lib" "$site/nvidia/cudnn/lib" "$site/nvidia/not_a_lib"
touch "$site/nvidia/cu13/lib/libcublasLt.so.13" "$site/nvidia/nccl/lib/libnccl.so.2"
libs=$(cd "$work" && PYTHONPATH="$site" LD_LIBRARY_PATH=/keep/this bash -c \
  "source '$src/scripts/gpu_env.sh' > /dev/null && echo \"\$LLMT_CUDA_LIBS\"") || fail "gpu_env.sh failed"
echo "search path: $libs"
for d in "$site/nvidia/cu13/lib" "$site/nvidia/nccl/lib" "$site/nvidia/cudnn/lib" /keep/this; do
  case ":$libs:" in *":$d:"*) ;; *) fail "$d is not on the search path" ;; esac
done
case ":$libs:" in *not_a_lib*) fail "a folder without lib/ is on the search path" ;; esac
[ "${libs##*:}" = /keep/this ] || fail "LD_LIBRARY_PATH is not last"

# 3. a bundle without a driver: stop at the first step
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' || [ -e /usr/local/nvidia/lib64/libcuda.so.1 ]; then
  echo "PASS (part 3 skipped: this machine has the NVIDIA driver's libcuda.so.1)"
  exit 0
fi
b="$work/bundle"
mkdir -p "$b/bin" "$b/real" "$b/lib"
loader=$(ldd /bin/true | awk '/ld-linux/ {print $1}')
cp -L "$loader" "$b/lib/ld-linux.so"
for p in llmt llmt_gpu_tests; do
  cp /bin/true "$b/real/$p"
  printf '#!/usr/bin/env bash\necho "ran %s" >> "%s"\n' "$p" "$work/ran" > "$b/bin/$p"
  chmod +x "$b/bin/$p"
done
cp "$src/scripts/gpu_env.sh" "$b/env.sh"
tar -cJf "$work/bundle.tar.xz" -C "$b" .
start=$SECONDS
OUT="$work/out" LLMT_GPU_BUNDLE="$work/bundle.tar.xz" PYTHONPATH="$site" timeout 60 \
  "$src/scripts/gpu_selftest.sh" --bundle > "$work/selftest.out" 2>&1
rc=$?
took=$((SECONDS - start))
cat "$work/selftest.out"
[ $rc -ne 0 ] || fail "the self-test passed without a driver"
[ $rc -ne 124 ] || fail "the self-test ran into the test's 60 s limit"
[ $took -le 20 ] || fail "the self-test took ${took}s to stop"
grep -q "^MISSING: libcuda.so.1 (the NVIDIA driver's).*looked in .*/usr/local/cuda" "$work/out/gpu_selftest.log" ||
  fail "no MISSING line naming libcuda.so.1 and where it looked"
grep -q "^stopped: nothing else can run" "$work/out/gpu_selftest.log" || fail "it did not stop after the first step"
[ ! -e "$work/ran" ] || fail "a program ran after the environment step failed: $(cat "$work/ran")"
[ -f "$work/out/gpu_bench.jsonl" ] && [ -f "$work/out/gpu_ops.jsonl" ] || fail "the result files are not there"
echo "PASS (stopped after ${took}s)"
