{{/* The chart's name, and the release-scoped name of every object. */}}
{{- define "gpuzombie.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuzombie.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpuzombie.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuzombie.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuzombie.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuzombie.labels" -}}
{{ include "gpuzombie.selectorLabels" . }}
app.kubernetes.io/component: node-agent
app.kubernetes.io/part-of: gpuzombie
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "gpuzombie.image" -}}
{{- $i := .Values.image -}}
{{- printf "%s/%s:%s" $i.registry $i.repository (default .Chart.AppVersion $i.tag) | trimPrefix "/" -}}
{{- end -}}

{{- define "gpuzombie.scheme" -}}
{{- ternary "HTTPS" "HTTP" .Values.exporter.tls.enabled -}}
{{- end -}}

{{/*
The scrape's relabeling, the same for the ServiceMonitor and the PodMonitor: `node` from the pod's
node; the operator's own namespace/pod/container/service/endpoint target labels dropped, so the
exporter's namespace, pod and container labels (the workload's, not the agent's) stay as they are.
*/}}
{{- define "gpuzombie.relabelings" -}}
honorLabels: true
relabelings:
  - sourceLabels: [__meta_kubernetes_pod_node_name]
    targetLabel: node
    action: replace
  - regex: (namespace|pod|container|service|endpoint)
    action: labeldrop
{{- end -}}

{{- define "gpuzombie.tlsConfig" -}}
{{- if .Values.exporter.tls.enabled }}
scheme: https
{{- with .Values.exporter.tls.scrapeTlsConfig }}
tlsConfig:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}


{{/* The CRI socket: exporter.cri.socket when set, else the default socket of exporter.cri.runtime
(crictl's endpoints; gpuzombie.k8s.names.DEFAULT_SOCKETS). */}}
{{- define "gpuzombie.criSocket" -}}
{{- $cri := .Values.exporter.cri -}}
{{- $sockets := dict "containerd" "/run/containerd/containerd.sock" "crio" "/run/crio/crio.sock" "docker" "/var/run/cri-dockerd.sock" -}}
{{- $cri.socket | default (get $sockets $cri.runtime) -}}
{{- end -}}

{{- /* k, a resource name, is a device plugin's GPU (podspec's list of GPU resources). */ -}}
{{- define "gpuzombie.gpuResourceName" -}}
(k == 'nvidia.com/gpu' || k == 'nvidia.com/gpu.shared' || k == 'amd.com/gpu' || k.startsWith('nvidia.com/mig-'))
{{- end -}}

{{- /* The pod asks for a GPU: in any container (init ones too) through a device plugin or a DRA claim,
or through a KAI fraction. The API server calls the webhook, or runs the policy, only for these
(matchConditions): both must see every pod their code would fix. */ -}}
{{- define "gpuzombie.gpuPodCondition" -}}
((has(object.spec.initContainers) ? object.spec.initContainers : []) + object.spec.containers).exists(c,
has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, {{ include "gpuzombie.gpuResourceName" . }})) ||
(has(c.resources.requests) && c.resources.requests.exists(k, {{ include "gpuzombie.gpuResourceName" . }})) ||
(has(c.resources.claims) && c.resources.claims.size() > 0))) ||
(has(object.metadata.annotations) && ('gpu-fraction' in object.metadata.annotations || 'gpu-memory' in object.metadata.annotations))
{{- end -}}

{{/* Where the node DaemonSets (the exporter, the NRI plugin) run: GPU nodes (gpuNodesOnly), the
selector and affinity given, the GPU taints tolerated. */}}
{{- define "gpuzombie.nodePlacement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if or .Values.gpuNodesOnly .Values.affinity }}
affinity:
  {{- if .Values.gpuNodesOnly }}
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - key: {{ .Values.gpuNodeLabel.key }}
              operator: In
              values: [{{ .Values.gpuNodeLabel.value | quote }}]
  {{- end }}
  {{- with .Values.affinity }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
