// Shared fixtures of the browser suite: the real `tally` binary, a static site server, a
// fault-injecting proxy, headless Chromium, and condition-based waiting (never sleeps).
//
// Contract: every fixture binds 127.0.0.1 port 0 (or a port it was given back), is stopped by
// the test that started it, and reports what went wrong with enough context to debug: the
// server's stderr, the last value a wait saw.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, existsSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve, extname, dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const STATIC = join(ROOT, 'static');
/// A normal desktop Chrome: HeadlessChrome would be filtered as a bot by the collector.
export const USER_AGENT =
  'Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36';
// The user agent is also set for the whole browser: a beacon sent while a page unloads does not
// carry the context's user agent (it would go out as HeadlessChrome and be filtered).
export const CHROMIUM_ARGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  `--user-agent=${USER_AGENT}`,
];

export function tallyBin() {
  const bin = process.env.TALLY_BIN || join(ROOT, 'target/debug/tally');
  if (!existsSync(bin)) throw new Error(`no tally binary at ${bin}: run 'cargo build --bin tally' or set TALLY_BIN`);
  return bin;
}

export function tempDir() {
  return mkdtempSync(join(tmpdir(), 'tally-browser-'));
}

/// Runs a `tally` command to completion (e.g. `site add`).
export async function tallyCommand(args) {
  const child = spawn(tallyBin(), args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  const [code] = await once(child, 'exit');
  if (code !== 0) throw new Error(`tally ${args.join(' ')} exited ${code}: ${out}`);
  return out;
}

/// Starts `tally serve` on 127.0.0.1:`port` (0: any) and resolves once it prints its address.
/// With auto-sites, the per-address limit on new sites is off: every test of a file makes its
/// own site, all from 127.0.0.1.
export async function startTally({ db, port = 0, autoSites = true, extra = [] }) {
  const auto = autoSites ? ['--auto-sites', '--new-sites-per-hour', '0'] : [];
  const args = ['--db', db, 'serve', '--listen', `127.0.0.1:${port}`, ...auto, ...extra];
  const child = spawn(tallyBin(), args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, TALLY_LOG: 'warn' } });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const url = await new Promise((resolveUrl, reject) => {
    let buf = '';
    child.stdout.on('data', (d) => {
      buf += d;
      const m = buf.match(/listening on (http:\/\/\S+)/);
      if (m) resolveUrl(m[1].replace(/\/$/, ''));
    });
    child.on('exit', (code) => reject(new Error(`tally serve exited ${code} before listening: ${stderr}`)));
  });
  return {
    url,
    port: Number(new URL(url).port),
    get stderr() { return stderr; },
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      await once(child, 'exit');
    },
  };
}

const TYPES = { '.js': 'text/javascript; charset=utf-8', '.wasm': 'application/wasm', '.html': 'text/html; charset=utf-8' };

/// A static web site on 127.0.0.1: `pages` maps a path to an HTML string or to
/// `{ html, headers }`; `/static/*` serves the committed snippet (the "own CDN" case).
/// `hold(path)` makes requests for that path wait until the returned release() is called.
export async function startSite(pages = {}) {
  const held = new Map();
  const server = http.createServer(async (req, res) => {
    const path = new URL(req.url, 'http://x').pathname;
    if (held.has(path)) await held.get(path).promise;
    if (path.startsWith('/static/')) {
      const file = join(STATIC, path.slice('/static/'.length));
      if (!file.startsWith(STATIC) || !existsSync(file)) { res.writeHead(404).end(); return; }
      res.writeHead(200, { 'content-type': TYPES[extname(file)] || 'application/octet-stream', 'access-control-allow-origin': '*' });
      res.end(readFileSync(file));
      return;
    }
    const page = pages[path] ?? pages['*'];
    if (page === undefined) { res.writeHead(404).end('not found'); return; }
    const { html, headers = {} } = typeof page === 'string' ? { html: page } : page;
    res.writeHead(200, { 'content-type': TYPES['.html'], 'cache-control': 'no-store', ...headers });
    res.end(html);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = server.address().port;
  return {
    port,
    origin: `http://127.0.0.1:${port}`,
    localhost: `http://localhost:${port}`,
    pages,
    hold(path) {
      let release;
      const promise = new Promise((r) => (release = r));
      held.set(path, { promise });
      return () => { held.delete(path); release(); };
    },
    async close() {
      for (const h of held.values()) h.promise.then?.(() => {});
      server.closeAllConnections();
      server.close();
    },
  };
}

/// A proxy in front of `target` (a tally URL). `intercept(req, body, n)` may answer a
/// request itself by returning { status, headers, body }; n counts hits (POST /api/v1/hit).
/// Every hit is logged with its arrival time, URL, headers and body.
export async function startProxy(target, intercept = () => null) {
  const hits = [];
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      const isHit = req.method === 'POST' && req.url.startsWith('/api/v1/hit');
      if (isHit) hits.push({ at: Date.now(), url: req.url, headers: req.headers, body: body.toString() });
      const own = isHit ? intercept(req, body.toString(), hits.length) : null;
      if (own) {
        res.writeHead(own.status, {
          'access-control-allow-origin': req.headers.origin || '*',
          'access-control-allow-credentials': 'true',
          'access-control-expose-headers': 'Retry-After',
          'content-type': 'application/json',
          ...own.headers,
        });
        res.end(own.body ?? '');
        return;
      }
      const t = new URL(target);
      const upstream = http.request(
        { host: t.hostname, port: t.port, method: req.method, path: req.url, headers: { ...req.headers, host: t.host } },
        (up) => {
          res.writeHead(up.statusCode, up.headers);
          up.pipe(res);
        },
      );
      upstream.on('error', () => { res.writeHead(502).end(); });
      upstream.end(body);
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    hits,
    async close() { server.closeAllConnections(); server.close(); },
  };
}

/// A UUIDv7 event id whose time is `ms` (the hit's own time, as the snippet would send it).
export function uuidv7(ms) {
  const b = randomBytes(16);
  b.writeUIntBE(ms, 0, 6);
  b[6] = (b[6] & 0x0f) | 0x70;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

export async function launchBrowser() {
  return chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS });
}

/// A fresh browser profile (own storage) with a normal user agent; `log` collects every
/// request to the collector's hit endpoint, console messages and page errors.
export async function newProfile(browser, options = {}) {
  const context = await browser.newContext({ userAgent: USER_AGENT, ...options });
  const log = { hits: [], console: [], errors: [], requests: [] };
  context.on('request', (r) => {
    log.requests.push(r.url());
    if (r.url().includes('/api/v1/hit')) log.hits.push({ url: r.url(), body: r.postData(), at: Date.now() });
  });
  context.on('page', (p) => {
    p.on('console', (m) => log.console.push(m.text()));
    p.on('pageerror', (e) => log.errors.push(String(e)));
  });
  return { context, log };
}

/// Polls `probe` until it returns a value other than undefined/null/false; throws after
/// `timeout` with the last thing it saw (`seen(x)` records it for the message).
export async function waitFor(probe, { timeout = 20000, interval = 50, what = 'condition' } = {}) {
  const deadline = Date.now() + timeout;
  let last;
  const seen = (x) => { last = x; };
  for (;;) {
    let value;
    try { value = await probe(seen); } catch (e) { last = e; }
    if (value !== undefined && value !== null && value !== false) return value;
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}; last seen: ${last instanceof Error ? last.stack : JSON.stringify(last)}`);
    }
    await new Promise((r) => setTimeout(r, interval)); // polling interval, not synchronisation
  }
}

/// Waits until the profile's log holds at least `n` hits and returns them. The browser reports
/// a request to the test asynchronously, so the server may count a hit before the log has it.
export function hitsLogged(log, n) {
  return waitFor(() => (log.hits.length >= n ? log.hits : null), { what: `${n} hit(s) in the request log` });
}

/// GET /api/v1/counts, straight from the collector.
export async function counts(api, site, page = '/') {
  const r = await fetch(`${api}/api/v1/counts?site=${encodeURIComponent(site)}&page=${encodeURIComponent(page)}`);
  if (!r.ok) throw new Error(`counts ${r.status}: ${await r.text()}`);
  return r.json();
}

/// Waits until the counts of (site, page) satisfy `ok`, and returns them.
export function countsWhere(api, site, page, ok, what) {
  return waitFor(async (seen) => {
    const c = await counts(api, site, page);
    seen(c);
    return ok(c) ? c : null;
  }, { what: what || `counts of ${site}${page} (${ok})` });
}

/// An HTML page with the snippet. `src` is the loader URL; `attrs` the data-* attributes.
export function pageHtml({ src, attrs = {}, body = '', head = '', stub = false }) {
  const a = Object.entries(attrs).map(([k, v]) => (v === true ? ` data-${k}` : ` data-${k}="${v}"`)).join('');
  const queueStub = stub ? '<script>window.tally=window.tally||function(){(tally.q=tally.q||[]).push(arguments)}</script>' : '';
  return `<!doctype html><html><head><meta charset="utf-8"><title>t</title>${head}${queueStub}
<script async src="${src}"${a}></script></head><body>${body}</body></html>`;
}

/// The tally-owned keys of the page's storage areas.
export function storageKeys(page) {
  return page.evaluate(() => {
    const keys = [];
    for (const s of [localStorage, sessionStorage]) for (let i = 0; i < s.length; i++) if (s.key(i).startsWith('tally:')) keys.push(s.key(i));
    return keys;
  });
}

export function cleanup(dir) {
  rmSync(dir, { recursive: true, force: true });
}

/** The usual test file's world: a collector on a fresh database, a site server, a browser. */
export async function startAll() {
  const dir = tempDir();
  const tally = await startTally({ db: `${dir}/tally.sqlite` });
  const site = await startSite();
  const browser = await launchBrowser();
  return { dir, tally, site, browser };
}

/** Stops what {@link startAll} started (whatever of it did start) and removes its files. */
export async function stopAll(env) {
  await env?.browser?.close();
  await env?.site?.close();
  await env?.tally?.stop();
  if (env?.dir) cleanup(env.dir);
}
