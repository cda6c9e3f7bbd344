{{/*
The `cni` values in effect, as YAML: .Values.cni, with any of its names given at the top level
(Istio's chart reads them there too, so an Istio values file works as it is) put over it. Maps
such as `repair` are merged key by key. Each template starts with
  {{- $cni := include "redirect-cni.cni" . | fromYaml }}
*/}}
{{- define "redirect-cni.cni" -}}
{{- $cni := deepCopy .Values.cni -}}
{{- range $name, $default := .Values.cni -}}
{{- if hasKey $.Values $name -}}
{{- $top := index $.Values $name -}}
{{- if and (kindIs "map" $default) (kindIs "map" $top) -}}
{{- $_ := set $cni $name (mustMergeOverwrite (deepCopy $default) $top) -}}
{{- else -}}
{{- $_ := set $cni $name $top -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $cni -}}
{{- end -}}

{{/* global.platform, or platform at the top level (Istio's chart reads both). */}}
{{- define "redirect-cni.platform" -}}
{{- coalesce .Values.platform .Values.global.platform | default "" -}}
{{- end -}}

{{/*
"true" on OpenShift: the platform says so, or the cluster serves the SCC API (helm install
sees it; helm template sees it with --api-versions security.openshift.io/v1).
*/}}
{{- define "redirect-cni.openshift" -}}
{{- if or (eq (include "redirect-cni.platform" .) "openshift") (.Capabilities.APIVersions.Has "security.openshift.io/v1") -}}
true
{{- end -}}
{{- end -}}

{{/*
The repair controller's mode, as the installer picks it (docs/repair.md): repair, delete, label,
none (the controller watches but does nothing), or off.
*/}}
{{- define "redirect-cni.repairMode" -}}
{{- $r := (include "redirect-cni.cni" . | fromYaml).repair -}}
{{- if not $r.enabled -}}off
{{- else if $r.repairPods -}}repair
{{- else if $r.deletePods -}}delete
{{- else if $r.labelPods -}}label
{{- else -}}none
{{- end -}}
{{- end -}}

{{/* The labels of every object: the name the plain manifests use, nothing else. */}}
{{- define "redirect-cni.labels" -}}
app.kubernetes.io/name: redirect-cni
{{- end -}}

{{/*
The ClusterRoleBindings' subject: the ServiceAccount, in the release's namespace.
*/}}
{{- define "redirect-cni.subject" -}}
- kind: ServiceAccount
  name: redirect-cni
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/*
Refusals, checked once (from the ServiceAccount's template): settings the chart cannot render
into a working deployment.
*/}}
{{- define "redirect-cni.checks" -}}
{{- $cni := include "redirect-cni.cni" . | fromYaml -}}
{{- if and (eq $cni.provider "multus") $cni.chained -}}
{{- fail "cni.provider=multus needs cni.chained=false: Multus runs the standalone file the installer writes, which it finds by the name inside (the NetworkAttachmentDefinition's)" -}}
{{- end -}}
{{- $ambient := or (.Values.ambient | default dict).enabled ($cni.ambient | default dict).enabled (eq (coalesce .Values.profile .Values.global.profile | default "") "ambient") -}}
{{- if $ambient -}}
{{- fail "ambient mode is not supported: redirect-cni replaces istio-cni in sidecar mode only (leave ambient.enabled and profile=ambient unset)" -}}
{{- end -}}
{{- with include "redirect-cni.platform" . -}}
{{- if ne . "openshift" -}}
{{- fail (printf "global.platform=%s: this chart knows only openshift (it adds the SCC). Set cni.cniBinDir and cni.cniConfDir for %s yourself (Istio's files/profile-platform-%s.yaml names them) and leave global.platform unset" . . .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
