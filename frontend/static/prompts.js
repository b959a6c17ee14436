// "Prompt difficulty over time" on the run page, from GET /api/runs/{id}/prompts: the prompts of
// each step stacked by pass-rate band, and how many prompts seen so far were learned, forgotten,
// never solved or always solved (the endpoint defines each). The section exists only once the
// run has prompt data (external runs may log none). Always drawn against the step.
import { get, qs } from "/static/api.js";
import { ROLE_COLORS } from "/static/catalogue.js";
import { alpha, baseLayout, chartCard, react } from "/static/charts.js";
import { h } from "/static/util.js";

const PAGE = 10000; // the endpoint's largest page
const BANDS = [
  { field: "zero", name: "pass rate 0", color: ROLE_COLORS.neg },
  { field: "low", name: "(0, 0.5)", color: ROLE_COLORS.accent2 },
  { field: "high", name: "[0.5, 1)", color: ROLE_COLORS.accent3 },
  { field: "one", name: "pass rate 1", color: ROLE_COLORS.pos },
];
const FATES = [
  { field: "learned", name: "learned", color: ROLE_COLORS.pos },
  { field: "forgotten", name: "forgotten", color: ROLE_COLORS.neg },
  { field: "never_solved", name: "never solved", color: ROLE_COLORS.accent2, dash: "dot" },
  { field: "always_solved", name: "always solved", color: ROLE_COLORS.accent3, dash: "dot" },
];
const BAND_HELP =
  "Prompts sampled at each step, by their pass rate (correct rollouts / rollouts of the prompt at that step).";
const FATE_HELP =
  "Of the prompts seen up to each step: learned = pass rate < 0.5 at first sighting and ≥ 0.5 at the latest;" +
  " forgotten = the reverse; never solved = no correct rollout yet; always solved = every rollout correct so far.";

/** All pages of the run's prompt view, as one object of arrays. */
async function loadAll(runId) {
  let data = null;
  let stepMin = 0;
  for (;;) {
    const page = await get(`/api/runs/${runId}/prompts${qs({ step_min: stepMin, max_steps: PAGE })}`);
    if (!data) data = page;
    else for (const [k, v] of Object.entries(page)) if (Array.isArray(v)) data[k].push(...v);
    if (page.next_step_min === null) return data;
    stepMin = page.next_step_min;
  }
}

function bandFigure(data) {
  const traces = BANDS.map((b) => ({
    x: data.steps,
    y: data[b.field],
    type: "scatter",
    mode: "lines",
    stackgroup: "bands",
    name: b.name,
    line: { width: 0.5, color: b.color },
    fillcolor: alpha(b.color, 0.75),
  }));
  const layout = baseLayout({ uirevision: "prompts", yTitle: "prompts" });
  layout.hovermode = "x unified";
  return { traces, layout };
}

function fateFigure(data) {
  const traces = FATES.map((f) => ({
    x: data.steps,
    y: data[f.field],
    type: "scatter",
    mode: "lines",
    name: f.name,
    line: { color: f.color, dash: f.dash || "solid" },
  }));
  traces.push({
    x: data.steps,
    y: data.seen,
    type: "scatter",
    mode: "lines",
    name: "seen",
    visible: "legendonly", // the scale of the other four would vanish under it
    line: { color: ROLE_COLORS.reference, dash: "dash" },
  });
  const layout = baseLayout({ uirevision: "prompts", yTitle: "prompts seen so far" });
  layout.yaxis.rangemode = "tozero";
  layout.hovermode = "x unified";
  return { traces, layout };
}

/** The section, placed after `anchor`; `refresh()` reloads and redraws it (no-op without data). */
export function promptView(runId, anchor) {
  let section = null;
  let plots = null;
  let busy = false;

  function build() {
    const bands = chartCard("prompt-bands", "Prompts by pass-rate band", BAND_HELP, {});
    const fates = chartCard("prompt-fates", "Learned / forgotten / never / always solved", FATE_HELP, {});
    section = h(
      "div",
      { "data-section": "prompts" },
      h("h3.section-title", {}, "Prompt difficulty over time"),
      h("div.charts", {}, bands.card, fates.card),
    );
    anchor.after(section);
    plots = { bands: bands.plot, fates: fates.plot };
  }

  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const data = await loadAll(runId);
      anchor.dataset.promptSteps = String(data.steps.length); // what the last load found
      if (!data.steps.length) return;
      if (!section) build();
      for (const [plot, figure] of [
        [plots.bands, bandFigure(data)],
        [plots.fates, fateFigure(data)],
      ]) {
        figure.layout.datarevision = data.steps.length;
        react(plot, figure.traces, figure.layout);
      }
    } catch (err) {
      console.warn("prompts", err);
    } finally {
      busy = false;
    }
  }

  return { refresh };
}
