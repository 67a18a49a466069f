#!/usr/bin/env bash
# llmt bench measures what trains: its data collectives go over what llmt train would use (one
# choice, train/session.h), --ddp_backend picks them as in train, and each JSON line names them as
# "ddp_backend". Under mpirun with two ranks: on the CPU, MPI; with --device cuda (in ctest the SIMT
# emulator, one emulated device per rank), NCCL with --ddp_backend nccl, MPI staged through host
# memory with --ddp_backend mpi, and without the flag what train chooses on the emulator (mpi).
# Not a speed test. Usage: bench_comm.sh path/to/llmt path/to/llmt_simt
set -uo pipefail
llmt=$1
simt=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi=(mpirun -np 2)
[ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
[ "$(nproc)" -ge 2 ] || mpi+=(--oversubscribe)
args=(bench --model gpt2-tiny --seq_len 16 --per_device_train_batch_size 2 --steps 1 --warmup 0 --threads 1
      --fsdp "full_shard auto_wrap")
run() {  # run <name> <program> [flags...]: the JSON line's ddp_backend
  local name=$1 prog=$2
  shift 2
  LLMT_SIMT_DEVICES=2 OMP_NUM_THREADS=1 "${mpi[@]}" "$prog" "${args[@]}" "$@" > "$work/$name.jsonl" 2> "$work/$name.err" ||
    { echo "FAIL: $name: $prog ${args[*]} $*" >&2; cat "$work/$name.err" >&2; exit 1; }
  python3 -c 'import json,sys; l=[json.loads(x) for x in open(sys.argv[1])]; assert len(l)==1 and l[0]["ranks"]==2, l; print(l[0]["ddp_backend"])' \
    "$work/$name.jsonl" || { echo "FAIL: $name: not one JSON line over 2 ranks" >&2; cat "$work/$name.jsonl" >&2; exit 1; }
}
expect() {  # expect <name> <want> <got>
  [ "$3" = "$2" ] || { echo "FAIL: $1: ddp_backend \"$3\", expected $2"; exit 1; }
  echo "$1: ddp_backend $3"
}
got=$(run cpu "$llmt") || exit 1; expect cpu mpi "$got"
got=$(run cuda_nccl "$simt" --device cuda --ddp_backend nccl) || exit 1; expect cuda_nccl nccl "$got"
got=$(run cuda_mpi "$simt" --device cuda --ddp_backend mpi) || exit 1; expect cuda_mpi mpi "$got"
got=$(run cuda_default "$simt" --device cuda) || exit 1; expect cuda_default mpi "$got"
# the flag is checked as train checks it
if OMP_NUM_THREADS=1 "$llmt" "${args[@]}" --ddp_backend gloo > /dev/null 2> "$work/bad.err"; then
  echo "FAIL: --ddp_backend gloo was accepted"; exit 1
fi
grep -q "ddp_backend must be nccl or mpi" "$work/bad.err" || { echo "FAIL: no message for --ddp_backend gloo"; cat "$work/bad.err"; exit 1; }
echo PASS
