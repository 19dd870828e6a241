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
// '' (its run joins the three strings with Array.prototype.join).
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
// added). Absent (null, read as the date "null GMT"), unreadable (NaN) or past (negative): the
// module treats all as 0.
function retryAfterMs(header) {
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
    case Num.Engaged:
      return !document.hidden && document.hasFocus();
    case Num.Scroll:
      return (deepest = x ? 0 : depth());
    case Num.Screen:
      return screen.width;
    case Num.Random:
      return crypto.getRandomValues(new Uint8Array(1))[0];
  }
}

// The largest scroll depth since the module's last reset (a new page view).
let deepest = 0;

// The largest of `deepest` and the share of the document seen now, whole percent rounded down
// (a page that fits the window: 100 or more; the module caps it at 100). While the document is
// still loading its height is not known yet: nothing new is read.
function depth() {
  const seen = document.readyState != 'loading' && ((scrollY + innerHeight) * 100 / document.documentElement?.scrollHeight | 0);
  return seen > deepest ? seen : deepest;
}

// A storage key (area 0 localStorage, 1 sessionStorage; an absent key, or a storage that
// throws, reads as ''), or the page's URL (area 2) or referrer (area 3).
export function load(area, key) {
  try {
    return area > 3 ? JSON.stringify(key) : area > 1 ? (area > 2 ? document.referrer : location.href) : storageArea(area).getItem(key) || '';
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
  callModule(Op.Answer, status, waitMs, id, '', body);
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

// Is the page still at URL `s`: the same URL but for the fragment (what 0) or the same path
// (what 1), compared by the browser's own URL parser? Or (what 2) is `s` an event id whose
// fetch awaits its answer?
export function is(s, what) {
  if (what > 1) return inFlight.has(s);
  try {
    const then = new URL(s);
    return what ? then.pathname == location.pathname : then.href.split('#')[0] == location.href.split('#')[0];
  } catch (e) {
    return false;
  }
}

function wantsCounts(busuanzi) {
  return document.readyState == 'loading' || !!document.querySelector('[data-tally]' + (busuanzi ? ',[id^=busuanzi_]' : ''));
}

// Fills the counters (show): without `site`, from `a`, a tally_wire::HitResponse with counts;
// with it, from the counts of the current page on collector `a`, read (GET /api/v1/counts
// counts nothing).
export function counts(a, site, busuanzi) {
  try {
    site
      ? fetch(a + '/api/v1/counts?site=' + encodeURIComponent(site) + '&page=' + encodeURIComponent(location.pathname), { credentials: 'omit' })
        .then((r) => r.ok && r.json())
        .then((c) => c && show(c, busuanzi), () => {})
      : show(JSON.parse(a).counts, busuanzi);
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

// Reports page hides (Op.Hide), focus and visibility changes (Op.Attention), scrolling (kept in
// `deepest`) and, when `spa`, history changes (Op.Push, Op.Replace, Op.Pop).
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
  document.addEventListener('visibilitychange', () => callModule(document.hidden ? Op.Hide : Op.Attention));
  addEventListener('focus', () => callModule(Op.Attention));
  addEventListener('blur', () => callModule(Op.Attention));
  // A scroll event cannot be cancelled: it needs no `passive`.
  addEventListener('scroll', () => (deepest = depth()));
}
