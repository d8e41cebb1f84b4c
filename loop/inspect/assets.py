"""The report page's script, inlined into every report (no network, no files).

The script reads the index (`<script id="index">`), draws the filter bar and a page of task
cards at a time (heat map per run, legend, rollouts table), and decodes a rollout's transcript
(`<script id="t-N">`, gzip + base64) only when it is opened. In the address, `#rollout=N` opens
a transcript (`#rollout=N&tokens` also its token views) and `#task=ID` shows one task. When the
first render is done the page sets `data-ready` and `data-render-ms` on <body> (the browser
test reads them).
"""

from __future__ import annotations

SCRIPT = r"""
"use strict";
(() => {
const D = JSON.parse(document.getElementById("index").textContent);
const R = D.rollouts, API = D.apis.map(a => a[0]), COLOR = D.apis.map(a => a[1]);
const PAGE = 12, ROW_PAGE = 20, MAX_COLS = 300, MAX_ROWS = 200;
const F = {q: "", task: "", split: "", d: "", outcome: "", st: "", run: "", it: "", api: ""};
let shown = PAGE;
const $ = id => document.getElementById(id);

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}
const num = (x, d = 2) => (x === null || x === undefined) ? "-" : (+x).toFixed(d);
const pct = x => isFinite(x) ? (100 * x).toFixed(0) + "%" : "-";
const iterName = it => it === null ? "eval" : "iter " + it;
const outcome = r => r.ok ? "success" : (r.ok === false ? "failure" : "not scored");
const count = (n, what) => `${n} ${what}${n === 1 ? "" : "s"}`;

function unique(values) {
  return [...new Set(values)].sort((a, b) =>
    (a === null) - (b === null) || (a < b ? -1 : a > b ? 1 : 0));
}

function buildFilters() {
  const box = $("filters");
  box.append(el("input", {type: "search", id: "f-q", placeholder: "task id contains",
    oninput: e => { F.q = e.target.value.trim(); refresh(); }}));
  const add = (key, label, values, name) => {
    if (values.length < 2) return;
    const s = el("select", {id: "f-" + key, onchange: e => { F[key] = e.target.value; refresh(); }},
      el("option", {value: "", text: "all"}));
    for (const v of values) s.append(el("option", {value: String(v), text: name(v)}));
    box.append(el("label", {}, label + " ", s));
  };
  add("split", "split", unique(R.map(r => r.split)), String);
  add("d", "difficulty", unique(R.map(r => r.d)), String);
  add("outcome", "outcome", ["success", "failure"], String);
  add("st", "status", unique(R.map(r => r.st)), String);
  add("run", "run", unique(R.map(r => r.run)), i => D.runs[i].label);
  add("it", "iteration", unique(R.map(r => r.it)), iterName);
  add("api", "calls", API.map((_, i) => i).sort((a, b) => API[a] < API[b] ? -1 : 1), i => API[i]);
  box.append(el("span", {id: "f-task"}));
}

function pass(r) {
  return (!F.q || r.task.includes(F.q)) && (!F.task || r.task === F.task)
    && (!F.split || r.split === F.split) && (!F.d || String(r.d) === F.d)
    && (!F.st || r.st === F.st) && (!F.run || String(r.run) === F.run)
    && (!F.it || String(r.it) === F.it) && (!F.api || r.seq.includes(Number(F.api)))
    && (F.outcome !== "success" || r.ok) && (F.outcome !== "failure" || !r.ok);
}

function groups() {
  const by = new Map();
  for (const r of R) {
    if (!pass(r)) continue;
    if (!by.has(r.task)) by.set(r.task, []);
    by.get(r.task).push(r);
  }
  return [...by.entries()].sort((a, b) => a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0);
}

function refresh() { shown = PAGE; renderCards(); }

function renderCards() {
  const g = groups(), cards = $("cards");
  const n = g.reduce((s, [, rs]) => s + rs.length, 0);
  const ok = g.reduce((s, [, rs]) => s + rs.filter(r => r.ok).length, 0);
  $("status").textContent = `${count(n, "rollout")} of ${count(g.length, "task")} match ` +
    "the filters; " +
    `${pct(ok / n)} succeed. Click a heat-map column or a table row for its transcript.` +
    (D.tokenNote ? " Note: " + D.tokenNote + "." : "");
  const chip = $("f-task");
  chip.replaceChildren();
  if (F.task) chip.append(el("span", {class: "chip"}, "task = " + F.task,
    el("button", {type: "button", title: "clear", text: "\u2715",
      onclick: () => { F.task = ""; refresh(); }})));
  cards.replaceChildren(...g.slice(0, shown).map(([task, rs]) => card(task, rs)));
  const more = $("more"), left = g.length - shown;
  more.hidden = left <= 0;
  more.textContent = `show ${Math.min(PAGE, left)} more tasks (${left} not shown)`;
}

function bySequence(a, b) {
  const n = Math.min(a.seq.length, b.seq.length);
  for (let i = 0; i < n; i++) {
    if (a.seq[i] !== b.seq[i]) return API[a.seq[i]] < API[b.seq[i]] ? -1 : 1;
  }
  return a.seq.length - b.seq.length || (b.ok === true) - (a.ok === true) || a.id - b.id;
}

function card(task, rs) {
  const info = D.tasks[task] || {}, ok = rs.filter(r => r.ok).length;
  const distinct = new Set(rs.map(r => r.seq.join(","))).size;
  const c = el("article", {class: "card", "data-task": task});
  c.append(el("h3", {}, task, el("span", {class: "meta", text:
    `difficulty ${info.difficulty} \u00b7 ${count(rs.length, "rollout")} \u00b7 ` +
    `${ok} succeed \u00b7 ${count(distinct, "distinct API-call sequence")}`})));
  if (info.instruction) c.append(el("p", {class: "instruction", text: info.instruction}));
  const sorted = rs.slice().sort(bySequence), maps = el("div", {class: "maps"});
  for (const run of unique(rs.map(r => r.run))) {
    maps.append(heatmap(sorted.filter(r => r.run === run), run, c));
  }
  c.append(maps, legend(rs), rolloutTable(sorted, c), el("div", {class: "transcript"}));
  return c;
}

function heatmap(rs, run, c) {
  const cols = rs.slice(0, MAX_COLS);
  const rows = Math.min(MAX_ROWS, Math.max(0, ...cols.map(r => r.seq.length)));
  const w = Math.max(4, Math.min(24, Math.floor(760 / cols.length)));
  const h = rows > 60 ? 5 : (rows > 30 ? 8 : 12), top = 20, left = 46;
  const s = svg("svg", {class: "heatmap", width: left + cols.length * w + 4,
    height: top + rows * h + 4, "data-run": run, "data-cols": cols.length});
  for (const [y, text] of rows ? [[12, "outcome"], [top + 9, "call 1"]] : [[12, "outcome"]]) {
    const label = svg("text", {x: 0, y: y, "font-size": 9});
    label.textContent = text;
    s.append(label);
  }
  cols.forEach((r, x) => {
    const mark = r.ok ? "#1a7f37" : (r.ok === false ? "#222" : "#9aa5b1");
    s.append(svg("rect", {x: left + x * w, y: 3, width: w - 1, height: 12, fill: mark,
      class: "outcome"}));
    if (w >= 10) {
      const glyph = svg("text", {x: left + x * w + (w - 1) / 2, y: 13, "font-size": 10,
        fill: "#fff", "text-anchor": "middle"});
      glyph.textContent = r.ok ? "\u2713" : "\u2717";
      s.append(glyph);
    }
    const n = Math.min(rows, r.seq.length), bad = new Set(r.bad);
    for (let y = 0; y < n; y++) {
      const X = left + x * w, Y = top + y * h;
      s.append(svg("rect", {x: X, y: Y, width: w - 1, height: h - 1, fill: COLOR[r.seq[y]],
        class: "cell"}));
      if (bad.has(y)) s.append(svg("path", {d: `M${X} ${Y}L${X + w - 1} ${Y + h - 1}` +
        `M${X + w - 1} ${Y}L${X} ${Y + h - 1}`, stroke: "#000", "stroke-width": 1.3}));
    }
  });
  const hover = el("div", {class: "hover"});
  const at = e => {
    const box = s.getBoundingClientRect();
    const x = Math.floor((e.clientX - box.left - left) / w);
    const y = Math.floor((e.clientY - box.top - top) / h);
    return [cols[x], y];
  };
  s.addEventListener("mousemove", e => {
    const [r, y] = at(e);
    if (!r) { hover.textContent = ""; return; }
    const call = y >= 0 && y < r.seq.length ? ` \u00b7 call ${y + 1}: ${API[r.seq[y]]}` +
      (r.bad.includes(y) ? " (failed)" : "") : "";
    hover.textContent = `rollout #${r.k} (${outcome(r)}, ${r.seq.length} calls)${call}`;
  });
  s.addEventListener("click", e => { const [r] = at(e); if (r) openTranscript(r, c, false); });
  const label = (D.runs.length > 1 ? D.runs[run].label + ": " : "") + count(rs.length, "rollout") +
    (rs.length > MAX_COLS ? ` (first ${MAX_COLS} drawn)` : "") +
    (cols.some(r => r.seq.length) ? ", sorted by call sequence" : ": no API calls");
  return el("figure", {class: "map"}, el("figcaption", {text: label}), s, hover);
}

function legend(rs) {
  const used = unique(rs.flatMap(r => r.seq)).sort((a, b) => API[a] < API[b] ? -1 : 1);
  const box = el("div", {class: "legend"});
  for (const i of used) {
    box.append(el("span", {}, el("span", {class: "swatch", style: "background:" + COLOR[i]}),
      API[i]));
  }
  box.append(el("span", {text: "\u2715 failed call \u00b7 outcome row: green \u2713 success, " +
    "black \u2717 failure \u00b7 columns are rollouts, rows are calls in order"}));
  return box;
}

function rolloutTable(rs, c) {
  const multiRun = D.runs.length > 1, iters = rs.some(r => r.it !== null);
  const training = rs.some(r => r.adv !== null || r.kept !== null);
  const head = ["#", ...(multiRun ? ["run"] : []), "split", ...(iters ? ["iter"] : []),
    "status", "outcome", "reward", ...D.columns, ...(training ? ["advantage", "kept"] : [])];
  const t = el("table", {class: "rollouts"});
  t.append(el("tr", {}, ...head.map(h => el("th", {text: h, title: D.columnDocs[h] || null}))));
  const rows = rs.map(r => {
    const cells = [r.k, ...(multiRun ? [D.runs[r.run].label] : []), r.split,
      ...(iters ? [iterName(r.it)] : []), r.st, outcome(r), num(r.r), ...r.m,
      ...(training ? [num(r.adv, 3), r.kept === null ? "-" : String(r.kept)] : [])];
    const tr = el("tr", {"data-id": r.id, onclick: () => openTranscript(r, c, false)},
      ...cells.map(x => el("td", {text: String(x)})));
    tr.children[head.indexOf("outcome")].className = r.ok ? "ok" : "bad";
    return tr;
  });
  t.append(...rows.slice(0, ROW_PAGE));
  if (rows.length <= ROW_PAGE) return t;
  const all = el("button", {type: "button", text: `show all ${rows.length} rollouts`,
    onclick: () => { t.append(...rows.slice(ROW_PAGE)); all.remove(); }});
  return el("div", {}, t, all);
}

async function unpack(b64) {
  const bin = atob(b64.trim()), bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

async function openTranscript(r, c, scroll) {
  const box = c.querySelector(".transcript");
  for (const tr of c.querySelectorAll(".rollouts tr")) {
    tr.classList.toggle("sel", tr.dataset.id === String(r.id));
  }
  box.replaceChildren(el("p", {class: "note", text: "decoding transcript\u2026"}));
  try {
    const t = await unpack($("t-" + r.id).textContent);
    box.replaceChildren(transcript(r, t, box));
  } catch (err) {
    box.replaceChildren(el("p", {class: "error", text: "cannot show this transcript: " + err}));
  }
  history.replaceState(null, "", "#rollout=" + r.id);
  if (scroll) box.scrollIntoView({block: "start"});
}

function transcript(r, t, box) {
  const runName = D.runs.length > 1 ? D.runs[r.run].label + " \u00b7 " : "";
  const extra = (r.it !== null ? ` \u00b7 ${iterName(r.it)}` : "") +
    (r.adv !== null ? ` \u00b7 advantage ${num(r.adv, 3)}` : "") +
    (r.kept !== null ? ` \u00b7 ${r.kept ? "trained on" : "dropped by the |A| filter"}` : "");
  const head = el("div", {class: "thead"},
    el("button", {type: "button", text: "close", onclick: () => box.replaceChildren()}),
    el("b", {text: `${r.task} #${r.k}`}),
    ` ${runName}split ${r.split}${extra} \u00b7 status ${r.st} \u00b7 reward ${num(r.r)} \u00b7 `,
    el("span", {class: r.ok ? "ok" : "bad", text: outcome(r)}),
    el("div", {class: "note", text: (t.tokens ? `${t.tokens} tokens, ${t.outputTokens} ` +
      "sampled \u00b7 " : "") + t.where}));
  const out = el("div", {class: "transcript-body", "data-id": r.id}, head);
  if (t.error) out.append(el("pre", {class: "error", text: t.error}));
  out.append(el("details", {}, el("summary", {text: "the task as the agent saw it"}),
    el("pre", {text: t.context || "(not recorded)"})));
  const adv = Array.isArray(t.turnAdvantages) && new Set(t.turnAdvantages).size > 1
    ? t.turnAdvantages : null;  // per-turn advantages, shown only when they differ
  t.turns.forEach((u, i) => out.append(turn(u, i, r, adv ? adv[i] ?? null : null)));
  if (t.outside.length) {
    out.append(el("h4", {text: "API calls outside any turn (the sandbox failed mid-step)"}),
      calls(t.outside));
  }
  out.append(tests(t.tests));
  return out;
}

function turn(u, i, r, advantage) {
  const sec = el("section", {class: "turn" + (u.failed ? " failed" : "")});
  sec.append(el("h4", {text: `Turn ${i + 1}` +
    (u.finish === "length" ? " (cut at the token limit)" : "") +
    (u.failed ? " \u00b7 execution failed" : "") +
    (advantage === null ? "" : ` \u00b7 advantage ${num(advantage, 3)}`)}));
  for (const [kind, body] of u.segs) {
    sec.append(kind === "c" ? el("pre", {class: "code", text: body})
      : el("div", {class: "thought", text: body}));
  }
  if (!u.segs.some(s => s[0] === "c")) sec.append(el("p", {class: "note", text: "no code block"}));
  if (u.calls.length) sec.append(calls(u.calls));
  if (u.obs !== null) sec.append(el("pre", {class: "obs" + (u.failed ? " err" : ""), text: u.obs}));
  else if (u.error) sec.append(el("pre", {class: "obs err", text: u.error}));
  if (u.tok) sec.append(tokenToggle(u.tok, r));
  return sec;
}

function calls(list) {
  const t = el("table", {class: "calls"},
    el("tr", {}, ...["#", "API call", "arguments", "result", "ms"].map(h => el("th", {text: h}))));
  list.forEach((c, i) => t.append(el("tr", {class: c.ok ? "" : "fail"},
    el("td", {text: String(i + 1)}), el("td", {text: c.ep}),
    el("td", {class: "args", text: c.args}), el("td", {text: c.ok ? "ok" : (c.error || "error")}),
    el("td", {text: num(c.ms)}))));
  return t;
}

function tests(list) {
  const passed = list.filter(x => x.passed).length;
  const box = el("div", {class: "tests"}, el("h4", {text: list.length
    ? `Tests: ${passed} of ${list.length} passed` : "Tests: not run (rollout not scored)"}));
  const ul = el("ul");
  for (const x of list) {
    const li = el("li", {class: x.passed ? "pass" : "fail"}, el("b", {text: x.name}),
      ": " + (x.requirement || ""));
    if (!x.passed && x.message) li.append(el("div", {class: "msg", text: x.message}));
    ul.append(li);
  }
  box.append(ul);
  return box;
}

function tokenToggle(tok, r) {
  const wrap = el("div");
  const btn = el("button", {type: "button", text: `token view (${tok.ids.length} sampled tokens)`,
    onclick: () => wrap.replaceChildren(...(wrap.childElementCount ? [] : tokenView(tok, r)))});
  return el("div", {class: "tokens"}, btn, wrap);
}

function tokenView(tok, r) {
  const learner = Array.isArray(tok.ll);
  const view = el("div", {class: "tokview"});
  let trained = 0, sum = 0, count = 0, worst = 0;
  tok.ids.forEach((id, i) => {
    const lp = tok.lp[i], ll = learner ? tok.ll[i] : null;
    const on = !tok.mask || tok.mask[i] === "1";
    trained += on;
    let bg = "transparent", tip = `id ${id} \u00b7 sampler ${num(lp, 4)}`;
    if (learner && lp !== null && ll !== null) {
      const d = ll - lp, a = Math.min(1, Math.abs(d) / 0.5);
      sum += Math.abs(d); count += 1; worst = Math.max(worst, Math.abs(d));
      bg = d < 0 ? `rgba(215,48,39,${a.toFixed(3)})` : `rgba(49,54,149,${a.toFixed(3)})`;
      tip += ` \u00b7 learner ${num(ll, 4)} \u00b7 \u0394 ${num(d, 4)}`;
    } else if (lp !== null) {
      bg = `rgba(253,150,60,${(1 - Math.exp(lp)).toFixed(3)})`;
    }
    const piece = id in D.vocab ? D.vocab[id] : `[${id}]`;
    view.append(el("span", {class: "tok" + (on ? " trained" : " untrained"),
      style: "background:" + bg, title: tip + (on ? " \u00b7 trained" : " \u00b7 not trained"),
      text: piece.replace(/\n/g, "\u21b5\n")}));
  });
  const what = r.kept === false ? "no token was trained: the |A| filter dropped this rollout"
    : (r.kept === null ? "an evaluation rollout: underlined tokens are its loss mask"
      : `${trained} of ${tok.ids.length} tokens trained (underlined)`);
  const colour = learner
    ? `colour: learner \u2212 sampler log-prob (red: learner lower, blue: higher; full at ` +
      `|\u0394| \u2265 0.5); mean |\u0394| ${num(count ? sum / count : null, 4)}, ` +
      `max ${num(worst, 4)}`
    : "colour: sampler probability (darker orange: less likely); no learner log-probs";
  return [el("p", {class: "note", text: `${what}. ${colour}.`}), view];
}

async function route() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("rollout")) {
    const r = R[Number(params.get("rollout"))];
    if (!r) return;
    for (const k of Object.keys(F)) F[k] = "";
    for (const s of document.querySelectorAll("#filters select, #filters input")) s.value = "";
    F.task = r.task;
    refresh();
    const c = document.querySelector(".card");
    if (!c) return;
    await openTranscript(r, c, true);
    if (params.has("tokens")) for (const b of c.querySelectorAll(".tokens button")) b.click();
  } else if (params.has("task")) {
    F.task = params.get("task");
    refresh();
    $("explore").scrollIntoView({block: "start"});
  }
}

$("more").addEventListener("click", () => { shown += PAGE; renderCards(); });
window.addEventListener("hashchange", route);
buildFilters();
renderCards();
route().finally(() => {
  document.body.dataset.renderMs = performance.now().toFixed(0);
  document.body.dataset.ready = "1";
});
})();
"""
