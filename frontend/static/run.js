// Run page: header, meta, config, and live separation dashboards. Initial data comes from
// /api/runs/{id}/metrics (server-side downsampled, min/max kept); new points arrive on the SSE
// stream /api/runs/{id}/stream and are appended; charts redraw with Plotly.react and a fixed
// uirevision so zoom survives every update.
import { del, errorText, get, post, qs, stream } from "/static/api.js";
import { noteEditor } from "/static/notes.js";
import { promptView } from "/static/prompts.js";
import { alertsView } from "/static/run_alerts.js";
import { drawAll, drawInTurn, scheduleDraw } from "/static/run_charts.js";
import { renderProgress, renderRun } from "/static/run_header.js";
import { logTail, logView } from "/static/run_log.js";
import { loadRolloutTable } from "/static/run_rollouts.js";
import { loadMetrics, loadRollouts, mergePoints, runId, S } from "/static/run_state.js";
import { $, $$, FINISHED, h, setConn, toast } from "/static/util.js";

const PROMPTS = promptView(runId, $("#chart-sections"));
const LOG = logView(runId, () => Boolean(S.run && FINISHED.has(S.run.status)));
const ALERTS = alertsView($("#run-alerts"), runId);
let tailShown = false;
function showErrorLog(run) {
  // A failed run leads with what it printed last, beside its error.
  if (run.status !== "failed" || tailShown) return;
  tailShown = true;
  logTail(runId, $("#run-error-log"));
}
const showNote = noteEditor($("#run-notes"), {
  path: `/api/runs/${runId}`,
  withTags: true,
  onSaved: (run) => onStatus(run),
});

// ---- live --------------------------------------------------------------------------------------
// Throttled (not debounced: events arrive every second and would postpone a debounce forever).
let rolloutTimer = null;
function fetchNewRollouts() {
  if (rolloutTimer || !S.rolloutsLoaded) return;
  rolloutTimer = setTimeout(async () => {
    await loadRollouts(true);
    rolloutTimer = null;
    scheduleDraw();
    if (S.rolloutStep === null) loadRolloutTable(); // following the latest step
  }, 1500);
  fetchPrompts();
}

// The prompt view is recomputed server-side over the whole run: refreshed at most every 10 s.
let promptTimer = null;
function fetchPrompts() {
  if (promptTimer) return;
  promptTimer = setTimeout(async () => {
    await PROMPTS.refresh();
    promptTimer = null;
  }, 10000);
}

function onMetrics(data) {
  if (!data?.series) return;
  for (const [key, pts] of Object.entries(data.series)) mergePoints(key, pts);
  if (S.run && data.step_max !== undefined && data.step_max > (S.run.step || 0)) {
    S.run.step = data.step_max;
    renderProgress();
    refreshRunSoon(); // the server's ETA and pace for the new step
  }
  if (S.live) {
    scheduleDraw();
    fetchNewRollouts();
  }
}

// A new step changes the ETA the server computes: the run is fetched again, at most every few
// seconds (a fast run logs many steps a second).
let refreshTimer = null;
function refreshRunSoon() {
  if (refreshTimer !== null) return;
  refreshTimer = setTimeout(async () => {
    try {
      const fresh = await get(`/api/runs/${runId}`);
      if (S.run && fresh.step < S.run.step) fresh.step = S.run.step; // a later event got here first
      onStatus(fresh);
    } catch {
      // the stream's next status event brings it
    } finally {
      refreshTimer = null;
    }
  }, 3000);
}

function onStatus(run) {
  if (!run || run.id !== runId) return;
  const wasFinished = S.run && FINISHED.has(S.run.status);
  S.run = run;
  renderRun();
  showNote(run);
  showErrorLog(run);
  if (FINISHED.has(run.status) && !wasFinished) {
    fetchNewRollouts();
    scheduleDraw();
  }
}

function openStream() {
  if (S.es) return;
  S.es = stream(
    `/api/runs/${runId}/stream${qs({ since_step: S.maxStep })}`,
    {
      metrics: onMetrics,
      status: onStatus,
      end: () => {
        closeStream();
        setConn("done");
        // One last fetch so the finished run's charts hold the server's final view.
        fetchNewRollouts();
      },
    },
    (open) => setConn(open ? "live" : "off"),
  );
}

function closeStream() {
  if (S.es) {
    S.es.close();
    S.es = null;
  }
}

// ---- actions and controls ------------------------------------------------------------------------
$("#cancel-btn").addEventListener("click", async () => {
  const name = S.run?.name || `run ${runId}`;
  if (!confirm(`Cancel ${name} (#${runId})? A running run stops within seconds; this cannot be undone.`)) return;
  try {
    onStatus(await post(`/api/runs/${runId}/cancel`));
    toast("Cancel requested", "ok");
  } catch (err) {
    toast(`Cancel failed: ${errorText(err)}`, "error");
  }
});
$("#clone-btn").addEventListener("click", async () => {
  try {
    const res = await post(`/api/runs/${runId}/clone`, { overrides: {} });
    location.href = `/runs/${res.runs[0].id}`;
  } catch (err) {
    toast(`Clone failed: ${errorText(err)}`, "error");
  }
});
$("#delete-btn").addEventListener("click", async () => {
  if (!confirm(`Delete run ${runId} and all its metrics?`)) return;
  try {
    closeStream();
    await del(`/api/runs/${runId}`);
    location.href = "/";
  } catch (err) {
    toast(`Delete failed: ${errorText(err)}`, "error");
  }
});
for (const btn of $$(".tabs button")) {
  btn.addEventListener("click", () => {
    for (const b of $$(".tabs button")) b.classList.toggle("active", b === btn);
    for (const name of ["charts", "config", "summary", "logs", "alerts"])
      $(`#tab-${name}`).hidden = name !== btn.dataset.tab;
    if (btn.dataset.tab === "logs") LOG.show();
    else LOG.hide();
    if (btn.dataset.tab === "alerts") ALERTS.show();
    else ALERTS.hide();
    if (btn.dataset.tab === "charts") window.dispatchEvent(new Event("resize"));
  });
}
$("#x-mode").addEventListener("change", (ev) => {
  S.xmode = ev.target.value;
  drawAll();
});
$("#smooth").addEventListener("input", (ev) => {
  S.smooth = Number(ev.target.value);
  $("#smooth-val").textContent = S.smooth.toFixed(2);
  scheduleDraw(60);
});
$("#live-toggle").addEventListener("change", (ev) => {
  S.live = ev.target.checked;
  if (S.live) scheduleDraw(0);
});
// Keep the ETA / heartbeat age fresh between events.
setInterval(() => S.run && !FINISHED.has(S.run.status) && renderProgress(), 2000);

async function init() {
  try {
    S.run = await get(`/api/runs/${runId}`);
  } catch (err) {
    $("#run-root").replaceChildren(
      h(
        "div.panel.empty",
        {},
        `Run ${runId} could not be loaded: ${errorText(err)}. `,
        h("a", { href: "/" }, "Back to runs"),
      ),
    );
    return;
  }
  renderRun();
  showNote(S.run);
  showErrorLog(S.run);
  // The charts draw as soon as the first keys' series are in; the sampled rollouts (megabytes
  // on a long run) and the prompt view load after, and their panels fill in when they arrive.
  let drawn = null;
  try {
    await loadMetrics(() => {
      drawn = drawInTurn();
    });
  } catch (err) {
    toast(`Could not load metrics: ${errorText(err)}`, "error");
  }
  await drawn;
  drawAll();
  if (FINISHED.has(S.run.status)) setConn("done");
  else openStream();
  loadRolloutTable();
  await loadRollouts(false);
  S.rolloutsLoaded = true;
  scheduleDraw(0);
  PROMPTS.refresh();
}
init();
