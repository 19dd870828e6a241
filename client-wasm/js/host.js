// Tally host functions: the only place the WebAssembly client touches browser APIs.
//
// Contract: each function is imported by src/web.rs. scripts/build-snippet.sh inlines this
// file into the wasm-bindgen glue (replacing the glue's import of it), so the free name
// `run` below is the glue's own export (src/web.rs: the op codes). Nothing here throws:
// storage errors become null/false, a failed fetch becomes an answer with status 0, and every call
// back into the module is wrapped so a fault there cannot reach the page.
// Full-line comments are stripped at build time; keep the code itself compact.

// run()'s string arguments are never undefined (that would arrive as "undefined").
function tallyCall(o, s = 0, w = 0, a = '', b = '', c = '') {
  try { run(o, s, w, a, b, c) } catch (e) {}
}
function tallyArea(a) {
  return a ? sessionStorage : localStorage
}
// Retry-After as a wait in ms: delay-seconds, or an HTTP-date in any of its three forms
// (Date.parse reads IMF-fixdate, RFC 850 and asctime; asctime carries no zone, so GMT is
// added). Absent, unreadable (NaN) or past (negative): the module treats all as 0.
function tallyWait(h) {
  return h == null ? 0 : /^\s*\d+\s*$/.test(h) ? h * 1e3 : Date.parse(/gmt/i.test(h) ? h : h + ' GMT') - Date.now()
}
// The host calls with numbers only, one import: 0 now (Unix ms), 1 later(x ms), 2 want(x:
// busuanzi), 3 listen(x: spa).
export function num(o, x) {
  return o ? [, tallyLater, tallyWant, tallyListen][o](x) : Date.now()
}
export function rand(b) {
  crypto.getRandomValues(b)
}
export function load(a, k) {
  try { return tallyArea(a).getItem(k) } catch (e) { return null }
}
export function save(a, k, v) {
  try { v ? tallyArea(a).setItem(k, v) : tallyArea(a).removeItem(k); return true } catch (e) { return false }
}
// Event ids whose fetch awaits its answer; the answer (op 2) leaves the set first.
const tallyFlights = new Set();
function tallyDone(k, s, w, t) {
  tallyFlights.delete(k);
  tallyCall(2, s, w, t, k)
}
export function busy(k) {
  return tallyFlights.has(k)
}
// A hit to api a (with &counts=1 when c), every URL with a fresh t= cache buster. With event
// id k: fetch with a text/plain body (no CORS preflight), keepalive so it survives
// navigation, no cookies; the answer is read, so 429/503 + Retry-After and the counters reach
// the module (op 2, naming k). Without k: sendBeacon (page hiding: no answer wanted).
export function send(a, c, b, k) {
  const u = a + '/api/v1/hit?t=' + Date.now() + (c ? '&counts=1' : '');
  try {
    if (!k) return navigator.sendBeacon(u, b);
    tallyFlights.add(k);
    fetch(u, { method: 'POST', body: b, keepalive: true, credentials: 'omit' })
      .then(r => r.text().then(t => tallyDone(k, r.status, tallyWait(r.headers.get('Retry-After')), t)),
        () => tallyDone(k, 0))
  } catch (e) {
    // No fetch, or its keepalive quota is used up: fall back to a beacon, outcome unknown (1).
    if (k) {
      const ok = send(a, 0, b);
      setTimeout(() => tallyDone(k, ok ? 1 : 0))
    }
  }
  return false
}
function tallyLater(ms) {
  setTimeout(() => tallyCall(3), ms)
}
export function page(r) {
  return r ? document.referrer : location.href
}
// Is the page still at URL u: the same path (p), or the same URL but for the fragment?
export function same(u, p) {
  try {
    const a = new URL(u), b = location;
    return p ? a.pathname == b.pathname : a.href.split('#')[0] == b.href.split('#')[0]
  } catch (e) { return false }
}
function tallyWant(z) {
  return document.readyState == 'loading' || !!document.querySelector('[data-tally]' + (z ? ',[id^=busuanzi_]' : ''))
}
// The answer is a tally_wire::HitResponse; its counts fill [data-tally=...] elements and,
// with data-busuanzi, the classic busuanzi ids (showing their hidden containers).
export function fill(t, z) {
  try {
    const d = document, c = JSON.parse(t).counts, f = () => [
      ['site.views', 'site_pv', c.site.views], ['site.visitors', 'site_uv', c.site.visitors],
      ['page.views', 'page_pv', c.page.views], ['page.visitors', 'page_uv', c.page.visitors],
      ['live', 0, c.live.visitors]
    ].forEach(([k, b, v]) => {
      d.querySelectorAll('[data-tally="' + k + '"]').forEach(e => e.textContent = v);
      let e = z && b && d.getElementById('busuanzi_value_' + b);
      if (e) e.textContent = v;
      e = z && b && d.getElementById('busuanzi_container_' + b);
      if (e) e.style.display = 'inline'
    });
    c && (d.readyState == 'loading' ? d.addEventListener('DOMContentLoaded', f) : f())
  } catch (e) {}
}
function tallyListen(spa) {
  if (spa) {
    ['pushState', 'replaceState'].forEach((m, i) => {
      const o = history[m];
      history[m] = function () {
        const r = o.apply(this, arguments);
        tallyCall(5 + i);
        return r
      }
    });
    addEventListener('popstate', () => tallyCall(7))
  }
  addEventListener('pagehide', () => tallyCall(4));
  document.addEventListener('visibilitychange', () => document.visibilityState == 'hidden' && tallyCall(4))
}
