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
const BY_KEY = new Map(METRICS.map((m) => [m.key, m]));
// Families of keys a config names (eval/<benchmark>/avg@<k>): described once, matched by regex.
const PATTERNS = (RAW.patterns || []).map((p) => ({ ...p, re: new RegExp(p.regex) }));

/** The catalogue entry of a key (or of the pattern it matches), or undefined for a key logged
 * from elsewhere (external runs). */
export const metricInfo = (key) => BY_KEY.get(key) || PATTERNS.find((p) => p.re.test(key));

/** Help line of a key (empty for keys the catalogue does not know). */
export const helpOf = (key) => metricInfo(key)?.help || "";

/** Deterministic series (schedules, lr, counters) are drawn as they are: never smoothed. */
export const isDeterministic = (key) => Boolean(metricInfo(key)?.deterministic);

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

/** Whether a chart applies to a run of `algorithm` and job `kind` (the catalogue's `algorithms`
 * and `kinds`; empty = every run). A panel that does not apply is hidden rather than drawn as if
 * it meant something. */
export const chartApplies = (chart, algorithm, kind = "rl") =>
  (!chart.kinds?.length || chart.kinds.includes(kind)) &&
  (!chart.algorithms?.length || !algorithm || chart.algorithms.includes(algorithm));

/** Why a key's series may be constant (said on its panel when it is), or "". */
export const constantNoteOf = (key) => metricInfo(key)?.constant_note || "";

/** Charted keys in display order (section, chart, then catalogue order). */
export const CHARTED_KEYS = SECTIONS.flatMap((s) =>
  CHARTS.filter((c) => c.section === s.id).flatMap((c) => c.metrics.map((m) => m.key)),
);
