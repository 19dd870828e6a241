// When things go wrong: the collector down or throttling, WebAssembly forbidden by CSP, a slow
// module download. The page must never notice; the view must arrive exactly once.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startTally, startSite, startProxy, launchBrowser, newProfile, pageHtml, counts, countsWhere,
  waitFor, tempDir, cleanup,
} from './support.mjs';

let dir, site, browser;

before(async () => {
  dir = tempDir();
  site = await startSite();
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await site?.close();
  cleanup(dir);
});

/// The snippet loaded from the site's own server (`/static/`, the "own CDN" setup), so it
/// loads even while the collector is down.
const ownCdn = (attrs, extra = {}) => pageHtml({ src: `${site.origin}/static/tally.js`, attrs, ...extra });
const queueText = (page) => page.evaluate(() => localStorage.getItem('tally:q'));
const eventId = (hit) => JSON.parse(hit.body).event_id;

test('collector down while the page loads: the queued view arrives exactly once when it is back', async () => {
  const db = `${dir}/down.sqlite`;
  let tally = await startTally({ db });
  const { port, url: api } = tally;
  await tally.stop();

  site.pages['/down/a'] = ownCdn({ site: 'down', api }, { body: '<script>window.hostRan = true</script>' });
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  const failed = page.waitForEvent('requestfailed', (r) => r.url().includes('/api/v1/hit'));
  await page.goto(`${site.origin}/down/a`);
  await failed;
  assert.equal(await page.evaluate(() => window.hostRan && document.readyState), 'complete');
  const queued = await waitFor(async () => {
    const q = await queueText(page); // "due attempts born event_id body"
    return q && Number(q.split(' ')[1]) >= 1 && q;
  }, { what: 'the failed view queued with its failed attempt counted' });
  assert.ok(queued.includes(eventId(log.hits[0])));

  tally = await startTally({ db, port });
  try {
    // Delivered by the page's own backoff timer, with the same event id.
    await countsWhere(api, 'down', '/down/a', (c) => c.site.views === 1);
    await waitFor(async () => !(await queueText(page)), { what: 'the queue emptied' });
    assert.ok(log.hits.length >= 2);
    assert.ok(log.hits.every((h) => eventId(h) === eventId(log.hits[0])), 'every retry reused the event id');

    // A later page load neither resends it nor counts it again.
    await page.reload();
    const c = await countsWhere(api, 'down', '/down/a', (c) => c.site.views === 2);
    assert.equal(c.site.visitors, 1);
    await waitFor(async () => !(await queueText(page)), { what: 'the queue emptied again' });
    assert.equal((await counts(api, 'down', '/down/a')).site.views, 2, 'the first view counted exactly once');
    assert.deepEqual(log.errors, []);
  } finally {
    await context.close();
    await tally.stop();
  }
});

test('the next page load delivers what an earlier page left queued', async () => {
  const db = `${dir}/nextload.sqlite`;
  let tally = await startTally({ db });
  const { port, url: api } = tally;
  await tally.stop();
  site.pages['/nextload/a'] = ownCdn({ site: 'nextload', api });
  site.pages['/nextload/b'] = ownCdn({ site: 'nextload', api });
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  const failed = page.waitForEvent('requestfailed', (r) => r.url().includes('/api/v1/hit'));
  await page.goto(`${site.origin}/nextload/a`);
  await failed;
  const first = eventId(log.hits[0]);
  await page.goto('about:blank'); // the page (and its timers) are gone; the queue stays

  tally = await startTally({ db, port });
  try {
    await page.goto(`${site.origin}/nextload/b`);
    await countsWhere(api, 'nextload', '/nextload/a', (c) => c.page.views === 1 && c.site.views === 2);
    assert.ok(log.hits.slice(1).some((h) => eventId(h) === first), 'resent with its original event id');
    await waitFor(async () => !(await queueText(page)), { what: 'the queue emptied' });
  } finally {
    await context.close();
    await tally.stop();
  }
});

// Retry-After in each form HTTP allows: delay-seconds and the three HTTP-date forms (js/host.js
// hands dates to the browser's Date.parse; asctime carries no zone and means GMT).
const retryAfter = {
  seconds: (wait) => String(wait),
  'HTTP-date': (wait) => new Date(Date.now() + (wait + 1) * 1000).toUTCString(),
  'RFC 850 date': (wait) => {
    const d = new Date(Date.now() + (wait + 1) * 1000), [, dd, mon, yyyy, time] = d.toUTCString().replace(',', '').split(' ');
    return `${d.toLocaleDateString('en-US', { weekday: 'long', timeZone: 'UTC' })}, ${dd}-${mon}-${yyyy.slice(2)} ${time} GMT`;
  },
  'asctime date': (wait) => {
    const [wd, dd, mon, yyyy, time] = new Date(Date.now() + (wait + 1) * 1000).toUTCString().replace(',', '').split(' ');
    return `${wd} ${mon} ${String(+dd).padStart(2, ' ')} ${time} ${yyyy}`;
  },
};
for (const form of Object.keys(retryAfter)) {
  test(`collector answers 429 with Retry-After (${form}): the client waits, then delivers once`, async () => {
    const siteId = `throttle-${form.split(/[ -]/)[0].toLowerCase()}`;
    const tally = await startTally({ db: `${dir}/${siteId}.sqlite` });
    const wait = 2;
    const proxy = await startProxy(tally.url, (req, body, n) => n === 1 && {
      status: 429,
      headers: { 'retry-after': retryAfter[form](wait) },
      body: '{"error":"rate_limited","message":"slow down"}',
    });
    site.pages[`/${siteId}/a`] = ownCdn({ site: siteId, api: proxy.url });
    const { context } = await newProfile(browser);
    try {
      const page = await context.newPage();
      await page.goto(`${site.origin}/${siteId}/a`);
      await countsWhere(tally.url, siteId, `/${siteId}/a`, (c) => c.site.views === 1);
      await waitFor(async () => !(await queueText(page)), { what: 'the queue emptied' });
      assert.equal(proxy.hits.length, 2, 'one refused try, one delivery');
      assert.equal(eventId(proxy.hits[1]), eventId(proxy.hits[0]), 'the retry kept its event id');
      assert.notEqual(proxy.hits[1].url, proxy.hits[0].url, 'a fresh t= cache buster');
      const waited = proxy.hits[1].at - proxy.hits[0].at;
      // An HTTP-date has one-second resolution: now + 3 s truncated is at least 2 s away.
      assert.ok(waited >= wait * 1000 - 50, `waited ${waited} ms, Retry-After asked ${wait} s`);
      assert.equal((await counts(tally.url, siteId, `/${siteId}/a`)).site.views, 1);
    } finally {
      await context.close();
      await proxy.close();
      await tally.stop();
    }
  });
}

// sendBeacon, the one request browsers promise to deliver while a page goes away: a hit that is
// due when the page is hidden is handed to it. The page's clock is paused, so the retry timer
// of a refused first try cannot fire; the clock is then set past the retry's due time and the
// page left.
test('a hit due when the page goes away is sent with sendBeacon and counted once', async () => {
  const siteId = 'beacon-hide';
  const tally = await startTally({ db: `${dir}/${siteId}.sqlite` });
  const proxy = await startProxy(tally.url, (req, body, n) => n === 1 && { status: 503, body: '{}' });
  site.pages[`/${siteId}/a`] = ownCdn({ site: siteId, api: proxy.url });
  const { context, log } = await newProfile(browser);
  try {
    const t0 = Date.now();
    await context.clock.install({ time: t0 });
    await context.clock.pauseAt(t0 + 1000);
    const page = await context.newPage();
    await page.goto(`${site.origin}/${siteId}/a`);
    await waitFor(async () => {
      const q = await queueText(page); // "due attempts born event_id body"
      return q && Number(q.split(' ')[1]) === 1;
    }, { what: 'the refused view queued with its failed try counted' });
    assert.equal(proxy.hits.length, 1, 'no retry while the clock stands still');
    // Past the backoff (at most 1 s after the first try); no timer fires.
    await context.clock.setSystemTime(t0 + 5000);
    await page.goto('about:blank');
    await countsWhere(tally.url, siteId, `/${siteId}/a`, (c) => c.site.views === 1);
    // The page view, then its engagement report, which goes by beacon right after it.
    const views = proxy.hits.filter((h) => JSON.parse(h.body).type === 'pageview');
    assert.equal(views.length, 2);
    assert.equal(eventId(views[1]), eventId(views[0]), 'the beacon carried the same event id');
    // fetch(..., {credentials: 'omit'}) is a CORS request; a beacon with a text body is not.
    assert.deepEqual(views.map((h) => h.headers['sec-fetch-mode']), ['cors', 'no-cors']);
    assert.deepEqual(log.errors, []);
  } finally {
    await context.close();
    await proxy.close();
    await tally.stop();
  }
});

// Where fetch throws (no fetch, or its keepalive quota used up), the hit goes to sendBeacon.
test('when fetch throws, the hit is sent with sendBeacon and counted once', async () => {
  const siteId = 'beacon-fallback';
  const tally = await startTally({ db: `${dir}/${siteId}.sqlite` });
  site.pages[`/${siteId}/a`] = ownCdn({ site: siteId, api: tally.url }, {
    head: `<script>
      const realFetch = fetch;
      window.fetch = (url, init) => {
        if (String(url).includes('/api/v1/hit')) throw new TypeError('keepalive quota exceeded');
        return realFetch(url, init);
      };
    </script>`,
  });
  const { context, log } = await newProfile(browser);
  const types = [];
  context.on('request', (r) => r.url().includes('/api/v1/hit') && types.push(r.resourceType()));
  try {
    const page = await context.newPage();
    await page.goto(`${site.origin}/${siteId}/a`);
    await countsWhere(tally.url, siteId, `/${siteId}/a`, (c) => c.site.views === 1);
    assert.equal(types[0], 'ping', 'sent by sendBeacon');
    // The beacon's outcome is unknown, so the hit stays queued and is beaconed again on its
    // backoff; the collector counts it once.
    await waitFor(() => log.hits.length >= 2, { what: 'a second beacon' });
    assert.ok(log.hits.every((h) => eventId(h) === eventId(log.hits[0])), 'one event id');
    assert.equal((await counts(tally.url, siteId, `/${siteId}/a`)).site.views, 1);
    assert.deepEqual(log.errors, []);
  } finally {
    await context.close();
    await tally.stop();
  }
});

test("the host page's own script keeps running when the collector is unreachable", async () => {
  // Port 9 (discard) on loopback: nothing listens, connections are refused.
  site.pages['/unreachable/a'] = ownCdn({ site: 'unreachable', api: 'http://127.0.0.1:9' }, {
    stub: true,
    body: `<script>
      tally('event', 'early');
      window.steps = ['inline'];
      addEventListener('load', () => {
        window.steps.push('load');
        tally('event', 'late', { dedupe: 'x' });
        tally.track('later');
        window.steps.push('after-calls');
      });
    </script>`,
  });
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(`${site.origin}/unreachable/a`);
  await waitFor(() => log.hits.length >= 4, { what: 'the view and three events attempted' });
  assert.deepEqual(await page.evaluate(() => window.steps), ['inline', 'load', 'after-calls']);
  assert.deepEqual(log.errors, [], 'nothing thrown into the page');
  await context.close();
});

test("a CSP without 'wasm-unsafe-eval' gets one console message naming it, and no page error", async () => {
  const tally = await startTally({ db: `${dir}/csp.sqlite` });
  try {
    site.pages['/csp/a'] = {
      html: pageHtml({ src: `${tally.url}/tally.js`, attrs: { site: 'csp' }, body: '<script src="/csp/after.js"></script>' }),
      headers: { 'content-security-policy': `script-src 'self' ${tally.url}; connect-src 'self' ${tally.url}` },
    };
    site.pages['/csp/after.js'] = { html: 'window.after = true', headers: { 'content-type': 'text/javascript' } };
    const { context, log } = await newProfile(browser);
    const page = await context.newPage();
    await page.goto(`${site.origin}/csp/a`);
    const message = await waitFor(() => log.console.find((m) => m.startsWith('tally:')), { what: 'the tally console message' });
    assert.match(message, /'wasm-unsafe-eval'/);
    assert.equal(log.console.filter((m) => m.startsWith('tally:')).length, 1);
    assert.deepEqual(log.errors, []);
    assert.equal(await page.evaluate(() => window.after), true);
    assert.equal(log.hits.length, 0);
    await context.close();
  } finally {
    await tally.stop();
  }
});

test('the load event never waits for the snippet (module download held back)', async () => {
  const tally = await startTally({ db: `${dir}/slow.sqlite` });
  try {
    const wasm = (await (await fetch(`${site.origin}/static/tally.js`)).text()).match(/tally-[0-9a-f]+\.wasm/)[0];
    const release = site.hold(`/static/${wasm}`);
    site.pages['/slow/a'] = ownCdn({ site: 'slow', api: tally.url });
    const { context } = await newProfile(browser);
    const page = await context.newPage();
    const wasmRequested = page.waitForRequest((r) => r.url().endsWith(wasm));
    await page.goto(`${site.origin}/slow/a`, { waitUntil: 'load' });
    await wasmRequested;
    assert.equal(await page.evaluate(() => document.readyState), 'complete', 'load fired while the module was still downloading');
    await assert.rejects(counts(tally.url, 'slow', '/slow/a'), /unknown_site/, 'nothing counted yet: no such site');
    release();
    await countsWhere(tally.url, 'slow', '/slow/a', (c) => c.site.views === 1);
    await context.close();
  } finally {
    await tally.stop();
  }
});
