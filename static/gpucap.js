// What every page does in the browser besides htmx and the countdowns (countdown.js). It lives
// here, not inline in the templates, so the Content-Security-Policy allows scripts from this site
// alone: no inline script, no inline event handler, no eval (htmx runs with allowEval off, so no
// hx-on attributes either).
(function () {
  "use strict";

  // An answer htmx does not swap (a 5xx, a 403 or 404 from a page gone stale) must not pass in
  // silence: say so at the top of the page, which stays as it was.
  document.addEventListener("htmx:responseError", function (event) {
    var status = event.detail.xhr.status;
    var alert = document.getElementById("htmx-error") || document.createElement("div");
    alert.id = "htmx-error";
    alert.className = "alert alert-error";
    alert.setAttribute("role", "alert");
    alert.textContent = status >= 500
      ? "The server failed to answer (" + status + "); nothing on this page was changed. Try again, or reload."
      : "That was refused (" + status + "); reload the page to see where things stand.";
    var main = document.querySelector("main");
    if (main) main.prepend(alert);
  });

  // Filters leave out what is not set, so a pushed URL reads ?state=cordoned, not ?cluster=&...
  document.addEventListener("htmx:configRequest", function (event) {
    if (event.detail.verb !== "get") return;
    for (const [name, value] of Array.from(event.detail.formData.entries())) {
      if (value === "") event.detail.formData.delete(name);
    }
  });

  // A filter form's errors (templates/components/filter_form.html) last until its next request.
  document.addEventListener("htmx:beforeRequest", function (event) {
    var form = event.detail.elt;
    if (!form.matches || !form.matches("form.filters")) return;
    form.querySelectorAll(".field-error").forEach(function (error) { error.remove(); });
  });

  // A field with data-clears="a b" empties the fields a and b of its form when it changes (the
  // usage period: a month clears the days, a day the month).
  document.addEventListener("change", function (event) {
    var field = event.target;
    if (!field.dataset || !field.dataset.clears || !field.form) return;
    field.dataset.clears.split(" ").forEach(function (name) {
      var other = field.form.elements.namedItem(name);
      if (other) other.value = "";
    });
  });

  document.addEventListener("click", function (event) {
    // The menu button of a narrow screen opens and closes the menu.
    var toggle = event.target.closest(".menu-toggle");
    if (toggle) {
      var open = toggle.closest(".topbar").classList.toggle("topbar-open");
      toggle.setAttribute("aria-expanded", open);
      return;
    }
    // Copy buttons: the text of the element a button's data-copy names goes to the clipboard.
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.dataset.copy);
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.textContent).then(function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    });
  });
})();
