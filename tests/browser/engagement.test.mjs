// What the snippet tells the collector about how a page was used: the screen width on every
// page view, and engagement reports (the time a page view was both visible and focused, and
// its deepest scroll, under the page view's own event id) when the visitor leaves for now,
// navigates in a single-page app or leaves the page. The test records every hit the page
// sends, whatever the answer, with a proxy that forwards them to the collector (requests made
// while a page unloads never reach Playwright's request events; a beacon is told from a fetch
// by its Sec-Fetch-Mode, no-cors), and reads back what the collector stored
// (POST /api/v2/query).
//
// All in real headless Chromium:
// - focus and blur: real focus changes. Another page of the profile holds the browser's focus;
//   CDP Emulation.setFocusEmulationEnabled on the page under test gives it focus (Chromium
//   fires a real focus event, document.hasFocus() is true) and takes it away again (a real
//   blur event, document.hasFocus() false);
// - scrolling: real mouse-wheel input; SPA navigation: the page's own history.pushState;
// - pagehide: a real navigation to another page;
// - hidden while staying on the page: headless Chromium cannot hide a page (bringing another
//   page to the front, minimising the window and freezing the page all leave it 'visible'),
//   so that one step is simulated in the page: document.visibilityState and document.hidden
//   are overridden and a visibilitychange event dispatched.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { newProfile, pageHtml, waitFor, startAll, stopAll, startProxy } from './support.mjs';

let env, tally, site, browser, proxy;

before(async () => {
  env = await startAll();
  ({ tally, site, browser } = env);
  proxy = await startProxy(tally.url);
});

after(async () => {
  await proxy?.close();
  await stopAll(env);
});

/// Lets `ms` of (engaged or idle) time pass on the page: the quantity under test, not a wait
/// for something to happen.
const elapse = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/// The share of the document the page shows now, as the snippet measures it.
const depthNow = (page) =>
  page.evaluate(() => Math.floor(((scrollY + innerHeight) * 100) / document.documentElement.scrollHeight));

/// Hides the page without leaving it, or shows it again (see the top of the file: simulated;
/// showing removes the override, so the browser's own state answers again).
const setHidden = (page, hidden) =>
  page.evaluate((hidden) => {
    if (hidden) {
      Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' });
      Object.defineProperty(document, 'hidden', { configurable: true, get: () => true });
    } else {
      delete document.visibilityState;
      delete document.hidden;
    }
    document.dispatchEvent(new Event('visibilitychange'));
  }, hidden);

/// POST /api/v2/query on the collector.
async function query(q) {
  const r = await fetch(`${tally.url}/api/v2/query`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(q),
  });
  const answer = await r.json();
  if (!r.ok) throw new Error(`query ${r.status}: ${JSON.stringify(answer)}`);
  return answer.results;
}

test('page views carry the screen width; blur, SPA navigation, hiding and pagehide report engagement', async () => {
  const long = '<div style="height:6000px">a long page</div>';
  site.pages['/eng/a'] = pageHtml({ src: `${tally.url}/tally.js`, attrs: { site: 'eng', api: proxy.url }, body: long });
  site.pages['/eng/away'] = '<!doctype html><title>away</title>';
  const { context } = await newProfile(browser, {
    viewport: { width: 800, height: 600 },
    screen: { width: 1280, height: 800 },
  });
  // Every hit the page sent, as the proxy saw it: how (a beacon, or a fetch) and what.
  const sent = () =>
    proxy.hits.map((h) => ({ how: h.headers['sec-fetch-mode'] === 'no-cors' ? 'beacon' : 'fetch', hit: JSON.parse(h.body) }));
  // Distinct hits, each as first sent: a beaconed report stays queued until a later fetch of
  // the same body confirms it, and that resend is no new report.
  const ofType = (type) => {
    const all = sent();
    const seen = new Set();
    return all.filter((s) => s.hit.type === type && !seen.has(JSON.stringify(s.hit)) && seen.add(JSON.stringify(s.hit)));
  };
  const nth = (type, n) =>
    waitFor(() => ofType(type).length >= n && ofType(type)[n - 1], { what: `${type} hit ${n}; sent: ${JSON.stringify(sent())}` });

  const page = await context.newPage();
  await (await context.newPage()).bringToFront();
  const cdp = await context.newCDPSession(page);
  await cdp.send('Emulation.setFocusEmulationEnabled', { enabled: true });
  const started = Date.now();
  await page.goto(`${site.origin}/eng/a`);
  const a = (await nth('pageview', 1)).hit;
  assert.equal(a.screen_width, 1280, 'screen.width, not the window');

  // Page A, engaged 1.2 s, then the window loses focus (a real blur). (Before any mouse input:
  // input gives the page the browser's real focus, which emulation cannot then take away.)
  await elapse(1200);
  const depthTop = await depthNow(page);
  await cdp.send('Emulation.setFocusEmulationEnabled', { enabled: false });
  const blurred = Date.now();
  const r1 = await nth('engagement', 1);
  assert.equal(r1.how, 'fetch', 'the page is open: fetch');
  assert.deepEqual(
    [r1.hit.site, r1.hit.event_id, r1.hit.visitor_id, r1.hit.url, r1.hit.referrer],
    ['eng', a.event_id, a.visitor_id, a.url, null],
    "the page view's own event id, visitor id and URL",
  );
  assert.equal(r1.hit.scroll, depthTop, 'the share of the page in view so far');
  assert.ok(depthTop > 0 && depthTop < 20, `a long page: ${depthTop}`);
  assert.ok(
    r1.hit.engaged_ms >= 1200 && r1.hit.engaged_ms <= blurred - started,
    `engaged ${r1.hit.engaged_ms} ms of at most ${blurred - started}`,
  );
  assert.equal(r1.hit.screen_width, undefined, 'only page views carry the screen width');

  // Blurred for 1.5 s (not engaged); focused again (a real focus event), scrolled down by the
  // mouse wheel, 1.1 s, then an SPA navigation: page A reports its totals before page B is
  // counted.
  await elapse(1500);
  const refocusing = Date.now();
  await cdp.send('Emulation.setFocusEmulationEnabled', { enabled: true });
  await page.mouse.move(400, 300);
  await page.mouse.wheel(0, 1800);
  await waitFor(() => page.evaluate(() => scrollY >= 1800), { what: 'page A scrolled' });
  await elapse(1100);
  const depthA = await depthNow(page);
  const leavingA = Date.now();
  await page.evaluate(() => history.pushState({}, '', '/eng/b'));
  const b = (await nth('pageview', 2)).hit;
  const r2 = await nth('engagement', 2);
  assert.equal(r2.hit.event_id, a.event_id);
  const order = sent().map((s) => JSON.stringify(s.hit));
  assert.ok(order.indexOf(JSON.stringify(r2.hit)) < order.indexOf(JSON.stringify(b)), 'A reports before B is counted');
  const grewA = r2.hit.engaged_ms - r1.hit.engaged_ms;
  assert.ok(
    grewA >= 1100 && grewA <= Date.now() - refocusing && grewA < 1500 + 1100,
    `a total, grown by the focused time only: +${grewA} ms`,
  );
  assert.ok(depthA > depthTop, `scrolled further: ${depthA}`);
  assert.equal(r2.hit.scroll, depthA);
  assert.equal(b.screen_width, 1280);
  assert.equal(b.referrer, `${site.origin}/eng/a`);

  // Page B: scrolled to the end, engaged 1.1 s, hidden (a report by beacon), hidden 1.5 s
  // (not engaged), shown again for 1.1 s, then left for another page (pagehide, a beacon).
  await page.mouse.wheel(0, 20000);
  await waitFor(async () => (await depthNow(page)) === 100, { what: 'page B scrolled to its end' });
  await elapse(1100);
  await setHidden(page, true);
  const hidden = Date.now();
  const r3 = await nth('engagement', 3);
  assert.equal(r3.how, 'beacon', 'hiding: sendBeacon');
  assert.equal(r3.hit.event_id, b.event_id);
  assert.equal(r3.hit.url, `${site.origin}/eng/b`);
  assert.equal(r3.hit.scroll, 100);
  assert.ok(
    r3.hit.engaged_ms >= 1100 && r3.hit.engaged_ms <= hidden - leavingA,
    `engaged ${r3.hit.engaged_ms} ms of at most ${hidden - leavingA}`,
  );
  await elapse(1500);
  const showing = Date.now();
  await setHidden(page, false);
  await elapse(1100);
  await page.goto(`${site.origin}/eng/away`);
  const r4 = await nth('engagement', 4);
  // Leaving, Chromium blurs the old document before pagehide: the report leaves on that blur
  // by fetch with keepalive, which outlives the page like a beacon (pagehide then has nothing
  // new); without a blur first, pagehide sends it by beacon.
  assert.ok(['fetch', 'beacon'].includes(r4.how), r4.how);
  assert.equal(r4.hit.event_id, b.event_id);
  const grewB = r4.hit.engaged_ms - r3.hit.engaged_ms;
  assert.ok(
    grewB >= 1100 && grewB <= Date.now() - showing && grewB < 1500 + 1100,
    `a total, grown by the visible time only: +${grewB} ms`,
  );
  assert.equal(ofType('pageview').length, 2, 'reports count no page views');

  // What the collector kept: per page the largest engaged time and depth it was sent, and the
  // device class of the screen width (1280 px: a laptop).
  const expect = [
    ['/eng/a', Math.round(r2.hit.engaged_ms / 1000), depthA],
    ['/eng/b', Math.round(r4.hit.engaged_ms / 1000), 100],
  ];
  for (const [path, seconds, depth] of expect) {
    const q = { site_id: 'eng', date_range: 'day', metrics: ['visitors', 'time_on_page', 'scroll_depth'], filters: [['is', 'event:page', [path]]] };
    await waitFor(async (seen) => {
      const results = await query(q);
      seen(results);
      const m = results[0]?.metrics;
      return m && m[0] === 1 && m[1] === seconds && m[2] === depth;
    }, { what: `time on ${path} = ${seconds} s, scroll depth ${depth} %` });
  }
  const devices = await query({ site_id: 'eng', date_range: 'day', metrics: ['visitors'], dimensions: ['visit:device'] });
  assert.deepEqual(devices.map((r) => [r.dimensions, r.metrics]), [[['Laptop'], [1]]]);
  await context.close();
});
