#!/usr/bin/env bash
# Stop the single-node cluster started by tests/slurm/start_cluster.sh: slurmd, slurmctld, munged,
# each by the pid in its pid file. Packages, configuration and the munge key stay, so the next
# start_cluster.sh is quick. Safe to run when nothing is running.
set -uo pipefail

RUN=/run/noisymlt-slurm

stop() {  # stop NAME PIDFILE: TERM, wait up to 10 s, then KILL
    local name="$1" pidfile="$2" pid
    [ -s "$pidfile" ] || return 0
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        echo "[stop_cluster] stopping $name ($pid)" >&2
        kill -TERM "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$pidfile"
}

stop slurmd "$RUN/slurmd.pid"
stop slurmctld "$RUN/slurmctld.pid"
stop munged /run/munge/munged.pid
exit 0
