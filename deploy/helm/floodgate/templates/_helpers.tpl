{{/* The name of every object: the release name, unless it already says floodgate. */}}
{{- define "floodgate.fullname" -}}
{{- if contains "floodgate" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-floodgate" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "floodgate.labels" -}}
app.kubernetes.io/name: floodgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "floodgate.selector" -}}
app.kubernetes.io/name: floodgate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: server
{{- end -}}

{{/* Whether the replicas share a Redis. */}}
{{- define "floodgate.redis" -}}
{{- if or .Values.redis.url .Values.redis.clusterUrls .Values.redis.sentinelUrls -}}true{{- end -}}
{{- end -}}

{{- define "floodgate.tokensSecret" -}}
{{- .Values.admin.existingSecret | default (printf "%s-admin-tokens" (include "floodgate.fullname" .)) -}}
{{- end -}}
