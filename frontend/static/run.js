// Run page: header, meta, config, and live separation dashboards. Initial data comes from
// /api/runs/{id}/metrics (server-side downsampled, min/max kept); new points arrive on the SSE
// stream /api/runs/{id}/stream and are appended; charts redraw with Plotly.react and a fixed
// uirevision so zoom survives every update.
import { del, errorText, get, post, qs, stream } from "/static/api.js";
import {
  CHARTS,
  helpOf,
  isDeterministic,
  metricInfo,
  ROLE_COLORS,
  ROLLOUTS_AXIS,
  SECTIONS,
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
function metaItem(k, v, title) {
  return h("div", {}, h("div.k", {}, k), h("div.v", { title: title || (typeof v === "string" ? v : null) }, v ?? "–"));
}

function renderRun() {
  const run = S.run;
  document.title = `${run.name || `Run ${run.id}`} · ConSPO Lab`;
  $("#run-title").replaceChildren(run.name || `Run ${run.id}`, " ", h("span.rid", {}, `#${run.id}`));
  $("#run-status").replaceChildren(...[statusBadge(run), waitingNote(run)].filter(Boolean));
  $("#run-progress").replaceChildren(progressBar(run));
  const p = progress(run);
  const finished = FINISHED.has(run.status);
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
    const wanted = defs.filter((d) => d.section === sec.id && (d.always || hasData(d)));
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
      const { card, plot } = chartCard(def.id, def.title, help, { wide: def.kind === "rollout_box" });
      grid.append(card);
      S.cards.set(def.id, { def, card, plot });
    }
  }
}

function hasData(def) {
  if (def.kind === "rollout_box" || def.kind === "rollout_hist") return S.rollouts.length > 0;
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
  const built = def.kind === "rollout_box" ? boxFigure() : def.kind === "rollout_hist" ? histFigure() : lineFigure(def);
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
}

function lineFigure(def) {
  const keys = chartKeys(def).filter((k) => hasFinite(S.series[k.key]));
  if (!keys.length) return null;
  const traces = [];
  const used = [];
  const stack = def.kind === "stack";
  for (const k of keys) {
    const s = S.series[k.key];
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
    } else {
      const markers = def.markers && s.steps.length <= 80;
      const smooth = k.deterministic ? 0 : S.smooth; // a schedule is exact: smoothing would make it lag
      traces.push(
        ...lineTraces(xs, s, {
          name: k.name,
          color: k.color,
          dash: k.dash,
          smooth,
          mode: markers ? "lines+markers" : "lines",
        }),
      );
    }
  }
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
  if (def.y_range === "unit" || def.y_range === "zero") layout.yaxis.rangemode = "tozero";
  const flat = constantValue(traces);
  if (flat !== null && def.y_range === "auto" && !stack) {
    // Plotly pads a flat line by ±1, which makes e.g. a constant 1e-3 read as 0.
    const pad = Math.abs(flat) * 0.5 || 1;
    layout.yaxis.range = [flat - pad, flat + pad];
  }
  if (S.xmode === "step" && S.maxStep <= 12) layout.xaxis.dtick = 1;
  if (stack) layout.hovermode = "x unified";
  return { traces, layout };
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

function boxFigure() {
  const by = rolloutsByStep();
  if (!by.size) return null;
  const steps = [...by.keys()].sort((a, b) => a - b);
  // At most ~50 boxes per side: bin consecutive steps when there are more.
  const nb = Math.min(50, steps.length);
  const binOf = (i) => Math.floor((i * nb) / steps.length);
  const bins = Array.from({ length: nb }, () => ({ steps: [], pos: [], neg: [] }));
  steps.forEach((st, i) => {
    const b = bins[binOf(i)];
    b.steps.push(st);
    b.pos.push(...by.get(st).pos);
    b.neg.push(...by.get(st).neg);
  });
  const traces = [];
  for (const [side, color, name] of [
    ["pos", POS, "correct (reward > 0)"],
    ["neg", NEG, "wrong"],
  ]) {
    const x = [],
      y = [];
    for (const b of bins) {
      const label = b.steps[b.steps.length - 1];
      for (const v of b[side]) {
        x.push(label);
        y.push(v);
      }
    }
    traces.push({
      type: "box",
      x: xOfSteps(x),
      y,
      name,
      marker: { color, size: 2 },
      line: { width: 1, color },
      fillcolor: alpha(color, 0.2),
      boxpoints: false,
      hoverinfo: "y+name",
      offsetgroup: side,
    });
  }
  const layout = baseLayout({ uirevision: `${S.xmode}`, xTitle: X_TITLES[S.xmode], yTitle: CHART_BY_ID.boxes.y_title });
  layout.boxmode = "group";
  layout.hovermode = "closest";
  const notes = [];
  if (S.rolloutNote) notes.push(S.rolloutNote);
  if (nb < steps.length) notes.push(`${steps.length} steps binned into ${nb}`);
  withNotes(layout, notes.length ? [noteAnnotation(notes.join(" · "))] : []);
  return { traces, layout };
}

function histFigure() {
  const by = rolloutsByStep();
  if (!by.size) return null;
  const last = Math.max(...by.keys());
  const e = by.get(last);
  // One set of bins for both sides, so the bars line up and compare.
  const all = [...e.pos, ...e.neg];
  const lo = Math.min(...all),
    hi = Math.max(...all);
  const size = (hi - lo) / 24 || 0.01;
  const xbins = { start: lo - size / 2, end: hi + size / 2, size };
  const traces = [
    {
      type: "histogram",
      x: e.pos,
      name: `correct (${e.pos.length})`,
      marker: { color: alpha(POS, 0.6) },
      xbins,
      autobinx: false,
    },
    {
      type: "histogram",
      x: e.neg,
      name: `wrong (${e.neg.length})`,
      marker: { color: alpha(NEG, 0.6) },
      xbins,
      autobinx: false,
    },
  ];
  const layout = baseLayout({
    uirevision: "hist",
    xTitle: `score s_θ at step ${last}`,
    yTitle: CHART_BY_ID.hist.y_title,
  });
  layout.barmode = "overlay";
  layout.hovermode = "closest";
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
    $("#run-progress").replaceChildren(progressBar(S.run));
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
  await PROMPTS.refresh();
  if (FINISHED.has(S.run.status)) setConn("done");
  else openStream();
}
init();
