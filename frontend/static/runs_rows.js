// The runs list's rows: a run's row, and a group's header row (its arms, progress against the
// planned work, a sparkline per arm and each arm's mean). Built from the page's `state` (runs.js),
// passed in.
import { qs } from "/static/api.js";
import { fromText, pipelineInfo, pipelineLink } from "/static/lineage.js";
import { noteLine } from "/static/notes.js";
import {
  armsOf,
  groupKey,
  groupName,
  meanSd,
  meanSeries,
  shownValue,
  statusCounts,
  usedConfig,
  valueSummary,
} from "/static/runs_table.js";
import {
  color,
  countsText,
  FINISHED,
  fmtAgo,
  fmtNum,
  fmtTime,
  fmtValue,
  getPath,
  h,
  progressBar,
  resourcesText,
  sparkline,
  sparklines,
  statusBadge,
  stepsBar,
  waitingNote,
} from "/static/util.js";

export function sparkFor(state, id) {
  return sparkline(state.sparks.get(id)?.values || [], { range: state.range });
}

/** A cell per column: the runs' value of that config path, "varies", or "–" where the run does
 * not use the parameter (`needs`: runs_table.paramNeedsOf). */
export function hyperCells(runs, cols, needs = {}) {
  const configs = runs.map((r) => usedConfig(r, needs));
  return cols.map((key) => {
    const values = new Set(configs.map((c) => JSON.stringify(getPath(c, key) ?? null)));
    const text = values.size === 1 ? fmtValue(getPath(configs[0], key)) : "varies";
    return h("td.hp.mono", { "data-key": key }, text);
  });
}

export function queuePlace(run) {
  if (run.status !== "queued" || !run.queue_position) return null;
  return h(
    "div.muted.small.queue-place",
    { title: "place in the queue (1 = next to start)" },
    `#${run.queue_position} in queue`,
  );
}

export function rowFor(state, run, cols, onPipelineSize) {
  const sel = state.selected.has(run.id);
  const key = groupKey(run);
  const inGroup = key && state.groupOf.get(run.id) === key;
  const value = shownValue(state, run); // what the list is ordered by, when it is a summary
  const finished = FINISHED.has(run.status);
  const actions = h(
    "div.actions",
    {},
    finished || run.cancel_requested
      ? null
      : h("button.btn.btn-xs", { "data-act": "cancel", title: "Cancel this run" }, "Cancel"),
    // External runs were trained elsewhere: there is no job to clone or rerun.
    run.external ? null : h("button.btn.btn-xs", { "data-act": "clone", title: "Queue a copy of this run" }, "Clone"),
    run.external
      ? null
      : h("a.btn.btn-xs", { href: `/runs/new?from=${run.id}`, title: "Open the form with this run's config" }, "Edit…"),
    h("button.btn.btn-xs.btn-danger", { "data-act": "delete", title: "Delete run and its metrics" }, "Delete"),
  );
  return h(
    `tr${sel ? ".selected" : ""}${inGroup ? ".in-group" : ""}`,
    { "data-id": run.id, "data-group": inGroup ? key : null, hidden: inGroup && !state.open.has(key) },
    h("td", {}, h("input", { type: "checkbox", class: "sel", checked: sel, "aria-label": `select run ${run.id}` })),
    h(
      "td.name",
      {},
      h("a", { href: `/runs/${run.id}` }, run.name || `run ${run.id}`),
      " ",
      h("span.muted.small", {}, `#${run.id}`),
      run.seed !== null && run.seed !== undefined ? h("span.muted.small", {}, ` · seed ${run.seed}`) : null,
      studyLink(run),
      run.pipeline_id !== null && run.pipeline_id !== undefined ? " · " : null,
      pipelineLink(run, onPipelineSize), // one function for every row: called once, with the id
      run.pipeline_id == null && fromText(run) ? h("span.muted.small", {}, ` · ${fromText(run)}`) : null,
      noteLine(run.note) ? h("div.note-line.muted.small", { title: run.note }, noteLine(run.note)) : null,
    ),
    h("td", {}, statusBadge(run), queuePlace(run), waitingNote(run)),
    h("td", {}, run.algorithm || run.kind || "–"),
    h("td.opt", {}, run.task || "–"),
    h("td.mono.opt", {}, run.model || "–"),
    h(
      "td.resources.opt",
      { title: "config.resources: processes per node × nodes, as the machine holds them (GPUs, or CPU processes)" },
      resourcesText(run),
    ),
    h("td.opt", {}, run.owner || "–"),
    h(
      "td.opt",
      {},
      (run.tags || []).map((t) => h("span.tag", {}, t)),
    ),
    hyperCells([run], cols, state.paramNeeds),
    h("td", {}, progressBar(run)),
    h("td.spark-cell", {}, sparkFor(state, run.id)),
    h("td.num.value-cell", {}, fmtNum(value)),
    h("td.muted.opt", { title: fmtTime(run.created_at) }, fmtAgo(run.created_at)),
    h("td", {}, actions),
  );
}

/** A group's header row: its name, n, status counts, shared config values, and the mean ± sd
 * of the column's metric over its runs' last values; the toggle shows or hides its runs. */
export function studyLink(run) {
  const m = /^study-(\d+)$/.exec(run.group_id || "");
  return m
    ? h(
        "a.small",
        { href: `/studies/${m[1]}`, title: "Open the study: verdict and paired differences" },
        ` · study ${m[1]}`,
      )
    : null;
}

/** The studies list's item of a study's group (GET /api/studies: its plan), if any. */
function studyOfGroup(state, key) {
  const study = /^g:study-(\d+)$/.exec(key);
  return study ? state.studies.get(Number(study[1])) : undefined;
}

/** The name of a study's or a pipeline's group (its studies list item; its pipeline, read once
 * by lineage.js, whose arrival redraws the rows of its runs and so this one), if known yet. */
function knownName(state, key) {
  const pipeline = /^p:(\d+)$/.exec(key);
  return pipeline ? pipelineInfo(Number(pipeline[1]))?.name : studyOfGroup(state, key)?.name;
}

/** "15 runs (2 started) · 3 arms": a study counts its plan (`progress`, as the studies list and
 * its page do), not the runs listed (a demo of 15 runs read "2 runs · 2 arms" while two ran, and
 * still "2 runs" once cancelled); another group its listed runs. */
function groupCount(state, key, runs, arms) {
  const study = studyOfGroup(state, key);
  if (study?.progress) {
    const n = study.arms.length;
    const what = study.search ? "search" : `${n} arm${n === 1 ? "" : "s"}`;
    return `${study.progress.runs} runs (${study.progress.started} started) · ${what}`;
  }
  return `${runs.length} runs${arms.length > 1 ? ` · ${arms.length} arms` : ""}`;
}

/** "2 running · 13 pending": a study's runs per status, its rows not released yet too. */
function groupStatus(state, key, runs) {
  const planned = studyOfGroup(state, key)?.progress;
  return planned ? countsText(planned.counts) : statusCounts(runs);
}

/** "1,290/4,500 steps": a group's progress against its planned work. A study's plan is the
 * server's (`state.studies`: its pending runs count too), else the listed runs' total. */
function groupProgress(state, key, runs) {
  const planned = studyOfGroup(state, key)?.progress;
  const steps = planned ? planned.steps : runs.reduce((a, r) => a + (r.step || 0), 0);
  const total = planned ? planned.total_steps : runs.reduce((a, r) => a + (r.total_steps || r.config?.steps || 0), 0);
  const runsText = planned
    ? `${planned.started} of ${planned.runs} runs started, ${planned.ended} ended`
    : `${runs.length} runs`;
  const bar = stepsBar(steps, total, `steps done / planned over all its runs (${runsText})`);
  bar.classList.add("group-progress");
  return bar;
}

/** Per arm: its mean curve in the sparkline, its mean ± sd of the runs' values (last, or the
 * summary the list is ordered by: the column's `shownValue`). Arms are
 * never averaged together (a GRPO and a ConSPO run's mean means nothing). */
function armStats(state, runs) {
  const arms = armsOf(runs);
  const lines = arms.map((arm, i) => {
    const mean = meanSeries(arm.runs.map((r) => state.sparks.get(r.id)));
    return { xs: mean.steps, ys: mean.values, color: arms.length > 1 ? color(i) : undefined, name: arm.label };
  });
  const stats = arms.map((arm, i) => {
    const stat = meanSd(arm.runs.map((r) => shownValue(state, r)));
    return h(
      "div.arm-stat",
      { "data-arm": arm.label },
      arms.length > 1 ? h("span.swatch", { style: `background:${color(i)}` }) : null,
      arms.length > 1 ? `${arm.label} ` : null,
      stat.text,
    );
  });
  return { lines, stats, arms };
}

/** A group's header row: its name, n, status counts, shared config values, progress against the
 * planned work, and per arm a sparkline and the mean ± sd of the column's metric over its runs'
 * last values; the toggle shows or hides its runs. */
export function groupRowFor(state, key, ids, cols) {
  const runs = ids.map((id) => state.runs.get(id));
  const open = state.open.has(key);
  const shared = (f) => {
    const vals = new Set(runs.map(f));
    return vals.size === 1 ? [...vals][0] || "–" : "mixed";
  };
  const { lines, stats, arms } = armStats(state, runs);
  return h(
    "tr.group-row",
    { "data-group": key },
    h("td", {}, h("input", { type: "checkbox", class: "group-sel", "aria-label": `select group ${key}` })),
    h(
      "td.name",
      {},
      h(
        "button.group-toggle",
        { type: "button", "aria-expanded": String(open), title: open ? "Hide its runs" : "Show its runs" },
        open ? "▾" : "▸",
      ),
      " ",
      h("strong", {}, groupName(key, runs, knownName(state, key))),
      " ",
      h("span.muted.small.group-n", {}, groupCount(state, key, runs, arms)),
      studyLink(runs[0]), // a study's group row links its verdict page, folded or not
    ),
    h("td.small.group-status", {}, groupStatus(state, key, runs)),
    h(
      "td",
      {},
      shared((r) => r.algorithm),
    ),
    h(
      "td.opt",
      {},
      shared((r) => r.task),
    ),
    h(
      "td.mono.opt",
      {},
      shared((r) => r.model),
    ),
    h("td.opt", {}, ""),
    h(
      "td.opt",
      {},
      shared((r) => r.owner),
    ),
    h("td.opt", {}, ""),
    hyperCells(runs, cols, state.paramNeeds),
    h("td", {}, groupProgress(state, key, runs)),
    h("td.spark-cell", {}, sparklines(lines, { range: state.range })),
    h(
      "td.num.group-stat",
      { title: `${state.metric}: per arm, mean ± sd of the runs' ${valueSummary(state.orderBy, state.metric)} values` },
      stats,
    ),
    h("td.muted.opt", {}, ""),
    h(
      "td",
      {},
      h(
        "a.btn.btn-xs",
        {
          // grouped as the group is: a study's runs by arm, others by algorithm
          href: `/compare${qs({ runs: [...ids].sort((a, b) => a - b), group: runs.some((r) => r.arm) ? "arm" : "algorithm" })}`,
          title: "Compare its runs: mean ± band",
        },
        "Compare",
      ),
    ),
  );
}
