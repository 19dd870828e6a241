#!/usr/bin/env bash
# Abuse benchmark: legitimate traffic alone, then under one hostile client's flood (loopback
# only; the attacker binds 127.0.0.2, visitors 127.1.x.y). Prints PASS/FAIL per goal.
#   scripts/bench-abuse.sh [seconds-per-phase] [-- extra loadgen abuse args]
# e.g. scripts/bench-abuse.sh 20 -- --attack-kinds huge-parse,badge --strict
# TALLY_ARGS replaces the serve flags besides --listen/--db (default: --auto-sites).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-15}
shift $(( $# > 0 ? 1 : 0 ))
[[ ${1:-} == -- ]] && shift
cargo build --profile dist -q -p tally -p tally-loadgen
target/dist/tally-loadgen abuse --duration "$secs" \
  --tally-args="${TALLY_ARGS:---auto-sites}" "$@"
