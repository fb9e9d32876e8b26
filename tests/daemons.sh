# Shell functions shared by the scripts that start and stop the test suite's local services
# (tests/slurm/*_cluster.sh, tests/ssh/*_sshd.sh). Source it; run as root.

# apt_install PKG...: install Debian packages without letting apt start their daemons (no systemd here; the
# scripts start their own, on their own ports).
apt_install() {
    local own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        own_policy=1
    fi
    local status=0
    DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
        || status=$?
    [ "$own_policy" -eq 1 ] && rm -f /usr/sbin/policy-rc.d
    return "$status"
}

# stop_pid NAME PIDFILE: TERM the process in PIDFILE, wait up to 10 s, then KILL; remove the pid file.
stop_pid() {
    local name="$1" pidfile="$2" pid
    [ -s "$pidfile" ] || return 0
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        echo "[stop] stopping $name ($pid)" >&2
        kill -TERM "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    fi
    rm -f "$pidfile"
}
