// The run page's views of the sampled rollouts: the score distribution over steps (a heatmap per
// class), the interquartile bands behind the score lines, and the table of one step's rollouts
// with their text (a run with tools: each response as its turns, turns.js; a rollout that played
// an environment: its episode turn by turn, episodeView).
import { errorText, get, qs } from "/static/api.js";
import { CHARTS, ROLE_COLORS } from "/static/catalogue.js";
import { alpha, bandTraces, baseLayout, noteAnnotation, withNotes, X_TITLES } from "/static/charts.js";
import { alignSteps, runId, S, xOfSteps } from "/static/run_state.js";
import { quantile } from "/static/series.js";
import { turnFormat, turnsView } from "/static/turns.js";
import { $, fmtNum, h, toast } from "/static/util.js";

const CHART_BY_ID = Object.fromEntries(CHARTS.map((c) => [c.id, c]));
const POS = ROLE_COLORS.pos;
const NEG = ROLE_COLORS.neg;

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

export function iqrBands() {
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

export function heatmapFigure() {
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
  // Short titles, one per half (two long ones ran into each other); the unit is said once.
  layout.yaxis = { ...layout.yaxis, domain: [0.54, 1], title: { text: "correct", font: { size: 10.5 } } };
  layout.yaxis2 = { ...layout.yaxis, domain: [0, 0.46], anchor: "x", title: { text: "wrong", font: { size: 10.5 } } };
  layout.xaxis.anchor = "y2"; // the step axis under both halves, not between them
  layout.xaxis.title = { ...layout.xaxis.title, text: `${X_TITLES[S.xmode]} (y: ${yTitle})` };
  layout.showlegend = false;
  layout.hovermode = "closest";
  layout.xaxis.nticks = 10;
  if (S.xmode === "step" && S.maxStep <= 10) layout.xaxis.dtick = 1; // no repeated integer ticks
  alignSteps(layout.xaxis);
  if (S.xmode === "step") layout.xaxis.tickformat = "d";
  const notes = [];
  if (S.rolloutNote) notes.push(S.rolloutNote);
  if (per > 1) notes.push(`${by.size} steps merged into ${columns.length} columns`);
  withNotes(layout, notes.length ? [noteAnnotation(notes.join(" · "))] : []);
  return { traces, layout };
}

// ---- rollout table: the sampled rollouts of one step, with their text ----------------------------
let formatLoad = null;

/** How this run's responses split into turns (turns.js), or null for a run without tools:
 * the tools it may call and the output block's text, from GET /api/presets (asked once). */
function toolFormat() {
  const names = S.run?.config?.tools?.names;
  if (!Array.isArray(names) || !names.length) return Promise.resolve(null);
  formatLoad ??= get("/api/presets").then(
    (p) =>
      turnFormat(
        p.tools.filter((t) => names.includes(t.name)),
        p.tool_observation,
      ),
    (err) => {
      toast(`Could not load the tools' format (responses shown as plain text): ${errorText(err)}`, "error");
      return null;
    },
  );
  return formatLoad;
}

/** How an episode ended, in a word: failed (an environment fault), won (a winning return), cut
 * (the turn limit ended it before the environment said done) or lost. */
function episodeOutcome(ep) {
  if (ep.failure !== null && ep.failure !== undefined) return "failed";
  if (ep.succeeded) return "won";
  if (ep.truncated) return "cut";
  return "lost";
}

function episodeText(kind, label, text) {
  return h(`div.episode-${kind}`, {}, h("span.turn-label", {}, label), h("pre", {}, text));
}

/** A rollout's episode (the API's `episode`, conspo.sink.episode_json) in order: the
 * environment's first observation, then each turn's action, the environment's answer, its reward
 * and whether the episode was done; a turn that failed the episode shows why, in red. Model and
 * environment text alike is hostile: h() makes every piece a text node. */
function episodeView(ep) {
  const outcome = episodeOutcome(ep);
  const turns = ep.turns.map((t, i) => {
    const cut = t.cut_chars ? ` (${t.cut_chars} chars cut)` : "";
    const meta = `reward ${fmtNum(t.reward)} · ${t.done ? "done" : "not done"}`;
    return h(
      `div.episode-turn${t.error ? ".failed" : ""}`,
      { dataset: { turn: i + 1 } },
      episodeText("action", `turn ${i + 1} · model`, t.action),
      t.error ? h("div.episode-error", {}, t.error) : episodeText("observation", `environment${cut}`, t.observation),
      h("div.episode-meta", {}, meta),
    );
  });
  const n = ep.turns.length;
  const summary = `${n} turn${n === 1 ? "" : "s"} · ${outcome} · total reward ${fmtNum(ep.total_reward)}`;
  return h(
    "div.episode",
    { dataset: { outcome } },
    h("div.episode-summary", {}, summary),
    outcome === "failed" && !ep.turns.some((t) => t.error) ? h("div.episode-error", {}, ep.failure) : null,
    episodeText("first", "environment · start", ep.first_observation),
    ...turns,
  );
}

function answerCell(r, format) {
  const text = r.completion || "";
  if (r.episode) return h("td.text.turned", {}, episodeView(r.episode));
  if (format && text) return h("td.text.turned", {}, turnsView(text, format));
  if (!text && r.prompt)
    return h(
      "td.text.empty-completion",
      { title: "the model wrote nothing before its end token" },
      "(empty completion)",
    );
  return h("td.text", {}, text || "–");
}

/** The rollout's answer, and below it, folded, what a judge reward wrote of it (its first
 * judgement: the API's `critique`), as text. */
function completionCell(r, format) {
  const cell = answerCell(r, format);
  if (r.critique)
    cell.append(h("details.critique", {}, h("summary", {}, "judge's critique"), h("pre", {}, r.critique)));
  return cell;
}

export async function loadRolloutTable(step) {
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
    const [data, format] = await Promise.all([
      get(`/api/runs/${runId}/rollouts${qs({ step_min: at, step_max: at, text: true, limit: 512 })}`),
      toolFormat(),
    ]);
    const rows = data.items.map((r) =>
      h(
        `tr.${r.reward > 0 ? "pos" : "neg"}`,
        {},
        h("td.num", {}, r.group),
        h("td.num", {}, r.index),
        h("td.text", {}, r.prompt || "–"),
        completionCell(r, format),
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
