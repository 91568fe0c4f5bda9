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

{{/* NAME-SUFFIX in 63 characters at most (a Service's name, a label's value): NAME is cut to make
room, never the suffix, so the name stays distinct from NAME's. Called with (list NAME SUFFIX). */}}
{{- define "cfr.suffixed" -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" (index . 0 | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end -}}

{{/* Values are quoted: a release named "true" or "123" must stay a string. */}}
{{- define "cfr.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cfr.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/component: {{ .Values.mode | quote }}
{{- end -}}

{{- define "cfr.labels" -}}
{{ include "cfr.labelsWithoutComponent" . }}
app.kubernetes.io/component: {{ .Values.mode | quote }}
{{- end -}}

{{/* The release's labels less the component, for manifests of another component (the Redis). */}}
{{- define "cfr.labelsWithoutComponent" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "cfr.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
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

{{/* The headless Service over the pool's pods (discovery resolves its DNS name). */}}
{{- define "cfr.endpointsName" -}}
{{- include "cfr.suffixed" (list (include "cfr.poolName" .) "endpoints") -}}
{{- end -}}

{{- define "cfr.redisName" -}}
{{- include "cfr.suffixed" (list (include "cfr.fullname" .) "redis") -}}
{{- end -}}

{{/* The app.kubernetes.io/name of the chart's Redis pods (their selector's). */}}
{{- define "cfr.redisAppName" -}}
{{- include "cfr.suffixed" (list (include "cfr.name" .) "redis") -}}
{{- end -}}

{{/*
The chart's own labels or annotations (YAML) with the user's (a map) added: a key the chart
sets may be repeated with the chart's value only, as it would otherwise render twice (a YAML
error) or break a selector. Called with (dict "own" YAML "extra" MAP "what" VALUE-NAME).
*/}}
{{- define "cfr.withExtra" -}}
{{- $all := fromYaml .own -}}
{{- range $key, $value := .extra -}}
{{- if and (hasKey $all $key) (ne (toString (index $all $key)) (toString $value)) -}}
{{- fail (printf "%s sets %s, which the chart sets itself (to %s): leave it out" $.what $key (index $all $key | quote)) -}}
{{- end -}}
{{- /* a label or annotation value is a string (a number or a boolean would be refused) */ -}}
{{- $_ := set $all $key (toString $value) -}}
{{- end -}}
{{- toYaml $all -}}
{{- end -}}

{{/* Two Services or Deployments of one name would overwrite each other: possible only with a fullnameOverride ending in a suffix the chart adds. */}}
{{- define "cfr.checkNames" -}}
{{- $fullname := include "cfr.fullname" . -}}
{{- if and (include "cfr.chartRedis" .) (eq $fullname (include "cfr.redisName" .)) -}}
{{- fail (printf "the chart's Redis would be named %s, as the router is: choose another fullnameOverride" $fullname) -}}
{{- end -}}
{{- if and (eq .Values.mode "epp") .Values.inferencePool.enabled .Values.inferencePool.headlessService.enabled (eq $fullname (include "cfr.endpointsName" .)) -}}
{{- fail (printf "the InferencePool's headless Service would be named %s, as the router's is: choose another fullnameOverride or inferencePool.name" $fullname) -}}
{{- end -}}
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
{{- printf "%s.%s.svc" (include "cfr.endpointsName" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
An image reference: REPOSITORY@DIGEST when a digest is given (the tag is then left out, as the
digest alone names the image), else REPOSITORY:TAG. Called with (dict "image" IMAGE-VALUES
"defaultTag" TAG "what" VALUE-NAME).
*/}}
{{- define "cfr.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .defaultTag .image.tag | required (printf "%s.tag or %s.digest names the image" .what .what)) -}}
{{- end -}}
{{- end -}}

{{- define "cfr.image" -}}
{{- include "cfr.imageRef" (dict "image" .Values.image "defaultTag" .Chart.AppVersion "what" "image") -}}
{{- end -}}
