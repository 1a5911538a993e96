{{/* The image of one of docker-variant's programs: variant-proxy, variant-scheduler, variant-agent. */}}
{{- define "docker-variant.image" -}}
{{ .root.Values.image.prefix }}{{ .name }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end -}}

{{/* The two labels every object carries: its component and the whole. */}}
{{- define "docker-variant.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: docker-variant
{{- end -}}


{{/* A server's connection-limit arguments, from its values' limits (docs/security.md). */}}
{{- define "docker-variant.limitArgs" -}}
- --max-head-bytes={{ int .maxHeadBytes }}
- --head-timeout={{ .headTimeout }}
- --body-timeout={{ .bodyTimeout }}
- --keep-alive={{ .keepAlive }}
- --max-connections={{ int .maxConnections }}
{{- end -}}

{{/* agent.auth, checked: how agents prove themselves to the scheduler (--agent-auth). */}}
{{- define "docker-variant.agentAuth" -}}
{{- if not (has .Values.agent.auth (list "kubernetes" "tokens")) }}
{{- fail (printf "agent.auth: %q is neither kubernetes nor tokens" (toString .Values.agent.auth)) }}
{{- end }}
{{- end -}}
