{{/* The image of one of docker-variant's programs: variant-proxy, variant-scheduler, variant-agent. */}}
{{- define "docker-variant.image" -}}
{{- $registry := required "image.registry: name the registry deploy/images/build.sh's images were pushed to (HOST[:PORT]); no public registry has them" .root.Values.image.registry -}}
{{ trimSuffix "/" $registry }}/{{ .root.Values.image.prefix }}{{ .name }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
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

{{/* The registries whose pulls the nodes' containerd sends through the proxy: agent.containerdHosts.registries, else scheduler.registries. */}}
{{- define "docker-variant.containerdRegistries" -}}
{{- $registries := .Values.agent.containerdHosts.registries | default .Values.scheduler.registries -}}
{{- if not $registries -}}
{{- fail "agent.containerdHosts.registries: no registry to write containerd's hosts.toml for; set scheduler.registries (HOST:PORT, as clients name it), which it defaults to" -}}
{{- end -}}
{{- toJson $registries -}}
{{- end -}}
