{{/* Names, labels and shared snippets of the kvgate chart. */}}

{{- define "kvgate.name" -}}
{{- default "kvgate" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every object name: the release name, or "<release>-kvgate". */}}
{{- define "kvgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "kvgate.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: (dict "ctx" $ "component" "operator"). */}}
{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvgate.name" .ctx }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end }}

{{/* The recommended labels (DESIGN.md §4) plus the chart's: (dict "ctx" $ "component" "..."). */}}
{{- define "kvgate.labels" -}}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/managed-by: kvgate
app.kubernetes.io/part-of: kvgate
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The kvgate image reference (digest wins over tag; tag defaults to appVersion). */}}
{{- define "kvgate.image" -}}
{{- $img := .Values.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "kvgate.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "kvgate.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvgate.redis.fullname" -}}
{{- printf "%s-redis" (include "kvgate.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Redis URL every kvgate component of this release uses. */}}
{{- define "kvgate.redis.url" -}}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s.%s.svc:%d/0" (include "kvgate.redis.fullname" .) .Release.Namespace (int .Values.redis.port) }}
{{- else }}
{{- required "redis.external.url is required when redis.enabled is false" .Values.redis.external.url }}
{{- end }}
{{- end }}

{{/* The external Redis's CA bundle volume source ({secret: ...} / {configMap: ...}), or "". */}}
{{- define "kvgate.redis.caVolumeSource" -}}
{{- $tls := .Values.redis.external.tls }}
{{- if and (not .Values.redis.enabled) $tls.caSecret }}
secret: {secretName: {{ $tls.caSecret | quote }}}
{{- else if and (not .Values.redis.enabled) $tls.caConfigMap }}
configMap: {name: {{ $tls.caConfigMap | quote }}}
{{- end }}
{{- end }}

{{/* The Secret holding the Redis password, or "" when there is none. */}}
{{- define "kvgate.redis.secretName" -}}
{{- if .Values.redis.enabled }}
{{- if .Values.redis.auth.enabled }}
{{- default (include "kvgate.redis.fullname" .) .Values.redis.auth.existingSecret }}
{{- end }}
{{- else }}
{{- .Values.redis.external.existingSecret }}
{{- end }}
{{- end }}

{{- define "kvgate.redis.secretKey" -}}
{{- if .Values.redis.enabled }}
{{- .Values.redis.auth.secretKey }}
{{- else }}
{{- .Values.redis.external.secretKey }}
{{- end }}
{{- end }}

{{/* Pod scheduling fields shared by every workload: pass the component's values. */}}
{{- define "kvgate.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "kvgate.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "string" . }}{{ . | quote }}{{ else }}{{ .name | quote }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
