#!/usr/bin/env bash
# check-snippet.sh - CI check that the committed snippet in static/ was built from the current
# sources: the hash of its inputs (scripts/snippet-inputs.sh) must equal static/INPUTS, and the
# files static/manifest.rs names must exist with the content hash in their name.
# Fails with the command to run when stale. Needs cargo (for the resolved dependency list),
# no wasm toolchain.
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

for name in $(grep -oE '"tally-[0-9a-f]{12}\.(js|wasm)"' static/manifest.rs | tr -d '"'); do
  [[ -f static/$name ]] || fail "static/manifest.rs names $name, which is missing"
  case $name in
    *.wasm) sum=$(sha256sum < "static/$name") ;;
    # The glue file ends with the newline the build appends; its name hashes the code before it.
    *.js) sum=$(head -c -1 "static/$name" | sha256sum) ;;
  esac
  [[ $name == tally-${sum:0:12}.* ]] || fail "static/$name does not match its content hash"
  grep -q "$name" static/tally.js || fail "static/tally.js does not load $name"
done
extra=$(find static -maxdepth 1 -name 'tally-*' -printf '%f\n' | grep -vxF -f <(grep -oE 'tally-[0-9a-f]{12}\.(js|wasm)' static/manifest.rs) || true)
[[ -z $extra ]] || fail "files not in the manifest: $extra"
echo "check-snippet: ok (inputs $have)"
