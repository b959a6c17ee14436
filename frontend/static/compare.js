// Compare page: overlay runs per metric, group by any config path with mean ± std across seeds,
// EMA smoothing, x-axis by step / wall time / rollouts seen, an A − B difference curve (runs, or
// groups against a baseline group: paired by seed when the seeds match, Welch otherwise) and a
// config table of what differs. The whole view lives in the query string, so a link shares it.
import { errorText, get, qs } from "/static/api.js";
import { helpOf, isDeterministic, KEY_METRICS, ROLLOUTS_AXIS, unitOf } from "/static/catalogue.js";
import {
  bandTraces,
  baseLayout,
  chartCard,
  lineTraces,
  noteAnnotation,
  react,
  sampledAnnotation,
  withNotes,
  X_TITLES,
} from "/static/charts.js";
import {
  $,
  color,
  debounce,
  ema,
  FINISHED,
  flatten,
  fmtNum,
  fmtValue,
  getPath,
  h,
  statusBadge,
  toast,
} from "/static/util.js";

const DEFAULT_KEYS = KEY_METRICS;
const ROLLOUTS_KEY = ROLLOUTS_AXIS;
const TOP_LEVEL = ["algorithm", "task", "model", "status", "seed", "group_id", "owner"];

const url = new URLSearchParams(location.search);
const list = (v) =>
  v
    ? v
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean)
    : [];
const DEFAULT_SMOOTH = 0.5;
const S = {
  runIds: list(url.get("runs")).map(Number).filter(Number.isFinite),
  keys: list(url.get("keys")),
  group: url.get("group") || "",
  x: url.get("x") || "step",
  // Noisy series are smoothed by default (deterministic ones never: isDeterministic); "0" in
  // the URL turns it off.
  smooth: url.has("smooth") ? Number(url.get("smooth")) : DEFAULT_SMOOTH,
  diff: list(url.get("diff")).map(Number),
  diffKey: url.get("dkey") || "",
  base: url.get("base") || "", // baseline group of the group difference curves
  showAll: url.get("all") === "1",
  runs: new Map(), // id → Run
  allRuns: [], // picker list
  keysAvailable: [],
  data: {}, // id → {key: Series}
  cards: new Map(),
  rev: 0,
};

function syncUrl() {
  const q = qs({
    runs: S.runIds,
    keys: S.keys,
    group: S.group,
    x: S.x === "step" ? "" : S.x,
    smooth: S.smooth !== DEFAULT_SMOOTH ? S.smooth.toFixed(2) : "",
    diff: S.diff.length === 2 ? S.diff : "",
    dkey: S.diff.length === 2 || S.group ? diffKey() : "",
    base: S.group ? S.base : "",
    all: S.showAll ? "1" : "",
  });
  history.replaceState(null, "", `/compare${q}`);
}

/** A run's colour: its group's when grouped (the same on charts, sidebar and config table). */
function runColor(id) {
  const grouped = groups();
  if (grouped) {
    const labels = [...grouped.keys()];
    const at = labels.findIndex((label) => grouped.get(label).includes(id));
    if (at >= 0) return color(at);
  }
  return color(S.runIds.indexOf(id));
}
const runName = (run) => `${run.name || `run ${run.id}`} #${run.id}`;

// ---- loading ------------------------------------------------------------------------------------
async function loadPicker() {
  try {
    const data = await get(`/api/runs${qs({ limit: 200, sort: "-created_at" })}`);
    S.allRuns = data.items;
    for (const r of data.items) if (S.runIds.includes(r.id)) S.runs.set(r.id, r);
  } catch (err) {
    toast(`Could not list runs: ${errorText(err)}`, "error");
  }
  const missing = S.runIds.filter((id) => !S.runs.has(id));
  if (missing.length) {
    try {
      const found = await get(`/api/runs${qs({ ids: missing, limit: 500 })}`);
      for (const r of found.items) {
        S.runs.set(r.id, r);
        S.allRuns.push(r);
      }
    } catch (err) {
      toast(`Could not load runs: ${errorText(err)}`, "error");
    }
    for (const id of missing.filter((x) => !S.runs.has(x))) {
      S.runIds = S.runIds.filter((x) => x !== id);
      toast(`Run ${id} not found; removed from the view`, "error");
    }
  }
}

async function loadKeys() {
  const sets = await Promise.all(
    S.runIds.map((id) =>
      get(`/api/runs/${id}/metrics/keys`)
        .then((d) => d.keys)
        .catch(() => []),
    ),
  );
  const all = new Set();
  for (const ks of sets) for (const k of ks) all.add(k);
  S.keysAvailable = [...all].sort();
  if (!S.keys.length) S.keys = DEFAULT_KEYS.filter((k) => all.has(k));
  if (!S.keys.length) S.keys = S.keysAvailable.slice(0, 4);
}

async function loadData() {
  S.data = {};
  if (!S.runIds.length || !S.keys.length) return;
  const keys = [...new Set([...S.keys, ...(S.x === "rollouts" ? [ROLLOUTS_KEY] : [])])].slice(0, 50);
  const ids = S.runIds.slice(0, 50);
  const data = await get(`/api/compare${qs({ runs: ids, keys, max_points: 1000 })}`);
  for (const [rid, entry] of Object.entries(data.runs || {})) S.data[Number(rid)] = entry.series || {};
  S.rev += 1;
}

async function refreshRuns() {
  if (!S.runIds.length) return;
  try {
    // One request for all runs; a run deleted meanwhile keeps its last copy.
    const found = await get(`/api/runs${qs({ ids: S.runIds, limit: 500 })}`);
    for (const r of found.items) S.runs.set(r.id, r);
  } catch {
    /* transient: keep the last copies */
  }
}

// ---- x axis and alignment -----------------------------------------------------------------------
function interp(xs, ys, x) {
  if (!xs.length || x < xs[0] || x > xs[xs.length - 1]) return null;
  let lo = 0,
    hi = xs.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid;
    else hi = mid;
  }
  if (xs[hi] === x) return ys[hi];
  const t = (x - xs[lo]) / (xs[hi] - xs[lo] || 1);
  if (ys[lo] === null || ys[hi] === null) return null;
  return ys[lo] + t * (ys[hi] - ys[lo]);
}

/** x values for a run's steps under the current x mode (wall time in minutes since the run started). */
function xFor(runId, steps, wall) {
  if (S.x === "wall_time") {
    const run = S.runs.get(runId);
    const w = wall && wall.length === steps.length ? wall : null;
    const start = run?.started_at || w?.[0] || 0;
    if (w) return w.map((t) => (t - start) / 60);
    return steps;
  }
  if (S.x === "rollouts") {
    const r = S.data[runId]?.[ROLLOUTS_KEY];
    if (!r?.steps.length) return steps;
    return steps.map((st) => interp(r.steps, r.values, st));
  }
  return steps;
}

function groupValue(run, path) {
  if (TOP_LEVEL.includes(path)) return run[path];
  if (path === "tags") return (run.tags || []).join(",");
  const v = getPath(run.config || {}, path);
  return v === undefined ? getPath(run, path) : v;
}

function groups() {
  if (!S.group) return null;
  const by = new Map();
  for (const id of S.runIds) {
    const run = S.runs.get(id);
    if (!run) continue;
    const label = `${S.group}=${fmtValue(groupValue(run, S.group))}`;
    if (!by.has(label)) by.set(label, []);
    by.get(label).push(id);
  }
  return by;
}

/** A run's x value at `step` under the current x mode. */
function xAt(id, s, step) {
  return xFor(id, [step], s.wall_time?.length ? [interp(s.steps, s.wall_time, step)] : null)[0];
}

/** Mean and std across runs on the union of their steps (each run interpolated inside its range). */
function aggregate(ids, key) {
  const series = ids.map((id) => [id, S.data[id]?.[key]]).filter(([, s]) => s?.steps.length);
  if (!series.length) return null;
  const stepSet = new Set();
  for (const [, s] of series) for (const st of s.steps) stepSet.add(st);
  const steps = [...stepSet].sort((a, b) => a - b);
  const mean = [],
    lo = [],
    hi = [],
    xs = [],
    counts = [];
  for (const st of steps) {
    const vals = [],
      xv = [];
    for (const [id, s] of series) {
      const v = interp(s.steps, s.values, st);
      if (v === null || !Number.isFinite(v)) continue;
      vals.push(v);
      const x = xAt(id, s, st);
      if (x !== null) xv.push(x);
    }
    if (!vals.length) continue;
    const m = vals.reduce((a, b) => a + b, 0) / vals.length;
    const sd = Math.sqrt(vals.reduce((a, b) => a + (b - m) ** 2, 0) / vals.length);
    mean.push(m);
    lo.push(m - sd);
    hi.push(m + sd);
    counts.push(vals.length);
    xs.push(xv.length ? xv.reduce((a, b) => a + b, 0) / xv.length : st);
  }
  return {
    xs,
    mean,
    lo,
    hi,
    counts,
    n: series.length,
    sampled: series.some(([, s]) => s.sampled),
    series: series.map(([, s]) => s),
  };
}

const diffKey = () => (S.keys.includes(S.diffKey) ? S.diffKey : S.keys[0] || "");

// ---- group difference: group B − baseline group A, paired by seed when the seeds match ------------
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
const variance = (xs, m = mean(xs)) => xs.reduce((a, b) => a + (b - m) ** 2, 0) / (xs.length - 1);
/** t_{0.975, df}; a fractional (Welch) df is rounded down, which widens the band a little. */
const t975 = (df) => (df >= 1 ? (T975[Math.floor(df) - 1] ?? 1.96) : null);

/** seed → run id for a group whose runs all have distinct seeds; null otherwise. */
function seedMap(ids) {
  const out = new Map();
  for (const id of ids) {
    const seed = S.runs.get(id)?.seed;
    if (seed === null || seed === undefined || out.has(seed)) return null;
    out.set(seed, id);
  }
  return out;
}

/** How a group difference is computed: paired over the seeds both groups ran (at least 2 of
 * them), else unpaired (Welch). */
function pairing(idsA, idsB) {
  const a = seedMap(idsA);
  const b = seedMap(idsB);
  const common = a && b ? [...a.keys()].filter((seed) => b.has(seed)).sort((x, y) => x - y) : [];
  if (common.length >= 2) return { paired: true, pairs: common.map((seed) => [a.get(seed), b.get(seed)]) };
  return { paired: false };
}

/** B − A per step on the union of steps: paired, the mean of per-seed differences with a t band
 * over the seeds that reached the step; unpaired, the difference of means with a Welch band.
 * `n` is the seeds (pairs) contributing at each step, `full` how many there could be. */
function groupDifference(idsA, idsB, key) {
  const series = (id) => S.data[id]?.[key];
  const at = (id, st) => {
    const s = series(id);
    if (!s?.steps.length) return null;
    const v = interp(s.steps, s.values, st);
    return v === null || !Number.isFinite(v) ? null : v;
  };
  const stepSet = new Set();
  for (const id of [...idsA, ...idsB]) for (const st of series(id)?.steps || []) stepSet.add(st);
  const steps = [...stepSet].sort((x, y) => x - y);
  const how = pairing(idsA, idsB);
  const out = { paired: how.paired, xs: [], mean: [], lo: [], hi: [], n: [], full: 0, sampled: false };
  out.full = how.paired ? how.pairs.length : idsA.length + idsB.length;
  out.sampled = [...idsA, ...idsB].some((id) => series(id)?.sampled);
  const xOf = (ids, st) => {
    const xv = ids.map((id) => (series(id) ? xAt(id, series(id), st) : null)).filter((x) => x !== null);
    return xv.length ? mean(xv) : st;
  };
  for (const st of steps) {
    let m, half, n;
    if (how.paired) {
      const d = how.pairs
        .map(([a, b]) => [at(a, st), at(b, st)])
        .filter(([va, vb]) => va !== null && vb !== null)
        .map(([va, vb]) => vb - va);
      if (!d.length) continue;
      n = d.length;
      m = mean(d);
      half = n > 1 ? (t975(n - 1) * Math.sqrt(variance(d, m))) / Math.sqrt(n) : null;
    } else {
      const va = idsA.map((id) => at(id, st)).filter((v) => v !== null);
      const vb = idsB.map((id) => at(id, st)).filter((v) => v !== null);
      if (!va.length || !vb.length) continue;
      n = va.length + vb.length;
      m = mean(vb) - mean(va);
      half = null;
      if (va.length > 1 && vb.length > 1) {
        const qa = variance(va) / va.length;
        const qb = variance(vb) / vb.length;
        const df = (qa + qb) ** 2 / (qa ** 2 / (va.length - 1) + qb ** 2 / (vb.length - 1) || 1);
        half = (t975(df) ?? 1.96) * Math.sqrt(qa + qb);
      }
    }
    out.xs.push(xOf([...idsA, ...idsB], st));
    out.mean.push(m);
    out.lo.push(half === null ? null : m - half);
    out.hi.push(half === null ? null : m + half);
    out.n.push(n);
  }
  return out.xs.length ? out : null;
}

function groupDiffFigure(key) {
  const grouped = groups();
  if (!grouped || grouped.size < 2) return null;
  const labels = [...grouped.keys()];
  const base = baseGroup(labels);
  const smooth = isDeterministic(key) ? 0 : S.smooth;
  const traces = [];
  const used = [];
  const kinds = new Set();
  labels.forEach((label, gi) => {
    if (label === base) return;
    const diff = groupDifference(grouped.get(base), grouped.get(label), key);
    if (!diff) return;
    kinds.add(diff.paired ? "paired" : "welch");
    const c = color(gi);
    const name = `${label} − ${base}`;
    const m = ema(diff.mean, smooth);
    if (diff.lo.some((v) => v !== null))
      traces.push(
        ...bandTraces(diff.xs, ema(diff.lo, smooth), ema(diff.hi, smooth), {
          color: c,
          name: `${name} 95% CI`,
          group: name,
        }),
      );
    const unit = diff.paired ? "seeds" : "runs";
    const text = diff.n.map((k) => `n = ${k} of ${diff.full} ${unit}`);
    const full = m.map((v, i) => (diff.n[i] === diff.full ? v : null));
    const short = m.map((v, i) =>
      diff.n[i] < diff.full || diff.n[i - 1] < diff.full || diff.n[i + 1] < diff.full ? v : null,
    );
    const line = { x: diff.xs, text, type: "scatter", mode: "lines", legendgroup: name, customdata: diff.n };
    const hovertemplate = `%{y:+.4g} · %{text}<extra>${name}</extra>`;
    traces.push({
      ...line,
      y: full,
      line: { width: 2, color: c },
      name: `${name} (${diff.paired ? `paired, ${diff.full} seeds` : "unpaired"})`,
      meta: { pairing: diff.paired ? "paired" : "welch", raw: diff.mean, n: diff.n },
      hovertemplate,
    });
    if (short.some((v) => v !== null))
      traces.push({
        ...line,
        y: short,
        line: { width: 1.5, color: c, dash: "dot" },
        name: `${name}: fewer`,
        showlegend: false,
        hovertemplate,
      });
    used.push(...[...grouped.get(base), ...grouped.get(label)].map((id) => S.data[id]?.[key]).filter(Boolean));
  });
  if (!traces.length) return null;
  const layout = baseLayout({ uirevision: `${S.x}|gdiff|${base}`, xTitle: X_TITLES[S.x], yTitle: unitOf(key) });
  layout.shapes = [
    { type: "line", xref: "paper", x0: 0, x1: 1, y0: 0, y1: 0, line: { color: "#9ca3af", width: 1, dash: "dot" } },
  ];
  const said = [];
  if (kinds.has("paired")) said.push("paired by seed: mean of per-seed differences, band = 95% t CI over seeds");
  if (kinds.has("welch")) said.push("unpaired (seeds differ): difference of group means, band = 95% Welch CI");
  said.push("dotted: fewer seeds");
  if (smooth) said.push(`EMA smoothing ${smooth.toFixed(2)}`);
  const notes = [...sampledAnnotation(used), noteAnnotation(said.join(" · "))];
  if (notes.length > 1) {
    notes[0].text = notes.map((n) => n.text).join(" · ");
    notes.length = 1;
  }
  withNotes(layout, notes);
  return { traces, layout, pairing: [...kinds].join(",") };
}

/** The baseline group: the one chosen if it is still a group, else the first. */
function baseGroup(labels) {
  return labels.includes(S.base) ? S.base : labels[0];
}

// ---- charts -------------------------------------------------------------------------------------
function metricFigure(key) {
  const smooth = isDeterministic(key) ? 0 : S.smooth; // schedules are exact: never smoothed
  const traces = [];
  const used = [];
  const grouped = groups();
  if (grouped) {
    let gi = 0;
    for (const [label, ids] of grouped) {
      const agg = aggregate(ids, key);
      const c = color(gi++);
      if (!agg) continue;
      used.push(...agg.series);
      const m = ema(agg.mean, smooth);
      const lo = ema(agg.lo, smooth),
        hi = ema(agg.hi, smooth);
      if (agg.n > 1) {
        traces.push(...bandTraces(agg.xs, lo, hi, { color: c, name: `${label} ±std`, group: label, opacity: 0.16 }));
      }
      // The mean is drawn solid only where every run of the group has reached the step; where
      // fewer have, it is dotted and the hover says how many (a dropped seed is never silent).
      const text = agg.counts.map((k) => `n = ${k} of ${agg.n}`);
      const full = m.map((v, i) => (agg.counts[i] === agg.n ? v : null));
      const short = m.map((v, i) =>
        agg.counts[i] < agg.n || agg.counts[i - 1] < agg.n || agg.counts[i + 1] < agg.n ? v : null,
      );
      traces.push({
        x: agg.xs,
        y: full,
        text,
        type: "scatter",
        mode: "lines",
        line: { width: 2, color: c },
        name: `${label} (n=${agg.n})`,
        legendgroup: label,
        hovertemplate: `%{y:.4g} · %{text}<extra>${label}</extra>`,
      });
      if (short.some((v) => v !== null)) {
        traces.push({
          x: agg.xs,
          y: short,
          text,
          type: "scatter",
          mode: "lines",
          line: { width: 1.5, color: c, dash: "dot" },
          name: `${label}: fewer runs`,
          legendgroup: label,
          showlegend: false,
          hovertemplate: `%{y:.4g} · %{text}<extra>${label}</extra>`,
        });
      }
    }
  } else {
    for (const id of S.runIds) {
      const s = S.data[id]?.[key];
      const run = S.runs.get(id);
      if (!s?.steps.length || !run) continue;
      used.push(s);
      traces.push(
        ...lineTraces(xFor(id, s.steps, s.wall_time), s, {
          name: runName(run),
          color: runColor(id),
          smooth,
          group: `run${id}`,
        }),
      );
    }
  }
  if (!traces.length) return null;
  const layout = baseLayout({ uirevision: `${S.x}|${S.group}`, xTitle: X_TITLES[S.x], yTitle: unitOf(key) });
  const notes = sampledAnnotation(used);
  if (grouped && [...grouped.values()].some((ids) => ids.length > 1))
    notes.push(noteAnnotation("line = mean across runs (dotted: fewer runs) · band = ±1 std"));
  if (smooth) notes.push(noteAnnotation(`EMA smoothing ${smooth.toFixed(2)}`));
  if (notes.length > 1) {
    notes[0].text = notes.map((n) => n.text).join(" · ");
    notes.length = 1;
  }
  withNotes(layout, notes);
  return { traces, layout };
}

function diffFigure(key) {
  const [a, b] = S.diff;
  const sa = S.data[a]?.[key];
  const sb = S.data[b]?.[key];
  if (!sa || !sb || !sa.steps.length || !sb.steps.length) return null;
  const steps = [],
    vals = [],
    wall = [];
  sa.steps.forEach((st, i) => {
    const vb = interp(sb.steps, sb.values, st);
    if (vb === null || sa.values[i] === null) return;
    steps.push(st);
    vals.push(sa.values[i] - vb);
    wall.push(sa.wall_time ? sa.wall_time[i] : null);
  });
  if (!steps.length) return null;
  const s = { steps, values: vals, sampled: false };
  const smooth = isDeterministic(key) ? 0 : S.smooth;
  const traces = lineTraces(xFor(a, steps, wall), s, { name: `#${a} − #${b}`, color: "#7c3aed", smooth });
  const layout = baseLayout({ uirevision: `${S.x}|diff`, xTitle: X_TITLES[S.x], yTitle: unitOf(key) });
  layout.shapes = [
    { type: "line", xref: "paper", x0: 0, x1: 1, y0: 0, y1: 0, line: { color: "#9ca3af", width: 1, dash: "dot" } },
  ];
  return { traces, layout };
}

function draw() {
  const container = $("#compare-charts");
  const wanted = S.runIds.length ? S.keys.map((k) => ({ id: `m-${k}`, key: k, title: k, help: helpOf(k) })) : [];
  if (S.diff.length === 2 && S.runIds.length && diffKey()) {
    const k = diffKey();
    wanted.unshift({
      id: `d-${k}`,
      key: k,
      diff: true,
      title: `Difference #${S.diff[0]} − #${S.diff[1]}: ${k}`,
      help: "Run A minus run B at A's steps (B interpolated inside its range).",
    });
  }
  const grouped = groups();
  if (grouped && grouped.size > 1 && S.runIds.length && diffKey()) {
    const k = diffKey();
    const base = baseGroup([...grouped.keys()]);
    wanted.unshift({
      id: `g-${k}`,
      key: k,
      gdiff: true,
      title: `Group difference against ${base}: ${k}`,
      help:
        "Each group minus the baseline group. Paired by seed when both groups ran the same seeds " +
        "(the mean of per-seed differences, 95% t band over seeds); otherwise the difference of " +
        "the group means with a 95% Welch band. Dotted where fewer seeds have reached the step.",
    });
  }
  const wantedIds = new Set(wanted.map((w) => w.id));
  for (const [id, entry] of S.cards) {
    if (!wantedIds.has(id)) {
      if (entry.plot.dataset.state === "plotted") window.Plotly.purge(entry.plot);
      entry.card.remove();
      S.cards.delete(id);
    }
  }
  for (const w of wanted) {
    let entry = S.cards.get(w.id);
    if (!entry) {
      const { card, plot } = chartCard(w.id.replace(/[^\w-]/g, "_"), w.title, w.help);
      card.dataset.key = w.key;
      if (w.diff) card.dataset.diff = "1";
      entry = { card, plot };
      S.cards.set(w.id, entry);
    }
    container.append(entry.card); // keeps order
    const fig = w.gdiff ? groupDiffFigure(w.key) : w.diff ? diffFigure(w.key) : metricFigure(w.key);
    if (w.gdiff) entry.card.dataset.pairing = fig?.pairing || "";
    if (!fig) {
      if (entry.plot.dataset.state === "plotted") window.Plotly.purge(entry.plot);
      entry.plot.dataset.state = "empty";
      entry.card.classList.add("empty-chart");
      entry.plot.replaceChildren(h("span", {}, "no data for the selected runs"));
      continue;
    }
    if (entry.plot.dataset.state !== "plotted") {
      entry.plot.replaceChildren();
      entry.card.classList.remove("empty-chart");
      entry.plot.dataset.state = "plotted";
    }
    fig.layout.datarevision = `${S.rev}|${S.smooth}|${S.group}|${S.x}`;
    react(entry.plot, fig.traces, fig.layout);
  }
  renderGroupSummary();
  $("#compare-empty").hidden = S.runIds.length > 0;
  const n = S.runIds.length;
  $("#compare-sub").textContent = n
    ? `${n} run${n === 1 ? "" : "s"} · ${S.keys.length} metric${S.keys.length === 1 ? "" : "s"}`
    : "";
}

// ---- per-group summary ---------------------------------------------------------------------------
const SUMMARY_LAST_N = 3;
// Student t quantiles t_{0.975, df} for df = 1..30 (beyond, the normal's 1.96 is within 4%).
const T975 = [
  12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.16, 2.145, 2.131, 2.12, 2.11,
  2.101, 2.093, 2.086, 2.08, 2.074, 2.069, 2.064, 2.06, 2.056, 2.052, 2.048, 2.045, 2.042,
];

/** Mean of a run's last N logged values of `key` (its steady level, not one noisy step). */
function lastMean(id, key) {
  const values = (S.data[id]?.[key]?.values || []).filter((v) => v !== null && Number.isFinite(v));
  const tail = values.slice(-SUMMARY_LAST_N);
  return tail.length ? tail.reduce((a, b) => a + b, 0) / tail.length : null;
}

/** Per group and metric: the mean over runs of each run's last-N mean, its 95% t CI, and n. */
function renderGroupSummary() {
  const table = $("#group-summary");
  if (!table) return;
  const grouped = groups() || new Map(S.runIds.map((id) => [runName(S.runs.get(id) || { id }), [id]]));
  const rows = [];
  let gi = 0;
  for (const [label, ids] of grouped) {
    const c = groups() ? color(gi++) : runColor(ids[0]);
    for (const key of S.keys) {
      const values = ids.map((id) => lastMean(id, key)).filter((v) => v !== null);
      if (!values.length) continue;
      const n = values.length;
      const mean = values.reduce((a, b) => a + b, 0) / n;
      const sd = n > 1 ? Math.sqrt(values.reduce((a, b) => a + (b - mean) ** 2, 0) / (n - 1)) : null;
      const half = sd === null ? null : ((T975[n - 2] ?? 1.96) * sd) / Math.sqrt(n);
      rows.push(
        h(
          "tr",
          {},
          h("td", {}, h("span.swatch", { style: `background:${c}` }), " ", label),
          h("td.mono", {}, key),
          h("td.num", {}, `${n} of ${ids.length}`),
          h("td.num", {}, fmtNum(mean)),
          h("td.num", {}, half === null ? "–" : `± ${fmtNum(half, 3)}`),
        ),
      );
    }
  }
  table.replaceChildren(
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ...["group", "metric", "n", `mean of last ${SUMMARY_LAST_N}`, "95% CI (t)"].map((t) => h("th", {}, t)),
      ),
    ),
    h("tbody", {}, ...rows),
  );
}

// ---- config diff ---------------------------------------------------------------------------------
function renderConfigDiff() {
  const table = $("#config-diff");
  const runs = S.runIds.map((id) => S.runs.get(id)).filter(Boolean);
  if (!runs.length) {
    table.replaceChildren();
    return;
  }
  const rows = new Map();
  const add = (key, getter) => rows.set(key, runs.map(getter));
  for (const k of ["algorithm", "task", "model", "seed", "status"]) add(k, (r) => (k === "status" ? r.status : r[k]));
  add("tags", (r) => r.tags || []);
  const flats = runs.map((r) => flatten(r.config || {}));
  const allKeys = new Set();
  for (const f of flats) for (const k of Object.keys(f)) allKeys.add(k);
  for (const k of [...allKeys].sort())
    if (!["algorithm", "seed", "task.name", "model.name"].includes(k))
      rows.set(
        k,
        flats.map((f) => f[k]),
      );
  const differs = (vals) => new Set(vals.map((v) => JSON.stringify(v ?? null))).size > 1;
  const shown = [...rows].filter(([, vals]) => S.showAll || differs(vals));
  const head = h(
    "tr",
    {},
    h("th", {}, "key"),
    runs.map((r) =>
      h(
        "th",
        {},
        h("span.swatch", { style: `background:${runColor(r.id)}` }),
        " ",
        h("a", { href: `/runs/${r.id}` }, runName(r)),
      ),
    ),
  );
  const body = shown.length
    ? shown.map(([k, vals]) => {
        const d = differs(vals);
        return h(
          "tr",
          { "data-key": k },
          h("td", {}, k),
          vals.map((v) =>
            h(
              `td${d ? ".differs" : ""}`,
              {},
              k === "status" ? statusBadge(runs[vals.indexOf(v)] || runs[0]) : fmtValue(v),
            ),
          ),
        );
      })
    : [
        h(
          "tr",
          {},
          h("td.muted", { colspan: runs.length + 1 }, "All configs are identical (tick “show all keys” to list them)."),
        ),
      ];
  // Last values of the charted metrics, for a quick numeric comparison.
  const lastRows = S.keys.map((k) =>
    h(
      "tr.summary-row",
      {},
      h("td", {}, `last ${k}`),
      runs.map((r) => {
        const s = S.data[r.id] && S.data[r.id][k];
        const v = s?.values.length ? s.values[s.values.length - 1] : r.summary ? r.summary[k] : undefined;
        return h("td", {}, fmtNum(v));
      }),
    ),
  );
  const sep = h("tr.sep", {}, h("td", { colspan: runs.length + 1 }, "last logged values"));
  table.replaceChildren(h("thead", {}, head), h("tbody", {}, body, lastRows.length ? sep : null, lastRows));
}

// ---- sidebar -------------------------------------------------------------------------------------
function renderRunList() {
  const filter = $("#run-filter").value.trim().toLowerCase();
  const sorted = [...S.allRuns].sort((a, b) => S.runIds.includes(b.id) - S.runIds.includes(a.id) || b.id - a.id);
  const seen = new Set();
  const items = [];
  for (const r of sorted) {
    if (seen.has(r.id)) continue;
    seen.add(r.id);
    const label = `${runName(r)} ${r.algorithm || ""} ${(r.tags || []).join(" ")}`.toLowerCase();
    if (filter && !label.includes(filter) && !S.runIds.includes(r.id)) continue;
    const checked = S.runIds.includes(r.id);
    items.push(
      h(
        "label",
        { title: `${runName(r)} · ${r.algorithm} · ${r.status}` },
        h("input", { type: "checkbox", value: r.id, checked, "aria-label": `compare run ${r.id}` }),
        h("span.swatch", { style: `background:${checked ? runColor(r.id) : "#e5e7eb"}` }),
        h("span", {}, runName(r)),
        h("span.muted.small", {}, ` ${r.algorithm || ""}`),
      ),
    );
  }
  $("#run-list").replaceChildren(...(items.length ? items : [h("span.muted", {}, "no runs")]));
  // A/B pickers
  for (const [sel, idx] of [
    ["#diff-a", 0],
    ["#diff-b", 1],
  ]) {
    const el = $(sel);
    el.replaceChildren(
      h("option", { value: "" }, idx ? "B: –" : "A: –"),
      ...S.runIds.map((id) => h("option", { value: id }, `${idx ? "B" : "A"}: #${id}`)),
    );
    el.value = S.diff.length === 2 ? String(S.diff[idx]) : "";
  }
  renderBaseSelect();
  $("#diff-key").replaceChildren(...S.keys.map((k) => h("option", { value: k }, k)));
  $("#diff-key").value = diffKey();
  // group-by suggestions: top-level fields and config paths that differ between the chosen runs
  const runs = S.runIds.map((id) => S.runs.get(id)).filter(Boolean);
  const flats = runs.map((r) => flatten(r.config || {}));
  const keys = new Set();
  for (const f of flats) for (const k of Object.keys(f)) keys.add(k);
  const differing = [...keys].filter((k) => new Set(flats.map((f) => JSON.stringify(f[k] ?? null))).size > 1);
  $("#group-options").replaceChildren(
    ...["algorithm", "task", "model", ...differing.filter((k) => k !== "algorithm")].map((k) =>
      h("option", { value: k }),
    ),
  );
}

/** The baseline-group picker, shown while the runs are grouped. */
function renderBaseSelect() {
  const grouped = groups();
  const labels = grouped ? [...grouped.keys()] : [];
  $("#diff-base-row").hidden = labels.length < 2;
  $("#diff-base").replaceChildren(...labels.map((l) => h("option", { value: l }, l)));
  if (labels.length) $("#diff-base").value = baseGroup(labels);
}

function renderKeyList() {
  const filter = $("#key-filter").value.trim().toLowerCase();
  const keys = [...new Set([...S.keysAvailable, ...S.keys])].sort();
  $("#key-list").replaceChildren(
    ...keys
      .filter((k) => !filter || k.includes(filter) || S.keys.includes(k))
      .map((k) =>
        h(
          "label",
          { title: helpOf(k) || k },
          h("input", { type: "checkbox", value: k, checked: S.keys.includes(k), "aria-label": `metric ${k}` }),
          k,
        ),
      ),
  );
  $("#key-count").textContent = `${S.keys.length}/${keys.length}`;
}

async function reload({ keys = false } = {}) {
  syncUrl();
  if (keys) await loadKeys();
  renderRunList();
  renderKeyList();
  try {
    await loadData();
  } catch (err) {
    toast(`Could not load metrics: ${errorText(err)}`, "error");
  }
  draw();
  renderConfigDiff();
}

$("#run-list").addEventListener("change", async (ev) => {
  const id = Number(ev.target.value);
  if (ev.target.checked) {
    if (!S.runIds.includes(id)) S.runIds.push(id);
    const r = S.allRuns.find((x) => x.id === id);
    if (r) S.runs.set(id, r);
  } else {
    S.runIds = S.runIds.filter((x) => x !== id);
  }
  if (S.diff.length === 2 && !S.diff.every((d) => S.runIds.includes(d))) S.diff = [];
  await reload({ keys: true });
});
$("#key-list").addEventListener("change", (ev) => {
  const k = ev.target.value;
  S.keys = ev.target.checked ? [...S.keys, k] : S.keys.filter((x) => x !== k);
  reload();
});
$("#run-filter").addEventListener("input", debounce(renderRunList, 150));
$("#key-filter").addEventListener("input", debounce(renderKeyList, 150));
$("#group-by").addEventListener("change", (ev) => {
  S.group = ev.target.value.trim() === "none" ? "" : ev.target.value.trim();
  renderBaseSelect();
  syncUrl();
  draw();
});
$("#diff-base").addEventListener("change", (ev) => {
  S.base = ev.target.value;
  syncUrl();
  draw();
});
$("#x-axis").addEventListener("change", (ev) => {
  S.x = ev.target.value;
  reload();
});
$("#smooth").addEventListener(
  "input",
  debounce((ev) => {
    S.smooth = Number(ev.target.value);
    $("#smooth-val").textContent = S.smooth.toFixed(2);
    syncUrl();
    draw();
  }, 40),
);
for (const sel of ["#diff-a", "#diff-b", "#diff-key"]) {
  $(sel).addEventListener("change", () => {
    const a = Number($("#diff-a").value),
      b = Number($("#diff-b").value);
    S.diff = a && b && a !== b ? [a, b] : [];
    S.diffKey = $("#diff-key").value;
    syncUrl();
    draw();
  });
}
$("#show-all-config").addEventListener("change", (ev) => {
  S.showAll = ev.target.checked;
  syncUrl();
  renderConfigDiff();
});
// ---- reports: the server renders them (the study report's renderer); a fetch carries the token
function reportQuery() {
  const grouped = groups();
  return qs({
    runs: S.runIds,
    key: diffKey(),
    group: S.group,
    baseline: grouped && grouped.size > 1 ? baseGroup([...grouped.keys()]) : "",
    k: SUMMARY_LAST_N,
  });
}

async function download(path, filename) {
  if (!S.runIds.length) return toast("Pick runs first", "error");
  try {
    const resp = await fetch(path, {
      headers: window.CONSPO_TOKEN ? { Authorization: `Bearer ${window.CONSPO_TOKEN}` } : {},
    });
    if (!resp.ok) throw new Error(`${resp.status}: ${(await resp.text()).slice(0, 300)}`);
    const href = URL.createObjectURL(await resp.blob());
    const link = h("a", { href, download: filename, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(href), 60_000);
  } catch (err) {
    toast(`Could not export: ${errorText(err)}`, "error");
  }
}
$("#report-html").addEventListener("click", () =>
  download(`/api/compare/report.html${reportQuery()}`, "comparison.html"),
);
$("#report-csv").addEventListener("click", () =>
  download(`/api/compare/objective.csv${reportQuery()}`, "comparison.csv"),
);
$("#copy-link").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(location.href);
    toast("Link copied", "ok");
  } catch {
    toast(location.href);
  }
});

// Live: while any chosen run is unfinished, refresh every 5 s (zoom is kept by uirevision).
setInterval(async () => {
  const live = S.runIds.some((id) => {
    const r = S.runs.get(id);
    return r && !FINISHED.has(r.status);
  });
  if (!live || document.hidden) return;
  await refreshRuns();
  try {
    await loadData();
  } catch {
    return;
  }
  draw();
  renderConfigDiff();
}, 5000);

async function init() {
  const groupId = url.get("group_id");
  if (groupId && !S.runIds.length) {
    try {
      const data = await get(`/api/runs${qs({ group_id: groupId, limit: 50 })}`);
      S.runIds = data.items.map((r) => r.id).sort((a, b) => a - b);
      for (const r of data.items) S.runs.set(r.id, r);
      if (!S.group) S.group = "algorithm";
    } catch (err) {
      toast(`Could not load group ${groupId}: ${errorText(err)}`, "error");
    }
  }
  if (S.diff.length !== 2 && S.runIds.length === 2) S.diff = [S.runIds[0], S.runIds[1]];
  $("#group-by").value = S.group;
  $("#x-axis").value = S.x;
  $("#smooth").value = String(S.smooth);
  $("#smooth-val").textContent = S.smooth.toFixed(2);
  $("#show-all-config").checked = S.showAll;
  await loadPicker();
  await reload({ keys: true });
}
init();
