{{/* The admission webhook's names and labels (webhook-*.yaml). */}}
{{- define "gpuzombie.webhook.name" -}}
{{- printf "%s-webhook" (include "gpuzombie.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuzombie.webhook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuzombie.name" . }}-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gpuzombie.webhook.labels" -}}
{{ include "gpuzombie.webhook.selectorLabels" . }}
app.kubernetes.io/component: admission-webhook
app.kubernetes.io/part-of: gpuzombie
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "gpuzombie.webhook.secretName" -}}
{{- if .Values.webhook.certManager.enabled -}}
{{- printf "%s-tls" (include "gpuzombie.webhook.name" .) -}}
{{- else -}}
{{- required "webhook.secretName (a kubernetes.io/tls Secret) is required when webhook.certManager.enabled is false" .Values.webhook.secretName -}}
{{- end -}}
{{- end -}}

{{/* Namespaces never mutated: kube-system, the release's, and webhook.skipNamespaces. */}}
{{- define "gpuzombie.webhook.skipped" -}}
{{- concat (list "kube-system" .Release.Namespace) .Values.webhook.skipNamespaces | uniq | join "," -}}
{{- end -}}
