// Live countdowns to interruption-notice deadlines, and relative times that keep up with the
// clock. Every element with data-deadline (an ISO-8601 time) shows the time left as "1:54 left",
// turns urgent in the last 30 seconds and reads "stopping…" once the deadline has passed. Every
// element with data-since (templates/components/ago.html) reads like Django's naturaltime, "3
// minutes ago", or with data-age like its timesince, "3 minutes". Both count in the browser, so
// the server is not asked every second; elements swapped in by HTMX are picked up on the next
// tick, and at once after a swap.
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

  var NBSP = "\u00a0";
  var UNITS = [
    [365 * 86400, "year"], [30 * 86400, "month"], [7 * 86400, "week"],
    [86400, "day"], [3600, "hour"], [60, "minute"]
  ];

  function count(n, unit) {
    return n + NBSP + unit + (n === 1 ? "" : "s");
  }

  function timesince(seconds) {
    // Like Django's timesince: the largest unit, and the next one when it is not zero.
    for (var i = 0; i < UNITS.length; i++) {
      var n = Math.floor(seconds / UNITS[i][0]);
      if (n > 0) {
        var text = count(n, UNITS[i][1]);
        if (i + 1 < UNITS.length) {
          var m = Math.floor((seconds - n * UNITS[i][0]) / UNITS[i + 1][0]);
          if (m > 0) text += ", " + count(m, UNITS[i + 1][1]);
        }
        return text;
      }
    }
    return count(0, "minute");
  }

  function naturaltime(seconds) {
    if (seconds < 1) return "now";
    if (seconds < 60) return seconds === 1 ? "a second ago" : seconds + NBSP + "seconds ago";
    if (seconds < 3600) {
      var minutes = Math.floor(seconds / 60);
      return minutes === 1 ? "a minute ago" : minutes + NBSP + "minutes ago";
    }
    if (seconds < 86400) {
      var hours = Math.floor(seconds / 3600);
      return hours === 1 ? "an hour ago" : hours + NBSP + "hours ago";
    }
    return timesince(seconds) + " ago";
  }

  function since(element, now) {
    var moment = parse(element.getAttribute("data-since"));
    if (isNaN(moment)) return;
    var seconds = Math.max(0, Math.floor((now - moment) / 1000));
    var text = element.hasAttribute("data-age") ? timesince(seconds) : naturaltime(seconds);
    if (element.textContent !== text) element.textContent = text;
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (element) {
      render(element, now);
    });
    document.querySelectorAll("[data-since]").forEach(function (element) {
      since(element, now);
    });
  }

  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:afterSettle", tick);
  setInterval(tick, 1000);
})();
