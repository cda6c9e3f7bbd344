#!/usr/bin/env bash
# Builds the redirect image (Containerfile: FROM scratch, the four static binaries in
# /usr/local/bin) with podman, offline, then tests it: runs `redirect-cni-node` from the image
# the way the DaemonSets in deploy/ run it, against temporary directories standing in for the
# node's CNI directories, and checks what docs/deploy/README.md says the installer does.
#
#   scripts/build-image.sh [options]
#
#   --bin-dir DIR      the static binaries (default "${CARGO_TARGET_DIR:-target}/static/x86_64",
#                      as scripts/build-static.sh leaves them; a relative CARGO_TARGET_DIR is taken
#                      from the current directory, as cargo does, the default `target` from the
#                      repository's root)
#   --tag NAME         the image's name (default localhost/redirect:dev)
#   --test-only        do not build: test the image NAME as it is (built before, or elsewhere)
#   --build-only       build, check the image's contents, and stop there
#   --mode MODE        kubernetes | openshift | all (default all): whose settings the installer
#                      runs with, the ConfigMap of deploy/MODE/redirect-cni.yaml (chained into
#                      an existing .conflist, or OpenShift's standalone Multus config)
#   --timeout SECONDS  how long the installer gets to put everything in place (default 60)
#   --rm-image         remove the image at the end (default: keep it, tagged NAME)
#   --keep-temp        keep the temporary directories (printed at the end) for a look
#
# Environment: PODMAN_RUNTIME (crun, runc, ...) and PODMAN_STORAGE_DRIVER (overlay, vfs, ...)
# replace what the script picks (see "podman" below). Nothing under /etc is changed.
#
# Needs root to install what is missing (podman, runc on cgroup v1, jq) with apt-get; runs
# `apt-get update` once only when an install fails without it. No registry is contacted: the
# image is FROM scratch, every podman command runs with --pull=never, and the containers with
# --network=none.
#
# Exit status: 0 when every step passed; 1 with a `FAIL:` line naming the step otherwise; 2 on a
# bad option.
set -euo pipefail

START=$SECONDS
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TAG=localhost/redirect:dev
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
  BIN_DIR="$CARGO_TARGET_DIR/static/x86_64"
else
  BIN_DIR="$REPO/target/static/x86_64"
fi
BUILD=1 TEST=1 MODE=all TIMEOUT=60 RM_IMAGE=0 KEEP_TEMP=0
BINS=(redirect-cni redirect-cni-node redirect-init redirect-validate)
# What the image's binaries are called by (the manifests' and docs' command paths).
IMAGE_BIN=/usr/local/bin

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) BIN_DIR=${2:?--bin-dir needs a directory}; shift ;;
    --tag) TAG=${2:?--tag needs a name}; shift ;;
    --test-only) BUILD=0 ;;
    --build-only) TEST=0 ;;
    --mode) MODE=${2:?--mode needs kubernetes, openshift or all}; shift ;;
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift ;;
    --rm-image) RM_IMAGE=1 ;;
    --keep-temp) KEEP_TEMP=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$MODE" in
  all) MODES=(kubernetes openshift) ;;
  kubernetes | openshift) MODES=("$MODE") ;;
  *) echo "--mode: kubernetes, openshift or all, not $MODE" >&2; exit 2 ;;
esac
case "$TIMEOUT" in '' | *[!0-9]*) echo "--timeout: a number of seconds, not $TIMEOUT" >&2; exit 2 ;; esac
if [ "$BUILD" = 0 ] && [ "$TEST" = 0 ]; then
  echo "--test-only and --build-only together leave nothing to do" >&2; exit 2
fi

log() { printf '[build-image] %s\n' "$*" >&2; }
fail() { printf '[build-image] FAIL: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

# ---- what is needed, installed with apt-get when missing ------------------------------------

# The OCI runtime. crun (podman's default on Debian) refuses a hybrid cgroup hierarchy (v1 plus
# a cgroup2 mount with controllers: "cgroups in hybrid mode not supported"); runc handles v1,
# hybrid and v2. So: podman's default on a pure cgroup v2 host, runc otherwise.
RUNTIME=${PODMAN_RUNTIME:-}
if [ -z "$RUNTIME" ] && [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ]; then
  RUNTIME=runc
fi

need=()
have podman || need+=(podman)
have jq || need+=(jq)
if [ -n "$RUNTIME" ] && ! have "$RUNTIME"; then need+=("$RUNTIME"); fi
if ((${#need[@]})); then
  if [ "$(id -u)" != 0 ] || ! have apt-get; then
    fail "missing: ${need[*]}; install them (Debian: apt-get install --no-install-recommends ${need[*]}) or run this as root on Debian/Ubuntu"
  fi
  log "installing ${need[*]} (apt-get, no recommends)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1; then
    log "apt-get install failed; running apt-get update once and retrying"
    apt-get update -qq >/dev/null 2>&1 || fail "apt-get update failed: cannot install ${need[*]}"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
      || fail "apt-get install ${need[*]} failed"
  fi
fi

# ---- podman's options for this machine -------------------------------------------------------

PODMAN=(podman)
# Without systemd as init (a container, a VM started by a plain init), podman can use neither
# systemd's cgroup manager nor journald for its events.
if [ ! -d /run/systemd/system ]; then
  PODMAN+=(--cgroup-manager=cgroupfs --events-backend=file)
fi
[ -n "$RUNTIME" ] && PODMAN+=(--runtime="$RUNTIME")
if [ -n "${PODMAN_STORAGE_DRIVER:-}" ]; then
  PODMAN+=(--storage-driver="$PODMAN_STORAGE_DRIVER")
fi
if ! info_err=$("${PODMAN[@]}" info 2>&1 >/dev/null); then
  # overlay is the default; a kernel or backing filesystem without it can fall back to vfs when
  # the store is still empty (an existing store keeps the driver it was created with).
  if [ -z "${PODMAN_STORAGE_DRIVER:-}" ] && "${PODMAN[@]}" --storage-driver=vfs info >/dev/null 2>&1; then
    log "podman's default storage driver does not work here; using vfs (${info_err%%$'\n'*})"
    PODMAN+=(--storage-driver=vfs)
  else
    printf '%s\n' "$info_err" >&2
    fail "podman cannot run on this machine ('${PODMAN[*]} info' failed, above); a store keeps the storage driver it was created with (unset PODMAN_STORAGE_DRIVER, or pick that one); otherwise run this as root, or as a user set up for rootless podman (subuid/subgid)"
  fi
fi

# Options of every container. The installer runs as the DaemonSet runs it: root, no privilege
# escalation, a read-only root filesystem, and here no network at all. Also no capability: the
# DaemonSet's NET_ADMIN, SYS_ADMIN and SYS_PTRACE (and its /proc and /var/run/netns mounts) are
# for repairing pods in place, which needs an API server; the installer must work without them.
RUN_OPTS=(--pull=never --network=none)
# The bind mounts are temporary directories: no SELinux relabelling (a no-op without SELinux).
RUN_OPTS+=(--security-opt=label=disable)
# Podman asks for 1048576 open files by default; a host whose hard limit is lower, where root
# lacks CAP_SYS_RESOURCE to raise it, makes the runtime fail ("setrlimit RLIMIT_NOFILE: Operation
# not permitted"). Then ask for what this host allows. Any --ulimit also drops podman's default
# nproc (pid_max, to which podman lowers its own limit) for 1048576, which fails the same way:
# give podman's default explicitly.
nofile=$(ulimit -Hn)
if [ "$nofile" != unlimited ] && [ "$nofile" -lt 1048576 ]; then
  nproc=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 32768)
  hard_nproc=$(ulimit -Hu)
  if [ "$hard_nproc" != unlimited ] && [ "$hard_nproc" -lt "$nproc" ]; then nproc=$hard_nproc; fi
  RUN_OPTS+=(--ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")
fi
SECURE_OPTS=(--user=0:0 --cap-drop=all --security-opt=no-new-privileges
  --read-only --read-only-tmpfs=false)

log "podman: ${PODMAN[*]}; containers: ${RUN_OPTS[*]}"

# ---- cleanup ----------------------------------------------------------------------------------

WORK=$(mktemp -d /tmp/build-image.XXXXXX)
CONTAINERS=()
STARTED=0 # whether an installer test started (its messages name directories under $WORK)
cleanup() {
  local rc=$? c
  for c in "${CONTAINERS[@]}"; do
    "${PODMAN[@]}" rm -f -t 0 "$c" >/dev/null 2>&1 || true
  done
  if [ "$RM_IMAGE" = 1 ]; then
    "${PODMAN[@]}" rmi "$TAG" >/dev/null 2>&1 && log "removed the image $TAG"
  fi
  if [ "$KEEP_TEMP" = 1 ]; then
    log "kept the temporary directories in $WORK"
  else
    rm -rf "$WORK"
  fi
  if [ "$rc" = 0 ]; then
    log "done in $((SECONDS - START))s"
  else
    log "failed after $((SECONDS - START))s$([ "$KEEP_TEMP" = 1 ] || [ "$STARTED" = 0 ] || echo " (--keep-temp keeps the directories named above)")"
  fi
}
trap cleanup EXIT

# ---- build ------------------------------------------------------------------------------------

if [ "$BUILD" = 1 ]; then
  [ -d "$BIN_DIR" ] || fail "no directory $BIN_DIR: build the static binaries first (scripts/build-static.sh), or pass --bin-dir"
  BIN_DIR=$(cd "$BIN_DIR" && pwd)
  for b in "${BINS[@]}"; do
    f="$BIN_DIR/$b"
    [ -f "$f" ] || fail "$f is missing: build the static binaries first (scripts/build-static.sh)"
    [ -x "$f" ] || fail "$f is not executable"
    # FROM scratch has no dynamic loader: a dynamic binary would fail there with "no such file".
    if have readelf && readelf -lW "$f" 2>/dev/null | grep -q 'Requesting program interpreter'; then
      fail "$f is dynamically linked (it names a program interpreter); the image has no libc: use the static build"
    fi
  done
  version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)
  old_id=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
  log "building $TAG from $BIN_DIR (version ${version:-unknown})"
  # --layers=false: no intermediate images; FROM scratch pulls nothing, --pull=never makes sure.
  if ! "${PODMAN[@]}" build --pull=never --network=none --layers=false \
      --build-arg "VERSION=${version:-unknown}" -f "$REPO/Containerfile" -t "$TAG" "$BIN_DIR" \
      >"$WORK/build.log" 2>&1; then
    cat "$WORK/build.log" >&2
    fail "podman build failed (above)"
  fi
  new_id=$("${PODMAN[@]}" image inspect --format '{{.Id}}' "$TAG")
  # The image this tag named before, now nameless: remove it (unless a container still uses it).
  if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    "${PODMAN[@]}" rmi "$old_id" >/dev/null 2>&1 || true
  fi
fi

# ---- the image's contents ---------------------------------------------------------------------

"${PODMAN[@]}" image exists "$TAG" || fail "there is no image $TAG (build it, or drop --test-only)"
size=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$TAG")
log "image $TAG: id $("${PODMAN[@]}" image inspect --format '{{.Id}}' "$TAG" | cut -c1-12), $size bytes"

# Every file in the image, from a container that is created and never started.
cid=$("${PODMAN[@]}" create --pull=never "$TAG" "$IMAGE_BIN/redirect-cni") \
  || fail "podman create $TAG failed"
CONTAINERS+=("$cid")
mkdir -p "$WORK/image"
"${PODMAN[@]}" export "$cid" >"$WORK/image.tar" || fail "podman export of $TAG failed"
"${PODMAN[@]}" rm "$cid" >/dev/null
tar -tvf "$WORK/image.tar" >"$WORK/image.list"
tar -xf "$WORK/image.tar" -C "$WORK/image" --no-same-owner
files=$(tar -tf "$WORK/image.tar" | grep -v '/$' | sed 's|^\./||' | sort | tr '\n' ' ')
want=$(printf 'usr/local/bin/%s\n' "${BINS[@]}" | sort | tr '\n' ' ')
if [ "$files" != "$want" ]; then
  cat "$WORK/image.list" >&2
  fail "the image should hold exactly ${want}but holds: $files"
fi
for b in "${BINS[@]}"; do
  f="$WORK/image/usr/local/bin/$b"
  [ "$(stat -c %a "$f")" = 755 ] || fail "$IMAGE_BIN/$b in the image has mode $(stat -c %a "$f"), not 0755"
  if [ "$BUILD" = 1 ]; then
    cmp -s "$f" "$BIN_DIR/$b" || fail "$IMAGE_BIN/$b in the image differs from $BIN_DIR/$b"
  fi
done
not_root=$(awk '$2 != "0/0" { print $NF }' "$WORK/image.list" | tr '\n' ' ')
[ -z "$not_root" ] || fail "not owned by root (0/0) in the image: $not_root"
licenses=$("${PODMAN[@]}" image inspect --format '{{index .Config.Labels "org.opencontainers.image.licenses"}}' "$TAG")
[ "$licenses" = Apache-2.0 ] || fail "label org.opencontainers.image.licenses is '$licenses', not Apache-2.0"
log "contents: ${files}(mode 0755, root), no shell; labels ok"

if [ "$TEST" = 0 ]; then
  exit 0
fi

# ---- each binary runs -------------------------------------------------------------------------

run_once() { # run_once DESCRIPTION ARGS... : one container, output in $out
  local what=$1; shift
  if ! out=$("${PODMAN[@]}" run --rm "${RUN_OPTS[@]}" "${SECURE_OPTS[@]}" "$@" 2>&1); then
    printf '%s\n' "$out" >&2
    case "$out" in
      *"OCI runtime"* | *crun:* | *runc:* | *conmon* | *cgroup*)
        fail "podman cannot start a container here ($what; runtime: ${RUNTIME:-the default}); the error above names the reason. Try PODMAN_RUNTIME=runc or crun, or check cgroups" ;;
      *) fail "$what failed (above)" ;;
    esac
  fi
}
run_once "redirect-cni as a CNI plugin (CNI_COMMAND=VERSION)" -e CNI_COMMAND=VERSION "$TAG" "$IMAGE_BIN/redirect-cni"
case "$out" in *supportedVersions*) ;; *) printf '%s\n' "$out" >&2; fail "redirect-cni VERSION printed no supportedVersions" ;; esac
run_once "redirect-cni-node --help" "$TAG" "$IMAGE_BIN/redirect-cni-node" --help
run_once "redirect-cni install --help (runs redirect-cni-node)" "$TAG" "$IMAGE_BIN/redirect-cni" install --help
run_once "redirect-init --help" "$TAG" "$IMAGE_BIN/redirect-init" --help
run_once "redirect-validate --help" "$TAG" "$IMAGE_BIN/redirect-validate" --help
log "the four binaries run in the image (--network=none, no capability, read-only root)"

# ---- the installer, as the DaemonSet runs it --------------------------------------------------

# The ConfigMap's variables of a manifest, KEY=VALUE per line (its `data:` block: one plain or
# quoted scalar per key).
configmap_env() {
  awk '
    /^---/ { cm = 0; data = 0; next }
    /^kind: ConfigMap/ { cm = 1 }
    cm && /^data:/ { data = 1; next }
    cm && data && /^[^ #]/ { data = 0 }
    cm && data && /^  [A-Z_][A-Z0-9_]*:/ {
      line = $0; sub(/^  /, "", line)
      key = line; sub(/:.*/, "", key)
      val = line; sub(/^[^:]*:[ ]*/, "", val); sub(/[ ]+#.*$/, "", val)
      if (val ~ /^".*"$/ || val ~ /^'\''.*'\''$/) val = substr(val, 2, length(val) - 2)
      print key "=" val
    }' "$1"
}

# The DaemonSet container's own variables (its `env:` list), NAME=VALUE per line: a `value:` as
# it is, a downward API `fieldRef` as NAME=fieldRef:PATH (the scenario fills those in as kubelet
# would for the pod).
daemonset_env() {
  awk '
    /^---/ { ds = 0; env = 0; next }
    /^kind: DaemonSet/ { ds = 1 }
    ds && /^ *env:[ ]*$/ { env = 1; match($0, /^ */); indent = RLENGTH; name = ""; next }
    ds && env {
      if ($0 ~ /^[ ]*$/ || $0 ~ /^[ ]*#/) next
      match($0, /^ */)
      if (RLENGTH <= indent) { env = 0; next }
      line = $0; sub(/^ */, "", line); sub(/[ ]+#.*$/, "", line)
      if (line ~ /^- name: /) { name = line; sub(/^- name: */, "", name); next }
      if (line ~ /^value: /) {
        val = line; sub(/^value: */, "", val)
        if (val ~ /^".*"$/ || val ~ /^'\''.*'\''$/) val = substr(val, 2, length(val) - 2)
        print name "=" val; next
      }
      if (line ~ /^fieldPath: /) { path = line; sub(/^fieldPath: */, "", path); print name "=fieldRef:" path }
    }' "$1"
}

# The DaemonSet's command: its `command: [...]` line, a JSON array.
manifest_command() {
  sed -n 's/^ *command: *\(\[.*\]\) *$/\1/p' "$1" | head -1 | jq -r '.[]'
}

# Every file and directory under $1: path, type, mode, owner, and a hash of the contents.
snapshot() {
  (cd "$1" && find . -printf '%p %y %m %U:%G\n' | sort | while read -r p t m o; do
    if [ "$t" = f ]; then
      printf '%s %s %s %s %s\n' "$p" "$t" "$m" "$o" "$(sha256sum <"$p" | cut -c1-64)"
    else
      printf '%s %s %s %s\n' "$p" "$t" "$m" "$o"
    fi
  done)
}

# What the downward API gives the DaemonSet's pod (its fieldRef variables) in this test.
POD_NAMESPACE=redirect-system
NODE_NAME=node-a
API_HOST=10.96.0.1
TOKEN="test-token-$RANDOM$RANDOM"

scenario() {
  local mode=$1 manifest="$REPO/deploy/$1/redirect-cni.yaml"
  local dir="$WORK/$mode" host="$WORK/$mode/host" name="redirect-image-test-$mode-$$"
  [ -f "$manifest" ] || fail "$manifest is missing"
  STARTED=1
  mkdir -p "$host"

  # The installer's settings: the manifest's ConfigMap, then the container's own env (which wins
  # in Kubernetes too), its downward API fields (POD_NAMESPACE, POD_NAME, NODE_NAME) filled in as kubelet
  # would, and what kubelet gives every pod (KUBERNETES_SERVICE_*, the service account's token
  # and CA). With NODE_NAME the repair controller starts; with no network it cannot reach
  # $API_HOST and logs that it retries, which is expected here.
  local -A cfg=()
  local kv k v
  while IFS= read -r kv; do cfg[${kv%%=*}]=${kv#*=}; done < <(configmap_env "$manifest")
  while IFS= read -r kv; do
    k=${kv%%=*} v=${kv#*=}
    case "$v" in
      fieldRef:metadata.namespace) v=$POD_NAMESPACE ;;
      fieldRef:spec.nodeName) v=$NODE_NAME ;;
      fieldRef:metadata.name) v=$name ;;
      fieldRef:*) fail "$manifest: $k comes from ${v#fieldRef:}, which this test does not fill in" ;;
    esac
    cfg[$k]=$v
  done < <(daemonset_env "$manifest")
  for k in MOUNTED_CNI_NET_DIR CNI_BIN_DIR CNI_AGENT_RUN_DIR CHAINED_CNI_PLUGIN; do
    [ -n "${cfg[$k]:-}" ] || fail "$manifest: the ConfigMap sets no $k"
  done
  local -a cmd=()
  mapfile -t cmd < <(manifest_command "$manifest")
  [ "${#cmd[@]}" -gt 0 ] || fail "$manifest: no DaemonSet command found"
  [ "${cmd[0]}" = "$IMAGE_BIN/redirect-cni-node" ] \
    || fail "$manifest runs ${cmd[0]}, but the image holds $IMAGE_BIN/redirect-cni-node"

  [ -n "${cfg[POD_NAMESPACE]:-}" ] || fail "$manifest: the DaemonSet sets no POD_NAMESPACE"
  local -a env_opts=(-e "KUBERNETES_SERVICE_HOST=$API_HOST" -e KUBERNETES_SERVICE_PORT=443)
  for k in "${!cfg[@]}"; do env_opts+=(-e "$k=${cfg[$k]}"); done

  # The host: bin dirs with another plugin in them, the net dir, the run dir; each mounted where
  # the ConfigMap says (the manifest's volumeMounts). The host side of each is under $host.
  local -a mounts=() bin_dirs=()
  local net="$host/net.d" run="$host/run" d i=0
  IFS=, read -ra bin_dirs <<<"${cfg[CNI_BIN_DIR]}"
  local -a host_bins=()
  for d in "${bin_dirs[@]}"; do
    d=$(echo "$d" | tr -d ' ')
    [ -n "$d" ] || continue
    host_bins+=("$host/bin$i")
    mkdir -p "$host/bin$i"
    printf '#!/bin/sh\n# another CNI plugin\n' >"$host/bin$i/bridge"
    chmod 0755 "$host/bin$i/bridge"
    mounts+=(-v "$host/bin$i:$d")
    i=$((i + 1))
  done
  mkdir -p "$net" "$run" "$dir/sa"
  mounts+=(-v "$net:${cfg[MOUNTED_CNI_NET_DIR]}" -v "$run:${cfg[CNI_AGENT_RUN_DIR]}")
  printf '%s' "$TOKEN" >"$dir/sa/token"
  # A real CA (throwaway, self-signed) when openssl is here: the node agent then builds its API
  # client and starts the repair controller, which cannot reach $API_HOST with no network and
  # retries until SIGTERM. Otherwise a placeholder, and the agent logs that it has no client.
  if ! { have openssl && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -days 1 -subj /CN=redirect-image-test-ca -keyout "$dir/ca.key" -out "$dir/sa/ca.crt" \
      >/dev/null 2>&1; }; then
    printf -- '-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n' >"$dir/sa/ca.crt"
  fi
  rm -f "$dir/ca.key"
  printf '%s' "$POD_NAMESPACE" >"$dir/sa/namespace"
  mounts+=(-v "$dir/sa:/var/run/secrets/kubernetes.io/serviceaccount:ro")

  local chained=${cfg[CHAINED_CNI_PLUGIN]} target conf_mode
  case "$chained" in 1 | t | T | TRUE | true | True) chained=true ;; *) chained=false ;; esac
  if [ "$chained" = true ]; then
    # The node's primary CNI config, the runtime's choice (first by name) or CNI_CONF_NAME, and a
    # second one that must stay untouched. Hand-formatted, so that a byte-for-byte restore means
    # something.
    target="$net/${cfg[CNI_CONF_NAME]:-10-primary.conflist}"
    case "$target" in
      *.conflist) ;;
      *) fail "$manifest: CNI_CONF_NAME=${cfg[CNI_CONF_NAME]}: this test chains into a .conflist only" ;;
    esac
    cat >"$target" <<'EOF'
{ "cniVersion": "1.0.0", "name": "primary",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ],
  "zz-extra": 1 }
EOF
    chmod 0644 "$target"
    printf '{"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "loopback"}]}\n' \
      >"$net/zz-other.conflist"
  else
    # A config of another network in Multus's directory, to be left alone.
    printf '{"cniVersion": "1.0.0", "name": "other", "type": "loopback"}\n' >"$net/00-other.conf"
    target="$net/${cfg[CNI_CONF_NAME]:-redirect-cni.conf}"
    conf_mode=600
    [ "${cfg[CNI_CONF_GROUP_READ]:-false}" != true ] || conf_mode=640
  fi
  [ "$chained" != true ] || cp -p "$target" "$dir/original.conflist"
  snapshot "$host" >"$dir/before"

  log "[$mode] starting ${cmd[*]} (chained=$chained), host dirs under $host"
  "${PODMAN[@]}" run -d --name "$name" "${RUN_OPTS[@]}" "${SECURE_OPTS[@]}" \
    "${env_opts[@]}" "${mounts[@]}" "$TAG" "${cmd[@]}" >/dev/null \
    || fail "[$mode] podman run of the installer failed"
  CONTAINERS+=("$name")

  # What the installer must have done (docs/deploy/README.md, "What the installer does").
  local kubeconfig="$run/redirect-cni-kubeconfig" state="$run/redirect-cni-install-state.json"
  local kc_mode=${cfg[KUBECONFIG_MODE]:-0600}
  kc_mode=$((8#${kc_mode#0o}))
  kc_mode=$(printf '%o' "$kc_mode")
  local ca_b64
  ca_b64=$(base64 -w0 <"$dir/sa/ca.crt")
  # The fields of our entry, from the same settings.
  local entry_filter
  # The entry's name is CNI_NETWORK_NAME, istio-cni unless set (Istio's, as Multus looks it up).
  entry_filter=$(jq -n --arg run "${cfg[CNI_AGENT_RUN_DIR]}" --arg ns "$POD_NAMESPACE" \
    --arg level "${cfg[PLUGIN_LOG_LEVEL]:-info}" --arg excl "${cfg[EXCLUDE_NAMESPACES]:-}" \
    --arg name "${cfg[CNI_NETWORK_NAME]:-istio-cni}" '
      {type: "redirect-cni", name: $name, log_level: $level,
       cni_agent_run_dir: $run, kubeconfig: ($run + "/redirect-cni-kubeconfig"),
       exclude_namespaces: ($excl | split(",") | map(gsub("^ +| +$"; "")) | map(select(. != ""))),
       pod_namespace: $ns}')
  installed() { # prints what is missing; status 0 when everything is in place
    local b
    for b in "${host_bins[@]}"; do
      [ -f "$b/redirect-cni" ] || { echo "no $b/redirect-cni"; return 1; }
      if [ ! -x "$b/redirect-cni" ] || [ "$(stat -c %a "$b/redirect-cni")" != 755 ]; then
        echo "$b/redirect-cni has mode $(stat -c %a "$b/redirect-cni"), not 0755"; return 1
      fi
      cmp -s "$b/redirect-cni" "$WORK/image$IMAGE_BIN/redirect-cni" \
        || { echo "$b/redirect-cni differs from the image's $IMAGE_BIN/redirect-cni"; return 1; }
    done
    [ -f "$kubeconfig" ] || { echo "no kubeconfig $kubeconfig"; return 1; }
    [ "$(stat -c %a "$kubeconfig")" = "$kc_mode" ] \
      || { echo "the kubeconfig has mode $(stat -c %a "$kubeconfig"), not $kc_mode"; return 1; }
    grep -qF "\"https://$API_HOST:443\"" "$kubeconfig" \
      || { echo "the kubeconfig does not name the server https://$API_HOST:443"; return 1; }
    grep -qF "$TOKEN" "$kubeconfig" || { echo "the kubeconfig lacks the service account's token"; return 1; }
    grep -qF "$ca_b64" "$kubeconfig" || { echo "the kubeconfig lacks the service account's ca.crt"; return 1; }
    [ -f "$target" ] || { echo "no CNI config $target"; return 1; }
    if [ "$chained" = true ]; then
      jq -e --argjson want "$entry_filter" --slurpfile orig "$dir/original.conflist" '
        (.plugins | map(select(.type == "redirect-cni")) | length) == 1
        and (.plugins[-1] | to_entries | map(select(.key as $k | $want | has($k))) | from_entries) == $want
        and .plugins[:-1] == $orig[0].plugins
        and del(.plugins) == ($orig[0] | del(.plugins))' "$target" >/dev/null 2>&1 \
        || { echo "$target does not hold the original plugins followed by our entry $entry_filter"; return 1; }
      [ "$(stat -c %a "$target")" = "$(stat -c %a "$dir/original.conflist")" ] \
        || { echo "$target changed its mode"; return 1; }
      [ -f "$state" ] || { echo "no install record $state"; return 1; }
    else
      jq -e --argjson want "$entry_filter" '
        .cniVersion == "1.0.0"
        and (to_entries | map(select(.key as $k | $want | has($k))) | from_entries) == $want' \
        "$target" >/dev/null 2>&1 \
        || { echo "$target is not the standalone config cniVersion 1.0.0 + $entry_filter"; return 1; }
      [ "$(stat -c %a "$target")" = "$conf_mode" ] \
        || { echo "$target has mode $(stat -c %a "$target"), not $conf_mode"; return 1; }
    fi
  }

  local deadline=$((SECONDS + TIMEOUT)) missing running
  while ! missing=$(installed); do
    running=$("${PODMAN[@]}" inspect --format '{{.State.Running}}' "$name" 2>/dev/null || echo false)
    if [ "$running" != true ] || [ "$SECONDS" -ge "$deadline" ]; then
      "${PODMAN[@]}" logs "$name" >&2 || true
      if [ "$running" != true ]; then
        fail "[$mode] the installer exited ($("${PODMAN[@]}" inspect --format 'exit code {{.State.ExitCode}}' "$name" 2>/dev/null)) before it was installed: $missing (its log above)"
      fi
      fail "[$mode] not installed after ${TIMEOUT}s: $missing (the installer's log above)"
    fi
    sleep 0.2
  done
  log "[$mode] installed: $(printf '%s ' "${host_bins[@]/%//redirect-cni}")(0755, = the image's), kubeconfig (0$kc_mode), $(basename "$target") $([ "$chained" = true ] && echo "with our entry last" || echo "(0$conf_mode)")"

  # SIGTERM, as kubelet stops the pod (terminationGracePeriodSeconds: 10, then SIGKILL).
  local grace
  grace=$(sed -n 's/^ *terminationGracePeriodSeconds: *\([0-9][0-9]*\).*/\1/p' "$manifest" | head -1)
  "${PODMAN[@]}" stop -t "${grace:-10}" "$name" >/dev/null || fail "[$mode] podman stop failed"
  local code
  code=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$name")
  "${PODMAN[@]}" logs "$name" >"$dir/installer.log" 2>&1 || true
  local agent="the repair controller did not start (its API client failed; see the log)"
  if grep -q 'starting the repair controller' "$dir/installer.log"; then
    agent="the repair controller ran for node ${cfg[NODE_NAME]:-?} (no API server here: it retried until SIGTERM)"
  fi
  if [ "$code" != 0 ]; then
    cat "$dir/installer.log" >&2
    [ "$code" != 137 ] || fail "[$mode] the installer did not exit within ${grace:-10}s of SIGTERM (killed)"
    fail "[$mode] the installer exited with $code after SIGTERM, not 0 (its log above)"
  fi

  # CLEANUP_ON_EXIT=false: "everything stays on the node".
  case "${cfg[CLEANUP_ON_EXIT]:-true}" in
    0 | f | F | FALSE | false | False)
      missing=$(installed) || { cat "$dir/installer.log" >&2
        fail "[$mode] CLEANUP_ON_EXIT=false, yet after SIGTERM: $missing (the installer's log above)"; }
      "${PODMAN[@]}" rm "$name" >/dev/null
      log "[$mode] SIGTERM: exit 0, everything left in place (CLEANUP_ON_EXIT=false); $agent"
      return 0 ;;
  esac

  # What it must have undone: its binaries, the kubeconfig, the config (chained: the original
  # bytes back; standalone: no file), the install record; nothing else touched.
  local b problems=()
  for b in "${host_bins[@]}"; do
    [ ! -e "$b/redirect-cni" ] || problems+=("$b/redirect-cni is still there")
  done
  [ ! -e "$kubeconfig" ] || problems+=("the kubeconfig $kubeconfig is still there")
  if [ "$chained" = true ]; then
    cmp -s "$target" "$dir/original.conflist" || problems+=("$target is not restored byte for byte")
  else
    [ ! -e "$target" ] || problems+=("the standalone config $target is still there")
  fi
  [ ! -e "$state" ] || problems+=("the install record $state is still there")
  snapshot "$host" >"$dir/after"
  if ! diff -u "$dir/before" "$dir/after" >"$dir/diff"; then
    problems+=("the host directories differ from before the installer ran (diff above)")
  fi
  if ((${#problems[@]})); then
    cat "$dir/installer.log" >&2
    [ ! -s "$dir/diff" ] || cat "$dir/diff" >&2
    fail "[$mode] after SIGTERM: $(printf '%s; ' "${problems[@]}")"
  fi
  "${PODMAN[@]}" rm "$name" >/dev/null
  log "[$mode] SIGTERM: exit 0, the host directories are exactly as before; $agent"
}

for m in "${MODES[@]}"; do
  scenario "$m"
done
log "image $TAG passed: build, contents, binaries, installer (${MODES[*]})$([ "$RM_IMAGE" = 1 ] || echo "; kept $TAG")"
