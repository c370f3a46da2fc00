{{/* The NRI plugin's names and labels (nri-daemonset.yaml). */}}
{{- define "gpuzombie.nri.name" -}}
{{- printf "%s-nri" (include "gpuzombie.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuzombie.nri.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuzombie.name" . }}-nri
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuzombie.nri.labels" -}}
{{ include "gpuzombie.nri.selectorLabels" . }}
app.kubernetes.io/component: nri-plugin
app.kubernetes.io/part-of: gpuzombie
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}
