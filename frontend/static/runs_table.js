// The runs list's arithmetic, apart from its DOM: which rows group together, which config keys
// earn a column, and the one y-range all sparklines of a column share. Pure functions of the
// listed runs, so runs.js stays a page of rendering and events.
import { configMeets } from "/static/catalogue.js";
import { interp } from "/static/series.js";
import { countsText, flatten, fmtNum } from "/static/util.js";

/** Which summary of the column's metric the value column shows: the one the list is ordered by
 * (`-max(sep/gap)` → "max"), else its last value. Ordered by max, the column showed last values
 * and read out of order. */
export function valueSummary(orderBy, metric) {
  const ordered = /^-?(best|max|min|last)\((.*)\)$/.exec(orderBy || "");
  return ordered && ordered[2] === metric ? ordered[1] : "last";
}

/** A run's value in that column: the server's `order_value` (the summary it ordered by), or the
 * last value from its summary (kept live by the run stream). */
export function shownValue(state, run) {
  if (valueSummary(state.orderBy, state.metric) === "last") return run.summary?.[state.metric];
  return run.order_value;
}

/** The group a run belongs to, or null: the seeds of one submission share `group_id` (a study's
 * runs share "study-<id>"), the stages of a pipeline share `pipeline_id`. */
export function groupKey(run) {
  if (run.group_id) return `g:${run.group_id}`;
  if (run.pipeline_id !== null && run.pipeline_id !== undefined) return `p:${run.pipeline_id}`;
  return null;
}

/** The table's order as rows: a lone run is {run}, two or more runs of one group listed are
 * {group, runs} at the place of the group's first listed run (the list is newest first). */
export function tableRows(order, runs) {
  const members = new Map();
  for (const id of order) {
    const key = groupKey(runs.get(id));
    if (key) members.set(key, [...(members.get(key) || []), id]);
  }
  const rows = [];
  const placed = new Set();
  for (const id of order) {
    const key = groupKey(runs.get(id));
    if (!key || members.get(key).length < 2) rows.push({ run: id });
    else if (!placed.has(key)) {
      placed.add(key);
      rows.push({ group: key, runs: members.get(key) });
    }
  }
  return rows;
}

/** A group's name: its pipeline's (`name`, when known) with its id ("sft-then-grpo · pipeline
 * 3"), its study's (the row's link says "study 3"), else its runs' common name without the
 * suffixes the server adds, per seed and to keep names unique (`conspo-arith-s0`, `…-s1-2` →
 * `conspo-arith`). */
export function groupName(key, runs, name) {
  const first = runs[0];
  const study = /^g:study-(\d+)$/.exec(key);
  if (study) return name || `study ${study[1]}`;
  if (key.startsWith("p:")) return name ? `${name} · pipeline ${key.slice(2)}` : `pipeline ${key.slice(2)}`;
  const bases = runs.map((r) => (r.name || "").replace(/(-s\d+)?(-\d+)?$/, ""));
  return bases.every((b) => b === bases[0]) && bases[0] ? bases[0] : first.name || `group of run ${first.id}`;
}

/** "2 running · 1 queued", most advanced states first. */
export function statusCounts(runs) {
  const counts = {};
  for (const r of runs) counts[r.status] = (counts[r.status] || 0) + 1;
  return countsText(counts);
}

/** Mean ± sample sd of the finite values, as text with n ("0.412 ± 0.031 (n=3)"). */
export function meanSd(values) {
  const xs = values.filter((v) => typeof v === "number" && Number.isFinite(v));
  if (!xs.length) return { n: 0, text: "–" };
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  if (xs.length < 2) return { n: 1, mean, text: `${fmtNum(mean)} (n=1)` };
  const sd = Math.sqrt(xs.reduce((a, b) => a + (b - mean) ** 2, 0) / (xs.length - 1));
  return { n: xs.length, mean, sd, text: `${fmtNum(mean)} ± ${fmtNum(sd, 2)} (n=${xs.length})` };
}

// Keys that never make a hyperparameter column: identities and what other columns show.
const NOT_HYPER = new Set(["name", "seed", "algorithm", "task.name", "model.name", "kind"]);
const NOT_HYPER_PREFIX = ["resources.", "checkpoint.", "logging."];
// Which varying keys come first when there are more than fit: the algorithm's own parameters
// (τ, margin, ε), then lr, group size and prompts per step, then the rest in name order.
const FIRST = ["params.", "optim.lr", "sampling.group_size", "sampling.prompts_per_step", "steps"];

function rank(key) {
  const i = FIRST.findIndex((p) => (p.endsWith(".") ? key.startsWith(p) : key === p));
  return i < 0 ? FIRST.length : i;
}

/** The config keys whose values differ among `runs`, ranked as a W&B table would offer them:
 * algorithm parameters (ε, contrast: set by the runs of the algorithms that have them), lr, G,
 * prompts per step, then the rest; within each, keys every run sets before keys some lack (a
 * run logged from outside may carry a sparse config), then by name. */
export function varyingKeys(runs, needs = {}) {
  const flat = runs.map((r) => flatten(usedConfig(r, needs)));
  const keys = new Set(flat.flatMap((f) => Object.keys(f)));
  const out = [];
  for (const key of keys) {
    if (NOT_HYPER.has(key) || NOT_HYPER_PREFIX.some((p) => key.startsWith(p))) continue;
    const seen = new Set(flat.map((f) => JSON.stringify(f[key] ?? null)));
    if (seen.size > 1) out.push({ key, partial: flat.some((f) => !(key in f)) ? 1 : 0 });
  }
  out.sort((a, b) => rank(a.key) - rank(b.key) || a.partial - b.partial || a.key.localeCompare(b.key));
  return out.map((k) => k.key);
}

/** Config path → the paper's symbol of that parameter, from the schemas' `symbol` (RunConfig's
 * sections and every algorithm's params: GET /api/presets). */
export function symbolsOf(presets) {
  const out = {};
  const schema = presets.config_schema;
  for (const [section, prop] of Object.entries(schema.properties || {})) {
    const ref = prop.$ref?.split("/").pop();
    for (const [name, p] of Object.entries(schema.$defs?.[ref]?.properties || {}))
      if (p.symbol) out[`${section}.${name}`] = p.symbol;
  }
  for (const algorithm of presets.algorithms)
    for (const [name, p] of Object.entries(algorithm.params_schema.properties || {}))
      if (p.symbol) out[`params.${name}`] = p.symbol;
  return out;
}

/** Algorithm → config path → the condition under which that parameter of the algorithm is used
 * at all (its schema's `needs`, in the catalogue's condition syntax: ConSPO's ε only with
 * "params.score=clipped_ratio"), from GET /api/presets. */
export function paramNeedsOf(presets) {
  const out = {};
  for (const algorithm of presets.algorithms)
    for (const [name, p] of Object.entries(algorithm.params_schema.properties || {}))
      if (p.needs) out[algorithm.name] = { ...out[algorithm.name], [`params.${name}`]: p.needs };
  return out;
}

/** The run's config without the parameters its other settings leave unused (ConSPO's ε with
 * log-prob scores): no column or cell shows such a value as if it shaped the run. */
export function usedConfig(run, needs = {}) {
  const config = run.config || {};
  const own = Object.entries(needs[run.algorithm] || {});
  const unused = own.filter(([, cond]) => !configMeets(cond, config, Boolean(run.external)));
  if (!unused.length || !config.params) return config;
  const params = { ...config.params };
  for (const [path] of unused) delete params[path.slice("params.".length)];
  return { ...config, params };
}

/** A column's short header: the parameter's symbol where it has one, else the key's last part. */
export function hyperLabel(key, symbols = {}) {
  return symbols[key] || key.split(".").pop();
}

/** One [min, max] over every sparkline of the column, so rows compare by eye; null when no
 * run has two finite points. A flat column gets a small pad so its line sits mid-cell. */
export function sharedRange(seriesList) {
  const range = valuesRange(seriesList);
  if (!range || range[0] !== range[1]) return range;
  const pad = Math.abs(range[0]) * 0.05 || 0.5;
  return [range[0] - pad, range[1] + pad];
}

/** The column head's words for its scale: the values' own [min, max], not the padded range a
 * flat column is drawn on (a series constant at 0 read "y −0.5 … 0.5", values none of its runs
 * had); "" when no run has two finite points. */
export function scaleText(seriesList) {
  const range = valuesRange(seriesList);
  if (!range) return "";
  const [lo, hi] = range.map((v) => fmtNum(v, 3));
  return lo === hi ? `y = ${lo}, constant` : `y ${lo} … ${hi}`;
}

/** [min, max] of the finite values of every series with two or more of them, else null. */
function valuesRange(seriesList) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const values of seriesList) {
    const finite = (values || []).filter((v) => v !== null && Number.isFinite(v));
    if (finite.length < 2) continue;
    for (const v of finite) {
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
  }
  return Number.isFinite(lo) ? [lo, hi] : null;
}

/** The arms of a group: its runs partitioned by config apart from the seed and the name (a
 * study's arms, or the one config of a multi-seed submission), each labelled by its runs' name
 * without the seed suffix and the prefix all arms share ("study-3-grpo-s0" → "grpo"). */
export function armsOf(runs) {
  const by = new Map();
  for (const run of runs) {
    const { seed: _seed, name: _name, ...rest } = flatten(run.config || {});
    const key = JSON.stringify(Object.entries(rest).sort(([a], [b]) => a.localeCompare(b)));
    if (!by.has(key)) by.set(key, []);
    by.get(key).push(run);
  }
  const arms = [...by.values()].map((members) => ({
    runs: members,
    base: (members[0].name || `run ${members[0].id}`).replace(/(-s\d+)?(-\d+)?$/, ""),
  }));
  let prefix = arms.length > 1 ? arms[0].base : "";
  for (const arm of arms) while (!arm.base.startsWith(prefix)) prefix = prefix.slice(0, -1);
  prefix = prefix.slice(0, prefix.lastIndexOf("-") + 1); // cut at a word boundary
  return arms.map((arm) => ({ ...arm, label: arm.base.slice(prefix.length) || arm.base }));
}

/** The mean over runs of their {steps, values} series on the union of their steps, each run
 * interpolated inside its own range only (a run that has not reached a step does not count). */
export function meanSeries(seriesList) {
  const present = seriesList.filter((s) => s?.steps?.length);
  const steps = [...new Set(present.flatMap((s) => s.steps))].sort((a, b) => a - b);
  const values = steps.map((st) => {
    const vs = present.map((s) => interp(s.steps, s.values, st)).filter((v) => v !== null && Number.isFinite(v));
    return vs.length ? vs.reduce((a, b) => a + b, 0) / vs.length : null;
  });
  return { steps, values };
}
