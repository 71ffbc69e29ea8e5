/* udpo report: browse the debates embedded in this page (no network, no libraries).
   Model text is only ever written with textContent. Debates render a page at a time and a
   debate's grid and texts only when it is opened. */
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("udpo-data").textContent);
  var SETS = DATA.sets;
  var PAGE = 50;
  var STATES = { g: "gold", w: "wrong", n: "none" };
  var U = { u_intra: 0, u_inter: 1, u_sys: 2 };

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function show(a) { return a === null || a === undefined ? "None" : a; }
  function num(x) { return x === null || x === undefined ? "–" : Number(x).toFixed(3); }
  function oneLine(s, n) {
    s = String(s).replace(/\s+/g, " ").trim();
    return s.length > n ? s.slice(0, n) + "…" : s;
  }
  function press(buttons, on) {
    buttons.forEach(function (b) { b.setAttribute("aria-pressed", b === on ? "true" : "false"); });
  }

  /* ---- one debate ---- */

  function grid(d, onCell) {
    var table = el("table", "grid");
    var head = table.createTHead().insertRow();
    head.appendChild(el("th", "corner", "agent \\ round"));
    var rounds = d.a[0].length;
    for (var t = 0; t < rounds; t++) head.appendChild(el("th", "", t === 0 ? "0 (initial)" : String(t)));
    var body = table.createTBody();
    var compromised = d.m || [];
    d.a.forEach(function (row, i) {
      var tr = body.insertRow();
      var bad = compromised.indexOf(i) >= 0;
      var th = el("th", bad ? "agent compromised" : "agent", "agent " + i);
      if (bad) {
        th.appendChild(el("span", "tag", "compromised"));
        th.title = "compromised by the attack";
      }
      tr.appendChild(th);
      row.forEach(function (a, t) {
        var s = d.s[i][t];
        var cut = s !== s.toLowerCase();
        var td = el("td", "cell " + STATES[s.toLowerCase()] + (cut ? " cut" : ""), show(a));
        td.setAttribute("data-agent", i);
        td.setAttribute("data-round", t);
        td.title = "agent " + i + ", round " + t + ": " + show(a) +
          (s.toLowerCase() === "g" ? " (gold)" : s.toLowerCase() === "n" ? " (unparsed)" : "") +
          (cut ? ", cut at the token limit" : "");
        if (onCell) {
          td.tabIndex = 0;
          td.addEventListener("click", function () { onCell(i, t, td); });
          td.addEventListener("keydown", function (e) { if (e.key === "Enter") onCell(i, t, td); });
        }
        tr.appendChild(td);
      });
    });
    var cap = table.createCaption();
    cap.textContent = "gold " + show(d.g) + " · prediction " + show(d.p) + (d.c ? " (correct)" : " (wrong)");
    return table;
  }

  function turnView(d, i, t) {
    var box = el("div", "turn-text");
    var s = d.s[i][t];
    box.appendChild(el("h4", "", "agent " + i + ", round " + t + " · answer " + show(d.a[i][t]) +
      (s !== s.toLowerCase() ? " · cut at the token limit" : "")));
    var text = d.x[i][t];
    box.appendChild(el("pre", "text", text === null ? "(no turn recorded)" : text));
    var read = d.r && d.r[i + "," + t];
    if (read) {
      box.appendChild(el("p", "reads", "read: " + (read.length ? read.map(function (m) {
        return "agent " + m[0] + " (round " + m[1] + ")";
      }).join(", ") : "nobody")));
    }
    var details = d.d && d.d[i + "," + t];
    if (details) box.appendChild(el("pre", "details", "protocol: " + details));
    return box;
  }

  function debateBody(d, label) {
    var box = el("div", "body");
    if (label) box.appendChild(el("h4", "side", label));
    box.appendChild(el("div", "question", d.q));
    var facts = "id " + d.id + " · U_intra " + num(d.u[0]) + " · U_inter " + num(d.u[1]) + " · U_sys " + num(d.u[2]);
    if (d.meta) Object.keys(d.meta).forEach(function (k) { facts += " · " + k + " " + d.meta[k]; });
    if (d.m) facts += " · compromised agents " + d.m.join(", ");
    box.appendChild(el("p", "facts", facts));
    var panel = el("div", "turn");
    var table;
    var onCell = d.x ? function (i, t, td) {
      table.querySelectorAll("td.sel").forEach(function (c) { c.classList.remove("sel"); });
      td.classList.add("sel");
      panel.replaceChildren(turnView(d, i, t));
    } : null;
    table = grid(d, onCell);
    box.appendChild(table);
    panel.appendChild(el("p", "hint", d.x ? "Click a cell to read that turn." : "No turn texts in this file."));
    box.appendChild(panel);
    if (d.x) {
      var all = el("details", "all-turns");
      all.appendChild(el("summary", "", "every turn's text"));
      all.addEventListener("toggle", function () {
        if (!all.open || all.getAttribute("data-built")) return;
        all.setAttribute("data-built", "1");
        for (var t = 0; t < d.a[0].length; t++) {
          for (var i = 0; i < d.a.length; i++) all.appendChild(turnView(d, i, t));
        }
      });
      box.appendChild(all);
    }
    return box;
  }

  function lazy(details, build) {
    details.addEventListener("toggle", function () {
      if (!details.open || details.getAttribute("data-built")) return;
      details.setAttribute("data-built", "1");
      details.appendChild(build());
    });
  }

  function debateItem(d) {
    var item = el("details", "debate " + (d.c ? "is-correct" : "is-wrong"));
    item.setAttribute("data-qid", d.id);
    var sum = el("summary");
    sum.appendChild(el("span", d.c ? "badge ok" : "badge bad", d.c ? "correct" : "wrong"));
    sum.appendChild(el("span", "qid", d.id));
    sum.appendChild(el("span", "qtext", oneLine(d.q, 140)));
    sum.appendChild(el("span", "ans", "gold " + show(d.g) + " · pred " + show(d.p)));
    sum.appendChild(el("span", "unc", "U_sys " + num(d.u[2])));
    if (d.m) sum.appendChild(el("span", "tag", "attacked"));
    item.appendChild(sum);
    lazy(item, function () { return debateBody(d); });
    return item;
  }

  function fillSelect(select, value) {
    SETS.forEach(function (s, k) {
      var o = el("option", "", s.name + " (" + s.debates.length + ")");
      o.value = String(k);
      select.appendChild(o);
    });
    select.value = String(value);
  }

  function pager(prev, next, label, page, total) {
    var pages = Math.max(1, Math.ceil(total / PAGE));
    label.textContent = "page " + (page + 1) + " of " + pages;
    prev.disabled = page <= 0;
    next.disabled = page >= pages - 1;
  }

  /* ---- browsing one set ---- */

  if (!SETS.length) {
    $("browse").replaceChildren(el("h2", "", "Debates"), el("p", "count", "This run holds no debates yet."));
    window.__udpoReady = performance.now();
    document.body.setAttribute("data-ready", "1");
    return;
  }

  var browse = { set: DATA.browse, filter: "all", sort: "order", query: "", page: 0, view: [] };
  var haystacks = {};

  function haystack(k) {
    if (!haystacks[k]) haystacks[k] = SETS[k].debates.map(function (d) { return (d.id + "\n" + d.q).toLowerCase(); });
    return haystacks[k];
  }

  function computeView() {
    var debates = SETS[browse.set].debates;
    var q = browse.query.trim().toLowerCase();
    var hay = q ? haystack(browse.set) : null;
    var view = [];
    for (var k = 0; k < debates.length; k++) {
      var d = debates[k];
      if (browse.filter === "correct" && !d.c) continue;
      if (browse.filter === "wrong" && d.c) continue;
      if (q && hay[k].indexOf(q) < 0) continue;
      view.push(k);
    }
    if (browse.sort in U) {
      var j = U[browse.sort];
      var key = function (k) { var v = debates[k].u[j]; return v === null ? -1 : v; };
      view.sort(function (a, b) { return key(b) - key(a) || a - b; });
    }
    browse.view = view;
  }

  function renderBrowse() {
    var set = SETS[browse.set];
    var view = browse.view;
    var start = browse.page * PAGE;
    var items = view.slice(start, start + PAGE).map(function (k) { return debateItem(set.debates[k]); });
    $("debates").replaceChildren.apply($("debates"), items);
    $("count").textContent = view.length + " of " + set.debates.length + " debates" +
      (view.length ? " · showing " + (start + 1) + "–" + (start + items.length) : "");
    var meta = Object.keys(set.meta).map(function (k) { return k + " " + set.meta[k]; }).join(" · ");
    $("set-meta").textContent = meta;
    pager($("prev"), $("next"), $("page"), browse.page, view.length);
  }

  function refresh() { browse.page = 0; computeView(); renderBrowse(); }

  fillSelect($("set"), browse.set);
  $("set").addEventListener("change", function () { browse.set = Number(this.value); refresh(); });
  var filters = [$("filter-all"), $("filter-correct"), $("filter-wrong")];
  filters.forEach(function (b) {
    b.addEventListener("click", function () {
      browse.filter = b.id.replace("filter-", "");
      press(filters, b);
      refresh();
    });
  });
  $("sort").addEventListener("change", function () { browse.sort = this.value; refresh(); });
  var timer = null;
  $("search").addEventListener("input", function () {
    var input = this;
    clearTimeout(timer);
    timer = setTimeout(function () { browse.query = input.value; refresh(); }, 150);
  });
  $("prev").addEventListener("click", function () { browse.page--; renderBrowse(); });
  $("next").addEventListener("click", function () { browse.page++; renderBrowse(); });

  /* ---- two sets side by side ---- */

  var cmp = DATA.compare ? { a: DATA.compare[0], b: DATA.compare[1], only: false, page: 0, pairs: [] } : null;

  function computePairs() {
    var A = SETS[cmp.a].debates, B = SETS[cmp.b].debates;
    var byId = {};
    B.forEach(function (d, k) { (byId[d.id] = byId[d.id] || []).push(k); });
    var changed = [], same = [], matched = 0, onlyA = 0, up = 0, down = 0, accA = 0, accB = 0;
    A.forEach(function (d, k) {
      var queue = byId[d.id];
      if (!queue || !queue.length) { onlyA++; return; }
      var e = B[queue.shift()];
      matched++;
      accA += d.c ? 1 : 0;
      accB += e.c ? 1 : 0;
      if (d.c !== e.c) {
        changed.push([d, e]);
        if (e.c) up++; else down++;
      } else {
        same.push([d, e]);
      }
    });
    var onlyB = 0;
    Object.keys(byId).forEach(function (id) { onlyB += byId[id].length; });
    cmp.pairs = cmp.only ? changed : changed.concat(same);
    var text = matched + " questions in both sets";
    if (matched) {
      text += " · accuracy " + num(accA / matched) + " → " + num(accB / matched) + " · " + up +
        " improved (wrong → correct) · " + down + " regressed (correct → wrong) · " + (matched - up - down) + " unchanged";
    }
    if (onlyA || onlyB) text += " · only in A: " + onlyA + ", only in B: " + onlyB;
    $("cmp-summary").textContent = text;
  }

  function side(tag, name) { return name.indexOf(tag + " · ") === 0 ? name : tag + " · " + name; }

  function pairItem(pair) {
    var d = pair[0], e = pair[1];
    var change = d.c === e.c ? "same" : e.c ? "improved" : "regressed";
    var item = el("details", "debate pair " + change);
    item.setAttribute("data-qid", d.id);
    var sum = el("summary");
    sum.appendChild(el("span", "badge " + change, change));
    sum.appendChild(el("span", "qid", d.id));
    sum.appendChild(el("span", "qtext", oneLine(d.q, 110)));
    sum.appendChild(el("span", "ans", "A " + show(d.p) + (d.c ? " ✓" : " ✗") + " · B " + show(e.p) + (e.c ? " ✓" : " ✗")));
    sum.appendChild(el("span", "unc", "U_sys " + num(d.u[2]) + " → " + num(e.u[2])));
    item.appendChild(sum);
    lazy(item, function () {
      var both = el("div", "side-by-side");
      both.appendChild(debateBody(d, side("A", SETS[cmp.a].name)));
      both.appendChild(debateBody(e, side("B", SETS[cmp.b].name)));
      return both;
    });
    return item;
  }

  function renderPairs() {
    var start = cmp.page * PAGE;
    var items = cmp.pairs.slice(start, start + PAGE).map(pairItem);
    $("cmp-list").replaceChildren.apply($("cmp-list"), items);
    pager($("cmp-prev"), $("cmp-next"), $("cmp-page"), cmp.page, cmp.pairs.length);
  }

  function refreshPairs() { cmp.page = 0; computePairs(); renderPairs(); }

  if (cmp) {
    $("compare").hidden = false;
    $("nav-compare").hidden = false;
    fillSelect($("cmp-a"), cmp.a);
    fillSelect($("cmp-b"), cmp.b);
    $("cmp-a").addEventListener("change", function () { cmp.a = Number(this.value); refreshPairs(); });
    $("cmp-b").addEventListener("change", function () { cmp.b = Number(this.value); refreshPairs(); });
    var modes = [$("cmp-changed-first"), $("cmp-changed-only")];
    modes.forEach(function (b) {
      b.addEventListener("click", function () {
        cmp.only = b.id === "cmp-changed-only";
        press(modes, b);
        refreshPairs();
      });
    });
    $("cmp-prev").addEventListener("click", function () { cmp.page--; renderPairs(); });
    $("cmp-next").addEventListener("click", function () { cmp.page++; renderPairs(); });
    refreshPairs();
  }

  refresh();
  window.__udpoReady = performance.now();
  document.body.setAttribute("data-ready", "1");
})();
