#!/usr/bin/env bash
# Runs kvgate's e2e suite (tests/e2e) against a kind cluster, for users who have Docker.
#
# NOT run on kvgate's CI: our CI machines have no Docker engine. There the same suite runs on
# the control plane built from Go modules (hack/cluster, `make test-e2e`). This script is the
# way to check kvgate on real kubelets and real containers.
#
# What it does:
#  1. creates a kind cluster `kvgate-e2e` (pod subnet 10.244.0.0/16, one node), unless it exists;
#  2. builds an image `kvgate:e2e` from this checkout (Python + kvgate + redis-server), and tags
#     it also as the vLLM image the tests deploy ($KVGATE_E2E_VLLM_IMAGE), with a `vllm` shim
#     that runs `kvgate sim serve` — there is no GPU, so engines are simulated as on our CI;
#  3. loads both into kind, routes the pod subnet to the kind node (Linux; needs root), so the
#     tests reach pods by their IPs as they do in the network-namespace cluster;
#  4. runs `pytest tests/e2e -m e2e` with KVGATE_E2E_KUBECONFIG pointing at the kind cluster.
# `KVGATE_KIND_KEEP=1` keeps the cluster afterwards; otherwise it is deleted.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER="${KVGATE_KIND_CLUSTER:-kvgate-e2e}"
IMAGE="${KVGATE_E2E_IMAGE:-kvgate:e2e}"
VLLM_IMAGE="${KVGATE_E2E_VLLM_IMAGE:-vllm/vllm-openai:kvgate-sim}"
PY="${PY:-.venv/bin/python}"

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is required (this target is for machines with Docker)" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: the Docker engine is not reachable" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
kubeconfig="$work/kubeconfig"

if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  cat > "$work/kind.yaml" <<KIND
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  podSubnet: 10.244.0.0/16
  serviceSubnet: 10.96.0.0/16
nodes:
- role: control-plane
KIND
  kind create cluster --name "$CLUSTER" --config "$work/kind.yaml" --wait 120s
fi
kind get kubeconfig --name "$CLUSTER" > "$kubeconfig"

# The image: kvgate from this checkout, redis-server, and the `vllm serve` shim.
cat > "$work/vllm" <<'SHIM'
#!/bin/sh
# vLLM stand-in for kvgate's e2e tests: `vllm serve ARGS` -> `kvgate sim serve ARGS`.
[ "$1" = serve ] && shift
exec kvgate sim serve "$@"
SHIM
cat > "$work/Dockerfile" <<'DOCKER'
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/*
COPY src /src/kvgate/src
COPY pyproject.toml README.md /src/kvgate/
# One image for every component of the e2e suite: operator, router, indexer and the vLLM shim.
RUN pip install --no-cache-dir '/src/kvgate[router,operator,sim]'
COPY vllm /usr/local/bin/vllm
RUN chmod +x /usr/local/bin/vllm
ENTRYPOINT ["kvgate"]
DOCKER
mkdir -p "$work/ctx"
cp -r src pyproject.toml README.md "$work/vllm" "$work/ctx/"
docker build -t "$IMAGE" -f "$work/Dockerfile" "$work/ctx"
# vLLM images start `vllm serve` themselves; ours must too.
printf 'FROM %s\nENTRYPOINT ["vllm", "serve"]\n' "$IMAGE" | docker build -t "$VLLM_IMAGE" -
kind load docker-image --name "$CLUSTER" "$IMAGE" "$VLLM_IMAGE"

# Reach pod IPs from this machine through the node container (Linux, root).
node_ip="$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$CLUSTER-control-plane")"
if [ "$(uname -s)" = Linux ] && [ "$(id -u)" = 0 ]; then
  ip route replace 10.244.0.0/16 via "$node_ip"
else
  echo "kind-e2e: cannot route 10.244.0.0/16 via $node_ip (needs Linux and root); tests that reach pods by IP will fail" >&2
fi

status=0
KVGATE_E2E_KUBECONFIG="$kubeconfig" KVGATE_E2E_IMAGE="$IMAGE" KVGATE_E2E_VLLM_IMAGE="$VLLM_IMAGE" \
  "$PY" -m pytest tests/e2e -m e2e -q "$@" || status=$?

if [ "$(uname -s)" = Linux ] && [ "$(id -u)" = 0 ]; then ip route del 10.244.0.0/16 via "$node_ip" || true; fi
if [ -z "${KVGATE_KIND_KEEP:-}" ]; then kind delete cluster --name "$CLUSTER"; fi
exit "$status"
