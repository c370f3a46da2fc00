{{/* The fence's names and labels (fence.yaml). */}}
{{- define "gpuzombie.fence.name" -}}
{{- printf "%s-fence" (include "gpuzombie.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuzombie.fence.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuzombie.name" . }}-fence
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuzombie.fence.labels" -}}
{{ include "gpuzombie.fence.selectorLabels" . }}
app.kubernetes.io/component: fence
app.kubernetes.io/part-of: gpuzombie
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}
