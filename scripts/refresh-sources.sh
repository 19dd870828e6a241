#!/usr/bin/env bash
# Check and sort the source tables (server/data/sources/sources.tsv and aliases.tsv), or list
# the hosts of an upstream referrer file that they lack, for review.
#
#   scripts/refresh-sources.sh                 # check both tables; sort them in place
#   scripts/refresh-sources.sh --check         # check only (exit 1 if unsorted or invalid)
#   scripts/refresh-sources.sh --merge FILE    # print FILE's hosts the tables lack
#
# The rules (the same as collect/sources.rs and its tests): three tab-separated columns;
# hosts lower-case, at least two labels, no `www.`, each listed once; names plain text with
# one spelling and one category; categories search, social, shopping, video, email, ai or
# empty; tags lower-case, listed once, never a name's own spelling or a listed host; no
# control characters. Rows are sorted by name, then host or tag; the leading comment stays.
#
# --merge reads a file in the Snowplow referer-parser shape, JSON or YAML
# ({medium: {Name: {domains: [...]}}}), and prints `host<TAB>name<TAB>category` rows for the
# hosts no listed host covers. Nothing is written: the operator picks rows by hand. Mind the
# licence: Snowplow's referers.yml and the lists derived from it are GPLv3-derived data, so
# they are not shipped (server/data/sources/SOURCES.md); adding a few facts found there is a
# different thing from copying the list. YAML needs PyYAML (a venv under ~/.cache/tally when
# missing).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
mode=write
merge=""
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  --merge) mode=merge; merge="$(cd "$(dirname "${2:?--merge needs a file}")" && pwd)/$(basename "$2")" ;;
  -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
  *) echo "usage: $0 [--check | --merge FILE]" >&2; exit 2 ;;
esac

python="python3"
if [[ $mode == merge && $merge != *.json ]] && ! python3 -c 'import yaml' 2>/dev/null; then
  venv="${XDG_CACHE_HOME:-$HOME/.cache}/tally/pyyaml-6.0.3"
  if [[ ! -x $venv/bin/python ]]; then
    echo "installing PyYAML 6.0.3 into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "PyYAML==6.0.3" || {
      rm -rf "$venv"
      echo "error: could not install PyYAML (offline?); convert FILE to JSON instead" >&2
      exit 1
    }
  fi
  python="$venv/bin/python"
fi

DATA="$root/server/data/sources" MODE="$mode" MERGE="$merge" "$python" - <<'PY'
import json, os, re, signal, sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` is fine

data, mode, merge = os.environ["DATA"], os.environ["MODE"], os.environ["MERGE"]
CATEGORIES = {"", "search", "social", "shopping", "video", "email", "ai"}
LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
errors = []

def read(name):
    path = os.path.join(data, name)
    lines = open(path, encoding="utf-8").read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header, rows = [], []
    for i, line in enumerate(lines, 1):
        if line.startswith("#") and not rows:
            header.append(line)
        elif line.startswith("#"):
            errors.append(f"{name}:{i}: comments belong at the top")
        elif line == "":
            continue
        else:
            rows.append((i, line))
    return path, header, rows

def plain(text):
    return text != "" and text == text.strip() and not any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 for c in text)

names = {}  # lower-cased name -> (name, category)
def source(where, name, category):
    known = names.get(name.lower())
    if known is None:
        names[name.lower()] = (name, category)
    elif known[0] != name:
        errors.append(f"{where}: {name!r} is also spelled {known[0]!r} (or is an alias)")
    elif known[1] != category:
        errors.append(f"{where}: {name!r} has category {known[1]!r} elsewhere")

def columns(file, i, line):
    cols = line.split("\t")
    if len(cols) != 3:
        errors.append(f"{file}:{i}: not three tab-separated columns: {line!r}")
        return None
    key, name, category = cols
    if not plain(name):
        errors.append(f"{file}:{i}: the name must be plain text: {line!r}")
    if category not in CATEGORIES:
        errors.append(f"{file}:{i}: unknown category {category!r}")
    return key, name, category

src_path, src_header, src_rows = read("sources.tsv")
ali_path, ali_header, ali_rows = read("aliases.tsv")
hosts = {}
parsed_sources = []
for i, line in src_rows:
    row = columns("sources.tsv", i, line)
    if not row:
        continue
    host, name, category = row
    labels = host.split(".")
    if len(labels) < 2 or host.startswith("www.") or not all(LABEL.match(l) for l in labels):
        errors.append(f"sources.tsv:{i}: a host is lower-case labels (at least two, no www.): {host!r}")
        continue
    if host in hosts:
        errors.append(f"sources.tsv:{i}: {host} is listed twice")
    hosts[host] = name
    source(f"sources.tsv:{i}", name, category)
    parsed_sources.append(row)
tags = set()
parsed_aliases = []
for i, line in ali_rows:
    row = columns("aliases.tsv", i, line)
    if not row:
        continue
    tag, name, category = row
    if not plain(tag) or tag.lower() != tag:
        errors.append(f"aliases.tsv:{i}: a tag is lower-case plain text: {tag!r}")
    if tag in tags or tag in names:
        errors.append(f"aliases.tsv:{i}: {tag!r} is listed already (or is a name's own spelling)")
    if tag in hosts:
        errors.append(f"aliases.tsv:{i}: {tag!r} is a listed host, matched as a tag already")
    tags.add(tag)
    source(f"aliases.tsv:{i}", name, category)
    parsed_aliases.append(row)
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(f"{len(errors)} problem(s); nothing written")

def covered(host):
    parts = host.split(".")
    for i in range(len(parts) - 1):
        if ".".join(parts[i:]) in hosts:
            return hosts[".".join(parts[i:])]
    return None

if mode == "merge":
    text = open(merge, encoding="utf-8").read()
    if merge.endswith(".json"):
        upstream = json.loads(text)
    else:
        import yaml
        upstream = yaml.safe_load(text)
    medium_category = {"search": "search", "social": "social", "email": "email"}
    new = {}
    for medium, sources in (upstream or {}).items():
        for name, entry in (sources or {}).items():
            for domain in (entry or {}).get("domains", []) or []:
                host = str(domain).split("/")[0].strip().lower().rstrip(".")
                host = host[4:] if host.startswith("www.") else host
                if "." not in host or covered(host) or host in new:
                    continue
                known = names.get(str(name).lower())
                category = known[1] if known else medium_category.get(medium, "")
                new[host] = (known[0] if known else str(name), category)
    rows = sorted(new.items(), key=lambda r: (r[1][0].lower(), r[0]))
    print(f"# {len(rows)} host(s) of {os.path.basename(merge)} that no listed host covers; review "
          "each (and its licence) before adding it to sources.tsv")
    for host, (name, category) in rows:
        print(f"{host}\t{name}\t{category}")
    sys.exit(0)

def write(path, header, rows):
    ordered = sorted(rows, key=lambda r: (r[1].lower(), r[0]))
    text = "\n".join(header + ["\t".join(r) for r in ordered]) + "\n"
    if open(path, encoding="utf-8").read() == text:
        return False
    if mode == "check":
        print(f"{os.path.basename(path)} is not sorted: run scripts/refresh-sources.sh", file=sys.stderr)
        sys.exit(1)
    open(path + ".tmp", "w", encoding="utf-8").write(text)
    os.replace(path + ".tmp", path)
    return True

changed = [p for p, h, r in ((src_path, src_header, parsed_sources), (ali_path, ali_header, parsed_aliases)) if write(p, h, r)]
by_category = {}
for name, category in names.values():
    by_category[category or "(none)"] = by_category.get(category or "(none)", 0) + 1
print(f"{len(hosts)} hosts, {len(tags)} aliases, {len(names)} names: "
      + ", ".join(f"{c} {n}" for c, n in sorted(by_category.items())))
print("sorted: " + ", ".join(os.path.basename(p) for p in changed) if changed else "already sorted")
PY
