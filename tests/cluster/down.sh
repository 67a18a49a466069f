#!/usr/bin/env bash
# Removes what tests/cluster/up.sh (and slurm_up.sh) made: every process in the hosts' namespaces,
# the namespaces, the bridge, the /etc/hosts lines, the Slurm and munge daemons the harness
# started, and $LLMT_CLUSTER_DIR. Safe to run twice, or after a failed run.
set -uo pipefail
name=${LLMT_CLUSTER_NAME:-llmt}
dir=${LLMT_CLUSTER_DIR:-/tmp/$name-cluster}
[ "$(id -u)" -eq 0 ] || { echo "down.sh: needs root"; exit 0; }

# daemons the harness started outside the hosts (slurmctld, munged): by their pid files
for pidfile in "$dir"/slurm/slurmctld.pid "$dir"/munge/munged.pid; do
  [ -f "$pidfile" ] && kill -9 "$(cat "$pidfile")" 2> /dev/null
done
for ns in $(ip netns list 2> /dev/null | awk -v p="^$name-node" '$1 ~ p {print $1}'); do
  pids=$(ip netns pids "$ns" 2> /dev/null)
  [ -z "$pids" ] || kill -9 $pids 2> /dev/null
  ip netns del "$ns" 2> /dev/null
done
ip link del "$name-br0" 2> /dev/null
for v in $(ip -o link show 2> /dev/null | awk -F': ' -v p="^$name-v[0-9]" '$2 ~ p {print $2}' | cut -d@ -f1); do
  ip link del "$v" 2> /dev/null
done
if grep -q "# $name-cluster$" /etc/hosts 2> /dev/null; then
  # /etc/hosts may be a bind mount (containers): rewrite it in place, never replace the file
  kept=$(grep -v "# $name-cluster$" /etc/hosts)
  printf '%s\n' "$kept" > /etc/hosts
fi
rm -rf "$dir"
echo "down.sh: the test cluster $name is gone"
