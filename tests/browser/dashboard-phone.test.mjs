// The dashboard on a 390×844 phone and a 1280×800 desktop in real headless Chromium: axe-core
// finds no violations, the chart's labels render at 11 px or more and the chart is above the
// fold, the range bar stays on one line, paths show decoded with the full path in `title`
// (a Latin path here: the Debian image has no CJK font for the screenshot; tests/it covers 中文),
// and no request 404s (favicon). Screenshots of both go to target/screenshots/; with
// UPDATE_SCREENSHOTS=1 they replace the committed docs/dashboard*.png the README shows (CI
// leaves the work tree as it found it).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { ROOT, USER_AGENT, cleanup, launchBrowser, startTally, tallyCommand, tempDir, uuidv7 } from './support.mjs';

const require = createRequire(import.meta.url);
const AXE = readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const HOUR = 3600 * 1000;

const SIZES = [
  { name: 'desktop', viewport: { width: 1280, height: 800 }, shot: 'dashboard.png' },
  { name: 'phone', viewport: { width: 390, height: 844 }, shot: 'dashboard-phone.png', isMobile: true, hasTouch: true },
];

test('dashboard reads well on a phone and a desktop (axe, label sizes, fold, screenshots)', async () => {
  const dir = tempDir();
  const db = join(dir, 'phone.sqlite');
  await tallyCommand(['--db', db, 'site', 'add', 'blog', '--origin', 'https://blog.example', '--public']);
  const tally = await startTally({ db, autoSites: false });
  let browser;
  try {
    browser = await launchBrowser();
    const now = Date.now();
    const paths = ['/', '/posts/caf%C3%A9-%C3%BCber-z%C3%A4hler', '/posts/a-rather-long-article-title-about-counting-visits', '/about'];
    let n = 0;
    for (let day = 0; day < 3; day++) {
      for (const [i, path] of paths.entries()) {
        for (let k = 0; k <= (i + day) % 3; k++) {
          const at = Math.round(now - (day * 24 + 0.2 + k * 0.01) * HOUR);
          const body = { site: 'blog', type: 'pageview', event_id: uuidv7(at),
            visitor_id: `0b6f5f8e-7d0e-4a55-9d5e-${String(++n).padStart(12, '0')}`,
            url: `https://blog.example${path}`, referrer: k ? 'https://news.example/x' : null };
          const r = await fetch(`${tally.url}/api/v1/hit`, {
            method: 'POST', headers: { 'content-type': 'text/plain', origin: 'https://blog.example', 'user-agent': USER_AGENT },
            body: JSON.stringify(body),
          });
          assert.equal((await r.json()).status, 'accepted');
        }
      }
      const r = await fetch(`${tally.url}/api/v1/hit`, {
        method: 'POST', headers: { 'content-type': 'text/plain', origin: 'https://blog.example', 'user-agent': USER_AGENT },
        body: JSON.stringify({ site: 'blog', type: 'event', name: 'signup', event_id: uuidv7(now - (day * 24 + 1) * HOUR),
          url: 'https://blog.example/', referrer: null }),
      });
      assert.equal((await r.json()).status, 'accepted');
    }

    for (const size of SIZES) {
      const context = await browser.newContext({
        userAgent: USER_AGENT, viewport: size.viewport, isMobile: size.isMobile, hasTouch: size.hasTouch,
      });
      const page = await context.newPage();
      const missing = [];
      page.on('response', (r) => { if (r.status() >= 400) missing.push(`${r.status()} ${r.url()}`); });
      const res = await page.goto(`${tally.url}/dashboard/blog?range=30d`, { waitUntil: 'load' });
      assert.equal(res.status(), 200);
      assert.deepEqual(missing, [], `${size.name}: failed requests`);
      assert.equal(await page.locator('h1').count(), 1, 'one h1');

      // axe-core, injected through the DevTools protocol (a CSP on the page does not apply).
      await page.evaluate(AXE);
      const violations = await page.evaluate(async () => (await globalThis.axe.run(document)).violations
        .map((v) => `${v.id}: ${v.nodes.length} × ${v.help}`));
      assert.deepEqual(violations, [], `${size.name}: axe violations`);

      // Every visible chart label: 11 px computed, and at least 11 px tall as drawn.
      const labels = await page.locator('.tally-chart text').evaluateAll((ts) => ts
        .filter((t) => getComputedStyle(t).display !== 'none')
        .map((t) => ({ text: t.textContent, size: parseFloat(getComputedStyle(t).fontSize),
          height: t.getBoundingClientRect().height, left: t.getBoundingClientRect().left,
          right: t.getBoundingClientRect().right, cls: t.getAttribute('class') })));
      assert.ok(labels.filter((l) => l.cls.startsWith('x-label')).length >= 3, `${size.name}: x labels`);
      for (const l of labels) {
        assert.ok(l.size >= 11 && l.height >= 11, `${size.name}: label ${l.text} at ${l.size}px, ${l.height}px tall`);
      }
      // Date labels never overlap.
      const xs = labels.filter((l) => l.cls.startsWith('x-label')).sort((a, b) => a.left - b.left);
      for (let i = 1; i < xs.length; i++) {
        assert.ok(xs[i].left >= xs[i - 1].right, `${size.name}: ${xs[i - 1].text} overlaps ${xs[i].text}`);
      }
      // The chart is visible without scrolling.
      const chart = await page.locator('.chart svg').boundingBox();
      assert.ok(chart.y + chart.height <= size.viewport.height, `${size.name}: chart ends at ${chart.y + chart.height}`);
      // The range buttons sit on one line.
      const tops = await page.locator('nav.ranges a').evaluateAll((as) => as.map((a) => a.getBoundingClientRect().top));
      assert.equal(new Set(tops).size, 1, `${size.name}: range buttons wrap`);
      // The page path is shown decoded, in a link that filters by it (its title says so).
      const cell = page.locator('#top-pages td.label a', { hasText: 'café' });
      assert.equal(await cell.getAttribute('title'), 'Filter by page: /posts/café-über-zähler');
      assert.equal(await page.locator('#events td.label').first().textContent(), 'signup');

      const dir = process.env.UPDATE_SCREENSHOTS === '1' ? join(ROOT, 'docs') : join(ROOT, 'target', 'screenshots');
      mkdirSync(dir, { recursive: true });
      await page.screenshot({ path: join(dir, size.shot) });
      console.log(`${size.name} screenshot: ${join(dir, size.shot)}`);
      await context.close();
    }
  } finally {
    await browser?.close();
    await tally.stop();
    cleanup(dir);
  }
});
