#!/usr/bin/env bash
# Start an OpenSSH server on localhost for the DVC SSH-remote test (tests/test_dvc.py), run as root.
#
# Installs Debian's openssh-server when sshd is missing (unless NOISYMLT_SSHD_NO_INSTALL=1), then, in its own
# folder (NOISYMLT_SSHD_DIR, default /run/noisymlt-sshd): a host key, a client key pair, and an sshd_config that
# listens on 127.0.0.1 only (NOISYMLT_SSHD_PORT, default 2222), lets in only this user with only that client
# key (no password, no PAM), and serves SFTP. Starts sshd, waits until `ssh` logs in with the key while checking
# the host key against the folder's known_hosts, and writes remote.json there: host, port, user, keyfile,
# known_hosts, what the test needs to connect.
#
# Idempotent: a server that already lets the key in is left alone; keys are made once. Stop it with
# tests/ssh/stop_sshd.sh. Environment: SSHD_START_TIMEOUT (seconds to wait for a login, default 30).
set -euo pipefail
# shellcheck source=../daemons.sh
source "$(dirname "$0")/../daemons.sh"

DIR="${NOISYMLT_SSHD_DIR:-/run/noisymlt-sshd}"
PORT="${NOISYMLT_SSHD_PORT:-2222}"
TIMEOUT="${SSHD_START_TIMEOUT:-30}"
HOST=127.0.0.1
LOGIN="$(id -un)"

log() { echo "[start_sshd] $*" >&2; }

[ "$(id -u)" -eq 0 ] || { log "must run as root (installs packages, starts sshd)"; exit 1; }

alive() { [ -s "$DIR/sshd.pid" ] && kill -0 "$(cat "$DIR/sshd.pid")" 2>/dev/null; }
# A login as the test makes it: only this key, and the host key must be the one in known_hosts.
login() {
    ssh -F /dev/null -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=yes \
        -o UserKnownHostsFile="$DIR/known_hosts" -o ConnectTimeout=5 -i "$DIR/client_ed25519" -p "$PORT" \
        "$LOGIN@$HOST" true 2>"$DIR/login.err"
}

if alive && [ -s "$DIR/remote.json" ] && login; then
    log "sshd already up on $HOST:$PORT (pid $(cat "$DIR/sshd.pid"))"
    exit 0
fi

# --- packages -------------------------------------------------------------------------------
if [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
    if [ "${NOISYMLT_SSHD_NO_INSTALL:-0}" = 1 ]; then
        log "openssh-server is not installed (and NOISYMLT_SSHD_NO_INSTALL=1)"
        exit 1
    fi
    log "installing openssh-server"
    apt_install openssh-server openssh-client  # Debian's own sshd on port 22 is not started
fi

# --- keys and configuration -----------------------------------------------------------------
if alive; then  # ours, but not letting the key in (another port, a changed folder): start afresh
    log "restarting sshd (pid $(cat "$DIR/sshd.pid"))"
    bash "$(dirname "$0")/stop_sshd.sh"
fi
mkdir -p "$DIR"
chmod 700 "$DIR"
[ -s "$DIR/host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C noisymlt-test-host -f "$DIR/host_ed25519_key"
[ -s "$DIR/client_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C noisymlt-test-client -f "$DIR/client_ed25519"
# restrict: no forwarding, no terminal; commands and SFTP (what DVC uses) still work
echo "restrict $(cat "$DIR/client_ed25519.pub")" >"$DIR/authorized_keys"
chmod 600 "$DIR/authorized_keys"
hostkey="$(cut -d' ' -f1,2 "$DIR/host_ed25519_key.pub")"
printf '[%s]:%s %s\n[localhost]:%s %s\n' "$HOST" "$PORT" "$hostkey" "$PORT" "$hostkey" >"$DIR/known_hosts"

cat >"$DIR/sshd_config" <<CONF
# written by noisymlt tests/ssh/start_sshd.sh: localhost only, one user, one key
Port $PORT
ListenAddress $HOST
HostKey $DIR/host_ed25519_key
PidFile $DIR/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
AllowUsers $LOGIN
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
UsePAM no
Subsystem sftp internal-sftp
LogLevel VERBOSE
CONF

mkdir -p /run/sshd  # sshd's privilege-separation directory (Debian's service creates it)
chmod 755 /run/sshd
/usr/sbin/sshd -t -f "$DIR/sshd_config" || { log "sshd refuses $DIR/sshd_config"; exit 1; }

# --- start ----------------------------------------------------------------------------------
log "starting sshd on $HOST:$PORT"
rm -f "$DIR/remote.json"
: >"$DIR/sshd.log"
/usr/sbin/sshd -f "$DIR/sshd_config" -E "$DIR/sshd.log" || { log "sshd did not start:"; cat "$DIR/sshd.log" >&2; exit 1; }

started=$SECONDS
deadline=$((SECONDS + TIMEOUT))
until login; do
    # sshd forks before it binds: a port in use shows as a daemon that wrote no pid file and left
    if ! alive && [ $((SECONDS - started)) -ge 2 ]; then
        log "sshd exited:"
        cat "$DIR/sshd.log" >&2
        exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
        log "no login on $HOST:$PORT after ${TIMEOUT}s:"
        cat "$DIR/login.err" >&2 || true
        tail -n 20 "$DIR/sshd.log" >&2 || true
        bash "$(dirname "$0")/stop_sshd.sh"  # a server the test cannot use should not stay up
        exit 1
    fi
    sleep 0.5
done

cat >"$DIR/remote.json" <<JSON
{"host": "$HOST", "port": $PORT, "user": "$LOGIN", "keyfile": "$DIR/client_ed25519",
 "known_hosts": "$DIR/known_hosts", "pid_file": "$DIR/sshd.pid"}
JSON
log "sshd up on $HOST:$PORT (pid $(cat "$DIR/sshd.pid")); connection details in $DIR/remote.json"
