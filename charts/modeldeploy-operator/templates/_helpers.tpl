{{- define "modeldeploy-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "modeldeploy-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "modeldeploy-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "modeldeploy-operator.selectorLabels" -}}
app.kubernetes.io/name: modeldeploy-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "modeldeploy-operator.labels" -}}
{{ include "modeldeploy-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modeldeploy
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "modeldeploy-operator.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "modeldeploy-operator.gateKeySecret" -}}
{{- .Values.gateKey.existingSecret | default (printf "%s-gate-key" (include "modeldeploy-operator.fullname" .)) -}}
{{- end -}}
