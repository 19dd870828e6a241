#!/usr/bin/env bash
# snippet-size.sh - the size benchmark of the browser snippet: the bytes of the loader, the glue
# and the wasm in static/ (or DIR), against the budget of docs/behaviour.md §3 ("measured with
# gzip -9"): loader <= 1 KB, everything a page downloads <= 8 KB (1 KB = 1024 bytes).
# The verdict is on `gzip -9` of each file (the file name gzip stores in its header included,
# ~10-25 B per file, so the figure errs high). Reported beside it, the bytes the collector
# actually sends (server/src/http/assets.rs serves each file precompressed): NAME.gz (zopfli,
# to browsers without brotli, e.g. on plain http, where browsers do not offer it) and NAME.br
# (brotli, every current browser over https). Both are normally smaller than gzip -9; the
# script checks them against the same budget too, so what is served never exceeds it either.
#   scripts/snippet-size.sh [DIR]      exit 1 when over budget
set -euo pipefail
DIR=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/static}
LOADER_BUDGET=1024 TOTAL_BUDGET=8192
shopt -s nullglob
glue=("$DIR"/tally-*.js) wasm=("$DIR"/tally-*.wasm)
[[ -f $DIR/tally.js && ${#glue[@]} == 1 && ${#wasm[@]} == 1 ]] ||
  { echo "expected tally.js, one tally-*.js and one tally-*.wasm in $DIR" >&2; exit 2; }
for f in "$DIR/tally.js" "${glue[0]}" "${wasm[0]}"; do
  [[ -f $f.gz && -f $f.br ]] || { echo "missing $f.gz or $f.br: run scripts/build-snippet.sh" >&2; exit 2; }
done
total_raw=0 total_gz=0 total_br=0 total_g9=0
printf '%-8s %-26s %7s %9s %9s %8s\n' part file raw 'gzip(.gz)' 'br(.br)' 'gzip -9'
row() {
  local raw gz br g9
  raw=$(stat -c%s "$2") gz=$(stat -c%s "$2.gz") br=$(stat -c%s "$2.br") g9=$(gzip -9c "$2" | wc -c)
  printf '%-8s %-26s %7d %9d %9d %8d\n' "$1" "$(basename "$2")" "$raw" "$gz" "$br" "$g9"
  total_raw=$((total_raw + raw)) total_gz=$((total_gz + gz)) total_br=$((total_br + br)) total_g9=$((total_g9 + g9))
  [[ $1 != loader ]] || loader_g9=$g9 loader_gz=$gz loader_br=$br
}
row loader "$DIR/tally.js"
row glue "${glue[0]}"
row wasm "${wasm[0]}"
printf '%-8s %-26s %7d %9d %9d %8d\n' total "" "$total_raw" "$total_gz" "$total_br" "$total_g9"
status=0
verdict() {
  if (($2 <= $3)); then echo "ok   $1 (gzip -9): $2 <= $3 bytes ($(($3 - $2)) to spare)"
  else echo "OVER $1 (gzip -9): $2 > $3 bytes ($(($2 - $3)) over)"; status=1; fi
}
verdict loader "$loader_g9" $LOADER_BUDGET
verdict total "$total_g9" $TOTAL_BUDGET
served() {
  if (($2 <= $4 && $3 <= $4)); then echo "ok   $1 as served: $2 B gzip (.gz), $3 B brotli (.br)"
  else echo "OVER $1 as served: $2 B gzip (.gz), $3 B brotli (.br), budget $4"; status=1; fi
}
served loader "$loader_gz" "$loader_br" $LOADER_BUDGET
served total "$total_gz" "$total_br" $TOTAL_BUDGET
exit $status
