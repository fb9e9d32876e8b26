#!/usr/bin/env bash
# Start a single-node SLURM cluster on this machine, for tests/test_profile_slurm.py (run as root).
#
# Installs Debian's slurm-wlm + munge when missing, writes /etc/slurm/slurm.conf for one node
# (this host: its CPUs and memory, one default partition, no accounting, no cgroups, so it also
# works inside containers and VMs without systemd), creates the munge key, starts munged,
# slurmctld and slurmd, and waits until `sinfo` shows the node idle.
#
# The node declares 4 fake GPUs (GRES gpu:4 over character devices /dev/noisymlt-fakegpu[0-3], made with
# mknod as copies of /dev/null), so that `sbatch --gpus=N` gets CUDA_VISIBLE_DEVICES from slurmd as on a GPU
# node (tests/test_profile_slurm.py, packed runs); where mknod is refused the node has no GRES and those tests skip.
#
# Idempotent: a cluster that already answers is left alone; daemons already running (per their
# pid files) are not started twice. Stop it with tests/slurm/stop_cluster.sh.
# Environment: SLURM_START_TIMEOUT (seconds to wait for an idle node, default 90).
set -euo pipefail
# shellcheck source=../daemons.sh
source "$(dirname "$0")/../daemons.sh"

CONF=/etc/slurm/slurm.conf
MARK="# written by noisymlt tests/slurm/start_cluster.sh"
RUN=/run/noisymlt-slurm                 # pid files
SPOOL=/var/spool/noisymlt-slurm         # controller state and slurmd spool
LOGS=/var/log/noisymlt-slurm
TIMEOUT="${SLURM_START_TIMEOUT:-90}"
HOST="$(hostname -s)"

log() { echo "[start_cluster] $*" >&2; }

[ "$(id -u)" -eq 0 ] || { log "must run as root (installs packages, starts daemons)"; exit 1; }

node_state() { sinfo --noheader --nodes="$HOST" --format=%t 2>/dev/null | head -n1 || true; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# (sinfo takes ~10 s to give up on a stopped controller, so ask it only when the daemons run.)
if alive "$RUN/slurmctld.pid" && alive "$RUN/slurmd.pid" && [ "$(node_state)" = idle ]; then
    log "cluster already up: node $HOST idle"
    exit 0
fi

# --- packages -------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
    || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge"
    apt_install slurm-wlm munge  # apt starts no daemon: this script starts them
fi

# --- configuration --------------------------------------------------------------------------
if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    log "$CONF exists and was not written by this script; refusing to overwrite it"
    exit 1
fi
mkdir -p /etc/slurm "$RUN" "$SPOOL/ctld" "$SPOOL/d" "$LOGS"
# srun and slurmd look the node up by name; a fresh machine may not resolve its own name.
if ! getent hosts "$HOST" >/dev/null; then
    log "adding '127.0.0.1 $HOST' to /etc/hosts"
    echo "127.0.0.1 $HOST" >>/etc/hosts
fi

# CPUs, topology and RealMemory exactly as slurmd detects them, so the node is not drained for
# a mismatch; the name is forced to the short host name that slurmd will register under.
hw="$(slurmd -C | sed -n 1p | tr ' ' '\n' \
    | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore|RealMemory)=' | tr '\n' ' ')"
case "$hw" in *CPUs=*RealMemory=*) ;; *) log "could not read the hardware from 'slurmd -C'"; exit 1 ;; esac

# Fake GPUs: slurmd only needs a device file per card to hand them out and set CUDA_VISIBLE_DEVICES.
gres=""
gres_types=""
if (for i in 0 1 2 3; do [ -c /dev/noisymlt-fakegpu$i ] || mknod /dev/noisymlt-fakegpu$i c 1 3 2>/dev/null || exit 1; done); then
    echo "NodeName=$HOST Name=gpu File=/dev/noisymlt-fakegpu[0-3]" >/etc/slurm/gres.conf
    gres="Gres=gpu:4 "
    gres_types="GresTypes=gpu"
else
    log "mknod refused: the node gets no fake GPUs (tests of packed GPU jobs will skip)"
    rm -f /etc/slurm/gres.conf
fi

cat >"$CONF.tmp" <<EOF
$MARK
ClusterName=noisymlt-test
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
$gres_types
ReturnToService=2
# No cgroups, no accounting: works in containers; the executor then polls with squeue.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Finished jobs stay visible to squeue this long (the executor needs >= 3x its poll interval).
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$HOST NodeAddr=127.0.0.1 ${hw}${gres}State=UNKNOWN
PartitionName=main Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
mv "$CONF.tmp" "$CONF"
log "wrote $CONF (node $HOST: $hw)"

# --- munge ----------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge /etc/munge/munge.key
chmod 700 /etc/munge
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
chmod 755 /run/munge

if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    for _ in $(seq 50); do
        munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.2
    done
    munge -n </dev/null | unmunge >/dev/null || { log "munged does not answer"; exit 1; }
fi

# --- slurm daemons --------------------------------------------------------------------------
if alive "$RUN/slurmctld.pid"; then
    log "slurmctld running; re-reading configuration"
    scontrol reconfigure || true
else
    log "starting slurmctld"
    slurmctld
fi
if ! alive "$RUN/slurmd.pid"; then
    log "starting slurmd"
    slurmd
fi

deadline=$((SECONDS + TIMEOUT))
state=""
while [ $SECONDS -lt $deadline ]; do
    state="$(node_state)"
    case "$state" in
        idle) log "node $HOST idle after ${SECONDS}s"; sinfo; exit 0 ;;
        down* | drain* | inval*) scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
done
log "node $HOST not idle after ${TIMEOUT}s (state: '${state:-no answer}'); logs in $LOGS"
tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
exit 1
