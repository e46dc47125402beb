{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "kvroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: "<release>-<chart>" unless the release name already holds the chart name. */}}
{{- define "kvroute.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the Envoy Deployment and of its objects (service mode). */}}
{{- define "kvroute.envoyName" -}}
{{- printf "%s-envoy" (include "kvroute.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* Headless Service of the kvroute pods' ext_proc port (service mode). */}}
{{- define "kvroute.extprocName" -}}
{{- printf "%s-extproc" (include "kvroute.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "kvroute.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of the router pods (kvroute, plus Envoy in sidecar mode). */}}
{{- define "kvroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{/* Selector labels of the Envoy pods (service mode). */}}
{{- define "kvroute.envoySelectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: proxy
{{- end }}

{{- define "kvroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvroute.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvroute.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "kvroute.enginesNamespace" -}}
{{- default .Release.Namespace .Values.engines.namespace }}
{{- end }}

{{/* Fully qualified name of the engines' (headless) Service. */}}
{{- define "kvroute.enginesHost" -}}
{{- printf "%s.%s.svc.%s" .Values.engines.service (include "kvroute.enginesNamespace" .) .Values.engines.clusterDomain }}
{{- end }}

{{/* Keys kvroute no longer takes fail the install with the reason. */}}
{{- define "kvroute.checkRemoved" -}}
{{- $routing := default dict .Values.config.routing }}
{{- if hasKey $routing "destination_header" }}
{{- fail "config.routing.destination_header was removed: kvroute always sends its pick as x-gateway-destination-endpoint (the envoy.lb metadata key Envoy's override_host reads); delete the key" }}
{{- end }}
{{- end }}

{{/* Whether the chart needs API access (Kubernetes discovery). */}}
{{- define "kvroute.needsAPI" -}}
{{- if eq .Values.discovery.mode "kubernetes" }}true{{ end }}
{{- end }}

{{/* discovery.defaults in kvroute's snake_case, empty values left out. */}}
{{- define "kvroute.discoveryDefaults" -}}
{{- $d := .Values.discovery.defaults }}
{{- $out := dict }}
{{- with $d.model }}{{ $_ := set $out "model" . }}{{ end }}
{{- with $d.engine }}{{ $_ := set $out "engine" . }}{{ end }}
{{- with $d.blockSize }}{{ $_ := set $out "block_size" (int .) }}{{ end }}
{{- with $d.eventsPort }}{{ $_ := set $out "events_port" (int .) }}{{ end }}
{{- with $d.replayPort }}{{ $_ := set $out "replay_port" (int .) }}{{ end }}
{{- with $d.topic }}{{ $_ := set $out "topic" . }}{{ end }}
{{- with $d.dpRanks }}{{ $_ := set $out "dp_ranks" (int .) }}{{ end }}
{{- with $d.metricsPort }}{{ $_ := set $out "metrics_port" (int .) }}{{ end }}
{{- toYaml $out }}
{{- end }}

{{/* kvroute's configuration file: listeners and replicas from the chart's values, the rest from .Values.config. */}}
{{- define "kvroute.config" -}}
{{- $p := .Values.kvroute.ports }}
{{- $listeners := dict
    "extproc" (printf "%s:%d" (ternary "127.0.0.1" "" (eq .Values.envoy.mode "sidecar")) (int $p.extproc))
    "admin" (printf "127.0.0.1:%d" (int $p.admin))
    "metrics" (printf ":%d" (int $p.metrics))
    "drain_timeout" .Values.kvroute.drainTimeout }}
{{- $defaults := include "kvroute.discoveryDefaults" . | fromYaml }}
{{- $replicas := dict }}
{{- if eq .Values.discovery.mode "kubernetes" }}
{{- $k := .Values.discovery.kubernetes }}
{{- $src := dict "namespace" (include "kvroute.enginesNamespace" .) "port_name" $k.portName "address_type" $k.addressType "min_interval" $k.minInterval }}
{{- if $k.inferencePool }}
{{- $_ := set $src "inference_pool" $k.inferencePool }}
{{- else if $k.selector }}
{{- $_ := set $src "selector" $k.selector }}
{{- else }}
{{- $_ := set $src "service" .Values.engines.service }}
{{- end }}
{{- if $k.ignorePods }}{{ $_ := set $src "ignore_pods" true }}{{ end }}
{{- with $k.podSelector }}{{ $_ := set $src "pod_selector" . }}{{ end }}
{{- if $defaults }}{{ $_ := set $src "defaults" $defaults }}{{ end }}
{{- $_ := set $replicas "kubernetes" $src }}
{{- else }}
{{- $src := dict "host" (include "kvroute.enginesHost" .) "port" (int .Values.engines.port) "interval" .Values.discovery.dns.interval }}
{{- if $defaults }}{{ $_ := set $src "defaults" $defaults }}{{ end }}
{{- $_ := set $replicas "dns" $src }}
{{- end }}
{{- $cfg := deepCopy .Values.config }}
{{- $_ := set $cfg "listeners" $listeners }}
{{- $_ := set $cfg "replicas" $replicas }}
{{- if .Values.tls.extproc.enabled }}
{{- $tls := deepCopy (.Values.config.tls | default dict) }}
{{- $_ := set $tls "extproc" (dict "cert_file" "/etc/kvroute-tls/extproc/tls.crt" "key_file" "/etc/kvroute-tls/extproc/tls.key" "client_ca_file" "/etc/kvroute-tls/extproc/ca.crt") }}
{{- $_ := set $cfg "tls" $tls }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* Pod anti-affinity from .Values.podAntiAffinity, unless .Values.affinity is set. */}}
{{- define "kvroute.affinity" -}}
{{- $ctx := index . 0 }}
{{- $labels := index . 1 }}
{{- if $ctx.Values.affinity }}
{{- toYaml $ctx.Values.affinity }}
{{- else if eq $ctx.Values.podAntiAffinity "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
  - topologyKey: kubernetes.io/hostname
    labelSelector:
      matchLabels:
        {{- $labels | nindent 8 }}
{{- else if eq $ctx.Values.podAntiAffinity "soft" }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
  - weight: 100
    podAffinityTerm:
      topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- $labels | nindent 10 }}
{{- end }}
{{- end }}

{{/* The Envoy container (sidecar and service mode alike). */}}
{{- define "kvroute.envoyContainer" -}}
- name: envoy
  image: {{ printf "%s:%s" .Values.envoy.image.repository .Values.envoy.image.tag }}
  imagePullPolicy: {{ .Values.envoy.image.pullPolicy }}
  args:
  - --config-path
  - /etc/envoy/envoy.yaml
  - --log-level
  - {{ .Values.envoy.logLevel }}
  - --disable-hot-restart
  {{- range .Values.envoy.extraArgs }}
  - {{ . | quote }}
  {{- end }}
  ports:
  - name: inference
    containerPort: {{ .Values.envoy.ports.inference }}
    protocol: TCP
  - name: envoy-ready
    containerPort: {{ .Values.envoy.ports.readiness }}
    protocol: TCP
  {{- include "kvroute.preStop" . | nindent 2 }}
  readinessProbe:
    httpGet:
      path: /ready
      port: envoy-ready
    periodSeconds: 5
    timeoutSeconds: 2
    failureThreshold: 2
  livenessProbe:
    tcpSocket:
      port: envoy-ready
    periodSeconds: 10
    timeoutSeconds: 2
    failureThreshold: 3
  resources:
    {{- toYaml .Values.envoy.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
  - name: envoy-config
    mountPath: /etc/envoy
    readOnly: true
  - name: envoy-tmp
    mountPath: /tmp
  {{- if .Values.tls.extproc.enabled }}
  - name: envoy-extproc-client-tls
    mountPath: /etc/envoy-tls/extproc-client
    readOnly: true
  {{- end }}
{{- end }}

{{/* Envoy's client certificate Secret volume (with extproc TLS). */}}
{{- define "kvroute.envoyTLSVolume" -}}
{{- if .Values.tls.extproc.enabled }}
- name: envoy-extproc-client-tls
  secret:
    secretName: {{ include "kvroute.extprocClientSecret" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* preStop delay shared by kvroute and Envoy (see envoy.shutdownDelaySeconds). */}}
{{- define "kvroute.preStop" -}}
{{- if gt (int .Values.envoy.shutdownDelaySeconds) 0 }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ .Values.envoy.shutdownDelaySeconds }}
{{- end }}
{{- end }}

{{/* Egress rules shared by the chart's NetworkPolicies: the engines' namespace, DNS, the API server (when "api"), extraEgress. */}}
{{- define "kvroute.egressRules" -}}
{{- $ctx := .ctx }}
{{- $eg := $ctx.Values.networkPolicy.egress }}
- to:
  - namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {{ include "kvroute.enginesNamespace" $ctx }}
  {{- with $eg.enginePorts }}
  ports:
  {{- range . }}
  - {port: {{ . }}, protocol: TCP}
  {{- end }}
  {{- end }}
- to:
  - namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {{ $eg.dnsNamespace }}
  ports:
  - {port: 53, protocol: UDP}
  - {port: 53, protocol: TCP}
{{- if and .api $eg.apiServerCIDRs }}
- to:
  {{- range $eg.apiServerCIDRs }}
  - ipBlock: {cidr: {{ . | quote }}}
  {{- end }}
  ports:
  {{- range $eg.apiServerPorts }}
  - {port: {{ . }}, protocol: TCP}
  {{- end }}
{{- end }}
{{- with $eg.extraEgress }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* extproc TLS: the kvroute server Secret, Envoy's client Secret, and the name Envoy expects in kvroute's certificate (SNI). */}}
{{- define "kvroute.extprocServerSecret" -}}
{{- .Values.tls.extproc.secretName | default (printf "%s-extproc-tls" (include "kvroute.fullname" .)) }}
{{- end }}
{{- define "kvroute.extprocClientSecret" -}}
{{- .Values.tls.extproc.clientSecretName | default (printf "%s-envoy-client-tls" (include "kvroute.fullname" .)) }}
{{- end }}
{{- define "kvroute.extprocSNI" -}}
{{- if .Values.tls.extproc.sni }}{{ .Values.tls.extproc.sni }}
{{- else if eq .Values.envoy.mode "sidecar" }}localhost
{{- else }}{{ printf "%s.%s.svc.%s" (include "kvroute.extprocName" .) .Release.Namespace .Values.engines.clusterDomain }}
{{- end }}
{{- end }}
