#!/usr/bin/env bash
# Boots one of Debian's kernels under qemu with our static binaries in its initramfs and runs the
# guest checks (scripts/lib/vm-guest.sh) there; compares what the binaries program with what the
# x86_64 binaries program on this machine's kernel.
#
#   scripts/kernel-vm.sh --arch amd64|arm64 --suite SUITE [--leave-out MODULE]
#                        [--kernel-tests FILE] [--name NAME] [--timeout SECONDS]   (root)
#
# SUITE is a Debian release (bullseye: Linux 5.10, bookworm: 6.1, trixie: 6.12). Fetched, not
# installed: the suite's kernel (linux-image-ARCH's current image) and busybox-static, with
# `apt-get download` through a private apt state (this machine's own package sources with their
# suite set to SUITE; nothing under /etc/apt or /var/lib/apt changes), unpacked with dpkg-deb
# into target/vm/debs/ARCH-SUITE/ (kept; delete it to start over). The initramfs holds busybox, our four
# static binaries (target/static/x86_64 or aarch64, from scripts/build-static.sh), the
# nf_tables, conntrack, NAT, TPROXY, fib, limit and veth modules with what they depend on (each
# module's `depends=`, loaded in that order), and scripts/lib/vm-guest.sh as /init. It runs the
# checks, prints `VM-TEST ok|fail NAME`, `VM-OUT NAME JSON` (inspect --json) and
# `VM-TEST done N passed, M failed`, then powers off.
#
# amd64 guests also get this machine's `ip` and `nft` (with the shared libraries they load) and,
# with --kernel-tests FILE (lines `NAME PATH`: test executables of the workspace's kernel tests,
# built by cargo for this machine), those executables: the guest runs each whole, one test at a
# time, with --include-ignored (their #[kernel_test]s; one left ignored fails), as a check of
# its own (ambient's in-pod rules and the host probe SNAT among them).
#
# --leave-out MODULE builds an initramfs without MODULE and runs the kernel-floor checks instead
# (VM_MODE=floor in the guest): what needs MODULE must fail before changing anything, with an
# error naming it; the rest must work.
#
# The guest runs under KVM when /dev/kvm opens (amd64 on an amd64 machine), else TCG.
# Exit 0 only when every check passed and the outputs match. Where the machine lacks what it
# needs (qemu cannot be installed, the packages cannot be fetched) it prints `SKIPPED vm NAME: WHY`
# and exits 0, or exits 1 when REDIRECT_REQUIRE_VMS=1 (the test command sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/apt-source.sh
timeout_s=300
arch=
suite=
leave_out=
tests_file=
name=
while (($#)); do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --suite) suite="$2"; shift 2 ;;
    --leave-out) leave_out="$2"; shift 2 ;;
    --kernel-tests) tests_file="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    *) echo "usage: $0 --arch amd64|arm64 --suite SUITE [--leave-out MODULE] [--kernel-tests FILE] [--name NAME] [--timeout SECONDS]" >&2; exit 2 ;;
  esac
done
case "$arch" in
  amd64) qemu=qemu-system-x86_64 qpkg=qemu-system-x86 static=x86_64 console=ttyS0 ;;
  arm64) qemu=qemu-system-aarch64 qpkg=qemu-system-arm static=aarch64 console=ttyAMA0 ;;
  *) echo "kernel-vm: --arch amd64 or arm64, not '$arch'" >&2; exit 2 ;;
esac
[[ "$suite" =~ ^[a-z]+$ ]] || { echo "kernel-vm: --suite names a Debian release (bullseye, bookworm, trixie), not '$suite'" >&2; exit 2; }
name=${name:-$arch-$suite${leave_out:+-no-$leave_out}}
[ -z "$tests_file" ] || [ -r "$tests_file" ] || { echo "kernel-vm: --kernel-tests $tests_file: no such file" >&2; exit 2; }
work="$(realpath -m "${CARGO_TARGET_DIR:-target}/vm/$name")" # absolute: apt reads relative Dir:: paths under its own
# The packages and what is unpacked of them, shared by the VMs of one suite and architecture
# (under a lock: the matrix boots them in parallel).
pkgs="$(realpath -m "${CARGO_TARGET_DIR:-target}/vm/debs/$arch-$suite")"
bin=target/static/$static
x86=target/static/x86_64
bins=(redirect-cni redirect-cni-node redirect-init redirect-validate)
# The modules the checks need; their dependencies are added (8021q: the VLAN of branch_eni's layout).
mods=(nf_tables nft_chain_nat nft_nat nft_redir nft_ct nft_tproxy nft_fib_inet nft_limit nf_conntrack veth 8021q)
# Modules only some kernels have apart (nft_counter is in nf_tables itself since 5.14 or so;
# the sock_diag ones that `listeners` reads with are built in on some).
optional=(nft_counter inet_diag tcp_diag udp_diag)

skip() {
  if [ "${REDIRECT_REQUIRE_VMS:-0}" = 1 ]; then
    echo "FAIL vm $name: $1 (REDIRECT_REQUIRE_VMS=1: not skipped)" >&2
    exit 1
  fi
  echo "SKIPPED vm $name: $1"
  exit 0
}
fail() { echo "FAIL vm $name: $*" >&2; exit 1; }
for b in "${bins[@]}"; do
  [ -x "$bin/$b" ] || fail "$bin/$b missing: run scripts/build-static.sh${static/x86_64/}${static/aarch64/ --aarch64}"
  [ -x "$x86/$b" ] || fail "$x86/$b missing: run scripts/build-static.sh"
done
mkdir -p "$work"

need=()
command -v "$qemu" >/dev/null || need+=("$qpkg")
command -v cpio >/dev/null || need+=(cpio)
command -v dpkg-deb >/dev/null || need+=(dpkg)
# amd64 guests run this machine's busybox (the suite's own may be older: bullseye's nsenter reads
# options after the program's name); arm64 guests fetch bookworm's with their kernel.
if [ "$arch" = amd64 ] && ! dpkg -s busybox-static >/dev/null 2>&1; then need+=(busybox-static); fi
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$work/apt-install.log" 2>&1 || true
  command -v "$qemu" >/dev/null || skip "no $qemu and apt could not install $qpkg (see $work/apt-install.log)"
  command -v cpio >/dev/null || skip "no cpio and apt could not install it"
  [ "$arch" != amd64 ] || dpkg -s busybox-static >/dev/null 2>&1 || skip "apt could not install busybox-static"
fi

# ---- the suite's kernel and busybox, through a private apt state
fetch_debs() {
  rm -rf "$pkgs/debs" "$pkgs/kpkg" "$pkgs/bb"
  mkdir -p "$pkgs/debs"
  apt_private "$suite" "$arch" "$pkgs" || { cat "$pkgs/apt.log" >&2; skip "apt could not read $suite's $arch package lists"; }
  # linux-image-ARCH is a metapackage: its Depends names the current image.
  kpkg=$(apt-cache "${APTO[@]}" depends "linux-image-$arch" 2>>"$pkgs/apt.log" | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
  [ -n "$kpkg" ] || { cat "$pkgs/apt.log" >&2; skip "no $arch kernel package (linux-image-$arch) in $suite"; }
  local extra=()
  [ "$arch" = amd64 ] || extra=(busybox-static)
  (cd "$pkgs/debs" && apt-get "${APTO[@]}" -qq download "$kpkg" "${extra[@]}" >>"../apt.log" 2>&1) \
    || { cat "$pkgs/apt.log" >&2; skip "apt could not download $kpkg ${extra[*]} for $arch from $suite"; }
  rm -rf "$pkgs/apt" # the package lists (~100 MB) are needed for the download only
}
have_debs() {
  ls "$pkgs"/debs/linux-image-*_"$arch".deb >/dev/null 2>&1 || return 1
  [ "$arch" = amd64 ] || ls "$pkgs"/debs/busybox-static_*_"$arch".deb >/dev/null 2>&1
}
mkdir -p "$pkgs"
exec 9>"$pkgs.lock"
flock 9
have_debs || fetch_debs
if [ ! -d "$pkgs/kpkg/lib/modules" ] || { [ "$arch" != amd64 ] && [ ! -x "$pkgs/bb/bin/busybox" ]; }; then
  rm -rf "$pkgs/kpkg" "$pkgs/bb"
  mkdir -p "$pkgs/kpkg"
  deb=$(ls "$pkgs"/debs/linux-image-*_"$arch".deb | head -1)
  # Only the kernel, its config and the module folders the checks draw on; the modules are under
  # ./usr/lib/modules since trixie (merged /usr), ./lib/modules before.
  m=$(dpkg-deb -c "$deb" | awk '!m && $6 ~ /\/modules\/[^/]*\/modules\.builtin$/ { m = $6; sub(/\/modules\/.*/, "/modules", m) } END { print m }')
  [ -n "$m" ] || fail "no modules.builtin in $deb"
  dpkg-deb --fsys-tarfile "$deb" \
    | tar -x -C "$pkgs/kpkg" --wildcards './boot/vmlinuz-*' './boot/config-*' "$m/*/modules.builtin" \
        "$m/*/kernel/net/*" "$m/*/kernel/crypto/*" "$m/*/kernel/lib/*" "$m/*/kernel/drivers/net/veth.ko*" 2>"$pkgs/tar.log" \
    || { cat "$pkgs/tar.log" >&2; fail "could not unpack the kernel package"; }
  if [ "$m" != ./lib/modules ]; then mkdir -p "$pkgs/kpkg/lib" && mv "$pkgs/kpkg/$m" "$pkgs/kpkg/lib/modules"; fi
  [ "$arch" = amd64 ] || dpkg-deb -x "$(ls "$pkgs"/debs/busybox-static_*_"$arch".deb | head -1)" "$pkgs/bb"
fi
flock -u 9
kver=$(ls "$pkgs/kpkg/lib/modules" | head -1)
kernel="$pkgs/kpkg/boot/vmlinuz-$kver"
[ -f "$kernel" ] || fail "no $kernel in the package"

# ---- the initramfs
root="$work/initramfs"
rm -rf "$root"
mkdir -p "$root/bin" "$root/lib/modules" "$root/etc" "$root/tests" "$root/var"
ln -s ../run "$root/var/run" # iproute2 keeps named namespaces in /var/run/netns
if [ "$arch" = amd64 ]; then cp /bin/busybox "$root/bin/busybox"; else cp "$pkgs/bb/bin/busybox" "$root/bin/busybox"; fi
ln -s busybox "$root/bin/sh"
mkdir -p "$root/opt/redirect"
for b in "${bins[@]}"; do cp "$bin/$b" "$root/opt/redirect/$b"; done
cp scripts/lib/vm-guest.sh "$root/init"
chmod 0755 "$root/init"
printf 'root:x:0:0:root:/:/bin/sh\nproxy:x:1337:1337:istio-proxy:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nproxy:x:1337:\n' >"$root/etc/group"
printf 'VM_NAME=%s\nVM_MODE=%s\nVM_LEFT_OUT=%s\n' "$name" "${leave_out:+floor}" "$leave_out" >"$root/etc/vm.env"
# A dynamically linked program of this machine and the shared libraries it loads, at their paths.
add_host_program() { # PATH [DEST]
  local src=$1 dest=${2:-$1} lib
  mkdir -p "$root/$(dirname "$dest")"
  cp -L "$src" "$root/$dest"
  for lib in $(ldd "$src" 2>/dev/null | awk '/=> \// { print $3 } /^[[:space:]]*\/[^ ]*ld-linux/ { print $1 }'); do
    [ -e "$root/$lib" ] && continue
    mkdir -p "$root/$(dirname "$lib")"
    cp -L "$lib" "$root/$lib"
  done
}
if [ "$arch" = amd64 ]; then
  # dash as sh: busybox's sh runs its own applets first, and the tests' `sh -c "ip ... nodad"`
  # need this machine's iproute2, not busybox's ip.
  rm -f "$root/bin/sh"
  add_host_program /bin/dash /bin/sh
  add_host_program "$(command -v ip)" /usr/sbin/ip
  add_host_program "$(command -v nft)" /usr/sbin/nft
  if [ -n "$tests_file" ]; then
    while read -r tname tpath; do
      [ -n "$tname" ] || continue
      [ -x "$tpath" ] || fail "kernel test $tname: $tpath is not an executable (build the tests first)"
      add_host_program "$tpath" "/tests/$tname"
      strip --strip-debug "$root/tests/$tname" 2>/dev/null || true # the initramfs stays small
    done <"$tests_file"
  fi
fi
# Module NAME -> file (names use _ where files may use -), then each module after its
# dependencies (`depends=` and `softdep=pre:` in its .modinfo; crc32c is crc32c_generic here).
declare -A modfile=() loaded=() builtin=()
while IFS= read -r f; do
  n=${f##*/}; n=${n%.ko*}; modfile[${n//-/_}]=$f
done < <(find "$pkgs/kpkg/lib/modules/$kver/kernel" -name '*.ko*')
while IFS= read -r f; do
  n=${f##*/}; n=${n%.ko}; builtin[${n//-/_}]=1
done <"$pkgs/kpkg/lib/modules/$kver/modules.builtin"
order=()
unpack_ko() {
  case "$1" in
    *.ko.xz) xz -dc "$1" ;; *.ko.zst) zstd -dqc "$1" ;; *) cat "$1" ;;
  esac
}
modinfo_field() { unpack_ko "$1" | tr '\0' '\n' | sed -n "s/^$2=//p" | head -1; } # FILE FIELD
add_mod() {
  local n=$1 d f
  [ -n "${loaded[$n]:-}" ] && return 0
  loaded[$n]=1
  [ -n "${builtin[$n]:-}" ] && return 0 # built into this kernel
  [ "$n" = "$leave_out" ] && return 0
  f=${modfile[$n]:-${modfile[${n}_generic]:-}}
  [ -n "$f" ] || fail "no module $n in $kver (not built in either: check $pkgs/kpkg/boot/config-$kver)"
  for d in $(modinfo_field "$f" softdep | sed 's/^pre: *//; s/post:.*//') $(modinfo_field "$f" depends | tr ',' ' '); do
    add_mod "$d"
  done
  unpack_ko "$f" >"$root/lib/modules/$n.ko"
  order+=("$n")
}
for m in "${mods[@]}"; do add_mod "$m"; done
for m in "${optional[@]}"; do [ -z "${modfile[$m]:-}" ] || add_mod "$m"; done
if [ -n "$leave_out" ]; then
  [ -n "${modfile[$leave_out]:-}" ] || fail "--leave-out $leave_out: $kver has no such module (built in, or misspelt)"
  [ ! -e "$root/lib/modules/$leave_out.ko" ] || fail "$leave_out ended up in the initramfs"
fi
printf '%s\n' "${order[@]}" >"$root/lib/modules/load-order"
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) | gzip -1 >"$work/initramfs.cpio.gz"
echo "vm $name: kernel $kver ($(basename "$(ls "$pkgs"/debs/linux-image-*_"$arch".deb | head -1)")), initramfs $(du -h "$work/initramfs.cpio.gz" | cut -f1), modules: ${order[*]}${leave_out:+ (left out: $leave_out)}"

# ---- x86_64: the same namespaces and rules on this machine's kernel (inspect --json only)
if [ -z "$leave_out" ]; then
  # Its own network and mount namespaces, a /tmp of its own: the matrix runs VMs in parallel.
  VM_ROLE=host VM_BIN="$x86" unshare -n -m sh -c 'mount -t tmpfs tmpfs /tmp && exec sh scripts/lib/vm-guest.sh' >"$work/host.log" 2>&1 \
    || { cat "$work/host.log" >&2; fail "the x86_64 side on this machine failed"; }
fi

# ---- boot; each console line stamped with the host's clock
if [ "$arch" = amd64 ]; then
  if [ "${REDIRECT_VM_ACCEL:-tcg}" = kvm ]; then
    accel=(-accel kvm -cpu host,-arch-capabilities) how=KVM # nested KVM here refuses the ARCH_CAPABILITIES MSR
  else
    # One host thread for both vCPUs: with a thread each (MTTCG), Debian 13's 6.12 oopsed once
    # on an int3 of its own live code patching (secure_tcp_seq_and_ts_off), an emulation race.
    accel=(-accel tcg,thread=single -cpu max) how=TCG
  fi
  machine=(-M q35 "${accel[@]}")
else
  machine=(-M virt -cpu cortex-a57 -accel tcg,thread=multi) how=TCG
fi
log="$work/console.log"
t0=$EPOCHREALTIME
set +e
timeout --foreground -k 5 "$timeout_s" "$qemu" "${machine[@]}" -smp 2 -m 2048 \
  -display none -monitor none -serial stdio -nic none -no-reboot \
  -kernel "$kernel" -initrd "$work/initramfs.cpio.gz" \
  -append "console=$console rdinit=/init quiet loglevel=3 panic=-1" </dev/null 2>&1 \
  | while IFS= read -r l; do l=${l%$'\r'}; printf '%s %s\n' "$EPOCHREALTIME" "$l"; done >"$log"
qrc=${PIPESTATUS[0]}
set -e
t1=$EPOCHREALTIME
sed 's/^[0-9.]* //' "$log" | grep -v '^VM-OUT ' | grep -E '^VM-TEST |^VM-LOG |Kernel panic|panic|Oops|BUG' | sed "s/^/[$name] /" || true
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "[$name] the console's last lines:" >&2
  sed 's/^[0-9.]* //' "$log" | tail -n 30 >&2
  fail "no poweroff within ${timeout_s}s"
fi
start=$(awk '$2 == "VM-TEST" && $3 == "start:" { print $1; exit }' "$log")
done_=$(awk '$2 == "VM-TEST" && $3 == "done" { print $1; exit }' "$log")
if [ -z "$start" ] || [ -z "$done_" ]; then
  sed 's/^[0-9.]* //' "$log" | tail -n 40 >&2
  fail "the guest did not report (qemu exit $qrc); its console is above"
fi
failed=0
grep -q '^[0-9.]* VM-TEST done [0-9]* passed, 0 failed' "$log" || failed=1
# ---- the same decisions: every inspect --json in the guest equals x86_64's here, the netns path aside
if [ -z "$leave_out" ]; then
  norm() { grep '^VM-OUT ' | sed 's/"netns": "[^"]*"/"netns": "-"/' | LC_ALL=C sort; }
  sed 's/^[0-9.]* //' "$log" | norm >"$work/inspect.guest"
  norm <"$work/host.log" >"$work/inspect.host"
  if [ ! -s "$work/inspect.guest" ] || ! diff -u "$work/inspect.host" "$work/inspect.guest" >"$work/inspect.diff"; then
    echo "[$name] VM-TEST fail inspect_same_as_host: the guest's and this machine's inspect --json differ:"
    cat "$work/inspect.diff"
    failed=1
  else
    echo "[$name] VM-TEST ok inspect_same_as_host ($(wc -l <"$work/inspect.guest") outputs identical)"
  fi
fi
boot=$(awk -v a="$t0" -v b="$start" 'BEGIN { printf "%.1f", b - a }')
tests=$(awk -v a="$start" -v b="$done_" 'BEGIN { printf "%.1f", b - a }')
total=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
counts=$(sed -n 's/^[0-9.]* VM-TEST done \([0-9]* passed, [0-9]* failed\).*/\1/p' "$log")
echo "vm $name: Linux $kver, $how: boot ${boot} s (qemu start to /init), checks ${tests} s ($counts), qemu ${total} s in all"
[ "$failed" = 0 ] || fail "see $log"
echo "vm $name: ok"
