#!/usr/bin/env bash
# The fuzz smoke run CI makes (issue 45): every target of this crate, built by cargo-fuzz
# without a sanitizer and without optimization (a build of a few minutes rather than the
# `-O` AddressSanitizer build of the real runs in FUZZING.md), then run for a few seconds
# each (FUZZ_SMOKE_SECONDS, default 5) from the committed seeds in seeds/ (made by
# seeds/make_seeds.py). New inputs go to target/smoke-corpus, never into seeds/. A crash, a
# leak past 2 GiB or an input that takes more than 10 s fails the run, with libFuzzer's
# report and the input under artifacts/.
#
# Usage: fuzz/smoke.sh [TARGET...] (default: every target `cargo fuzz list` names).
set -euo pipefail
cd "$(dirname "$0")"
seconds="${FUZZ_SMOKE_SECONDS:-5}"
fuzz=(cargo fuzz)
# The targets and the seeds each starts from.
seeds_of() {
  case "$1" in
    pickle | pickle_fast_path | import | replay | report | summary | export | snapshot_json)
      echo seeds/snapshots ;;
    config) echo seeds/config ;;
    metrics_request) echo seeds/metrics_request ;;
    pickle_lengths) echo seeds/pickle_lengths ;;
    *) echo "" ;;
  esac
}
if [ $# -gt 0 ]; then targets=("$@"); else mapfile -t targets < <("${fuzz[@]}" list); fi
"${fuzz[@]}" build --dev --sanitizer none 2>&1 | tail -n 3
for target in "${targets[@]}"; do
  corpus="target/smoke-corpus/$target"
  mkdir -p "$corpus"
  seeds="$(seeds_of "$target")"
  start=$SECONDS
  # libFuzzer prints a line per new input; keep its last lines and its verdict.
  if ! "${fuzz[@]}" run --dev --sanitizer none "$target" "$corpus" ${seeds:+"$seeds"} -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=65536 \
      -print_final_stats=1 > "target/smoke-$target.log" 2>&1; then
    tail -n 40 "target/smoke-$target.log"
    echo "fuzz smoke: $target failed (log above, input under fuzz/artifacts/$target)" >&2
    exit 1
  fi
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "target/smoke-$target.log" | grep -o '[0-9]*$' || echo '?')"
  echo "fuzz smoke: $target: $runs runs in $((SECONDS - start)) s, nothing found"
done
