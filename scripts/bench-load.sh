#!/usr/bin/env bash
# Load benchmark: tally vs a do-nothing baseline, then peak RSS with 1M distinct visitors.
#   scripts/bench-load.sh [seconds-per-server] [-- extra loadgen run args]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
cargo build --release -q -p tally -p tally-loadgen
# Default durability (synchronous=FULL: an fsync per commit), then crash-only durability.
target/release/tally-loadgen run --duration "$secs" --connections 64 --duplicates 25 "${@:2}"
if [[ -z ${SKIP_NORMAL:-} ]]; then
  target/release/tally-loadgen run --duration "$secs" --connections 64 --duplicates 25 --tally-args="--sync normal"
fi
if [[ -z ${SKIP_MEMORY:-} ]]; then
  target/release/tally-loadgen memory --visitors "${VISITORS:-1000000}"
fi
