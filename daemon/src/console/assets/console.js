// qd console: keeps the overview table current. Server-sent events first; if the
// stream fails repeatedly (a proxy that buffers, too many streams open), polling.
// The HTML comes from the console itself, escaped on the server.
(function () {
  "use strict";
  var el = document.getElementById("live");
  if (!el) { return; }
  var stream = el.getAttribute("data-stream");
  var poll = el.getAttribute("data-poll");
  var polling = false;
  function startPolling() {
    if (polling) { return; }
    polling = true;
    el.setAttribute("data-mode", "polling");
    setInterval(function () {
      fetch(poll, { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) { el.innerHTML = html; } })
        .catch(function () {});
    }, 3000);
  }
  if (!window.EventSource) { startPolling(); return; }
  var failures = 0;
  var source = new EventSource(stream);
  source.addEventListener("overview", function (e) {
    failures = 0;
    el.setAttribute("data-mode", "events");
    el.innerHTML = e.data;
  });
  source.onerror = function () {
    failures += 1;
    if (failures >= 3) { source.close(); startPolling(); }
  };
})();
