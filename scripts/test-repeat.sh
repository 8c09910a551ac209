#!/usr/bin/env bash
# Runs the README's test command N times (20 by default) on a fresh clone of this checkout's
# HEAD, stopping at the first failure, to show that the suite does not fail by chance.
#
#   scripts/test-repeat.sh [N]
#
# The clone shares this checkout's `target/` build cache through CARGO_TARGET_DIR only when
# VRAMSCOPE_REPEAT_SHARE_TARGET=1 (faster; by default the clone builds on its own, as CI does).
# The shared traces are found beside the clone through VRAMSCOPE_TRACES.
set -euo pipefail
runs="${1:-20}"
here="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
git clone -q "$here" "$work/vramscope"
cd "$work/vramscope"
if [ -d "$here/../shared/traces" ]; then
  export VRAMSCOPE_TRACES="$here/../shared/traces"
fi
if [ "${VRAMSCOPE_REPEAT_SHARE_TARGET:-0}" = 1 ]; then
  export CARGO_TARGET_DIR="$here/target"
fi
echo "== building once at $(git rev-parse --short HEAD)"
cargo test --workspace --locked --no-run -q
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  if ! cargo test --workspace --locked -q >"$work/run.log" 2>&1; then
    echo "run $i of $runs FAILED; its output:"
    tail -n 80 "$work/run.log"
    exit 1
  fi
  echo "run $i of $runs passed ($(( $(date +%s) - start )) s)"
done
echo "all $runs runs passed"
