// tally.js: Tally's loader (README.md, "The browser snippet"). Full-line comments are stripped at build time,
// and __GLUE__ / __WASM__ become the content-hashed names of the module files.
//
// Contract: reads the data-* options of its own <script> tag; makes window.tally(...) (and
// tally.track(...)) work at once, queueing calls, including those made through a stub
// (window.tally.q) before this script ran; skips pages that are not http(s) (file:, ...:
// the collector counts only http(s) URLs), localhost, *.localhost and [::1] unless
// data-allow-local, and Do Not Track / Global Privacy Control visitors when
// data-respect-dnt; then imports the glue and instantiates the .wasm with streaming
// compilation, both fetched asynchronously, so the page's rendering and load event never wait.
// Nothing here throws into the page: failures end in at most one console message, naming
// 'wasm-unsafe-eval' when the page's Content-Security-Policy forbids WebAssembly.
(function (w, d, l) {
  try {
    var s = d.currentScript || d.querySelector('script[data-site]'), o = s.dataset, p = w.tally,
      q = (p && p.q) || [], m, n = navigator,
      t = w.tally = function () { m ? r(arguments) : q.push(arguments) };
    function r(a) {
      try { m.run(1, 0, 0, a[0] + '', a[1] == null ? '' : a[1] + '', a[2] && a[2].dedupe != null ? a[2].dedupe + '' : '') } catch (e) {}
    }
    t.q = q;
    t.track = function (e, x) { t('event', e, x) };
    if (!/^https?:$/.test(l.protocol) || !('allowLocal' in o) && /(^|\.)localhost$|^\[::1\]$/.test(l.hostname) ||
      'respectDnt' in o && (n.doNotTrack == '1' || n.globalPrivacyControl)) return;
    var b = s.src;
    import(new URL('__GLUE__', b)).then(function (g) {
      return g.default({ module_or_path: new URL('__WASM__', b) }).then(function () {
        g.run(0, (o.storage == 'none') | ('busuanzi' in o) << 1 | (o.auto == 'false') << 2 | (o.spa == 'false') << 3,
          0, o.site || l.hostname, (o.api || new URL(b).origin).replace(/\/+$/, ''), '');
        m = g;
        q.splice(0).forEach(r)
      })
    }).catch(function (e) {
      console.warn('tally: ' + (/eval|CompileError/.test(e) ? "this page's Content-Security-Policy blocks WebAssembly: add 'wasm-unsafe-eval' to script-src" : e))
    })
  } catch (e) {}
})(window, document, location)
