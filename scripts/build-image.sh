#!/usr/bin/env bash
# Build the node agent's image (docker/Dockerfile, target node) with podman, tagged as the
# gpuzombie chart's default image: localhost/gpu-zombie/gpuzombie-node:<Chart.yaml appVersion>.
# The Dockerfile's pinned base (python:3.12-slim-bookworm) is used when it can be pulled; where no
# registry is reachable, a Debian bookworm rootfs with python3 made by debootstrap stands in (as
# docker/local-smoke.sh does), imported once as localhost/gz-debian-base:bookworm.
# Usage: scripts/build-image.sh [IMAGE]          build, then the smoke test
#        scripts/build-image.sh --check IMAGE    the smoke test alone
# Env: NODE_BASE (force a base).
set -euo pipefail
cd "$(dirname "$0")/.."
check_only=false
if [ "${1:-}" = "--check" ]; then
  check_only=true
  shift
  [ $# -eq 1 ] || { echo "usage: scripts/build-image.sh --check IMAGE" >&2; exit 2; }
fi
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/gpuzombie/Chart.yaml)
IMAGE=${1:-localhost/gpu-zombie/gpuzombie-node:$version}
PINNED=$(sed -n 's/^ARG NODE_BASE=//p' docker/Dockerfile)
LOCAL_BASE=localhost/gz-debian-base:bookworm
PODMAN=(podman)
[ -x /usr/sbin/runc ] && PODMAN+=(--runtime /usr/sbin/runc)  # crun fails on hybrid cgroups

LIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)  # what this sandbox lets a container keep
# The smoke test: a container of the image starts, and has the two files the webhook's init container
# copies (ADMISSION-CONTRACT.md). Each failure says which: a runtime that cannot start a container is
# the machine's problem, not the image's.
smoke() { "${PODMAN[@]}" run --rm --pull never "${LIMITS[@]}" --entrypoint /bin/sh "$IMAGE" -c "$1" 2>&1; }
smoke_test() {
  local out
  out=$(smoke 'exit 0') || { echo "build-image: podman cannot start a container of $IMAGE here: $(echo "$out" | tail -1)" >&2; return 1; }
  out=$(smoke 'test -x /usr/bin/tini-static') || { echo "build-image: $IMAGE lacks an executable /usr/bin/tini-static" >&2; return 1; }
  out=$(smoke 'python3 -S -I /opt/gpuzombie/prestop.pyz --help >/dev/null') \
    || { echo "build-image: $IMAGE: /opt/gpuzombie/prestop.pyz --help fails: $(echo "$out" | tail -1)" >&2; return 1; }
}
if $check_only; then
  smoke_test
  echo "build-image: $IMAGE passes the smoke test" >&2
  exit 0
fi

base=${NODE_BASE:-}
if [ -z "$base" ]; then
  if "${PODMAN[@]}" image exists "$PINNED" || "${PODMAN[@]}" pull -q "$PINNED" >/dev/null 2>&1; then
    base=$PINNED
  else
    base=$LOCAL_BASE
    echo "build-image: $PINNED cannot be pulled; using the local Debian base $LOCAL_BASE" >&2
  fi
fi
if [ "$base" = "$LOCAL_BASE" ] && ! "${PODMAN[@]}" image exists "$LOCAL_BASE"; then
  command -v debootstrap >/dev/null || { echo "build-image: needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates bookworm \
    "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log" \
    || { tail -5 "$work/debootstrap.log" >&2; exit 1; }
  rm -f "$work"/rootfs/usr/lib/python3*/EXTERNALLY-MANAGED
  # debootstrap leaves its .debs (44 MB) and apt's caches behind; an image has no use for them.
  rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/cache/apt/*.bin "$work"/rootfs/var/lib/apt/lists/*
  cp /etc/ssl/certs/ca-certificates.crt "$work/rootfs/etc/ssl/certs/ca-certificates.crt"
  tar -C "$work/rootfs" -c . | "${PODMAN[@]}" import - "$LOCAL_BASE" >/dev/null
fi
go_base=$(sed -n 's/^ARG GO_BASE=//p' docker/Dockerfile)
if ! "${PODMAN[@]}" image exists "$go_base" && ! "${PODMAN[@]}" pull -q "$go_base" >/dev/null 2>&1; then
  # The NRI plugin built here (the cluster's own build: go/nri, cached), copied in by the nri stage.
  echo "build-image: $go_base cannot be pulled; building gpuzombie-nri with this machine's Go" >&2
  python=$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)
  nri=$(PYTHONPATH="$PWD/src" "$python" -m gpuzombie cluster build --nri | tail -n 1) || exit 1
  mkdir -p go/nri/prebuilt && cp "$nri" go/nri/prebuilt/gpuzombie-nri
  trap 'rm -rf go/nri/prebuilt ${work:+"$work"}' EXIT
  go_base=$base
fi
"${PODMAN[@]}" build --network host "${LIMITS[@]}" \
  -f docker/Dockerfile --target node --build-arg NODE_BASE="$base" --build-arg GO_BASE="$go_base" \
  --label org.opencontainers.image.version="$version" --label org.opencontainers.image.base.name="$base" \
  -t "$IMAGE" .
smoke_test || { echo "build-image: $IMAGE was built (podman images $IMAGE); the smoke test above failed" >&2; exit 1; }
echo "built $IMAGE (base $base); push: podman tag $IMAGE REGISTRY/gpu-zombie/gpuzombie-node:$version && podman push ..." >&2
