#!/usr/bin/env bash
# install-kube-apiserver.sh OUTDIR
#
# A real Kubernetes control plane for the tests, offline, from the distribution's packages:
#   - kube-apiserver 1.20.2, built once from Debian's `kubernetes` source package (only kubectl
#     ships as a binary package; the source holds the whole tree with its vendor/ folder), with
#     the distribution's Go, CGO off, as debian/rules builds it (a GOPATH tree and `make WHAT=`);
#   - etcd from `etcd-server` (no service is started: the tests start their own);
#   - kubectl: the machine's own, or the distribution's `kubernetes-client` (the tests drive
#     the server with it, using what kubectl 1.20 and later all have).
# One fix is needed: the vendored github.com/modern-go/reflect2 1.0.1 crashes under Go 1.18 and
# later (SIGSEGV on the first custom-resource create); it is replaced by the distribution's
# 1.0.2 (golang-github-modern-go-reflect2-dev).
# Sources come from the machine's own apt configuration, copied as `deb-src` into a private apt
# state, so /etc/apt is never changed. No Go module proxy. About 3 minutes and 2 GB of scratch
# space the first time; then OUTDIR/kube-apiserver is there and the build is skipped.
# Result: OUTDIR/kube-apiserver (static), /usr/bin/etcd, kubectl on PATH, and openssl (the tests
# make the service accounts' signing key with it).
set -euo pipefail

OUT=${1:?usage: $0 OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export DEBIAN_FRONTEND=noninteractive
log() { printf '[install-kube-apiserver] %s\n' "$*" >&2; }

pkgs=(golang-go golang-github-modern-go-reflect2-dev etcd-server dpkg-dev ca-certificates make rsync openssl)
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
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
  systemctl stop etcd || true
fi

if [ -x "$OUT/kube-apiserver" ] && "$OUT/kube-apiserver" --version >/dev/null 2>&1; then
  log "kube-apiserver already built: $("$OUT/kube-apiserver" --version)"
  exit 0
fi

WORK=$(mktemp -d /tmp/install-kube-apiserver.XXXXXX)
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
log "building kube-apiserver with $(go env GOVERSION) (about 3 minutes)"
if ! (cd "$SRC" && make WHAT=cmd/kube-apiserver >"$WORK/build.log" 2>&1); then
  tail -40 "$WORK/build.log" >&2
  log "the build failed"
  exit 1
fi
bin=$(find "$SRC/_output" -type f -name kube-apiserver -perm -u+x | head -1)
[ -n "$bin" ] || { tail -20 "$WORK/build.log" >&2; log "no kube-apiserver in _output"; exit 1; }
install -m 0755 "$bin" "$OUT/kube-apiserver.tmp"
mv "$OUT/kube-apiserver.tmp" "$OUT/kube-apiserver"
log "done: $OUT/kube-apiserver ($("$OUT/kube-apiserver" --version)), $(etcd --version | head -1)"
