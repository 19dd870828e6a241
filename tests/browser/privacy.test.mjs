// Consent mode and excluding yourself, in a real browser against the real collector: what is
// stored (the page's storage areas), what is sent (the request log) and what is counted (the
// collector's counters).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  newProfile, pageHtml, counts, countsWhere, waitFor, storageKeys, startAll, stopAll,
} from './support.mjs';

let env, tally, site, browser;

before(async () => {
  env = await startAll();
  ({ tally, site, browser } = env);
});

after(() => stopAll(env));

const COUNTER = '<span data-tally="site.views">-</span>';
const snippet = (attrs, body = '') => pageHtml({ src: `${tally.url}/tally.js`, attrs, body });
const bodies = (log) => log.hits.map((h) => JSON.parse(h.body));
/// The client is up once the page's counter shows a number (filled from an answer or a read).
const counterShows = (page, n) =>
  waitFor(() => page.evaluate((n) => document.querySelector('[data-tally="site.views"]').textContent === String(n), n),
    { what: `the counter showing ${n}` });

test('data-storage="consent": counted without storage until tally("consent", true), then a remembered id', async () => {
  site.pages['/consent/a'] = snippet({ site: 'consent', storage: 'consent' });
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(`${site.origin}/consent/a`);
  await countsWhere(tally.url, 'consent', '/consent/a', (c) => c.site.views === 1);
  await waitFor(() => log.hits.length === 1, { what: 'the first view in the log' });
  assert.equal(bodies(log)[0].visitor_id, null, 'no visitor id before consent');
  assert.deepEqual(await storageKeys(page), [], 'nothing stored before consent');

  await page.evaluate(() => tally('consent', true));
  await page.evaluate(() => tally('event', 'after-consent'));
  await countsWhere(tally.url, 'consent', '/consent/a', (c) => c.site.views === 1);
  await waitFor(() => log.hits.length === 2, { what: 'the event in the log' });
  const vid = bodies(log)[1].visitor_id;
  assert.match(vid, /^[0-9a-f-]{36}$/, 'the event carries a visitor id');
  // The event's queue entry leaves once its answer is in; then the id and consent remain.
  await waitFor(async (seen) => {
    const keys = (await storageKeys(page)).sort();
    seen(keys);
    return keys.join() === 'tally:consent,tally:vid';
  }, { what: 'the stored id and consent, nothing queued' });
  assert.equal(await page.evaluate(() => localStorage.getItem('tally:vid')), vid);

  // Remembered: the next page load uses the stored id from the start.
  await page.reload();
  await countsWhere(tally.url, 'consent', '/consent/a', (c) => c.site.views === 2);
  await waitFor(() => log.hits.length === 3, { what: 'the second view in the log' });
  assert.equal(bodies(log)[2].visitor_id, vid);
  await context.close();
});

test('tally("consent", false) deletes the stored id and queue; later hits and loads store nothing', async () => {
  site.pages['/withdraw/a'] = snippet({ site: 'withdraw', storage: 'consent' });
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(`${site.origin}/withdraw/a`);
  await countsWhere(tally.url, 'withdraw', '/withdraw/a', (c) => c.site.views === 1);
  await page.evaluate(() => tally('consent', true));
  await waitFor(async () => (await storageKeys(page)).includes('tally:vid'), { what: 'a stored id' });
  // Something queued: a hit whose answer is still awaited when consent is withdrawn.
  await page.evaluate(() => { tally('event', 'queued'); tally('consent', false); });
  assert.deepEqual(await storageKeys(page), [], 'id, queue and consent deleted');
  await page.evaluate(() => tally('event', 'withdrawn'));
  await waitFor(() => bodies(log).some((b) => b.name === 'withdrawn'), { what: 'the event after withdrawal' });
  const sent = bodies(log);
  assert.match(sent.find((b) => b.name === 'queued').visitor_id, /^[0-9a-f-]{36}$/);
  assert.equal(sent.find((b) => b.name === 'withdrawn').visitor_id, null);
  assert.deepEqual(await storageKeys(page), []);

  await page.reload();
  await countsWhere(tally.url, 'withdraw', '/withdraw/a', (c) => c.site.views === 2);
  await waitFor(() => bodies(log).filter((b) => b.type === 'pageview').length === 2, { what: 'the reload\'s view' });
  assert.equal(bodies(log).filter((b) => b.type === 'pageview')[1].visitor_id, null);
  assert.deepEqual(await storageKeys(page), []);
  await context.close();
});

test('tally("ignore", true): remembered, nothing sent while set (counters still shown); false counts again', async () => {
  site.pages['/ignore/a'] = snippet({ site: 'ignore' }, COUNTER);
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(`${site.origin}/ignore/a`);
  await counterShows(page, 1);
  await page.evaluate(() => tally('ignore', true));
  assert.equal(await page.evaluate(() => localStorage.getItem('tally:ignore')), '1');
  await page.evaluate(() => { tally('event', 'while-ignored'); tally('pageview'); });

  await page.reload();
  await counterShows(page, 1); // read from the collector, not counted
  const other = await context.newPage(); // another tab of the same browser
  await other.goto(`${site.origin}/ignore/a`);
  await counterShows(other, 1);
  assert.equal(log.hits.length, 1, 'only the first view was ever sent');
  assert.equal((await counts(tally.url, 'ignore', '/ignore/a')).site.views, 1);

  await page.evaluate(() => tally('ignore', false));
  await page.reload();
  await counterShows(page, 2);
  assert.equal((await counts(tally.url, 'ignore', '/ignore/a')).site.views, 2);
  await context.close();
});

test('#tally-ignore / #tally-unignore in any URL set and clear it (the dashboard link)', async () => {
  site.pages['/fragment/a'] = snippet({ site: 'fragment' }, COUNTER);
  const visitor = await newProfile(browser);
  await (await visitor.context.newPage()).goto(`${site.origin}/fragment/a`);
  await countsWhere(tally.url, 'fragment', '/fragment/a', (c) => c.site.views === 1);
  await visitor.context.close();

  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(`${site.origin}/fragment/a#tally-ignore`);
  await waitFor(() => page.evaluate(() => localStorage.getItem('tally:ignore') === '1'), { what: 'the ignore flag' });
  await counterShows(page, 1);
  await page.goto(`${site.origin}/fragment/a?next`);
  await counterShows(page, 1);
  assert.equal(log.hits.length, 0, 'the link\'s page and the next were not counted');

  await page.goto(`${site.origin}/fragment/a?again#tally-unignore`);
  await counterShows(page, 2);
  assert.equal(await page.evaluate(() => localStorage.getItem('tally:ignore')), null);
  assert.equal((await counts(tally.url, 'fragment', '/fragment/a')).site.views, 2);

  // tally('ignore', true) queued through the stub before the snippet ran: remembered, and the
  // page's own view is not counted.
  const stub = "<script>window.tally=function(){(tally.q=tally.q||[]).push(arguments)};tally('ignore',true)</script>";
  site.pages['/fragment/stub'] = pageHtml({ src: `${tally.url}/tally.js`, attrs: { site: 'fragment' }, head: stub, body: COUNTER });
  const sent = log.hits.length;
  await page.goto(`${site.origin}/fragment/stub`);
  await counterShows(page, 2);
  assert.equal(await page.evaluate(() => localStorage.getItem('tally:ignore')), '1');
  assert.equal(log.hits.length, sent, 'nothing sent');
  await context.close();
});
