{{/*
Names, labels and the values several templates share.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "agent-reach.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: <release>-<chart>, or just <release> when it already contains
the chart name, or fullnameOverride. At most 40 characters, so that <fullname>-injector-tls and
the like stay within the 63 characters of a label value or a DNS label.
*/}}
{{- define "agent-reach.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* name-version, for the helm.sh/chart label. */}}
{{- define "agent-reach.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "agent-reach.labels" -}}
helm.sh/chart: {{ include "agent-reach.chart" . }}
{{ include "agent-reach.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agent-reach
{{- end }}

{{/* Labels that select the injector's pods. */}}
{{- define "agent-reach.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agent-reach.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "agent-reach.injectorSelectorLabels" -}}
{{ include "agent-reach.selectorLabels" . }}
app.kubernetes.io/component: injector
{{- end }}

{{/* Names of the injector's objects (all in the release namespace). */}}
{{- define "agent-reach.injectorName" -}}
{{- include "agent-reach.fullname" . }}-injector
{{- end }}

{{- define "agent-reach.tlsSecretName" -}}
{{- include "agent-reach.fullname" . }}-injector-tls
{{- end }}

{{/* Names of the per-fleet objects (one of each in every fleet namespace). */}}
{{- define "agent-reach.policyName" -}}
{{- include "agent-reach.fullname" . }}-policy
{{- end }}

{{/* The gossip key Secret: the user's (gossip.existingSecret), or the one the chart renders. */}}
{{- define "agent-reach.gossipKeyName" -}}
{{- if .Values.gossip.existingSecret }}
{{- .Values.gossip.existingSecret }}
{{- else }}
{{- include "agent-reach.fullname" . }}-gossip-key
{{- end }}
{{- end }}

{{- define "agent-reach.gossipServiceName" -}}
{{- include "agent-reach.fullname" . }}-gossip
{{- end }}

{{/* The fleet namespaces, as a JSON list (use with fromJsonArray): fleet.namespaces, or the release namespace. */}}
{{- define "agent-reach.fleetNamespaces" -}}
{{- if .Values.fleet.namespaces }}
{{- .Values.fleet.namespaces | uniq | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{/* The image of the injector and of the sidecar: repository@digest, or repository:tag (default appVersion). */}}
{{- define "agent-reach.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The DNS names the webhook's certificate covers: the injector Service's names. */}}
{{- define "agent-reach.webhookDnsNames" -}}
{{- $svc := include "agent-reach.injectorName" . }}
{{- $ns := .Release.Namespace }}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.fleet.clusterDomain) | toJson }}
{{- end }}

{{/*
The webhook's TLS material when the chart makes it (webhook.certManager.enabled=false), as JSON
{"ca": PEM, "crt": PEM, "key": PEM}. An existing Secret's certificate is kept across upgrades (so
the injector does not restart on every upgrade); otherwise a new CA and serving certificate are
generated. Computed once per render and memoized in the root context, because the Secret, the
webhook's caBundle and the Deployment's checksum/tls must all see the same certificate.
*/}}
{{- define "agent-reach.webhookTLS" -}}
{{- if not (hasKey $ "agentReachWebhookTLS") }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "agent-reach.tlsSecretName" .) }}
{{- $data := dict }}
{{- if $secret }}{{ $data = default dict $secret.data }}{{ end }}
{{- $tls := dict }}
{{- if and (hasKey $data "ca.crt") (hasKey $data "tls.crt") (hasKey $data "tls.key") }}
{{- $tls = dict "ca" (index $data "ca.crt" | b64dec) "crt" (index $data "tls.crt" | b64dec) "key" (index $data "tls.key" | b64dec) }}
{{- else }}
{{- $days := int .Values.webhook.certValidityDays }}
{{- $ca := genCA (printf "%s-ca" (include "agent-reach.injectorName" .)) $days }}
{{- $dnsNames := include "agent-reach.webhookDnsNames" . | fromJsonArray }}
{{- $cert := genSignedCert (index $dnsNames 2) nil $dnsNames $days $ca }}
{{- $tls = dict "ca" $ca.Cert "crt" $cert.Cert "key" $cert.Key }}
{{- end }}
{{- $_ := set $ "agentReachWebhookTLS" $tls }}
{{- end }}
{{- index $ "agentReachWebhookTLS" | toJson }}
{{- end }}

{{/* Checks across values that the schema cannot express; fails the render with the reason. */}}
{{- define "agent-reach.validate" -}}
{{- $p := .Values.sidecar.ports }}
{{- $ports := list (int $p.outbound) (int $p.inbound) (int $p.admin) (int $p.gossip) }}
{{- if ne (len ($ports | uniq)) 4 }}
{{- fail (printf "sidecar.ports must be four different ports, got outbound %d, inbound %d, admin %d, gossip %d" (int $p.outbound) (int $p.inbound) (int $p.admin) (int $p.gossip)) }}
{{- end }}
{{- if and .Values.sidecar.native (semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "sidecar.native=true needs Kubernetes 1.29 or later (native sidecars); this cluster is %s: set sidecar.native=false" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- if has (int .Values.fleet.defaults.agentPort) $ports }}
{{- fail (printf "fleet.defaults.agentPort %d is one of the sidecar's ports (sidecar.ports)" (int .Values.fleet.defaults.agentPort)) }}
{{- end }}
{{- include "agent-reach.validateMtls" . }}
{{- end }}

{{/* Checks of mtls.* and authorization.* (called by agent-reach.validate). */}}
{{- define "agent-reach.validateMtls" -}}
{{- $m := .Values.mtls }}
{{- $authz := .Values.authorization }}
{{- if and (or $authz.capabilities (eq $authz.default "deny")) (or (not $m.enabled) (eq $m.mode "disabled")) }}
{{- fail "authorization lists capabilities (or denies by default) but sidecars have no verified identities (mtls.enabled=false or mtls.mode=disabled): every caller would be refused; set mtls.enabled=true and mtls.mode permissive or strict" }}
{{- end }}
{{- if and $m.enabled (eq $m.source "certificate") }}
{{- if not $m.issuer.name }}
{{- fail "mtls.source=certificate needs mtls.issuer.name: the cert-manager Issuer or ClusterIssuer that signs the sidecars' certificates" }}
{{- end }}
{{- if not $m.certificate.serviceAccounts }}
{{- fail "mtls.source=certificate needs mtls.certificate.serviceAccounts: the injector refuses pods whose service account has no certificate, so with none listed it would refuse every pod" }}
{{- end }}
{{- $fleet := include "agent-reach.fleetNamespaces" . | fromJsonArray }}
{{- range $m.certificate.serviceAccounts }}
{{- if contains "/" . }}
{{- $ns := first (splitList "/" .) }}
{{- if not (has $ns $fleet) }}
{{- fail (printf "mtls.certificate.serviceAccounts: %s is not in a fleet namespace (%s)" . (join ", " $fleet)) }}
{{- end }}
{{- end }}
{{- end }}
{{- range include "agent-reach.mtlsServiceAccounts" . | fromJsonArray }}
{{- $secret := printf "%s-%s" (include "agent-reach.mtlsSecretPrefix" $) .name }}
{{- if gt (len $secret) 253 }}
{{- fail (printf "mtls.certificate.serviceAccounts: the Secret name %s is longer than 253 characters" $secret) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The prefix of the per-service-account certificate Secrets (source=certificate): <prefix>-<service account>. */}}
{{- define "agent-reach.mtlsSecretPrefix" -}}
{{- include "agent-reach.fullname" . }}-mtls
{{- end }}

{{/*
The service accounts that get a Certificate (mtls.source=certificate), as a JSON list of
{"namespace": …, "name": …}: a bare name in every fleet namespace, namespace/name in that one.
*/}}
{{- define "agent-reach.mtlsServiceAccounts" -}}
{{- $fleet := include "agent-reach.fleetNamespaces" . | fromJsonArray }}
{{- $out := list }}
{{- range .Values.mtls.certificate.serviceAccounts }}
{{- if contains "/" . }}
{{- $parts := splitList "/" . }}
{{- $out = append $out (dict "namespace" (index $parts 0) "name" (index $parts 1)) }}
{{- else }}
{{- $name := . }}
{{- range $fleet }}
{{- $out = append $out (dict "namespace" . "name" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- $out | uniq | toJson }}
{{- end }}
