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
{{- end }}

{{/* The pod volumes the sidecar mounts (in each fleet namespace the chart renders the objects they name). */}}
{{- define "agent-reach.sidecarVolumes" -}}
- name: agent-reach-policy
  configMap:
    name: {{ include "agent-reach.policyName" . }}
- name: agent-reach-gossip-key
  secret:
    secretName: {{ include "agent-reach.gossipKeyName" . }}
{{- end }}
