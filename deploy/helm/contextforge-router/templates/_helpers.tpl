{{/* Names and labels shared by every manifest of the release. */}}
{{- define "cfr.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cfr.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cfr.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cfr.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end -}}

{{- define "cfr.labels" -}}
{{ include "cfr.labelsWithoutComponent" . }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end -}}

{{/* The release's labels less the component, for manifests of another component (the Redis). */}}
{{- define "cfr.labelsWithoutComponent" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "cfr.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: contextforge-router
{{- end -}}

{{- define "cfr.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cfr.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "cfr.poolName" -}}
{{- default (include "cfr.fullname" .) .Values.inferencePool.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cfr.redisName" -}}
{{- printf "%s-redis" (include "cfr.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* "true" when the chart deploys its own Redis: state.redis.enabled, and no external Redis named. */}}
{{- define "cfr.chartRedis" -}}
{{- if and .Values.state.redis.enabled (not .Values.state.redisUrl) (not .Values.state.redisUrlSecret.name) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the chart's Redis requires a password: always, unless state.redis.auth.enabled is false. */}}
{{- define "cfr.redisAuth" -}}
{{- $auth := .Values.state.redis.auth | default dict -}}
{{- if and (include "cfr.chartRedis" .) (not (and (kindIs "bool" $auth.enabled) (not $auth.enabled))) -}}
true
{{- end -}}
{{- end -}}

{{/* The Secret holding the password of the chart's Redis, and its key: the user's, else the one the chart generates. */}}
{{- define "cfr.redisAuthSecretName" -}}
{{- default (include "cfr.redisName" .) .Values.state.redis.auth.existingSecret -}}
{{- end -}}

{{- define "cfr.redisAuthSecretKey" -}}
{{- if .Values.state.redis.auth.existingSecret -}}
{{- required "state.redis.auth.existingSecretKey names the password's key in state.redis.auth.existingSecret" .Values.state.redis.auth.existingSecretKey -}}
{{- else -}}
password
{{- end -}}
{{- end -}}

{{/* The shared-state URL: an external Redis, the chart's own, or memory ("" when the environment passes it: a Secret holds the URL or the password). */}}
{{- define "cfr.stateUrl" -}}
{{- if .Values.state.redisUrlSecret.name -}}
{{- if .Values.state.redisUrl -}}
{{- fail "state.redisUrlSecret and state.redisUrl both name the Redis: keep one" -}}
{{- end -}}
{{- else if .Values.state.redisUrl -}}
{{- .Values.state.redisUrl -}}
{{- else if .Values.state.redis.enabled -}}
{{- if not (include "cfr.redisAuth" .) -}}
{{- printf "redis://%s:6379" (include "cfr.redisName" .) -}}
{{- end -}}
{{- else -}}
memory
{{- end -}}
{{- end -}}

{{/* The DNS name engines are discovered under: the chart's headless Service in epp mode, else the configured one. */}}
{{- define "cfr.discoveryDnsName" -}}
{{- if .Values.router.discovery.dnsName -}}
{{- .Values.router.discovery.dnsName -}}
{{- else if and (eq .Values.mode "epp") .Values.inferencePool.enabled .Values.inferencePool.headlessService.enabled -}}
{{- printf "%s-endpoints.%s.svc" (include "cfr.poolName" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{- define "cfr.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
