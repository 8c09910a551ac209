#!/usr/bin/env bash
# cargo-deny on the workspace (deny.toml): licences, bans and sources always; the RustSec
# advisories where their database can be fetched or is already cached (~/.cargo/advisory-dbs),
# and otherwise one line saying they were skipped and why. Needs cargo-deny
# (`cargo install cargo-deny --locked`, about 0.20); CI runs this script where it is installed
# (issue 45: building it costs more than CI's budget on a 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo deny --version >/dev/null 2>&1; then
  echo "cargo-deny is not installed: cargo install cargo-deny --locked" >&2
  exit 1
fi
cargo deny --locked check licenses bans sources
dbs="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
if cargo deny fetch db >/dev/null 2>&1; then
  cargo deny --offline check advisories
elif compgen -G "$dbs/advisory-db-*/.git" >/dev/null; then
  echo "== cargo deny: the advisory database could not be fetched; checking the cached copy"
  cargo deny --offline check advisories
else
  echo "== cargo deny advisories: skipped: the RustSec database could not be fetched (no network" \
       "to github.com) and none is cached in $dbs"
fi
