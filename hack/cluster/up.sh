#!/usr/bin/env bash
# Starts a real Kubernetes control plane inside a named network namespace (default kvgate-dev):
# etcd, kube-apiserver (token auth, RBAC, service-account keys, TLS), kube-controller-manager,
# kube-scheduler, KWOK with $NODES fake nodes and the pod runner. The pod runner gives each pod
# a network namespace of its own holding its pod IP (10.244.0.0/16), joined to this one by a
# veth pair; Service IPs (10.96.0.0/16) are local here. Nothing can leave the namespaces.
#
#   sudo make cluster-up
#   sudo ip netns exec kvgate-dev kubectl --kubeconfig .cache/cluster/kubeconfig get nodes
#   sudo make cluster-down
#
# Settings (environment): see lib.sh. Needs root (ip netns), openssl, and the binaries of
# build.sh (built on first use).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib.sh
source "$here/lib.sh"

[ "$(id -u)" = 0 ] || die "must run as root (it creates the network namespace $NETNS)"
command -v ip >/dev/null || die "ip (iproute2) is not installed"
command -v openssl >/dev/null || die "openssl is not installed"
if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$NETNS"; then
  die "network namespace $NETNS exists: a cluster is running (stop it with 'make cluster-down')"
fi
bindir="$(bash "$here/build.sh" | tail -n 1)"
[ -x "$bindir/kvgate-cluster" ] || die "no control plane binaries in $bindir"
if [ "$PODRUNNER" = 1 ] && [ ! -x "$KVGATE" ]; then
  die "kvgate is not installed (run 'make install', or set KVGATE_BIN, or KVGATE_CLUSTER_PODRUNNER=0)"
fi

rm -rf "$STATE/etcd" "$STATE/pki" "$STATE/run" "$STATE/pods"
mkdir -p "$STATE"/{pki,run,logs,etcd,pods}
chmod 700 "$STATE/pki" "$STATE/etcd"
pki="$STATE/pki"
started_ok=0
cleanup_on_failure() {
  if [ "$started_ok" != 1 ]; then
    log "start failed; logs in $STATE/logs; stopping what was started"
    bash "$here/down.sh" || true
  fi
}
trap cleanup_on_failure EXIT

# --- network namespace -------------------------------------------------------------------
ip netns add "$NETNS"
ip -n "$NETNS" link set lo up
# Service ClusterIPs are local addresses (the pod runner's proxy listens on them); each pod gets
# a network namespace of its own from the pod runner, with a /32 route to its veth here, and
# this namespace forwards between pods.
ip -n "$NETNS" route add local "$SERVICE_CIDR" dev lo
ip -n "$NETNS" addr add "$HOST_IP/32" dev lo
ip netns exec "$NETNS" sysctl -qw net.ipv4.ip_forward=1
# `ip netns exec` bind-mounts /etc/netns/<ns>/hosts over /etc/hosts for processes it starts.
mkdir -p "/etc/netns/$NETNS"
printf '127.0.0.1 localhost\n::1 localhost\n' > "/etc/netns/$NETNS/hosts"

# --- keys and certificates ---------------------------------------------------------------
openssl_quiet() { openssl "$@" 2>/dev/null; }
openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key"
openssl_quiet req -x509 -new -key "$pki/ca.key" -subj "/CN=kvgate-cluster-ca" -days 3650 -out "$pki/ca.crt"
openssl_quiet ecparam -name prime256v1 -genkey -noout -out "$pki/apiserver.key"
openssl_quiet req -new -key "$pki/apiserver.key" -subj "/CN=kube-apiserver" -out "$pki/apiserver.csr"
cat > "$pki/apiserver.ext" <<EXT
subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$HOST_IP,IP:10.96.0.1
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
EXT
openssl_quiet x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
  -days 3650 -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt"
openssl_quiet genrsa -out "$pki/sa.key" 2048
openssl_quiet rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"

# Static bearer tokens: token,user,uid,"groups". The built-in RBAC bindings give the
# controller manager and the scheduler exactly their permissions.
token() { openssl rand -hex 16; }
declare -A TOKENS=(
  [admin]="$(token)" [kube-controller-manager]="$(token)" [kube-scheduler]="$(token)"
  [kwok]="$(token)" [podrunner]="$(token)"
)
{
  echo "${TOKENS[admin]},kvgate-admin,uid-admin,\"system:masters\""
  echo "${TOKENS[kube-controller-manager]},system:kube-controller-manager,uid-kcm,"
  echo "${TOKENS[kube-scheduler]},system:kube-scheduler,uid-scheduler,"
  echo "${TOKENS[kwok]},kwok,uid-kwok,\"system:masters\""
  echo "${TOKENS[podrunner]},kvgate-podrunner,uid-podrunner,\"system:masters\""
} > "$pki/tokens.csv"
chmod 600 "$pki/tokens.csv"

write_kubeconfig() {  # write_kubeconfig FILE USER TOKEN
  umask 077
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: kvgate
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 < "$pki/ca.crt")
users:
- name: $2
  user:
    token: $3
contexts:
- name: kvgate
  context: {cluster: kvgate, user: $2, namespace: default}
current-context: kvgate
KC
}
write_kubeconfig "$STATE/kubeconfig" kvgate-admin "${TOKENS[admin]}"
for c in kube-controller-manager kube-scheduler kwok podrunner; do
  write_kubeconfig "$pki/$c.kubeconfig" "$c" "${TOKENS[$c]}"
done

# --- processes ---------------------------------------------------------------------------
start() {  # start NAME COMMAND...: runs in the namespace, in its own session, logs to a file
  local name="$1"; shift
  setsid ip netns exec "$NETNS" "$@" > "$STATE/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE/run/$name.pid"
}
in_ns() { ip netns exec "$NETNS" "$@"; }
wait_for() {  # wait_for WHAT SECONDS COMMAND...
  local what="$1" secs="$2" i; shift 2
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "$what not ready after ${secs}s (see $STATE/logs)"
}
alive() { kill -0 "$(cat "$STATE/run/$1.pid")" 2>/dev/null || die "$1 exited (see $STATE/logs/$1.log)"; }
kubectl_admin() { in_ns "$bindir/kubectl" --kubeconfig "$STATE/kubeconfig" "$@"; }

t0=$(date +%s)
start etcd "$bindir/etcd" --name kvgate --data-dir "$STATE/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster kvgate=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
  --quota-backend-bytes 1073741824 --log-level warn
wait_for etcd 30 in_ns bash -c 'exec 3<>/dev/tcp/127.0.0.1/2379'

start kube-apiserver "$bindir/kube-apiserver" \
  --etcd-servers http://127.0.0.1:2379 \
  --bind-address 0.0.0.0 --secure-port "$API_PORT" --advertise-address "$HOST_IP" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
  --authorization-mode RBAC --anonymous-auth=false \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=true \
  --cert-dir "$pki/apiserver-certs" --profiling=false --event-ttl 30m
wait_for kube-apiserver 120 kubectl_admin get --raw /readyz
alive etcd

start kube-controller-manager "$bindir/kube-controller-manager" \
  --kubeconfig "$pki/kube-controller-manager.kubeconfig" --leader-elect=false \
  --bind-address 127.0.0.1 --secure-port 10257 \
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
  --use-service-account-credentials=true --service-cluster-ip-range "$SERVICE_CIDR" \
  --node-monitor-grace-period 60s --profiling=false
start kube-scheduler "$bindir/kube-scheduler" \
  --kubeconfig "$pki/kube-scheduler.kubeconfig" --leader-elect=false \
  --bind-address 127.0.0.1 --secure-port 10259 --profiling=false
start kwok "$bindir/kwok" --kubeconfig "$pki/kwok.kubeconfig" --config "$here/kwok-stages.yaml" \
  --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --node-ip "$HOST_IP" --cidr "$POD_CIDR" --server-address 127.0.0.1:10247 \
  --node-lease-duration-seconds 40

# --- fake nodes --------------------------------------------------------------------------
nodes_yaml=""
for ((i = 0; i < NODES; i++)); do
  nodes_yaml+="apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: \"0\"}
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-$i, kubernetes.io/os: linux, kubernetes.io/arch: amd64}
spec:
  podCIDR: 10.244.$i.0/24
  podCIDRs: [10.244.$i.0/24]
---
"
done
wait_for "default service account" 60 kubectl_admin get serviceaccount default -n default
printf '%s' "$nodes_yaml" | kubectl_admin apply -f - >/dev/null
wait_for "nodes Ready" 60 kubectl_admin wait --for condition=Ready node --all --timeout 1s
for c in kube-controller-manager kube-scheduler kwok; do alive "$c"; done

if [ "$PODRUNNER" = 1 ]; then
  start podrunner "$KVGATE" podrunner --kubeconfig "$pki/podrunner.kubeconfig" \
    --state-dir "$STATE/pods" --hosts-file "/etc/netns/$NETNS/hosts" --kvgate "$KVGATE" \
    --host-ip "$HOST_IP" --pod-api-server "https://$HOST_IP:$API_PORT"
  sleep 0.5
  alive podrunner
fi

ln -sfn "$bindir" "$STATE/bin"
started_ok=1
log "up in $(( $(date +%s) - t0 )) s: namespace $NETNS, $NODES KWOK node(s), kubeconfig $STATE/kubeconfig"
log "try: ip netns exec $NETNS $bindir/kubectl --kubeconfig $STATE/kubeconfig get nodes"
