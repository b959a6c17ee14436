// Runs page: a live table of runs with filters, progress/ETA, a sparkline per run and actions.
import { del, errorText, get, post, qs, stream } from "/static/api.js";
import { CHARTED_KEYS, KEY_METRICS } from "/static/catalogue.js";
import { fromText, pipelineLink } from "/static/lineage.js";
import {
  $,
  debounce,
  FINISHED,
  fmtAgo,
  fmtNum,
  fmtTime,
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

const params = new URLSearchParams(location.search);
const state = {
  q: params.get("q") || "",
  status: params.get("status") || "",
  algorithm: params.get("algorithm") || "",
  task: params.get("task") || "",
  tag: params.get("tag") || "",
  metric: params.get("metric") || DEFAULT_SPARK,
  runs: new Map(), // id → Run, in table order
  order: [],
  selected: new Set(),
  sparks: new Map(), // id → values
  total: 0,
};

const body = $("#runs-body");

function syncUrl() {
  const q = qs({
    q: state.q,
    status: state.status,
    algorithm: state.algorithm,
    task: state.task,
    tag: state.tag,
    metric: state.metric === DEFAULT_SPARK ? "" : state.metric,
  });
  history.replaceState(null, "", `/${q}`);
}

function matches(run) {
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
        updateSpark(Number(rid));
      }
    } catch (err) {
      console.warn("sparklines", errorText(err));
    }
  }
}

function updateSpark(id) {
  const row = body.querySelector(`tr[data-id="${id}"]`);
  if (!row) return;
  const cell = row.querySelector("td.spark-cell");
  cell.replaceChildren(sparkline(state.sparks.get(id) || []));
}

function rowFor(run) {
  const sel = state.selected.has(run.id);
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
    `tr${sel ? ".selected" : ""}`,
    { "data-id": run.id },
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
    h("td", {}, statusBadge(run), waitingNote(run)),
    h("td", {}, run.algorithm || "–"),
    h("td", {}, run.task || "–"),
    h("td.mono", {}, run.model || "–"),
    h("td.resources", { title: "config.resources: GPUs per node × nodes" }, resourcesText(run)),
    h("td", {}, run.owner || "–"),
    h(
      "td",
      {},
      (run.tags || []).map((t) => h("span.tag", {}, t)),
    ),
    h("td", {}, progressBar(run)),
    h("td.spark-cell", {}, sparkline(state.sparks.get(run.id) || [])),
    h("td.num", {}, fmtNum(last)),
    h("td.muted", { title: fmtTime(run.created_at) }, fmtAgo(run.created_at)),
    h("td", {}, actions),
  );
}

function render() {
  body.replaceChildren(...state.order.map((id) => rowFor(state.runs.get(id))));
  $("#runs-empty").hidden = state.order.length > 0;
  $("#count").textContent = `${state.order.length} of ${state.total} run${state.total === 1 ? "" : "s"}`;
  $("#spark-head").textContent = state.metric;
  updateSelection();
}

/** Re-render the rows of a pipeline's runs once its number of stages is known. */
function refreshPipelineRows(pipelineId) {
  for (const r of state.runs.values()) if (r.pipeline_id === pipelineId) updateRow(r);
}

function updateRow(run) {
  state.runs.set(run.id, run);
  const row = body.querySelector(`tr[data-id="${run.id}"]`);
  if (row) row.replaceWith(rowFor(run));
}

function updateSelection() {
  const n = state.selected.size;
  $("#compare-btn").disabled = n < 2;
  $("#compare-btn").textContent = n ? `Compare selected (${n})` : "Compare selected";
  $("#cancel-sel-btn").disabled = n === 0;
  $("#delete-sel-btn").disabled = n === 0;
  $("#sel-all").checked = n > 0 && n === state.order.length;
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
