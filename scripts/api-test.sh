#!/usr/bin/env bash
# api-test.sh - Schemathesis against a live `tally serve`: every documented operation of
# /api/v1/openapi.json is called with generated requests (examples, coverage, fuzzing,
# stateful), and every answer must be no 5xx and conform to the document (status code,
# content type, headers, body schema; see tests/api/schemathesis.toml for the checks).
#
# The server: target/debug/tally (built here unless TALLY_BIN is set) on a fresh SQLite file in
# a temp directory, port 0 on loopback (the address is read from its first line), with
# --auto-sites, the per-address limits off (so answers are not just 429), an admin token and a
# metrics token (so the protected answers are exercised too), and one private site `blog`
# (the document's example site). Schemathesis is installed from PyPI, at the pinned version,
# into a venv cached under ~/.cache/tally. Extra arguments go to `schemathesis run` (e.g.
# `--seed 42`, `--max-examples 500`). Exits non-zero on any finding, on a warning (the run
# tested less than it seems), or when the server did not stop cleanly.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SCHEMATHESIS_VERSION=4.32.5

venv=${XDG_CACHE_HOME:-$HOME/.cache}/tally/schemathesis-$SCHEMATHESIS_VERSION
st=$venv/bin/schemathesis
if ! "$st" --version 2>/dev/null | grep -qxF "schemathesis, version $SCHEMATHESIS_VERSION"; then
  echo "installing schemathesis $SCHEMATHESIS_VERSION into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION"
fi

if [[ -z ${TALLY_BIN:-} ]]; then
  cargo build --quiet --bin tally
  TALLY_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/tally
fi

work=$(mktemp -d)
pid=
cleanup() {
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

db=$work/tally.sqlite
export TALLY_ADMIN_TOKEN TALLY_METRICS_TOKEN
TALLY_ADMIN_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
TALLY_METRICS_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
"$TALLY_BIN" --db "$db" site add blog --origin https://blog.example >/dev/null

TALLY_LOG=${TALLY_LOG:-warn} "$TALLY_BIN" --db "$db" serve --listen 127.0.0.1:0 --auto-sites \
  --rate-limit-per-minute 0 --address-limit-per-minute 0 --new-sites-per-hour 0 --max-sites 0 \
  >"$work/stdout" 2>"$work/server.log" &
pid=$!
base=
for _ in $(seq 300); do
  base=$(sed -n 's/^listening on //p' "$work/stdout")
  [[ -n $base ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/server.log" >&2; echo "tally did not start" >&2; exit 1; }
  sleep 0.1
done
[[ -n $base ]] || { echo "tally did not report its address in 30 s" >&2; exit 1; }
echo "tally serving at $base (pid $pid)"

status=0
SCHEMATHESIS_HOOKS=$ROOT/tests/api/hooks.py timeout 300 "$st" --no-color \
  --config-file "$ROOT/tests/api/schemathesis.toml" \
  run "$base/api/v1/openapi.json" "$@" || status=$?
((status == 124)) && echo "schemathesis did not finish within 300 s" >&2

kill -TERM "$pid"
server_status=0
wait "$pid" || server_status=$?
pid=
if grep -q "panicked" "$work/server.log"; then
  echo "the server panicked:" >&2
  grep -A5 "panicked" "$work/server.log" >&2
  status=1
fi
if ((server_status != 0)); then
  echo "tally exited with status $server_status" >&2
  tail -n 20 "$work/server.log" >&2
  status=1
fi
exit "$status"
