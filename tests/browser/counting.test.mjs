// What a visitor's browser makes the collector count: visits, visitors, SPA navigation,
// custom events, counters in the page, CORS. Every assertion reads the real server's
// counters (GET /api/v1/counts) or its answers, never the client's word.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startTally, startSite, newProfile, pageHtml, counts, countsWhere, waitFor, storageKeys, tempDir, cleanup, tallyCommand, hitsLogged, startAll, stopAll,
} from './support.mjs';

let env, tally, site, browser;

before(async () => {
  env = await startAll();
  ({ tally, site, browser } = env);
});

after(() => stopAll(env));

/// Serves `html` at `path` on the test site and returns its URL.
function serve(path, html) {
  site.pages[path] = html;
  return site.origin + path;
}

const snippet = (attrs, extra = {}) => pageHtml({ src: `${tally.url}/tally.js`, attrs, ...extra });
const noneLeftToSend = (page) => waitFor(() => page.evaluate(() => !localStorage.getItem('tally:q')), { what: 'an empty retry queue' });

test('first visit counts 1 view and 1 visitor; a reload 2 views and still 1 visitor', async () => {
  const url = serve('/first/a', snippet({ site: 'first' }));
  const { context } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(url);
  let c = await countsWhere(tally.url, 'first', '/first/a', (c) => c.site.views === 1);
  assert.deepEqual([c.site.views, c.site.visitors, c.page.views, c.page.visitors], [1, 1, 1, 1]);
  await noneLeftToSend(page);

  await page.reload();
  c = await countsWhere(tally.url, 'first', '/first/a', (c) => c.site.views === 2);
  assert.deepEqual([c.site.views, c.site.visitors, c.page.views, c.page.visitors], [2, 1, 2, 1]);
  await noneLeftToSend(page);
  assert.equal((await counts(tally.url, 'first', '/first/a')).site.views, 2, 'nothing counted twice');
  await context.close();
});

test('a second browser profile is a second visitor', async () => {
  const url = serve('/profiles/a', snippet({ site: 'profiles' }));
  for (const expected of [1, 2]) {
    const { context } = await newProfile(browser);
    const page = await context.newPage();
    await page.goto(url);
    const c = await countsWhere(tally.url, 'profiles', '/profiles/a', (c) => c.site.views === expected);
    assert.equal(c.site.visitors, expected);
    await context.close();
  }
});

test('SPA navigation: pushState and popstate count, replaceState only on a new path', async () => {
  const url = serve('/spa/a', snippet({ site: 'spa' }));
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(url);
  await countsWhere(tally.url, 'spa', '/spa/a', (c) => c.page.views === 1);

  // Page views only: leaving a page view may also send its engagement report.
  const views = () => log.hits.map((h) => JSON.parse(h.body)).filter((h) => h.type === 'pageview');
  await page.evaluate(() => history.pushState({}, '', '/spa/b'));
  let c = await countsWhere(tally.url, 'spa', '/spa/b', (c) => c.page.views === 1);
  const b = views().at(-1);
  assert.equal(b.referrer, url, 'an SPA view refers to the previous page');

  await page.evaluate(() => history.replaceState({}, '', '/spa/b?tab=2')); // same path: not a view
  await page.evaluate(() => history.replaceState({}, '', '/spa/c')); // new path: a view
  c = await countsWhere(tally.url, 'spa', '/spa/c', (c) => c.page.views === 1);
  assert.equal(c.site.views, 3);
  assert.equal(views().length, 3, 'the query-only replaceState counted nothing');

  // History is now [/spa/a, /spa/c] (replaceState rewrote the /spa/b entry): back is /spa/a.
  await page.goBack();
  c = await countsWhere(tally.url, 'spa', '/spa/a', (c) => c.page.views === 2);
  assert.equal(c.site.views, 4);
  assert.equal(c.site.visitors, 1);
  // The URL comparison is the browser's (js/host.js): a fragment-only change is no new page.
  await page.evaluate(() => history.pushState({}, '', '/spa/a#top'));
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(views().length, 4, 'the fragment-only pushState counted nothing');
  await context.close();
});

test('in-page counters and busuanzi ids are filled from the counting request itself', async () => {
  const body = `
    <p>site <span data-tally="site.views">-</span> / <span data-tally="site.visitors">-</span></p>
    <p>page <span data-tally="page.views">-</span> / <span data-tally="page.visitors">-</span></p>
    <p>live <span data-tally="live">-</span></p>
    <span id="busuanzi_container_site_pv" style="display:none"><span id="busuanzi_value_site_pv"></span></span>
    <span id="busuanzi_value_site_uv"></span><span id="busuanzi_value_page_pv"></span>`;
  const url = serve('/counters/a', snippet({ site: 'counters', busuanzi: true }, { body }));
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  for (const views of [1, 2]) {
    await page.goto(url);
    const text = await waitFor(() => page.evaluate(() => {
      const t = (sel) => document.querySelector(sel).textContent;
      const v = {
        site: [t('[data-tally="site.views"]'), t('[data-tally="site.visitors"]')],
        page: [t('[data-tally="page.views"]'), t('[data-tally="page.visitors"]')],
        live: t('[data-tally="live"]'),
        bz: [t('#busuanzi_value_site_pv'), t('#busuanzi_value_site_uv'), t('#busuanzi_value_page_pv')],
        shown: document.getElementById('busuanzi_container_site_pv').style.display,
      };
      return v.site[0] !== '-' && v;
    }), { what: 'filled counters' });
    const c = await counts(tally.url, 'counters', '/counters/a');
    assert.equal(c.site.views, views);
    assert.deepEqual(text.site, [String(c.site.views), String(c.site.visitors)]);
    assert.deepEqual(text.page, [String(c.page.views), String(c.page.visitors)]);
    assert.equal(text.live, String(c.live.visitors));
    assert.deepEqual(text.bz, [String(c.site.views), String(c.site.visitors), String(c.page.views)]);
    assert.equal(text.shown, 'inline');
  }
  assert.equal(log.hits.length, 2, 'one request per page view');
  assert.ok(log.hits.every((h) => h.url.includes('counts=1')));
  await context.close();
});

test('a custom event sent twice with one dedupe key counts once', async () => {
  // A name and key with characters the client's JSON writer escapes (quote, backslash) and
  // non-ASCII it passes through.
  const url = serve('/events/a', snippet({ site: 'events' }, { stub: true, body: `<script>
    tally('event', 'sign "up" \\\\ é', { dedupe: 'user_"42"' });   // queued before the loader ran
    addEventListener('load', () => tally.track('sign "up" \\\\ é', { dedupe: 'user_"42"' }));
  </script>` }));
  const { context } = await newProfile(browser);
  const page = await context.newPage();
  const answers = [];
  page.on('response', async (r) => {
    if (!r.url().includes('/api/v1/hit')) return;
    const sent = JSON.parse(r.request().postData());
    if (sent.type === 'event') answers.push({ sent, got: await r.json() });
  });
  await page.goto(url);
  await waitFor(() => answers.length === 2, { what: 'two event answers' });
  assert.deepEqual(answers.map((a) => a.sent.dedupe), ['user_"42"', 'user_"42"']);
  assert.deepEqual(answers.map((a) => a.sent.name), ['sign "up" \\ é', 'sign "up" \\ é']);
  assert.notEqual(answers[0].sent.event_id, answers[1].sent.event_id, 'each call is its own event');
  assert.deepEqual(answers.map((a) => a.got.status).sort(), ['accepted', 'duplicate']);
  await context.close();
});

test('data-storage="none": counted, no visitor id, nothing written to storage', async () => {
  const url = serve('/nostore/a', snippet({ site: 'nostore', storage: 'none' }));
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(url);
  await countsWhere(tally.url, 'nostore', '/nostore/a', (c) => c.site.views === 1);
  await hitsLogged(log, 1);
  assert.equal(JSON.parse(log.hits[0].body).visitor_id, null);
  assert.deepEqual(await storageKeys(page), []);
  await context.close();
});

test('storage that throws: still counted (session, then memory fallback)', async () => {
  const url = serve('/throwing/a', snippet({ site: 'throwing' }));
  const { context, log } = await newProfile(browser);
  await context.addInitScript(() => {
    const boom = () => { throw new DOMException('denied', 'SecurityError'); };
    for (const m of ['getItem', 'setItem', 'removeItem', 'key', 'clear']) Storage.prototype[m] = boom;
    Object.defineProperty(window, 'localStorage', { get: boom });
  });
  const page = await context.newPage();
  await page.goto(url);
  await countsWhere(tally.url, 'throwing', '/throwing/a', (c) => c.site.views === 1 && c.site.visitors === 1);
  await hitsLogged(log, 1);
  assert.match(JSON.parse(log.hits[0].body).visitor_id, /^[0-9a-f-]{36}$/, 'an in-memory visitor id');
  assert.deepEqual(log.errors, []);
  await context.close();
});

test('localhost and *.localhost pages are skipped unless data-allow-local', async () => {
  site.pages['/local/skip'] = snippet({ site: 'local-skip' });
  site.pages['/local/allow'] = snippet({ site: 'local-allow', 'allow-local': true });
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(`${site.localhost}/local/skip`);
  // The loader decides synchronously: once window.tally exists, it has decided.
  await page.waitForFunction(() => typeof window.tally === 'function' && document.readyState === 'complete');
  await page.evaluate(() => tally('event', 'ignored')); // harmless, never throws
  assert.ok(!log.requests.some((u) => u.includes('/tally-')), 'the skipped page did not even download the module');
  assert.equal(log.hits.length, 0);
  await page.goto(`${site.localhost}/local/allow`);
  await countsWhere(tally.url, 'local-allow', '/local/allow', (c) => c.site.views === 1);
  await hitsLogged(log, 1);
  assert.equal(log.hits.length, 1, 'only the allowed page sent anything');
  await assert.rejects(counts(tally.url, 'local-skip', '/local/skip'), /unknown_site/, 'never counted: no such site');
  await context.close();
});

test('CORS: an allowed origin counts on a registered site, any other origin is refused', async () => {
  const d2 = tempDir();
  const db = `${d2}/sites.sqlite`;
  const other = await startSite();
  try {
    await tallyCommand(['--db', db, 'site', 'add', 'corsblog', '--origin', site.origin, '--timezone', 'UTC']);
    const strict = await startTally({ db, autoSites: false });
    try {
      const html = pageHtml({ src: `${strict.url}/tally.js`, attrs: { site: 'corsblog' } });
      site.pages['/cors/a'] = html;
      other.pages['/cors/a'] = html;
      const { context, log } = await newProfile(browser);
      const page = await context.newPage();
      const isHit = (r) => r.url().includes('/api/v1/hit');
      // Wait for the browser to report the first answer too, so the wait below cannot see it.
      const accepted = page.waitForResponse(isHit);
      await page.goto(`${site.origin}/cors/a`);
      assert.equal((await accepted).status(), 200);
      await countsWhere(strict.url, 'corsblog', '/cors/a', (c) => c.site.views === 1);

      const refused = page.waitForResponse(isHit);
      await page.goto(`${other.origin}/cors/a`);
      assert.equal((await refused).status(), 403);
      await hitsLogged(log, 2);
      assert.equal(log.hits.length, 2);
      assert.equal((await counts(strict.url, 'corsblog', '/cors/a')).site.views, 1, 'the refused origin was not counted');
      // Refused for good: the client dropped it instead of retrying.
      await waitFor(() => page.evaluate(() => !localStorage.getItem('tally:q')), { what: 'the refused hit dropped' });
      await context.close();
    } finally {
      await strict.stop();
    }
  } finally {
    await other.close();
    cleanup(d2);
  }
});

test('data-respect-dnt: Do Not Track / Global Privacy Control visitors are not counted', async () => {
  site.pages['/dnt/respect'] = snippet({ site: 'dnt', 'respect-dnt': true });
  site.pages['/dnt/ignore'] = snippet({ site: 'dnt' });
  for (const signal of ['doNotTrack', 'globalPrivacyControl']) {
    const { context, log } = await newProfile(browser);
    await context.addInitScript((s) => {
      Object.defineProperty(Navigator.prototype, s, { get: () => (s === 'doNotTrack' ? '1' : true) });
    }, signal);
    const page = await context.newPage();
    await page.goto(`${site.origin}/dnt/respect`);
    await page.waitForFunction(() => typeof window.tally === 'function' && document.readyState === 'complete');
    assert.ok(!log.requests.some((u) => u.includes('/tally-')), `${signal}: the module was not even loaded`);
    await page.goto(`${site.origin}/dnt/ignore`); // without data-respect-dnt the signal is not honoured
    await countsWhere(tally.url, 'dnt', '/dnt/ignore', (c) => c.page.views === (signal === 'doNotTrack' ? 1 : 2));
    await hitsLogged(log, 1);
    assert.equal(log.hits.length, 1);
    await context.close();
  }
  assert.equal((await counts(tally.url, 'dnt', '/dnt/respect')).page.views, 0);
});

test('the snippet files arrive precompressed (Content-Encoding, Vary) and the module still counts', async () => {
  const url = serve('/compressed/a', snippet({ site: 'compressed' }));
  const { context } = await newProfile(browser);
  const page = await context.newPage();
  const files = [];
  page.on('response', async (r) => {
    if (!/\/tally(-[0-9a-f]+)?\.(js|wasm)$/.test(new URL(r.url()).pathname)) return;
    const h = await r.allHeaders();
    files.push({ path: new URL(r.url()).pathname, encoding: h['content-encoding'], vary: h.vary, sent: (await r.request().allHeaders())['accept-encoding'] });
  });
  await page.goto(url);
  await countsWhere(tally.url, 'compressed', '/compressed/a', (c) => c.site.views === 1);
  await waitFor(() => files.length === 3, { what: 'the three snippet files' });
  for (const f of files) {
    // Chromium offers br only over https; over http it gets the gzip file.
    assert.equal(f.encoding, /\bbr\b/.test(f.sent) ? 'br' : 'gzip', `${f.path} (accept-encoding: ${f.sent})`);
    assert.equal(f.vary, 'Accept-Encoding', f.path);
  }
  await context.close();
});
