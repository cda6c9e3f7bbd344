# Shell helpers the scripts in benches/ share (sourced, not run).

# median: the median of the numbers on stdin, one per line, rounded.
median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.0f", m}'; }

# delete_namespaces PREFIX: every namespace named PREFIX*, and its /etc/netns entry.
delete_namespaces() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^$1" || true); do
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
}
