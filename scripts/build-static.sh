#!/usr/bin/env bash
# Builds redirect-cni, redirect-cni-node, redirect-init and redirect-validate as fully static
# release executables
# and checks that they are (file: "statically linked"; ldd: "not a dynamic executable"; readelf:
# no INTERP, no NEEDED), runs each once, prints sizes.
# Run as root from anywhere in the repository; installs what is missing (Debian/Ubuntu apt, rustup).
#
#   scripts/build-static.sh [--aarch64]
#
#   x86_64 (always): target x86_64-unknown-linux-musl; ring's C/asm is compiled by musl-gcc
#     (musl-tools), rustc links with its self-contained musl crt/libc.a, non-PIE
#     (-C relocation-model=static), so that ldd calls it "not a dynamic executable".
#     Output: ${CARGO_TARGET_DIR:-target}/static/x86_64/
#   --aarch64 (or REDIRECT_STATIC_AARCH64=1): also aarch64-unknown-linux-musl, cross-compiled with
#     Debian's gcc-aarch64-linux-gnu as C compiler and linker (rustc supplies its self-contained musl
#     crt objects and libc.a; ring's C needs only headers from libc6-dev-arm64-cross), a plain static
#     executable; each binary is run once under qemu-aarch64-static if qemu-user-static installs.
#     Output: ${CARGO_TARGET_DIR:-target}/static/aarch64/
#   REDIRECT_STATIC_FALLBACK=glibc: build x86_64 as glibc `-C target-feature=+crt-static` instead of
#     musl (what happens anyway if the musl target cannot be added). Such a binary still dlopens
#     glibc's libnss_*.so for getaddrinfo/getpwnam when nsswitch.conf names more than files/dns.
#   CC_<target>/AR_<target>/CARGO_TARGET_<TARGET>_LINKER already set in the environment win.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${CARGO_TARGET_DIR:-target}"
aarch64="${REDIRECT_STATIC_AARCH64:-0}"
for a in "$@"; do
  case "$a" in
    --aarch64) aarch64=1 ;;
    *) echo "usage: $0 [--aarch64]" >&2; exit 2 ;;
  esac
done
case "${REDIRECT_STATIC_FALLBACK:=musl}" in musl | glibc) ;; *) echo "REDIRECT_STATIC_FALLBACK: musl or glibc" >&2; exit 2 ;; esac
bins=(redirect-cni redirect-cni-node redirect-init redirect-validate)
built=()
cargo_build() { cargo build --release -p cni-plugin -p cni-node -p init-shim -p validator --bins "$@"; }

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have cc || need+=(gcc libc6-dev)
have musl-gcc || need+=(musl-tools)
have file || need+=(file)
have readelf || need+=(binutils)
if [ "$aarch64" = 1 ]; then
  have aarch64-linux-gnu-gcc || need+=(gcc-aarch64-linux-gnu)
  [ -f /usr/aarch64-linux-gnu/include/string.h ] || need+=(libc6-dev-arm64-cross)
  have qemu-aarch64-static || need+=(qemu-user-static)
fi
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  for p in "${need[@]}"; do # one by one: a missing qemu must not stop the build
    apt-get install -y -qq --no-install-recommends "$p" >/dev/null || echo "warning: could not install $p" >&2
  done
fi

# check BIN NATIVE: static by file, readelf and (native binaries only: ldd can't read others) ldd.
check() {
  local bin="$1" native="$2" f l
  f="$(file -b "$bin")"
  echo "  file: $f"
  case "$f" in *"statically linked"*) ;; *) echo "FAIL: $bin is not static (file)" >&2; exit 1 ;; esac
  if readelf -lW "$bin" | grep -q INTERP || readelf -dW "$bin" | grep -q NEEDED; then
    echo "FAIL: $bin has an interpreter or NEEDED libraries (readelf)" >&2; exit 1
  fi
  if [ "$native" = 1 ]; then
    # A static executable: "not a dynamic executable" (on stderr, exit 1).
    l="$(ldd "$bin" 2>&1 | tr -d '\t' || true)"
    echo "  ldd: $l"
    case "$l" in "not a dynamic executable") ;; *) echo "FAIL: $bin is not static (ldd)" >&2; exit 1 ;; esac
  fi
}
# smoke BIN [RUNNER]: one harmless invocation per binary (must exit 0); prints its first line.
smoke() {
  local bin="$1" o; shift
  case "$(basename "$bin")" in
    redirect-cni) o="$(CNI_COMMAND=VERSION "$@" "$bin" </dev/null)" ;;
    *) o="$("$@" "$bin" --help </dev/null)" ;;
  esac
  echo "  ran: ${o%%$'\n'*}"
}

# ---- x86_64
mode="$REDIRECT_STATIC_FALLBACK"
if [ "$mode" = musl ] && ! rustup target add x86_64-unknown-linux-musl; then
  mode=glibc
fi
if [ "$mode" = musl ]; then
  target="x86_64-unknown-linux-musl"
  # A plain static executable (not static-pie): `ldd` then says "not a dynamic executable".
  CC_x86_64_unknown_linux_musl="${CC_x86_64_unknown_linux_musl:-musl-gcc}" \
    RUSTFLAGS="${RUSTFLAGS:-} -C relocation-model=static" cargo_build --target "$target"
else
  target="x86_64-unknown-linux-gnu"
  echo "########################################################################" >&2
  echo "## WARNING: FALLBACK: building x86_64 against glibc with +crt-static,  ##" >&2
  echo "## not musl. getaddrinfo/NSS still need glibc's shared libs at runtime ##" >&2
  echo "########################################################################" >&2
  RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
    cargo_build --target "$target"
fi
# collect ARCH TARGET NATIVE [RUNNER]: copy the three binaries of TARGET to static/ARCH, check
# each, and run each once (through RUNNER, e.g. an emulator, for a foreign architecture).
collect() {
  local arch="$1" target="$2" native="$3" b dest
  shift 3
  mkdir -p "$out/static/$arch"
  for b in "${bins[@]}"; do
    dest="$out/static/$arch/$b"
    cp "$out/$target/release/$b" "$dest"; built+=("$dest")
    echo "== $arch ($target) $b"
    check "$dest" "$native"
    if [ "$native" = 1 ] || have "${1:-}"; then
      smoke "$dest" "$@"
    else
      echo "  (${1:-an emulator} not available: not run)"
    fi
  done
}
collect x86_64 "$target" 1

# ---- aarch64
if [ "$aarch64" = 1 ]; then
  target="aarch64-unknown-linux-musl"
  rustup target add "$target"
  CC_aarch64_unknown_linux_musl="${CC_aarch64_unknown_linux_musl:-aarch64-linux-gnu-gcc}" \
    AR_aarch64_unknown_linux_musl="${AR_aarch64_unknown_linux_musl:-aarch64-linux-gnu-ar}" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER="${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER:-aarch64-linux-gnu-gcc}" \
    cargo_build --target "$target"
  # qemu-user runs what --help and VERSION need; it has no NETLINK_NETFILTER sockets and does
  # not translate SO_ORIGINAL_DST, so rules cannot be programmed or probed under it.
  collect aarch64 "$target" 0 qemu-aarch64-static
fi

echo "== sizes"
for f in "${built[@]}"; do printf '%10d bytes  %6s  %s\n' "$(stat -c %s "$f")" "$(du -h "$f" | cut -f1)" "$f"; done
