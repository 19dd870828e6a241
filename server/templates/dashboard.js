// Tally dashboard: keeps "Live now" current. Served as /dashboard.js (no inline script, so a
// strict Content-Security-Policy can forbid inline code). Without it the page is complete.
(function () {
  var card = document.getElementById("card-live");
  if (!card || !window.fetch) return;
  var site = card.getAttribute("data-site");
  function fmt(n) { return Number(n).toLocaleString("en-US"); }
  function tick() {
    fetch("/api/v1/counts?site=" + encodeURIComponent(site), { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (c) {
        if (!c) return;
        card.querySelector('[data-field="visitors"]').textContent = fmt(c.live.visitors);
        card.querySelector('[data-field="views"]').textContent = fmt(c.live.events);
      })
      .catch(function () {});
  }
  setInterval(tick, 10000);
})();
