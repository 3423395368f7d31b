// keel console: refreshes the parts of a page marked data-refresh every data-every seconds,
// fetching only that part (X-Console-Partial); ticks the boxes that pick every box of a name;
// copies a secret shown once. Pages work without it.
(function () {
  "use strict";
  // The boxes of `name` that belong to `form` (inside it, or tied to it by form="...").
  function boxesOf(form, name) {
    return Array.prototype.filter.call(form.elements, function (el) {
      return el.type === "checkbox" && el.name === name;
    });
  }
  function refresh(el) {
    var url = el.getAttribute("data-refresh");
    var every = Math.max(1, parseInt(el.getAttribute("data-every") || "5", 10)) * 1000;
    // Replacing the region would take the keyboard's focus (a Stop button tabbed to) with it:
    // while anything in it has focus, it waits.
    function focusedInside() {
      var active = document.activeElement;
      return active !== null && active !== document.body && el.contains(active);
    }
    // What the reader ticked in the region: ticked again in what replaces it.
    function ticked() {
      var kept = {};
      el.querySelectorAll("input[type=checkbox]").forEach(function (box) {
        if (box.checked) {
          kept[box.name + "\u0000" + box.value] = true;
        }
      });
      return kept;
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
              var kept = ticked();
              el.innerHTML = html;
              el.querySelectorAll("input[type=checkbox]").forEach(function (box) {
                if (kept[box.name + "\u0000" + box.value]) {
                  box.checked = true;
                }
              });
              el.querySelectorAll("[data-select-all]").forEach(selectAll);
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
      boxesOf(box.form, box.getAttribute("data-select-all")).forEach(function (other) {
        other.checked = box.checked;
      });
    });
  }
  // A button that copies the text of the element data-copy names, and says so.
  function copier(button) {
    button.hidden = false;
    button.addEventListener("click", function () {
      var source = document.getElementById(button.getAttribute("data-copy"));
      if (source === null) {
        return;
      }
      var text = source.value !== undefined ? source.value : source.textContent;
      var said = document.getElementById(button.getAttribute("data-copy") + "-copied");
      function done(ok) {
        if (said !== null) {
          said.textContent = ok ? "Copied." : "Select it and copy it by hand.";
        }
      }
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(fallback()); });
      } else {
        done(fallback());
      }
      function fallback() {
        var area = document.createElement("textarea");
        area.value = text;
        area.setAttribute("readonly", "");
        area.style.position = "fixed";
        area.style.opacity = "0";
        document.body.appendChild(area);
        area.select();
        var ok = false;
        try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
        document.body.removeChild(area);
        return ok;
      }
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(refresh);
    document.querySelectorAll("[data-select-all]").forEach(selectAll);
    document.querySelectorAll("button[data-copy]").forEach(copier);
  });
})();
