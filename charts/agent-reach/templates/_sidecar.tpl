{{/*
The agent-reach sidecar, a Kubernetes Container: defined once here, rendered into the injector's
config (injector.yaml, key `sidecar`), from which the webhook adds it to every injected pod — as a
native sidecar (an init container with restartPolicy Always) or as a plain container, after
sidecar.native. Its ports come from sidecar.ports, like every other place that names them.
*/}}
{{- define "agent-reach.sidecar" -}}
{{- $ports := .Values.sidecar.ports -}}
name: agent-reach
image: {{ include "agent-reach.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
args: ["run"]
env:
  - name: POD_NAME
    valueFrom:
      fieldRef:
        fieldPath: metadata.name
  - name: POD_NAMESPACE
    valueFrom:
      fieldRef:
        fieldPath: metadata.namespace
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: AGENT_REACH_POLICY
    value: /etc/agent-reach/policy/policy.yaml
  - name: AGENT_REACH_LOG
    value: {{ .Values.sidecar.logLevel | quote }}
  {{- if eq .Values.sidecar.logFormat "json" }}
  - name: AGENT_REACH_LOG_FORMAT
    value: json
  {{- end }}
  {{- with .Values.sidecar.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
ports:
  - name: reach-in
    containerPort: {{ $ports.inbound }}
    protocol: TCP
  - name: reach-admin
    containerPort: {{ $ports.admin }}
    protocol: TCP
  - name: reach-gossip
    containerPort: {{ $ports.gossip }}
    protocol: UDP
startupProbe:
  httpGet:
    path: /live
    port: reach-admin
  periodSeconds: 1
  failureThreshold: 30
livenessProbe:
  httpGet:
    path: /live
    port: reach-admin
  periodSeconds: 10
readinessProbe:
  httpGet:
    path: /ready
    port: reach-admin
  periodSeconds: 2
resources:
  {{- toYaml .Values.sidecar.resources | nindent 2 }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  {{- if .Values.mtls.enabled }}
  # The group csi-driver-spiffe gives the certificate files (its fs-group volume attribute): they
  # are 0440, readable by this group only.
  runAsGroup: 65532
  {{- end }}
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]
  seccompProfile:
    type: RuntimeDefault
volumeMounts:
  - name: agent-reach-policy
    mountPath: /etc/agent-reach/policy
    readOnly: true
  - name: agent-reach-gossip-key
    mountPath: /var/run/agent-reach/gossip
    readOnly: true
  {{- if .Values.escalation.existingSecret }}
  - name: agent-reach-escalation-key
    mountPath: {{ include "agent-reach.escalationKeyDir" . }}
    readOnly: true
  {{- end }}
{{- end }}

{{/* The pod volumes the sidecar mounts (in each fleet namespace the chart renders the objects they name). */}}
{{- define "agent-reach.sidecarVolumes" -}}
- name: agent-reach-policy
  configMap:
    name: {{ include "agent-reach.policyName" . }}
- name: agent-reach-gossip-key
  secret:
    secretName: {{ include "agent-reach.gossipKeyName" . }}
{{- if .Values.escalation.existingSecret }}
# The user's Secret with the escalation webhook's HMAC key, as the file the policy names.
- name: agent-reach-escalation-key
  secret:
    secretName: {{ .Values.escalation.existingSecret }}
    items:
      - key: {{ .Values.escalation.existingSecretKey }}
        path: key
{{- end }}
{{- end }}

{{/* Where the escalation key Secret is mounted in the sidecar; the policy's key_file is its `key`. */}}
{{- define "agent-reach.escalationKeyDir" -}}
/var/run/agent-reach/escalation
{{- end }}

{{/*
The certificate volume of mtls.enabled (injector.yaml, key `mtls`): the injector names it, mounts
it read-only at /var/run/agent-reach/tls in the sidecar and adds `tls` to the bootstrap.
*/}}
{{- define "agent-reach.mtlsInjector" -}}
{{- $m := .Values.mtls -}}
{{- if eq $m.source "csi" -}}
# csi-driver-spiffe: a certificate per pod for its service account, requested when the pod starts
# and renewed in place; the driver is configured with the issuer and trust domain at its install.
volume:
  csi:
    driver: spiffe.csi.cert-manager.io
    readOnly: true
    volumeAttributes:
      # The files' group (0440): the sidecar's runAsGroup.
      spiffe.csi.cert-manager.io/fs-group: "65532"
{{- else -}}
# The Secret of the pod's service account's Certificate; `{service_account}` is literal: the
# webhook puts the pod's service account there, and refuses a pod whose service account is not
# listed below (its Secret does not exist).
volume:
  secret:
    secretName: {{ printf "%s-{service_account}" (include "agent-reach.mtlsSecretPrefix" .) | quote }}
service_accounts:
  {{- range include "agent-reach.mtlsServiceAccounts" . | fromJsonArray }}
  - {{ printf "%s/%s" .namespace .name | quote }}
  {{- end }}
{{- end }}
{{- end }}
