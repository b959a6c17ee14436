// Run page: header, meta, config, and live separation dashboards. Initial data comes from
// /api/runs/{id}/metrics (server-side downsampled, min/max kept); new points arrive on the SSE
// stream /api/runs/{id}/stream and are appended; charts redraw with Plotly.react and a fixed
// uirevision so zoom survives every update.
import { del, errorText, get, post, qs, stream } from "/static/api.js";
import {
  CHARTS,
  chartApplies,
  constantNoteOf,
  helpOf,
  isDeterministic,
  metricInfo,
  ROLE_COLORS,
  ROLLOUTS_AXIS,
  SECTIONS,
  STEP_TIME,
  unitOf,
} from "/static/catalogue.js";
import {
  alpha,
  bandTraces,
  baseLayout,
  chartCard,
  hasFinite,
  lineTraces,
  noteAnnotation,
  quantile,
  react,
  sampledAnnotation,
  withNotes,
  X_TITLES,
} from "/static/charts.js";
import { kindLine } from "/static/lineage.js";
import { promptView } from "/static/prompts.js";
import {
  $,
  $$,
  FINISHED,
  flatten,
  fmtAgo,
  fmtDuration,
  fmtNum,
  fmtTime,
  fmtValue,
  h,
  progress,
  progressBar,
  resourcesText,
  setConn,
  statusBadge,
  toast,
  waitingNote,
} from "/static/util.js";

const CHART_BY_ID = Object.fromEntries(CHARTS.map((c) => [c.id, c]));
const runId = Number($("#run-root").dataset.runId);
const PROMPTS = promptView(runId, $("#chart-sections"));
const POS = ROLE_COLORS.pos;
const NEG = ROLE_COLORS.neg;

const S = {
  run: null,
  series: {}, // key → {steps, values, min, max, wall_time, sampled, total_points}
  rollouts: [], // {step, reward, score, length, ...}
  rolloutNote: "",
  rolloutMaxStep: 0,
  maxStep: 0,
  smooth: 0,
  xmode: "step",
  live: true,
  es: null,
  cards: new Map(), // chart id → {def, card, plot}
  lastUpdate: null,
  rev: 0, // bumped on every data change: layout.datarevision makes Plotly.react recompute
  rolloutStep: null, // the step the rollout table shows (null: the latest)
  liveSettled: false,
};

// ---- chart definitions: the catalogue's sections and charts, plus one chart per key it lacks ----
const SECTIONS_SHOWN = [...SECTIONS, { id: "other", title: "Other metrics" }];

/** The series lines a chart covers among the keys present. */
function chartKeys(def) {
  return (def.metrics || [])
    .filter((m) => S.series[m.key])
    .map((m) => ({
      key: m.key,
      name: m.label,
      color: m.colorValue,
      dash: m.dash ? "dash" : undefined,
      deterministic: m.deterministic,
    }));
}

function claimedKeys() {
  const claimed = new Set([ROLLOUTS_AXIS]);
  for (const def of CHARTS) for (const k of chartKeys(def)) claimed.add(k.key);
  return claimed;
}

// ---- x axis ----------------------------------------------------------------------------------
function interp(xs, ys, x) {
  if (!xs.length) return null;
  if (x <= xs[0]) return ys[0];
  if (x >= xs[xs.length - 1]) return ys[ys.length - 1];
  let lo = 0,
    hi = xs.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid;
    else hi = mid;
  }
  const t = (x - xs[lo]) / (xs[hi] - xs[lo] || 1);
  return ys[lo] + t * (ys[hi] - ys[lo]);
}

function refSeries() {
  let best = null;
  for (const s of Object.values(S.series)) if (!best || s.steps.length > best.steps.length) best = s;
  return best;
}

function t0() {
  if (S.run?.started_at) return S.run.started_at;
  const r = refSeries();
  return r?.wall_time.length ? r.wall_time[0] : 0;
}

/** x values for steps (array) under the current x mode. */
function xOfSteps(steps, wall) {
  if (S.xmode === "wall_time") {
    if (wall && wall.length === steps.length) return wall.map((w) => (w - t0()) / 60);
    const r = refSeries();
    if (!r) return steps;
    return steps.map((st) => (interp(r.steps, r.wall_time, st) - t0()) / 60);
  }
  if (S.xmode === "rollouts") {
    const r = S.series[ROLLOUTS_AXIS];
    if (!r) return steps;
    const pts = r.steps.map((st, i) => [st, r.values[i]]).filter((p) => p[1] !== null);
    const xs = pts.map((p) => p[0]),
      ys = pts.map((p) => p[1]);
    return steps.map((st) => interp(xs, ys, st));
  }
  return steps;
}

// ---- data --------------------------------------------------------------------------------------
function mergePoints(key, pts) {
  S.rev += 1;
  let s = S.series[key];
  if (!s) {
    s = S.series[key] = { steps: [], values: [], min: [], max: [], wall_time: [], sampled: false, total_points: 0 };
  }
  const n = pts.steps.length;
  for (let i = 0; i < n; i++) {
    const st = pts.steps[i];
    const v = pts.values[i];
    const w = pts.wall_time ? pts.wall_time[i] : null;
    const last = s.steps.length ? s.steps[s.steps.length - 1] : -Infinity;
    if (st > last) {
      s.steps.push(st);
      s.values.push(v);
      s.min.push(v);
      s.max.push(v);
      s.wall_time.push(w);
      s.total_points += 1;
    } else if (!s.sampled) {
      // A re-emitted step (resume after a checkpoint) overwrites, never duplicates; a key
      // written late to an older step (the stream's cursor is a write sequence) is inserted
      // in step order.
      const idx = s.steps.indexOf(st);
      if (idx >= 0) {
        s.values[idx] = v;
        s.min[idx] = v;
        s.max[idx] = v;
        s.wall_time[idx] = w;
      } else {
        let at = s.steps.findIndex((x) => x > st);
        if (at < 0) at = s.steps.length;
        s.steps.splice(at, 0, st);
        s.values.splice(at, 0, v);
        s.min.splice(at, 0, v);
        s.max.splice(at, 0, v);
        s.wall_time.splice(at, 0, w);
        s.total_points += 1;
      }
    }
    if (st > S.maxStep) S.maxStep = st;
  }
}

async function loadMetrics() {
  const { keys } = await get(`/api/runs/${runId}/metrics/keys`);
  if (!keys.length) return;
  const chunks = [];
  for (let i = 0; i < keys.length; i += 40) chunks.push(keys.slice(i, i + 40));
  for (const chunk of chunks) {
    const data = await get(`/api/runs/${runId}/metrics${qs({ keys: chunk, max_points: 1000 })}`);
    for (const [key, s] of Object.entries(data.series)) {
      S.series[key] = {
        steps: s.steps,
        values: s.values,
        min: s.min || s.values.slice(),
        max: s.max || s.values.slice(),
        wall_time: s.wall_time || [],
        sampled: Boolean(s.sampled),
        total_points: s.total_points || s.steps.length,
      };
      if (s.steps.length) S.maxStep = Math.max(S.maxStep, s.steps[s.steps.length - 1]);
    }
  }
}

const ROLLOUT_BUDGET = 20000;

async function loadRollouts(incremental = false) {
  try {
    if (incremental) {
      const data = await get(`/api/runs/${runId}/rollouts${qs({ step_min: S.rolloutMaxStep + 1, limit: 5000 })}`);
      addRollouts(data.items);
      return;
    }
    const perStep = S.run?.config?.logging?.rollout_sample || 64;
    const steps = S.maxStep || S.run?.step || 0;
    if (steps * perStep <= ROLLOUT_BUDGET) {
      const data = await get(`/api/runs/${runId}/rollouts${qs({ limit: ROLLOUT_BUDGET })}`);
      S.rollouts = [];
      addRollouts(data.items);
      S.rolloutNote = "";
    } else {
      // Too many to draw: take ~40 evenly spaced steps and say so on the chart.
      const n = Math.min(40, steps);
      const picks = [...new Set(Array.from({ length: n }, (_, i) => Math.max(1, Math.round(((i + 1) * steps) / n))))];
      const results = [];
      for (let i = 0; i < picks.length; i += 8) {
        const batch = picks
          .slice(i, i + 8)
          .map((st) => get(`/api/runs/${runId}/rollouts${qs({ step_min: st, step_max: st, limit: perStep * 4 })}`));
        results.push(...(await Promise.all(batch)));
      }
      S.rollouts = [];
      for (const r of results) addRollouts(r.items);
      S.rolloutNote = `sampled: rollouts of ${picks.length} of ${steps.toLocaleString()} steps`;
    }
  } catch (err) {
    console.warn("rollouts", errorText(err));
  }
}

function addRollouts(items) {
  S.rev += 1;
  for (const it of items || []) {
    S.rollouts.push(it);
    if (it.step > S.rolloutMaxStep) S.rolloutMaxStep = it.step;
  }
}

// ---- header ------------------------------------------------------------------------------------
/** Median seconds of the last 10 steps (the catalogue's step-time key), for an ETA that follows
 * the run's current pace rather than its since-start average; null without data. */
function recentStepSeconds() {
  const s = S.series[STEP_TIME];
  if (!s) return null;
  const last = s.values.slice(-10).filter((v) => v !== null && Number.isFinite(v));
  if (!last.length) return null;
  return quantile(
    last.sort((a, b) => a - b),
    0.5,
  );
}

/** "3rd in the queue · <why it waits>" for a queued run. */
function queueText(run) {
  const parts = [];
  if (run.queue_position) parts.push(`#${run.queue_position} in the queue`);
  return parts.join(" · ");
}

// ---- rollout table: the sampled rollouts of one step, with their text ----------------------------
async function loadRolloutTable(step) {
  const input = $("#rollout-step");
  const latest = S.rolloutMaxStep || S.maxStep || 0;
  if (!latest) {
    $("#rollout-body").replaceChildren(h("tr", {}, h("td", { colspan: 7 }, "no rollouts yet")));
    return;
  }
  input.max = latest;
  const at = Math.min(latest, Math.max(0, step ?? S.rolloutStep ?? latest));
  input.value = at;
  try {
    const data = await get(`/api/runs/${runId}/rollouts${qs({ step_min: at, step_max: at, text: true, limit: 512 })}`);
    const rows = data.items.map((r) =>
      h(
        `tr.${r.reward > 0 ? "pos" : "neg"}`,
        {},
        h("td.num", {}, r.group),
        h("td.num", {}, r.index),
        h("td.text", {}, r.prompt || "–"),
        h("td.text", {}, r.completion || (r.prompt ? "" : "–")),
        h("td.num", {}, fmtNum(r.reward)),
        h("td.num", {}, fmtNum(r.score)),
        h("td", {}, r.reward > 0 ? "✓ correct" : "✗ wrong"),
      ),
    );
    $("#rollout-body").replaceChildren(
      ...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 7 }, `no sampled rollouts at step ${at}`))]),
    );
  } catch (err) {
    toast(`Could not load rollouts: ${errorText(err)}`, "error");
  }
}

$("#rollout-step").addEventListener("change", (ev) => {
  S.rolloutStep = Number(ev.target.value);
  loadRolloutTable(S.rolloutStep);
});
function metaItem(k, v, title) {
  return h("div", {}, h("div.k", {}, k), h("div.v", { title: title || (typeof v === "string" ? v : null) }, v ?? "–"));
}

function renderRun() {
  const run = S.run;
  document.title = `${run.name || `Run ${run.id}`} · ConSPO Lab`;
  $("#run-title").replaceChildren(run.name || `Run ${run.id}`, " ", h("span.rid", {}, `#${run.id}`));
  $("#run-status").replaceChildren(...[statusBadge(run), waitingNote(run)].filter(Boolean));
  $("#run-progress").replaceChildren(progressBar(run, recentStepSeconds()));
  $("#run-lineage").replaceChildren(
    ...kindLine(run, () => S.run && renderRun()),
    run.cloned_from ? " · " : "",
    run.cloned_from ? h("a", { href: `/runs/${run.cloned_from}` }, `cloned from #${run.cloned_from}`) : "",
  );
  const waiting = run.status === "queued" ? queueText(run) : "";
  $("#run-queue").textContent = waiting;
  const p = progress(run, recentStepSeconds());
  const finished = FINISHED.has(run.status);
  if (finished && !S.liveSettled) {
    // A finished run has nothing more to stream: "live" is unticked, and says why.
    S.liveSettled = true;
    const live = $("#live-toggle");
    live.checked = false;
    live.disabled = true;
    live.parentElement.title = `run ${run.status}: no live updates`;
  }
  const duration = run.started_at ? (run.finished_at || Date.now() / 1000) - run.started_at : null;
  const meta = [
    metaItem("algorithm", run.algorithm),
    metaItem("task", run.task),
    metaItem("model", run.model),
    metaItem("resources", resourcesText(run), `strategy ${run.config?.resources?.strategy || "ddp"}`),
    metaItem("owner", run.owner),
    metaItem("seed", String(run.seed ?? "–")),
    metaItem(
      "group",
      run.group_id
        ? h("a", { href: `/compare?${new URLSearchParams({ group_id: run.group_id })}` }, run.group_id)
        : "–",
      run.group_id,
    ),
    metaItem(
      "tags",
      (run.tags || []).length
        ? h(
            "span",
            {},
            run.tags.map((t) => h("span.tag", {}, t)),
          )
        : "–",
    ),
    metaItem("step", `${p.step} / ${p.total || "?"}`),
    metaItem(
      finished ? "duration" : "ETA",
      finished ? fmtDuration(duration) : p.eta !== null ? fmtDuration(p.eta) : "–",
    ),
    metaItem("created", fmtTime(run.created_at)),
    metaItem("started", fmtTime(run.started_at)),
    metaItem("finished", fmtTime(run.finished_at)),
    metaItem("heartbeat", run.heartbeat_at ? fmtAgo(run.heartbeat_at) : "–", fmtTime(run.heartbeat_at)),
    metaItem("worker host", run.worker_host || "–"),
    metaItem("device", run.device || "–"),
    metaItem("dtype", run.dtype || "–"),
    run.ray_job_id ? metaItem("Ray job", run.ray_job_id) : null,
    metaItem("kind", run.external ? "external (logged over HTTP)" : "queued job"),
  ];
  $("#run-meta").replaceChildren(...meta.filter(Boolean));
  const err = $("#run-error");
  err.hidden = !run.error;
  err.textContent = run.error ? `Error: ${run.error}` : "";
  $("#cancel-btn").hidden = finished || run.cancel_requested;
  $("#clone-btn").hidden = Boolean(run.external); // logged from elsewhere: nothing to rerun
  $("#edit-btn").hidden = Boolean(run.external);
  $("#config-table").replaceChildren(
    ...Object.entries(flatten(run.config || {})).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, fmtValue(v)))),
  );
  const summary = Object.entries(run.summary || {}).sort(([a], [b]) => a.localeCompare(b));
  $("#summary-table").replaceChildren(
    ...(summary.length
      ? summary.map(([k, v]) => h("tr", {}, h("td", { title: helpOf(k) }, k), h("td", {}, fmtNum(v, 6))))
      : [h("tr", {}, h("td", {}, "no metrics yet"), h("td"))]),
  );
}

// ---- charts ------------------------------------------------------------------------------------
function ensureCards() {
  const container = $("#chart-sections");
  const claimed = claimedKeys();
  const otherKeys = Object.keys(S.series)
    .filter((k) => !claimed.has(k))
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
        markers: Boolean(pattern),
        metrics: [
          { key, label: key, help: helpOf(key), colorValue: ROLE_COLORS.accent, deterministic: isDeterministic(key) },
        ],
      };
    }),
  ];
  for (const sec of SECTIONS_SHOWN) {
    const wanted = defs.filter(
      (d) => d.section === sec.id && chartApplies(d, S.run?.algorithm, S.run?.config?.kind) && (d.always || hasData(d)),
    );
    if (!wanted.length) continue;
    let secEl = container.querySelector(`[data-section="${sec.id}"]`);
    if (!secEl) {
      secEl = h("div", { "data-section": sec.id }, h("h3.section-title", {}, sec.title), h("div.charts"));
      // keep section order
      const after = SECTIONS_SHOWN.slice(SECTIONS_SHOWN.indexOf(sec) + 1)
        .map((s) => container.querySelector(`[data-section="${s.id}"]`))
        .find(Boolean);
      container.insertBefore(secEl, after || null);
    }
    const grid = secEl.querySelector(".charts");
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

function placeholder(entry, text) {
  if (entry.plot.dataset.state !== "empty") {
    if (entry.plot.dataset.state === "plotted") window.Plotly.purge(entry.plot);
    entry.plot.dataset.state = "empty";
    entry.card.classList.add("empty-chart");
  }
  entry.plot.replaceChildren(h("span", {}, text));
}

function drawChart(entry) {
  const { def } = entry;
  const built = def.kind === "rollout_heatmap" ? heatmapFigure() : lineFigure(def, entry);
  setConstantNote(entry);
  if (!built) {
    let text = "no data yet";
    if (S.run && S.run.status === "queued") text = "waiting for the run to start…";
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

function lineFigure(def, entry) {
  const keys = chartKeys(def).filter((k) => hasFinite(S.series[k.key]));
  if (!keys.length) return null;
  const traces = [];
  const used = [];
  const stack = def.kind === "stack";
  keys.forEach((k, i) => {
    const s = withDetail(k.key, S.series[k.key], entry?.detail);
    used.push(s);
    const xs = xOfSteps(s.steps, s.wall_time);
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
    traces.push(...lines);
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
  const layout = baseLayout({ uirevision: `${S.xmode}`, xTitle: X_TITLES[S.xmode], yTitle: def.y_title || "" });
  withNotes(layout, sampledAnnotation(used));
  layout.shapes = shapes;
  if (def.y_range === "unit") {
    // Fractions always on [0, 1] (a little room for the line at 1): panels compare at a glance.
    layout.yaxis.range = [-0.03, 1.03];
    layout.yaxis.autorange = false;
  } else if (def.y_range === "zero") layout.yaxis.rangemode = "tozero";
  if (def.y_format) {
    layout.yaxis.tickformat = def.y_format;
    layout.yaxis.hoverformat = ".3~e";
  }
  const flat = constantValue(traces);
  if (flat !== null && def.y_range !== "unit" && !stack) {
    // Plotly pads a flat line by ±1, which makes e.g. a constant 1e-3 read as 0.
    const pad = Math.abs(flat) * 0.5 || 1;
    layout.yaxis.range =
      def.y_range === "zero" ? [Math.min(0, flat - pad), Math.max(0, flat + pad)] : [flat - pad, flat + pad];
  }
  // A handful of integer ticks whatever the run's length (early on, Plotly would label every
  // fraction of a step).
  layout.xaxis.nticks = 8;
  if (S.xmode === "step") layout.xaxis.tickformat = "d";
  if (S.xmode === "step" && S.maxStep <= 8) layout.xaxis.dtick = 1;
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
  const notes = entry.def.kind === "rollout_heatmap" ? [] : constantNotes(entry.def);
  let el = entry.card.querySelector(".chart-note");
  if (!notes.length) {
    if (el) el.remove();
    return;
  }
  if (!el) {
    el = h("div.chart-note");
    entry.plot.before(el);
  }
  el.textContent = notes.join(" · ");
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

function rolloutsByStep() {
  const by = new Map();
  for (const r of S.rollouts) {
    if (r.score === null || r.score === undefined) continue;
    if (!by.has(r.step)) by.set(r.step, { pos: [], neg: [] });
    const e = by.get(r.step);
    (r.reward > 0 ? e.pos : e.neg).push(r.score);
  }
  return by;
}

function iqrBands() {
  const by = rolloutsByStep();
  if (!by.size) return [];
  const steps = [...by.keys()].sort((a, b) => a - b);
  const out = [];
  for (const [side, color, name] of [
    ["pos", POS, "s⁺ IQR"],
    ["neg", NEG, "s⁻ IQR"],
  ]) {
    const st = steps.filter((s) => by.get(s)[side].length >= 2);
    if (!st.length) continue;
    const q = st.map((s) =>
      by
        .get(s)
        [side].slice()
        .sort((a, b) => a - b),
    );
    const lo = q.map((a) => quantile(a, 0.25));
    const hi = q.map((a) => quantile(a, 0.75));
    out.push(...bandTraces(xOfSteps(st), lo, hi, { color, name, opacity: 0.12, legend: true }));
  }
  return out;
}

// Score distribution over steps: one heatmap per class (correct above, wrong below) on the same
// score bins and the same steps, each column the share of that class's rollouts in each bin (so
// a step with few correct rollouts is as readable as one with many).
const HEAT_BINS = 30;
const HEAT_MAX_COLUMNS = 200;

function heatmapFigure() {
  const by = rolloutsByStep();
  if (!by.size) return null;
  let steps = [...by.keys()].sort((a, b) => a - b);
  const all = steps.flatMap((st) => [...by.get(st).pos, ...by.get(st).neg]);
  let lo = Infinity,
    hi = -Infinity;
  for (const v of all) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const size = (hi - lo) / HEAT_BINS || 0.01;
  const centres = Array.from({ length: HEAT_BINS }, (_, i) => lo + (i + 0.5) * size);
  // Too many steps for the width: merge consecutive ones (the column is labelled by its last).
  const per = Math.ceil(steps.length / HEAT_MAX_COLUMNS);
  const columns = [];
  for (let i = 0; i < steps.length; i += per) columns.push(steps.slice(i, i + per));
  const z = { pos: centres.map(() => []), neg: centres.map(() => []) };
  const counts = { pos: [], neg: [] };
  for (const col of columns) {
    for (const side of ["pos", "neg"]) {
      const hist = new Array(HEAT_BINS).fill(0);
      let n = 0;
      for (const st of col)
        for (const v of by.get(st)[side]) {
          hist[Math.min(HEAT_BINS - 1, Math.floor((v - lo) / size))] += 1;
          n += 1;
        }
      counts[side].push(n);
      hist.forEach((c, b) => {
        z[side][b].push(n ? c / n : null);
      });
    }
  }
  steps = columns.map((c) => c[c.length - 1]);
  const xs = xOfSteps(steps);
  const trace = (side, color, name, yaxis, showscale) => ({
    type: "heatmap",
    x: xs.slice(),
    y: centres,
    z: z[side],
    customdata: z[side].map(() => counts[side]),
    name,
    yaxis,
    zmin: 0,
    zmax: 1,
    colorscale: [
      [0, "rgba(255,255,255,0)"],
      [0.02, alpha(color, 0.12)],
      [1, color],
    ],
    showscale,
    colorbar: showscale ? { title: { text: "share", side: "right" }, thickness: 10, len: 0.9 } : undefined,
    hovertemplate: `${name}<br>step %{x}<br>score %{y:.3f}<br>share %{z:.2f} of %{customdata} rollouts<extra></extra>`,
  });
  const traces = [trace("pos", POS, "correct", "y", false), trace("neg", NEG, "wrong", "y2", true)];
  const layout = baseLayout({ uirevision: `heat:${S.xmode}`, xTitle: X_TITLES[S.xmode], yTitle: "" });
  const yTitle = CHART_BY_ID.dist.y_title;
  layout.yaxis = { ...layout.yaxis, domain: [0.54, 1], title: { text: `correct: ${yTitle}`, font: { size: 10.5 } } };
  layout.yaxis2 = {
    ...layout.yaxis,
    domain: [0, 0.46],
    anchor: "x",
    title: { text: `wrong: ${yTitle}`, font: { size: 10.5 } },
  };
  layout.showlegend = false;
  layout.hovermode = "closest";
  layout.xaxis.nticks = 10;
  if (S.xmode === "step") layout.xaxis.tickformat = "d";
  const notes = [];
  if (S.rolloutNote) notes.push(S.rolloutNote);
  if (per > 1) notes.push(`${by.size} steps merged into ${columns.length} columns`);
  withNotes(layout, notes.length ? [noteAnnotation(notes.join(" · "))] : []);
  return { traces, layout };
}

let drawTimer = null;
function scheduleDraw(delay = 300) {
  if (drawTimer) return;
  drawTimer = setTimeout(() => {
    drawTimer = null;
    drawAll();
  }, delay);
}

function drawAll() {
  ensureCards();
  for (const entry of S.cards.values()) drawChart(entry);
  const ref = refSeries();
  const n = ref ? ref.total_points : 0;
  S.lastUpdate = Date.now();
  $("#points-note").textContent = ref
    ? `${Object.keys(S.series).length} metrics · last step ${S.maxStep} · ${n.toLocaleString()} points per metric`
    : "";
}

// ---- live --------------------------------------------------------------------------------------
// Throttled (not debounced: events arrive every second and would postpone a debounce forever).
let rolloutTimer = null;
function fetchNewRollouts() {
  if (rolloutTimer) return;
  rolloutTimer = setTimeout(async () => {
    await loadRollouts(true);
    rolloutTimer = null;
    scheduleDraw();
    if (S.rolloutStep === null) loadRolloutTable(); // following the latest step
  }, 1500);
  fetchPrompts();
}

// The prompt view is recomputed server-side over the whole run: refreshed at most every 10 s.
let promptTimer = null;
function fetchPrompts() {
  if (promptTimer) return;
  promptTimer = setTimeout(async () => {
    await PROMPTS.refresh();
    promptTimer = null;
  }, 10000);
}

function onMetrics(data) {
  if (!data?.series) return;
  for (const [key, pts] of Object.entries(data.series)) mergePoints(key, pts);
  if (S.run && data.step_max !== undefined && data.step_max > (S.run.step || 0)) {
    S.run.step = data.step_max;
    $("#run-progress").replaceChildren(progressBar(S.run, recentStepSeconds()));
  }
  if (S.live) {
    scheduleDraw();
    fetchNewRollouts();
  }
}

function onStatus(run) {
  if (!run || run.id !== runId) return;
  const wasFinished = S.run && FINISHED.has(S.run.status);
  S.run = run;
  renderRun();
  if (FINISHED.has(run.status) && !wasFinished) {
    fetchNewRollouts();
    scheduleDraw();
  }
}

function openStream() {
  if (S.es) return;
  S.es = stream(
    `/api/runs/${runId}/stream${qs({ since_step: S.maxStep })}`,
    {
      metrics: onMetrics,
      status: onStatus,
      end: () => {
        closeStream();
        setConn("done");
        // One last fetch so the finished run's charts hold the server's final view.
        fetchNewRollouts();
      },
    },
    (open) => setConn(open ? "live" : "off"),
  );
}

function closeStream() {
  if (S.es) {
    S.es.close();
    S.es = null;
  }
}

// ---- actions and controls ------------------------------------------------------------------------
$("#cancel-btn").addEventListener("click", async () => {
  const name = S.run?.name || `run ${runId}`;
  if (!confirm(`Cancel ${name} (#${runId})? A running run stops within seconds; this cannot be undone.`)) return;
  try {
    onStatus(await post(`/api/runs/${runId}/cancel`));
    toast("Cancel requested", "ok");
  } catch (err) {
    toast(`Cancel failed: ${errorText(err)}`, "error");
  }
});
$("#clone-btn").addEventListener("click", async () => {
  try {
    const res = await post(`/api/runs/${runId}/clone`, { overrides: {} });
    location.href = `/runs/${res.runs[0].id}`;
  } catch (err) {
    toast(`Clone failed: ${errorText(err)}`, "error");
  }
});
$("#delete-btn").addEventListener("click", async () => {
  if (!confirm(`Delete run ${runId} and all its metrics?`)) return;
  try {
    closeStream();
    await del(`/api/runs/${runId}`);
    location.href = "/";
  } catch (err) {
    toast(`Delete failed: ${errorText(err)}`, "error");
  }
});
for (const btn of $$(".tabs button")) {
  btn.addEventListener("click", () => {
    for (const b of $$(".tabs button")) b.classList.toggle("active", b === btn);
    for (const name of ["charts", "config", "summary"]) $(`#tab-${name}`).hidden = name !== btn.dataset.tab;
    if (btn.dataset.tab === "charts") window.dispatchEvent(new Event("resize"));
  });
}
$("#x-mode").addEventListener("change", (ev) => {
  S.xmode = ev.target.value;
  drawAll();
});
$("#smooth").addEventListener("input", (ev) => {
  S.smooth = Number(ev.target.value);
  $("#smooth-val").textContent = S.smooth.toFixed(2);
  scheduleDraw(60);
});
$("#live-toggle").addEventListener("change", (ev) => {
  S.live = ev.target.checked;
  if (S.live) scheduleDraw(0);
});
// Keep the ETA / heartbeat age fresh between events.
setInterval(() => S.run && !FINISHED.has(S.run.status) && renderRun(), 5000);

async function init() {
  try {
    S.run = await get(`/api/runs/${runId}`);
  } catch (err) {
    $("#run-root").replaceChildren(
      h(
        "div.panel.empty",
        {},
        `Run ${runId} could not be loaded: ${errorText(err)}. `,
        h("a", { href: "/" }, "Back to runs"),
      ),
    );
    return;
  }
  renderRun();
  try {
    await loadMetrics();
  } catch (err) {
    toast(`Could not load metrics: ${errorText(err)}`, "error");
  }
  await loadRollouts(false);
  drawAll();
  loadRolloutTable();
  await PROMPTS.refresh();
  if (FINISHED.has(S.run.status)) setConn("done");
  else openStream();
}
init();
