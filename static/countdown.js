// Live countdowns to interruption-notice deadlines. Every element with data-deadline (an
// ISO-8601 time) shows the time left as "1:54 left", turns urgent in the last 30 seconds and
// reads "stopping…" once the deadline has passed. It counts from the deadline in the browser,
// so the server is not asked every second; elements swapped in by HTMX are picked up on the
// next tick, and at once after a swap.
(function () {
  "use strict";
  var URGENT_SECONDS = 30;

  function parse(iso) {
    // Browsers agree on milliseconds; the server may send microseconds.
    return Date.parse(iso.replace(/(\.\d{3})\d+/, "$1"));
  }

  function render(element, now) {
    var deadline = parse(element.getAttribute("data-deadline"));
    if (isNaN(deadline)) return;
    var left = Math.ceil((deadline - now) / 1000);
    var text;
    if (left > 0) {
      var hours = Math.floor(left / 3600);
      var minutes = Math.floor((left % 3600) / 60);
      var seconds = String(left % 60).padStart(2, "0");
      text = (hours ? hours + ":" + String(minutes).padStart(2, "0") : minutes) + ":" + seconds + " left";
    } else {
      text = "stopping…";
    }
    if (element.textContent !== text) element.textContent = text;
    element.classList.toggle("countdown-urgent", left > 0 && left <= URGENT_SECONDS);
    element.classList.toggle("countdown-due", left <= 0);
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (element) {
      render(element, now);
    });
  }

  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:afterSettle", tick);
  setInterval(tick, 1000);
})();
