#!/usr/bin/env bash
# Slurm on the test cluster of tests/cluster/up.sh: munged and slurmctld on this machine (the "login
# node", the bridge address), one slurmd inside each host's network and UTS namespaces, so that
# sbatch/srun/scancel act on the hosts as on real nodes.
#
#   tests/cluster/up.sh 2 && tests/cluster/slurm_up.sh
#   . $LLMT_CLUSTER_DIR/slurm/env.sh   then: sinfo, sbatch -N 2 scripts/slurm/train_srun.sbatch ...
#   tests/cluster/down.sh              stops the daemons too (by their pid files, and the namespaces)
#
# Everything lives under $LLMT_CLUSTER_DIR (default /tmp/$LLMT_CLUSTER_NAME-cluster): munge/ (its own
# key, socket, pid, log: the machine's /etc/munge and /run/munge are left alone), slurm/ (slurm.conf,
# cgroup.conf, state, spool per node, logs, pid files, env.sh). The ports depend on LLMT_CLUSTER_NAME,
# so that two clusters' controllers can run side by side.
# Exit status 77 (ctest's skip) with the reason when Slurm or munge is missing or the cluster is not up.
set -euo pipefail
name=${LLMT_CLUSTER_NAME:-llmt}
subnet=${LLMT_CLUSTER_SUBNET:-10.213.0}
dir=${LLMT_CLUSTER_DIR:-/tmp/$name-cluster}

skip() { echo "slurm_up.sh: skipped: $*"; exit 77; }
for p in slurmctld slurmd munged mungekey munge unmunge sinfo scontrol; do
  command -v $p > /dev/null || PATH=$PATH:/usr/sbin command -v $p > /dev/null ||
    skip "no $p (apt-get install slurm-wlm munge)"
done
export PATH=$PATH:/usr/sbin
[ "$(id -u)" -eq 0 ] || skip "needs root (slurmd inside the hosts' namespaces)"
[ -s "$dir/hosts" ] && [ -f "$dir/env.sh" ] || skip "no cluster at $dir (tests/cluster/up.sh 2 first)"
id munge > /dev/null 2>&1 || skip "no munge user (apt-get install munge)"
while read -r h _ _; do
  [ -f "$dir/$h/sshd.pid" ] && kill -0 "$(cat "$dir/$h/sshd.pid")" 2> /dev/null || skip "host $h of $dir is not up"
done < "$dir/hosts"

m=$dir/munge s=$dir/slurm
# a second run starts afresh: stop what an earlier one started (down.sh does the same)
for pidfile in "$s/slurmctld.pid" "$m/munged.pid" "$s"/slurmd.*.pid; do
  [ ! -f "$pidfile" ] || kill -9 "$(cat "$pidfile")" 2> /dev/null || true
done
rm -rf "$m" "$s"

# ---- munge: the daemon runs as the munge user, which must reach its files; up.sh made $dir 0700
chmod 711 "$dir"
mkdir -p "$m"
mungekey -c -k "$m/munge.key" > /dev/null 2>&1 || mungekey -c -f -k "$m/munge.key"
chown -R munge:munge "$m"
chmod 711 "$m"   # munged insists that everyone may reach its socket's directory
chmod 600 "$m/munge.key"
runuser -u munge -- munged --key-file="$m/munge.key" --socket="$m/munge.socket" --pid-file="$m/munged.pid" \
  --log-file="$m/munged.log" --seed-file="$m/munged.seed"
for _ in $(seq 50); do [ -S "$m/munge.socket" ] && break; sleep 0.1; done
munge -n -S "$m/munge.socket" | unmunge -S "$m/munge.socket" > /dev/null ||
  { echo "slurm_up.sh: munged does not answer on $m/munge.socket" >&2; cat "$m/munged.log" >&2; exit 1; }

# ---- slurm.conf: one partition of every host, 2 CPUs each
# ports from the cluster name: the default cluster and a second one differ (6820..7817, even/odd)
sum=$(printf '%s' "$name" | cksum | cut -d' ' -f1)
ctld_port=$((6820 + 2 * (sum % 499))) slurmd_port=$((6821 + 2 * (sum % 499)))
mkdir -p "$s/state" "$s/log"
nodes=""
while read -r h addr _; do
  mkdir -p "$s/spool/$h" "$s/tmp/$h"
  nodes+="NodeName=$h NodeAddr=$addr CPUs=2 RealMemory=1000 State=UNKNOWN"$'\n'
  list=${list:+$list,}$h
done < "$dir/hosts"
cat > "$s/slurm.conf" << EOF
# made by tests/cluster/slurm_up.sh for the test cluster $name
ClusterName=$name
# the controller's own hostname, with the bridge address the hosts reach it at
SlurmctldHost=$(hostname)($subnet.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a job step credential's lifetime, and also how long a requeued job waits before it
# starts again (slurm.conf(5); default 120 s). The wait is what keeps a requeued job from starting on
# a node that still holds its old, revoked credential ("Job credential revoked"): shorten it, never
# skip it (scontrol update StartTime=now on a requeued job did that and failed such launches)
AuthInfo=socket=$m/munge.socket,cred_expire=20
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/spool/%n
# the hosts share this machine's /tmp: PMIx's per-step directories there would collide between hosts
TmpFS=$s/tmp/%n
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/slurmd.%n.pid
SlurmctldLogFile=$s/log/slurmctld.log
SlurmdLogFile=$s/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroup v2, no cpusets here: track processes by their parents, bind nothing
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# jobs start at once and end quickly: tests wait on them
SchedulerType=sched/backfill
SchedulerParameters=defer_batch=0,sched_min_interval=0,batch_sched_delay=0,bf_interval=1
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
# scancel and preemption send SIGTERM, then SIGKILL after KillWait: llmt saves a checkpoint in
# between, which takes several seconds over these hosts' TCP (a SIGKILL mid-save leaves a .tmp- dir)
KillWait=30
WaitTime=0
MinJobAge=600
OverTimeLimit=0
BatchStartTimeout=20
# a job stopped by a time limit or a signal may requeue itself (scontrol requeue)
JobRequeue=1
$nodes
PartitionName=test Nodes=$list Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
# slurmd starts only with the cgroup v1 plugin named (this machine has v1 hierarchies, no v2)
cat > "$s/cgroup.conf" << EOF
CgroupPlugin=cgroup/v1
EOF
cat > "$s/env.sh" << EOF
export SLURM_CONF=$s/slurm.conf
EOF
export SLURM_CONF=$s/slurm.conf

# ---- the daemons: slurmctld here, slurmd in each host's namespaces (it takes its name from -N)
slurmctld -f "$SLURM_CONF" || { echo "slurm_up.sh: slurmctld did not start" >&2; tail "$s/log/slurmctld.log" >&2; exit 1; }
while read -r h _ _; do
  nsenter -t "$(cat "$dir/$h/sshd.pid")" -n -u slurmd -N "$h" -f "$SLURM_CONF" ||
    { echo "slurm_up.sh: slurmd on $h did not start" >&2; tail "$s/log/slurmd.$h.log" >&2; exit 1; }
done < "$dir/hosts"

# every node idle: registered with the controller, nothing running
n=$(wc -l < "$dir/hosts")
for _ in $(seq 150); do
  idle=$(sinfo -h -N -o '%N %T' 2> /dev/null | grep -c ' idle$' || true)
  [ "$idle" -eq "$n" ] && break
  sleep 0.2
done
[ "$idle" -eq "$n" ] || { echo "slurm_up.sh: $idle of $n nodes idle after 30 s" >&2; sinfo -N >&2
                         tail -5 "$s/log/slurmctld.log" "$s"/log/slurmd.*.log >&2; exit 1; }
echo "slurm_up.sh: Slurm up ($list idle, partition test, slurmctld on $subnet.1:$ctld_port); . $s/env.sh, then sbatch ..."
