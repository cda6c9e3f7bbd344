#!/usr/bin/env bash
# install-kube.sh OUTDIR
#
# A real Kubernetes cluster for the tests, offline, from the distribution's packages:
#   - kube-apiserver, kubelet, kube-scheduler and kube-controller-manager 1.20.2, built once
#     from Debian's `kubernetes` source package (only kubectl ships as a binary package; the
#     source holds the whole tree with its vendor/ folder), with the distribution's Go, CGO
#     off, as debian/rules builds them (a GOPATH tree and one `make WHAT=`);
#   - etcd from `etcd-server` (no service is started: the tests start their own);
#   - the node's runtime: containerd 1.6 (it serves CRI v1alpha2, which kubelet 1.20 speaks),
#     runc, the reference CNI plugins (bridge, host-local, loopback), and catatonit (its pause
#     mode is the pods' sandbox image); the tests start their own containerd;
#   - kubectl: the machine's own, or the distribution's `kubernetes-client` (the tests drive
#     the server with it, using what kubectl 1.20 and later all have).
# One fix is needed: the vendored github.com/modern-go/reflect2 1.0.1 crashes under Go 1.18 and
# later (SIGSEGV on the first custom-resource create); it is replaced by the distribution's
# 1.0.2 (golang-github-modern-go-reflect2-dev).
# Sources come from the machine's own apt configuration, copied as `deb-src` into a private apt
# state, so /etc/apt is never changed. No Go module proxy. About 5 minutes and 2.5 GB of
# scratch space the first time; then the four binaries are in OUTDIR and the build is skipped.
# Result: OUTDIR/{kube-apiserver,kubelet,kube-scheduler,kube-controller-manager} (static),
# /usr/bin/etcd, containerd, runc, /usr/lib/cni, catatonit, kubectl on PATH, and openssl (the
# tests make the service accounts' signing key with it).
set -euo pipefail

OUT=${1:?usage: $0 OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export DEBIAN_FRONTEND=noninteractive
log() { printf '[install-kube] %s\n' "$*" >&2; }

pkgs=(golang-go golang-github-modern-go-reflect2-dev etcd-server dpkg-dev ca-certificates make rsync openssl
      containerd runc containernetworking-plugins catatonit iptables curl)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
# kubectl: the machine's own when it has one, else the distribution's (kubernetes-client, the
# same 1.20 as the server); the tests use only what both have.
command -v kubectl >/dev/null 2>&1 || missing+=(kubernetes-client)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# etcd-server's package may start a service where there is an init system; the tests run their own.
# So may containerd's; a node's test containerd has sockets and state of its own.
for svc in etcd containerd; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl stop "$svc" || true
  fi
done

# INSTALL_KUBE_PACKAGES_ONLY=1: the packages above only; the build is left to a later run (which
# then touches no package: scripts/test.sh runs it beside the static builds).
if [ "${INSTALL_KUBE_PACKAGES_ONLY:-0}" = 1 ]; then
  exit 0
fi

BINS=(kube-apiserver kubelet kube-scheduler kube-controller-manager)
built=1
for b in "${BINS[@]}"; do
  [ -x "$OUT/$b" ] && "$OUT/$b" --version >/dev/null 2>&1 || built=0
done
if [ "$built" = 1 ]; then
  log "already built: ${BINS[*]} ($("$OUT/kube-apiserver" --version))"
  exit 0
fi

WORK=$(mktemp -d /tmp/install-kube.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

. "$(dirname "$0")/lib/apt-source.sh"
log "fetching the source package kubernetes"
fetch_source kubernetes "$WORK"
SRC=$WORK/gopath/src/k8s.io/kubernetes
mkdir -p "$(dirname "$SRC")"
(cd "$WORK" && dpkg-source -q -x kubernetes_*.dsc "$SRC") >/dev/null 2>&1
rm -f "$WORK"/kubernetes_*

# The vendored reflect2 1.0.1 breaks under Go >= 1.18; the distribution's 1.0.2 does not.
R2=/usr/share/gocode/src/github.com/modern-go/reflect2
[ -d "$R2" ] || { log "missing $R2 (golang-github-modern-go-reflect2-dev)"; exit 1; }
rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
cp -r "$R2" "$SRC/vendor/github.com/modern-go/reflect2"

export GOPATH=$WORK/gopath GOFLAGS= GOPROXY=off CGO_ENABLED=0 GOTOOLCHAIN=local \
       GOCACHE=$WORK/gocache KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean
what=$(printf 'cmd/%s ' "${BINS[@]}")
log "building ${BINS[*]} with $(go env GOVERSION) (about 5 minutes)"
started=$SECONDS
if ! (cd "$SRC" && make WHAT="$what" >"$WORK/build.log" 2>&1); then
  tail -40 "$WORK/build.log" >&2
  log "the build failed"
  exit 1
fi
for b in "${BINS[@]}"; do
  bin=$(find "$SRC/_output" -type f -name "$b" -perm -u+x | head -1)
  [ -n "$bin" ] || { tail -20 "$WORK/build.log" >&2; log "no $b in _output"; exit 1; }
  install -m 0755 "$bin" "$OUT/$b.tmp"
  mv "$OUT/$b.tmp" "$OUT/$b"
done
log "done in $((SECONDS - started)) s: ${BINS[*]} in $OUT ($("$OUT/kube-apiserver" --version)), $(etcd --version | head -1), $(containerd --version)"
