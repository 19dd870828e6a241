#!/usr/bin/env bash
# snippet-size.sh - the size benchmark of the browser snippet: the bytes a browser receives for
# the loader, the glue and the wasm in static/ (or DIR). The collector serves each file
# precompressed (server/src/http/assets.rs): brotli (NAME.br) to browsers that accept it
# (every current browser, over https), gzip (NAME.gz, zopfli) to the others (browsers offer br
# only over https, so plain-http pages get gzip). The budget of SPEC §3 (loader <= 1 KB,
# everything a page downloads <= 8 KB; 1 KB = 1024 bytes) is checked on brotli, what a page
# on an https collector receives; the gzip figures are reported beside it, with how far they
# are from the budget. Also shows `gzip -9` of each file: the measure used before the files
# were precompressed.
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
  [[ $1 != loader ]] || loader_gz=$gz loader_br=$br
}
row loader "$DIR/tally.js"
row glue "${glue[0]}"
row wasm "${wasm[0]}"
printf '%-8s %-26s %7d %9d %9d %8d\n' total "" "$total_raw" "$total_gz" "$total_br" "$total_g9"
status=0
verdict() {
  if (($2 <= $3)); then echo "ok   $1 (brotli): $2 <= $3 bytes received"
  else echo "OVER $1 (brotli): $2 > $3 bytes received"; status=1; fi
}
verdict loader "$loader_br" $LOADER_BUDGET
verdict total "$total_br" $TOTAL_BUDGET
note() {
  if (($2 <= $3)); then echo "info $1 (gzip, plain http): $2 <= $3 bytes received"
  else echo "info $1 (gzip, plain http): $2 bytes received, $(($2 - $3)) over the https budget"; fi
}
note loader "$loader_gz" $LOADER_BUDGET
note total "$total_gz" $TOTAL_BUDGET
exit $status
