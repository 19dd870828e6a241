// Lighthouse (Google's page audit, run here against Debian's Chromium) scores the dashboard's
// performance and accessibility at 0.95 or more, on a 1280×800 desktop and on a 390×844 phone
// (Lighthouse's simulated mobile network and CPU), with two days of data on the page.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import * as chromeLauncher from 'chrome-launcher';
import lighthouse from 'lighthouse';
import { CHROMIUM_ARGS, USER_AGENT, cleanup, startTally, tallyCommand, tempDir, uuidv7 } from './support.mjs';

const HOUR = 3600 * 1000;

const FORMS = [
  { name: 'desktop', settings: { formFactor: 'desktop', screenEmulation: { mobile: false, width: 1280, height: 800, deviceScaleFactor: 1, disabled: false } } },
  { name: 'phone', settings: { formFactor: 'mobile', screenEmulation: { mobile: true, width: 390, height: 844, deviceScaleFactor: 3, disabled: false } } },
];

test('Lighthouse: dashboard performance and accessibility at least 0.95 on desktop and phone', async () => {
  const dir = tempDir();
  const db = join(dir, 'lh.sqlite');
  await tallyCommand(['--db', db, 'site', 'add', 'blog', '--origin', 'https://blog.example', '--public']);
  const tally = await startTally({ db, autoSites: false });
  let chrome;
  try {
    const now = Date.now();
    const pages = ['/', '/posts/one', '/posts/two', '/about', '/pricing'];
    const refs = [null, 'https://news.example/x', 'https://www.google.com/', 'https://social.example/p'];
    for (let n = 0; n < 120; n++) {
      const at = Math.round(now - ((n * 7) % (2 * 24)) * HOUR - 0.1 * HOUR);
      const r = await fetch(`${tally.url}/api/v1/hit`, {
        method: 'POST', headers: { 'content-type': 'text/plain', origin: 'https://blog.example', 'user-agent': USER_AGENT },
        body: JSON.stringify({ site: 'blog', type: 'pageview', event_id: uuidv7(at),
          visitor_id: `0b6f5f8e-7d0e-4a55-9d5e-${String(n % 40).padStart(12, '0')}`,
          url: `https://blog.example${pages[n % pages.length]}?utm_campaign=c${n % 3}`,
          referrer: refs[n % refs.length], screen_width: n % 2 ? 390 : 1440 }),
      });
      const answer = await r.json();
      assert.equal(answer.status, 'accepted', JSON.stringify(answer));
    }
    mkdirSync(join(dir, 'profile'));
    chrome = await chromeLauncher.launch({
      chromePath: process.env.CHROMIUM || '/usr/bin/chromium',
      chromeFlags: CHROMIUM_ARGS.filter((f) => !f.startsWith('--user-agent')),
      userDataDir: join(dir, 'profile'),
    });
    for (const form of FORMS) {
      const result = await lighthouse(`${tally.url}/dashboard/blog?range=30d`, {
        port: chrome.port, output: 'json', logLevel: 'error',
        onlyCategories: ['performance', 'accessibility'],
      }, { extends: 'lighthouse:default', settings: form.settings });
      const { lhr } = result;
      assert.equal(lhr.runtimeError, undefined, `${form.name}: ${JSON.stringify(lhr.runtimeError)}`);
      const failing = Object.values(lhr.audits)
        .filter((a) => a.scoreDisplayMode === 'binary' && a.score === 0)
        .map((a) => a.id);
      for (const category of ['performance', 'accessibility']) {
        const score = lhr.categories[category].score;
        console.log(`${form.name} ${category}: ${score}`);
        assert.ok(score >= 0.95, `${form.name} ${category} ${score} (failing: ${failing.join(', ')})`);
      }
    }
  } finally {
    if (chrome) await chrome.kill();
    await tally.stop();
    cleanup(dir);
  }
});
