#!/usr/bin/env bash
# Stop the sshd started by tests/ssh/start_sshd.sh, by the pid in its pid file. The keys and the package stay,
# so the next start_sshd.sh is quick. Safe to run when nothing is running.
set -uo pipefail
# shellcheck source=../daemons.sh
source "$(dirname "$0")/../daemons.sh"

DIR="${NOISYMLT_SSHD_DIR:-/run/noisymlt-sshd}"
pidfile="$DIR/sshd.pid"

stop_pid sshd "$pidfile"
rm -f "$pidfile" "$DIR/remote.json"
exit 0
