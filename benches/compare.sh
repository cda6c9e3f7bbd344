#!/usr/bin/env bash
# Whole-process time to program a pod's capture in a fresh network namespace, side by side:
# our programs (release builds) against Istio's rules for the same configuration loaded the way
# Istio loads them (iptables-restore per family, or `nft -f` for Istio's native nftables backend).
#
# Scenarios (Istio's rules come from ../shared/testdata/istio via target/release/bench-data):
#   startup     each binary doing nothing: redirect-cni VERSION, redirect-init and
#               redirect-validate --help, against /bin/true (the floor).
#   default     Istio's sidecar default, IPv4 pod:
#                 redirect-init -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x '' -b '*' -d 15090,15021,15020 -o 15020
#               vs iptables-restore (what Istio runs for an IPv4 pod), iptables-restore +
#               ip6tables-restore (a dual-stack pod), nft -f of Istio's nftables rules, and the
#               commands istio-iptables itself runs (save v4+v6, restore, save v4+v6; its own Go
#               start-up not counted).
#   replace     over a namespace that has the default rules already (applied before the clock
#               starts): redirect-init --force-apply of the same (the table is read and found
#               equal), redirect-init --reconcile of another config (-d adds a port: an update in
#               place), and a second redirect-cni ADD.
#   dual-stack  Istio's dns-uid-gid case (DNS, 2 UIDs, 2 GIDs, IPv4 + IPv6): both restores.
#   exclude-10k the default with 10,000 excluded CIDRs (-x): ours (one interval set) vs Istio's
#               10,000 RETURN rules (iptables-restore, nft -f) and vs nft -f of our own table.
#   cni         redirect-cni ADD (chained, annotations from runtimeConfig, no API call), run from
#               the host namespace as a runtime does, for the default and the 10k case.
#
# Our binaries come from REDIRECT_BIN_DIR (default: the static build of scripts/build-static.sh,
# built if missing); point it at another build (e.g. an older release) to compare the two.
#
# Each run gets its own namespace (veth with a pod address, lo up); the time is taken around the
# command alone with bash's $EPOCHREALTIME (no extra fork): exec, start-up, kernel work, exit.
# The command's output goes to files on tmpfs, opened and truncated before the clock starts (as
# a container's log pipe is open before it starts): truncating the previous run's log on a disk
# file system inside the clock cost ~0.3 ms, charged only to the tools that print.
# The tools are interleaved within each round so machine drift hits all alike.
# A footprint section follows: binary sizes and peak RSS (/usr/bin/time).
#
# Usage (root): bash benches/compare.sh [RUNS]   (default 30; the 10k scenarios run RUNS/3, min 5)
set -euo pipefail

RUNS=${1:-${RUNS:-30}}
RUNS_10K=$(( RUNS / 3 > 5 ? RUNS / 3 : 5 ))
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
REL=$ROOT/target/release
. "$ROOT/benches/lib.sh"
bash "$ROOT/scripts/install-deps.sh"
our_binaries "$ROOT"
[ -x "$REL/bench-data" ] || (cd "$ROOT" && cargo build --release -q -p redirect-benches --bin bench-data)
CNI_BASIC=$SHARED/testdata/istio/cni/basic.restore
DNS4=$SHARED/testdata/istio/iptables/dns-uid-gid.restore
DNS6=$SHARED/testdata/istio/iptables/dns-uid-gid.restore6
for f in "$CNI_BASIC" "$DNS4" "$DNS6"; do
  [ -r "$f" ] || { echo "missing $f (set SHARED=path/to/shared)" >&2; exit 1; }
done

NS_PREFIX="rdcmp$$"
DATA=$(mktemp -d /tmp/rdcmp.XXXXXX)
LOGS=$(mktemp -d /dev/shm/rdcmp.XXXXXX 2>/dev/null || mktemp -d /tmp/rdcmp-logs.XXXXXX)
export OUT=$LOGS/out ERR=$LOGS/err
cleanup() {
  delete_namespaces "$NS_PREFIX"
  rm -rf "$DATA" "$LOGS" "${BIN_COPY:-}"
}
trap cleanup EXIT

"$REL/bench-data" "$DATA" "$CNI_BASIC" 10000
EXCLUDE=$(cat "$DATA/exclude.list")

# fresh_ns NAME: a namespace with lo up and a veth carrying 10.99.0.2/24 and fd99::2/64.
fresh_ns() {
  ip netns add "$1"
  ip -n "$1" link set lo up
  ip -n "$1" link add v0 type veth peer name v1
  ip -n "$1" addr add 10.99.0.2/24 dev v0
  ip -n "$1" addr add fd99::2/64 dev v0 nodad
  ip -n "$1" link set v0 up
  mkdir -p "/etc/netns/$1"
  printf 'nameserver 127.0.0.53\nnameserver ::127.0.0.53\n' > "/etc/netns/$1/resolv.conf"
}

# timed_in NAME SCRIPT: run SCRIPT with bash inside namespace NAME; print its duration in µs.
timed_in() {
  ip netns exec "$1" bash -c '
    exec 3>"$ERR"
    t0=$EPOCHREALTIME
    eval "$0" >/dev/null 2>&3 || { cat "$ERR" >&2; exit 1; }
    t1=$EPOCHREALTIME
    echo $(( ${t1/./} - ${t0/./} ))' "$2"
}

# timed_cni NAME CONF [CMD]: one redirect-cni ADD (or CMD) from the host namespace into NAME; µs.
timed_cni() { timed_plugin "$1" "$BIN/redirect-cni" "$2" "${3:-ADD}"; }

INIT_DEFAULT="$BIN/redirect-init -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x '' -b '*' -d 15090,15021,15020 -o 15020"
declare -A CMDS SETUP
CMDS[startup/redirect-cni-VERSION]="cni-version:"
CMDS[startup/redirect-init--help]="$BIN/redirect-init --help"
CMDS[startup/redirect-validate--help]="$BIN/redirect-validate --help"
CMDS[startup/true]="/bin/true"
CMDS[default/redirect-init]=$INIT_DEFAULT
CMDS[default/iptables-nft-restore]="iptables-nft-restore --noflush $DATA/istio-default.restore"
CMDS[default/iptables-nft-restore+ip6tables-nft-restore]="iptables-nft-restore --noflush $DATA/istio-default.restore && ip6tables-nft-restore --noflush $DATA/istio-default.restore6"
CMDS[default/iptables-legacy-restore]="iptables-legacy-restore --noflush $DATA/istio-default.restore"
CMDS[default/iptables-legacy-restore+ip6tables-legacy-restore]="iptables-legacy-restore --noflush $DATA/istio-default.restore && ip6tables-legacy-restore --noflush $DATA/istio-default.restore6"
CMDS[default/nft-f-istio-rules]="nft -f $DATA/istio-default.nft"
CMDS[default/istio-iptables-commands]="iptables-nft-save; ip6tables-nft-save; iptables-nft-restore --noflush $DATA/istio-default.restore && iptables-nft-save && ip6tables-nft-save"
CMDS[default/redirect-cni-ADD]="cni:$DATA/cni-default.json"
CMDS[replace/redirect-init]="$INIT_DEFAULT --force-apply"
SETUP[replace/redirect-init]=$INIT_DEFAULT
CMDS[replace/redirect-init--reconcile-another]="${INIT_DEFAULT/15090,15021,15020/15090,15021,15020,9000} --reconcile"
SETUP[replace/redirect-init--reconcile-another]=$INIT_DEFAULT
CMDS[replace/redirect-cni-ADD-again]="cni:$DATA/cni-default.json"
SETUP[replace/redirect-cni-ADD-again]="cni:$DATA/cni-default.json"
CMDS[dual-stack/redirect-init]="$BIN/redirect-init -p 15001 -z 15006 -u 3,4 -g 1,2 --redirect-dns --dual-stack"
CMDS[dual-stack/iptables-nft-restore+ip6tables-nft-restore]="iptables-nft-restore --noflush $DNS4 && ip6tables-nft-restore --noflush $DNS6"
CMDS[dual-stack/iptables-legacy-restore+ip6tables-legacy-restore]="iptables-legacy-restore --noflush $DNS4 && ip6tables-legacy-restore --noflush $DNS6"
# The list goes in as one argument (125 KB; the kernel's limit per argument is 128 KiB).
CMDS[exclude-10k/redirect-init]="$BIN/redirect-init -p 15001 -z 15006 -u 1337 -m REDIRECT -i '*' -x $EXCLUDE -b '*' -d 15090,15021,15020 -o 15020"
CMDS[exclude-10k/iptables-nft-restore]="iptables-nft-restore --noflush $DATA/istio-exclude.restore"
CMDS[exclude-10k/iptables-legacy-restore]="iptables-legacy-restore --noflush $DATA/istio-exclude.restore"
CMDS[exclude-10k/nft-f-istio-rules]="nft -f $DATA/istio-exclude.nft"
CMDS[exclude-10k/nft-f-our-set]="nft -f $DATA/ours-exclude.nft"
CMDS[exclude-10k/redirect-cni-ADD]="cni:$DATA/cni-exclude.json"
ORDER=(startup/true startup/redirect-cni-VERSION startup/redirect-init--help
       startup/redirect-validate--help
       default/redirect-init default/iptables-nft-restore
       default/iptables-nft-restore+ip6tables-nft-restore default/iptables-legacy-restore
       default/iptables-legacy-restore+ip6tables-legacy-restore default/nft-f-istio-rules
       default/istio-iptables-commands default/redirect-cni-ADD
       replace/redirect-init replace/redirect-init--reconcile-another replace/redirect-cni-ADD-again
       dual-stack/redirect-init dual-stack/iptables-nft-restore+ip6tables-nft-restore
       dual-stack/iptables-legacy-restore+ip6tables-legacy-restore
       exclude-10k/redirect-init exclude-10k/iptables-nft-restore exclude-10k/iptables-legacy-restore
       exclude-10k/nft-f-istio-rules exclude-10k/nft-f-our-set exclude-10k/redirect-cni-ADD)

# ONLY=REGEX keeps the scenarios whose key matches (e.g. ONLY='^default/'), to look at one closely.
if [ -n "${ONLY:-}" ]; then
  kept=(); for key in "${ORDER[@]}"; do [[ $key =~ $ONLY ]] && kept+=("$key"); done
  ORDER=("${kept[@]}")
fi

# A node always holds netfilter hooks somewhere (kube-proxy, the host's firewall, other pods), so
# the kernel's static keys for the nat and conntrack hooks are on. On this test machine nothing
# else holds them: the first hook registered after all others went away patches kernel text on
# every CPU (about 0.7 ms in a VM), charged to whichever tool comes first after a namespace
# without rules. One namespace holding the hooks of every tool here keeps the keys on for all.
# KEEP_HOOKS=0 turns it off.
if [ "${KEEP_HOOKS:-1}" != 0 ]; then
  fresh_ns "$NS_PREFIX-hooks"
  ip netns exec "$NS_PREFIX-hooks" bash -c "iptables-legacy-restore --noflush $DATA/istio-default.restore &&
    ip6tables-legacy-restore --noflush $DATA/istio-default.restore6 && nft -f $DATA/istio-default.nft"
fi

declare -A RESULTS
n=0
for ((i = 0; i < RUNS; i++)); do
  for key in "${ORDER[@]}"; do
    [[ $key == exclude-10k/* ]] && (( i >= RUNS_10K )) && continue
    ns="$NS_PREFIX-$n"; n=$((n + 1))
    fresh_ns "$ns"
    cmd=${CMDS[$key]}
    setup=${SETUP[$key]:-}
    if [[ $setup == cni:* ]]; then
      timed_cni "$ns" "${setup#cni:}" >/dev/null
    elif [ -n "$setup" ]; then
      timed_in "$ns" "$setup" >/dev/null
    fi
    if [[ $cmd == cni:* ]]; then
      us=$(timed_cni "$ns" "${cmd#cni:}")
    elif [[ $cmd == cni-version:* ]]; then
      us=$(timed_cni "$ns" /dev/null VERSION)
    else
      us=$(timed_in "$ns" "$cmd")
    fi
    RESULTS[$key]+="$us "
    ip netns del "$ns"; rm -rf "/etc/netns/$ns"
  done
done

# A fork+exec of /bin/true timed the same way: the floor every whole-process number includes.
fresh_ns "$NS_PREFIX-floor"
for ((i = 0; i < RUNS; i++)); do RESULTS[floor]+="$(timed_in "$NS_PREFIX-floor" /bin/true) "; done

med() { tr ' ' '\n' <<<"${RESULTS[$1]:-}" | { grep . || true; } | median; }
ratio() { [ -n "$2" ] && [ "$2" != 0 ] && awk -v a="$1" -v b="$2" 'BEGIN{printf "%.1fx", a/b}' || echo -; }
echo "machine: $(nproc) cores, $(uname -r), runs: $RUNS ($RUNS_10K for exclude-10k), fresh namespace each"
echo "our binaries: $BIN_FROM, run from a copy ($(file -b "$BIN/redirect-cni" | cut -d, -f1-2))"
floor=$(med floor)
echo "fork+exec of /bin/true (the floor of every number below): $floor µs"
printf '%-62s %10s %9s %14s\n' "command" "median µs" "vs ours" "minus floor"
for scen in startup default replace dual-stack exclude-10k; do
  case $scen in
    startup) ours=$(med startup/true) ;;
    replace) ours=$(med default/redirect-init) ;;
    *) ours=$(med "$scen/redirect-init") ;;
  esac
  for key in "${ORDER[@]}"; do
    [[ $key == $scen/* ]] || continue
    m=$(med "$key")
    if [ -n "$ours" ]; then
      printf '%-62s %10s %9s %14s\n' "$key" "$m" "$(ratio "$m" "$ours")" \
        "$(ratio $(( m - floor )) $(( ours - floor )))"
    else
      printf '%-62s %10s %9s %14s\n' "$key" "$m" - -
    fi
  done
done
echo "(vs ours: the command's median over redirect-init's in the same scenario (startup: over"
echo " /bin/true; replace: over redirect-init's first apply); minus floor: the same ratio after"
echo " taking the /bin/true floor off both, i.e. the work beyond starting a process)"

echo
echo "footprint ($BIN_FROM):"
for b in redirect-init redirect-cni redirect-validate; do
  printf '  %-18s %6.2f MB\n' "$b" "$(awk -v s="$(stat -c %s "$BIN/$b")" 'BEGIN{print s/1e6}')"
done
rss_in() { ip netns exec "$1" /usr/bin/time -f %M bash -c "$2 >/dev/null 2>&1" 2>&1 | tail -1; }
fresh_ns "$NS_PREFIX-rss1"
echo "  peak RSS, redirect-init apply (default):     $(rss_in "$NS_PREFIX-rss1" "exec $INIT_DEFAULT") KB"
fresh_ns "$NS_PREFIX-rss2"
echo "  peak RSS, redirect-init apply (10k CIDRs):   $(rss_in "$NS_PREFIX-rss2" "exec ${CMDS[exclude-10k/redirect-init]}") KB"
for case in default exclude; do
  fresh_ns "$NS_PREFIX-rss-$case"
  kb=$(CNI_COMMAND=ADD CNI_CONTAINERID=bench CNI_NETNS=/run/netns/$NS_PREFIX-rss-$case CNI_IFNAME=v0 \
       CNI_PATH=/opt/cni/bin CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0" \
       /usr/bin/time -f %M "$BIN/redirect-cni" <"$DATA/cni-$case.json" 2>&1 >/dev/null | tail -1)
  printf '  %-44s %s KB\n' "peak RSS, redirect-cni ADD ($case):" "$kb"
done
fresh_ns "$NS_PREFIX-rss3"
echo "  peak RSS, iptables-nft-restore (default):    $(rss_in "$NS_PREFIX-rss3" "exec iptables-nft-restore --noflush $DATA/istio-default.restore") KB"
fresh_ns "$NS_PREFIX-rss4"
echo "  peak RSS, nft -f Istio rules (10k CIDRs):    $(rss_in "$NS_PREFIX-rss4" "exec nft -f $DATA/istio-exclude.nft") KB"
