#!/usr/bin/env bash
# build-node-images.sh OUTDIR: the images the real node's tests import into containerd
# (`ctr -n k8s.io images import`), offline, as OCI archives:
#   pause.tar    localhost/pause:test     the sandbox: the distribution's static catatonit, -P
#   redirect.tar localhost/redirect:test  the shipped image's content (Containerfile): the four
#                                         static binaries in /usr/local/bin, run as root
#   testpod.tar  localhost/testpod:test   the test pods' app and proxy stand-in (cni-shim/testpod)
# The static binaries come from scripts/build-static.sh (run first, as scripts/test.sh does);
# testpod is built here the same way (musl, no C). A second run rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: $0 OUTDIR}
mkdir -p "$OUT"
arch=$(uname -m)
STATIC=${CARGO_TARGET_DIR:-target}/static/$arch
command -v catatonit >/dev/null || { echo "catatonit is missing: run scripts/install-deps.sh" >&2; exit 1; }
for b in redirect-cni redirect-cni-node redirect-init redirect-validate; do
  [ -x "$STATIC/$b" ] || { echo "$STATIC/$b is missing: run scripts/build-static.sh" >&2; exit 1; }
done
target=$arch-unknown-linux-musl
RUSTFLAGS="${RUSTFLAGS:-} -C relocation-model=static" cargo build -q --release --target "$target" -p testpod
testpod=${CARGO_TARGET_DIR:-target}/$target/release/testpod
img() { python3 scripts/lib/oci-image.py "$@"; }
img "$OUT/pause.tar" localhost/pause:test --file "$(command -v catatonit):/catatonit" \
  --entrypoint '["/catatonit", "-P"]'
img "$OUT/redirect.tar" localhost/redirect:test \
  --file "$STATIC/redirect-cni:/usr/local/bin/redirect-cni" \
  --file "$STATIC/redirect-cni-node:/usr/local/bin/redirect-cni-node" \
  --file "$STATIC/redirect-init:/usr/local/bin/redirect-init" \
  --file "$STATIC/redirect-validate:/usr/local/bin/redirect-validate" \
  --cmd '["/usr/local/bin/redirect-cni-node"]'
img "$OUT/testpod.tar" localhost/testpod:test --file "$testpod:/testpod" --entrypoint '["/testpod"]'
ls -l "$OUT"
