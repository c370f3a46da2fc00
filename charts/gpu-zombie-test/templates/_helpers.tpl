{{/* Chart name, and the chart label Helm's conventions want. */}}
{{- define "gpu-zombie-test.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-zombie-test.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries; the selector subset must stay stable across upgrades. */}}
{{- define "gpu-zombie-test.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-zombie-test.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpu-zombie-test.labels" -}}
{{ include "gpu-zombie-test.selectorLabels" . }}
app.kubernetes.io/part-of: gpuzombie
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "gpu-zombie-test.chart" . }}
{{- end -}}

{{/* registry/repository:tag<suffix> for one tag of the image (every image shares a repository). */}}
{{- define "gpu-zombie-test.image" -}}
{{- $image := .root.Values.image -}}
{{- printf "%s/%s:%s%s" $image.registry $image.repository .tag $image.tagSuffix -}}
{{- end -}}

{{- define "gpu-zombie-test.placement" -}}
{{- with .runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
One scenario pod, the seed's pod.yaml: (dict "root" $ "key" "<scenarios key>").
The container sets only args, so the image's ENTRYPOINT (tini, or none for nofix) stays PID 1, and the
shell starts the parent as the image's CMD does: in the background under sleep (init: sleep), or in
the foreground before exec'ing sleep so tini inherits the orphans (init: tini).
*/}}
{{- define "gpu-zombie-test.scenarioPod" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $s := index $v.scenarios .key -}}
{{- if $s.enabled }}
{{- if and $s.prestop (ge (int $v.prestop.timeoutSeconds) (int $v.terminationGracePeriodSeconds)) }}
{{- fail "prestop.timeoutSeconds must be below terminationGracePeriodSeconds: the kubelet SIGKILLs when the grace ends" }}
{{- end }}
{{- $parent := printf "python3 -m gpuzombie.workloads.parent --workers %d --size-mib %d" (int $v.workload.workers) (int $v.workload.sizeMib) -}}
{{- if $s.fixedWorker }}{{ $parent = printf "%s --fixed" $parent }}{{ end }}
apiVersion: v1
kind: Pod
metadata:
  name: {{ $s.podName }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "gpu-zombie-test.labels" $root | nindent 4 }}
    app.kubernetes.io/component: scenario
    gpuzombie.dev/scenario: {{ $s.id }}
    {{- /* the label's first domain, kept as an alias for selectors written against it (docs/experiment-chart.md) */}}
    gpuzombie.io/scenario: {{ $s.id }}
spec:
  terminationGracePeriodSeconds: {{ int $v.terminationGracePeriodSeconds }}
  {{- if $s.shareProcessNamespace }}
  shareProcessNamespace: true
  {{- end }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with (include "gpu-zombie-test.placement" $v | trim) }}{{ . | nindent 2 }}{{ end }}
  {{- with $s.runAsUser }}
  securityContext:
    runAsUser: {{ int . }}
    runAsGroup: {{ int . }}
    runAsNonRoot: true
  {{- end }}
  containers:
    - name: worker
      image: {{ include "gpu-zombie-test.image" (dict "root" $root "tag" $s.imageTag) }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      args:
        - sh
        - -c
        - {{ printf "%s%s exec sleep infinity" $parent (eq $s.init "sleep" | ternary " &" ";") | quote }}
      resources:
        {{- with $v.resources.requests }}
        requests:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        limits:
          {{ $v.gpu.resourceName }}: {{ int $v.gpu.count }}
          {{- with $v.resources.limits }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
      {{- if $s.prestop }}
      lifecycle:
        preStop:
          exec:
            command: ["gpuzombie", "prestop", "--timeout", {{ $v.prestop.timeoutSeconds | toString | quote }}]
      {{- end }}
{{- end }}
{{- end -}}
