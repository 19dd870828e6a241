// Run twice, count once: pjax themes run the snippet's <script> again after each navigation.
// Hexo NexT re-executes it with only src/id/class/type/data-pjax (its data-* options lost);
// Butterfly re-inserts it with all its attributes. Both replays below, on markup like those
// themes' (busuanzi ids, a hidden page-views container inside the swapped content), must count
// each navigation once, under the first run's site, and leave every counter showing the
// collector's numbers for the current URL. Assertions read the collector's counters.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  newProfile, counts, waitFor, startAll, stopAll,
} from './support.mjs';

let env, tally, site, browser;

before(async () => {
  env = await startAll();
  ({ tally, site, browser } = env);
});

after(() => stopAll(env));

/// A theme page: the Tally tag marked data-pjax, site counters in the footer (outside the
/// swapped #main), the page counter in a container hidden until filled (NexT's post meta).
function themePage(siteId, title, extraAttrs = '') {
  return `<!doctype html><html><head><meta charset="utf-8"><title>${title}</title>
<script data-pjax async src="${tally.url}/tally.js" data-site="${siteId}" data-busuanzi${extraAttrs}></script>
</head><body>
<main id="main"><h1>${title}</h1>
  <span id="busuanzi_container_page_pv" style="display: none;">Views: <span id="busuanzi_value_page_pv"></span></span>
  <span data-tally="page.views">-</span>
</main>
<footer><span id="busuanzi_container_site_pv" style="display: none;"><span id="busuanzi_value_site_pv"></span></span>
  <span id="busuanzi_value_site_uv"></span> <span data-tally="site.views">-</span></footer>
</body></html>`;
}

/// What the page shows: every counter's text and whether the containers are visible.
function shown(page) {
  return page.evaluate(() => {
    const t = (sel) => document.querySelector(sel).textContent;
    return {
      pagePv: t('#busuanzi_value_page_pv'),
      pageTally: t('[data-tally="page.views"]'),
      sitePv: t('#busuanzi_value_site_pv'),
      siteUv: t('#busuanzi_value_site_uv'),
      siteTally: t('[data-tally="site.views"]'),
      pageShown: document.getElementById('busuanzi_container_page_pv').style.display,
      siteShown: document.getElementById('busuanzi_container_site_pv').style.display,
    };
  });
}

/// Waits until every counter in the page shows the collector's numbers for (siteId, path).
async function countersMatch(page, siteId, path) {
  return waitFor(async (seen) => {
    const c = await counts(tally.url, siteId, path);
    const s = await shown(page);
    seen({ collector: c, page: s });
    const want = {
      pagePv: String(c.page.views), pageTally: String(c.page.views), sitePv: String(c.site.views),
      siteUv: String(c.site.visitors), siteTally: String(c.site.views), pageShown: 'inline', siteShown: 'inline',
    };
    return JSON.stringify(s) === JSON.stringify(want) && c;
  }, { what: `the counters of ${siteId}${path} in the page` });
}

/// Swaps #main for the one of `url`'s page (what pjax libraries do).
function swapIn(page, url) {
  return page.evaluate(async (url) => {
    const doc = new DOMParser().parseFromString(await (await fetch(url)).text(), 'text/html');
    document.querySelector('#main').replaceWith(doc.querySelector('#main'));
    document.title = doc.title;
  }, url);
}

/// Runs every script[data-pjax] again, as the theme does after a navigation, and resolves once
/// the new script has run. NexT (keep = false): a new element with only src, id, class, type
/// and data-pjax, appended to the head. Butterfly (keep = true): a copy with all attributes in
/// the old one's place.
function rerunScripts(page, keep) {
  return page.evaluate(async (keep) => {
    for (const old of [...document.querySelectorAll('script[data-pjax]')]) {
      const s = document.createElement('script');
      if (keep) {
        for (const a of old.attributes) s.setAttribute(a.name, a.value);
      } else {
        for (const k of ['id', 'className', 'type']) if (old[k]) s[k] = old[k];
        s.setAttribute('data-pjax', '');
        s.src = old.src;
      }
      const ran = new Promise((resolve) => { s.onload = s.onerror = resolve; });
      if (keep) old.replaceWith(s);
      else { document.head.appendChild(s); old.remove(); }
      await ran;
    }
  }, keep);
}

/// Sends a marker event and waits for the collector to have it: everything the page queued
/// before it (a wrongly counted re-run included) has been sent by then.
async function settle(page, log) {
  const before = log.hits.length;
  await page.evaluate(() => tally('event', 'marker'));
  await waitFor(() => log.hits.slice(before).some((h) => JSON.parse(h.body).name === 'marker'), { what: 'the marker event sent' });
}

const pageViews = (log) => log.hits.map((h) => JSON.parse(h.body)).filter((b) => b.type === 'pageview');

for (const [theme, keep] of [['NexT (attributes dropped)', false], ['Butterfly (attributes kept)', true]]) {
  const siteId = keep ? 'butterfly' : 'next';
  test(`${theme}: each pjax navigation counts once, under the first run's site, counters refreshed`, async () => {
    for (const p of ['a', 'b', 'c']) site.pages[`/${siteId}/${p}`] = themePage(siteId, `Post ${p}`);
    const { context, log } = await newProfile(browser);
    const page = await context.newPage();
    await page.goto(`${site.origin}/${siteId}/a`);
    await countersMatch(page, siteId, `/${siteId}/a`);

    // MoOx pjax's order (NexT, Butterfly): swap the content, pushState, then re-run scripts.
    await swapIn(page, `${site.origin}/${siteId}/b`);
    await page.evaluate((u) => history.pushState({}, '', u), `/${siteId}/b`);
    await rerunScripts(page, keep);
    let c = await countersMatch(page, siteId, `/${siteId}/b`);
    assert.deepEqual([c.site.views, c.page.views], [2, 1]);

    // Another order (pushState first, content swapped after the answer filled the old
    // counters): only the re-run's refresh can fill the fresh, hidden containers.
    const answered = page.waitForResponse((r) => r.url().includes('/api/v1/hit'));
    await page.evaluate((u) => history.pushState({}, '', u), `/${siteId}/c`);
    await answered;
    // The response arriving is not the page having read it: wait until its numbers are in
    // the old containers, so the answer cannot land in the swapped-in ones.
    await waitFor(async (seen) => {
      const s = await shown(page);
      seen(s);
      return s.pagePv === '1' && s.sitePv === '3';
    }, { what: 'the answer for /c in the old counters' });
    await swapIn(page, `${site.origin}/${siteId}/c`);
    assert.equal((await shown(page)).pageShown, 'none', 'the swapped-in container starts hidden');
    await rerunScripts(page, keep);
    c = await countersMatch(page, siteId, `/${siteId}/c`);
    assert.deepEqual([c.site.views, c.page.views], [3, 1]);

    // A third run on the same URL counts nothing either.
    await rerunScripts(page, keep);
    await settle(page, log);
    const views = pageViews(log);
    assert.deepEqual(views.map((v) => new URL(v.url).pathname), [`/${siteId}/a`, `/${siteId}/b`, `/${siteId}/c`]);
    assert.ok(log.hits.every((h) => JSON.parse(h.body).site === siteId), 'every hit under the first run\'s site');
    assert.ok(log.hits.every((h) => h.url.startsWith(tally.url)), 'every hit to the first run\'s collector');
    c = await counts(tally.url, siteId, `/${siteId}/c`);
    assert.deepEqual([c.site.views, c.page.views], [3, 1]);
    assert.equal(log.requests.filter((u) => /\/tally-[0-9a-f]+\.wasm/.test(u)).length, 1, 'the module was fetched once');
    assert.deepEqual(log.errors, []);
    await context.close();
  });
}

test('data-spa="false" on a pjax theme: the re-run reads the counters of the new URL, counting nothing', async () => {
  const siteId = 'pjaxnospa';
  for (const p of ['a', 'b']) site.pages[`/${siteId}/${p}`] = themePage(siteId, `Post ${p}`, ' data-spa="false"');
  const { context, log } = await newProfile(browser);
  const page = await context.newPage();
  await page.goto(`${site.origin}/${siteId}/b`); // b has a view of its own
  await countersMatch(page, siteId, `/${siteId}/b`);
  await page.goto(`${site.origin}/${siteId}/a`);
  await countersMatch(page, siteId, `/${siteId}/a`);

  await swapIn(page, `${site.origin}/${siteId}/b`);
  await page.evaluate((u) => history.pushState({}, '', u), `/${siteId}/b`);
  await rerunScripts(page, false);
  const c = await countersMatch(page, siteId, `/${siteId}/b`);
  assert.deepEqual([c.site.views, c.page.views], [2, 1], 'the navigation was not counted (data-spa="false")');
  await settle(page, log);
  assert.equal(pageViews(log).length, 2);
  assert.equal(log.requests.filter((u) => u.includes('/api/v1/counts')).length, 1, 'one read of the counts');
  await context.close();
});
