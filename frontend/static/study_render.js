// Renders a study (GET /api/studies/{id}) into a root element: the verdict, the per-arm and
// paired tables, separation statistics, grouped curves with the real n at each step, and for a
// search the parallel coordinates and parameter importances; for a tuned study its tuning phase
// (each tuned arm's trials and the settings it picked) before the verdict. Shared by the study page
// (study.js) and the self-contained HTML report, which inlines this file and util.js with their
// import/export lines stripped, so it must use nothing but util.js and a global Plotly.
import { color, countsText, fmtNum, h, seedsWithData, stepsBar } from "/static/util.js";

const CHART_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

/** The arm's colour: its index among the study's arms, the same on every chart and table. */
export function armColors(view) {
  return Object.fromEntries(view.arms.map((a, i) => [a.name, color(i)]));
}

function scaled(view, v) {
  return v === null || v === undefined ? null : v * (view.objective.scale || 1);
}

/** "[0.711, 1]", starred when the server cut it to the metric's range (see clipNote). */
function fmtCi(view, ci, digits = 3, clipped = false) {
  if (!ci) return "–";
  return `[${fmtNum(scaled(view, ci[0]), digits)}, ${fmtNum(scaled(view, ci[1]), digits)}]${clipped ? " *" : ""}`;
}

/** The footnote of a table with a starred interval. */
function clipNote(rows) {
  return rows.some((r) => r.ci_clipped)
    ? h("p.muted.small.clip-note", {}, "* cut to the metric's range (a mean of fractions stays within [0, 1])")
    : null;
}

function fmtP(p) {
  if (p === null || p === undefined) return "–";
  return p < 0.001 ? "< 0.001" : p.toFixed(3);
}

function swatch(colorValue, name) {
  return h("span.arm", {}, h("span.swatch", { style: `background:${colorValue}` }), name);
}

function table(id, head, rows) {
  return h(
    "table.grid",
    { id },
    h("thead", {}, h("tr", {}, ...head.map((c) => h("th", {}, c)))),
    h("tbody", {}, ...rows.map((r) => h("tr", {}, ...r.map((c) => h("td", {}, c))))),
  );
}

function unitText(view) {
  const o = view.objective;
  const reduce = o.reduce === "mean_last_k" ? `mean of the last ${o.k}` : o.reduce;
  const unit = o.unit ? ` (${o.unit}${o.scale !== 1 ? `, × ${o.scale}` : ""})` : "";
  return `${o.metric}, ${reduce}, ${o.direction === "max" ? "higher" : "lower"} is better${unit}`;
}

export function armTable(view, colors) {
  return h("div", {}, armGrid(view, colors), clipNote(view.arms));
}

function armGrid(view, colors) {
  return table(
    "arm-table",
    ["arm", "n", "mean", "95% CI (t)", "95% CI (bootstrap)", "sd"],
    view.arms.map((a) => [
      swatch(colors[a.name], a.name + (a.name === view.baseline ? " (baseline)" : "")),
      `${a.n} of ${a.planned}`,
      fmtNum(scaled(view, a.mean), 4),
      fmtCi(view, a.ci_t, 3, a.ci_clipped),
      a.ci_boot ? fmtCi(view, a.ci_boot, 3, a.ci_clipped) : a.n > 0 ? "– (needs ≥ 3 seeds)" : "–",
      fmtNum(scaled(view, a.sd), 3),
    ]),
  );
}

export function pairTable(view, colors) {
  return h("div", {}, pairGrid(view, colors), clipNote(view.pairs));
}

function pairGrid(view, colors) {
  return table(
    "pair-table",
    [
      "arm − baseline",
      "n pairs",
      "mean d",
      "95% CI (t)",
      "95% CI (bootstrap)",
      "p (paired t: decides)",
      "p (Wilcoxon: robustness check)",
      "wins / ties / losses",
      "P(improvement)",
      "seeds dropped",
    ],
    view.pairs.map((p) => [
      swatch(colors[p.arm], `${p.arm} − ${p.baseline}`),
      String(p.n),
      fmtNum(scaled(view, p.mean_d), 4),
      fmtCi(view, p.ci_t, 3, p.ci_clipped),
      p.ci_boot ? fmtCi(view, p.ci_boot, 3, p.ci_clipped) : p.n > 0 ? "– (needs ≥ 3 pairs)" : "–",
      fmtP(p.p_t),
      fmtP(p.p_wilcoxon),
      `${p.wins} / ${p.ties} / ${p.losses}`,
      p.p_improvement === null
        ? p.n > 0
          ? "– (needs ≥ 3 pairs)"
          : "–"
        : `${fmtNum(p.p_improvement, 3)} [${(p.p_improvement_ci || []).map((v) => fmtNum(v, 2)).join(", ") || "–"}]`,
      // "seed 0", not a bare "0" that reads as a count of none (the verdict names the seeds too)
      p.dropped.length ? `${p.dropped.length > 1 ? "seeds" : "seed"} ${p.dropped.join(", ")}` : "none",
    ]),
  );
}

function separationTable(view, colors) {
  const keys = [...new Set(Object.values(view.separation).flatMap((s) => Object.keys(s)))].sort();
  if (!keys.length) return h("p.muted", {}, "No separation statistics logged yet.");
  return table(
    "separation-table",
    ["arm", ...keys.map((k) => `${k} mean [95% CI] (n)`)],
    view.arms.map((a) => [
      swatch(colors[a.name], a.name),
      ...keys.map((k) => {
        const s = view.separation[a.name]?.[k];
        if (!s) return "–";
        const ci = s.ci_t ? ` [${fmtNum(s.ci_t[0], 3)}, ${fmtNum(s.ci_t[1], 3)}]` : "";
        return `${fmtNum(s.mean, 4)}${ci} (${s.n})`;
      }),
    ]),
  );
}

/** With several tasks: per arm and per paired difference, the mean and the IQM over every
 * task × seed run, each with its stratified bootstrap CI (seeds resampled within each task). */
function tasksTable(view, colors) {
  const t = view.tasks;
  const row = (name, label, agg) => [
    swatch(colors[name], label),
    Object.entries(agg.tasks)
      .map(([task, n]) => `${task}: ${n}`)
      .join(", "),
    fmtNum(scaled(view, agg.mean), 4),
    fmtCi(view, agg.ci_mean),
    fmtNum(scaled(view, agg.iqm), 4),
    fmtCi(view, agg.ci_iqm),
  ];
  return table(
    "tasks-table",
    ["arm", "runs per task", "mean", "95% CI (stratified)", "IQM", "95% CI (stratified)"],
    [
      ...view.arms.filter((a) => t.arms[a.name]).map((a) => row(a.name, a.name, t.arms[a.name])),
      ...Object.entries(t.pairs).map(([arm, agg]) => row(arm, `${arm} − ${view.baseline} (paired)`, agg)),
    ],
  );
}

// A row with no run: still pending, or never to be released (the study stopped first).
const unreleased = (r) => (r.state === "pending" ? "waiting for a slot" : "never released");

function runsTable(view, colors) {
  return table(
    "runs-table",
    ["arm", "seed", "run", "status", "step", "objective"],
    view.runs.map((r) => [
      swatch(colors[r.arm], r.task ? `${r.arm} · ${r.task}` : r.arm),
      String(r.seed),
      r.run_id ? h("a", { href: `/runs/${r.run_id}` }, r.name) : h("span.muted", {}, unreleased(r)),
      r.status,
      `${r.step} / ${r.total_steps ?? "?"}`,
      fmtNum(scaled(view, r.objective), 4),
    ]),
  );
}

/** Per seed (and task), a link to its arms' rollouts side by side (the rollout viewer takes 8
 * runs: a seed's first 8); a seed with one released run has nothing to set beside it. */
function rolloutLinks(view) {
  const bySeed = new Map();
  for (const r of view.runs) {
    if (!r.run_id) continue;
    const key = r.task ? `seed ${r.seed} · ${r.task}` : `seed ${r.seed}`;
    if (!bySeed.has(key)) bySeed.set(key, []);
    bySeed.get(key).push(r);
  }
  const links = [...bySeed]
    .filter(([, runs]) => runs.length > 1)
    .map(([key, runs]) =>
      h(
        "a.btn.btn-sm.rollouts-seed",
        {
          href: `/compare/rollouts?runs=${runs
            .slice(0, 8)
            .map((r) => r.run_id)
            .join(",")}`,
          title: `${key}: its arms' rollouts side by side at one step (${runs.map((r) => r.arm).join(", ")})`,
        },
        key,
      ),
    );
  if (!links.length) return [];
  return [
    h("h3.section-title", {}, "Rollouts side by side"),
    h(
      "p.rollouts-seeds",
      {},
      h("span.muted", {}, "Each seed's arms drew the same prompts: their groups at one step, per prompt: "),
      ...links.flatMap((a) => [a, " "]),
    ),
  ];
}

/** Mean lines solid where every seed of the arm reached the step, dotted where fewer did; the
 * hover gives n at each step, the legend its range; the band is the 95% t interval over the
 * seeds at that step. */
export function curveTraces(curve, arm, colorValue) {
  const full = curve.mean.map((m, i) => (curve.n[i] >= curve.seeds ? m : null));
  const partial = curve.mean.map((m, i) => {
    const short = curve.n[i] < curve.seeds;
    const edge = curve.n[i - 1] < curve.seeds || curve.n[i + 1] < curve.seeds;
    return short || edge ? m : null;
  });
  const text = curve.n.map((n) => `n = ${n} of ${curve.seeds}`);
  const traces = [];
  if (curve.lo.some((v) => v !== null)) {
    const xs = curve.steps.filter((_, i) => curve.lo[i] !== null);
    const lo = curve.lo.filter((v) => v !== null);
    const hi = curve.hi.filter((v) => v !== null);
    traces.push({
      x: [...xs, ...xs.slice().reverse()],
      y: [...hi, ...lo.slice().reverse()],
      fill: "toself",
      mode: "lines", // Plotly's default for a short trace adds markers: dots on the band's corners
      fillcolor: `${colorValue}26`,
      line: { width: 0 },
      hoverinfo: "skip",
      showlegend: false,
      legendgroup: arm,
      name: `${arm} 95% CI`,
    });
  }
  traces.push({
    x: curve.steps,
    y: full,
    text,
    mode: "lines",
    name: `${arm} (${seedsWithData(curve.n, curve.seeds)})`, // never the seeds planned
    legendgroup: arm,
    line: { color: colorValue, width: 2 },
    hovertemplate: `%{y:.4g} · %{text}<extra>${arm}</extra>`,
  });
  traces.push({
    x: curve.steps,
    y: partial,
    text,
    mode: "lines", // no markers: dots at a band's corners read as outliers
    name: `${arm}: fewer seeds`,
    legendgroup: arm,
    showlegend: false,
    line: { color: colorValue, width: 1.5, dash: "dot" },
    hovertemplate: `%{y:.4g} · %{text}<extra>${arm}</extra>`,
  });
  return traces;
}

const padded = ([lo, hi]) => [lo - 0.03 * (hi - lo), hi + 0.03 * (hi - lo)];

function curveCharts(view, colors, Plotly, root) {
  if (!view.curves) return;
  for (const [key, perArm] of Object.entries(view.curves)) {
    const traces = view.arms.flatMap((a) =>
      perArm[a.name]?.steps.length ? curveTraces(perArm[a.name], a.name, colors[a.name]) : [],
    );
    if (!traces.length) continue;
    const sampled = Object.values(perArm).some((c) => c.sampled);
    const div = h("div.chart", { "data-key": key });
    // The caption is text under the plot: as an annotation, a narrow chart clipped its start.
    const note = `mean over seeds, band = 95% t CI of the mean; dotted = fewer seeds than the arm has (n in the hover); no smoothing${sampled ? "; sampled to 400 steps" : ""}`;
    root.append(h("div.panel.chart-card", {}, h("h4", {}, key), div, h("p.muted.small.chart-caption", {}, note)));
    Plotly.newPlot(
      div,
      traces,
      {
        margin: { l: 52, r: 14, t: 56, b: 44 },
        height: 330,
        hovermode: "x unified",
        // above the plot, however many rows the arms take: never over the curves
        legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
        xaxis: { title: { text: "step" } },
        // A bounded metric (a fraction) is drawn on its own range, never past it.
        yaxis: { title: { text: key }, ...(view.bounds?.[key] ? { range: padded(view.bounds[key]) } : {}) },
      },
      CHART_CONFIG,
    );
  }
}

function searchCharts(view, Plotly, root) {
  const s = view.search;
  if (!s) return;
  const trials = s.trials.filter((t) => t.value !== null);
  root.append(h("h3.section-title", {}, `Search: ${s.sampler} sampler, ${s.trials.length} of ${s.n_trials} trials`));
  if (trials.length) {
    const dims = s.params.map((p) => {
      const values = trials.map((t) => t.params[p]);
      if (values.every((v) => typeof v === "number")) return { label: p, values };
      const choices = [...new Set(values.map(String))];
      return {
        label: p,
        values: values.map((v) => choices.indexOf(String(v))),
        tickvals: choices.map((_, i) => i),
        ticktext: choices,
      };
    });
    dims.push({ label: `objective (${view.objective.metric})`, values: trials.map((t) => scaled(view, t.value)) });
    const div = h("div.chart#parcoords");
    root.append(
      h(
        "div.panel.chart-card",
        {},
        h("h4", {}, "parallel coordinates (one line per trial, coloured by objective)"),
        div,
      ),
    );
    Plotly.newPlot(
      div,
      [
        {
          type: "parcoords",
          line: { color: trials.map((t) => t.value), colorscale: "Viridis", showscale: true },
          dimensions: dims,
        },
      ],
      { height: 320, margin: { l: 60, r: 40, t: 40, b: 20 } },
      CHART_CONFIG,
    );
  }
  const imp = Object.entries(s.importances || {});
  const div = h("div.chart#importances");
  root.append(
    h(
      "div.panel.chart-card",
      {},
      h("h4", {}, "parameter importances (optuna.importance, its default evaluator)"),
      imp.length ? div : h("p.muted", {}, s.importance_note || "needs 2+ finished trials"),
    ),
  );
  if (imp.length) {
    Plotly.newPlot(
      div,
      [{ type: "bar", orientation: "h", x: imp.map((e) => e[1]), y: imp.map((e) => e[0]) }],
      { height: 60 + 30 * imp.length, margin: { l: 140, r: 20, t: 10, b: 30 } },
      CHART_CONFIG,
    );
  }
}

/** A parameter's value as the tuning tables show it (a learning rate in exponent form). */
const paramText = (v) => (typeof v === "number" ? fmtNum(v, 3) : String(v));

/** "optim.lr 3.2e-4, params.tau 0.5" */
const paramsText = (params) =>
  Object.entries(params || {})
    .map(([k, v]) => `${k} ${paramText(v)}`)
    .join(", ");

/** A tuned arm's pick: its settings, its mean on the tuning seeds, and how sure it is. */
function pickLine(view, arm) {
  const pick = arm.pick;
  if (!pick)
    return h("p.muted.small.tuning-pick", {}, "searching: the pick comes when every arm's search has finished");
  if (pick.trial === null) return h("p.tuning-pick", {}, `${arm.arm}: ${pick.confidence}`);
  return h(
    "p.tuning-pick",
    {},
    h("strong", {}, `${arm.arm} runs at t${pick.trial}: ${paramsText(pick.params)}`),
    ` (mean ${fmtNum(scaled(view, pick.value), 4)} on the tuning seeds). ${pick.confidence}.`,
  );
}

/** A tuned study's first phase: per tuned arm its trials on the tuning seeds (parameters,
 * value, state, each seed's run) and the pick; the verdict further down reads the final seeds
 * alone. */
function tuningSection(view) {
  const t = view.tuning;
  if (!t) return [];
  const seeds = t.seeds.join(", ");
  const plan = `${t.planned.tuning_runs} tuning runs, then ${t.planned.final_runs} final runs`;
  const phase =
    t.phase === "tuning"
      ? `Phase 1 of 2 (${plan}): each tuned arm is searched on tuning seeds ${seeds}; the final runs on seeds ${view.seeds.join(", ")} start when every search has finished.`
      : `Phase 1 of 2, done: tuned on seeds ${seeds}. Phase 2 runs each arm at its pick on seeds ${view.seeds.join(", ")}; the verdict reads those runs only.`;
  const out = [h("h3.section-title#tuning-title", {}, "Tuning"), h("p.muted.small#tuning-phase", {}, phase)];
  for (const arm of t.arms) {
    const chosen = arm.pick?.trial;
    const rows = arm.trials.map((tr) => [
      tr.number === chosen ? h("strong", {}, `t${tr.number} ★`) : `t${tr.number}`,
      ...arm.params.map((p) => paramText(tr.params[p])),
      fmtNum(scaled(view, tr.value), 4),
      tr.state,
      h(
        "span",
        {},
        ...tr.runs.flatMap((r, i) => [
          i ? " · " : "",
          r.run_id
            ? h(
                "a",
                { href: `/runs/${r.run_id}`, title: r.name },
                `s${r.seed}: ${fmtNum(scaled(view, r.objective), 3)}`,
              )
            : h("span.muted", {}, `s${r.seed}: ${r.status}`),
        ]),
      ),
    ]);
    out.push(
      h(
        "div.panel.tuning-arm",
        { style: "overflow:auto", "data-scroll-x": "", dataset: { arm: arm.arm } },
        h("h4", {}, `${arm.arm}: ${arm.trials.length} of ${arm.n_trials} trials (${arm.sampler} sampler)`),
        table(`tuning-${arm.arm}`, ["trial", ...arm.params, "mean objective", "state", "runs (seed: objective)"], rows),
        pickLine(view, arm),
      ),
    );
  }
  out.push(h("p.muted.small", {}, `How sure a pick is: ${t.rule}.`));
  return out;
}

/** Why a study its owner did not cancel stopped (runs of it were cancelled from outside it):
 * a list of at most one line, spread into the page. */
function stoppedNote(view) {
  const ids = view.stopped_by || [];
  if (!ids.length) return [];
  const links = ids.flatMap((id, i) => [i ? ", " : "", h("a", { href: `/runs/${id}` }, `#${id}`)]);
  return [
    h(
      "p.muted#study-stopped",
      {},
      `Stopped: run${ids.length > 1 ? "s" : ""} `,
      ...links,
      ` ${ids.length > 1 ? "were" : "was"} cancelled outside the study, so it released no more runs.`,
    ),
  ];
}

export function renderStudy(view, root, Plotly) {
  const colors = armColors(view);
  root.replaceChildren();
  // a study's progress: the same figures as the studies list and the runs list's study row (a
  // comparison of runs, drawn by this renderer too, has only its runs' counts)
  const p = view.progress;
  root.append(
    h(
      "div.page-head",
      {},
      h("h1", {}, view.title || `Study ${view.id}: ${view.name}`),
      h("span.badge", { id: "study-status" }, view.status),
      h("span.muted#study-counts", {}, p ? `${p.runs} runs: ${countsText(p.counts)}` : countsText(view.counts)),
      p
        ? stepsBar(
            p.steps,
            p.total_steps,
            `steps done / planned (${p.started} of ${p.runs} runs started, ${p.ended} ended)`,
          )
        : null,
    ),
    ...stoppedNote(view),
    ...tuningSection(view),
    ...(view.tuning ? [h("h3.section-title", {}, "Verdict (final seeds)")] : []),
    h(
      "div.panel#verdict",
      {},
      ...(view.verdict.length ? view.verdict : ["no arm to compare yet"]).map((line) => h("p.verdict-line", {}, line)),
    ),
    h(
      "p.muted.small",
      {},
      `Objective: ${unitText(view)}. Seeds: ${view.seeds.join(", ")}. ${view.pairing_note || "Differences are paired by seed."} Values shown × ${view.objective.scale}.`,
    ),
    h("h3.section-title", {}, "Arms"),
    h("div.panel", { style: "overflow:auto", "data-scroll-x": "" }, armTable(view, colors)),
    h("h3.section-title", {}, `Paired differences against ${view.baseline}`),
    h(
      "div.panel",
      { style: "overflow:auto", "data-scroll-x": "" },
      view.pairs.length
        ? pairTable(view, colors)
        : h("p.muted", {}, view.unpaired?.length ? "none paired by seed: see the verdict lines above" : "one arm only"),
    ),
    ...(view.tasks
      ? [
          h("h3.section-title", {}, `Across tasks (${view.tasks.tasks.join(", ")})`),
          h("div.panel", { style: "overflow:auto", "data-scroll-x": "" }, tasksTable(view, colors)),
        ]
      : []),
    h("h3.section-title", {}, "Separation statistics over the objective's window"),
    h("div.panel", { style: "overflow:auto", "data-scroll-x": "" }, separationTable(view, colors)),
  );
  const charts = h("div.charts#study-charts");
  const curvesTitle = h("h3.section-title#curves-title", {}, "Curves");
  root.append(curvesTitle, charts);
  if (Plotly) {
    curveCharts(view, colors, Plotly, charts);
    searchCharts(view, Plotly, root);
  }
  curvesTitle.hidden = !charts.childElementCount; // no heading over nothing (no run logged yet)
  root.append(
    ...rolloutLinks(view),
    h("h3.section-title", {}, "Runs"),
    h("div.panel", { style: "overflow:auto", "data-scroll-x": "" }, runsTable(view, colors)),
  );
}
