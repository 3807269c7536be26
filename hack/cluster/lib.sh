# Shared settings of up.sh / down.sh (sourced). Every setting can be overridden from the
# environment, so tests run a private cluster next to a developer's playground.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Named network namespace holding every process of the cluster (and its pods).
NETNS="${KVGATE_CLUSTER_NETNS:-kvgate-dev}"
[[ "$NETNS" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || { echo "cluster: bad namespace name '$NETNS'" >&2; exit 1; }
# State: certificates, kubeconfigs, etcd data, logs, pid files, pod working directories.
STATE="${KVGATE_CLUSTER_DIR:-$repo/.cache/cluster}"
# Number of KWOK nodes (kwok-node-0 .. N-1, podCIDR 10.244.<i>.0/24).
NODES="${KVGATE_CLUSTER_NODES:-2}"
# Start the pod runner (`kvgate podrunner`) with the cluster: 1 or 0.
PODRUNNER="${KVGATE_CLUSTER_PODRUNNER:-1}"
# The kvgate command the pod runner uses (and runs pods with).
KVGATE="${KVGATE_BIN:-}"
if [ -z "$KVGATE" ]; then
  if [ -x "$repo/.venv/bin/kvgate" ]; then KVGATE="$repo/.venv/bin/kvgate"; else KVGATE="$(command -v kvgate || true)"; fi
fi
POD_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
# The "host" address inside the namespace: apiserver advertise address and the nodes' InternalIP.
HOST_IP=10.245.0.1
API_PORT=6443
# Components in start order; down.sh stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok podrunner)

die() { echo "cluster: $*" >&2; exit 1; }
log() { echo "cluster: $*" >&2; }
