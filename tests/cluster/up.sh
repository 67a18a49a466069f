#!/usr/bin/env bash
# A small cluster on this machine: N hosts, each a network namespace with its own address on one
# bridge, its own hostname (a UTS namespace) and its own sshd. Open MPI reaches them over ssh as it
# reaches real nodes; the file system is this machine's, shared as NFS would be.
#
#   tests/cluster/up.sh N        make node1..nodeN (needs root and `ip netns`)
#   . $LLMT_CLUSTER_DIR/env.sh   then: mpirun -hostfile $LLMT_CLUSTER_DIR/hostfile ...
#   tests/cluster/down.sh        remove all of it (also after a failed run)
#
# Two clusters can stand side by side: LLMT_CLUSTER_NAME (default llmt) prefixes every name below,
# LLMT_CLUSTER_HOST (default node) names the hosts, LLMT_CLUSTER_SUBNET (default 10.213.0) their /24.
# What it makes (for the defaults), all removed by down.sh:
#   - bridge "$name-br0" with 10.213.0.1/24 (this "login node"), and per host K: namespace llmt-nodeK,
#     veth llmt-vK (bridge side) / eth0 (inside), address 10.213.0.(10+K), hostname nodeK
#   - /etc/hosts lines "10.213.0.(10+K) nodeK  # llmt-cluster" (so hostfiles can name nodeK)
#   - $LLMT_CLUSTER_DIR (default /tmp/llmt-cluster): a client key made for the harness, each host's
#     sshd key, config and pid, env.sh (Open MPI's launcher and interfaces), hostfile (slots=2),
#     hosts (name, address, namespace per line)
# Nothing in ~/.ssh changes: the sshds read the harness's own authorized_keys file.
# Exit status 77 (ctest's skip) with the reason when this machine cannot make namespaces.
set -euo pipefail
n=${1:?usage: up.sh N}
[[ $n =~ ^[1-9]$ ]] || { echo "up.sh: N must be 1..9, got $n" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
name=${LLMT_CLUSTER_NAME:-llmt}
node=${LLMT_CLUSTER_HOST:-node}
subnet=${LLMT_CLUSTER_SUBNET:-10.213.0}
dir=${LLMT_CLUSTER_DIR:-/tmp/$name-cluster}
[[ $name =~ ^[a-z]{1,8}$ ]] || { echo "up.sh: LLMT_CLUSTER_NAME must be 1-8 lower-case letters" >&2; exit 2; }
slots=${LLMT_CLUSTER_SLOTS:-2}

skip() { echo "up.sh: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces, sshd on the test addresses)"
command -v ip > /dev/null || skip "no 'ip' command (iproute2)"
command -v unshare > /dev/null && command -v nsenter > /dev/null || skip "no unshare/nsenter (util-linux)"
[ -x /usr/sbin/sshd ] || skip "no /usr/sbin/sshd (apt-get install openssh-server)"
ip netns add "$name-probe" 2> /dev/null || skip "'ip netns add' is not permitted here"
ip netns del "$name-probe"

LLMT_CLUSTER_NAME=$name LLMT_CLUSTER_DIR=$dir "$here/down.sh" > /dev/null 2>&1 || true  # a clean start, whatever an earlier run left
mkdir -p "$dir" /run/sshd
chmod 700 "$dir"
ssh-keygen -q -t ed25519 -N "" -C llmt-cluster -f "$dir/key"
cp "$dir/key.pub" "$dir/authorized_keys"

ip link add "$name-br0" type bridge
ip addr add "$subnet.1/24" dev "$name-br0"
ip link set "$name-br0" up
# the bridge forwards between the hosts even where the machine's firewall drops bridged traffic
[ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 0 > /proc/sys/net/bridge/bridge-nf-call-iptables

: > "$dir/hostfile"
: > "$dir/hosts"  # name address namespace, one line per host (for the other harness scripts)
for k in $(seq "$n"); do
  ns=$name-node$k addr=$subnet.$((10 + k))
  ip netns add "$ns"
  ip link add "$name-v$k" type veth peer name "$name-n$k"
  ip link set "$name-v$k" master "$name-br0" up
  ip link set "$name-n$k" netns "$ns"
  ip -n "$ns" link set "$name-n$k" name eth0
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  echo "$addr $node$k  # $name-cluster" >> /etc/hosts

  mkdir -p "$dir/$node$k"
  ssh-keygen -q -t ed25519 -N "" -f "$dir/$node$k/host_key"
  cat > "$dir/$node$k/sshd_config" << EOF
ListenAddress $addr
HostKey $dir/$node$k/host_key
PidFile $dir/$node$k/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100
MaxSessions 100
EOF
  # the sshd, and so every process started over ssh on this host, sees hostname nodeK
  ip netns exec "$ns" unshare --uts sh -c "hostname $node$k && exec /usr/sbin/sshd -f '$dir/$node$k/sshd_config'"
  echo "$node$k slots=$slots" >> "$dir/hostfile"
  echo "$node$k $addr $ns" >> "$dir/hosts"
done

cat > "$dir/ssh" << EOF
#!/bin/sh
exec ssh -i "$dir/key" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
  -o BatchMode=yes -o ConnectTimeout=10 "\$@"
EOF
chmod +x "$dir/ssh"
# Open MPI: launch over the harness's ssh, and keep its own traffic on the test subnet (the remote
# daemons cannot reach mpirun through the machine's other interfaces)
cat > "$dir/env.sh" << EOF
export LLMT_CLUSTER_DIR=$dir LLMT_CLUSTER_NAME=$name
export OMPI_MCA_plm_rsh_agent=$dir/ssh
export OMPI_MCA_oob_tcp_if_include=$subnet.0/24
export OMPI_MCA_btl_tcp_if_include=$subnet.0/24
export OMPI_MCA_btl=self,vader,tcp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF

# every host answers over ssh with its own name
for k in $(seq "$n"); do
  for _ in $(seq 50); do
    got=$("$dir/ssh" "$node$k" hostname 2> /dev/null || true)
    [ "$got" = "$node$k" ] && break
    sleep 0.1
  done
  [ "$got" = "$node$k" ] || { echo "up.sh: $node$k does not answer over ssh (got '$got')" >&2; exit 1; }
done
echo "up.sh: $n hosts up (${node}1..$node$n on $subnet.0/24, $slots slots each); . $dir/env.sh, then mpirun -hostfile $dir/hostfile"
