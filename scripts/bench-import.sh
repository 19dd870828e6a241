#!/usr/bin/env bash
# Import benchmark: live p99 with no import vs during a `tally import` of a generated combined
# log on the same database (the importer's paced lane), and the import's lines/s, in one run.
#   scripts/bench-import.sh [live-seconds] [-- extra loadgen import args, e.g. --lines 500000
#                                           --import-args="--pause 0"]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-8}
shift $(( $# > 0 ? 1 : 0 ))
[[ ${1:-} == -- ]] && shift
cargo build --profile dist -q -p tally -p tally-loadgen
target/dist/tally-loadgen import --duration "$secs" "$@"
