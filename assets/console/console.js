// keel console: refreshes the parts of a page marked data-refresh every data-every seconds,
// fetching only that part (X-Console-Partial). Pages work without it.
(function () {
  "use strict";
  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    var every = Math.max(1, parseInt(el.getAttribute("data-every") || "5", 10)) * 1000;
    // Replacing the region would take the keyboard's focus (a Stop button tabbed to) with it:
    // while anything in it has focus, it waits.
    function focusedInside() {
      var active = document.activeElement;
      return active !== null && active !== document.body && el.contains(active);
    }
    function tick() {
      if (document.hidden || focusedInside()) {
        return setTimeout(tick, every);
      }
      fetch(url, { credentials: "same-origin", headers: { "X-Console-Partial": "1" } })
        .then(function (response) {
          if (response.redirected || !response.ok) {
            window.location.reload();
            return null;
          }
          return response.text();
        })
        .then(function (html) {
          if (html !== null) {
            if (!focusedInside()) {
              el.innerHTML = html;
            }
            setTimeout(tick, every);
          }
        })
        .catch(function () { setTimeout(tick, every * 2); });
    }
    setTimeout(tick, every);
  }
  // A checkbox that selects (or clears) every box of its form named by data-select-all.
  function selectAll(box) {
    box.addEventListener("change", function () {
      var name = box.getAttribute("data-select-all");
      box.form.querySelectorAll("input[type=checkbox][name='" + name + "']").forEach(function (other) {
        other.checked = box.checked;
      });
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("[data-select-all]").forEach(selectAll);
  });
})();
