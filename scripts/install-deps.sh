#!/usr/bin/env bash
# Installs the system packages the build and the kernel tests need (Debian/Ubuntu, as root).
# libnftnl/libmnl: the test oracle of our nf_tables encoder (dev-dependencies only; no binary
# links them). nftables/iptables/ipset/iproute2/time: used only by tests and comparisons (loading
# Istio's rules, checking our renderings), never by our binaries. The static builds' own
# toolchain (musl-tools, cross compilers) is installed by scripts/build-static.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(libnftnl-dev libmnl-dev pkg-config nftables iptables ipset iproute2 python3 time)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The kernel matrix (scripts/kernel-vms.sh): qemu for amd64 and arm64, cpio for the initramfs,
# busybox-static for the amd64 guests; the kernels it boots are fetched by scripts/kernel-vm.sh,
# not installed.
vmpkgs=()
command -v qemu-system-aarch64 >/dev/null 2>&1 || vmpkgs+=(qemu-system-arm)
command -v qemu-system-x86_64 >/dev/null 2>&1 || vmpkgs+=(qemu-system-x86)
command -v cpio >/dev/null 2>&1 || vmpkgs+=(cpio)
dpkg -s busybox-static >/dev/null 2>&1 || vmpkgs+=(busybox-static)
if ((${#vmpkgs[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${vmpkgs[@]}" >/dev/null
fi
# Kernel modules the capture uses; built in on many kernels, so failures are not fatal.
for m in nf_tables nft_chain_nat nft_redir nft_tproxy nft_ct nft_nat nf_conntrack nf_tproxy_ipv4 nf_tproxy_ipv6; do
  modprobe "$m" 2>/dev/null || true
done
# The CNI reference client (cnitool) and the reference plugins (/usr/lib/cni) for the
# plugin's end-to-end tests and the demo, from the distribution's packages, once into .tools/.
if [ ! -x .tools/cnitool ] || [ ! -x /usr/lib/cni/bridge ]; then
  bash scripts/install-cnitool.sh .tools
fi
# A real Kubernetes cluster (kube-apiserver, kubelet, scheduler and controller-manager 1.20
# built from the distribution's source package, etcd, containerd, runc, kubectl) for the
# Kubernetes-facing tests and the real node's, once into .tools/kube (~5 minutes). With
# REDIRECT_KUBE_LATER=1 only its packages: the caller builds it (scripts/test.sh, in the
# background).
if [ ! -x .tools/kube/kubelet ] || [ ! -x .tools/kube/kube-apiserver ] || ! command -v etcd >/dev/null \
   || ! command -v kubectl >/dev/null || ! command -v containerd >/dev/null || ! command -v catatonit >/dev/null; then
  INSTALL_KUBE_PACKAGES_ONLY="${REDIRECT_KUBE_LATER:-0}" bash scripts/install-kube.sh .tools/kube
fi
# containerd 2 (Debian sid's 2.1.9, which calls CNI STATUS and GC), its CNI reference plugins and
# the CRI's api.proto, for the CRI tests (deploy/cri), once into .tools/containerd2; runc stays
# the machine's (above).
bash scripts/install-containerd2.sh .tools/containerd2
bash scripts/install-helm.sh .tools # helm and kubernetes-validate, for the Helm chart tests (tests/helm_chart.rs)
