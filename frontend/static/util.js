// Small helpers shared by the pages: DOM, formatting, smoothing, sparklines, config flattening.

export const $ = (sel, root = document) => root.querySelector(sel);
export const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));

/** h("div.cls#id", {attr: v, onclick: fn}, ...children) */
export function h(tag, attrs = {}, ...children) {
  const m = tag.match(/^([a-z0-9]+)((?:[.#][\w-]+)*)$/i);
  const el = document.createElement(m ? m[1] : tag);
  if (m?.[2]) {
    for (const part of m[2].match(/[.#][\w-]+/g)) {
      if (part[0] === ".") el.classList.add(part.slice(1));
      else el.id = part.slice(1);
    }
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "html") el.innerHTML = v;
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function fmtNum(v, digits = 4) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return v.toExponential(2);
  return String(Number(v.toPrecision(digits)));
}

export function fmtDuration(sec) {
  if (sec === null || sec === undefined || !Number.isFinite(sec) || sec < 0) return "–";
  sec = Math.round(sec);
  if (sec < 60) return `${sec}s`;
  const m = Math.floor(sec / 60);
  if (m < 60) return `${m}m ${String(sec % 60).padStart(2, "0")}s`;
  const hh = Math.floor(m / 60);
  return `${hh}h ${String(m % 60).padStart(2, "0")}m`;
}

export function fmtAgo(t) {
  if (!t) return "–";
  const d = Date.now() / 1000 - t;
  if (d < 5) return "just now";
  return `${fmtDuration(d)} ago`;
}

export function fmtTime(t) {
  if (!t) return "–";
  const d = new Date(t * 1000);
  return d.toLocaleString(undefined, {
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
  });
}

export function statusBadge(run) {
  let status = run.status;
  if (run.cancel_requested && (status === "running" || status === "queued")) status = "cancelling";
  return h(`span.badge.st-${status}`, { title: run.error || status }, status);
}

/** What a run occupies, in the terms of the machine that holds it ("1 GPU", "1 CPU process",
 * "2 nodes × 8 GPUs"): the API's `resources_text`. */
export function resourcesText(run) {
  return run.resources_text || "–";
}

/** Why a queued run waits (computed by the API from the live workers), as a muted note. */
export function waitingNote(run) {
  if (run.status !== "queued" || !run.waiting_reason) return null;
  return h("div.muted.small.waiting", { title: "why no worker has taken this run yet" }, run.waiting_reason);
}

export const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

// When each run object was first drawn: the server's eta_s is "as of the response", counted down
// from then (no comparison of this browser's clock with the server's).
const RECEIVED = new WeakMap();

/** Progress fraction and ETA (seconds) of a run. The ETA is the server's (`eta_s`, from the run's
 * pace: backend/runs/progress.py), the same on every page, counted down from when it arrived;
 * none for a run not running, being cancelled, or before its first step. `evaluating`: the run
 * is scoring its held-out split, logging no step until it ends (the page gets no new run to
 * count from), so a countdown that runs out there means the evaluation outlasted its estimate:
 * `overdue`, and no ETA rather than a false 0 s. */
export function progress(run) {
  const total = run.total_steps || run.config?.steps || 0;
  const step = run.step || 0;
  const frac = total > 0 ? Math.min(1, step / total) : 0;
  const evaluating = run.status === "running" && run.phase === "evaluating";
  let eta = null;
  let overdue = false;
  if (run.status === "running" && !run.cancel_requested && Number.isFinite(run.eta_s)) {
    const now = Date.now() / 1000;
    if (!RECEIVED.has(run)) RECEIVED.set(run, now);
    eta = Math.max(0, run.eta_s - (now - RECEIVED.get(run)));
    if (evaluating && eta < 1) [eta, overdue] = [null, true];
  }
  return { step, total, frac, eta, evaluating, overdue };
}

/** The ETA as the pages write it: "~40s (evaluating)" while an evaluation runs (its time is an
 * estimate until one is measured), "evaluating, past its estimate" once that ran out, "" with
 * none. */
export function etaLabel(p) {
  if (p.overdue) return "evaluating, past its estimate";
  if (p.eta === null) return "";
  return p.evaluating ? `~${fmtDuration(p.eta)} (evaluating)` : fmtDuration(p.eta);
}

export function progressBar(run) {
  const p = progress(run);
  const label = `${p.step}/${p.total || "?"}`;
  const eta = etaLabel(p);
  const etaText = eta ? (p.overdue ? ` · ${eta}` : ` · ETA ${eta}`) : "";
  const finished = FINISHED.has(run.status);
  return h(
    "div.progress",
    { title: `${Math.round(p.frac * 100)}%${etaText}` },
    h("div.bar", {}, h(`div.fill.st-${run.status}`, { style: `width:${(p.frac * 100).toFixed(1)}%` })),
    h("span.plabel", {}, label, finished ? "" : etaText),
  );
}

// What is moving first (backend/studies/progress.py's STATUS_ORDER).
const STATUS_ORDER = ["running", "queued", "pending", "succeeded", "failed", "cancelled"];

/** "2 running · 3 succeeded · 10 pending" from runs per status (a study's `progress.counts`). */
export function countsText(counts) {
  const rank = (s) => (STATUS_ORDER.includes(s) ? STATUS_ORDER.indexOf(s) : STATUS_ORDER.length);
  return Object.entries(counts)
    .sort((a, b) => rank(a[0]) - rank(b[0]))
    .map(([s, n]) => `${n} ${s}`)
    .join(" · ");
}

/** "1,290/4,500": steps done against steps planned over many runs (a study, a group of runs). */
export function stepsBar(steps, total, title) {
  const frac = total ? Math.min(1, steps / total) : 0;
  return h(
    "div.progress.steps-bar",
    { title, "data-steps": steps, "data-total": total },
    h("div.bar", {}, h("div.fill.st-running", { style: `width:${(frac * 100).toFixed(1)}%` })),
    h("span.plabel", {}, `${steps.toLocaleString()}/${total ? total.toLocaleString() : "?"}`),
  );
}

/** Exponential moving average with TensorBoard-style debiasing; weight in [0, 1). */
export function ema(values, weight) {
  if (!weight || weight <= 0) return values.slice();
  const out = new Array(values.length);
  let last = 0;
  let n = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v === null || v === undefined || !Number.isFinite(v)) {
      out[i] = null;
      continue;
    }
    last = last * weight + (1 - weight) * v;
    n++;
    out[i] = last / (1 - weight ** n);
  }
  return out;
}

/** An inline SVG sparkline of `values` (nulls skipped). `range` ([min, max]) fixes the y-scale,
 * e.g. one shared by every row of a table, and is kept on the SVG as `data-y-range`; without it
 * the line spans its own min to max. */
export function sparkline(values, { width = 110, height = 24, color = "#4f46e5", range = null } = {}) {
  return sparklines([{ ys: values, color }], { width, height, range });
}

/** Several lines in one sparkline (a group's arms), each {xs (default: the index), ys, color},
 * on one x- and y-scale. */
export function sparklines(lines, { width = 110, height = 24, range = null } = {}) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  svg.setAttribute("class", "spark");
  if (range) svg.dataset.yRange = `${range[0]},${range[1]}`;
  const drawn = lines.map((line) => ({
    ...line,
    pts: line.ys
      .map((v, i) => [line.xs ? line.xs[i] : i, v])
      .filter(([x, v]) => x !== null && v !== null && Number.isFinite(v)),
  }));
  const all = drawn.flatMap((l) => l.pts);
  if (!drawn.some((l) => l.pts.length >= 2)) {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", 2);
    t.setAttribute("y", height / 2 + 4);
    t.setAttribute("class", "spark-empty");
    t.textContent = all.length ? fmtNum(all[all.length - 1][1], 3) : "no data";
    svg.append(t);
    return svg;
  }
  const xs = all.map((p) => p[0]);
  const ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs),
    x1 = Math.max(...xs);
  const y0 = range ? range[0] : Math.min(...ys),
    y1 = range ? range[1] : Math.max(...ys);
  const sx = (x) => 1 + ((x - x0) / (x1 - x0 || 1)) * (width - 2);
  // a flat series on its own scale sits mid-cell (at the bottom, it read as the column's minimum)
  const sy = (y) => (y1 === y0 ? height / 2 : height - 2 - ((y - y0) / (y1 - y0)) * (height - 4));
  const titles = [];
  for (const { pts, color = "#4f46e5", name } of drawn) {
    if (!pts.length) continue;
    const d = pts.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", d);
    path.setAttribute("fill", "none");
    path.setAttribute("stroke", color);
    path.setAttribute("stroke-width", "1.3");
    svg.append(path);
    const last = pts[pts.length - 1];
    const dot = document.createElementNS(ns, "circle");
    dot.setAttribute("cx", sx(last[0]).toFixed(1));
    dot.setAttribute("cy", sy(last[1]).toFixed(1));
    dot.setAttribute("r", "1.8");
    dot.setAttribute("fill", color);
    svg.append(dot);
    const own = pts.map((p) => p[1]);
    titles.push(
      `${name ? `${name}: ` : ""}last ${fmtNum(last[1])} · min ${fmtNum(Math.min(...own))} · max ${fmtNum(Math.max(...own))}`,
    );
  }
  const title = document.createElementNS(ns, "title");
  title.textContent = titles.join("\n");
  svg.append(title);
  return svg;
}

const isObject = (v) => Boolean(v) && typeof v === "object";

/** {a: {b: 1}, rewards: [{name: "verifier"}]} → {"a.b": 1, "rewards.0.name": "verifier"}: a list
 * holding objects (a run's rewards, its benchmarks) is flattened with indices, so every value
 * is one a table can print; a list of plain values stays one value ("+, -"). */
export function flatten(obj, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(obj || {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (isObject(v) && (!Array.isArray(v) || v.some(isObject))) flatten(v, key, out);
    else out[key] = v;
  }
  return out;
}

export function getPath(obj, path) {
  let cur = obj;
  for (const part of path.split(".")) {
    if (cur === null || cur === undefined) return undefined;
    cur = cur[part];
  }
  return cur;
}

export function fmtValue(v) {
  if (v === undefined) return "–";
  if (v === null) return "null";
  // Objects as JSON text, never "[object Object]" (flatten spells them out where it can).
  if (Array.isArray(v) ? v.some(isObject) : isObject(v)) return JSON.stringify(v);
  if (Array.isArray(v)) return v.join(", ");
  if (typeof v === "number") return fmtNum(v, 6);
  return String(v);
}

let toastTimer = null;
export function toast(msg, kind = "info") {
  const el = document.getElementById("toast");
  if (!el) return;
  el.textContent = msg;
  el.className = `toast toast-${kind}`;
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (el.hidden = true), kind === "error" ? 7000 : 3500);
}

export function setConn(state) {
  const el = document.getElementById("conn");
  if (!el) return;
  el.className = `conn conn-${state}`;
  el.title = { live: "live: streaming updates", off: "not connected (retrying)", done: "run finished" }[state] || state;
  el.textContent = { live: "● live", off: "○ offline", done: "" }[state] || "";
}

export function runLabel(run) {
  return run.name ? `${run.name}` : `run ${run.id}`;
}

/** A stable, distinct colour per index. */
export const PALETTE = [
  "#4f46e5",
  "#e11d48",
  "#059669",
  "#d97706",
  "#0891b2",
  "#7c3aed",
  "#db2777",
  "#65a30d",
  "#2563eb",
  "#ea580c",
  "#0d9488",
  "#9333ea",
  "#475569",
  "#ca8a04",
];
export const color = (i) => PALETTE[((i % PALETTE.length) + PALETTE.length) % PALETTE.length];

export function debounce(fn, ms) {
  let t = null;
  return (...args) => {
    clearTimeout(t);
    t = setTimeout(() => fn(...args), ms);
  };
}

/** A legend's n: the seeds (or runs) that have data at a step. A legend cannot follow the step,
 * so it gives their range over the steps ("n = 1–3 of 5"; "n = 5" where every step has all of
 * them) and the hover gives n at each step; "of" is said where no step has them all. */
export function seedsWithData(counts, of) {
  const seen = counts.filter((n) => n > 0);
  if (!seen.length) return `n = 0 of ${of}`;
  const lo = Math.min(...seen);
  const hi = Math.max(...seen);
  return `n = ${lo === hi ? lo : `${lo}–${hi}`}${hi < of ? ` of ${of}` : ""}`;
}

/** Resolves once the browser has painted the page as it is now: a page drawing many charts in
 * one go shows the first before drawing the next (a background tab paints nothing: after `ms`). */
export function afterPaint(ms = 200) {
  return new Promise((resolve) => {
    requestAnimationFrame(() => setTimeout(resolve, 0));
    setTimeout(resolve, ms);
  });
}

// ---- scroll cues -------------------------------------------------------------------------------
// A table wider than its box scrolls inside it; its box gets cue-right / cue-left (an edge shadow,
// app.css) while there is more of it that way, so nothing looks cut off. Every scrolling box:
// .table-wrap and [data-scroll-x]; kept up on scroll, resize and whenever the page changes.
const SCROLLERS = ".table-wrap, [data-scroll-x]";

function updateCue(el) {
  const more = el.scrollWidth - el.clientWidth;
  el.classList.toggle("cue-right", more > 1 && el.scrollLeft < more - 1);
  el.classList.toggle("cue-left", more > 1 && el.scrollLeft > 1);
}

function updateCues() {
  for (const el of document.querySelectorAll(SCROLLERS)) updateCue(el);
}

if (typeof window !== "undefined" && !window.__scrollCues) {
  window.__scrollCues = true;
  let queued = false;
  const soon = () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      updateCues();
    });
  };
  document.addEventListener("scroll", (ev) => ev.target?.matches?.(SCROLLERS) && updateCue(ev.target), true);
  window.addEventListener("resize", soon);
  new MutationObserver(soon).observe(document.documentElement, { childList: true, subtree: true });
  soon();
}
