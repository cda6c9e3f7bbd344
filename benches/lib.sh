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
}
