#!/usr/bin/env bash
# Build the pinned helm for the chart tests from Helm's own source and print its path. The chart needs
# no particular helm (any helm 3.8+ or 4 renders it; docs/cluster.md): this one is what the tests run.
# Source: the Go module helm.sh/helm/v4 at the release tag, as the Helm maintainers publish it (the
# module path is theirs, served by the Go module proxy and checked against the checksum database,
# sum.golang.org), pinned here by version and go.sum hash, built the way Helm's Makefile builds a
# release (CGO off, -trimpath, -s -w, the version stamped). Every dependency is checked against the
# module's own go.sum. Why not get.helm.sh, Debian, PyPI or npm: docs/cluster.md, "Where helm comes from".
# Usage: scripts/get-helm.sh            -> prints e.g. ~/.cache/gpuzombie/helm-v4.3.2/helm
# Env: GPUZOMBIE_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/gpuzombie); GPUZOMBIE_HELM=/path/to/helm
# uses that helm instead (printed after it answers `helm version`), unpinned.
set -euo pipefail
HELM_MODULE=helm.sh/helm/v4
HELM_VERSION=v4.3.2
# The go.sum lines of the module (sum.golang.org has the same): its source zip and its go.mod.
HELM_MODULE_SUM=h1:zdd8DgKTlLrlYIzdoAntDHLH0V3RkgNIpQ3yjzuD84M=
HELM_GOMOD_SUM=h1:BJQR7djmSuM0wKBYqrU+UQAoaLagLPF8MaZ5cIiYv4k=
CACHE=${GPUZOMBIE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuzombie}
HELM=$CACHE/helm-$HELM_VERSION/helm

if [ -n "${GPUZOMBIE_HELM:-}" ]; then
  "$GPUZOMBIE_HELM" version >/dev/null || { echo "get-helm.sh: GPUZOMBIE_HELM=$GPUZOMBIE_HELM does not run" >&2; exit 1; }
  echo "$GPUZOMBIE_HELM"
  exit 0
fi
# The cache holds the binary and the SHA-256 it had when built: a changed file is built again.
if [ -x "$HELM" ] && [ -f "$HELM.sha256" ] && sha256sum --check --status "$HELM.sha256"; then
  echo "$HELM"
  exit 0
fi
command -v go >/dev/null || {
  echo "get-helm.sh: building helm $HELM_VERSION needs Go 1.26 or newer (or GPUZOMBIE_HELM=/path/to/your/helm)" >&2
  exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Download (or find in the module cache) the pinned source and compare its hashes to the pins: a
# proxy or cache serving other bytes for this version stops here, before anything is built.
got=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "$HELM_MODULE@$HELM_VERSION")
sum=$(python3 -c 'import json, sys; d = json.loads(sys.stdin.read()); print(d.get("Sum", ""), d.get("GoModSum", ""), d.get("Error", ""))' <<<"$got")
if [ "$sum" != "$HELM_MODULE_SUM $HELM_GOMOD_SUM " ]; then
  echo "get-helm.sh: $HELM_MODULE@$HELM_VERSION does not match its pinned go.sum hashes ($sum)" >&2
  exit 1
fi
echo "get-helm.sh: building helm $HELM_VERSION from $HELM_MODULE (a few minutes cold; cached in $CACHE)" >&2
ldflags="-w -s -X $HELM_MODULE/internal/version.version=$HELM_VERSION"
ldflags+=" -X $HELM_MODULE/internal/version.metadata= -X $HELM_MODULE/internal/version.gitTreeState=clean"
# go install of a version: the module's own go.mod and go.sum, no replace of ours, -mod=readonly.
(cd "$work" && GOBIN="$work/bin" CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
  go install -trimpath -ldflags "$ldflags" "$HELM_MODULE/cmd/helm@$HELM_VERSION")
"$work/bin/helm" version --template '{{.Version}}' | grep -qx "$HELM_VERSION" \
  || { echo "get-helm.sh: the built helm does not report $HELM_VERSION" >&2; exit 1; }
mkdir -p "$(dirname "$HELM")"
install -m 0755 "$work/bin/helm" "$HELM.tmp.$$"
mv "$HELM.tmp.$$" "$HELM"
sha256sum "$HELM" >"$HELM.sha256"
echo "$HELM"
