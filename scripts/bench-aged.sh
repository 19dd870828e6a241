#!/usr/bin/env bash
# Aged-database benchmark: the realistic mix against a fresh SQLite file, the same file carrying
# a year of counter history (every counter row of its pages repeated for the 365 days before),
# and the same file with a million more visitors in its all-time visitor sets, alternating, so a
# run says what history costs the hot path (schema v5 keyed `counters` (scope, source, day),
# which put today's rows of different pages a year of rows apart: -16 %; v6 keys them day
# first; large visitor sets outgrow the writer's page cache: about -10 %).
#   scripts/bench-aged.sh [seconds-per-drive] [rounds]
# Needs python3 (its sqlite3 module ages the copy). Load goes to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-6}
rounds=${2:-3}
cargo build --profile dist -q -p tally -p tally-loadgen
target=$(realpath "${CARGO_TARGET_DIR:-target}")
tally=$target/dist/tally
loadgen=$target/dist/tally-loadgen
dir=$(mktemp -d)
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
args=(--auto-sites --rate-limit-per-minute 0 --address-limit-per-minute 0 --new-sites-per-hour 0)

# Serve $1 (a database file) on a free port; sets pid and addr.
serve() {
  "$tally" serve --listen 127.0.0.1:0 --db "$1" "${args[@]}" >"$dir/serve.log" 2>&1 &
  pid=$!
  addr=
  for _ in $(seq 200); do
    addr=$(sed -n 's|^listening on http://||p' "$dir/serve.log")
    [[ -n $addr ]] && return
    kill -0 "$pid" 2>/dev/null || { cat "$dir/serve.log"; exit 1; }
    sleep 0.05
  done
  echo "tally did not start"; cat "$dir/serve.log"; exit 1
}
stop() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
}

# The site and its pages: a short drive on a fresh file.
serve "$dir/base.db"
"$loadgen" drive --addr "$addr" --duration 2 >/dev/null
stop
python3 - "$dir" <<'EOF'
import shutil, sqlite3, sys
d = sys.argv[1]
shutil.copy(f"{d}/base.db", f"{d}/aged.db")
c = sqlite3.connect(f"{d}/aged.db")
c.execute("CREATE TEMP TABLE back (n INTEGER)")
c.executemany("INSERT INTO back VALUES (?)", [(n,) for n in range(1, 366)])
c.execute("INSERT INTO counters (scope, source, day, views, visitors) "
          "SELECT c.scope, c.source, c.day - b.n, c.views, c.visitors "
          "FROM counters c, back b WHERE c.day >= 0")
c.commit()
rows = c.execute("SELECT count(*) FROM counters").fetchone()[0]
c.execute("VACUUM")
print(f"aged copy: {rows} counter rows (a year of history)")
c.close()

# A second copy whose all-time visitor sets hold a million more visitors (1-4 pages each).
import os, random
shutil.copy(f"{d}/base.db", f"{d}/visitors.db")
c = sqlite3.connect(f"{d}/visitors.db")
site = c.execute("SELECT id FROM site_keys").fetchone()[0]
pages = [r[0] for r in c.execute("SELECT id FROM pages WHERE site = ? AND path != ''", (site,))]
rng = random.Random(1)
rows = []
for _ in range(1_000_000):
    visitor = rng.randbytes(16)
    for page in rng.sample(pages, 1 + int(rng.paretovariate(1.2)) % 4):
        rows.append((site, 0, visitor, page))
    if len(rows) > 200_000:
        c.executemany("INSERT OR IGNORE INTO reach VALUES (?, ?, ?, ?)", rows)
        rows = []
c.executemany("INSERT OR IGNORE INTO reach VALUES (?, ?, ?, ?)", rows)
c.commit()
n = c.execute("SELECT count(*) FROM reach").fetchone()[0]
c.execute("VACUUM")
print(f"visitors copy: {n} all-time visitor-set rows (a million more visitors)")
EOF

printf '%-6s %-9s %s\n' round file result
for round in $(seq "$rounds"); do
  for file in base aged visitors; do
    rm -f "$dir"/run.db*
    cp "$dir/$file.db" "$dir/run.db"
    serve "$dir/run.db"
    result=$("$loadgen" drive --addr "$addr" --duration "$secs" | tail -1 | cut -d'(' -f1)
    stop
    printf '%-6s %-9s %s\n' "$round" "$file" "$result"
  done
done
