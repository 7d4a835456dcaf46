{{- define "tidegate.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tidegate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tidegate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{ include "tidegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tidegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tidegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tidegate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tidegate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Whether any Redis is configured. */}}
{{- define "tidegate.hasRedis" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret .Values.redis.embedded.enabled -}}true{{- end -}}
{{- end -}}

{{/* Refuse values that would deploy a broken gateway. */}}
{{- define "tidegate.validate" -}}
{{- $processes := or (gt (int .Values.replicaCount) 1) .Values.autoscaling.enabled (gt (int .Values.workers) 1) -}}
{{- if and $processes (not (include "tidegate.hasRedis" .)) -}}
{{- fail "tidegate: more than one gateway process (replicaCount > 1, autoscaling or workers > 1) needs Redis: set redis.url, redis.existingSecret or redis.embedded.enabled=true. The in-memory store is per process, so each replica would admit max_concurrency on its own." -}}
{{- end -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (add .Values.drainSeconds .Values.preStopSleepSeconds | int) -}}
{{- fail (printf "tidegate: terminationGracePeriodSeconds (%d) must exceed drainSeconds + preStopSleepSeconds (%d), or Kubernetes kills pods mid-drain" (int .Values.terminationGracePeriodSeconds) (add .Values.drainSeconds .Values.preStopSleepSeconds | int)) -}}
{{- end -}}
{{- if and .Values.redis.url .Values.redis.embedded.enabled -}}
{{- fail "tidegate: set either redis.url or redis.embedded.enabled, not both" -}}
{{- end -}}
{{- if .Values.dedicatedAutoscaling.enabled -}}
{{- range $scaled := .Values.dedicatedAutoscaling.pools -}}
{{- range $model, $routes := $.Values.routes -}}
{{- range $pool := ($routes.dedicated | default list) -}}
{{- if and $pool.replica_dns (eq $pool.name $scaled.endpoint) (gt (int $scaled.maxReplicas) (int $pool.max_replicas)) -}}
{{- fail (printf "tidegate: dedicatedAutoscaling.pools[%s].maxReplicas (%d) exceeds routes.%s.dedicated[%s].max_replicas (%d): pods beyond it would get no slot set and no traffic" $scaled.endpoint (int $scaled.maxReplicas) $model $pool.name (int $pool.max_replicas)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
