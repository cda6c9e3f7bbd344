#!/usr/bin/env bash
# Runs the arm64 static binaries (target/static/aarch64, from `build-static.sh --aarch64`) inside
# Debian's arm64 kernel under qemu-system-aarch64 (TCG, -M virt), and compares what they program
# with the x86_64 binaries' (target/static/x86_64) on this machine's kernel.
#
#   scripts/arm64-vm.sh [--timeout SECONDS]      (root; default timeout 300 s)
#
# Fetched, not installed: Debian's arm64 kernel (linux-image-arm64's current image) and
# busybox-static, with `apt-get download` through a private apt state for the arm64 architecture
# (the machine's own sources, nothing under /etc/apt or /var/lib/apt changes), unpacked with
# dpkg-deb into target/arm64-vm/ (kept: the two packages, 61 MB, and what the VM needs of them, 35 MB; delete it to start over). The initramfs holds
# busybox, our four binaries, the nf_tables/conntrack/nat/tproxy/veth modules with what they
# depend on (from each module's `depends=`, loaded in that order by insmod) and
# scripts/lib/arm64-guest.sh as /init: it runs the checks and prints `ARM64-TEST ok|fail NAME`,
# `ARM64-OUT NAME JSON` (inspect --json) and `ARM64-TEST done N passed, M failed`, then powers off.
# The same script runs on the host (in a network namespace of its own) with the x86_64 binaries;
# every ARM64-OUT line must be the same on both, the namespace's path aside.
#
# Exit 0 only when every check passed and the outputs match. Where the machine lacks what it
# needs (qemu-system-aarch64 cannot be installed, the packages cannot be fetched) it prints
# `SKIPPED arm64-vm: WHY` and exits 0, or exits 1 when REDIRECT_REQUIRE_ARM64_VM=1 (CI sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
timeout_s=300
while (($#)); do
  case "$1" in
    --timeout) timeout_s="$2"; shift 2 ;;
    *) echo "usage: $0 [--timeout SECONDS]" >&2; exit 2 ;;
  esac
done
work="$(realpath -m "${CARGO_TARGET_DIR:-target}/arm64-vm")" # absolute: apt reads relative Dir:: paths under its own
arm=target/static/aarch64
x86=target/static/x86_64
bins=(redirect-cni redirect-cni-node redirect-init redirect-validate)
# The modules the checks need; their dependencies are added.
mods=(nf_tables nft_chain_nat nft_nat nft_redir nft_ct nft_tproxy nf_conntrack veth)

skip() {
  if [ "${REDIRECT_REQUIRE_ARM64_VM:-0}" = 1 ]; then
    echo "FAIL arm64-vm: $1 (REDIRECT_REQUIRE_ARM64_VM=1: not skipped)" >&2
    exit 1
  fi
  echo "SKIPPED arm64-vm: $1"
  exit 0
}
for b in "${bins[@]}"; do
  [ -x "$arm/$b" ] || { echo "FAIL arm64-vm: $arm/$b missing: run scripts/build-static.sh --aarch64" >&2; exit 1; }
  [ -x "$x86/$b" ] || { echo "FAIL arm64-vm: $x86/$b missing: run scripts/build-static.sh" >&2; exit 1; }
done

need=()
command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
command -v cpio >/dev/null || need+=(cpio)
command -v dpkg-deb >/dev/null || need+=(dpkg)
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$work.apt-install.log" 2>&1 || true
  command -v qemu-system-aarch64 >/dev/null || skip "no qemu-system-aarch64 and apt could not install qemu-system-arm (see $work.apt-install.log)"
  command -v cpio >/dev/null || skip "no cpio and apt could not install it"
fi

# ---- Debian's arm64 kernel and busybox, through a private apt state
mkdir -p "$work"
aptd="$work/apt"
apto=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$aptd/parts"
      -o "Dir::State=$aptd/state" -o "Dir::State::Lists=$aptd/lists" -o "Dir::State::status=$aptd/state/status"
      -o "Dir::Cache=$aptd/cache" -o APT::Architecture=arm64 -o APT::Architectures::=arm64
      -o APT::Sandbox::User=root)
if ! ls "$work"/debs/linux-image-*_arm64.deb "$work"/debs/busybox-static_*_arm64.deb >/dev/null 2>&1; then
  rm -rf "$aptd" "$work/debs" "$work/kpkg" "$work/bb"
  mkdir -p "$aptd/parts" "$aptd/state" "$aptd/lists/partial" "$aptd/cache/archives/partial" "$work/debs"
  touch "$aptd/state/status"
  shopt -s nullglob
  n=0
  for f in /etc/apt/sources.list.d/*.sources; do cp "$f" "$aptd/parts/s$((n++)).sources"; done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do [ -r "$f" ] && cp "$f" "$aptd/parts/s$((n++)).list"; done
  shopt -u nullglob
  apt-get "${apto[@]}" -qq update >"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; skip "apt could not read the arm64 package lists"; }
  # linux-image-arm64 is a metapackage: its Depends names the current image.
  kpkg=$(apt-cache "${apto[@]}" depends linux-image-arm64 2>>"$work/apt.log" | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
  [ -n "$kpkg" ] || { cat "$work/apt.log" >&2; skip "no arm64 kernel package (linux-image-arm64) in this machine's apt sources"; }
  (cd "$work/debs" && apt-get "${apto[@]}" -qq download "$kpkg" busybox-static >>"../apt.log" 2>&1) \
    || { cat "$work/apt.log" >&2; skip "apt could not download $kpkg and busybox-static for arm64"; }
  rm -rf "$aptd" # the arm64 package lists (~100 MB) are needed for the download only
fi
if [ ! -d "$work/kpkg/lib/modules" ] || [ ! -x "$work/bb/bin/busybox" ]; then
  rm -rf "$work/kpkg" "$work/bb"
  mkdir -p "$work/kpkg"
  # Only the kernel, its config and the module folders the checks draw on (35 of the package's 350 MB).
  dpkg-deb --fsys-tarfile "$(ls "$work"/debs/linux-image-*_arm64.deb | head -1)" \
    | tar -x -C "$work/kpkg" --wildcards './boot/vmlinuz-*' './boot/config-*' './lib/modules/*/kernel/net/*' \
        './lib/modules/*/kernel/crypto/*' './lib/modules/*/kernel/lib/*' './lib/modules/*/kernel/drivers/net/veth.ko*'
  dpkg-deb -x "$(ls "$work"/debs/busybox-static_*_arm64.deb | head -1)" "$work/bb"
fi
kver=$(ls "$work/kpkg/lib/modules" | head -1)
kernel="$work/kpkg/boot/vmlinuz-$kver"
[ -f "$kernel" ] || { echo "FAIL arm64-vm: no $kernel in the package" >&2; exit 1; }

# ---- the initramfs
root="$work/initramfs"
rm -rf "$root"
mkdir -p "$root/bin" "$root/lib/modules" "$root/etc"
cp "$work/bb/bin/busybox" "$root/bin/busybox"
ln -s busybox "$root/bin/sh"
for b in "${bins[@]}"; do cp "$arm/$b" "$root/bin/$b"; done
cp scripts/lib/arm64-guest.sh "$root/init"
chmod 0755 "$root/init"
printf 'root:x:0:0:root:/:/bin/sh\nproxy:x:1337:1337:istio-proxy:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nproxy:x:1337:\n' >"$root/etc/group"
# Module NAME -> file (names use _ where files may use -), then each module after its
# dependencies (`depends=` and `softdep=pre:` in its .modinfo; crc32c is crc32c_generic here).
declare -A modfile=() loaded=()
while IFS= read -r f; do
  n=${f##*/}; n=${n%.ko*}; modfile[${n//-/_}]=$f
done < <(find "$work/kpkg/lib/modules/$kver/kernel" -name '*.ko*')
order=()
modinfo_field() { # FILE FIELD
  case "$1" in
    *.ko.xz) xz -dc "$1" ;; *.ko.zst) zstd -dqc "$1" ;; *) cat "$1" ;;
  esac | tr '\0' '\n' | sed -n "s/^$2=//p" | head -1
}
add_mod() {
  local n=$1 d f
  [ -n "${loaded[$n]:-}" ] && return 0
  f=${modfile[$n]:-${modfile[${n}_generic]:-}}
  [ -n "$f" ] || { echo "FAIL arm64-vm: no module $n in $kver (built in? check the kernel config)" >&2; exit 1; }
  loaded[$n]=1
  for d in $(modinfo_field "$f" softdep | sed 's/^pre: *//; s/post:.*//') $(modinfo_field "$f" depends | tr ',' ' '); do
    add_mod "$d"
  done
  case "$f" in
    *.ko.xz) xz -dc "$f" ;; *.ko.zst) zstd -dqc "$f" ;; *) cat "$f" ;;
  esac >"$root/lib/modules/$n.ko"
  order+=("$n")
}
for m in "${mods[@]}"; do add_mod "$m"; done
printf '%s\n' "${order[@]}" >"$root/lib/modules/load-order"
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 >"$work/initramfs.cpio.gz"
echo "arm64-vm: kernel $kver ($(basename "$(ls "$work"/debs/linux-image-*_arm64.deb | head -1)")), busybox $(basename "$(ls "$work"/debs/busybox-static_*_arm64.deb | head -1)"), initramfs $(du -h "$work/initramfs.cpio.gz" | cut -f1), modules: ${order[*]}"

# ---- x86_64: the same namespaces and rules on this machine's kernel (inspect --json only)
ARM64_ROLE=host ARM64_BIN="$x86" unshare -n sh scripts/lib/arm64-guest.sh >"$work/host.log" 2>&1 \
  || { cat "$work/host.log" >&2; echo "FAIL arm64-vm: the x86_64 side failed" >&2; exit 1; }

# ---- boot; each console line stamped with the host's clock
log="$work/console.log"
t0=$EPOCHREALTIME
set +e
timeout --foreground -k 5 "$timeout_s" qemu-system-aarch64 -M virt -cpu cortex-a57 -smp 2 -m 1024 \
  -accel tcg,thread=multi -display none -monitor none -serial stdio -nic none -no-reboot \
  -kernel "$kernel" -initrd "$work/initramfs.cpio.gz" \
  -append "console=ttyAMA0 rdinit=/init quiet loglevel=3 panic=-1" </dev/null 2>&1 \
  | while IFS= read -r l; do l=${l%$'\r'}; printf '%s %s\n' "$EPOCHREALTIME" "$l"; done >"$log"
qrc=${PIPESTATUS[0]}
set -e
t1=$EPOCHREALTIME
sed 's/^[0-9.]* //' "$log" | grep -v '^ARM64-OUT ' | grep -E '^ARM64-TEST |Kernel panic|panic|Oops|BUG' || true
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "FAIL arm64-vm: no poweroff within ${timeout_s}s; the console's last lines:" >&2
  sed 's/^[0-9.]* //' "$log" | tail -n 30 >&2
  exit 1
fi
start=$(awk '$2 == "ARM64-TEST" && $3 == "start:" { print $1; exit }' "$log")
done_=$(awk '$2 == "ARM64-TEST" && $3 == "done" { print $1; exit }' "$log")
if [ -z "$start" ] || [ -z "$done_" ]; then
  echo "FAIL arm64-vm: the guest did not report (qemu exit $qrc); its console:" >&2
  sed 's/^[0-9.]* //' "$log" | tail -n 40 >&2
  exit 1
fi
failed=0
grep -q '^[0-9.]* ARM64-TEST done [0-9]* passed, 0 failed' "$log" || failed=1
# ---- the same decisions: every inspect --json of arm64 equals x86_64's, the netns path aside
norm() { grep '^ARM64-OUT ' | sed 's/"netns": "[^"]*"/"netns": "-"/' | LC_ALL=C sort; }
sed 's/^[0-9.]* //' "$log" | norm >"$work/inspect.arm64"
norm <"$work/host.log" >"$work/inspect.x86_64"
if [ ! -s "$work/inspect.arm64" ] || ! diff -u "$work/inspect.x86_64" "$work/inspect.arm64" >"$work/inspect.diff"; then
  echo "ARM64-TEST fail inspect_same_as_x86_64: the arm64 and x86_64 inspect --json differ:"
  cat "$work/inspect.diff"
  failed=1
else
  echo "ARM64-TEST ok inspect_same_as_x86_64 ($(wc -l <"$work/inspect.arm64") outputs identical)"
fi
boot=$(awk -v a="$t0" -v b="$start" 'BEGIN { printf "%.1f", b - a }')
tests=$(awk -v a="$start" -v b="$done_" 'BEGIN { printf "%.1f", b - a }')
total=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
echo "arm64-vm: boot ${boot} s (qemu start to /init), tests ${tests} s, qemu ${total} s in all (TCG, $(nproc) host cores)"
if [ "$failed" != 0 ]; then
  echo "FAIL arm64-vm: see $log" >&2
  exit 1
fi
echo "arm64-vm: ok"
