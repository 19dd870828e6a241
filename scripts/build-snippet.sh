#!/usr/bin/env bash
# build-snippet.sh - builds Tally's browser snippet into static/ (committed, so `tally serve`
# needs no wasm toolchain). One command: scripts/build-snippet.sh
#
# Steps: cargo build of client-wasm for wasm32-unknown-unknown (profile `wasm`: opt-level z,
# LTO, one codegen unit, panic abort; plus, on the Debian toolchain, a size-optimised std
# with panic=immediate-abort) -> wasm-bindgen --target web -> wasm-opt -Oz (binaryen from
# npm; bookworm's binaryen 108 emits modules that do not load) -> scripts/assemble-snippet.mjs
# (substitute the operation codes of src/ops.rs into the JS, inline js/host.js into the glue,
# minify glue and loader, content-hash the names, precompress each file to .gz and .br, write
# static/ and static/manifest.rs) -> static/INPUTS (scripts/snippet-inputs.sh) -> sizes.
#
# Toolchains:
#  - a rustup with `rustup target add wasm32-unknown-unknown`: plain cargo; wasm-bindgen-cli
#    of the exact locked version is installed with cargo if missing;
#  - otherwise ../shared/tools/wasm-toolchain.sh (or $WASM_TOOLCHAIN) sets up Debian's
#    rustc-web with -Zbuild-std (WASMKIT_SMALL=1).
# Env: CARGO_TARGET_DIR (default target/wasm), WASMKIT_TOOLS (default ~/.cache/wasmkit),
#      SNIPPET_OUT (default static).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
T=wasm32-unknown-unknown
OUT=${SNIPPET_OUT:-$ROOT/static}
TOOLS=${WASMKIT_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/wasmkit}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/wasm}
log() { echo "[snippet] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

WB_VERSION=$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/version = |"/,""); print; exit}' Cargo.lock)
[[ -n $WB_VERSION ]] || die "no wasm-bindgen in Cargo.lock"

# --- 1. the toolchain -------------------------------------------------------------------
TOOLCHAIN=${WASM_TOOLCHAIN:-$ROOT/../shared/tools/wasm-toolchain.sh}
if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx $T; then
  MODE=rustup
  WB=$TOOLS/wasm-bindgen-$WB_VERSION/bin/wasm-bindgen
  if [[ $("$WB" --version 2>/dev/null) != "wasm-bindgen $WB_VERSION" ]]; then
    if [[ $(wasm-bindgen --version 2>/dev/null) == "wasm-bindgen $WB_VERSION" ]]; then WB=wasm-bindgen
    else
      log "cargo install wasm-bindgen-cli@$WB_VERSION"
      cargo install --locked wasm-bindgen-cli --version "=$WB_VERSION" --root "$TOOLS/wasm-bindgen-$WB_VERSION" >&2
    fi
  fi
  BUILD=(cargo build --target $T)
elif [[ -f $TOOLCHAIN ]]; then
  MODE=debian
  eval "$(WASMKIT_SMALL=1 WASMKIT_TOOLS=$TOOLS bash "$TOOLCHAIN" setup "$ROOT/Cargo.lock")"
  WB=wasm-bindgen
  # No file/line/column strings for panic locations, no Debug formatting code (both unused
  # with panic=immediate-abort, but they can still leave data and code behind).
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS+=" -Zlocation-detail=none -Zfmt-debug=none"
  export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS
  # shellcheck disable=SC2206  # WASM_CARGO_FLAGS is a flag list by design
  BUILD=($WASM_CARGO build $WASM_CARGO_FLAGS)
else
  die "no wasm32 toolchain: run 'rustup target add $T', or provide ../shared/tools/wasm-toolchain.sh"
fi

# --- 2. compile -------------------------------------------------------------------------
# No reference types (on by default for wasm32 since Rust 1.82): the module passes no
# JavaScript objects, and without them wasm-bindgen makes no externref table, with its
# initialiser import and start export (74 B gzip in all).
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS="${CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS:-} -Ctarget-feature=-reference-types"
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUSTFLAGS
# Per-package optimisation levels, measured (ARCHITECTURE.md, "Size"): `alloc` at 1 keeps
# String and Vec growth as shared calls rather than copies inlined at every push, and
# wasm-bindgen at "s" lets LLVM see that a string handed over from JavaScript never needs
# shrinking: 268 B gzip less together; every other package is smallest at the profile's "z".
# Given here, not in Cargo.toml: `alloc` is a package only under -Zbuild-std, and there cargo
# would warn on every other build that the override names no package.
BUILD+=(--config 'profile.wasm.package.alloc.opt-level=1' --config 'profile.wasm.package.wasm-bindgen.opt-level="s"')
log "mode=$MODE: ${BUILD[*]} -p tally-client --lib --profile wasm"
# Keep the target_features section (strip=true drops it and wasm-bindgen then guesses);
# wasm-bindgen removes names and producers below, wasm-opt the rest.
CARGO_PROFILE_WASM_STRIP=debuginfo "${BUILD[@]}" -p tally-client --lib --profile wasm >&2
RAW=$CARGO_TARGET_DIR/$T/wasm/tally_client.wasm

# --- 3. bindgen -------------------------------------------------------------------------
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
"$WB" --target web --encode-into always --omit-default-module-path \
  --remove-name-section --remove-producers-section --no-typescript --out-dir "$TMP" "$RAW"

# --- 4. wasm-opt ------------------------------------------------------------------------
# Pinned node tools (part of the recorded inputs, since they are in this file).
# @gfx/zopfli (zopfli in wasm) writes the .gz and brotli-wasm (the brotli crate in wasm) the
# .br of each file: deterministic, ~3% and ~10% smaller than gzip -9.
NODE_TOOLS=(binaryen@132.0.0 terser@5.51.2 @gfx/zopfli@1.0.15 brotli-wasm@3.0.1)
NODE_PREFIX=$TOOLS/snippet-node
export SNIPPET_NODE_MODULES=$NODE_PREFIX/node_modules
if [[ $(cat "$NODE_PREFIX/.pins" 2>/dev/null) != "${NODE_TOOLS[*]}" ]]; then
  log "npm install ${NODE_TOOLS[*]}"
  mkdir -p "$NODE_PREFIX"
  npm install --prefix "$NODE_PREFIX" --no-audit --no-fund --save-exact "${NODE_TOOLS[@]}" >&2
  echo "${NODE_TOOLS[*]}" > "$NODE_PREFIX/.pins"
fi
WASM_OPT=$SNIPPET_NODE_MODULES/.bin/wasm-opt
# Rust's wasm32 target enables these features by default; wasm-opt must be told.
FEATURES=(--enable-bulk-memory --enable-bulk-memory-opt --enable-sign-ext --enable-mutable-globals
  --enable-nontrapping-float-to-int --enable-reference-types --enable-multivalue)
# Exports the trimmed glue never calls (assemble-snippet.mjs drops wasm-bindgen's
# free-on-exception and realloc paths): removing them lets -Oz delete the code behind them.
for unused in __wbindgen_free __wbindgen_realloc __abort_handler __instance_terminated; do
  "$WASM_OPT" "${FEATURES[@]}" --remove-exports="$unused" "$TMP/tally_client_bg.wasm" -o "$TMP/opt.wasm"
  mv "$TMP/opt.wasm" "$TMP/tally_client_bg.wasm"
done
# --low-memory-unused: the module never touches its lowest 1 KB (Rust's linker puts the stack
# top at 1 MB, growing down, and data above it; Emscripten passes this flag for the same
# layout), so wasm-opt may fold constant offsets into loads and stores.
"$WASM_OPT" -Oz --converge --low-memory-unused "${FEATURES[@]}" "$TMP/tally_client_bg.wasm" -o "$TMP/opt.wasm"
# One-letter import, export and module names (wasm-bindgen's import names carry a 16-hex hash
# each); the mapping goes to names.json, which assemble-snippet.mjs applies to the glue.
# The target_features section has served its purpose (wasm-bindgen read it): drop it, and run
# -Oz once more over the renamed module.
"$WASM_OPT" "${FEATURES[@]}" --minify-imports-and-exports-and-modules "$TMP/opt.wasm" \
  -o "$TMP/min.wasm" > "$TMP/names.json"
"$WASM_OPT" "${FEATURES[@]}" --strip-target-features -Oz --converge --low-memory-unused "$TMP/min.wasm" \
  -o "$TMP/tally_client_bg.wasm"

# --- 5. assemble into static/ -----------------------------------------------------------
node "$ROOT/scripts/assemble-snippet.mjs" "$TMP" "$ROOT/client-wasm/js" "$OUT"

# --- 6. record the inputs, print the sizes ----------------------------------------------
# shellcheck source=scripts/snippet-inputs.sh
source "$ROOT/scripts/snippet-inputs.sh"
snippet_inputs_hash > "$OUT/INPUTS"
log "inputs $(cat "$OUT/INPUTS") recorded in $OUT/INPUTS"
# The budget verdict is scripts/snippet-size.sh's job (it fails when over); a build never does.
"$ROOT/scripts/snippet-size.sh" "$OUT" || log "over the size budget (see above)"
