#!/usr/bin/env bash
# From a hostfile to the mpirun command that starts one rank per GPU on every node, with the
# environment each rank needs. Prints the command, then runs it (exec).
#
#   scripts/launch.sh --hostfile H [--env-file F ...] [--np N] [--bind-to numa|socket|none]
#                     [--mpirun-arg ARG ...] [--dry-run] -- llmt train ...
#   scripts/launch.sh --hostfile H --check      (check the hostfile only)
#
# The hostfile: one `host slots=N [max_slots=M]` line per node, '#' comments, blank lines. Every node
# gets the same number of ranks (--map-by ppr:SLOTS:node), which must equal its GPUs when that is
# known ($LLMT_GPUS_PER_NODE, else `nvidia-smi -L` on this node; LLMT_GPUS_PER_NODE=0 skips the check).
#
# The environment: every KEY=value of the env file (--env-file, repeatable, later files win; else
# ./.llmt_env, else ~/.llmt_env, as DeepSpeed reads .deepspeed_env) goes to every rank with -x, and so do
# the NCCL_* and UCX_* variables set here (the env file wins over them), PATH, LD_LIBRARY_PATH and
# OMP_NUM_THREADS. NCCL_SOCKET_IFNAME also restricts Open MPI's own TCP traffic to that interface.
set -euo pipefail

prog=launch.sh
die() { echo "$prog: error: $*" >&2; exit 2; }

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

hostfile="" dry_run=0 check_only=0 np="" bind="numa"
env_files=() extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hostfile) [ $# -ge 2 ] || die "--hostfile needs a file"; hostfile=$2; shift 2 ;;
    --hostfile=*) hostfile=${1#*=}; shift ;;
    --env-file) [ $# -ge 2 ] || die "--env-file needs a file"; env_files+=("$2"); shift 2 ;;
    --env-file=*) env_files+=("${1#*=}"); shift ;;
    --np) [ $# -ge 2 ] || die "--np needs a number"; np=$2; shift 2 ;;
    --np=*) np=${1#*=}; shift ;;
    --bind-to) [ $# -ge 2 ] || die "--bind-to needs a value"; bind=$2; shift 2 ;;
    --mpirun-arg) [ $# -ge 2 ] || die "--mpirun-arg needs a value"; extra+=("$2"); shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --check) check_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (the program to run goes after --)" ;;
  esac
done
[ -n "$hostfile" ] || die "--hostfile is required (see hostfiles/)"
[ -f "$hostfile" ] || die "hostfile '$hostfile' does not exist"
[ $check_only -eq 1 ] || [ $# -gt 0 ] || die "no program given: scripts/launch.sh --hostfile H -- llmt train ..."

# ---- the hostfile ----
# Read as Open MPI 4.1 reads it, and refused where it would refuse or misread it. mpirun gets the
# normalised text (one 'host slots=N [max_slots=M]' line per node) whenever the file is not already
# plain: Open MPI itself fails on a CRLF line end or a UTF-8 byte-order mark.
hosts=() host_slots=() host_lines=() normal=""
declare -A host_line=()  # lower-cased name -> its line: host names ignore case, as Open MPI's do
# This node's own names: mpirun takes localhost, 127.x.x.x, the host's names and its addresses for one
# node, and two lines naming it failed in mpirun with "multiple definitions of the slot count".
local_names=" localhost localhost.localdomain $(hostname 2> /dev/null) $(hostname -s 2> /dev/null) \
$(timeout 2 hostname -f 2> /dev/null) $(hostname -I 2> /dev/null) "
local_names=${local_names,,}
needs_copy=0
decimal() { [[ $2 =~ ^[0-9]{1,6}$ ]] || die "$where: $1=$2 is not a number of slots (decimal, at most 999999)"; }
lineno=0
while IFS= read -r raw || [ -n "$raw" ]; do
  lineno=$((lineno + 1))
  if [ $lineno -eq 1 ] && [ "${raw:0:3}" = $'\xef\xbb\xbf' ]; then raw=${raw:3}; needs_copy=1; fi  # a UTF-8 BOM
  if [ "${raw%$'\r'}" != "$raw" ]; then raw=${raw%$'\r'}; needs_copy=1; fi  # CRLF (the \r is invisible in messages)
  line=${raw%%#*}
  set -f; words=($line); set +f  # split on blanks, no globbing (a here-string per line costs a temporary file)
  [ ${#words[@]} -gt 0 ] || continue
  where="$hostfile line $lineno"
  host=${words[0]}
  [[ $host != *=* ]] || die "$where: '$raw' starts with '$host'; a line is 'host slots=N'"
  if [[ $host == *:* ]]; then
    die "$where: '$host' is an IPv6 address; Open MPI 4.1's hostfile takes host names and IPv4 addresses (give the node's name)"
  fi
  [[ $host =~ ^[A-Za-z0-9.-]+$ ]] ||
    die "$where: host '$host' has a character Open MPI 4.1 refuses in a node name (letters, digits, '.' and '-' only)"
  slots="" max_slots=""
  for w in "${words[@]:1}"; do
    case "$w" in
      slots=*) [ -z "$slots" ] || die "$where: slots is given twice ('$raw')"; slots=${w#slots=} ;;
      max_slots=*|max-slots=*) [ -z "$max_slots" ] || die "$where: max_slots is given twice ('$raw')"
                               max_slots=${w#*=} ;;
      *) die "$where: '$w' is not understood (expected slots=N [max_slots=M])" ;;
    esac
  done
  [ -n "$slots" ] || die "$where: $host has no slots=N (give the ranks per node, one per GPU)"
  # decimal, as Open MPI reads it (bash would take 010 for 8 and fail on 08); at most 6 digits
  decimal slots "$slots"
  slots=$((10#$slots))
  [ "$slots" -gt 0 ] || die "$where: $host has zero slots"
  if [ -n "$max_slots" ]; then
    decimal max_slots "$max_slots"
    max_slots=$((10#$max_slots))
    [ "$max_slots" -ge "$slots" ] || die "$where: max_slots=$max_slots is below slots=$slots"
  fi
  key=${host,,}
  if [[ $key == 127.* || $local_names == *" $key "* ]]; then
    [ -z "${host_line[@this-node]:-}" ] ||
      die "$where: $host is this node, already on line ${host_line[@this-node]} as ${local_host}" \
          "(localhost, 127.x.x.x and this host's names and addresses are one node to mpirun)"
    key=@this-node local_host=$host
  fi
  [ -z "${host_line[$key]:-}" ] ||
    die "$where: $host is already on line ${host_line[$key]} (one line per node; host names ignore case)"
  host_line[$key]=$lineno
  hosts+=("$host") host_slots+=("$slots") host_lines+=("$lineno")
  normal+="$host slots=$slots${max_slots:+ max_slots=$max_slots}"$'\n'
done < "$hostfile"
[ ${#hosts[@]} -gt 0 ] || die "$hostfile names no host"
ppn=${host_slots[0]}
for i in "${!hosts[@]}"; do
  [ "${host_slots[$i]}" -eq "$ppn" ] || die "$hostfile line ${host_lines[$i]}: ${hosts[$i]} has slots=${host_slots[$i]} but ${hosts[0]} (line ${host_lines[0]}) has slots=$ppn; every node must run the same number of ranks"
done
gpus=${LLMT_GPUS_PER_NODE:-}
gpus_from="LLMT_GPUS_PER_NODE"
if [ -z "$gpus" ] && command -v nvidia-smi > /dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ' || true)
  gpus_from="nvidia-smi on $(hostname)"
fi
if [ -n "$gpus" ] && [ "$gpus" != 0 ]; then
  [[ $gpus =~ ^[0-9]+$ ]] || die "LLMT_GPUS_PER_NODE=$gpus is not a number"
  [ "$ppn" -eq "$gpus" ] || die "$hostfile line ${host_lines[0]}: slots=$ppn but the nodes have $gpus GPUs ($gpus_from); llmt runs one rank per GPU (set LLMT_GPUS_PER_NODE=$ppn to mean it)"
fi
total=$(( ${#hosts[@]} * ppn ))
if [ $check_only -eq 1 ]; then
  echo "$hostfile: ${#hosts[@]} host(s) x $ppn slots = $total ranks"
  exit 0
fi
if [ -n "$np" ]; then
  [[ $np =~ ^[0-9]+$ ]] && [ "$np" -gt 0 ] || die "--np $np is not a positive number"
  [ "$np" -le "$total" ] || die "--np $np is more than the $total slots of $hostfile"
else
  np=$total
fi

# ---- the env file(s) ----
if [ ${#env_files[@]} -eq 0 ]; then
  if [ -f .llmt_env ]; then env_files=(.llmt_env)
  elif [ -n "${HOME:-}" ] && [ -f "$HOME/.llmt_env" ]; then env_files=("$HOME/.llmt_env")
  fi
fi
env_keys=() env_vals=()
for f in ${env_files[@]+"${env_files[@]}"}; do
  [ -f "$f" ] || die "env file '$f' does not exist"
  lineno=0
  while IFS= read -r raw || [ -n "$raw" ]; do
    lineno=$((lineno + 1))
    line=${raw#"${raw%%[![:space:]]*}"}      # leading blanks
    line=${line%"${line##*[![:space:]]}"}    # trailing blanks
    [ -n "$line" ] && [ "${line:0:1}" != "#" ] || continue
    line=${line#export }
    [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || die "$f line $lineno: '$raw' is not KEY=value"
    key=${BASH_REMATCH[1]} val=${BASH_REMATCH[2]}
    if [[ $val =~ ^\"(.*)\"$ ]] || [[ $val =~ ^\'(.*)\'$ ]]; then val=${BASH_REMATCH[1]}; fi
    found=0
    for i in "${!env_keys[@]}"; do
      if [ "${env_keys[$i]}" = "$key" ]; then env_vals[$i]=$val; found=1; fi
    done
    [ $found -eq 1 ] || { env_keys+=("$key"); env_vals+=("$val"); }
  done < "$f"
done
env_value() {  # the value a rank will see: the env file's, else this shell's
  local i
  for i in "${!env_keys[@]}"; do
    [ "${env_keys[$i]}" != "$1" ] || { printf '%s' "${env_vals[$i]}"; return; }
  done
  printf '%s' "${!1:-}"
}

# ---- the command ----
cmd=("${MPIRUN:-mpirun}")
[ "$(id -u)" -ne 0 ] || cmd+=(--allow-run-as-root)
mpi_hostfile=$hostfile
if [ $needs_copy -eq 1 ]; then
  # The normalised copy, on a descriptor mpirun inherits: the file itself is gone before mpirun
  # starts, so nothing is left behind after exec.
  copy=$(mktemp "${TMPDIR:-/tmp}/llmt-hostfile.XXXXXX") || die "cannot write a normalised copy of $hostfile"
  printf '%s' "$normal" > "$copy"
  exec 9< "$copy"
  rm -f "$copy"
  mpi_hostfile=/dev/fd/9
  echo "$prog: note: $hostfile has CRLF line ends or a byte-order mark, which Open MPI 4.1 cannot read; mpirun gets a normalised copy on $mpi_hostfile" >&2
fi
cmd+=(--hostfile "$mpi_hostfile" -np "$np" --map-by "ppr:$ppn:node" --bind-to "$bind")

# NCCL_SOCKET_IFNAME in NCCL's syntax ('^' excludes, '=' means exact names, else prefixes) to Open MPI's
# interface lists, which take exact names: prefixes expand over this node's interfaces.
ifname=$(env_value NCCL_SOCKET_IFNAME)
if [ -n "$ifname" ]; then
  mode=include
  if [ "${ifname:0:1}" = "^" ]; then mode=exclude; ifname=${ifname:1}; fi
  exact=0
  if [ "${ifname:0:1}" = "=" ]; then exact=1; ifname=${ifname:1}; fi
  netdir="${LLMT_SYSFS_ROOT:-/sys}/class/net"
  list=()
  IFS=',' read -r -a prefixes <<< "$ifname"
  for p in "${prefixes[@]}"; do
    [ -n "$p" ] || continue
    matched=0
    if [ $exact -eq 0 ] && [ -d "$netdir" ]; then
      for dev in $(ls "$netdir" | sort); do
        if [ "${dev#"$p"}" != "$dev" ]; then list+=("$dev"); matched=1; fi
      done
    fi
    [ $matched -eq 1 ] || list+=("$p")
  done
  if [ "$mode" = exclude ]; then
    # replacing Open MPI's default exclusion (127.0.0.1/8): keep loopback out
    has_lo=0
    for d in "${list[@]}"; do [ "$d" != lo ] || has_lo=1; done
    [ $has_lo -eq 1 ] || list=(lo "${list[@]}")
  fi
  joined=$(IFS=,; echo "${list[*]}")
  if [ -n "$joined" ]; then
    cmd+=(--mca "btl_tcp_if_$mode" "$joined" --mca "oob_tcp_if_$mode" "$joined")
  fi
fi

for i in "${!env_keys[@]}"; do cmd+=(-x "${env_keys[$i]}=${env_vals[$i]}"); done
while IFS= read -r name; do
  [ -n "$name" ] || continue
  skip=0
  for k in ${env_keys[@]+"${env_keys[@]}"}; do
    if [ "$k" = "$name" ]; then
      skip=1
      [ "${!name}" = "$(env_value "$name")" ] ||
        echo "$prog: note: $name=${!name} in this shell is overridden by the env file: $(env_value "$name")" >&2
    fi
  done
  [ $skip -eq 1 ] || cmd+=(-x "$name")
done < <(compgen -e | grep -E '^(NCCL|UCX)_' | LC_ALL=C sort || true)
for name in PATH LD_LIBRARY_PATH OMP_NUM_THREADS; do
  skip=0
  for k in ${env_keys[@]+"${env_keys[@]}"}; do [ "$k" != "$name" ] || skip=1; done
  [ $skip -eq 1 ] || [ -z "${!name:-}" ] || cmd+=(-x "$name")
done
cmd+=(${extra[@]+"${extra[@]}"} "$@")

# the command as one line a shell reads back: plain words bare, others in single quotes
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./:=,@%+^-]+$ ]]; then printf '%s' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}
line=""
for w in "${cmd[@]}"; do line+="${line:+ }$(quote "$w")"; done
echo "$line"
[ $dry_run -eq 1 ] && exit 0
exec "${cmd[@]}"
