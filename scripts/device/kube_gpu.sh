#!/usr/bin/env bash
# The seed's experiment on a real Kubernetes node with the GPU (issue 37): the cluster of
# `gpuzombie cluster` (kube-apiserver, etcd, scheduler, controller manager, kubelet of Kubernetes
# v1.37.2, built from their Go modules) on the GPU machine, containerd 2.4.2 as its runtime (CDI
# needs containerd >= 1.7), NVIDIA's device plugin v0.17.4 (built from its Go module, cgo; go-nvml
# loads the machine's libnvidia-ml) advertising nvidia.com/gpu, each pod's GPU handed out by the
# kubelet through CDI (nvidia-container-toolkit v1.20.2's nvidia-cdi-hook; nvidia-ctk's own spec is
# generated beside it), and the scenarios as real Pods deleted through the API server.
#
#   here, once:    scripts/device/kube_gpu.sh prepare
#                  builds or takes from the caches: the kube multi-call binary, containerd 2, the
#                  device plugin and the toolkit (go/nvidia-*: nvidia-ctk, nvidia-cdi-hook and
#                  nvidia-container-runtime.cdi), the NRI plugin, the .debs (runc, catatonit, tini,
#                  busybox-static for `ip`, the CNI plugins), the wheels the GPU machine lacks, helm
#                  and the chart's node image; xz-compressed into .kube-gpu/1, 2, 3 and 4 (each under
#                  what one call carries beside the working tree: 64 MiB in all).
#   GPU machine:   scripts/device/kube_gpu.sh unpack N        (carry .kube-gpu/N), N = 1, 2, 3, 4:
#                  calls back to back (a machine stays warm 30 s; /tmp keeps what the earlier ones
#                  unpacked)
#                  scripts/device/kube_gpu.sh up              cluster, CDI, device plugin, RuntimeClass
#                                                             nvidia (NVIDIA's runtime, CDI mode); Ready
#                  scripts/device/kube_gpu.sh scenarios       S1-S5 x REPEAT on the real kubelet
#                  scripts/device/kube_gpu.sh variant         S1 with 10 workers, once
#                  scripts/device/kube_gpu.sh nri             S1 under the NRI plugin, no webhook
#                  scripts/device/kube_gpu.sh fixes           pod-nofix vs the webhook's fix, trace,
#                  exporter --once and top --once on that node
#                  scripts/device/kube_gpu.sh chart           helm install (exporter DaemonSet, webhook),
#                  pod-nofix through the registered webhook, the handover gate with a stale holder
#                  (scripts/device/kube_chart_gpu.py)
#                  scripts/device/kube_gpu.sh down
#                  The cluster and the device plugin run in sessions of their own, so they outlive
#                  one call and serve the next; `down` ends them.
# Dry run without a GPU (no device plugin: the CPU stand-in): DEVICE=cpu GRACE=5 SIZE_MIB=64 REPEAT=1
# scripts/device/kube_gpu.sh up && ... scenarios (`up` then skips the plugin and says so).
set -uo pipefail
cd "$(dirname "$0")/../.."
ACTION=${1:-}
OUT=${OUT:-/tmp/kube-gpu-out}
GZK=${GZK:-/tmp/gzk}
REPEAT=${REPEAT:-3}
GRACE=${GRACE:-30}
DEVICE=${DEVICE:-cuda}
SIZE_MIB=${SIZE_MIB:-2048}
BUDGET_S=${BUDGET_S:-500}
CARRY=.kube-gpu
DEBS=(runc catatonit tini busybox-static containernetworking-plugins)
WHEELS=(cryptography cffi pycparser container-runtime-interface-api==2.0.1 jsonpatch jsonpointer ruamel.yaml)

log() { echo "== $(date -u +%H:%M:%S) $*"; }
xz_to() { xz -T2 -6 -c "$1" >"$2" || return 2; }

prepare() {
  local python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  local work=/tmp/kube-gpu-prepare
  rm -rf "$CARRY" "$work" && mkdir -p "$CARRY/1" "$CARRY/2" "$CARRY/3" "$CARRY/4" "$work/debs" "$work/wheels" || return 2
  local kube containerd nri helm image
  kube=$("$python" -m gpuzombie cluster build 2>/dev/null | tail -n 1) || return 2
  containerd=$("$python" -m gpuzombie cluster build --containerd2 2>/dev/null | tail -n 1) || return 2
  [ -x "$kube" ] && [ -x "$containerd/containerd" ] || { echo "cluster build printed no binary: $kube $containerd" >&2; return 2; }
  nri=$("$python" -m gpuzombie cluster build --nri 2>/dev/null | tail -n 1) || return 2
  local nvbin=$work/nvidia
  mkdir -p "$nvbin"
  (cd go/nvidia-device-plugin && go build -trimpath -ldflags "-s -w" -o "$nvbin/" \
    github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin) || return 2
  (cd go/nvidia-container-toolkit && go build -trimpath -ldflags "-s -w" -o "$nvbin/" \
    github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk \
    github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook \
    github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.cdi) || return 2
  (cd "$work/debs" && apt-get download "${DEBS[@]}" 2>/dev/null >/dev/null) || return 2
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$work/wheels" "${WHEELS[@]}" || return 2
  helm=$(scripts/get-helm.sh) || return 2
  image=$("$python" -c 'from gpuzombie.cluster.images import node_image_archive as a; n, p = a(lambda m: None); print(p)') ||
    return 2
  # A call carries 64 MiB with the working tree, counted in 4 KiB blocks (32.4 MiB on 2026-12-06):
  # four parts of at most 31.5 MiB. 1: the kube binary, the shim, tini, catatonit; 2: containerd, ctr,
  # the device plugin, the toolkit, busybox, the small wheels; 3: the CNI plugins, cryptography, helm,
  # runc; 4: the node image and the NRI plugin (`chart` and `nri` only).
  xz -T2 -9e -c "$kube" >"$CARRY/1/kube.xz" || return 2
  xz_to "$containerd/containerd-shim-runc-v2" "$CARRY/1/containerd-shim-runc-v2.xz" || return 2
  cp "$work"/debs/tini_*.deb "$work"/debs/catatonit_*.deb "$CARRY/1/" || return 2
  for b in containerd ctr; do xz_to "$containerd/$b" "$CARRY/2/$b.xz" || return 2; done
  for b in nvidia-device-plugin nvidia-ctk nvidia-cdi-hook nvidia-container-runtime.cdi; do
    xz_to "$nvbin/$b" "$CARRY/2/$b.xz" || return 2
  done
  cp "$work"/debs/busybox-static_*.deb "$CARRY/2/" && mv "$work"/wheels/cryptography-*.whl "$work/debs/" &&
    cp "$work"/wheels/*.whl "$CARRY/2/" || return 2
  cp "$work"/debs/containernetworking-plugins_*.deb "$work"/debs/runc_*.deb "$work"/debs/cryptography-*.whl "$CARRY/3/" ||
    return 2
  xz_to "$helm" "$CARRY/3/helm.xz" || return 2
  xz_to "$image" "$CARRY/4/node-image.tar.xz" && xz_to "$nri" "$CARRY/4/gpuzombie-nri.xz" || return 2
  du -sm "$CARRY"/1 "$CARRY"/2 "$CARRY"/3 "$CARRY"/4
}

unpack() {
  local part=$1
  [ -d "$CARRY/$part" ] || { echo "no $CARRY/$part: carry it (prepare makes it here)" >&2; return 2; }
  mkdir -p "$GZK/bin" "$GZK/containerd" "$GZK/site" "$GZK/root"
  for f in "$CARRY/$part"/*.xz; do
    [ -e "$f" ] || continue
    local name dir=$GZK/bin
    name=$(basename "$f" .xz)
    case $name in containerd | containerd-shim-runc-v2 | ctr) dir=$GZK/containerd ;; *.tar) dir=$GZK ;; esac
    # python's lzma: the GPU machine may have no xz
    python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
      "$f" "$dir/$name" || return 2
  done
  chmod +x "$GZK"/bin/* "$GZK"/containerd/* 2>/dev/null
  for deb in "$CARRY/$part"/*.deb; do [ -e "$deb" ] && { dpkg -x "$deb" "$GZK/root" || return 2; }; done
  if ls "$CARRY/$part"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$GZK/site" \
      "$CARRY/$part"/*.whl || return 2
  fi
  ls -la "$GZK/bin" "$GZK/containerd"
  du -sh "$GZK"
}

environment() {
  export GPUZOMBIE_CLUSTER_DIR=${GPUZOMBIE_CLUSTER_DIR:-$GZK/cluster}
  export GPUZOMBIE_CLUSTER_RUNTIME=containerd2
  export GPUZOMBIE_KUBE_BINARY=$GZK/bin/kube
  export GPUZOMBIE_CONTAINERD_BINARIES=$GZK/containerd
  # NVIDIA's runtime in CDI mode as the handler `nvidia` (RuntimeClass nvidia), as the GPU Operator
  # sets a node up: how the chart's exporter (NVIDIA_VISIBLE_DEVICES=all) and a gated pod's gate get NVML
  [ -x "$GZK/bin/nvidia-container-runtime.cdi" ] && export GPUZOMBIE_NVIDIA_RUNTIME=$GZK/bin/nvidia-container-runtime.cdi
  [ -x "$GZK/bin/kube" ] && [ -x "$GZK/containerd/containerd" ] && [ -x "$GZK/root/usr/sbin/runc" ] ||
    { echo "unpack 1, 2 and 3 first" >&2; return 2; }
  ln -sf "$GZK/root/bin/busybox" "$GZK/bin/ip"  # busybox's ip makes the bridge (the machine has no iproute2)
  ln -sf "$GZK/root/usr/sbin/runc" "$GZK/bin/runc"
  # containerd on PATH beside the unpacked CNI plugins: the cluster finds them at <prefix>/lib/cni
  ln -sf "$GZK/containerd/containerd" "$GZK/root/usr/bin/containerd"
  export PATH="$GZK/bin:$GZK/root/usr/bin:$GZK/root/usr/sbin:$GZK/root/bin:$PATH"
  export PYTHONPATH="$PWD/src:$GZK/site${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  mkdir -p "$OUT"
}

gz() { python3 -m gpuzombie "$@"; }
kubectl() { gz cluster kubectl -- "$@"; }
layout_path() { python3 -c "from gpuzombie.cluster.layout import Layout; print(getattr(Layout.from_env(), '$1'))"; }

machine() {
  date -u +"run at %Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.used,memory.total --format=csv 2>&1
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, torch.cuda.is_available())' 2>&1
  uname -r; nproc
  "$GZK/containerd/containerd" --version; runc --version | head -n 1
}

up() {
  environment || return 2
  { machine; } 2>&1 | tee "$OUT/machine.txt"
  local t0=$SECONDS
  if gz cluster status --json 2>/dev/null | python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["up"] else 1)'; then
    log "the cluster is up already (an earlier call's): using it" | tee "$OUT/up.log"
  else
    log "cluster up (containerd 2.4.2)" | tee "$OUT/up.log"
    gz cluster up 2>&1 | tee -a "$OUT/up.log"
    [ "${PIPESTATUS[0]}" = 0 ] || { gz cluster status 2>&1 | tail -n 20; return 1; }
    log "cluster up took $((SECONDS - t0)) s" | tee -a "$OUT/up.log"
  fi
  local kubelet_root cdi
  kubelet_root=$(layout_path kubelet_root) cdi=$(layout_path cdi_specs)
  if [ "$DEVICE" != cuda ]; then
    log "DEVICE=$DEVICE: no device plugin (the CPU stand-in)" | tee -a "$OUT/up.log"
    return 0
  fi
  # The plugin's socket path is fixed (/var/lib/kubelet/device-plugins/); the kubelet's root is the
  # cluster's. And the plugin writes its CDI spec to /var/run/cdi, where containerd reads the cluster's.
  mkdir -p /var/lib/kubelet /var/run
  ln -sfn "$kubelet_root/device-plugins" /var/lib/kubelet/device-plugins
  [ -e /var/run/cdi ] && [ ! -L /var/run/cdi ] && { echo "/var/run/cdi exists: not replaced" >&2; return 2; }
  ln -sfn "$cdi" /var/run/cdi
  log "nvidia-ctk cdi generate" | tee -a "$OUT/up.log"
  nvidia-ctk cdi generate --output="$cdi/nvidia-ctk.yaml" --nvidia-cdi-hook-path="$GZK/bin/nvidia-cdi-hook" \
    >"$OUT/nvidia-ctk.log" 2>&1
  echo "nvidia-ctk rc=$? ; nvidia-ctk cdi list:" | tee -a "$OUT/up.log"
  nvidia-ctk cdi list --spec-dir="$cdi" 2>&1 | tee -a "$OUT/up.log"
  # STRATEGY=cdi (the default): the kubelet passes the plugin's CDI device names to containerd, which
  # applies the plugin's spec; STRATEGY=specs: the plugin returns the /dev/nvidia* device specs
  # instead (no CDI; the driver's libraries come from the host's /usr the lab's pods mount).
  local strategy=(--device-list-strategy=cdi-cri)
  [ "${STRATEGY:-cdi}" = specs ] && strategy=(--device-list-strategy=envvar --pass-device-specs=true)
  if [ -n "${GPUZOMBIE_NVIDIA_RUNTIME:-}" ]; then
    printf '%s\n' 'apiVersion: node.k8s.io/v1' 'kind: RuntimeClass' 'metadata: {name: nvidia}' 'handler: nvidia' |
      kubectl apply -f - 2>&1 | tee -a "$OUT/up.log"
  fi
  log "NVIDIA device plugin (${strategy[*]})" | tee -a "$OUT/up.log"
  [ -f "$GZK/device-plugin.pid" ] && kill "$(cat "$GZK/device-plugin.pid")" 2>/dev/null  # an earlier call's
  # On the host, not in its DaemonSet's container: the driver's root is / on both sides.
  setsid nvidia-device-plugin "${strategy[@]}" --driver-root=/ --driver-root-ctr-path=/ --nvidia-cdi-hook-path="$GZK/bin/nvidia-cdi-hook" \
    --fail-on-init-error=true >"$OUT/device-plugin.log" 2>&1 </dev/null &
  echo $! >"$GZK/device-plugin.pid"
  local gpus=""
  for _ in $(seq 1 "${PLUGIN_WAIT_S:-40}"); do
    gpus=$(kubectl get nodes -o jsonpath='{.items[0].status.allocatable.nvidia\.com/gpu}' 2>/dev/null)
    [ -n "$gpus" ] && [ "$gpus" != 0 ] && break
    sleep 1
  done
  log "node allocatable nvidia.com/gpu: ${gpus:-none} ($((SECONDS - t0)) s since up began)" | tee -a "$OUT/up.log"
  ls -la "$cdi" | tee -a "$OUT/up.log"
  tail -n 30 "$OUT/device-plugin.log"
  [ -n "$gpus" ] && [ "$gpus" != 0 ]
}

scenarios() {
  environment || return 2
  local results=$GZK/results-kubernetes
  rm -rf "$results"
  log "lab run --runtime kubernetes --repeat $REPEAT --grace $GRACE --device $DEVICE" | tee "$OUT/scenarios.log"
  local t0=$SECONDS
  timeout -s TERM -k 60 "$BUDGET_S" python3 -m gpuzombie lab run --scenario all --runtime kubernetes \
    --repeat "$REPEAT" --grace "$GRACE" --device "$DEVICE" --size-mib "$SIZE_MIB" --out "$results" \
    2>&1 | tee -a "$OUT/scenarios.log" | grep -v '^ ' | tail -n 40
  local rc=${PIPESTATUS[0]}
  log "rc=$rc took=$((SECONDS - t0))s" | tee -a "$OUT/scenarios.log"
  [ -d "$results" ] && tar -C "$GZK" -czf "$OUT/kubernetes.tgz" results-kubernetes
  cp "$results/memory-timeline.png" "$OUT/timeline-kubernetes.png" 2>/dev/null
  return "$rc"
}

nri() {  # S1 with the NRI plugin (go/nri, issue 39) and no webhook: containerd puts it under tini
  environment || return 2
  local sock tini=$GZK/opt-nri/gpuzombie/tini-static
  sock=$(layout_path nri_socket)
  mkdir -p "$(dirname "$tini")"
  log "gpuzombie-nri on $sock; S1 x ${NRI_REPEAT:-2}" | tee "$OUT/nri.log"
  setsid gpuzombie-nri --socket "$sock" --tini "$tini" --install-tini "$GZK/root/usr/bin/tini-static" \
    >"$OUT/nri-plugin.log" 2>&1 </dev/null &
  echo $! >"$GZK/nri.pid"
  sleep 2
  timeout -s TERM -k 30 240 python3 -m gpuzombie lab run --scenario s1-nofix --runtime kubernetes \
    --repeat "${NRI_REPEAT:-2}" --grace "$GRACE" --device "$DEVICE" --size-mib "$SIZE_MIB" --out "$GZK/results-nri" \
    2>&1 | tee -a "$OUT/nri.log" | grep -v '^ ' | tail -n 12
  local rc=${PIPESTATUS[0]}
  kill "$(cat "$GZK/nri.pid")" 2>/dev/null
  [ -d "$GZK/results-nri" ] && tar -C "$GZK" -czf "$OUT/kubernetes-nri.tgz" results-nri
  return "$rc"
}

variant() {  # the 10-worker variant of S1, once
  environment || return 2
  log "the 10-worker variant of S1, once" | tee "$OUT/variant.log"
  timeout -s TERM -k 30 200 python3 -m gpuzombie lab run --scenario s1-nofix --runtime kubernetes --workers 10 \
    --grace "$GRACE" --device "$DEVICE" --size-mib "$SIZE_MIB" --out "$GZK/results-kubernetes-10" \
    2>&1 | tee -a "$OUT/variant.log" | grep -v '^ ' | tail -n 12
  local rc=${PIPESTATUS[0]}
  [ -d "$GZK/results-kubernetes-10" ] && tar -C "$GZK" -czf "$OUT/kubernetes-10.tgz" results-kubernetes-10
  return "$rc"
}

fixes() {
  environment || return 2
  local log=$OUT/fixes.log
  log "pod-nofix on the real kubelet, then the webhook's fix of it" | tee "$log"
  timeout 150 python3 -m gpuzombie lab pod deploy/pod-nofix.yaml --runtime kubernetes --grace "$GRACE" \
    --out "$GZK/labpod" 2>&1 | tee -a "$log" | tail -n 15
  python3 -m gpuzombie webhook --patch deploy/pod-nofix.yaml 2>>"$log" \
    | timeout 150 python3 -m gpuzombie lab pod - --runtime kubernetes --grace "$GRACE" --out "$GZK/labpod" \
      2>&1 | tee -a "$log" | tail -n 15
  log "a GPU pod left running: trace, exporter --once, top --once" | tee -a "$log"
  local socket pr py
  socket=$(layout_path containerd_socket) pr=$(layout_path pod_resources_socket)
  py=$(python3 -c 'import sys; print(sys.executable)')
  # the interpreter's own prefixes and torch's directory, where they are not under /usr or /opt
  local extra_mounts="" extra_volumes="" i=0 d
  for d in $(python3 -c 'import sys, os, importlib.util as u; s = u.find_spec("torch"); print(*{p for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(s.origin)) if s else "/usr") if not p.startswith(("/usr", "/opt"))})'); do
    extra_mounts="$extra_mounts, {name: py$i, mountPath: $d, readOnly: true}"
    extra_volumes="$extra_volumes
    - {name: py$i, hostPath: {path: $d}}"
    i=$((i + 1))
  done
  local hold="x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda')" limits="{limits: {nvidia.com/gpu: 1}}"
  [ "$DEVICE" = cuda ] || { hold="x = bytearray(64 << 20)"; limits="{}"; }  # the dry run: no GPU
  kubectl apply -f - <<EOF 2>&1 | tee -a "$log"
apiVersion: v1
kind: Pod
metadata: {name: holder, namespace: default}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: train
      image: localhost/gpuzombie/busybox:static
      imagePullPolicy: Never
      command: ["$py", "-c", "import torch, time; $hold; print('holding', flush=True); time.sleep(600)"]
      env: [{name: LD_LIBRARY_PATH, value: /usr/local/nvidia/lib64}]
      resources: $limits
      volumeMounts: [{name: usr, mountPath: /usr, readOnly: true}, {name: lib, mountPath: /lib, readOnly: true}, {name: lib64, mountPath: /lib64, readOnly: true}, {name: opt, mountPath: /opt, readOnly: true}$extra_mounts]
  volumes:
    - {name: usr, hostPath: {path: /usr}}
    - {name: lib, hostPath: {path: /lib}}
    - {name: lib64, hostPath: {path: /lib64}}
    - {name: opt, hostPath: {path: /opt}}$extra_volumes
EOF
  kubectl wait --for=condition=Ready pod/holder --timeout=90s 2>&1 | tee -a "$log"
  sleep 8
  kubectl describe pod holder >"$OUT/holder-describe.txt" 2>&1
  kubectl logs holder >"$OUT/holder.log" 2>&1
  gz trace --cri-socket "$socket" --pod-resources-socket "$pr" >"$OUT/trace.txt" 2>&1
  echo "trace rc=$?" | tee -a "$log"
  gz exporter --once --cri-socket "$socket" --pod-resources-socket "$pr" >"$OUT/exporter.prom" 2>&1
  echo "exporter rc=$?" | tee -a "$log"
  grep -E '^gpuzombie_(gpu_memory_used_by_pod|pod_gpu)' "$OUT/exporter.prom" | head -n 5 | tee -a "$log"
  gz top --once --cri-socket "$socket" --pod-resources-socket "$pr" >"$OUT/top.txt" 2>&1
  echo "top rc=$?" | tee -a "$log"
  kubectl delete pod holder --wait=true --timeout=60s 2>&1 | tee -a "$log"
  tar -C "$GZK" -czf "$OUT/labpod.tgz" labpod 2>/dev/null
  cat "$OUT/trace.txt" | head -n 20
}

chart() {  # helm install of the chart (exporter under RuntimeClass nvidia, the webhook), pod-nofix
  # through the registered webhook, the handover with a stale holder (scripts/device/kube_chart_gpu.py)
  environment || return 2
  local image=$GZK/node-image.tar  # the GPU machine cannot build it (no PyPI there): part 4 carries it
  [ -f "$image" ] || { echo "no $image: unpack 4 first (carry .kube-gpu/4)" >&2; return 2; }
  log "importing the node image ($image)" | tee "$OUT/chart.log"
  "$GZK/containerd/ctr" --address "$(layout_path containerd_socket)" --namespace k8s.io images import "$image" 2>&1 |
    tail -n 2 | tee -a "$OUT/chart.log"
  timeout -s TERM -k 30 "$BUDGET_S" python3 scripts/device/kube_chart_gpu.py "$OUT/chart" 2>&1 | tee -a "$OUT/chart.log"
  local rc=${PIPESTATUS[0]}
  helm uninstall gpuzombie -n gpuzombie --kubeconfig "$(layout_path root)/admin.kubeconfig" --wait --timeout 90s \
    >>"$OUT/chart.log" 2>&1
  return "$rc"
}

down() {
  environment || return 2
  [ -f "$GZK/device-plugin.pid" ] && kill "$(cat "$GZK/device-plugin.pid")" 2>/dev/null
  gz cluster down 2>&1 | tail -n 5
  for link in /var/lib/kubelet/device-plugins /var/run/cdi; do [ -L "$link" ] && rm "$link"; done  # up's links only
  echo "left: $(pgrep -fc 'containerd|kubelet|kube-apiserver|etcd|nvidia-device-plugin' || true) processes"
}

case $ACTION in
  prepare) prepare ;;
  unpack) unpack "${2:?unpack 1, 2, 3 or 4}" ;;
  up) up ;;
  scenarios) scenarios ;;
  variant) variant ;;
  nri) nri ;;
  fixes) fixes ;;
  chart) chart ;;
  down) down ;;
  *) echo "usage: $0 prepare | unpack 1|2|3|4 | up | scenarios | variant | nri | fixes | chart | down" >&2; exit 2 ;;
esac
