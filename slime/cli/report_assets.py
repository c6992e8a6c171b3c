"""The report page's stylesheet and script, inlined into every report (no file beside it, no network).

The script is plain ES2017 with no library: the x-axis switch of the curves and the rollout viewer
(filter, sort, page and inspect the samples embedded as JSON chunks; see slime.cli.report_html).
Kept as Python strings so that the package ships them without package-data rules.
"""

from __future__ import annotations

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#20232a;color:#fff;padding:12px 24px}header h1{margin:0;font-size:20px}
header .sub{color:#bbb;font-size:12px}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:6px 24px;z-index:5}
nav a{margin-right:14px;color:#0b5cad;text-decoration:none;font-size:13px}
main{padding:8px 24px 48px}section{margin-top:22px}h2{border-bottom:1px solid #ddd;padding-bottom:4px}
h3{margin:14px 0 6px;font-size:15px}
table{border-collapse:collapse;background:#fff;font-size:12.5px;margin:4px 0}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f0f0f2}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #ddd;padding:8px;overflow:auto;max-height:420px;font-size:12px;margin:4px 0}
.swatch{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.charts{display:flex;flex-wrap:wrap;gap:8px}.chart{background:#fff;border:1px solid #e3e3e3;border-radius:4px}
.chart svg{display:block;width:403px;height:auto}.timeline svg{max-width:100%;height:auto}
.muted{color:#777}.bad{color:#b00020}.ok{color:#1b7f3b}.note{font-size:12.5px;color:#555}
.changed{background:#fff4d6}
.rv-controls{display:flex;flex-wrap:wrap;gap:10px;align-items:end;background:#fff;border:1px solid #ddd;padding:8px}
.rv-controls label{display:flex;flex-direction:column;font-size:11px;color:#555}
.rv-controls input{width:78px}.rv-table tr{cursor:pointer}.rv-table tr:hover td{background:#eef5ff}
.rv-table td.txt{max-width:340px;white-space:pre;overflow:hidden;text-overflow:ellipsis;font-family:monospace}
.rv-detail{background:#fff;border:1px solid #ccc;padding:10px;margin-top:8px}
.toks{font-family:monospace;white-space:pre-wrap;line-height:1.9;font-size:12.5px}
.tok{border-radius:2px;padding:1px 0;margin-right:1px;border-bottom:2px solid transparent}
.tok.nomask{color:#999;border-bottom:2px dotted #bbb}
.rv-group{display:grid;grid-template-columns:repeat(auto-fill,minmax(260px,1fr));gap:8px}
.rv-group .card{background:#fff;border:1px solid #ccc;padding:6px;font-size:12px}
.legend span{margin-right:10px;font-size:11.5px}
.turn{color:#6a3d9a;font-weight:600;font-size:11px}
"""

JS = r"""
(function () {
  "use strict";
  function $(id) { return document.getElementById(id); }
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in (attrs || {})) { e.setAttribute(k, attrs[k]); }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }
  // curves: rollout / time x-axis
  document.querySelectorAll("input[name=xaxis]").forEach(function (r) {
    r.addEventListener("change", function () {
      document.querySelectorAll("[data-x]").forEach(function (d) {
        d.style.display = d.getAttribute("data-x") === r.value ? "" : "none";
      });
    });
  });
  var metaEl = $("rv-meta");
  if (!metaEl) { return; }
  var meta = JSON.parse(metaEl.textContent);
  var index = JSON.parse($("rv-index").textContent);
  var C = {};
  index.cols.forEach(function (c, i) { C[c] = i; });
  var rows = index.rows, cache = {}, page = 0, shown = [];
  function chunk(n) {
    if (!(n in cache)) { cache[n] = JSON.parse($("rv-chunk-" + n).textContent); }
    return cache[n];
  }
  function sample(r) { return chunk(r[C.chunk])[r[C.pos]]; }
  function num(id) { var v = $(id).value; return v === "" ? null : Number(v); }
  function fmt(v, d) { return v === null || v === undefined ? "" : (typeof v === "number" ? v.toFixed(d) : v); }
  function filtered() {
    var src = $("rv-src").value, ro = $("rv-rollout").value, st = $("rv-status").value;
    var g = num("rv-group"), rmin = num("rv-rmin"), rmax = num("rv-rmax");
    var lmin = num("rv-lmin"), lmax = num("rv-lmax");
    var out = rows.filter(function (r) {
      return (src === "" || r[C.src] === Number(src)) && (ro === "" || r[C.rollout] === Number(ro)) &&
        (st === "" || r[C.status] === st) && (g === null || r[C.group] === g) &&
        (rmin === null || r[C.reward] >= rmin) && (rmax === null || r[C.reward] <= rmax) &&
        (lmin === null || r[C.len] >= lmin) && (lmax === null || r[C.len] <= lmax);
    });
    var s = $("rv-sort").value, desc = s.charAt(0) === "-", key = s.replace("-", "");
    if (key === "reward" || key === "len") {
      out.sort(function (a, b) { return (desc ? -1 : 1) * ((a[C[key]] || 0) - (b[C[key]] || 0)); });
    } else if (key === "group") {
      out.sort(function (a, b) {
        return a[C.src] - b[C.src] || a[C.rollout] - b[C.rollout] || a[C.group] - b[C.group] || a[C.index] - b[C.index];
      });
    }
    return out;
  }
  function render() {
    shown = filtered();
    var size = Number($("rv-size").value), pages = Math.max(1, Math.ceil(shown.length / size));
    page = Math.min(Math.max(page, 0), pages - 1);
    var body = $("rv-body");
    body.textContent = "";
    shown.slice(page * size, (page + 1) * size).forEach(function (r) {
      var tr = el("tr", {"data-src": r[C.src], "data-rollout": r[C.rollout], "data-row": r[C.pos]});
      var srcLabel = meta.sources[r[C.src]].label;
      [srcLabel, r[C.rollout], r[C.group], r[C.index], fmt(r[C.reward], 3), r[C.status], r[C.version], r[C.len],
       r[C.prompt], r[C.response]].forEach(function (v, i) {
        tr.appendChild(el("td", {"class": i >= 8 ? "txt" : (i >= 1 && i <= 7 && i !== 5 ? "num" : "")}, v));
      });
      tr.addEventListener("click", function () { detail(r); });
      body.appendChild(tr);
    });
    $("rv-count").textContent =
      shown.length + " of " + rows.length + " embedded samples; page " + (page + 1) + "/" + pages;
  }
  function tokenStrip(s) {
    var box = el("div", {"class": "toks"});
    var tl = s.tlp, turns = {}, a = s.meta && s.meta.agent;
    ((a && a.turn_spans) || []).forEach(function (t, k) {
      turns[t.response_start] = "turn " + (t.turn_id || k) + " (version " + t.weight_version + ")";
      if (t.response_end < s.tok.length) { turns[t.response_end] = turns[t.response_end] || "tool / environment"; }
    });
    s.tok.forEach(function (t, i) {
      if (turns[i]) { box.appendChild(el("span", {"class": "turn"}, "[" + turns[i] + "] ")); }
      var lp = s.lp[i], m = s.mask.length ? s.mask[i] : 1, color, tip;
      if (tl) {
        var d = Math.abs(s.dlp[i]), a = Math.min(1, Math.log10(1 + d * 1e3) / 3);
        color = "rgba(214,39,40," + a.toFixed(3) + ")";
        tip = "engine " + fmt(lp, 5) + " trainer " + fmt(tl[i], 5) + " |diff| " + d.toExponential(2);
      } else {
        var p = lp === undefined ? 1 : Math.exp(lp);
        color = "rgba(31,119,180," + (0.55 * (1 - p)).toFixed(3) + ")";
        tip = "engine log-prob " + fmt(lp, 5) + " (p=" + fmt(p, 3) + ")";
      }
      var span = el("span", {"class": "tok" + (m ? "" : " nomask"), "style": "background:" + color,
        "title": "#" + i + " id " + s.ids[i] + " | " + tip + " | loss mask " + m +
          (s.tv && s.tv.length ? " | version " + s.tv[i] : "")}, t);
      box.appendChild(span);
    });
    return box;
  }
  function agentBlock(s) {
    var a = s.meta && s.meta.agent;
    if (!a) { return null; }
    var box = el("div");
    box.appendChild(el("h4", {}, "Agent episode: " + (a.turns || 0) + " turn(s), stop: " + (a.stop || "?") +
      (a.error ? ", error: " + a.error : "")));
    var calls = a.tool_calls || [];
    if (calls.length) {
      var t = el("table", {"class": "rv-tools"}), h = el("tr");
      ["#", "tool", "arguments", "output"].forEach(function (x) { h.appendChild(el("th", {}, x)); });
      t.appendChild(h);
      calls.forEach(function (c, i) {
        var tr = el("tr");
        [i + 1, c.name || c.tool || "", JSON.stringify(c.arguments || c.args || ""),
         typeof c.output === "string" ? c.output : JSON.stringify(c.output !== undefined ? c.output : c.result)]
          .forEach(function (v) { tr.appendChild(el("td", {}, v)); });
        t.appendChild(tr);
      });
      box.appendChild(t);
    }
    var d = el("details"); d.appendChild(el("summary", {}, "episode record (metadata.agent)"));
    d.appendChild(el("pre", {}, JSON.stringify(a, null, 1))); box.appendChild(d);
    return box;
  }
  function card(r, s, cls) {
    var box = el("div", {"class": cls});
    box.appendChild(el("h4", {}, meta.sources[r[C.src]].label + " | rollout " + r[C.rollout] + " | group " +
      r[C.group] + " | sample " + r[C.index] + " | reward " + fmt(r[C.reward], 3) + " | " + r[C.status] +
      " | weight version " + r[C.version]));
    box.appendChild(el("div", {"class": "muted"}, "prompt (" + s.plen + " tokens)"));
    box.appendChild(el("pre", {}, s.prompt));
    box.appendChild(el("div", {"class": "muted"}, "response (" + s.tok.length + " tokens)"));
    box.appendChild(el("pre", {}, s.response));
    box.appendChild(el("div", {"class": "muted"}, "label: " + JSON.stringify(s.label)));
    box.appendChild(tokenStrip(s));
    return box;
  }
  function detail(r) {
    var s = sample(r), out = $("rv-detail");
    out.textContent = "";
    var b = el("button", {"id": "rv-group-btn"}, "show group " + r[C.group] + " side by side");
    b.addEventListener("click", function () { group(r); });
    out.appendChild(b);
    out.appendChild(card(r, s, "rv-detail"));
    var a = agentBlock(s);
    if (a) { out.appendChild(a); }
    var d = el("details"); d.appendChild(el("summary", {}, "metadata"));
    d.appendChild(el("pre", {}, JSON.stringify(s.meta, null, 1))); out.appendChild(d);
    out.scrollIntoView({block: "nearest"});
  }
  function group(r) {
    var out = $("rv-detail"), grid = el("div", {"class": "rv-group"});
    var mates = rows.filter(function (x) {
      return x[C.src] === r[C.src] && x[C.rollout] === r[C.rollout] && x[C.group] === r[C.group];
    }).sort(function (a, b) { return a[C.index] - b[C.index]; });
    out.textContent = "";
    out.appendChild(el("h4", {},
      "group " + r[C.group] + " of rollout " + r[C.rollout] + ": " + mates.length + " samples"));
    mates.forEach(function (x) { grid.appendChild(card(x, sample(x), "card")); });
    out.appendChild(grid);
  }
  ["rv-src", "rv-rollout", "rv-status", "rv-group", "rv-rmin", "rv-rmax", "rv-lmin", "rv-lmax", "rv-sort", "rv-size"]
    .forEach(function (id) { $(id).addEventListener("input", function () { page = 0; render(); }); });
  $("rv-prev").addEventListener("click", function () { page -= 1; render(); });
  $("rv-next").addEventListener("click", function () { page += 1; render(); });
  render();
})();
"""
