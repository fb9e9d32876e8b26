#!/usr/bin/env bash
# Stop the sshd started by tests/ssh/start_sshd.sh, by the pid in its pid file. The keys and the package stay,
# so the next start_sshd.sh is quick. Safe to run when nothing is running.
set -uo pipefail

DIR="${NOISYMLT_SSHD_DIR:-/run/noisymlt-sshd}"
pidfile="$DIR/sshd.pid"

[ -s "$pidfile" ] || exit 0
pid="$(cat "$pidfile")"
if kill -0 "$pid" 2>/dev/null; then
    echo "[stop_sshd] stopping sshd ($pid)" >&2
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
fi
rm -f "$pidfile" "$DIR/remote.json"
exit 0
