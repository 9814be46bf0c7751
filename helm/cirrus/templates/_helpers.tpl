{{/* Name of the operator's objects: <release>-operator unless fullnameOverride is set. */}}
{{- define "cirrus.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. No chart version or "managed-by" label, so that the rendered
     output and the plain manifests generated from it are the same objects. */}}
{{- define "cirrus.labels" -}}
app.kubernetes.io/name: cirrus
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: cirrus
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "cirrus.selectorLabels" -}}
app.kubernetes.io/name: cirrus
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The schema of a core/v1 ResourceRequirements (requests and limits), used three times in
     the SwarmJob CRD. */}}
{{- define "cirrus.crdResourceRequirements" -}}
type: object
properties:
  requests:
    {{- include "cirrus.crdResourceList" . | nindent 4 }}
  limits:
    {{- include "cirrus.crdResourceList" . | nindent 4 }}
{{- end -}}

{{- define "cirrus.crdResourceList" -}}
type: object
maxProperties: 16
additionalProperties:
  anyOf:
    - type: integer
    - type: string
  pattern: '^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$'
  x-kubernetes-int-or-string: true
{{- end -}}

{{/* The operator's rules on SwarmJobs and their children (rbac.yaml: in a ClusterRole, or in a
     Role of operator.watchNamespace). */}}
{{- define "cirrus.jobRules" -}}
- apiGroups: ["cirrus.dev"]
  resources: ["swarmjobs"]
  # delete: runPolicy.ttlSecondsAfterFinished removes a finished job, as the TTL-after-
  # finished controller does for Jobs (one job at a time, by uid: no deletecollection).
  # patch: a job with spec.clusters carries the finalizer cirrus.dev/member-copies, which the
  # operator adds and removes by merge patch, so that deleting the job deletes its copies in
  # the member clusters first (no ownerReference crosses clusters). RBAC cannot limit a patch
  # to the finalizers; the operator patches nothing else of a job (its status goes through
  # swarmjobs/status).
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["cirrus.dev"]
  resources: ["swarmjobs/status"]
  # get: no more than get on swarmjobs already allows; clients (kubectl included) read the
  # subresource before patching it.
  verbs: ["get", "update", "patch"]
- apiGroups: ["cirrus.dev"]
  resources: ["swarmjobs/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["pods", "services"]
  verbs: ["create", "get", "list", "watch", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  # A job's Secret (its CA and gateway keys and certificates) is made once and asked for
  # by name: no list or watch, so the operator cannot enumerate the cluster's Secrets; no
  # update or delete (never re-keyed; garbage collection removes it with its job). patch:
  # a job spanning clusters adds gateway certificates to it (signed at home from this
  # cluster's requests), keys are never replaced.
  verbs: ["create", "get", "patch"]
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  # spec.gangScheduling: a region's PodGroup, made and, when its gang's size changes (its
  # schedulingPolicy is immutable), made again.
  verbs: ["create", "get", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
