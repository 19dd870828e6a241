#!/usr/bin/env bash
# snippet-inputs.sh - prints the SHA-256 of everything the committed snippet in static/ is
# built from. build-snippet.sh records it in static/INPUTS; check-snippet.sh compares. A
# rebuild is not byte-identical across machines, so CI compares inputs, not outputs.
#
# Inputs: the client crate (Cargo.toml, src/ except the test-only src/client/tests.rs, js/),
# the wire crate (Cargo.toml, src/), the build recipe (this file, build-snippet.sh, which holds
# every build flag and tool pin, and assemble-snippet.mjs), the parts of the workspace
# Cargo.toml the client build reads ([profile.*] and the shared dependency lines it uses),
# and the exact resolved versions of the client's dependencies on wasm32 - the client's slice
# of Cargo.lock, so a server dependency bump does not make the snippet stale while a serde or
# wasm-bindgen bump does.
#   scripts/snippet-inputs.sh          print the hash
#   scripts/snippet-inputs.sh --list   print what is hashed
set -euo pipefail

snippet_inputs_listing() {
  local root f deps
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cd "$root"
  local files
  files=$(find client-wasm/Cargo.toml client-wasm/src client-wasm/js wire/Cargo.toml wire/src \
    scripts/build-snippet.sh scripts/snippet-inputs.sh scripts/assemble-snippet.mjs -type f \
    ! -path client-wasm/src/client/tests.rs | LC_ALL=C sort)
  for f in $files; do printf '%s %s\n' "$f" "$(sha256sum < "$f" | cut -d' ' -f1)"; done
  echo "--- workspace Cargo.toml: profiles and shared dependencies"
  awk '/^\[/ { section = $0 }
       section ~ /^\[profile\.(release|wasm)\]/ || section ~ /^\[workspace\.package\]/ { print; next }
       section == "[workspace.dependencies]" && /^(serde|uuid|tally-wire) / { print }' Cargo.toml
  echo "--- resolved dependencies (wasm32)"
  deps=$(cargo tree -p tally-client --target wasm32-unknown-unknown -e normal,build --prefix none \
    --format '{p}' --offline 2>/dev/null ||
    cargo tree -p tally-client --target wasm32-unknown-unknown -e normal,build --prefix none --format '{p}')
  # Path dependencies print their absolute path: drop it, it differs between checkouts.
  sed 's/ (\/[^)]*)//; s/ (\*)$//' <<<"$deps" | LC_ALL=C sort -u
}

snippet_inputs_hash() {
  local listing
  listing=$(snippet_inputs_listing)
  sha256sum <<<"$listing" | cut -d' ' -f1
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  if [[ ${1:-} == --list ]]; then snippet_inputs_listing; else snippet_inputs_hash; fi
fi
