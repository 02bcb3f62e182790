"""The error browser: one self-contained HTML page of every scored example of a report
(`python -m mcwq_t5x.report RESULTS_DIR --html DIR` writes `DIR/index.html`).

No server, no network (a Content-Security-Policy forbids every request). One row per test
example and system: question, gold and predicted RIR with differing tokens highlighted, the
§6.2 category, recursionDepth, unseen compounds and the other systems' predictions. Filters live
in the address fragment (`#language=he&split=mcd1&category=correct`, `fragment`), so report.md's
links open the page on their examples. Stable elements: `#count` (`data-count`), `#rows tbody
tr`, `#f-language`, `#f-split`, `#f-test`, `#f-model`, `#f-mode`, `#f-category`, `#f-depth`,
`#f-unseen`, `#f-search`, `#page-size`, `#prev`, `#next`.
"""
from __future__ import annotations

import json
import pathlib
import urllib.parse
from typing import Any, Mapping, Sequence

from mcwq_t5x.data import writers
from mcwq_t5x.evaluation import compounds
from mcwq_t5x.evaluation import metrics

#: The page's file name in the browser's folder.
PAGE = "index.html"
#: Rows per page the reader can choose, and the default.
# A page at a time keeps tens of thousands of rows usable.
PAGE_SIZES = (25, 100, 500, 1000)
DEFAULT_PAGE_SIZE = 100
#: Filter fields, in the order of the page's controls and of `fragment`.
FIELDS = ("language", "split", "test", "model", "mode", "category", "depth", "unseen", "compound",
          "q")


def fragment(filters: Mapping[str, Any]) -> str:
  """"#field=value&..." that opens the page filtered ("" for none); a list joins by commas.

  Values are percent-encoded; ValueError for a field not in `FIELDS`.
  """
  parts = []
  for field in FIELDS:
    if field not in filters or filters[field] is None:
      continue
    value = filters[field]
    values = value if isinstance(value, (list, tuple)) else [value]
    parts.append(f"{field}=" + ",".join(urllib.parse.quote(str(v), safe="") for v in values))
  unknown = set(filters) - set(FIELDS)
  if unknown:
    raise ValueError(f"unknown filter fields {sorted(unknown)}; expected some of {FIELDS}")
  return "#" + "&".join(parts) if parts else ""


class _Strings:
  """Interned strings: each distinct string once, referred to by its index."""

  def __init__(self):
    self.index: dict[str, int] = {}
    self.values: list[str] = []

  def __call__(self, text: str) -> int:
    i = self.index.get(text)
    if i is None:
      i = self.index[text] = len(self.values)
      self.values.append(text)
    return i


def page_data(report: Mapping[str, Any], sections: Sequence[Mapping[str, Any]] = ()) -> dict:
  """The page's JSON-serialisable data (runs, test sets, tables) from `report.build`'s output.

  `sections`: tables {"name", "heading", "header", "rows", "links" (per row {column: fragment})}.
  ValueError: the report has no `_examples` (read back from results.json).
  """
  examples = report.get("_examples")
  if not examples:
    raise ValueError("the report holds no examples (build it with report.build; results.json "
                     "has only the scores)")
  # Interned: a prediction equal to its gold query is stored once (a full release, all systems).
  strings = _Strings()
  sets, set_index = [], {}
  for key, s in examples["sets"].items():
    set_index[key] = len(sets)
    sets.append({
        "key": key,
        "split": s["split"],
        "test": "gold" if s["split"] == "gold" else s["part"],
        "language": s["language"],
        "g": [strings(t.strip()) for t in s["targets"]],
        "q": [strings(q) for q in s["questions"]] if s.get("questions") else None,
        "d": list(s["depths"]) if s.get("depths") else None,
        "u": [[strings(c) for c in u] for u in s["unseen"]] if s.get("unseen") is not None else None
    })
  categories = list(metrics.ERROR_CATEGORIES)
  category_index = {c: i for i, c in enumerate(categories)}
  runs = []
  for run, data in zip(report["runs"], examples["runs"]):
    runs.append({
        "model": run["model"],
        "mode": run["mode"],
        "split": run["split"],
        "language": run["language"],
        "test": sets[set_index[data["set"]]]["test"],
        "set": set_index[data["set"]],
        "em": run["exact_match"],
        "ci": run.get("exact_match_ci"),
        "p": [strings(p.strip()) for p in data["predictions"]],
        "c": [category_index[c] for c in data["categories"]]
    })
  return {
      "title": "MCWQ error browser",
      "strings": strings.values,
      "categories": categories,
      "bucketEdges": list(compounds.BUCKET_EDGES),
      "buckets": list(compounds.BUCKETS),
      "sets": sets,
      "runs": runs,
      "tables": [dict(s) for s in sections],
      "pageSizes": list(PAGE_SIZES),
      "pageSize": DEFAULT_PAGE_SIZE,
      "fields": list(FIELDS)
  }


def write_page(
    report: Mapping[str, Any],
    out_dir: str | pathlib.Path,
    sections: Sequence[Mapping[str, Any]] = ()) -> pathlib.Path:
  """Writes `out_dir/index.html` and returns its path.

  Raises ValueError (no per-example data) or writers.ResultWriteError.
  """
  data = script_json(page_data(report, sections))
  path = pathlib.Path(out_dir) / PAGE
  writers.write_atomic(path, _HTML.replace("__DATA__", data, 1))
  return path


def script_json(value: Any) -> str:
  """`value` as JSON safe inside `<script>` (`<`, `>`, `&` as `\\u00XX` escapes)."""
  # why: no string may close the element (`</script>`) or open a comment.
  text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
  # JSON strings are the only place these characters can occur; the escapes decode back to them.
  return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


_HTML = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>MCWQ error browser</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1em; font-size: 14px; }
h1 { font-size: 1.4em; margin: 0 0 .4em 0; }
h2 { font-size: 1.05em; margin: 1em 0 .3em 0; }
#filters { display: flex; flex-wrap: wrap; gap: .4em 1em; align-items: end; margin: .6em 0;
           position: sticky; top: 0; background: #fff; padding: .4em 0; z-index: 1;
           border-bottom: 1px solid #ccc; }
#filters label { display: flex; flex-direction: column; font-size: .85em; color: #444; }
#pager { margin: .4em 0; }
table { border-collapse: collapse; }
td, th { border: 1px solid #ddd; padding: 2px 5px; vertical-align: top; }
th { background: #f3f3f3; }
#rows td.q { max-width: 22em; }
#rows td.query { font-family: ui-monospace, monospace; font-size: .85em; max-width: 40em;
                 word-break: break-word; }
.tag { display: block; color: #777; font-size: .8em; }
.del { background: #fdd; text-decoration: line-through; }
.ins { background: #fd8; }
.correct { color: #070; }
.wrong { color: #a00; }
.report-table td a { text-decoration: none; }
.chip { background: #eef; border: 1px solid #99c; border-radius: 3px; padding: 1px 4px;
        font-family: ui-monospace, monospace; font-size: .85em; }
details summary { cursor: pointer; }
</style>
</head>
<body>
<h1>MCWQ error browser</h1>
<p id="summary"></p>
<details id="tables-box"><summary>The report's tables (each linked cell shows its examples)</summary>
<div id="tables"></div></details>
<div id="filters"></div>
<div id="pager"><span id="count" data-count="0"></span>
 <button id="prev" type="button">previous</button> <button id="next" type="button">next</button>
 <label>rows per page <select id="page-size"></select></label>
 <button id="clear" type="button">clear filters</button></div>
<table id="rows"><thead><tr><th>#</th><th>language</th><th>test set</th><th>model</th>
<th>question</th><th>gold / predicted query</th><th>category</th><th>complexity</th>
<th>unseen compounds</th><th>other systems</th></tr></thead><tbody></tbody></table>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const S = D.strings;
const state = {filters: {}, page: 0, size: D.pageSize, rows: []};
const MULTI = "\u0000several";

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function bucket(k) {
  let i = 0;
  while (i + 1 < D.bucketEdges.length && D.bucketEdges[i + 1] <= k) i++;
  return D.buckets[i];
}

// Per run, the runs of other systems on the same test set and language.
const others = D.runs.map((r, i) => D.runs.map((o, j) => j).filter(
    j => j !== i && D.runs[j].set === r.set));

function values(field) {
  const seen = new Set();
  if (field === "depth") {
    for (const s of D.sets) if (s.d) for (const d of s.d) if (d !== null) seen.add(d);
    return [...seen].sort((a, b) => a - b).map(String);
  }
  if (field === "category") return D.categories;
  if (field === "unseen") return D.buckets;
  for (const r of D.runs) seen.add(r[field]);
  return [...seen].sort();
}

function parseHash() {
  const filters = {};
  const text = location.hash.replace(/^#/, "");
  if (!text) return filters;
  for (const part of text.split("&")) {
    const at = part.indexOf("=");
    if (at < 0) continue;
    const field = part.slice(0, at);
    if (!D.fields.includes(field)) continue;
    const vals = part.slice(at + 1).split(",").map(decodeURIComponent).filter(v => v !== "");
    if (vals.length) filters[field] = vals;
  }
  return filters;
}

function toHash(filters) {
  const parts = [];
  for (const f of D.fields) {
    if (filters[f] && filters[f].length)
      parts.push(f + "=" + filters[f].map(encodeURIComponent).join(","));
  }
  return parts.length ? "#" + parts.join("&") : "";
}

const SELECTS = ["language", "split", "test", "model", "mode", "category", "depth", "unseen"];

function buildFilters() {
  const box = document.getElementById("filters");
  for (const f of SELECTS) {
    const sel = el("select", {id: "f-" + f});
    sel.addEventListener("change", () => {
      const v = sel.value;
      if (v === MULTI) return;
      if (v === "") delete state.filters[f]; else state.filters[f] = [v];
      go();
    });
    box.append(el("label", {}, f === "depth" ? "complexity" :
                  f === "unseen" ? "unseen compounds" : f === "test" ? "test set" : f, sel));
  }
  const search = el("input", {id: "f-search", type: "search", placeholder: "text in question or query"});
  search.addEventListener("change", () => {
    if (search.value) state.filters.q = [search.value]; else delete state.filters.q;
    go();
  });
  box.append(el("label", {}, "search", search));
  box.append(el("span", {id: "f-compound"}));
}

function syncControls() {
  for (const f of SELECTS) {
    const sel = document.getElementById("f-" + f);
    sel.textContent = "";
    sel.append(el("option", {value: ""}, "all"));
    const chosen = state.filters[f] || [];
    for (const v of values(f)) sel.append(el("option", {value: v}, v));
    if (chosen.length > 1) sel.append(el("option", {value: MULTI}, chosen.join(", ")));
    sel.value = chosen.length > 1 ? MULTI : chosen.length ? chosen[0] : "";
    if (f === "depth" || f === "unseen") sel.disabled = values(f).length === 0 ||
        (f === "unseen" && !D.sets.some(s => s.u)) || (f === "depth" && !D.sets.some(s => s.d));
  }
  document.getElementById("f-search").value = (state.filters.q || [""])[0];
  const chip = document.getElementById("f-compound");
  chip.textContent = "";
  if (state.filters.compound) {
    const x = el("button", {type: "button"}, "×");
    x.addEventListener("click", () => { delete state.filters.compound; go(); });
    chip.append("unseen compound: ", el("span", {class: "chip"}, state.filters.compound.join(" or ")), x);
  }
}

function matches() {
  const f = state.filters, out = [];
  const has = (field, v) => !f[field] || f[field].includes(String(v));
  const compound = f.compound ? new Set(f.compound) : null;
  const q = f.q ? f.q[0].toLowerCase() : null;
  D.runs.forEach((r, ri) => {
    if (!has("language", r.language) || !has("split", r.split) || !has("test", r.test) ||
        !has("model", r.model) || !has("mode", r.mode)) return;
    const s = D.sets[r.set];
    if ((f.depth && !s.d) || ((f.unseen || compound) && !s.u)) return;
    const cats = f.category ? new Set(f.category.map(c => D.categories.indexOf(c))) : null;
    for (let i = 0; i < r.p.length; i++) {
      if (cats && !cats.has(r.c[i])) continue;
      if (f.depth && !has("depth", s.d[i])) continue;
      if (f.unseen && !has("unseen", bucket(s.u[i].length))) continue;
      if (compound && !s.u[i].some(c => compound.has(S[c]))) continue;
      if (q && !(S[s.g[i]].toLowerCase().includes(q) || S[r.p[i]].toLowerCase().includes(q) ||
                 (s.q && S[s.q[i]].toLowerCase().includes(q)))) continue;
      out.push([ri, i]);
    }
  });
  return out;
}

// Token diff (longest common subsequence): marks the gold tokens the prediction lacks and the
// predicted tokens the gold lacks.
function diff(a, b) {
  const n = a.length, m = b.length;
  const L = Array.from({length: n + 1}, () => new Int32Array(m + 1));
  for (let i = n - 1; i >= 0; i--)
    for (let j = m - 1; j >= 0; j--)
      L[i][j] = a[i] === b[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const inA = new Array(n).fill(false), inB = new Array(m).fill(false);
  let i = 0, j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) { inA[i] = inB[j] = true; i++; j++; }
    else if (L[i + 1][j] >= L[i][j + 1]) i++; else j++;
  }
  return [inA, inB];
}

function tokens(text, keep, cls) {
  const span = el("span");
  text.forEach((t, k) => {
    if (k) span.append(" ");
    span.append(keep[k] ? t : el("span", {class: cls}, t));
  });
  return span;
}

function queryCell(gold, pred) {
  const a = gold.split(/\s+/).filter(Boolean), b = pred.split(/\s+/).filter(Boolean);
  const [inA, inB] = diff(a, b);
  return el("td", {class: "query"}, el("span", {class: "tag"}, "gold"), tokens(a, inA, "del"),
            el("span", {class: "tag"}, "predicted"),
            b.length ? tokens(b, inB, "ins") : el("em", {}, "(empty)"));
}

function render() {
  const rows = state.rows, size = state.size;
  const pages = Math.max(1, Math.ceil(rows.length / size));
  state.page = Math.min(state.page, pages - 1);
  const start = state.page * size, end = Math.min(rows.length, start + size);
  const count = document.getElementById("count");
  count.dataset.count = String(rows.length);
  count.textContent = rows.length ? `examples ${start + 1}–${end} of ${rows.length} selected ` :
                      "no example selected ";
  document.getElementById("prev").disabled = state.page === 0;
  document.getElementById("next").disabled = state.page >= pages - 1;
  const body = document.querySelector("#rows tbody");
  body.textContent = "";
  for (let k = start; k < end; k++) {
    const [ri, i] = rows[k];
    const r = D.runs[ri], s = D.sets[r.set];
    const cat = D.categories[r.c[i]];
    const unseen = s.u ? s.u[i] : null;
    const unseenCell = el("td");
    if (unseen) {
      if (unseen.length) {
        const det = el("details", {}, el("summary", {}, String(unseen.length)));
        for (const c of unseen) det.append(el("div", {class: "chip"}, S[c]));
        unseenCell.append(det);
      } else unseenCell.append("0");
    } else unseenCell.append("–");
    const otherCell = el("td");
    if (others[ri].length) {
      const det = el("details", {}, el("summary", {}, `${others[ri].length} other`));
      for (const j of others[ri]) {
        const o = D.runs[j];
        const oc = D.categories[o.c[i]];
        det.append(el("div", {}, el("b", {}, `${o.model} (${o.mode}): `),
                      el("span", {class: oc === "correct" ? "correct" : "wrong"}, oc), " ",
                      el("span", {class: "query"}, S[o.p[i]] || "(empty)")));
      }
      otherCell.append(det);
    } else otherCell.append("–");
    body.append(el("tr", {},
        el("td", {}, String(i + 1)), el("td", {}, r.language),
        el("td", {}, r.test === "gold" ? `gold (${r.split} model)` : `${r.split} ${r.test}`),
        el("td", {}, `${r.model} (${r.mode})`),
        el("td", {class: "q"}, s.q ? S[s.q[i]] : "–"),
        queryCell(S[s.g[i]], S[r.p[i]]),
        el("td", {class: cat === "correct" ? "correct" : "wrong"}, cat),
        el("td", {}, s.d && s.d[i] !== null ? String(s.d[i]) : "–"),
        unseenCell, otherCell));
  }
}

// A filter set by a control is applied at once and written to the address (so that the view can
// be bookmarked); a changed address (a link) applies its filters.
function go() {
  apply();
  const hash = toHash(state.filters);
  try {
    history.replaceState(null, "", hash || location.pathname + location.search);
  } catch (e) {
    location.hash = hash;
  }
}

function apply() {
  state.page = 0;
  syncControls();
  state.rows = matches();
  render();
}

function buildTables() {
  const box = document.getElementById("tables");
  for (const t of D.tables) {
    box.append(el("h2", {}, t.heading));
    const table = el("table", {class: "report-table"});
    table.append(el("tr", {}, ...t.header.map(h => el("th", {}, h))));
    t.rows.forEach((row, k) => {
      const links = t.links[k] || {};
      table.append(el("tr", {}, ...row.map((v, j) => {
        const link = links[String(j)];
        return el("td", {}, link && v !== "-" ? el("a", {href: link}, v) : v);
      })));
    });
    box.append(table);
  }
}

function init() {
  const total = D.runs.reduce((n, r) => n + r.p.length, 0);
  document.getElementById("summary").textContent =
      `${total} scored examples: ${D.runs.length} prediction files on ${D.sets.length} test sets.`;
  buildTables();
  buildFilters();
  const sizeSel = document.getElementById("page-size");
  for (const n of D.pageSizes) sizeSel.append(el("option", {value: String(n)}, String(n)));
  sizeSel.value = String(state.size);
  sizeSel.addEventListener("change", () => { state.size = Number(sizeSel.value); render(); });
  document.getElementById("prev").addEventListener("click", () => { state.page--; render(); });
  document.getElementById("next").addEventListener("click", () => { state.page++; render(); });
  document.getElementById("clear").addEventListener("click", () => { state.filters = {}; go(); });
  window.addEventListener("hashchange", () => {
    const filters = parseHash();
    if (toHash(filters) !== toHash(state.filters)) { state.filters = filters; apply(); }
  });
  state.filters = parseHash();
  apply();
  document.body.dataset.ready = "1";
}
init();
</script>
</body>
</html>
"""
