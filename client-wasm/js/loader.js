// tally.js: Tally's loader (docs/site-owners.md, "The browser snippet"), a classic script.
//
// Build (scripts/assemble-snippet.mjs): full-line comments are stripped, every Op.Name and
// Flag.Name becomes the number src/ops.rs defines for it (the one definition of the codes and
// of what run()'s arguments carry), __GLUE__ / __WASM__ become the content-hashed names of
// the module files, and terser minifies the result into static/tally.js.
//
// Contract:
// - Reads the data-* options of its own <script> tag; makes window.tally(...) (and
//   tally.track(...)) work at once, queueing calls, including those made through a stub
//   (window.tally.q) before this script ran.
// - Skips pages that are not http(s) (file:, ...: the collector counts only http(s) URLs),
//   localhost, *.localhost and [::1] unless data-allow-local, and Do Not Track / Global
//   Privacy Control visitors when data-respect-dnt; otherwise imports the glue and
//   instantiates the .wasm with streaming compilation, both fetched asynchronously, so the
//   page's rendering and load event never wait.
// - Exclude yourself: tally('ignore', true|false) is remembered here, in localStorage
//   ('tally:ignore', read by every later page load of the origin), also on skipped pages and
//   before the module is up; a URL ending in #tally-ignore / #tally-unignore sets / clears it
//   before anything is counted (a link from the dashboard works across origins). The module
//   hears it as Flag.Ignored at the start and as the command later.
// - Run twice, count once: when this script runs again on the same document (pjax themes
//   re-insert the tag after each navigation, NexT without its data-* attributes, Butterfly
//   with them), the second run changes nothing the first one chose (site, collector,
//   options), loads nothing and counts nothing: it asks the running client for
//   tally('refresh'), which fills the in-page counters again for the current URL. Counting a
//   navigation is the history hooks' job (src/client.rs).
// - Nothing here throws into the page: failures end in at most one console message, naming
//   'wasm-unsafe-eval' when the page's Content-Security-Policy forbids WebAssembly.
(function (window, document, location) {
  try {
    const earlier = window.tally;
    if (earlier && earlier.running) {
      earlier('refresh');
      return;
    }
    const script = document.currentScript || document.querySelector('script[data-site]');
    const options = script.dataset;
    const queue = (earlier && earlier.q) || [];
    // The glue module, once the client has started; calls wait in `queue` until then.
    let glue;
    const tally = (window.tally = function () {
      if (arguments[0] == 'ignore') ignore(arguments[1]);
      glue ? command(arguments) : queue.push(arguments);
    });
    function ignore(on) {
      try {
        on ? localStorage.setItem('tally:ignore', 1) : localStorage.removeItem('tally:ignore');
      } catch (e) {}
    }
    // Calls queued by a stub before this script ran are remembered too.
    queue.forEach(function (args) {
      if (args[0] == 'ignore') ignore(args[1]);
    });
    const link = /#tally-(un)?ignore$/.exec(location.href);
    if (link) ignore(!link[1]);
    // tally(kind, value, {dedupe}) as Op.Command. The glue's run makes each string argument
    // text as Array.prototype.join does: null and undefined become '', anything else String(x).
    function command(args) {
      const value = args[1];
      try {
        glue.run(Op.Command, value ? 1 : 0, 0, args[0], value, args[2] && args[2].dedupe);
      } catch (e) {}
    }
    tally.q = queue;
    tally.running = 1;
    tally.track = function (name, extra) {
      tally('event', name, extra);
    };

    const local = /(^|\.)localhost$|^\[::1\]$/.test(location.hostname) && !('allowLocal' in options);
    const doNotTrack = 'respectDnt' in options && (navigator.doNotTrack == '1' || navigator.globalPrivacyControl);
    if (!/^https?:$/.test(location.protocol) || local || doNotTrack) return;

    const src = script.src;
    const storage = options.storage;
    import(new URL('__GLUE__', src)).then(function (module) {
      return module.default(new URL('__WASM__', src)).then(function () {
        let ignored;
        try {
          ignored = localStorage.getItem('tally:ignore');
        } catch (e) {}
        const flags = (storage == 'none') * Flag.NoStorage | (storage == 'consent') * Flag.Consent |
          ('busuanzi' in options) * Flag.Busuanzi | (options.auto == 'false') * Flag.Manual |
          (options.spa == 'false') * Flag.NoSpa | !!ignored * Flag.Ignored;
        module.run(Op.Start, flags, 0, options.site || location.hostname,
          (options.api || new URL(src).origin).replace(/\/+$/, ''));
        glue = module;
        queue.splice(0).forEach(command);
      });
    }).catch(function (e) {
      console.warn('tally: ' + (/eval|CompileError/.test(e)
        ? "this page's Content-Security-Policy blocks WebAssembly: add 'wasm-unsafe-eval' to script-src"
        : e));
    });
  } catch (e) {}
})(window, document, location);
