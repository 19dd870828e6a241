#!/usr/bin/env bash
# The whole test suite — what CI runs (after .ci/run installed what a fresh machine lacks):
# formatting, clippy -D warnings, every Rust test (unit, integration over real HTTP with real
# SQLite files, kill -9 crash test, store conformance), schemathesis against a live server
# (every answer conforms to /api/v1/openapi.json, no 5xx), the proof that the committed snippet
# in static/ was built from the current sources, and the browser suite in headless Chromium
# against the real binary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step() { printf '\n== %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check
step "no import cycles between the collector's modules"
scripts/check-layers.py
step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
step "cargo test"
# The connection tests measure timeouts in seconds: they run alone after the rest, so a
# parallel CPU-heavy test cannot push them past their deadlines. Both runs are the same
# `cargo test --workspace` with only the name filter changed, so cargo resolves the same
# features and builds nothing twice (naming a target, `-p tally` or `--test it`, activates
# other dev-dependency features and recompiled ~3.7 min of dependencies).
cargo test --workspace -- --skip connections::
step "cargo test: connection timeouts, one at a time"
cargo test --workspace -- connections:: --test-threads=1
step "API conformance: schemathesis against a live server (scripts/api-test.sh)"
scripts/api-test.sh
step "committed snippet is current"
scripts/check-snippet.sh
step "snippet size budget (docs/behaviour.md §3: gzip -9, loader <= 1 KB, all <= 8 KB)"
scripts/snippet-size.sh
step "browser suite (headless Chromium)"
scripts/browser-test.sh
