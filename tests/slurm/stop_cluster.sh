#!/usr/bin/env bash
# Stop the single-node cluster started by tests/slurm/start_cluster.sh: slurmd, slurmctld, munged,
# each by the pid in its pid file. Packages, configuration and the munge key stay, so the next
# start_cluster.sh is quick. Safe to run when nothing is running.
set -uo pipefail
# shellcheck source=../daemons.sh
source "$(dirname "$0")/../daemons.sh"

RUN=/run/noisymlt-slurm

stop_pid slurmd "$RUN/slurmd.pid"
stop_pid slurmctld "$RUN/slurmctld.pid"
stop_pid munged /run/munge/munged.pid
exit 0
