// The metric catalogue (conspo/metrics.py), injected into every page as window.CONSPO_CATALOGUE
// and also served at GET /api/metrics/catalogue. Pages take every metric key, label, help line,
// unit and chart from here: no metric key is spelled in JavaScript.

const RAW = window.CONSPO_CATALOGUE || {
  sections: [],
  charts: [],
  metrics: [],
  key_metrics: [],
  rollouts_axis: "",
  legacy_keys: {},
};

/** Palette of the catalogue's colour roles (pos = correct rollouts, neg = wrong ones). */
export const ROLE_COLORS = {
  pos: "#059669",
  neg: "#dc2626",
  accent: "#4f46e5",
  accent2: "#d97706",
  accent3: "#0891b2",
  reference: "#94a3b8",
};

export const SECTIONS = RAW.sections;
export const METRICS = RAW.metrics;
export const KEY_METRICS = RAW.key_metrics;
export const ROLLOUTS_AXIS = RAW.rollouts_axis;
export const STEP_TIME = RAW.step_time;
export const EVAL_PROBLEMS = RAW.eval_problems;
export const EVAL_ACCURACY = RAW.eval_accuracy;
const BY_KEY = new Map(METRICS.map((m) => [m.key, m]));
// algorithm → the keys its objective's registration says it logs (conspo.registry)
const OBJECTIVE_METRICS = RAW.objective_metrics || {};
// Families of keys a config names (eval/<benchmark>/avg@<k>): described once, matched by regex.
const PATTERNS = (RAW.patterns || []).map((p) => ({ ...p, re: new RegExp(p.regex) }));

/** The catalogue entry of a key (or of the pattern it matches), or undefined for a key logged
 * from elsewhere (external runs). */
export const metricInfo = (key) => BY_KEY.get(key) || PATTERNS.find((p) => p.re.test(key));

/** Help line of a key (empty for keys the catalogue does not know). */
export const helpOf = (key) => metricInfo(key)?.help || "";

/** Deterministic series (schedules, lr, counters) and readings (system/*: smoothed false) are
 * drawn as they are: never smoothed. */
export const isDeterministic = (key) => {
  const m = metricInfo(key);
  return Boolean(m?.deterministic || m?.smoothed === false);
};

/** y-axis title of a key drawn alone: its unit, when the catalogue knows it. */
export const unitOf = (key) => metricInfo(key)?.unit || "";

/** The charts with their metrics (catalogue order), each metric with its resolved colour. */
export const CHARTS = RAW.charts.map((chart) => ({
  ...chart,
  metrics: METRICS.filter((m) => m.chart === chart.id).map((m) => ({
    ...m,
    colorValue: ROLE_COLORS[m.color] || ROLE_COLORS.accent,
  })),
}));

/** Whether the run's config meets a catalogue condition ("optim.mini_batches>1|optim.epochs>1":
 * any of the terms; a term is a config path that must be truthy, a list non-empty ("tools.names"),
 * or compared with > or =). A `partial` config (an external run's, sent by its trainer) meets a
 * term on a path it lacks. */
export function configMeets(needs, config, partial = false) {
  if (!needs) return true;
  return needs.split("|").some((term) => {
    const [, path, op, value] = /^([\w.]+)(?:([>=])(.+))?$/.exec(term.trim()) || [];
    const v = path?.split(".").reduce((cur, p) => cur?.[p], config || {});
    if (v === undefined && partial) return true;
    if (op === ">") return Number(v) > Number(value);
    if (op === "=") return String(v) === value;
    return Array.isArray(v) ? v.length > 0 : Boolean(v);
  });
}

/** Whether a chart says anything for `run`: its job kind (the catalogue's `kinds`; empty =
 * every kind), its algorithm (`algorithms`; `logged_with`: objectives whose registration logs
 * that key), and its config (`needs`: without it the series are constant). A panel that does
 * not apply is not drawn rather than drawn as if it meant something. */
export function chartApplies(chart, run) {
  const algorithm = run?.algorithm;
  const kind = run?.config?.kind || "rl";
  if (chart.kinds?.length && !chart.kinds.includes(kind)) return false;
  if (!algorithm) return true;
  if (chart.algorithms?.length && !chart.algorithms.includes(algorithm)) return false;
  if (chart.logged_with && !(OBJECTIVE_METRICS[algorithm] || []).includes(chart.logged_with)) return false;
  return configMeets(chart.needs, run.config, Boolean(run.external));
}

/** Whether a section has anything to show for `run` (else it is folded with `section.folded`). */
export const sectionApplies = (section, run) =>
  !run?.config || configMeets(section.needs, run.config, Boolean(run.external));

/** The key a logged key repeats (reward/verifier is the pass rate), or undefined. */
export const sameAs = (key) => metricInfo(key)?.same_as?.[key];

/** Why a key's series may be constant (said on its panel when it is), or "". */
export const constantNoteOf = (key) => metricInfo(key)?.constant_note || "";

/** Charted keys in display order (section, chart, then catalogue order). */
export const CHARTED_KEYS = RAW.charted_keys || [];

const CHART_BY_ID = new Map(CHARTS.map((c) => [c.id, c]));
/** Whether a key is a fraction (its panel's, or its family's, y_range is "unit"): drawn on [0, 1]. */
export function isFraction(key) {
  const info = metricInfo(key);
  return (info?.regex ? info.y_range : CHART_BY_ID.get(info?.chart)?.y_range) === "unit";
}

/** Whether a key says anything for `run`: its panel applies (a GRPO run's summary has no
 * ConSPO margin). Keys without a panel always do. */
export function keyApplies(key, run) {
  const chart = CHART_BY_ID.get(metricInfo(key)?.chart);
  return !chart || chartApplies(chart, run);
}
