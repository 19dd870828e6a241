#!/usr/bin/env bash
# Load benchmark: tally vs a do-nothing baseline and a durable ceiling (realistic mix), then
# peak RSS with 1M distinct visitors.
#   scripts/bench-load.sh [seconds-per-server] [-- extra loadgen run args, e.g. --mix cache]
# TALLY_ARGS replaces the serve flags (besides --listen/--db) of every run; ROUNDS (default 3)
# sets the rounds of the first run (baseline, ceiling, tally each round; medians printed).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
shift $(( $# > 0 ? 1 : 0 ))
[[ ${1:-} == -- ]] && shift
args=${TALLY_ARGS:---auto-sites --rate-limit-per-minute 0}
cargo build --profile dist -q -p tally -p tally-loadgen
# Default durability (synchronous=FULL: an fsync per commit), then crash-only durability.
target/dist/tally-loadgen run --duration "$secs" --rounds "${ROUNDS:-3}" --connections 64 \
  --duplicates 25 --tally-args="$args" "$@"
if [[ -z ${SKIP_NORMAL:-} ]]; then
  target/dist/tally-loadgen run --duration "$secs" --connections 64 --duplicates 25 \
    --tally-args="$args --sync normal" "$@"
fi
if [[ -z ${SKIP_MEMORY:-} ]]; then
  target/dist/tally-loadgen memory --visitors "${VISITORS:-1000000}" --tally-args="$args"
fi
