// gen-badge-fixtures.mjs - renders reference badges with shields' own library, `badge-maker`,
// into server/tests/fixtures/badges/ (one SVG per case and cases.json). The Rust test
// `badge_fixtures` renders the same badges and checks widths (within 2 px) and colours.
// Run once when the set changes, not in CI:
//   mkdir -p /tmp/bm && cd /tmp/bm && npm install badge-maker@6.0.0
//   NODE_PATH=/tmp/bm/node_modules node scripts/gen-badge-fixtures.mjs
import { createRequire } from 'node:module'
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { join, dirname } from 'node:path'
import { fileURLToPath } from 'node:url'

const require = createRequire(join(process.env.NODE_PATH || '.', 'x.js'))
const { makeBadge } = require('badge-maker')
const version = JSON.parse(
  readFileSync(join(dirname(require.resolve('badge-maker')), '..', 'package.json'), 'utf8'),
).version

const root = join(dirname(fileURLToPath(import.meta.url)), '..')
const out = join(root, 'server/tests/fixtures/badges')
mkdirSync(out, { recursive: true })

const texts = [
  ['views', '12,345'],
  ['visitors', '7'],
  ['reads today', '1.2k'],
  ['', '42'],
  ['Zugriffe gesamt', '999,999'],
  ['page views', '0'],
]
// (badge-maker's own default colour is brightgreen, ours blue: every case names its colour.
// A labelColor on an empty label makes badge-maker draw a 10 px empty box: not a case here.)
const colours = [
  ['blue', undefined],
  ['red', '#abc'],
  ['yellow', 'fff'],
  ['4c1', undefined],
]
const styles = ['flat', 'flat-square', 'plastic', 'for-the-badge']
const cases = []
let n = 0
for (const style of styles) {
  for (const [i, [label, message]] of texts.entries()) {
    const [color, labelColor] = colours[i % colours.length]
    const file = `${String(++n).padStart(2, '0')}-${style}.svg`
    const format = { label, message, style, color }
    if (labelColor) format.labelColor = labelColor
    writeFileSync(join(out, file), makeBadge(format) + '\n')
    cases.push({ file, label, message, color, labelColor: labelColor ?? null, style })
  }
}
writeFileSync(
  join(out, 'cases.json'),
  JSON.stringify({ generator: `badge-maker ${version}`, cases }, null, 1) + '\n',
)
console.log(`${cases.length} badges written to ${out}`)
