#!/usr/bin/env bash
# Build the images for real with podman from a local Debian base (no registry needed), start each
# scenario container, observe it from inside, and delete it the kubelet's way (preStop exec for
# S3/S4, then SIGTERM, SIGKILL after the grace period): prints PID 1, zombies, orphans and how long
# the deletion took. CPU stand-in workers (no GPU needed). Root, Debian: apt-get install podman runc
# debootstrap. Usage: docker/local-smoke.sh [GRACE_S (5)] [PRESTOP_TIMEOUT_S (3)]
set -euo pipefail
cd "$(dirname "$0")/.."
GRACE=${1:-5}
PRESTOP_TIMEOUT=${2:-3}
WORK=${GZ_SMOKE_DIR:-/tmp/gz-k8s-smoke}
BASE=localhost/gz-debian-base:bookworm
PODMAN=(podman --runtime /usr/sbin/runc)          # crun fails on hybrid cgroups
LIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)  # what this sandbox lets a container keep
mkdir -p "$WORK"

if ! "${PODMAN[@]}" image exists "$BASE"; then
  # The pinned bases come from Docker Hub; here a Debian rootfs with python3 stands in for both.
  # The host's CA bundle goes in so pip works behind a TLS-inspecting proxy.
  debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates bookworm \
    "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log"
  rm -f "$WORK"/rootfs/usr/lib/python3*/EXTERNALLY-MANAGED
  cp /etc/ssl/certs/ca-certificates.crt "$WORK/rootfs/etc/ssl/certs/ca-certificates.crt"
  tar -C "$WORK/rootfs" -c . | "${PODMAN[@]}" import - "$BASE" >/dev/null
fi

build() {  # build TARGET TAG [extra args...]
  local target=$1 tag=$2; shift 2
  local start=$SECONDS
  "${PODMAN[@]}" build --network host "${LIMITS[@]}" -f docker/Dockerfile --target "$target" \
    --build-arg TORCH_BASE="$BASE" --build-arg NODE_BASE="$BASE" \
    "$@" -t "localhost/gpu-zombie-test:$tag" . >"$WORK/build-$tag.log" 2>&1
  echo "built :$tag in $((SECONDS - start)) s"
}
build nofix nofix
build tini tini
build fullfix fullfix
build nofix nofix-uid1000 --build-arg USER_UID=1000
build node node

summary() {  # summary JSON_FILE -> "zombies orphans"
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; print(s["zombies"], s["orphans"])' "$1"
}

printf '\n%-24s %-8s %-5s %-8s %-8s %-8s %s\n' scenario image pid1 zombies orphans prestop "deleted after (grace ${GRACE} s)"
for row in "s1-nofix nofix no" "s2-tini tini no" "s3-tini-prestop tini yes" "s4-fullfix fullfix yes" \
           "s1-nofix-uid1000 nofix-uid1000 no"; do
  set -- $row
  name=gz-smoke-$1
  "${PODMAN[@]}" rm -f -t 0 "$name" >/dev/null 2>&1 || true
  "${PODMAN[@]}" run -d --name "$name" "${LIMITS[@]}" "localhost/gpu-zombie-test:$2" >/dev/null
  # Wait (bounded) until the worker says ready, then let the parent exit.
  for _ in $(seq 100); do "${PODMAN[@]}" logs "$name" 2>&1 | grep -q '^ready' && break; sleep 0.2; done
  sleep 1
  "${PODMAN[@]}" exec "$name" gpuzombie observe --json >"$WORK/$1-observe.json" || true
  pid1=$("${PODMAN[@]}" exec "$name" cat /proc/1/comm)
  read -r zombies orphans < <(summary "$WORK/$1-observe.json")
  start=$(date +%s.%N)
  if [ "$3" = yes ]; then  # the kubelet runs preStop first; its time counts against the grace
    timeout "$GRACE" "${PODMAN[@]}" exec "$name" gpuzombie prestop --timeout "$PRESTOP_TIMEOUT" \
      >"$WORK/$1-prestop.log" 2>&1 || true
  fi
  left=$(python3 -c "import sys; print(max(0, int(float(sys.argv[1]) - float(sys.argv[2]) + 0.999)))" \
           "$GRACE" "$(python3 -c "import time,sys; print(time.time() - float(sys.argv[1]))" "$start")")
  "${PODMAN[@]}" stop -t "$left" "$name" >/dev/null 2>&1
  took=$(python3 -c "import time,sys; print(f'{time.time() - float(sys.argv[1]):.2f} s')" "$start")
  "${PODMAN[@]}" logs "$name" >"$WORK/$1-container.log" 2>&1 || true
  "${PODMAN[@]}" rm -f -t 0 "$name" >/dev/null
  printf '%-24s %-8s %-5s %-8s %-8s %-8s %s\n' "$1" ":$2" "$pid1" "$zombies" "$orphans" "$3" "$took"
done
echo "logs and observe JSON: $WORK"
