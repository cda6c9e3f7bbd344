{{/*
The values in effect, as YAML: .Values with .Values.cni merged over it, as Istio's chart merges
them (its `cni` over the top level, maps key by key), so that a name given under `cni.` wins
over the same name at the top level, where values.yaml keeps the defaults. Istio's install page
gives istioctl's spelling, `values.cni.NAME` (for OpenShift: values.cni.cniBinDir, cniConfDir,
chained=false, cniConfFileName): read too, between the top level and `cni.`. Then what Istio's
chart makes of an empty value: an empty or null cniBinDir is /home/kubernetes/bin on GKE (its
Kubernetes version holds "-gke") and /opt/cni/bin elsewhere, an empty or null cniConfDir and
cniNetnsDir the defaults; empty items of excludeNamespaces are dropped (helm makes [""] of
`--set excludeNamespaces={}`); null resources entries are left out. pluginLogLevel is the
plugin's level: logging.level, else Istio's older logLevel, else global.logging.level (a
scope:level list gives the agent its levels and the plugin cni-plugin's). Each
template starts with
  {{- $cni := include "redirect-cni.cni" . | fromYaml }}
*/}}
{{- define "redirect-cni.cni" -}}
{{- $istioctl := (.Values.values | default dict).cni | default dict -}}
{{- $platform := include "redirect-cni.platformValues" . | fromYaml -}}
{{- $top := mustMergeOverwrite (deepCopy ($platform.top | default dict)) (deepCopy (omit .Values "cni" "values")) -}}
{{- $cni := mustMergeOverwrite $top (deepCopy ($platform.cni | default dict)) (deepCopy $istioctl) (deepCopy (.Values.cni | default dict)) -}}
{{- $gke := .Capabilities.KubeVersion.GitVersion | contains "-gke" -}}
{{- $_ := set $cni "cniBinDir" ($cni.cniBinDir | default (ternary "/home/kubernetes/bin" "/opt/cni/bin" $gke)) -}}
{{- $_ := set $cni "cniConfDir" ($cni.cniConfDir | default "/etc/cni/net.d") -}}
{{- $_ := set $cni "cniNetnsDir" ($cni.cniNetnsDir | default "/var/run/netns") -}}
{{- $_ := set $cni "cniConfFileName" ($cni.cniConfFileName | default "") -}}
{{- $_ := set $cni "excludeNamespaces" (compact ($cni.excludeNamespaces | default list)) -}}
{{- /* A boolean or the provider left null (or removed by a top-level null): the default. */ -}}
{{- range $name, $default := dict "chained" true "untaintNode" false "provider" "default" -}}
{{- if kindIs "invalid" (index $cni $name) -}}
{{- $_ := set $cni $name $default -}}
{{- end -}}
{{- end -}}
{{- $repair := $cni.repair | default dict -}}
{{- range $name, $default := dict "enabled" true "repairPods" true "deletePods" false "labelPods" false -}}
{{- if kindIs "invalid" (index $repair $name) -}}
{{- $_ := set $repair $name $default -}}
{{- end -}}
{{- end -}}
{{- $_ := set $cni "repair" $repair -}}
{{- /* Ambient mode. Istio's profile=ambient (or global.profile=ambient) sets cni.ambient.enabled
       under the user's values: on, unless cni.ambient.enabled is given. */ -}}
{{- $ambient := deepCopy ($cni.ambient | default dict) -}}
{{- $given := (.Values.cni | default dict).ambient | default dict -}}
{{- if and (eq (include "redirect-cni.profile" .) "ambient") (kindIs "invalid" $given.enabled) -}}
{{- $_ := set $ambient "enabled" true -}}
{{- end -}}
{{- range $name, $default := dict "enabled" false "dnsCapture" true "ipv6" true "reconcileIptablesOnStartup" true -}}
{{- if kindIs "invalid" (index $ambient $name) -}}
{{- $_ := set $ambient $name $default -}}
{{- end -}}
{{- end -}}
{{- $_ := set $cni "ambient" $ambient -}}
{{- $resources := dict -}}
{{- range $key, $r := ($cni.resources | default dict) -}}
{{- if kindIs "map" $r -}}
{{- $kept := dict -}}
{{- range $name, $q := $r -}}
{{- if not (kindIs "invalid" $q) -}}
{{- $_ := set $kept $name $q -}}
{{- end -}}
{{- end -}}
{{- if $kept -}}
{{- $_ := set $resources $key $kept -}}
{{- end -}}
{{- else if not (kindIs "invalid" $r) -}}
{{- $_ := set $resources $key $r -}}
{{- end -}}
{{- end -}}
{{- $_ := set $cni "resources" $resources -}}
{{- $level := coalesce ($cni.logging | default dict).level $cni.logLevel (.Values.global.logging | default dict).level "info" | toString -}}
{{- /* A level, or Istio's scope:level list: the agent takes it whole (LOG_OUTPUT_LEVEL), the
       plugin the level of cni-plugin (or Istio's older cni), else of default. */ -}}
{{- $plugin := "" -}}
{{- $default := "info" -}}
{{- range $item := splitList "," $level -}}
{{- $parts := splitList ":" (trim $item) -}}
{{- if eq (len $parts) 1 -}}
{{- $default = index $parts 0 -}}
{{- else if eq (index $parts 0) "default" -}}
{{- $default = index $parts 1 -}}
{{- else if has (index $parts 0) (list "cni-plugin" "cni") -}}
{{- $plugin = index $parts 1 -}}
{{- end -}}
{{- end -}}
{{- /* The agent's, as Istio's chart gives its --log_output_level (not the older logLevel). */ -}}
{{- $_ := set $cni "logOutputLevel" (coalesce ($cni.logging | default dict).level (.Values.global.logging | default dict).level "info" | toString) -}}
{{- $_ := set $cni "pluginLogLevel" (get (dict "fatal" "error" "warning" "warn") ($plugin | default $default) | default ($plugin | default $default)) -}}
{{- toYaml $cni -}}
{{- end -}}

{{/* Istio's profile: profile at the top level, else global.profile, as Istio's charts read it. */}}
{{- define "redirect-cni.profile" -}}
{{- coalesce .Values.profile .Values.global.profile | default "" -}}
{{- end -}}

{{/*
Istio's default ambient.enablementSelectors (its chart's values.yaml, 1.25 and later): the pod
labelled istio.io/dataplane-mode=ambient, or a pod not labelled none in a namespace so
labelled. The agent's default too: AMBIENT_ENABLEMENT_SELECTOR is rendered only for others.
*/}}
{{- define "redirect-cni.ambientSelectors" -}}
- podSelector:
    matchLabels: {istio.io/dataplane-mode: ambient}
- podSelector:
    matchExpressions:
      - {key: istio.io/dataplane-mode, operator: NotIn, values: [none]}
  namespaceSelector:
    matchLabels: {istio.io/dataplane-mode: ambient}
{{- end -}}

{{/*
The platform: platform at the top level, else global.platform, as Istio's chart picks its
platform profile; profile=openshift (Istio's older profile, and OpenShift Service Mesh's) is
openshift too.
*/}}
{{- define "redirect-cni.platform" -}}
{{- $profile := include "redirect-cni.profile" . -}}
{{- coalesce .Values.platform .Values.global.platform (ternary "openshift" "" (eq $profile "openshift")) | default "" -}}
{{- end -}}

{{/*
What Istio's platform profiles set (its manifests/helm-profiles/platform-<name>.yaml), as
{cni: ..., top: ...}: the cni part goes under the user's cni. values and over the top level (as
Istio's chart copies its cni over the top level after the profile is merged); the top part
under the user's top-level values. An unknown platform fails, as in Istio's chart.
*/}}
{{- define "redirect-cni.platformValues" -}}
{{- $platform := include "redirect-cni.platform" . -}}
{{- $k3s := "/var/lib/rancher/k3s/agent/etc/cni/net.d" -}}
{{- if eq $platform "" -}}
{}
{{- else if eq $platform "gke" -}}
cni: {cniBinDir: "", resourceQuotas: {enabled: true}}
top: {resourceQuotas: {enabled: true}}
{{- else if eq $platform "k3d" -}}
cni: {cniConfDir: {{ $k3s }}, cniBinDir: /bin}
{{- else if eq $platform "k3s" -}}
cni: {cniConfDir: {{ $k3s }}, cniBinDir: /var/lib/rancher/k3s/data/cni}
{{- else if eq $platform "microk8s" -}}
cni: {cniConfDir: /var/snap/microk8s/current/args/cni-network, cniBinDir: /var/snap/microk8s/current/opt/cni/bin}
{{- else if eq $platform "minikube" -}}
cni: {cniNetnsDir: /var/run/docker/netns}
{{- else if eq $platform "openshift" -}}
cni: {cniBinDir: /var/lib/cni/bin, cniConfDir: /etc/cni/multus/net.d, chained: false, cniConfFileName: istio-cni.conf, provider: multus}
top: {seLinuxOptions: {type: spc_t}}
{{- else -}}
{{- fail (printf "global.platform=%s: unknown platform; Istio's are gke, k3d, k3s, microk8s, minikube and openshift (or leave it unset and set cniBinDir, cniConfDir yourself)" $platform) -}}
{{- end -}}
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
The installer's settings (the ConfigMap's data), as YAML; the NetworkAttachmentDefinition takes
its name from CNI_NETWORK_NAME.
*/}}
{{- define "redirect-cni.configData" -}}
{{- $cni := include "redirect-cni.cni" . | fromYaml }}
{{- $data := dict }}
{{- /* Chained, or standalone (Multus), and the file: standalone defaults to redirect-cni.conf. */}}
{{- $_ := set $data "CHAINED_CNI_PLUGIN" (toString $cni.chained) }}
{{- $_ := set $data "CNI_CONF_NAME" ($cni.cniConfFileName | default (ternary "" "redirect-cni.conf" $cni.chained)) }}
{{- if and $cni.chained $cni.istioOwnedCNIConfig }}
{{- /* Our own list beside the primary's file, as Istio's chart says it. */}}
{{- $_ := set $data "ISTIO_OWNED_CNI_CONFIG" "true" }}
{{- $_ := set $data "ISTIO_OWNED_CNI_CONF_FILENAME" (toString ($cni.istioOwnedCNIConfigFileName | default "")) }}
{{- end }}
{{- if not $cni.chained }}
{{- /* The standalone file's mode: 0600 ("true": 0640). */}}
{{- $_ := set $data "CNI_CONF_GROUP_READ" "false" }}
{{- /* Its network's name, Istio's: Multus runs the file for an attachment of that name that
       has no config (Istio's injector asks for istio-cni). */}}
{{- $_ := set $data "CNI_NETWORK_NAME" "istio-cni" }}
{{- end }}
{{- /* The host's directories as the DaemonSet mounts them (under /host), and as the host sees
       the net dir (for messages). */}}
{{- $_ := set $data "MOUNTED_CNI_NET_DIR" (printf "/host%s" (clean $cni.cniConfDir)) }}
{{- $_ := set $data "CNI_NET_DIR" (clean $cni.cniConfDir) }}
{{- $_ := set $data "CNI_BIN_DIR" (printf "/host%s" (clean $cni.cniBinDir)) }}
{{- /* Shared with the plugin at the same path on the host: the kubeconfig and the install record. */}}
{{- $_ := set $data "CNI_AGENT_RUN_DIR" "/var/run/redirect-cni" }}
{{- $_ := set $data "KUBECONFIG_MODE" "0600" }}
{{- /* Fields of the plugin's entry. */}}
{{- $_ := set $data "EXCLUDE_NAMESPACES" (join "," $cni.excludeNamespaces) }}
{{- $_ := set $data "PLUGIN_LOG_LEVEL" $cni.pluginLogLevel }}
{{- /* The agent's own levels and Istio's JSON lines, only when not the default. */}}
{{- if ne $cni.logOutputLevel "info" }}
{{- $_ := set $data "LOG_OUTPUT_LEVEL" $cni.logOutputLevel }}
{{- end }}
{{- if (.Values.global | default dict).logAsJson }}
{{- $_ := set $data "LOG_AS_JSON" "true" }}
{{- end }}
{{- /* Istio's plugin fields, into the entry as Istio's installer writes them. */}}
{{- if (.Values.global | default dict).nativeNftables }}
{{- $_ := set $data "NATIVE_NFTABLES" "true" }}
{{- end }}
{{- if and $cni.ambient.enabled $cni.ambient.enableAmbientDetectionRetry }}
{{- $_ := set $data "ENABLE_AMBIENT_DETECTION_RETRY" "true" }}
{{- end }}
{{- /* More fields of the plugin's entry: in ambient mode the plugin asks the agent at ADD
       (<run dir>/ambient.sock) to enroll the pod. */}}
{{- $pluginConfig := dict }}
{{- if $cni.ambient.enabled }}
{{- $_ := set $pluginConfig "ambient_enabled" true }}
{{- end }}
{{- $_ := set $data "PLUGIN_CONFIG_JSON" (toJson $pluginConfig) }}
{{- /* On SIGTERM remove exactly what was installed. */}}
{{- $_ := set $data "CLEANUP_ON_EXIT" "true" }}
{{- /* The repair controller: the first of the three modes that is "true" acts. */}}
{{- $_ := set $data "REPAIR_ENABLED" (toString $cni.repair.enabled) }}
{{- $_ := set $data "REPAIR_REPAIR_PODS" (toString $cni.repair.repairPods) }}
{{- $_ := set $data "REPAIR_DELETE_PODS" (toString $cni.repair.deletePods) }}
{{- $_ := set $data "REPAIR_LABEL_PODS" (toString $cni.repair.labelPods) }}
{{- $handBack := include "redirect-cni.handBack" . }}
{{- if ne $handBack "off" }}
{{- $_ := set $data "HAND_BACK_ON_UNINSTALL" $handBack }}
{{- end }}
{{- $adopt := include "redirect-cni.adoptIstio" . }}
{{- if ne $adopt "replace" }}
{{- $_ := set $data "ADOPT_ISTIO" $adopt }}
{{- end }}
{{- /* These three only when they differ from the installer's own default, so that the default
       ConfigMap is the plain manifest's. */}}
{{- range $key, $v := dict
      "REPAIR_INIT_CONTAINER_NAME" (list $cni.repair.initContainerName "istio-validation")
      "REPAIR_BROKEN_POD_LABEL_KEY" (list $cni.repair.brokenPodLabelKey "cni.istio.io/uninitialized")
      "REPAIR_BROKEN_POD_LABEL_VALUE" (list (toString $cni.repair.brokenPodLabelValue) "true") }}
{{- if ne (index $v 0) (index $v 1) }}
{{- $_ := set $data $key (index $v 0) }}
{{- end }}
{{- end }}
{{- $_ := set $data "UNTAINT_NODE" (toString $cni.untaintNode) }}
{{- /* Ambient mode (docs/ambient.md): only when on, so that the default ConfigMap is the plain
       manifest's. ztunnel's socket stays at the agent's default, ZTUNNEL_UDS_ADDRESS
       /var/run/ztunnel/ztunnel.sock, in the folder the DaemonSet mounts. */}}
{{- if $cni.ambient.enabled }}
{{- $_ := set $data "AMBIENT_ENABLED" "true" }}
{{- $_ := set $data "AMBIENT_DNS_CAPTURE" (toString $cni.ambient.dnsCapture) }}
{{- $_ := set $data "AMBIENT_IPV6" (toString $cni.ambient.ipv6) }}
{{- $_ := set $data "AMBIENT_RECONCILE_POD_RULES_ON_STARTUP" (toString $cni.ambient.reconcileIptablesOnStartup) }}
{{- /* Istio's selectors as JSON (which is YAML, as Istio's agent reads it); left out at
       Istio's default, the agent's own. A null or absent list is the default; [] enrolls none,
       as with Istio. */}}
{{- $selectors := $cni.ambient.enablementSelectors }}
{{- if and (not (kindIs "invalid" $selectors)) (ne (toJson $selectors) (include "redirect-cni.ambientSelectors" $ | fromYamlArray | toJson)) }}
{{- $_ := set $data "AMBIENT_ENABLEMENT_SELECTOR" (toJson $selectors) }}
{{- end }}
{{- end }}
{{- /* Any other installer variable; it wins over the above. In ambient mode a
       PLUGIN_CONFIG_JSON of env is merged over {"ambient_enabled": true}, its keys winning, so
       that adding a field (log_file) does not turn the plugin's side of ambient mode off. */}}
{{- range $key, $v := $cni.env }}
{{- if and (eq $key "PLUGIN_CONFIG_JSON") $cni.ambient.enabled }}
{{- $text := toString $v }}
{{- $obj := fromJson $text }}
{{- if and (hasKey $obj "Error") (not (contains "\"Error\"" $text)) }}
{{- fail (printf "env.PLUGIN_CONFIG_JSON=%s: not a JSON object (%s); with ambient mode on, the chart merges it over {\"ambient_enabled\": true}" $text $obj.Error) }}
{{- end }}
{{- $_ := set $data $key (mustMergeOverwrite (dict "ambient_enabled" true) $obj | toJson) }}
{{- else }}
{{- $_ := set $data $key (toString $v) }}
{{- end }}
{{- end }}
{{- toYaml $data }}
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

{{/* The labels of every object: the name the plain manifests use, and Istio's istio.io/rev
     when a revision is given. */}}
{{- define "redirect-cni.labels" -}}
app.kubernetes.io/name: redirect-cni
{{- with (include "redirect-cni.cni" . | fromYaml).revision }}
istio.io/rev: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The DaemonSet's selector (immutable): the name alone, whatever the revision. */}}
{{- define "redirect-cni.selectorLabels" -}}
app.kubernetes.io/name: redirect-cni
{{- end -}}

{{/* "true" when global.resourceScope renders objects of this kind ("namespace" or
     "cluster"), as Istio's chart: all renders both, an unknown scope neither. */}}
{{- define "redirect-cni.renders" -}}
{{- $scope := (index . 0).Values.global.resourceScope | default "all" -}}
{{- if or (eq $scope "all") (eq $scope (index . 1)) -}}
true
{{- end -}}
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
{{- with $cni.psp_cluster_role -}}
{{- fail (printf "psp_cluster_role=%s: PodSecurityPolicy was removed in Kubernetes 1.25; a RoleBinding to a PodSecurityPolicy role would grant nothing, so this chart makes none: leave psp_cluster_role out. Where Pod Security Admission enforces a level, the release's namespace needs pod-security.kubernetes.io/enforce=privileged (host paths, host network, capabilities). On an older cluster that still enforces PodSecurityPolicy, bind the role yourself: kubectl -n %s create rolebinding redirect-cni-psp --clusterrole=%s --serviceaccount=%s:redirect-cni" . $.Release.Namespace . $.Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{- /* HAND_BACK_ON_UNINSTALL: cni.handBackOnUninstall, off, as-adopted, iptables-nft or nftables
       (iptables-legacy cannot be written from the agent's image, and says so). */ -}}
{{- define "redirect-cni.handBack" -}}
{{- $cni := include "redirect-cni.cni" . | fromYaml -}}
{{- $given := toString ($cni.handBackOnUninstall | default "off") -}}
{{- if not (has $given (list "off" "as-adopted" "iptables-nft" "nftables")) -}}
{{- fail (printf "cni.handBackOnUninstall is %q: it must be off, as-adopted, iptables-nft or nftables (iptables-legacy cannot be written from the agent's image: install Istio's CNI on iptables-nft or with values.global.nativeNftables=true)" $given) -}}
{{- end -}}
{{- $given -}}
{{- end -}}

{{- /* ADOPT_ISTIO: cni.adoptIstio, or with none, replace where the container has in-place
       rights anyway (repair mode repair, ambient mode) and off otherwise. */ -}}
{{- define "redirect-cni.adoptIstio" -}}
{{- $cni := include "redirect-cni.cni" . | fromYaml -}}
{{- $given := toString ($cni.adoptIstio | default "") -}}
{{- if not (has $given (list "" "replace" "keep" "off")) -}}
{{- fail (printf "cni.adoptIstio is %q: it must be replace, keep or off (or empty for the mode's default)" $given) -}}
{{- end -}}
{{- if ne $given "" -}}
{{- $given -}}
{{- else if or (eq (include "redirect-cni.repairMode" .) "repair") $cni.ambient.enabled -}}
replace
{{- else -}}
off
{{- end -}}
{{- end -}}

{{/*
The API version of the agents' FlowSchema and PriorityLevelConfiguration, or nothing when
flowControl.enabled is false or the cluster serves neither version: flowControl.apiVersion when
given, else flowcontrol.apiserver.k8s.io/v1 (Kubernetes 1.29+) when the cluster serves it, else
v1beta3 (1.26-1.28). v1beta3's nominalConcurrencyShares and lendablePercent mean what v1's do.
*/}}
{{- define "redirect-cni.flowControlVersion" -}}
{{- $fc := (include "redirect-cni.cni" . | fromYaml).flowControl | default dict -}}
{{- if or $fc.enabled (kindIs "invalid" $fc.enabled) -}}
{{- $given := $fc.apiVersion | default "" -}}
{{- if $given -}}
{{- $given -}}
{{- else if .Capabilities.APIVersions.Has "flowcontrol.apiserver.k8s.io/v1" -}}
flowcontrol.apiserver.k8s.io/v1
{{- else if .Capabilities.APIVersions.Has "flowcontrol.apiserver.k8s.io/v1beta3" -}}
flowcontrol.apiserver.k8s.io/v1beta3
{{- end -}}
{{- end -}}
{{- end -}}
