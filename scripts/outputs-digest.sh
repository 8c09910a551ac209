#!/usr/bin/env bash
# Writes one line per output of every command on the shared traces and the in-repo H200
# recordings: `<sha256>  <trace> <command>`, so that a change meant to keep behaviour (a crate
# moved, a module split, a constant given one home) can be checked byte for byte:
#
#   scripts/outputs-digest.sh > before.txt      # on the commit before the change
#   scripts/outputs-digest.sh > after.txt       # after it
#   diff before.txt after.txt && echo identical
#
# VRAMSCOPE_BIN names the binary to run (default: target/release/vramscope, built if absent).
# The shared traces come from $VRAMSCOPE_TRACES, else ../shared/traces.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${VRAMSCOPE_BIN:-target/release/vramscope}"
if [ ! -x "$bin" ]; then
  cargo build --release --locked --bin vramscope >&2
fi
traces="${VRAMSCOPE_TRACES:-../shared/traces}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
files=()
for f in "$traces"/*.pickle "$traces"/*.json.gz testkit/data/torch_h200/*.pickle.gz; do
  [ -e "$f" ] && files+=("$f")
done
if [ ${#files[@]} -eq 0 ]; then
  echo "no traces found (looked in $traces and testkit/data/torch_h200)" >&2
  exit 1
fi
digest() { # name, then the command
  local name="$1"; shift
  local status=0
  "$@" >"$work/out" 2>"$work/err" || status=$?
  printf '%s %s  %s\n' "$(cat "$work/out" "$work/err" | sha256sum | cut -c1-16)" "exit=$status" "$name"
}
for f in "${files[@]}"; do
  t="$(basename "$f")"
  for fmt in text json markdown html; do
    digest "$t report --format $fmt" "$bin" report "$f" --format "$fmt"
  done
  digest "$t summary" "$bin" summary "$f"
  digest "$t replay" "$bin" replay "$f"
  digest "$t replay --format json" "$bin" replay "$f" --format json
  digest "$t replay --verify" "$bin" replay "$f" --verify
  digest "$t replay --sweep --capacity 8GiB" "$bin" replay "$f" --sweep --capacity 8GiB
  for to in json perfetto pytorch events; do
    digest "$t convert --to $to" "$bin" convert "$f" --to "$to" -o -
  done
  digest "$t diff itself --at peak" "$bin" diff "$f" "$f" --at peak
done
digest "ranks of the shared traces" "$bin" ranks "${files[@]}"
