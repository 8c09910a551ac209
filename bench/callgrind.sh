#!/usr/bin/env bash
# Instructions per operation of each allocator on each trace, counted by callgrind over the
# replay loop only (`measure::run_ops`), so trace loading and set-up are left out. Instruction
# counts do not depend on machine load, unlike the timings of the main benchmark.
#
# Usage (from the workspace root, after `cargo build --release --manifest-path bench/Cargo.toml`):
#   bash bench/callgrind.sh [traces...] [-- subjects...]
# Prints a markdown table; the callgrind files stay in ${CALLGRIND_OUT:-/tmp/vramscope-callgrind}.
# BENCH_BIN names another build of the benchmark to count (a copy of the build before a change).
set -euo pipefail

bin="${BENCH_BIN:-$(dirname "$0")/target/release/vramscope-bench}"
out="${CALLGRIND_OUT:-/tmp/vramscope-callgrind}"
mkdir -p "$out"

traces=()
subjects=()
seen_separator=0
for arg in "$@"; do
    if [ "$arg" = "--" ]; then
        seen_separator=1
    elif [ "$seen_separator" = 0 ]; then
        traces+=("$arg")
    else
        subjects+=("$arg")
    fi
done
[ ${#traces[@]} -gt 0 ] || traces=(synthetic decomfl cs336_medium hta)
[ ${#subjects[@]} -gt 0 ] || subjects=(off events bt64 compact offset gpu-alloc cubecl mimalloc)

echo "| trace | allocator | instructions per operation |"
echo "|---|---|---|"
for trace in "${traces[@]}"; do
    for subject in "${subjects[@]}"; do
        file="$out/$trace.$subject.out"
        log="$out/$trace.$subject.log"
        valgrind --tool=callgrind --toggle-collect='*run_ops*' \
            --callgrind-out-file="$file" \
            "$bin" profile trace "$trace" "$subject" 1 >"$log" 2>&1
        ops=$(sed -n 's/.*: \([0-9]*\) operations.*/\1/p' "$log")
        collected=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$log")
        echo "| $trace | $subject | $((collected / ops)) |"
    done
done
