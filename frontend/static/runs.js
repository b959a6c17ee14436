// Runs page: a live table of runs with filters, progress/ETA, a sparkline per run and actions.
// Runs of one submission (seeds), study or pipeline collapse under a group row (n, status
// counts, mean ± sd of the column's metric); the config keys that differ among the listed runs
// get columns (toggleable); every sparkline of the column shares one y-scale, shown in its head.
// `/?group=<group_id>` lists one group, opened (where the form lands after "Start N runs").
import { ApiError, del, errorText, get, post, qs, stream } from "/static/api.js";
import { CHARTED_KEYS, KEY_METRICS } from "/static/catalogue.js";
import { groupRowFor, rowFor, sparkFor } from "/static/runs_rows.js";
import {
  groupName,
  hyperLabel,
  paramNeedsOf,
  scaleText,
  sharedRange,
  symbolsOf,
  tableRows,
  valueSummary,
  varyingKeys,
} from "/static/runs_table.js";
import { $, debounce, FINISHED, h, setConn, toast } from "/static/util.js";

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
  where: params.get("where") || "", // conditions on config and metrics (GET /api/runs?where=)
  orderBy: params.get("order_by") || "", // a metric summary to order by (GET /api/runs?order_by=)
  metric: params.get("metric") || DEFAULT_SPARK,
  group: params.get("group") || "", // a group_id: list only that group's runs
  cols: params.has("cols") ? params.get("cols").split(",").filter(Boolean) : null, // null: auto
  open: new Set(), // group keys shown expanded
  groupOf: new Map(), // run id → its group's key, for runs listed under a group row
  varying: [], // config keys that differ among the listed runs
  runs: new Map(), // id → Run, in table order
  order: [],
  selected: new Set(),
  sparks: new Map(), // id → {steps, values} of the column's metric
  symbols: {}, // config path → the paper's symbol (the schemas': GET /api/presets)
  paramNeeds: {}, // algorithm → params path → when it is used (ConSPO's ε: clipped-ratio scores)
  studies: new Map(), // study id → its list item (GET /api/studies): the planned work
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
    where: state.where,
    order_by: state.orderBy,
    metric: state.metric === DEFAULT_SPARK ? "" : state.metric,
    group: state.group,
    cols: state.cols ? state.cols.join(",") : "",
  });
  history.replaceState(null, "", `/${q}`);
}

function matches(run) {
  // A where query is the server's to evaluate: the stream updates the rows it listed, and the
  // periodic reload brings in new matches.
  if ((state.where || state.orderBy) && !state.runs.has(run.id)) return false;
  if (state.group && run.group_id !== state.group) return false;
  if (state.status && run.status !== state.status) return false;
  if (state.algorithm && run.algorithm !== state.algorithm) return false;
  if (state.task && run.task !== state.task) return false;
  if (state.tag && !(run.tags || []).includes(state.tag)) return false;
  if (state.q && !(run.name || "").toLowerCase().includes(state.q.toLowerCase())) return false;
  return true;
}

/** The order choices for the sparkline's metric: newest first, or its highest last / highest
 * max / lowest min value (runs without it last). */
function fillOrder() {
  const m = state.metric;
  const choices = [
    ["", "newest first"],
    [`-last(${m})`, `highest last ${m}`],
    [`-max(${m})`, `highest max ${m}`],
    [`min(${m})`, `lowest min ${m}`],
  ];
  if (state.orderBy && !choices.some(([v]) => v === state.orderBy)) choices.push([state.orderBy, state.orderBy]);
  $("#f-order").replaceChildren(...choices.map(([v, label]) => h("option", { value: v }, label)));
  $("#f-order").value = state.orderBy;
}

async function loadRuns() {
  const query = qs({
    status: state.status,
    algorithm: state.algorithm,
    task: state.task,
    tag: state.tag,
    q: state.q,
    where: state.where,
    order_by: state.orderBy,
    group_id: state.group,
    sort: "-created_at",
    limit: 200,
  });
  try {
    const data = await get(`/api/runs${query}`);
    $("#f-where-error").textContent = "";
    state.runs = new Map(data.items.map((r) => [r.id, r]));
    state.order = data.items.map((r) => r.id);
    state.total = data.total;
    for (const id of [...state.selected]) if (!state.runs.has(id)) state.selected.delete(id);
    render();
    loadSparks(state.order);
    loadStudies();
  } catch (err) {
    if (err instanceof ApiError && err.status === 422 && state.where) {
      // where the query stopped parsing, beside the box (the table keeps the last good list)
      $("#f-where-error").textContent = errorText(err).replace(/^query\.where: /, "");
      return;
    }
    toast(`Could not load runs: ${errorText(err)}`, "error");
  }
}

/** The studies of the listed runs (their planned work: a study's group row counts its pending
 * runs too), asked for by id (not the newest page of studies), then their group rows redrawn. */
async function loadStudies() {
  const ids = new Set();
  for (const r of state.runs.values()) {
    const study = /^study-(\d+)$/.exec(r.group_id || "");
    if (study) ids.add(Number(study[1]));
  }
  if (!ids.size) return;
  try {
    const data = await get(`/api/studies${qs({ ids: [...ids].slice(0, 500), limit: 500 })}`);
    state.studies = new Map(data.items.map((s) => [s.id, s]));
    redrawGroupRows();
  } catch (err) {
    console.warn("studies", errorText(err));
  }
}
const loadStudiesSoon = debounce(loadStudies, 3000);

function redrawGroupRows() {
  const cols = hyperColumns();
  for (const row of body.querySelectorAll("tr.group-row"))
    row.replaceWith(groupRowFor(state, row.dataset.group, groupIds(row.dataset.group), cols));
  updateSelection();
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
        state.sparks.set(Number(rid), s ? { steps: s.steps, values: s.values } : { steps: [], values: [] });
      }
      updateSparks();
    } catch (err) {
      console.warn("sparklines", errorText(err));
    }
  }
}

/** Redraw every sparkline on the column's shared y-scale (one run's new points can widen it). */
function updateSparks() {
  state.range = sharedRange(listedSeries());
  for (const cell of body.querySelectorAll("tr[data-id] td.spark-cell")) {
    cell.replaceChildren(sparkFor(state, Number(cell.parentElement.dataset.id)));
  }
  redrawGroupRows();
  sparkHead();
}

/** The sparkline column's series, one per listed run (undefined until loaded). */
const listedSeries = () => state.order.map((id) => state.sparks.get(id)?.values);

function sparkHead() {
  $("#spark-head").replaceChildren(
    state.metric,
    h(
      "div.spark-scale.small",
      { title: "every sparkline in this column is drawn on this one y-range, so rows compare" },
      state.range ? scaleText(listedSeries()) : "",
    ),
  );
}

/** The config keys shown as columns: the user's pick, else the first few that vary. */
function hyperColumns() {
  const listed = state.order.map((id) => state.runs.get(id));
  state.varying = varyingKeys(listed, state.paramNeeds);
  return state.cols ?? state.varying.slice(0, AUTO_HYPER_COLUMNS);
}

function render() {
  const cols = hyperColumns();
  state.groupOf = new Map();
  const rows = [];
  for (const row of tableRows(state.order, state.runs)) {
    if (row.run !== undefined) {
      rows.push(rowFor(state, state.runs.get(row.run), cols, refreshPipelineRows));
      continue;
    }
    for (const id of row.runs) state.groupOf.set(id, row.group);
    rows.push(
      groupRowFor(state, row.group, row.runs, cols),
      ...row.runs.map((id) => rowFor(state, state.runs.get(id), cols, refreshPipelineRows)),
    );
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

/** A head's label with a line break allowed after each "_" (max_refill_ / rounds) and nowhere
 * inside a word: breaking anywhere, a narrow column cut "contrast" into "contr" / "ast". */
const wrappable = (label) => label.split(/(?<=_)/).flatMap((part, i) => (i ? [h("wbr"), part] : [part]));

/** The hyperparameter heads (before Progress) and the column picker's choices. */
function renderHead(cols) {
  const shown = valueSummary(state.orderBy, state.metric);
  $("#value-head").textContent = shown;
  $("#value-head").title =
    `each run's ${shown} ${state.metric}${shown === "last" ? "" : ": what the list is ordered by"}`;
  for (const th of document.querySelectorAll("#runs-table th.hp")) th.remove();
  const before = $("#progress-head");
  for (const key of cols)
    before.before(h("th.hp", { "data-key": key, title: `config.${key}` }, wrappable(hyperLabel(key, state.symbols))));
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
  // The stream's rows carry no order_value (it is the list's): keep the listed one until the
  // reload a new step asks for (onRunEvent).
  if (!("order_value" in run)) run.order_value = state.runs.get(run.id)?.order_value;
  state.runs.set(run.id, run);
  const row = body.querySelector(`tr[data-id="${run.id}"]`);
  if (!row) return;
  const cols = hyperColumns();
  row.replaceWith(rowFor(state, run, cols, refreshPipelineRows));
  const key = state.groupOf.get(run.id);
  if (key) {
    const ids = [...state.groupOf].filter(([, k]) => k === key).map(([id]) => id);
    body.querySelector(`tr.group-row[data-group="${key}"]`)?.replaceWith(groupRowFor(state, key, ids, cols));
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
      deleted.add(id);
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
      deleted.add(id);
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
    state.symbols = symbolsOf(p);
    state.paramNeeds = paramNeedsOf(p);
    // Rows drawn before the schemas came may show a parameter their run leaves unused.
    if (state.order.length) render();
    else renderHead(hyperColumns());
    $("#runs-table").dataset.schemas = "1"; // headers by symbol, unused parameters hidden
  } catch (err) {
    console.warn("presets", errorText(err));
  }
  $("#f-algorithm").value = state.algorithm;
  $("#f-task").value = state.task;
}

// Live updates: the run stream, with polling as a fallback while it is down.
const sparkRefresh = new Set();
const deleted = new Set(); // runs deleted from this page: no more fetches for them
const flushSparks = debounce(() => {
  const ids = [...sparkRefresh].filter((id) => !deleted.has(id)); // a deleted run's series is a 404
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
      if (valueSummary(state.orderBy, state.metric) !== "last") reloadSoon(); // its summary and place may move
      sparkRefresh.add(run.id);
      flushSparks();
      if (/^study-\d+$/.test(run.group_id || "")) loadStudiesSoon();
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
bindFilter("#f-where", "where", "input");
fillOrder();
$("#f-order").addEventListener("change", (ev) => {
  state.orderBy = ev.target.value;
  syncUrl();
  loadRuns();
});
$("#f-metric").addEventListener("change", () => {
  state.metric = $("#f-metric").value.trim(); // before bindFilter's debounced update
  if (state.orderBy) {
    // the order follows the sparkline's metric: the same summary of the new one
    state.orderBy = state.orderBy.replace(/\(.*\)$/, `(${state.metric})`);
    syncUrl();
    loadRuns();
  }
  fillOrder();
});
bindFilter("#f-status", "status");
bindFilter("#f-algorithm", "algorithm");
bindFilter("#f-task", "task");
bindFilter("#f-metric", "metric");
loadPresets();
loadRuns();
startStream();
// Runs that come to match a where query (a new run, a metric crossing its bound) are the
// server's to find: asked again every 15 s while a query is set.
setInterval(() => state.where && loadRuns(), 15000);
// ETAs and "x ago" drift with time even without events.
setInterval(() => {
  for (const id of state.order) {
    const r = state.runs.get(id);
    if (r && r.status === "running") updateRow(r);
  }
}, 10000);
