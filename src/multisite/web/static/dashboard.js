// The dashboard page: polls /api/state and /api/series every second, the slower tables every 5 s.
// Everything it shows comes from the same /api the server documents (multisite.web.app).
"use strict";

const COLORS = { streaming: "#2e9e44", xoff: "#e0a100", disconnected: "#c62828", refused: "#7b1fa2", passive: "#8a94a0" };
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const SVG = "http://www.w3.org/2000/svg";
const dashboard = window.dashboard = { state: null, series: null, plots: {}, polls: 0, errors: 0 };

function el(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtTime(t) { return t ? new Date(t * 1000).toLocaleTimeString() : "-"; }

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

// Columns by depth along the links (a primary first, its secondaries next, cascades further right).
function layout(instances, links) {
  const depth = {};
  const incoming = new Set(links.map(l => l.to));
  const roots = instances.filter(i => !incoming.has(i.name)).map(i => i.name);
  (roots.length ? roots : instances.slice(0, 1).map(i => i.name)).forEach(n => depth[n] = 0);
  for (let pass = 0; pass < instances.length; pass++) {
    for (const l of links) {
      if (depth[l.from] !== undefined && (depth[l.to] === undefined || depth[l.to] < depth[l.from] + 1) && depth[l.from] + 1 < instances.length) {
        depth[l.to] = depth[l.from] + 1;
      }
    }
  }
  instances.forEach(i => { if (depth[i.name] === undefined) depth[i.name] = 0; });
  const cols = {};
  instances.forEach(i => (cols[depth[i.name]] = cols[depth[i.name]] || []).push(i.name));
  const pos = {};
  for (const [d, names] of Object.entries(cols)) {
    names.forEach((n, k) => pos[n] = { x: 100 + d * 330, y: 60 + k * 110 });
  }
  return pos;
}

function drawTopology(state) {
  const svg = document.getElementById("topology");
  svg.replaceChildren();
  const defs = el("defs");
  for (const [st, c] of Object.entries(COLORS)) {
    const m = el("marker", { id: "arrow-" + st, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
    m.appendChild(el("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: c }));
    defs.appendChild(m);
  }
  svg.appendChild(defs);
  const pos = layout(state.instances, state.links);
  let maxY = 0;
  for (const l of state.links) {
    const a = pos[l.from], b = pos[l.to];
    if (!a || !b) continue;
    const g = el("g", { class: "link st-" + l.state, "data-link": l.id, "data-state": l.state });
    g.appendChild(el("line", { x1: a.x + 75, y1: a.y, x2: b.x - 77, y2: b.y, stroke: COLORS[l.state] || "#555", "marker-end": `url(#arrow-${l.state})` }));
    const mx = (a.x + b.x) / 2, my = (a.y + b.y) / 2;
    g.appendChild(el("text", { x: mx, y: my - 10, fill: COLORS[l.state] || "#555" }, `${l.state.toUpperCase()}`));
    g.appendChild(el("text", { x: mx, y: my + 18 }, `backlog ${l.backlog} · lag ${Number(l.lag_s).toFixed(2)} s`));
    svg.appendChild(g);
  }
  for (const i of state.instances) {
    const p = pos[i.name];
    maxY = Math.max(maxY, p.y);
    const g = el("g", { class: "node" + (i.reachable ? "" : " unreachable"), "data-name": i.name, "data-role": i.role, "data-reachable": i.reachable, transform: `translate(${p.x},${p.y})` });
    g.appendChild(el("rect", { x: -75, y: -38, width: 150, height: 76, rx: 8 }));
    g.appendChild(el("text", { class: "name", y: -14 }, i.name));
    g.appendChild(el("text", { y: 5 }, i.role));
    g.appendChild(el("text", { y: 24 }, i.reachable ? `seqno ${i.seqno}` : "unreachable"));
    const t = el("title", {}, i.error ? `${i.key}: ${i.error}` : i.key);
    g.appendChild(t);
    svg.appendChild(g);
  }
  svg.setAttribute("height", Math.max(160, maxY + 60));
  const body = document.querySelector("#links tbody");
  body.replaceChildren();
  for (const l of state.links) {
    const tr = document.createElement("tr");
    tr.dataset.link = l.id;
    cell(tr, l.id);
    cell(tr, l.state, "state st-" + l.state).style.borderLeft = "6px solid";
    cell(tr, l.backlog);
    cell(tr, Number(l.lag_s).toFixed(3));
    cell(tr, l.last_error);
    body.appendChild(tr);
  }
  const down = state.instances.filter(i => !i.reachable).length;
  document.getElementById("summary").textContent =
    `${state.instances.length} instances, ${state.links.length} links` + (down ? `, ${down} unreachable` : "");
  document.getElementById("updated").textContent = "updated " + fmtTime(state.time);
}

// uPlot wants one x array: the union of the series' times, null where a series has no point.
function align(table, field) {
  const names = Object.keys(table).sort();
  const xs = [...new Set(names.flatMap(n => table[n].t))].sort((a, b) => a - b);
  const idx = new Map(xs.map((x, k) => [x, k]));
  const ys = names.map(n => {
    const y = new Array(xs.length).fill(null);
    table[n].t.forEach((t, k) => { y[idx.get(t)] = table[n][field][k]; });
    return y;
  });
  return { names, data: [xs, ...ys] };
}

function plot(id, table, field, unit) {
  const { names, data } = align(table, field);
  const box = document.getElementById(id);
  const key = names.join("|");
  let p = dashboard.plots[id];
  if (!p || p._key !== key) {
    if (p) p.destroy();
    box.replaceChildren();
    const opts = {
      width: Math.max(380, box.clientWidth || 420), height: 220,
      scales: { x: { time: true } },
      axes: [{}, { label: unit, size: 60 }],
      series: [{}, ...names.map((n, k) => ({ label: n, stroke: PALETTE[k % PALETTE.length], width: 2, spanGaps: false, points: { show: data[0].length < 60 } }))],
    };
    p = dashboard.plots[id] = new uPlot(opts, data, box);
    p._key = key;
  } else {
    p.setData(data);
  }
  p._points = data.slice(1).reduce((n, y) => n + y.filter(v => v !== null).length, 0);
  box.dataset.points = p._points;
}

async function getJSON(url) {
  const r = await fetch(url + (location.search || ""), { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

async function tick() {
  try {
    const [state, series] = await Promise.all([getJSON("/api/state"), getJSON("/api/series")]);
    dashboard.state = state; dashboard.series = series;
    drawTopology(state);
    plot("lag-plot", series.links, "lag_s", "seconds");
    plot("backlog-plot", series.links, "backlog", "transactions");
    plot("commit-plot", series.commits, "rate", "tx/s");
    dashboard.polls++;
  } catch (e) {
    dashboard.errors++;
    document.getElementById("summary").textContent = "dashboard unreachable: " + e.message;
  }
}

async function slowTick() {
  try {
    const [schedule, history, lost] = await Promise.all([getJSON("/api/schedule"), getJSON("/api/history"), getJSON("/api/lost")]);
    const body = document.querySelector("#schedule tbody");
    body.replaceChildren();
    if (!schedule.length) {
      const tr = document.createElement("tr"); cell(tr, "no timed work recorded on these instances"); body.appendChild(tr);
    }
    for (const s of schedule) {
      const tr = document.createElement("tr");
      const when = s.kind === "connection document" && s.schedule
        ? `${s.schedule}, ${s.mode}${s.enabled ? "" : " (disabled)"}` : null;
      cell(tr, s.instance); cell(tr, s.name || s.error); cell(tr, s.kind); cell(tr, when); cell(tr, s.last_confirmed);
      cell(tr, s.behind); cell(tr, fmtTime(s.updated)); cell(tr, fmtTime(s.next_run));
      cell(tr, s.error && s.name ? s.error : s.last_result);
      tr.className = s.kind === "connection document" ? "connection" : "spark";
      body.appendChild(tr);
    }
    const h = document.getElementById("history");
    h.replaceChildren();
    for (const [inst, recs] of Object.entries(history)) {
      const t = document.createElement("table");
      t.innerHTML = `<caption>${inst}</caption><tr><th>from seqno</th><th>root primary</th><th>role</th><th>upstream</th><th>created</th></tr>`;
      for (const r of (Array.isArray(recs) ? recs : [])) {
        const tr = document.createElement("tr");
        cell(tr, r.start_seqno); cell(tr, r.root_primary); cell(tr, r.role); cell(tr, r.upstream); cell(tr, fmtTime(r.created));
        t.appendChild(tr);
      }
      h.appendChild(t);
    }
    const l = document.getElementById("lost");
    l.replaceChildren();
    for (const [inst, files] of Object.entries(lost)) {
      const d = document.createElement("div");
      d.innerHTML = `<strong>${inst}</strong>: ` + (files.length ? "" : "none");
      const ul = document.createElement("ul");
      for (const f of files) {
        const li = document.createElement("li");
        const a = document.createElement("a");
        a.href = f.url + (location.search || ""); a.textContent = f.file; a.className = "lost-file";
        li.appendChild(a);
        li.append(` — ${f.transactions ?? "?"} transactions, common seqno ${f.common_seqno ?? "?"}${f.error ? ", " + f.error : ""}`);
        ul.appendChild(li);
      }
      d.appendChild(ul);
      l.appendChild(d);
    }
  } catch (e) {
    dashboard.errors++;
  }
}

tick(); slowTick();
setInterval(tick, 1000);
setInterval(slowTick, 5000);
