#!/usr/bin/env bash
# Run every cargo-fuzz target for SECONDS each (default 60): first the saved crash inputs of
# fuzz/regressions/<target>/ once, then fuzzing from fuzz/corpus/<target>/. Prints each
# target's executions and whether it crashed; exits 1 if any target crashed.
#
#   fuzz/run.sh [SECONDS]          all targets
#   TARGETS="cni_conf cni_args" fuzz/run.sh 30
set -u
cd "$(dirname "$0")"

SECONDS_EACH=${1:-60}
TOOLCHAIN=${TOOLCHAIN:-+nightly}
FLAGS=(-rss_limit_mb=2048 -max_len=65536)
LOGDIR=${LOGDIR:-target/run-logs}

if ! cargo "$TOOLCHAIN" fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz || exit 2
fi

targets=${TARGETS:-$(cargo "$TOOLCHAIN" fuzz list)}
mkdir -p "$LOGDIR"
cargo "$TOOLCHAIN" fuzz build || exit 2

failed=0
summary=()
for t in $targets; do
    status=ok
    # 1. The regressions: each saved input once.
    if compgen -G "regressions/$t/*" >/dev/null; then
        if ! cargo "$TOOLCHAIN" fuzz run "$t" regressions/"$t"/* -- "${FLAGS[@]}" \
            >"$LOGDIR/$t.regressions.log" 2>&1; then
            status="REGRESSION CRASHED (see $LOGDIR/$t.regressions.log)"
        fi
    fi
    # 2. Fuzzing from the corpus.
    mkdir -p "corpus/$t"
    log="$LOGDIR/$t.log"
    if ! cargo "$TOOLCHAIN" fuzz run "$t" -- -max_total_time="$SECONDS_EACH" "${FLAGS[@]}" \
        -print_final_stats=1 >"$log" 2>&1; then
        status="CRASHED (see $log and artifacts/$t/)"
    fi
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
    corpus=$(find "corpus/$t" -type f | wc -l)
    [ "$status" = ok ] || failed=1
    summary+=("$(printf '%-15s %6ss  %12s execs  corpus %5s  %s' "$t" "$SECONDS_EACH" "${execs:-?}" "$corpus" "$status")")
    echo "${summary[-1]}"
done

echo
echo "summary:"
printf '%s\n' "${summary[@]}"
exit $failed
