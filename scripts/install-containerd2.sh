#!/usr/bin/env bash
# install-containerd2.sh OUTDIR
#
# containerd 2 for the CRI tests (deploy/cri: containerd driven through the CRI by a Rust client),
# from Debian sid's packages, offline from the machine's point of view: the machine's own apt
# sources are copied into a private apt state with their release renamed `sid` (nothing
# under /etc/apt or /var/lib/apt changes), and three packages are fetched with
# `apt-get download` and unpacked with `dpkg-deb -x`:
#   containerd                   containerd 2 and containerd-shim-runc-v2
#   containernetworking-plugins  the reference plugins of sid (bridge, host-local, loopback,
#                                portmap), which speak CNI 1.1 (STATUS, GC)
#   golang-k8s-cri-api-dev       the CRI's api.proto (runtime/v1), which the client is built from
# runc stays the machine's (bookworm's, installed by scripts/install-kube.sh): containerd 2 is
# checked to run a container with it by the tests.
# Result: OUTDIR/{containerd,containerd-shim-runc-v2,ctr,api.proto,cni/*,VERSIONS}. A second run
# with everything in place does nothing. On failure apt's log is printed and the exit code is 1.
set -euo pipefail
. "$(dirname "$0")/lib/apt-source.sh"

OUT=${1:?usage: $0 OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log() { printf '[install-containerd2] %s\n' "$*" >&2; }
pkgs=(containerd containernetworking-plugins golang-k8s-cri-api-dev)
plugins=(bridge host-local loopback portmap)

have() {
  local f
  for f in containerd containerd-shim-runc-v2 ctr; do [ -x "$OUT/$f" ] || return 1; done
  for f in "${plugins[@]}"; do [ -x "$OUT/cni/$f" ] || return 1; done
  [ -s "$OUT/api.proto" ] && "$OUT/containerd" --version >/dev/null 2>&1
}
if have; then
  log "already there: $("$OUT/containerd" --version)"
  exit 0
fi
command -v dpkg-deb >/dev/null || { log "dpkg-deb is missing"; exit 1; }
command -v runc >/dev/null || { log "runc is missing: run scripts/install-kube.sh (scripts/install-deps.sh does)"; exit 1; }

WORK=$(mktemp -d /tmp/install-containerd2.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/debs" "$WORK/x"
fail() {
  [ -f "$WORK/apt.log" ] && cat "$WORK/apt.log" >&2
  log "$*"
  exit 1
}

started=$SECONDS
log "reading sid's package lists (a private apt state in $WORK/apt: this machine's sources, its release renamed sid)"
apt_private sid "$(dpkg --print-architecture)" "$WORK" || fail "apt could not read sid's package lists"
(cd "$WORK/debs" && apt-get "${APTO[@]}" -qq download "${pkgs[@]}" >>"$WORK/apt.log" 2>&1) \
  || fail "apt could not download ${pkgs[*]} from sid"
for p in "${pkgs[@]}"; do
  deb=$(ls "$WORK"/debs/"${p}"_*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || fail "no $p package was downloaded"
  log "$(basename "$deb")"
  dpkg-deb -x "$deb" "$WORK/x"
done

# Only what the tests use.
rm -rf "$OUT/cni" "$OUT"/*.tmp
mkdir -p "$OUT/cni"
for b in containerd containerd-shim-runc-v2 ctr; do
  [ -x "$WORK/x/usr/bin/$b" ] || fail "no usr/bin/$b in sid's containerd package"
  install -m 0755 "$WORK/x/usr/bin/$b" "$OUT/$b.tmp"
done
for b in "${plugins[@]}"; do
  [ -x "$WORK/x/usr/lib/cni/$b" ] || fail "no usr/lib/cni/$b in sid's containernetworking-plugins"
  install -m 0755 "$WORK/x/usr/lib/cni/$b" "$OUT/cni/$b"
done
proto=$WORK/x/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto
[ -s "$proto" ] || fail "no $proto in golang-k8s-cri-api-dev"
install -m 0644 "$proto" "$OUT/api.proto.tmp"
for b in containerd-shim-runc-v2 ctr api.proto containerd; do mv "$OUT/$b.tmp" "$OUT/$b"; done
"$OUT/containerd" --version >/dev/null 2>&1 || fail "sid's containerd does not run here: $("$OUT/containerd" --version 2>&1)"
{
  "$OUT/containerd" --version
  "$OUT/cni/bridge" --version 2>&1 | sed -n 's/^CNI protocol versions supported: /reference plugins speak CNI /p' || true
  (cd "$WORK/debs" && ls ./*.deb | sed 's|^\./||')
  runc --version | head -1
} >"$OUT/VERSIONS"
log "done in $((SECONDS - started)) s:"
sed 's/^/  /' "$OUT/VERSIONS" >&2
