#!/usr/bin/env bash
# scripts/launch.sh: the mpirun command it builds for given hostfiles and env files (--dry-run,
# compared word for word), the hostfile and env-file errors (each must name its line), and one real
# launch on this machine that shows env-file variables reaching every rank.
# Usage: launch_test.sh path/to/scripts/launch.sh [path/to/llmt]
set -uo pipefail
launch=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
llmt=${2:-}
[ -z "$llmt" ] || llmt=$(cd "$(dirname "$llmt")" && pwd)/$(basename "$llmt")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
mkdir -p home sys/class/net/{eth0,eth1,ib0,lo,docker0}
root=""
[ "$(id -u)" -ne 0 ] || root=" --allow-run-as-root"
failures=0

# A clean environment: only what each case sets reaches launch.sh.
run() { env -i HOME="$work/home" PATH=/usr/bin:/bin LLMT_GPUS_PER_NODE=0 "$@"; }

expect() {  # expect NAME EXPECTED -- command...
  local name=$1 want=$2
  shift 3
  local got
  got=$("$@" 2> "$work/stderr")
  local rc=$?
  if [ $rc -ne 0 ] || [ "$got" != "$want" ]; then
    echo "FAIL $name (rc $rc)"
    echo "  want: $want"
    echo "  got:  $got"
    sed 's/^/  stderr: /' "$work/stderr"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

expect_error() {  # expect_error NAME TEXT -- command...   (must fail and say TEXT)
  local name=$1 text=$2
  shift 3
  "$@" > "$work/stdout" 2> "$work/stderr"
  local rc=$?
  if [ $rc -eq 0 ] || ! grep -qF -- "$text" "$work/stderr"; then
    echo "FAIL $name (rc $rc): stderr should say: $text"
    sed 's/^/  stderr: /' "$work/stderr"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(head -n 1 "$work/stderr")"
  fi
}

cat > two-nodes <<'EOF'
# two nodes, 8 GPUs each
10.0.0.1 slots=8 max_slots=8

10.0.0.2   slots=8   # the second node
EOF
cat > netcheck.env <<'EOF'
# written by llmt netcheck --write-env
NCCL_IB_HCA==mlx5_0:1,mlx5_1:1

export NCCL_SOCKET_IFNAME==eth0
LLMT_GREETING="hello world"
   NCCL_DEBUG=WARN
EOF

# 1. env file (comments, blanks, export, quotes), the caller's NCCL_/UCX_ variables (the file wins),
#    NCCL_SOCKET_IFNAME's '=' stripped for Open MPI
expect "two nodes, env file, caller's NCCL/UCX variables" \
  "mpirun$root --hostfile two-nodes -np 16 --map-by ppr:8:node --bind-to numa --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 -x NCCL_IB_HCA==mlx5_0:1,mlx5_1:1 -x NCCL_SOCKET_IFNAME==eth0 -x 'LLMT_GREETING=hello world' -x NCCL_DEBUG=WARN -x NCCL_ALGO -x UCX_TLS -x PATH llmt train --fsdp 'full_shard auto_wrap'" \
  -- run NCCL_DEBUG=INFO NCCL_ALGO=Ring UCX_TLS=rc,sm OTHER=1 bash "$launch" --hostfile two-nodes --env-file netcheck.env --dry-run -- llmt train --fsdp "full_shard auto_wrap"
grep -q "NCCL_DEBUG=INFO in this shell is overridden by the env file: WARN" "$work/stderr" ||
  { echo "FAIL the override note is missing"; failures=$((failures + 1)); }

# 2. NCCL prefixes expand over this node's interfaces; '^' becomes an exclusion that keeps lo out
expect "NCCL_SOCKET_IFNAME=eth (prefix)" \
  "mpirun$root --hostfile two-nodes -np 16 --map-by ppr:8:node --bind-to numa --mca btl_tcp_if_include eth0,eth1 --mca oob_tcp_if_include eth0,eth1 -x NCCL_SOCKET_IFNAME -x PATH llmt" \
  -- run LLMT_SYSFS_ROOT="$work/sys" NCCL_SOCKET_IFNAME=eth bash "$launch" --hostfile two-nodes --dry-run -- llmt
expect "NCCL_SOCKET_IFNAME=^docker (exclusion)" \
  "mpirun$root --hostfile two-nodes -np 16 --map-by ppr:8:node --bind-to numa --mca btl_tcp_if_exclude lo,docker0 --mca oob_tcp_if_exclude lo,docker0 -x NCCL_SOCKET_IFNAME -x PATH llmt" \
  -- run LLMT_SYSFS_ROOT="$work/sys" NCCL_SOCKET_IFNAME=^docker bash "$launch" --hostfile two-nodes --dry-run -- llmt
expect "NCCL_SOCKET_IFNAME==ib0,eth1 (exact list)" \
  "mpirun$root --hostfile two-nodes -np 16 --map-by ppr:8:node --bind-to numa --mca btl_tcp_if_include ib0,eth1 --mca oob_tcp_if_include ib0,eth1 -x NCCL_SOCKET_IFNAME -x PATH llmt" \
  -- run LLMT_SYSFS_ROOT="$work/sys" NCCL_SOCKET_IFNAME==ib0,eth1 bash "$launch" --hostfile two-nodes --dry-run -- llmt

# 3. ./.llmt_env is found by itself, then ~/.llmt_env; --np, --bind-to, --mpirun-arg; GPUs agree
echo "LLMT_FROM=home" > home/.llmt_env
expect "HOME/.llmt_env when ./.llmt_env is absent" \
  "mpirun$root --hostfile two-nodes -np 4 --map-by ppr:8:node --bind-to none -x LLMT_FROM=home -x PATH --report-bindings llmt" \
  -- run LLMT_GPUS_PER_NODE=8 bash "$launch" --hostfile two-nodes --np 4 --bind-to none --mpirun-arg --report-bindings --dry-run -- llmt
echo "LLMT_FROM=cwd" > .llmt_env
expect "./.llmt_env first" \
  "mpirun$root --hostfile two-nodes -np 16 --map-by ppr:8:node --bind-to numa -x LLMT_FROM=cwd -x PATH -x OMP_NUM_THREADS llmt" \
  -- run OMP_NUM_THREADS=4 bash "$launch" --hostfile two-nodes --dry-run -- llmt
rm .llmt_env
expect "hostfile check" "two-nodes: 2 host(s) x 8 slots = 16 ranks" -- run bash "$launch" --hostfile two-nodes --check

# 4. errors, each naming where
printf 'a slots=2\nb slots=2\na slots=2\n' > dup
expect_error "duplicate host" "dup line 3: a is already on line 1" -- run bash "$launch" --hostfile dup --check
printf '# c\nnode1\n' > noslots
expect_error "missing slots" "noslots line 2: node1 has no slots=N" -- run bash "$launch" --hostfile noslots --check
printf 'node1 slots=0\n' > zero
expect_error "zero slots" "zero line 1: node1 has zero slots" -- run bash "$launch" --hostfile zero --check
printf 'n1 slots=8\n\nn2 slots=4\n' > unequal
expect_error "unequal slots" "unequal line 3: n2 has slots=4 but n1 (line 1) has slots=8" -- run bash "$launch" --hostfile unequal --check
expect_error "slots vs GPUs" "two-nodes line 2: slots=8 but the nodes have 4 GPUs (LLMT_GPUS_PER_NODE)" \
  -- run LLMT_GPUS_PER_NODE=4 bash "$launch" --hostfile two-nodes --check
printf 'n1 slots=2 cpus=4\n' > token
expect_error "unknown word" "token line 1: 'cpus=4' is not understood" -- run bash "$launch" --hostfile token --check
# parsed as Open MPI reads hostfiles: CRLF line ends, decimal slot counts (bash took 010 for 8 and failed
# on 08 with an octal error), repeated keys an error, absurd counts refused, each naming the line
printf 'n1 slots=2\r\nn2 slots=2\r\n' > crlf
expect "CRLF hostfile" "crlf: 2 host(s) x 2 slots = 4 ranks" -- run bash "$launch" --hostfile crlf --check
# what Open MPI 4.1 refuses or misreads is refused here, naming the line; host names ignore case (Open MPI
# calls n1 and N1 one node given twice); a byte-order mark is dropped (and mpirun gets the clean copy, part 5)
printf 'n1 slots=2\n::1 slots=2\n' > ipv6
expect_error "IPv6 address" "ipv6 line 2: '::1' is an IPv6 address" -- run bash "$launch" --hostfile ipv6 --check
printf 'n_1 slots=2\n' > underscore
expect_error "underscore in a host name" "underscore line 1: host 'n_1' has a character Open MPI 4.1 refuses" \
  -- run bash "$launch" --hostfile underscore --check
printf 'n1 slots=2\nn2 slots=2\nN1 slots=2\n' > case
expect_error "host names ignore case" "case line 3: N1 is already on line 1" -- run bash "$launch" --hostfile case --check
# this node under two names (localhost and its host name, or 127.0.0.1): mpirun failed with "multiple
# definitions of the slot count"
printf 'localhost slots=2\n%s slots=2\n' "$(hostname)" > local2
expect_error "this node twice" "local2 line 2: $(hostname) is this node, already on line 1 as localhost" \
  -- run bash "$launch" --hostfile local2 --check
printf 'n1 slots=2\nlocalhost slots=2\n127.0.0.1 slots=2\n' > loopback
expect_error "localhost and 127.0.0.1" "loopback line 3: 127.0.0.1 is this node, already on line 2 as localhost" \
  -- run bash "$launch" --hostfile loopback --check
printf '\xef\xbb\xbfn1 slots=2\r\nn2 slots=2\r\n' > bom
expect "UTF-8 BOM and CRLF" "bom: 2 host(s) x 2 slots = 4 ranks" -- run bash "$launch" --hostfile bom --check
expect "a normalised copy goes to mpirun" \
  "mpirun$root --hostfile /dev/fd/9 -np 4 --map-by ppr:2:node --bind-to numa -x LLMT_FROM=home -x PATH llmt" \
  -- run bash "$launch" --hostfile bom --dry-run -- llmt
grep -q "bom has CRLF line ends or a byte-order mark" "$work/stderr" ||
  { echo "FAIL the normalised-copy note is missing"; failures=$((failures + 1)); }
# the duplicate check is linear: 5000 hosts took minutes when each line was compared with every other
for i in $(seq 5000); do echo "node$i slots=8"; done > many
start=$(date +%s)
expect "5000 hosts" "many: 5000 host(s) x 8 slots = 40000 ranks" -- run bash "$launch" --hostfile many --check
took=$(( $(date +%s) - start ))
[ $took -le 15 ] || { echo "FAIL 5000 hosts took ${took}s"; failures=$((failures + 1)); }
printf 'n1 slots=08\nn2 slots=8\n' > octal8
expect "slots=08 is eight" "octal8: 2 host(s) x 8 slots = 16 ranks" -- run bash "$launch" --hostfile octal8 --check
printf 'n1 slots=010\n' > octal10
expect "slots=010 is ten" "octal10: 1 host(s) x 10 slots = 10 ranks" -- run bash "$launch" --hostfile octal10 --check
printf 'n1 slots=2 slots=3\n' > twice
expect_error "repeated key" "twice line 1: slots is given twice" -- run bash "$launch" --hostfile twice --check
printf 'n1 slots=99999999999999999999\n' > huge
expect_error "huge slots" "huge line 1: slots=99999999999999999999 is not a number of slots" -- run bash "$launch" --hostfile huge --check
printf 'n1 slots=4 max_slots=2\n' > maxs
expect_error "max_slots below slots" "maxs line 1: max_slots=2 is below slots=4" -- run bash "$launch" --hostfile maxs --check
printf '# nothing\n\n' > empty
expect_error "no hosts" "empty names no host" -- run bash "$launch" --hostfile empty --check
printf 'GOOD=1\nthis is not an assignment\n' > bad.env
expect_error "bad env-file line" "bad.env line 2: 'this is not an assignment' is not KEY=value" \
  -- run bash "$launch" --hostfile two-nodes --env-file bad.env --dry-run -- llmt
expect_error "np over slots" "--np 17 is more than the 16 slots of two-nodes" \
  -- run bash "$launch" --hostfile two-nodes --np 17 --dry-run -- llmt
expect_error "no program" "no program given" -- run bash "$launch" --hostfile two-nodes --dry-run

# 5. a real launch on this machine: env-file variables reach every rank, and llmt netcheck runs
printf 'localhost slots=2\n' > local
printf '# for every rank\nLLMT_PROBE="reached me"\n' > probe.env
out=$(run OMPI_MCA_mpi_yield_when_idle=1 bash "$launch" --hostfile local --env-file probe.env -- \
      bash -c 'echo "rank $OMPI_COMM_WORLD_RANK: $LLMT_PROBE"' 2>&1)
if [ "$(echo "$out" | grep -c ': reached me$')" -eq 2 ]; then
  echo "ok   real launch: both ranks see LLMT_PROBE"
else
  echo "FAIL real launch"; echo "$out" | sed 's/^/  /'; failures=$((failures + 1))
fi
# a hostfile with a byte-order mark and CRLF line ends, which mpirun alone refuses ("parse error")
printf '\xef\xbb\xbflocalhost slots=2\r\n' > local-bom
out=$(run OMPI_MCA_mpi_yield_when_idle=1 bash "$launch" --hostfile local-bom -- \
      bash -c 'echo "rank $OMPI_COMM_WORLD_RANK up"' 2>&1)
if [ "$(echo "$out" | grep -c '^rank [01] up$')" -eq 2 ]; then
  echo "ok   real launch from a BOM + CRLF hostfile"
else
  echo "FAIL real launch from a BOM + CRLF hostfile"; echo "$out" | sed 's/^/  /'; failures=$((failures + 1))
fi
if [ -n "$llmt" ]; then
  out=$(run OMPI_MCA_mpi_yield_when_idle=1 bash "$launch" --hostfile local -- "$llmt" netcheck --write-env "$work/out.env" 2>&1)
  if echo "$out" | grep -q "2 ranks on 1 node" && grep -q "^NCCL_SOCKET_IFNAME=" "$work/out.env"; then
    echo "ok   real launch: llmt netcheck on 2 ranks wrote $(grep -c '^[A-Z]' "$work/out.env") settings"
  else
    echo "FAIL llmt netcheck through launch.sh"; echo "$out" | sed 's/^/  /'; failures=$((failures + 1))
  fi
fi

if [ $failures -ne 0 ]; then echo "$failures FAILED"; exit 1; fi
echo "PASS"
