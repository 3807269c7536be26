#!/usr/bin/env bash
# Stops the local cluster started by up.sh: every component (reverse start order, SIGTERM then
# SIGKILL after 10 s), every process left in its network namespace (pod processes), the
# namespace itself; removes etcd data, keys, kubeconfigs and pod volumes (logs are kept in
# $STATE/logs and $STATE/pods/*/logs).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

stop_pid() {  # stop_pid NAME PID: TERM, wait up to 10 s, KILL
  local name="$1" pid="$2" i
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    # Exited but not yet reaped by its parent (init, for our setsid'd components).
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = Z ] && return 0
    sleep 0.1
  done
  log "$name (pid $pid) ignored SIGTERM for 10 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
  name="${COMPONENTS[$i]}"
  pidfile="$STATE/run/$name.pid"
  [ -f "$pidfile" ] || continue
  stop_pid "$name" "$(cat "$pidfile")"
  rm -f "$pidfile"
done

# Pod processes and pod network namespaces live outside $NETNS; the pod runner stops them, and
# leaves pid files behind only if it was killed.
for pidfile in "$STATE"/pods/*/logs/*.pid "$STATE"/pods/*/sandbox.pid; do
  [ -f "$pidfile" ] || continue
  stop_pid "pod process" "$(cat "$pidfile")"
  rm -f "$pidfile"
done

if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$NETNS"; then
  # Anything still inside the namespace was started by this cluster (pods of a pod runner
  # that died, for instance).
  for pid in $(ip netns pids "$NETNS" 2>/dev/null); do stop_pid "pod process" "$pid"; done
  ip netns delete "$NETNS"
  log "namespace $NETNS deleted"
fi
rm -rf "$STATE/etcd" "$STATE/pki" "$STATE/run" "$STATE"/pods/*/volumes "$STATE"/pods/*/serviceaccount \
  "$STATE/kubeconfig" "$STATE/bin" "/etc/netns/$NETNS"
log "stopped"
