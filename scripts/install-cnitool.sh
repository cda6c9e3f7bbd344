#!/usr/bin/env bash
# install-cnitool.sh OUTDIR
#
# Gets the CNI reference client `cnitool` and the CNI reference plugins on a Debian/Ubuntu
# machine from the distribution's own packages, for the plugin's end-to-end tests and the demo:
#   - containernetworking-plugins: bridge, host-local, loopback, ... in /usr/lib/cni;
#   - cnitool: built from the CNI library's source package (golang-github-appc-cni) with the
#     distribution's Go. The library's -dev package leaves cnitool/ out, the source has it.
# Sources come from the machine's own apt configuration: its `deb` entries are copied as
# `deb-src` into a private apt state, so /etc/apt is never changed. No Go module proxy.
# Result: OUTDIR/cnitool (static, CGO off).
set -euo pipefail

OUT=${1:?usage: $0 OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/install-cnitool.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export DEBIAN_FRONTEND=noninteractive
log() { printf '[install-cnitool] %s\n' "$*" >&2; }

pkgs=(golang-go golang-github-appc-cni-dev containernetworking-plugins dpkg-dev ca-certificates)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

. "$(dirname "$0")/lib/apt-source.sh"
log "fetching the source package golang-github-appc-cni"
fetch_source golang-github-appc-cni "$WORK"
(cd "$WORK" && dpkg-source -q -x golang-github-appc-cni_*.dsc cni-src) >/dev/null 2>&1

# A GOPATH build of the packaged source: no modules, no network.
export GOPATH=$WORK/gopath GO111MODULE=off GOFLAGS= GOPROXY=off CGO_ENABLED=0 \
       GOCACHE=$WORK/gocache GOTOOLCHAIN=local
mkdir -p "$GOPATH/src/github.com/containernetworking"
ln -s "$WORK/cni-src" "$GOPATH/src/github.com/containernetworking/cni"
log "building cnitool with $(go env GOVERSION)"
go build -trimpath -o "$OUT/cnitool" github.com/containernetworking/cni/cnitool
log "done: $OUT/cnitool; plugins in /usr/lib/cni"
