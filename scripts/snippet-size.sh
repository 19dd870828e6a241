#!/usr/bin/env bash
# snippet-size.sh - the size benchmark of the browser snippet: raw and gzip -9 bytes of the
# loader, the glue and the wasm in static/ (or DIR), against the budget of SPEC §3:
# loader <= 1 KB gzip, everything a page downloads <= 8 KB gzip (1 KB = 1024 bytes).
#   scripts/snippet-size.sh [DIR]      exit 1 when over budget
set -euo pipefail
DIR=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/static}
LOADER_BUDGET=1024 TOTAL_BUDGET=8192
shopt -s nullglob
glue=("$DIR"/tally-*.js) wasm=("$DIR"/tally-*.wasm)
[[ -f $DIR/tally.js && ${#glue[@]} == 1 && ${#wasm[@]} == 1 ]] ||
  { echo "expected tally.js, one tally-*.js and one tally-*.wasm in $DIR" >&2; exit 2; }
total_raw=0 total_gz=0
printf '%-8s %-26s %8s %8s\n' part file raw gzip-9
row() {
  local raw gz; raw=$(stat -c%s "$2"); gz=$(gzip -9c "$2" | wc -c)
  printf '%-8s %-26s %8d %8d\n' "$1" "$(basename "$2")" "$raw" "$gz"
  total_raw=$((total_raw + raw)) total_gz=$((total_gz + gz))
  [[ $1 != loader ]] || loader_gz=$gz
}
row loader "$DIR/tally.js"
row glue "${glue[0]}"
row wasm "${wasm[0]}"
printf '%-8s %-26s %8d %8d\n' total "" "$total_raw" "$total_gz"
status=0
verdict() { if (($2 <= $3)); then echo "ok   $1: $2 <= $3 bytes gzip"; else echo "OVER $1: $2 > $3 bytes gzip"; status=1; fi; }
verdict loader "$loader_gz" $LOADER_BUDGET
verdict total "$total_gz" $TOTAL_BUDGET
exit $status
