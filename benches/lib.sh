# Shell helpers the scripts in benches/ share (sourced, not run).

# median: the median of the numbers on stdin, one per line, rounded.
median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f", m}'; }

# delete_namespaces PREFIX: every namespace named PREFIX*, and its /etc/netns entry.
delete_namespaces() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^$1" || true); do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
}

# our_binaries ROOT: sets BIN to the directory of our three binaries: REDIRECT_BIN_DIR, or the
# static build of scripts/build-static.sh for this machine (built when missing).
our_binaries() {
  BIN=${REDIRECT_BIN_DIR:-${CARGO_TARGET_DIR:-$1/target}/static/$(uname -m)}
  if [ -z "${REDIRECT_BIN_DIR:-}" ] && [ ! -x "$BIN/redirect-cni" ]; then
    bash "$1/scripts/build-static.sh"
  fi
  local b
  for b in redirect-init redirect-cni redirect-validate; do
    [ -x "$BIN/$b" ] || { echo "missing $BIN/$b (REDIRECT_BIN_DIR)" >&2; exit 1; }
  done
  # Timed from a fresh copy, as a node runs them from an image it unpacked: here the same bytes
  # ran 0.1-0.2 ms slower per process from the files the build had just written than from a
  # copy (kernel 6.18; how the file came into the page cache), which would bias one build
  # against another. The copy goes with the script's own temporary folder.
  BIN_FROM=$BIN
  BIN_COPY=$(mktemp -d /tmp/rdbin.XXXXXX)
  cp "$BIN"/redirect-* "$BIN_COPY"/
  BIN=$BIN_COPY
}

# fresh_pod_ns NAME: a namespace as a pod's after its primary network: lo up, a veth v0 (its peer
# v1 in the same namespace) with 10.99.0.2/24.
fresh_pod_ns() {
  ip netns add "$1"
  ip -n "$1" link set lo up
  ip -n "$1" link add v0 type veth peer name v1
  ip -n "$1" addr add 10.99.0.2/24 dev v0
  ip -n "$1" link set v0 up
}

# timed_plugin NAME BIN CONF [CMD]: one plugin call (ADD, or CMD) of BIN from the host namespace
# into namespace NAME, for the pod default/web-0, CONF on stdin; prints its duration in µs. Its
# output goes to $OUT and $ERR, opened before the clock starts (as a runtime's pipes are).
timed_plugin() {
  NETNS=/run/netns/$1 BIN=$2 CONF=$3 CMD=${4:-ADD} bash -c '
    export CNI_COMMAND=$CMD CNI_CONTAINERID=bench CNI_NETNS=$NETNS CNI_IFNAME=v0 CNI_PATH=/opt/cni/bin
    export CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"
    exec 3>"$ERR" 4>"$OUT" 5<"$CONF"
    t0=$EPOCHREALTIME
    "$BIN" <&5 >&4 2>&3 || { cat "$OUT" "$ERR" >&2; exit 1; }
    t1=$EPOCHREALTIME
    echo $(( ${t1/./} - ${t0/./} ))'
}
