#!/usr/bin/env bash
# browser-test.sh - runs the browser suite (tests/browser) in headless Chromium against the real
# `tally` binary: builds target/debug/tally (unless TALLY_BIN is set), installs the pinned
# playwright-core from tests/browser/package-lock.json if needed, installs Debian's chromium if
# missing, then `node --test`. Extra arguments go to node (e.g. a test file).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
if [[ -z ${TALLY_BIN:-} ]]; then
  cargo build --bin tally
  # Where cargo put it (CARGO_TARGET_DIR may point elsewhere).
  export TALLY_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/tally
fi
if [[ ! -x ${CHROMIUM:-/usr/bin/chromium} ]]; then
  SUDO=; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
fi
cd tests/browser
[[ -d node_modules/playwright-core ]] || npm ci --no-audit --no-fund
exec node --test --test-concurrency=1 --test-timeout=120000 "$@"
