#!/usr/bin/env bash
# Refresh the bot pattern list and the user-agent corpora from their published npm packages.
#
#   scripts/refresh-bot-list.sh            # newest isbot 5.x and the newest corpora
#   ISBOT=isbot@5.2.3 scripts/refresh-bot-list.sh
#
# Writes:
#   server/data/bots/isbot-patterns.json         the pattern list (compiled into the binary)
#   server/data/bots/LICENSE-isbot               its licence (Unlicense)
#   server/tests/data/user-agents/crawlers.json  every instance of crawler-user-agents (MIT)
#   server/tests/data/user-agents/browsers.json  distinct real browser agents: user-agents
#                                                (BSD-2-Clause) and top-user-agents (MIT)
#   server/tests/data/user-agents/LICENSE-*      their licences
#   server/data/bots/SOURCES.md                  package names, versions, licences, counts
# Then run `cargo test -p tally --lib bots` and `cargo test -p tally --test it user_agent_corpus`:
# the corpus test fails if the new list counts more than 1 % of crawlers or filters any browser.
# Needs node and npm (the npm registry); writes nothing else.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
isbot="${ISBOT:-isbot@5}"
crawlers="${CRAWLERS:-crawler-user-agents}"
browsers="${BROWSERS:-user-agents}"
top="${TOP:-top-user-agents}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
for spec in "$isbot" "$crawlers" "$browsers" "$top"; do
  file="$(npm pack --silent "$spec" | tail -n 1)"
  name="${file%.tgz}"
  mkdir -p "$name"
  tar xzf "$file" -C "$name"
done

data="$root/server/data/bots"
corpus="$root/server/tests/data/user-agents"
mkdir -p "$data" "$corpus"

WORK="$work" DATA="$data" CORPUS="$corpus" node <<'JS'
const fs = require("fs");
const path = require("path");
const { WORK, DATA, CORPUS } = process.env;

const pkgs = {};
for (const dir of fs.readdirSync(WORK)) {
  const p = path.join(WORK, dir, "package");
  if (!fs.existsSync(path.join(p, "package.json"))) continue;
  const meta = JSON.parse(fs.readFileSync(path.join(p, "package.json"), "utf8"));
  pkgs[meta.name] = { dir: p, meta };
}
const need = (name) => {
  if (!pkgs[name]) throw new Error(`package ${name} was not unpacked`);
  return pkgs[name];
};
const licence = (pkg, to) => {
  const file = fs.readdirSync(pkg.dir).find((f) => /^licen[cs]e/i.test(f));
  if (!file) throw new Error(`${pkg.meta.name} ships no licence file`);
  fs.copyFileSync(path.join(pkg.dir, file), to);
  fs.chmodSync(to, 0o644);
};
// One string per line: readable diffs when the lists change.
const lines = (list) => "[\n" + list.map((s) => " " + JSON.stringify(s)).join(",\n") + "\n]\n";

const isbot = need("isbot");
const patterns = require(isbot.dir).list;
if (!Array.isArray(patterns) || patterns.length < 50) throw new Error("isbot: no pattern list");
fs.writeFileSync(path.join(DATA, "isbot-patterns.json"), lines(patterns));
licence(isbot, path.join(DATA, "LICENSE-isbot"));

const cua = need("crawler-user-agents");
const entries = JSON.parse(fs.readFileSync(path.join(cua.dir, "crawler-user-agents.json"), "utf8"));
const crawlerAgents = entries.flatMap((e) => e.instances || []).filter((s) => s.trim() !== "");
fs.writeFileSync(path.join(CORPUS, "crawlers.json"), lines(crawlerAgents));
licence(cua, path.join(CORPUS, "LICENSE-crawler-user-agents"));

const ua = need("user-agents");
const real = JSON.parse(fs.readFileSync(path.join(ua.dir, "dist", "user-agents.json"), "utf8"));
const top = need("top-user-agents");
const topList = JSON.parse(fs.readFileSync(path.join(top.dir, "src", "index.json"), "utf8"));
const browserAgents = [...new Set([...real.map((r) => r.userAgent), ...topList])].sort();
fs.writeFileSync(path.join(CORPUS, "browsers.json"), lines(browserAgents));
licence(ua, path.join(CORPUS, "LICENSE-user-agents"));
licence(top, path.join(CORPUS, "LICENSE-top-user-agents"));

const row = (p, what, n) => `| ${p.meta.name} | ${p.meta.version} | ${p.meta.license} | ${what} | ${n} |`;
fs.writeFileSync(
  path.join(DATA, "SOURCES.md"),
  [
    "# Bot patterns and user-agent corpora: where they come from",
    "",
    "Written by `scripts/refresh-bot-list.sh` from the packages as published on npm; do not edit",
    "by hand. The pattern list is compiled into the binary (`server/src/bots.rs`); the corpora",
    "are test data (`server/tests/it/bots.rs`).",
    "",
    "| package | version | licence | used as | entries |",
    "|---|---|---|---|---|",
    row(isbot, "`isbot-patterns.json` (its `list` export)", patterns.length),
    row(cua, "`crawlers.json` (every `instances` entry)", crawlerAgents.length),
    row(ua, "`browsers.json` (distinct `userAgent` values)", new Set(real.map((r) => r.userAgent)).size),
    row(top, "`browsers.json` (merged, deduplicated)", topList.length),
    "",
    `Distinct browser agents in \`browsers.json\`: ${browserAgents.length}.`,
    "",
  ].join("\n"),
);
console.log(`isbot ${isbot.meta.version}: ${patterns.length} patterns; ${crawlerAgents.length} crawler and ${browserAgents.length} browser agents`);
JS
