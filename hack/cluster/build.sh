#!/usr/bin/env bash
# Builds (or reuses) the local Kubernetes control plane: one multi-call binary `kvgate-cluster`
# (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl from k8s.io/kubernetes at
# K8S_VERSION) plus KWOK, into a cache directory outside the repo keyed by the versions and a
# hash of the Go sources, so repeated runs and CI on the same machine reuse it.
#
#   bash hack/cluster/build.sh              build if needed; prints the bin directory last
#   bash hack/cluster/build.sh --print-bindir   print the bin directory, build nothing
#
# Environment: KVGATE_CLUSTER_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/cluster),
# KVGATE_CLUSTER_BUILD_PARALLEL (go build -p, default 2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${KVGATE_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgate/cluster}"
src_hash="$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-12)"
key="${K8S_VERSION}-kwok-${KWOK_VERSION}-${src_hash}"
dest="$cache_root/$key"
bindir="$dest/bin"
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl)

if [ "${1:-}" = "--print-bindir" ]; then
  echo "$bindir"
  exit 0
fi

if [ -f "$dest/.complete" ]; then
  echo "cluster-build: reusing $bindir" >&2
  echo "$bindir"
  exit 0
fi

command -v go >/dev/null || { echo "cluster-build: Go is not installed (need go >= $(awk '$1=="go"{print $2}' "$here/go.mod"))" >&2; exit 1; }
mkdir -p "$bindir"
exec 9>"$dest/.lock"
flock 9
if [ -f "$dest/.complete" ]; then  # another build finished while we waited
  echo "$bindir"
  exit 0
fi

par="${KVGATE_CLUSTER_BUILD_PARALLEL:-2}"
start=$(date +%s)
pkg=k8s.io/component-base/version
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
ldflags="-s -w -X $pkg.gitVersion=${K8S_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION}"
echo "cluster-build: building control plane ${K8S_VERSION} into $bindir (go build -p $par)" >&2
(cd "$here" && CGO_ENABLED=0 go build -p "$par" -trimpath -ldflags "$ldflags" \
  -o "$bindir/kvgate-cluster.tmp" .)
mv "$bindir/kvgate-cluster.tmp" "$bindir/kvgate-cluster"
for c in "${components[@]}"; do ln -sfn kvgate-cluster "$bindir/$c"; done
mid=$(date +%s)
echo "cluster-build: control plane built in $((mid - start)) s; building kwok ${KWOK_VERSION}" >&2
(cd "$dest" && CGO_ENABLED=0 GOBIN="$bindir" GOFLAGS=-mod=mod go install -p "$par" -trimpath \
  -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}")
"$bindir/kvgate-cluster" version >/dev/null
end=$(date +%s)
echo "cluster-build: kwok built in $((end - mid)) s; total $((end - start)) s" >&2
printf 'k8s=%s kwok=%s built=%s seconds=%s\n' "$K8S_VERSION" "$KWOK_VERSION" "$(date -u +%FT%TZ)" "$((end - start))" > "$dest/.complete"
echo "$bindir"
