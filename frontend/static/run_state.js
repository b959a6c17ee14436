// The run page's data: the run, its metric series (server-downsampled, then appended from the
// live stream) and its sampled rollouts, with the x axis every panel shares. The other run_*
// modules render from `S`; only this one fetches metrics and rollouts.
import { errorText, get, qs } from "/static/api.js";
import { CHARTED_KEYS, CHARTS, ROLLOUTS_AXIS, SECTIONS } from "/static/catalogue.js";
import { interp } from "/static/series.js";
import { $ } from "/static/util.js";

export const runId = Number($("#run-root").dataset.runId);

export const S = {
  run: null,
  series: {}, // key → {steps, values, min, max, wall_time, sampled, total_points}
  rollouts: [], // {step, reward, score, length, ...}
  rolloutNote: "",
  rolloutMaxStep: 0,
  rolloutsLoaded: false, // the first (heavy) load is done: live updates may append
  maxStep: 0,
  lastWall: 0, // wall time of the newest logged point: a step logged is a sign of life
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

// ---- chart definitions: the catalogue's sections and charts, plus one chart per key it lacks ----
export const SECTIONS_SHOWN = [...SECTIONS, { id: "other", title: "Other metrics" }];

/** The series lines a chart covers among the keys present. */
export function chartKeys(def) {
  return (def.metrics || [])
    .filter((m) => S.series[m.key])
    .map((m) => ({
      key: m.key,
      name: m.label,
      color: m.colorValue,
      dash: m.dash ? "dash" : undefined,
      deterministic: m.deterministic || m.smoothed === false,
    }));
}

export function claimedKeys() {
  const claimed = new Set([ROLLOUTS_AXIS]);
  for (const def of CHARTS) for (const k of chartKeys(def)) claimed.add(k.key);
  return claimed;
}

// ---- x axis ----------------------------------------------------------------------------------
export function refSeries() {
  let best = null;
  for (const s of Object.values(S.series)) if (!best || s.steps.length > best.steps.length) best = s;
  return best;
}

export function t0() {
  if (S.run?.started_at) return S.run.started_at;
  const r = refSeries();
  return r?.wall_time.length ? r.wall_time[0] : 0;
}

/** x values for steps (array) under the current x mode. */
export function xOfSteps(steps, wall, mode = S.xmode) {
  if (mode === "wall_time") {
    if (wall && wall.length === steps.length) return wall.map((w) => (w - t0()) / 60);
    const r = refSeries();
    if (!r) return steps;
    return steps.map((st) => (interp(r.steps, r.wall_time, st) - t0()) / 60);
  }
  if (mode === "rollouts") {
    const r = S.series[ROLLOUTS_AXIS];
    if (!r) return steps;
    const pts = r.steps.map((st, i) => [st, r.values[i]]).filter((p) => p[1] !== null);
    const xs = pts.map((p) => p[0]),
      ys = pts.map((p) => p[1]);
    return steps.map((st) => interp(xs, ys, st));
  }
  return steps;
}

/** Every panel's step axis spans the run's logged steps, first to last: panels line up (one
 * starting at 1, another padded out to −8 did not), and the autorange stops there. */
export function alignSteps(xaxis, mode = S.xmode) {
  if (mode !== "step" || !S.maxStep) return;
  let first = S.maxStep;
  for (const s of Object.values(S.series)) if (s.steps.length && s.steps[0] < first) first = s.steps[0];
  xaxis.autorangeoptions = { include: [first, S.maxStep], minallowed: first, maxallowed: S.maxStep };
}

// ---- data --------------------------------------------------------------------------------------
export function mergePoints(key, pts) {
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
    if (w > S.lastWall) S.lastWall = w;
  }
}

function putSeries(data) {
  for (const [key, s] of Object.entries(data.series)) {
    if (!s.steps.length) continue; // a charted key this run does not log
    S.series[key] = {
      steps: s.steps,
      values: s.values,
      min: s.min || s.values.slice(),
      max: s.max || s.values.slice(),
      wall_time: s.wall_time || [],
      sampled: Boolean(s.sampled),
      total_points: s.total_points || s.steps.length,
    };
    S.maxStep = Math.max(S.maxStep, s.steps[s.steps.length - 1]);
    const wall = s.wall_time?.[s.wall_time.length - 1];
    if (wall > S.lastWall) S.lastWall = wall;
  }
}

/** Every logged key's series: the charted ones first, logged or not, in one request that the
 * page's <head> sent already (early.js: keep the two paths the same), so `onFirst` (the first
 * draw) needs no other answer; then the keys no panel charts, 40 at a time. */
export async function loadMetrics(onFirst = () => {}) {
  const [charted, { keys: logged }] = await Promise.all([
    get(`/api/runs/${runId}/metrics${qs({ keys: CHARTED_KEYS, max_points: 1000 })}`),
    get(`/api/runs/${runId}/metrics/keys`),
  ]);
  putSeries(charted);
  onFirst();
  const asked = new Set(CHARTED_KEYS);
  const rest = logged.filter((k) => !asked.has(k)).sort();
  for (let i = 0; i < rest.length; i += 40) {
    putSeries(await get(`/api/runs/${runId}/metrics${qs({ keys: rest.slice(i, i + 40), max_points: 1000 })}`));
  }
}

const ROLLOUT_BUDGET = 20000;

export async function loadRollouts(incremental = false) {
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

export function addRollouts(items) {
  S.rev += 1;
  for (const it of items || []) {
    S.rollouts.push(it);
    if (it.step > S.rolloutMaxStep) S.rolloutMaxStep = it.step;
  }
}

/** "3rd in the queue · <why it waits>" for a queued run. */
