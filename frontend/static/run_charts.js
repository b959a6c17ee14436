// The run page's panels: one card per catalogue chart that applies to the run (plus one per key
// the catalogue lacks), drawn from run_state's series with Plotly.react and a fixed uirevision so
// zoom survives every update; a zoom fetches the range at full resolution.
import { errorText, get, qs } from "/static/api.js";
import {
  CHARTS,
  chartApplies,
  configMeets,
  constantNoteOf,
  EVAL_ACCURACY,
  EVAL_PROBLEMS,
  helpOf,
  isDeterministic,
  metricInfo,
  ROLE_COLORS,
  sameAs,
  sectionApplies,
  unitOf,
} from "/static/catalogue.js";
import {
  alpha,
  baseLayout,
  chartCard,
  hasFinite,
  lineTraces,
  padSingleX,
  react,
  sampledAnnotation,
  setCardNote,
  withNotes,
  X_TITLES,
} from "/static/charts.js";
import { heatmapFigure, iqrBands } from "/static/run_rollouts.js";
import {
  alignSteps,
  chartKeys,
  claimedKeys,
  refSeries,
  runId,
  S,
  SECTIONS_SHOWN,
  xOfSteps,
} from "/static/run_state.js";
import { $, afterPaint, fmtNum, h } from "/static/util.js";

// ---- charts ------------------------------------------------------------------------------------
function ensureCards() {
  const container = $("#chart-sections");
  const claimed = claimedKeys();
  const otherKeys = Object.keys(S.series)
    .filter((k) => !claimed.has(k) && !sameAs(k)) // reward/verifier is the pass rate, drawn there
    .sort();
  const defs = [
    ...CHARTS,
    ...otherKeys.map((key) => {
      const pattern = metricInfo(key)?.regex ? metricInfo(key) : null; // eval/<bench>/avg@k, ...
      return {
        id: `other-${key}`,
        section: pattern?.section || "other",
        title: key,
        help: helpOf(key),
        y_title: unitOf(key),
        y_range: pattern?.y_range || "auto",
        x_axis: pattern?.x_axis || "run",
        markers: Boolean(pattern),
        metrics: [
          { key, label: key, help: helpOf(key), colorValue: ROLE_COLORS.accent, deterministic: isDeterministic(key) },
        ],
      };
    }),
  ];
  const keys = Object.keys(S.series);
  const sampled = keys.some((k) => k.startsWith("system/")); // the run logged system readings
  for (const sec of SECTIONS_SHOWN) {
    // A section whose keys this run never logged, though it logged system readings (the GPU
    // panels of a CPU run): one line saying why.
    const unread = sec.folded_without && sampled && !keys.some((k) => k.startsWith(sec.folded_without));
    const folded = unread || (S.run && !sectionApplies(sec, S.run));
    // An external run's partial config meets a condition on a path it lacks: the section shows
    // what was logged, but no empty panel for a feature the run may not have (tools).
    const assumed = !folded && S.run?.external && !configMeets(sec.needs, S.run.config);
    const wanted = defs.filter(
      (d) => d.section === sec.id && chartApplies(d, S.run) && ((d.always && !assumed) || hasData(d)),
    );
    if (!wanted.length && !unread) continue;
    let secEl = container.querySelector(`[data-section="${sec.id}"]`);
    if (secEl?.dataset.folded && !folded) {
      secEl.remove(); // the GPU readings arrived after all
      secEl = null;
    }
    if (!secEl) {
      // A section with nothing to show for this run's config is one line saying why.
      secEl = folded
        ? h(
            "div.folded-section",
            { "data-section": sec.id, "data-folded": "1" },
            h("h3.section-title", {}, sec.title),
            h("p.muted.small.section-note", {}, sec.folded),
          )
        : h("div", { "data-section": sec.id }, h("h3.section-title", {}, sec.title), h("div.charts"));
      // keep section order
      const after = SECTIONS_SHOWN.slice(SECTIONS_SHOWN.indexOf(sec) + 1)
        .map((s) => container.querySelector(`[data-section="${s.id}"]`))
        .find(Boolean);
      container.insertBefore(secEl, after || null);
    }
    const grid = secEl.querySelector(".charts");
    if (!grid) continue; // folded
    for (const def of wanted) {
      if (S.cards.has(def.id)) continue;
      const help = def.help || (def.metrics || []).map((m) => `${m.label}: ${m.help}`).join(" ");
      const { card, plot } = chartCard(def.id, def.title, help, { wide: def.kind === "rollout_heatmap" });
      grid.append(card);
      const entry = { def, card, plot, detail: null };
      S.cards.set(def.id, entry);
      if (def.kind !== "rollout_heatmap") bindZoom(entry);
    }
  }
}

function hasData(def) {
  if (def.kind === "rollout_heatmap") return S.rollouts.length > 0;
  return chartKeys(def).some((k) => hasFinite(S.series[k.key]));
}

// An external run that logs points but no per-rollout scores (TRL's plain GRPOTrainer through
// conspo_lab.trl_bridge) will never fill the panels drawn from those scores: say what would.
const NEEDS_SCORES =
  "this run's trainer sends no per-rollout scores (TRL's GRPOTrainer logs only reward means):" +
  " these curves need conspo.integrations.trl.ConSPOTrainer";

function withoutRolloutScores(def) {
  if (!S.run?.external || !Object.keys(S.series).length) return false;
  if (def.kind === "rollout_heatmap") return S.rolloutsLoaded && !S.rollouts.length;
  return def.section === "sep" && !chartKeys(def).length;
}

function placeholder(entry, text) {
  if (entry.plot.dataset.state !== "empty") {
    if (entry.plot.dataset.state === "plotted") window.Plotly.purge(entry.plot);
    entry.plot.dataset.state = "empty";
    entry.card.classList.add("empty-chart");
  }
  entry.plot.replaceChildren(h("span", {}, text));
}

export function drawChart(entry) {
  const { def } = entry;
  const built = def.kind === "rollout_heatmap" ? heatmapFigure() : lineFigure(def, entry);
  setConstantNote(entry);
  if (!built) {
    let text = "no data yet";
    if (S.run && S.run.status === "queued") text = "waiting for the run to start…";
    else if (withoutRolloutScores(def)) text = NEEDS_SCORES;
    else if (def.kind === "rollout_heatmap" && !S.rolloutsLoaded) text = "loading the sampled rollouts…";
    else if (chartKeys(def).length) {
      text =
        def.section === "sep"
          ? "no finite values yet: separation statistics need groups with both correct and wrong rollouts"
          : "only empty (NaN) values logged so far";
    }
    placeholder(entry, text);
    return;
  }
  if (entry.plot.dataset.state !== "plotted") {
    entry.plot.replaceChildren();
    entry.card.classList.remove("empty-chart");
    entry.plot.dataset.state = "plotted";
  }
  built.layout.datarevision = `${S.rev}:${S.smooth}:${S.xmode}`;
  react(entry.plot, built.traces, built.layout);
  entry.attachZoom?.();
}

// Lines of one panel that overlap (order_acc and margin_acc early in a run) stay distinguishable:
// each line after the first gets its own marker symbol, drawn at a bounded number of points.
const MARKER_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "cross"];

/** A series with the zoomed panel's full-resolution points spliced in over [lo, hi]. */
function withDetail(key, s, detail) {
  const d = detail?.series?.[key];
  if (!d) return s;
  const out = { ...s, steps: [], values: [], min: [], max: [], wall_time: [] };
  const put = (src, i) => {
    out.steps.push(src.steps[i]);
    out.values.push(src.values[i]);
    out.min.push(src.min ? src.min[i] : src.values[i]);
    out.max.push(src.max ? src.max[i] : src.values[i]);
    out.wall_time.push(src.wall_time?.[i] ?? null);
  };
  let j = 0;
  for (let i = 0; i < s.steps.length; i++) {
    if (s.steps[i] < detail.lo) put(s, i);
    else if (s.steps[i] > detail.hi) {
      for (; j < d.steps.length; j++) put(d, j);
      put(s, i);
    }
  }
  for (; j < d.steps.length; j++) put(d, j);
  return out;
}

// Greedy accuracy is a proportion of the held-out problems scored: its chart says n and draws
// the 95% Wilson interval of each evaluation (n from eval/problems, the same at every one).
const Z95 = 1.959964;

function wilson(p, n) {
  const z2 = Z95 * Z95;
  const d = 1 + z2 / n;
  const centre = (p + z2 / (2 * n)) / d;
  const half = (Z95 * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n))) / d;
  return [Math.max(0, centre - half), Math.min(1, centre + half)];
}

function accuracyBand(k, s, xs, main) {
  const n = S.run?.summary?.[EVAL_PROBLEMS];
  if (k.key !== EVAL_ACCURACY || !(n > 0)) return [];
  main.name = `${k.name} (n = ${n})`;
  const x = [];
  const lo = [];
  const hi = [];
  s.values.forEach((p, i) => {
    if (!Number.isFinite(p)) return;
    const [a, b] = wilson(p, n);
    x.push(xs[i]);
    lo.push(a);
    hi.push(b);
  });
  const edge = { type: "scatter", mode: "lines", line: { width: 0, color: k.color }, hoverinfo: "skip", x };
  return [
    { ...edge, y: hi, showlegend: false },
    { ...edge, y: lo, fill: "tonexty", fillcolor: alpha(k.color, 0.15), name: `95% interval, n = ${n}` },
  ];
}

function lineFigure(def, entry) {
  const keys = chartKeys(def).filter((k) => hasFinite(S.series[k.key]));
  if (!keys.length) return null;
  // System readings are sampled by the clock: drawn against wall time whatever the page's axis.
  const xmode = def.x_axis === "wall_time" ? "wall_time" : S.xmode;
  const traces = [];
  const used = [];
  const stack = def.kind === "stack";
  keys.forEach((k, i) => {
    const s = withDetail(k.key, S.series[k.key], entry?.detail);
    used.push(s);
    const xs = xOfSteps(s.steps, s.wall_time, xmode);
    if (stack) {
      traces.push({
        x: xs.slice(),
        y: s.values.slice(),
        type: "scatter",
        mode: "lines",
        stackgroup: "g",
        name: k.name,
        line: { width: 0.5, color: k.color },
        fillcolor: alpha(k.color, 0.75),
      });
      return;
    }
    const sparse = def.markers && s.steps.length <= 80;
    const marked = sparse || (i > 0 && keys.length > 1);
    const smooth = k.deterministic ? 0 : S.smooth; // a schedule is exact: smoothing would make it lag
    const lines = lineTraces(xs, s, {
      name: k.name,
      color: k.color,
      dash: k.dash,
      smooth,
      mode: marked ? "lines+markers" : "lines",
    });
    const main = lines[lines.length - 1];
    if (marked)
      main.marker = { size: 6, color: k.color, symbol: MARKER_SYMBOLS[i % MARKER_SYMBOLS.length], maxdisplayed: 24 };
    main.meta = { key: k.key, smoothed: smooth > 0 };
    const band = accuracyBand(k, s, xs, main);
    traces.push(...band, ...lines);
  });
  const shapes = [];
  if (def.rollout_iqr) traces.unshift(...iqrBands());
  if (def.zero_line)
    shapes.push({
      type: "line",
      xref: "paper",
      x0: 0,
      x1: 1,
      y0: 0,
      y1: 0,
      line: { color: "#9ca3af", width: 1, dash: "dot" },
    });
  const layout = baseLayout({ uirevision: `${xmode}`, xTitle: X_TITLES[xmode], yTitle: def.y_title || "" });
  withNotes(layout, sampledAnnotation(used));
  layout.shapes = shapes;
  if (def.y_range === "unit") {
    // Fractions always on [0, 1] (a little room for the line at 1): panels compare at a glance.
    layout.yaxis.range = [-0.03, 1.03];
    layout.yaxis.autorange = false;
  } else if (def.y_range === "zero") layout.yaxis.rangemode = "tozero";
  if (def.y_format === "~e") {
    // Plotly's own exponent labels: 3e−5, and 0 as 0 (d3's "~e" wrote "0e+0")
    layout.yaxis.exponentformat = "e";
    layout.yaxis.showexponent = "all";
    layout.yaxis.hoverformat = ".3~e";
  } else if (def.y_format) {
    layout.yaxis.tickformat = def.y_format;
    layout.yaxis.hoverformat = ".3~e";
  }
  const flat = constantValue(traces);
  if (flat !== null && def.y_range !== "unit" && !stack) {
    // Plotly pads a flat line by ±1, which makes e.g. a constant 1e-3 read as 0.
    const pad = Math.abs(flat) * 0.5 || 1;
    // From zero: a count or a size never goes below it (a flat 0 drew on −1 to 1).
    layout.yaxis.range =
      def.y_range === "zero" ? [Math.min(0, flat - pad), Math.max(0, flat) + pad] : [flat - pad, flat + pad];
    if (def.y_range === "zero" && flat >= 0) layout.yaxis.range[0] = 0;
  }
  // A handful of integer ticks whatever the run's length (early on, Plotly would label every
  // fraction of a step).
  layout.xaxis.nticks = 8;
  alignSteps(layout.xaxis, xmode);
  padSingleX(layout, traces, xmode === "step" ? 0.5 : null);
  if (xmode === "step") layout.xaxis.tickformat = "d";
  if (xmode === "step" && S.maxStep <= 8) layout.xaxis.dtick = 1;
  if (stack) layout.hovermode = "x unified";
  return { traces, layout };
}

/** "constant 0 over 300 steps: no ratio was clipped (…)" for each charted series that is. */
function constantNotes(def) {
  if (def.kind !== "line" && def.kind !== undefined) return [];
  const notes = [];
  for (const k of chartKeys(def)) {
    const s = S.series[k.key];
    const finite = s.values.filter((v) => v !== null && Number.isFinite(v));
    if (finite.length < 3) continue;
    const v = finite[0];
    const lo = Math.min(...(s.min || s.values).filter(Number.isFinite));
    const hi = Math.max(...(s.max || s.values).filter(Number.isFinite));
    if (Math.abs(hi - v) > 1e-12 * Math.max(1, Math.abs(v)) || Math.abs(lo - v) > 1e-12 * Math.max(1, Math.abs(v)))
      continue;
    const why = constantNoteOf(k.key);
    notes.push(
      `${k.name}: constant ${fmtNum(v)} over ${s.total_points.toLocaleString()} steps${why ? `: ${why}` : ""}`,
    );
  }
  return notes;
}

function setConstantNote(entry) {
  setCardNote(entry.card, entry.plot, entry.def.kind === "rollout_heatmap" ? [] : constantNotes(entry.def));
}

// ---- zoom: full resolution for the zoomed range, and keys to drive it --------------------------
/** Fetch the zoomed step range at full resolution (the API buckets long series). */
async function fetchDetail(entry, lo, hi) {
  const keys = chartKeys(entry.def)
    .map((k) => k.key)
    .filter((k) => S.series[k].sampled);
  if (!keys.length || S.xmode !== "step") return;
  const from = Math.max(0, Math.floor(lo));
  const to = Math.ceil(hi);
  const data = await get(
    `/api/runs/${runId}/metrics${qs({ keys, since_step: Math.max(0, from - 1), step_max: to, max_points: Math.max(1000, to - from + 1) })}`,
  );
  entry.detail = { lo: from, hi: to, series: data.series };
  entry.plot.dataset.detail = `${from}-${to}`;
  S.rev += 1;
  drawChart(entry);
}

function bindZoom(entry) {
  const { plot } = entry;
  plot.tabIndex = 0;
  plot.setAttribute("aria-label", `${entry.def.title}: + / − zoom, ← → pan, 0 resets`);
  plot.addEventListener("keydown", (ev) => {
    if (plot.dataset.state !== "plotted" || !plot.layout) return;
    const [a, b] = plot.layout.xaxis.range || [];
    if (a === undefined) return;
    const w = b - a,
      mid = (a + b) / 2;
    let range = null;
    if (ev.key === "+" || ev.key === "=") range = [mid - w / 4, mid + w / 4];
    else if (ev.key === "-" || ev.key === "_") range = [mid - w, mid + w];
    else if (ev.key === "ArrowLeft") range = [a - w / 4, b - w / 4];
    else if (ev.key === "ArrowRight") range = [a + w / 4, b + w / 4];
    else if (ev.key === "0" || ev.key === "Escape") {
      window.Plotly.relayout(plot, { "xaxis.autorange": true, "yaxis.autorange": entry.def.y_range !== "unit" });
      ev.preventDefault();
      return;
    }
    if (!range) return;
    ev.preventDefault();
    window.Plotly.relayout(plot, { "xaxis.range": range });
  });
  let bound = false;
  const attach = () => {
    if (bound || !plot.on) return;
    bound = true;
    plot.on("plotly_relayout", (ev) => {
      if (ev["xaxis.autorange"]) {
        if (entry.detail) {
          entry.detail = null;
          delete plot.dataset.detail;
          drawChart(entry);
        }
        return;
      }
      const lo = ev["xaxis.range[0]"] ?? ev["xaxis.range"]?.[0];
      const hi = ev["xaxis.range[1]"] ?? ev["xaxis.range"]?.[1];
      if (lo === undefined || hi === undefined) return;
      fetchDetail(entry, lo, hi).catch((err) => console.warn("zoom", errorText(err)));
    });
  };
  entry.attachZoom = attach;
}

/** The single value every finite y of `traces` shares, or null. */
function constantValue(traces) {
  let v = null;
  for (const t of traces) {
    for (const y of t.y || []) {
      if (y === null || !Number.isFinite(y)) continue;
      if (v === null) v = y;
      else if (Math.abs(y - v) > 1e-12 * Math.max(1, Math.abs(v))) return null;
    }
  }
  return v;
}

let drawTimer = null;
export function scheduleDraw(delay = 300) {
  if (drawTimer) return;
  drawTimer = setTimeout(() => {
    drawTimer = null;
    drawAll();
  }, delay);
}

export function drawAll() {
  ensureCards();
  for (const entry of S.cards.values()) drawChart(entry);
  notePoints();
}

/** The first draw: panel by panel, the first painted before the next is drawn (the whole page
 * in one task kept even the top panel off screen until the last one was done). */
export async function drawInTurn() {
  ensureCards();
  let first = true;
  for (const entry of [...S.cards.values()]) {
    drawChart(entry);
    await (first ? afterPaint() : new Promise((resolve) => setTimeout(resolve, 0)));
    first = false;
  }
  notePoints();
}

function notePoints() {
  const ref = refSeries();
  const n = ref ? ref.total_points : 0;
  S.lastUpdate = Date.now();
  $("#points-note").textContent = ref
    ? `${Object.keys(S.series).length} metrics · last step ${S.maxStep} · ${n.toLocaleString()} points per metric`
    : "";
}
