// The compare page's state and data: the chosen runs and keys (the whole view lives in the query
// string, so a link shares it), their series, the grouping, and the x axis every chart shares.
import { errorText, get, qs } from "/static/api.js";
import { KEY_METRICS, ROLLOUTS_AXIS } from "/static/catalogue.js";
import { interp, tHalfWidth } from "/static/series.js";
import { color, fmtValue, getPath, toast } from "/static/util.js";

export const DEFAULT_KEYS = KEY_METRICS;
const ROLLOUTS_KEY = ROLLOUTS_AXIS;
// Run fields a group-by path names directly (the rest are config paths): the server's list
// (backend/studies/comparison.py RUN_FIELDS), so the page's groups and the report's agree.
const RUN_FIELDS = window.CONSPO_GROUP_FIELDS || [];
export const SUMMARY_LAST_N = 3;

export const url = new URLSearchParams(location.search);
const list = (v) =>
  v
    ? v
        .split(",")
        .map((s) => s.trim())
        .filter(Boolean)
    : [];
const DEFAULT_SMOOTH = 0.5;
export const S = {
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

export function syncUrl() {
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
export function runColor(id) {
  const grouped = groups();
  if (grouped) {
    const labels = [...grouped.keys()];
    const at = labels.findIndex((label) => grouped.get(label).includes(id));
    if (at >= 0) return color(at);
  }
  return color(S.runIds.indexOf(id));
}
export const runName = (run) => `${run.name || `run ${run.id}`} #${run.id}`;

// ---- loading ------------------------------------------------------------------------------------
export async function loadPicker() {
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

export async function loadKeys() {
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

/** The chosen runs' series of the chosen keys: one request (early.js sends the first from
 * <head>: keep the two paths the same). */
export async function loadData() {
  S.data = {};
  if (!S.runIds.length || !S.keys.length) return;
  const keys = [...new Set([...S.keys, ...(S.x === "rollouts" ? [ROLLOUTS_KEY] : [])])].slice(0, 50);
  const ids = S.runIds.slice(0, 50);
  const data = await get(`/api/compare${qs({ runs: ids, keys, max_points: 1000 })}`);
  for (const [rid, entry] of Object.entries(data.runs || {})) S.data[Number(rid)] = entry.series || {};
  S.rev += 1;
}

export async function refreshRuns() {
  if (!S.runIds.length) return;
  try {
    // One request for all runs; a run deleted meanwhile keeps its last copy.
    const found = await get(`/api/runs${qs({ ids: S.runIds, limit: 500 })}`);
    for (const r of found.items) S.runs.set(r.id, r);
  } catch {
    /* transient: keep the last copies */
  }
}

/** x values for a run's steps under the current x mode (wall time in minutes since the run started). */
export function xFor(runId, steps, wall) {
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

export function groupValue(run, path) {
  if (RUN_FIELDS.includes(path)) return run[path];
  if (path === "tags") return (run.tags || []).join(",");
  const v = getPath(run.config || {}, path);
  return v === undefined ? getPath(run, path) : v;
}

export function groups() {
  if (!S.group) return null;
  const by = new Map();
  for (const id of S.runIds) {
    const run = S.runs.get(id);
    if (!run) continue;
    const value = groupValue(run, S.group);
    // a path the run lacks (a GRPO run's params.contrast): "(not set)", as the report says it
    const label = `${S.group}=${value === undefined ? "(not set)" : fmtValue(value)}`;
    if (!by.has(label)) by.set(label, []);
    by.get(label).push(id);
  }
  return by;
}

/** A run's x value at `step` under the current x mode. */
export function xAt(id, s, step) {
  return xFor(id, [step], s.wall_time?.length ? [interp(s.steps, s.wall_time, step)] : null)[0];
}

/** Mean across runs on the union of their steps (each run interpolated inside its range) with
 * the 95% t interval of that mean (null where fewer than two runs reached the step): the band
 * the comparison report draws of the same curve (backend/studies/objective.py group_curves). */
export function aggregate(ids, key) {
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
    const half = tHalfWidth(vals);
    mean.push(m);
    lo.push(half === null ? null : m - half);
    hi.push(half === null ? null : m + half);
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

export const diffKey = () => (S.keys.includes(S.diffKey) ? S.diffKey : S.keys[0] || "");

/** The baseline group: the one chosen if it is still a group, else the first. */
export function baseGroup(labels) {
  return labels.includes(S.base) ? S.base : labels[0];
}

/** Mean of a run's last N logged values of `key` (its steady level, not one noisy step). */
export function lastMean(id, key) {
  const values = (S.data[id]?.[key]?.values || []).filter((v) => v !== null && Number.isFinite(v));
  const tail = values.slice(-SUMMARY_LAST_N);
  return tail.length ? tail.reduce((a, b) => a + b, 0) / tail.length : null;
}
