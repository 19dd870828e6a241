#!/usr/bin/env bash
# check-snippet.sh - CI check that the committed snippet in static/ was built from the current
# sources: the hash of its inputs (scripts/snippet-inputs.sh) must equal static/INPUTS, the
# files static/manifest.rs names must exist with the content hash in their name, and every
# .gz / .br must decompress to the file it sits beside.
# Fails with the command to run when stale. Needs cargo (for the resolved dependency list) and
# node, no wasm toolchain.
#   scripts/check-snippet.sh [--rebuild]   --rebuild: rebuild first (needs the wasm toolchain)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
[[ ${1:-} != --rebuild ]] || scripts/build-snippet.sh >/dev/null
# shellcheck source=scripts/snippet-inputs.sh
source scripts/snippet-inputs.sh
fail() { echo "check-snippet: $*" >&2; echo "check-snippet: run scripts/build-snippet.sh and commit static/" >&2; exit 1; }

[[ -f static/INPUTS ]] || fail "static/INPUTS is missing"
want=$(cat static/INPUTS)
have=$(snippet_inputs_hash)
[[ $want == "$have" ]] || {
  echo "check-snippet: inputs changed since static/ was built (recorded $want, now $have); inputs:" >&2
  snippet_inputs_listing | sed 's/^/  /' >&2
  fail "static/ is stale"
}

for name in $(grep -oE '"tally-[0-9a-f]{8}\.(js|wasm)"' static/manifest.rs | tr -d '"'); do
  [[ -f static/$name ]] || fail "static/manifest.rs names $name, which is missing"
  case $name in
    *.wasm) sum=$(sha256sum < "static/$name") ;;
    # The glue file ends with the newline the build appends; its name hashes the code before it.
    *.js) sum=$(head -c -1 "static/$name" | sha256sum) ;;
  esac
  [[ $name == tally-${sum:0:8}.* ]] || fail "static/$name does not match its content hash"
  grep -q "$name" static/tally.js || fail "static/tally.js does not load $name"
done
served=$(grep -oE '"/\.\./static/[^"]+"' static/manifest.rs | sed 's|"/\.\./static/||; s|"$||' | LC_ALL=C sort)
extra=$(find static -maxdepth 1 -name 'tally*' -printf '%f\n' | LC_ALL=C sort | grep -vxF -f <(echo "$served") || true)
[[ -z $extra ]] || fail "files not in the manifest: $extra"
# Every precompressed file decompresses to the file beside it (node's zlib reads both).
node - static $served <<'JS' || fail "a precompressed file does not match its original"
const { readFileSync } = require('node:fs');
const { gunzipSync, brotliDecompressSync } = require('node:zlib');
const [dir, ...files] = process.argv.slice(2);
for (const f of files) {
  const unpack = f.endsWith('.gz') ? gunzipSync : f.endsWith('.br') ? brotliDecompressSync : null;
  if (unpack && !unpack(readFileSync(`${dir}/${f}`)).equals(readFileSync(`${dir}/${f.slice(0, -3)}`))) {
    console.error(`check-snippet: static/${f} does not decompress to static/${f.slice(0, -3)}`);
    process.exit(1);
  }
}
JS
echo "check-snippet: ok (inputs $have)"
