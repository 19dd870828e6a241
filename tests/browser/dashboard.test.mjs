// The dashboard in real headless Chromium: a site filled with known data over three days in a
// non-UTC time zone; the numbers the page shows must equal the data, and a screenshot is
// saved for review (its path is printed).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { ROOT, USER_AGENT, cleanup, launchBrowser, startTally, tallyCommand, tempDir, uuidv7 } from './support.mjs';

const ZONE = 'Europe/Berlin';
const HOUR = 3600 * 1000;

const visitor = (n) => `0b6f5f8e-7d0e-4a55-9d5e-${String(n).padStart(12, '0')}`;
const localDay = (ms) => new Intl.DateTimeFormat('en-CA', { timeZone: ZONE }).format(new Date(ms));
const num = (text) => Number(text.replace(/[^0-9]/g, ''));

test('dashboard shows the known numbers and looks like a product', async () => {
  const dir = tempDir();
  const db = join(dir, 'dash.sqlite');
  await tallyCommand(['--db', db, 'site', 'add', 'shop', '--origin', '*', '--timezone', ZONE, '--public']);
  const tally = await startTally({ db, autoSites: false });
  const browser = await launchBrowser();
  try {
    const now = Date.now();
    // [hours ago, page, visitor, referrer]
    const data = [
      [0.1, '/', 1, 'https://news.example/item?id=1'], [0.2, '/', 2, null], [0.3, '/pricing', 1, null],
      [0.4, '/docs/<b>intro</b>', 3, 'https://search.example/?q=tally'], [25, '/', 4, 'https://news.example/a'],
      [25.5, '/pricing', 4, null], [26, '/', 5, null], [49, '/', 1, 'https://news.example/b'],
      [49.5, '/pricing', 6, 'https://social.example/p/1'], [50, '/blog/launch', 7, null],
    ];
    for (const [ago, path, v, referrer] of data) {
      const at = Math.round(now - ago * HOUR);
      const r = await fetch(`${tally.url}/api/v1/hit`, {
        method: 'POST',
        headers: { 'content-type': 'text/plain', 'user-agent': USER_AGENT },
        body: JSON.stringify({ site: 'shop', type: 'pageview', event_id: uuidv7(at), visitor_id: visitor(v),
          url: `https://shop.example${path}`, referrer }),
      });
      assert.equal((await r.json()).status, 'accepted');
    }
    const distinct = (rows) => new Set(rows.map((r) => r[2])).size;

    const { context } = { context: await browser.newContext({ userAgent: USER_AGENT, viewport: { width: 1200, height: 900 } }) };
    const page = await context.newPage();
    const res = await page.goto(`${tally.url}/dashboard/shop?range=7d`);
    assert.equal(res.status(), 200);
    const card = (id) => page.locator(`#card-${id} [data-field="value"]`).first().textContent();
    assert.equal(num(await card('visitors')), distinct(data), '7-day visitors are distinct, not summed');
    assert.equal(num(await card('pageviews')), data.length, '7-day pageviews');

    const rows = await page.locator('#top-pages tbody tr').evaluateAll((trs) =>
      trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent.trim())));
    const byPage = {};
    for (const [, path, v] of data) {
      const key = new URL(`https://shop.example${path}`).pathname;
      (byPage[key] ??= { views: 0, visitors: new Set() }).views++;
      byPage[key].visitors.add(v);
    }
    const expected = Object.entries(byPage)
      // Paths are shown percent-decoded; no engagement reported (–); nothing is live: all
      // older than 60 s.
      .map(([p, s]) => [decodeURIComponent(p), String(s.visitors.size), String(s.views), '–', '0'])
      .sort((a, b) => Number(b[1]) - Number(a[1]) || a[0].localeCompare(b[0]));
    assert.deepEqual(rows, expected);
    assert.ok(rows.some(([p]) => p === '/docs/<b>intro</b>'), 'attacker-shaped paths appear (decoded) as text');
    assert.equal(await page.locator('#top-pages b').count(), 0, 'no markup injected from page paths');

    // Sources: the referring hosts (no name in the source list), and the direct visits.
    const sources = await page.locator('#sources tbody tr td:first-child').allTextContents();
    assert.deepEqual(sources.map((s) => s.trim()).sort(),
      ['Direct / None', 'news.example', 'search.example', 'social.example']);
    // Clicking a source filters the whole dashboard by it.
    await page.locator('#sources a', { hasText: 'news.example' }).click();
    await page.waitForURL(/f=is%2Cvisit%3Asource%2Cnews\.example/);
    // A visit's source is its first view's referrer (visits: gaps of at most 30 minutes, within
    // one local day), so a referred view inside a direct visit does not count.
    const entries = [];
    for (const v of new Set(data.map((r) => r[2]))) {
      const views = data.filter((r) => r[2] === v).sort((a, b) => b[0] - a[0]);
      views.forEach((r, i) => {
        const prev = views[i - 1];
        if (!prev || prev[0] - r[0] > 0.5 || localDay(now - prev[0] * HOUR) !== localDay(now - r[0] * HOUR)) {
          entries.push(r);
        }
      });
    }
    const fromNews = entries.filter(([, , , r]) => r && r.includes('news.example'));
    assert.ok(fromNews.length < data.filter(([, , , r]) => r && r.includes('news.example')).length,
      'the data has a referred view inside a direct visit');
    assert.equal(num(await card('visitors')), distinct(fromNews), 'visitors from news.example');
    assert.equal(await page.locator('ul.chips li').count(), 1, 'the filter is shown');
    await page.goBack();
    // One bar group per day of the range in the chart.
    assert.equal(await page.locator('.chart svg .views').count(), 7);

    const out = join(ROOT, 'target', 'screenshots');
    mkdirSync(out, { recursive: true });
    const shot = join(out, 'dashboard.png');
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`dashboard screenshot: ${shot}`);
    await context.close();
  } finally {
    await browser.close();
    await tally.stop();
    cleanup(dir);
  }
});
