// Runs page: a live table of runs with filters, progress/ETA, a sparkline per run and actions.
// Runs of one submission (seeds), study or pipeline collapse under a group row (n, status
// counts, mean ± sd of the column's metric); the config keys that differ among the listed runs
// get columns (toggleable); every sparkline of the column shares one y-scale, shown in its head.
// `/?group=<group_id>` lists one group, opened (where the form lands after "Start N runs").
import { del, errorText, get, post, qs, stream } from "/static/api.js";
import { CHARTED_KEYS, KEY_METRICS } from "/static/catalogue.js";
import { fromText, pipelineLink } from "/static/lineage.js";
import {
  groupKey,
  groupName,
  hyperLabel,
  meanSd,
  sharedRange,
  statusCounts,
  tableRows,
  varyingKeys,
} from "/static/runs_table.js";
import {
  $,
  debounce,
  FINISHED,
  fmtAgo,
  fmtNum,
  fmtTime,
  fmtValue,
  getPath,
  h,
  progressBar,
  resourcesText,
  setConn,
  sparkline,
  statusBadge,
  toast,
  waitingNote,
} from "/static/util.js";

// Any charted catalogue metric can fill the sparkline column; the first key metric by default.
const SPARK_METRICS = CHARTED_KEYS;
const DEFAULT_SPARK = KEY_METRICS[0];
// Hyperparameter columns shown until the user picks: the first few keys that vary.
const AUTO_HYPER_COLUMNS = 4;

const params = new URLSearchParams(location.search);
const state = {
  q: params.get("q") || "",
  status: params.get("status") || "",
  algorithm: params.get("algorithm") || "",
  task: params.get("task") || "",
  tag: params.get("tag") || "",
  metric: params.get("metric") || DEFAULT_SPARK,
  group: params.get("group") || "", // a group_id: list only that group's runs
  cols: params.has("cols") ? params.get("cols").split(",").filter(Boolean) : null, // null: auto
  open: new Set(), // group keys shown expanded
  groupOf: new Map(), // run id → its group's key, for runs listed under a group row
  varying: [], // config keys that differ among the listed runs
  runs: new Map(), // id → Run, in table order
  order: [],
  selected: new Set(),
  sparks: new Map(), // id → values
  range: null, // [min, max] shared by every sparkline of the column
  total: 0,
};
if (state.group) state.open.add(`g:${state.group}`);

const body = $("#runs-body");

function syncUrl() {
  const q = qs({
    q: state.q,
    status: state.status,
    algorithm: state.algorithm,
    task: state.task,
    tag: state.tag,
    metric: state.metric === DEFAULT_SPARK ? "" : state.metric,
    group: state.group,
    cols: state.cols ? state.cols.join(",") : "",
  });
  history.replaceState(null, "", `/${q}`);
}

function matches(run) {
  if (state.group && run.group_id !== state.group) return false;
  if (state.status && run.status !== state.status) return false;
  if (state.algorithm && run.algorithm !== state.algorithm) return false;
  if (state.task && run.task !== state.task) return false;
  if (state.tag && !(run.tags || []).includes(state.tag)) return false;
  if (state.q && !(run.name || "").toLowerCase().includes(state.q.toLowerCase())) return false;
  return true;
}

async function loadRuns() {
  const query = qs({
    status: state.status,
    algorithm: state.algorithm,
    task: state.task,
    tag: state.tag,
    q: state.q,
    group_id: state.group,
    sort: "-created_at",
    limit: 200,
  });
  try {
    const data = await get(`/api/runs${query}`);
    state.runs = new Map(data.items.map((r) => [r.id, r]));
    state.order = data.items.map((r) => r.id);
    state.total = data.total;
    for (const id of [...state.selected]) if (!state.runs.has(id)) state.selected.delete(id);
    render();
    loadSparks(state.order);
  } catch (err) {
    toast(`Could not load runs: ${errorText(err)}`, "error");
  }
}

async function loadSparks(ids) {
  const chunks = [];
  for (let i = 0; i < ids.length; i += 50) chunks.push(ids.slice(i, i + 50));
  for (const chunk of chunks) {
    if (!chunk.length) continue;
    try {
      const data = await get(`/api/compare${qs({ runs: chunk, keys: [state.metric], max_points: 80 })}`);
      for (const [rid, entry] of Object.entries(data.runs || {})) {
        const s = entry.series?.[state.metric];
        state.sparks.set(Number(rid), s ? s.values : []);
      }
      updateSparks();
    } catch (err) {
      console.warn("sparklines", errorText(err));
    }
  }
}

/** Redraw every sparkline on the column's shared y-scale (one run's new points can widen it). */
function updateSparks() {
  state.range = sharedRange(state.order.map((id) => state.sparks.get(id)));
  for (const cell of body.querySelectorAll("tr[data-id] td.spark-cell")) {
    cell.replaceChildren(sparkFor(Number(cell.parentElement.dataset.id)));
  }
  sparkHead();
}

function sparkFor(id) {
  return sparkline(state.sparks.get(id) || [], { range: state.range });
}

function sparkHead() {
  const r = state.range;
  $("#spark-head").replaceChildren(
    state.metric,
    h(
      "div.spark-scale.small",
      { title: "every sparkline in this column is drawn on this one y-range, so rows compare" },
      r ? `y ${fmtNum(r[0], 3)} … ${fmtNum(r[1], 3)}` : "",
    ),
  );
}

/** The config keys shown as columns: the user's pick, else the first few that vary. */
function hyperColumns() {
  const listed = state.order.map((id) => state.runs.get(id));
  state.varying = varyingKeys(listed);
  return state.cols ?? state.varying.slice(0, AUTO_HYPER_COLUMNS);
}

function hyperCells(runs, cols) {
  return cols.map((key) => {
    const values = new Set(runs.map((r) => JSON.stringify(getPath(r.config, key) ?? null)));
    const text = values.size === 1 ? fmtValue(getPath(runs[0].config, key)) : "varies";
    return h("td.hp.mono", { "data-key": key }, text);
  });
}

function queuePlace(run) {
  if (run.status !== "queued" || !run.queue_position) return null;
  return h(
    "div.muted.small.queue-place",
    { title: "place in the queue (1 = next to start)" },
    `#${run.queue_position} in queue`,
  );
}

function rowFor(run, cols) {
  const sel = state.selected.has(run.id);
  const key = groupKey(run);
  const inGroup = key && state.groupOf.get(run.id) === key;
  const last = run.summary ? run.summary[state.metric] : undefined;
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
      pipelineLink(run, () => refreshPipelineRows(run.pipeline_id)),
      run.pipeline_id == null && fromText(run) ? h("span.muted.small", {}, ` · ${fromText(run)}`) : null,
    ),
    h("td", {}, statusBadge(run), queuePlace(run), waitingNote(run)),
    h("td", {}, run.algorithm || run.kind || "–"),
    h("td.opt", {}, run.task || "–"),
    h("td.mono.opt", {}, run.model || "–"),
    h("td.resources.opt", { title: "config.resources: GPUs per node × nodes" }, resourcesText(run)),
    h("td.opt", {}, run.owner || "–"),
    h(
      "td.opt",
      {},
      (run.tags || []).map((t) => h("span.tag", {}, t)),
    ),
    hyperCells([run], cols),
    h("td", {}, progressBar(run)),
    h("td.spark-cell", {}, sparkFor(run.id)),
    h("td.num", {}, fmtNum(last)),
    h("td.muted.opt", { title: fmtTime(run.created_at) }, fmtAgo(run.created_at)),
    h("td", {}, actions),
  );
}

/** A group's header row: its name, n, status counts, shared config values, and the mean ± sd
 * of the column's metric over its runs' last values; the toggle shows or hides its runs. */
function groupRowFor(key, ids, cols) {
  const runs = ids.map((id) => state.runs.get(id));
  const open = state.open.has(key);
  const stat = meanSd(runs.map((r) => r.summary?.[state.metric]));
  const shared = (f) => {
    const vals = new Set(runs.map(f));
    return vals.size === 1 ? [...vals][0] || "–" : "mixed";
  };
  const steps = runs.reduce((a, r) => a + (r.step || 0), 0);
  const total = runs.reduce((a, r) => a + (r.total_steps || r.config?.steps || 0), 0);
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
      h("strong", {}, groupName(key, runs)),
      " ",
      h("span.muted.small.group-n", {}, `${runs.length} runs`),
      studyLink(runs[0]), // a study's group row links its verdict page, folded or not
    ),
    h("td.small.group-status", {}, statusCounts(runs)),
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
    hyperCells(runs, cols),
    h("td.muted.small", { title: "steps done / planned, all its runs" }, `${steps}/${total || "?"}`),
    h("td.spark-cell", {}, ""),
    h("td.num.group-stat", { title: `${state.metric}: mean ± sd of the runs' last values` }, stat.text),
    h("td.muted.opt", {}, ""),
    h(
      "td",
      {},
      h(
        "a.btn.btn-xs",
        { href: `/compare${qs({ runs: [...ids].sort((a, b) => a - b) })}`, title: "Compare its runs: mean ± band" },
        "Compare",
      ),
    ),
  );
}

function render() {
  const cols = hyperColumns();
  state.groupOf = new Map();
  const rows = [];
  for (const row of tableRows(state.order, state.runs)) {
    if (row.run !== undefined) {
      rows.push(rowFor(state.runs.get(row.run), cols));
      continue;
    }
    for (const id of row.runs) state.groupOf.set(id, row.group);
    rows.push(groupRowFor(row.group, row.runs, cols), ...row.runs.map((id) => rowFor(state.runs.get(id), cols)));
  }
  body.replaceChildren(...rows);
  renderHead(cols);
  $("#runs-empty").hidden = state.order.length > 0;
  $("#count").textContent = `${state.order.length} of ${state.total} run${state.total === 1 ? "" : "s"}`;
  $("#group-chip").hidden = !state.group;
  if (state.group) {
    const listed = state.order.map((id) => state.runs.get(id));
    $("#group-chip-name").textContent = listed.length ? groupName(`g:${state.group}`, listed) : state.group;
  }
  sparkHead();
  updateSelection();
}

/** Re-render the rows of a pipeline's runs once its number of stages is known. */
function refreshPipelineRows(pipelineId) {
  for (const r of state.runs.values()) if (r.pipeline_id === pipelineId) updateRow(r);
}

/** The hyperparameter heads (before Progress) and the column picker's choices. */
function renderHead(cols) {
  for (const th of document.querySelectorAll("#runs-table th.hp")) th.remove();
  const before = $("#progress-head");
  for (const key of cols) before.before(h("th.hp", { "data-key": key, title: `config.${key}` }, hyperLabel(key)));
  const offered = [...new Set([...state.varying, ...cols])];
  $("#cols-list").replaceChildren(
    ...offered.map((key) =>
      h("label.inline.small", {}, h("input", { type: "checkbox", value: key, checked: cols.includes(key) }), ` ${key}`),
    ),
  );
  $("#cols-picker summary").textContent = `columns (${cols.length})`;
  $("#cols-picker").hidden = offered.length === 0;
}

function updateRow(run) {
  state.runs.set(run.id, run);
  const row = body.querySelector(`tr[data-id="${run.id}"]`);
  if (!row) return;
  const cols = hyperColumns();
  row.replaceWith(rowFor(run, cols));
  const key = state.groupOf.get(run.id);
  if (key) {
    const ids = [...state.groupOf].filter(([, k]) => k === key).map(([id]) => id);
    body.querySelector(`tr.group-row[data-group="${key}"]`)?.replaceWith(groupRowFor(key, ids, cols));
    updateSelection();
  }
}

function updateSelection() {
  const n = state.selected.size;
  $("#compare-btn").disabled = n < 2;
  $("#compare-btn").textContent = n ? `Compare selected (${n})` : "Compare selected";
  $("#cancel-sel-btn").disabled = n === 0;
  $("#delete-sel-btn").disabled = n === 0;
  $("#sel-all").checked = n > 0 && n === state.order.length;
  for (const box of body.querySelectorAll("input.group-sel")) {
    const ids = groupIds(box.closest("tr").dataset.group);
    const picked = ids.filter((id) => state.selected.has(id)).length;
    box.checked = picked === ids.length;
    box.indeterminate = picked > 0 && picked < ids.length;
  }
}

function groupIds(key) {
  return [...state.groupOf].filter(([, k]) => k === key).map(([id]) => id);
}

function toggleGroup(key) {
  if (state.open.has(key)) state.open.delete(key);
  else state.open.add(key);
  const open = state.open.has(key);
  for (const tr of body.querySelectorAll(`tr[data-id][data-group="${key}"]`)) tr.hidden = !open;
  const btn = body.querySelector(`tr.group-row[data-group="${key}"] .group-toggle`);
  btn.textContent = open ? "▾" : "▸";
  btn.setAttribute("aria-expanded", String(open));
  btn.title = open ? "Hide its runs" : "Show its runs";
}

async function act(kind, id) {
  try {
    if (kind === "cancel") {
      updateRow(await post(`/api/runs/${id}/cancel`));
      toast(`Cancel requested for run ${id}`);
    } else if (kind === "clone") {
      const res = await post(`/api/runs/${id}/clone`, { overrides: {} });
      toast(`Cloned run ${id} → ${res.runs.map((r) => `#${r.id}`).join(", ")}`, "ok");
      await loadRuns();
    } else if (kind === "delete") {
      if (!confirm(`Delete run ${id} and all its metrics?`)) return;
      await del(`/api/runs/${id}`);
      state.selected.delete(id);
      toast(`Deleted run ${id}`);
      await loadRuns();
    }
  } catch (err) {
    toast(`${kind} failed: ${errorText(err)}`, "error");
  }
}

body.addEventListener("click", (ev) => {
  const groupRow = ev.target.closest("tr.group-row");
  if (groupRow) {
    const key = groupRow.dataset.group;
    if (ev.target.closest(".group-toggle")) toggleGroup(key);
    else if (ev.target.classList.contains("group-sel")) {
      for (const id of groupIds(key)) {
        if (ev.target.checked) state.selected.add(id);
        else state.selected.delete(id);
        body.querySelector(`tr[data-id="${id}"]`)?.classList.toggle("selected", ev.target.checked);
      }
      updateSelection();
    }
    return;
  }
  const row = ev.target.closest("tr[data-id]");
  if (!row) return;
  const id = Number(row.dataset.id);
  const btn = ev.target.closest("button[data-act]");
  if (btn) {
    act(btn.dataset.act, id);
    return;
  }
  if (ev.target.classList.contains("sel")) {
    if (ev.target.checked) state.selected.add(id);
    else state.selected.delete(id);
    row.classList.toggle("selected", ev.target.checked);
    updateSelection();
  }
});

$("#sel-all").addEventListener("change", (ev) => {
  state.selected = ev.target.checked ? new Set(state.order) : new Set();
  render();
});
$("#compare-btn").addEventListener("click", () => {
  location.href = `/compare${qs({ runs: [...state.selected].sort((a, b) => a - b) })}`;
});
$("#cancel-sel-btn").addEventListener("click", async () => {
  for (const id of state.selected) {
    const run = state.runs.get(id);
    if (run && !FINISHED.has(run.status)) await act("cancel", id);
  }
});
$("#delete-sel-btn").addEventListener("click", async () => {
  const ids = [...state.selected];
  if (!confirm(`Delete ${ids.length} run(s) and all their metrics?`)) return;
  for (const id of ids) {
    try {
      await del(`/api/runs/${id}`);
    } catch (err) {
      toast(`delete ${id} failed: ${errorText(err)}`, "error");
    }
  }
  state.selected.clear();
  await loadRuns();
});

function bindFilter(id, key, evName = "change") {
  const el = $(id);
  el.value = state[key];
  el.addEventListener(
    evName,
    debounce(
      () => {
        state[key] = el.value.trim();
        syncUrl();
        if (key === "metric") {
          state.sparks.clear();
          state.range = null;
          render();
          loadSparks(state.order);
        } else {
          loadRuns();
        }
      },
      evName === "input" ? 250 : 0,
    ),
  );
}

async function loadPresets() {
  try {
    const p = await get("/api/presets");
    for (const a of p.algorithms) $("#f-algorithm").append(h("option", { value: a.name }, a.name));
    for (const t of p.tasks) $("#f-task").append(h("option", { value: t.name }, t.name));
  } catch (err) {
    console.warn("presets", errorText(err));
  }
  $("#f-algorithm").value = state.algorithm;
  $("#f-task").value = state.task;
}

// Live updates: the run stream, with polling as a fallback while it is down.
const sparkRefresh = new Set();
const flushSparks = debounce(() => {
  const ids = [...sparkRefresh];
  sparkRefresh.clear();
  loadSparks(ids);
}, 2000);
const reloadSoon = debounce(loadRuns, 500);
let pollTimer = null;

function onRunEvent(run) {
  if (!run || run.id === undefined) return;
  if (state.runs.has(run.id)) {
    const before = state.runs.get(run.id);
    updateRow(run);
    if (!matches(run)) reloadSoon();
    else if (run.step !== before.step || run.status !== before.status) {
      sparkRefresh.add(run.id);
      flushSparks();
    }
  } else if (matches(run)) {
    reloadSoon();
  }
}

function startStream() {
  stream("/api/stream/runs", { run: onRunEvent }, (open) => {
    setConn(open ? "live" : "off");
    if (open && pollTimer) {
      clearInterval(pollTimer);
      pollTimer = null;
    } else if (!open && !pollTimer) {
      pollTimer = setInterval(loadRuns, 5000);
    }
  });
}

$("#cols-list").addEventListener("change", () => {
  state.cols = [...document.querySelectorAll("#cols-list input:checked")].map((el) => el.value);
  syncUrl();
  render();
});
document.addEventListener("click", (ev) => {
  if (!ev.target.closest("#cols-picker")) $("#cols-picker").open = false;
});
$("#group-chip button").addEventListener("click", () => {
  state.group = "";
  syncUrl();
  loadRuns();
});

for (const m of SPARK_METRICS) $("#f-metric").append(h("option", { value: m }, m));
if (!SPARK_METRICS.includes(state.metric)) $("#f-metric").append(h("option", { value: state.metric }, state.metric));
bindFilter("#f-q", "q", "input");
bindFilter("#f-tag", "tag", "input");
bindFilter("#f-status", "status");
bindFilter("#f-algorithm", "algorithm");
bindFilter("#f-task", "task");
bindFilter("#f-metric", "metric");
loadPresets();
loadRuns();
startStream();
// ETAs and "x ago" drift with time even without events.
setInterval(() => {
  for (const id of state.order) {
    const r = state.runs.get(id);
    if (r && r.status === "running") updateRow(r);
  }
}, 10000);

/** A study's runs share the group id "study-<id>" (backend/studies/spec.py): link the study. */
function studyLink(run) {
  const m = /^study-(\d+)$/.exec(run.group_id || "");
  return m
    ? h(
        "a.small",
        { href: `/studies/${m[1]}`, title: "Open the study: verdict and paired differences" },
        ` · study ${m[1]}`,
      )
    : null;
}
