// Tally host functions: the only place the WebAssembly client touches browser APIs.
//
// Contract: each exported function is imported by src/web.rs (its extern block). The build
// (scripts/assemble-snippet.mjs) inlines this file into the wasm-bindgen glue in place of its
// import, so `run` below is the glue's own export; it replaces every Op.Name and Num.Name with
// the number src/ops.rs defines (where each operation and its arguments are written down
// once), strips full-line comments and minifies. Nothing here throws: storage errors become
// ''/false, a failed fetch becomes an answer with status 0, and every call back into the
// module is wrapped so a fault there cannot reach the page.

// Calls the module. Arguments an operation does not use may be left out: the glue passes a
// missing number as NaN (0 in an integer parameter, read as 0 in `w`) and a missing string as
// '' (TextEncoder.encode's default).
function callModule(op, s, w, a, b, c) {
  try {
    run(op, s, w, a, b, c);
  } catch (e) {}
}

function storageArea(session) {
  return session ? sessionStorage : localStorage;
}

// Retry-After as a wait in ms: delay-seconds, or an HTTP-date in any of its three forms
// (Date.parse reads IMF-fixdate, RFC 850 and asctime; asctime carries no zone, so GMT is
// added). Absent, unreadable (NaN) or past (negative): the module treats all as 0.
function retryAfterMs(header) {
  if (header == null) return 0;
  if (/^\s*\d+\s*$/.test(header)) return header * 1e3;
  return Date.parse(/gmt/i.test(header) ? header : header + ' GMT') - Date.now();
}

// The module's questions that take and give a number (src/ops.rs, Num).
export function num(op, x) {
  switch (op) {
    case Num.Now:
      return Date.now();
    case Num.Later:
      setTimeout(() => callModule(Op.Tick), x);
      return 0;
    case Num.Want:
      return wantsCounts(x);
    case Num.Listen:
      listen(x);
      return 0;
  }
}

export function rand(bytes) {
  crypto.getRandomValues(bytes);
}

// An absent key (or a storage that throws) reads as ''.
export function load(session, key) {
  try {
    return storageArea(session).getItem(key) || '';
  } catch (e) {
    return '';
  }
}

// An empty value removes the key.
export function save(session, key, value) {
  try {
    if (value) storageArea(session).setItem(key, value);
    else storageArea(session).removeItem(key);
    return true;
  } catch (e) {
    return false;
  }
}

// Event ids whose fetch awaits its answer; an answer leaves the set before the module hears it.
const inFlight = new Set();

function answered(id, status, waitMs, body) {
  inFlight.delete(id);
  callModule(Op.Answer, status, waitMs, body, id);
}

export function busy(id) {
  return inFlight.has(id);
}

// A hit to collector `api` (with &counts=1 when `counts`), every URL with a fresh t= cache
// buster. With event id `id`: fetch with a text/plain body (no CORS preflight), keepalive so it
// survives navigation, no cookies; the answer is read, so 429/503 + Retry-After and the
// counters reach the module (Op.Answer, naming the id). Without an id: sendBeacon (the page is
// hiding: no answer wanted), and the result says whether the browser took it.
export function send(api, counts, body, id) {
  const url = api + '/api/v1/hit?t=' + Date.now() + (counts ? '&counts=1' : '');
  try {
    if (!id) return navigator.sendBeacon(url, body);
    inFlight.add(id);
    fetch(url, { method: 'POST', body, keepalive: true, credentials: 'omit' }).then(
      (r) => r.text().then((text) => answered(id, r.status, retryAfterMs(r.headers.get('Retry-After')), text)),
      () => answered(id, 0),
    );
  } catch (e) {
    // No fetch, or its keepalive quota is used up: hand it to a beacon, outcome unknown (1).
    if (id) {
      const taken = send(api, 0, body);
      setTimeout(() => answered(id, taken ? 1 : 0));
    }
  }
  return false;
}

export function page(referrer) {
  return referrer ? document.referrer : location.href;
}

// Is the page still at URL `url`: the same path (pathOnly), or the same URL but for the
// fragment? Compared by the browser's own URL parser.
export function same(url, pathOnly) {
  try {
    const then = new URL(url);
    return pathOnly ? then.pathname == location.pathname : then.href.split('#')[0] == location.href.split('#')[0];
  } catch (e) {
    return false;
  }
}

function wantsCounts(busuanzi) {
  return document.readyState == 'loading' || !!document.querySelector('[data-tally]' + (busuanzi ? ',[id^=busuanzi_]' : ''));
}

// `answer` is a tally_wire::HitResponse; its counts fill the counters (show).
export function fill(answer, busuanzi) {
  try {
    show(JSON.parse(answer).counts, busuanzi);
  } catch (e) {}
}

// The counts of the current page, read (GET /api/v1/counts counts nothing), then shown.
export function peek(api, site, busuanzi) {
  try {
    fetch(api + '/api/v1/counts?site=' + encodeURIComponent(site) + '&page=' + encodeURIComponent(location.pathname), { credentials: 'omit' })
      .then((r) => r.ok && r.json())
      .then((counts) => counts && show(counts, busuanzi), () => {});
  } catch (e) {}
}

// Fills [data-tally=...] elements and, with data-busuanzi, the classic busuanzi ids (showing
// their hidden containers), once the document is parsed. `counts` is a tally_wire::Counts.
function show(counts, busuanzi) {
  const put = () => [
    ['site.views', 'site_pv', counts.site.views],
    ['site.visitors', 'site_uv', counts.site.visitors],
    ['page.views', 'page_pv', counts.page.views],
    ['page.visitors', 'page_uv', counts.page.visitors],
    ['live', 0, counts.live.visitors],
  ].forEach(([name, id, value]) => {
    document.querySelectorAll('[data-tally="' + name + '"]').forEach((e) => (e.textContent = value));
    let e = busuanzi && id && document.getElementById('busuanzi_value_' + id);
    if (e) e.textContent = value;
    e = busuanzi && id && document.getElementById('busuanzi_container_' + id);
    if (e) e.style.display = 'inline';
  });
  if (counts) document.readyState == 'loading' ? document.addEventListener('DOMContentLoaded', put) : put();
}

// Reports page hides (Op.Hide) and, when `spa`, history changes (Op.Push, Op.Replace, Op.Pop).
function listen(spa) {
  if (spa) {
    [['pushState', Op.Push], ['replaceState', Op.Replace]].forEach(([method, op]) => {
      const original = history[method];
      history[method] = function () {
        const result = original.apply(this, arguments);
        callModule(op);
        return result;
      };
    });
    addEventListener('popstate', () => callModule(Op.Pop));
  }
  addEventListener('pagehide', () => callModule(Op.Hide));
  document.addEventListener('visibilitychange', () => document.visibilityState == 'hidden' && callModule(Op.Hide));
}
