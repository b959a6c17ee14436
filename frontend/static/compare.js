// Compare page: overlay runs per metric, group by any config path (mean across seeds, 95% t band),
// EMA smoothing, x-axis by step / wall time / rollouts seen, an A − B difference curve (runs, or
// groups against a baseline group: paired by seed when the seeds match, Welch otherwise) and a
// config table of what differs. The whole view lives in the query string, so a link shares it.
import { errorText, get, qs } from "/static/api.js";
import { helpOf } from "/static/catalogue.js";
import { chartCard, react, setCardNote } from "/static/charts.js";
import { diffFigure, groupDiffFigure, metricFigure } from "/static/compare_figures.js";
import {
  baseGroup,
  DEFAULT_KEYS,
  diffKey,
  groups,
  loadData,
  loadKeys,
  loadPicker,
  refreshRuns,
  S,
  SUMMARY_LAST_N,
  syncUrl,
  url,
} from "/static/compare_state.js";
import {
  renderBaseSelect,
  renderConfigDiff,
  renderGroupSummary,
  renderKeyList,
  renderRunList,
} from "/static/compare_tables.js";
import { $, afterPaint, debounce, FINISHED, h, toast } from "/static/util.js";

const nextTask = () => new Promise((resolve) => setTimeout(resolve, 0));

/** The charts the view asks for, in order (the group difference and the A − B curve first). */
function wantedCharts() {
  const wanted = S.runIds.length ? S.keys.map((k) => ({ id: `m-${k}`, key: k, title: k, help: helpOf(k) })) : [];
  if (S.diff.length === 2 && S.runIds.length && diffKey()) {
    const k = diffKey();
    wanted.unshift({
      id: `d-${k}`,
      key: k,
      diff: true,
      title: `Difference #${S.diff[0]} − #${S.diff[1]}: ${k}`,
      help: "Run A minus run B at A's steps (B interpolated inside its range).",
    });
  }
  const grouped = groups();
  if (grouped && grouped.size > 1 && S.runIds.length && diffKey()) {
    const k = diffKey();
    const base = baseGroup([...grouped.keys()]);
    wanted.unshift({
      id: `g-${k}`,
      key: k,
      gdiff: true,
      title: `Group difference against ${base}: ${k}`,
      help:
        "Each group minus the baseline group. Paired by seed when both groups ran the same seeds " +
        "(the mean of per-seed differences, 95% t band over seeds); otherwise the difference of " +
        "the group means with a 95% Welch band. Dotted where fewer seeds have reached the step.",
    });
  }
  return wanted;
}

/** Draw every chart; `inTurn` (the first draw): one by one, the first painted before the next
 * is drawn (all in one task kept even the first off screen until the last was done). */
async function draw({ inTurn = false } = {}) {
  const container = $("#compare-charts");
  const wanted = wantedCharts();
  const wantedIds = new Set(wanted.map((w) => w.id));
  for (const [id, entry] of S.cards) {
    if (!wantedIds.has(id)) {
      if (entry.plot.dataset.state === "plotted") window.Plotly.purge(entry.plot);
      entry.card.remove();
      S.cards.delete(id);
    }
  }
  let first = true;
  for (const w of wanted) {
    if (inTurn && !first) await (wanted.indexOf(w) === 1 ? afterPaint() : nextTask());
    first = false;
    let entry = S.cards.get(w.id);
    if (!entry) {
      const { card, plot } = chartCard(w.id.replace(/[^\w-]/g, "_"), w.title, w.help);
      card.dataset.key = w.key;
      if (w.diff) card.dataset.diff = "1";
      entry = { card, plot };
      S.cards.set(w.id, entry);
    }
    container.append(entry.card); // keeps order
    entry.card.querySelector(".chart-title").textContent = w.title; // regrouped: a new baseline
    const fig = w.gdiff ? groupDiffFigure(w.key) : w.diff ? diffFigure(w.key) : metricFigure(w.key);
    if (w.gdiff) entry.card.dataset.pairing = fig?.pairing || "";
    setCardNote(entry.card, entry.plot, fig?.notes || []);
    if (!fig) {
      if (entry.plot.dataset.state === "plotted") window.Plotly.purge(entry.plot);
      entry.plot.dataset.state = "empty";
      entry.card.classList.add("empty-chart");
      entry.plot.replaceChildren(h("span", {}, "no data for the selected runs"));
      continue;
    }
    if (entry.plot.dataset.state !== "plotted") {
      entry.plot.replaceChildren();
      entry.card.classList.remove("empty-chart");
      entry.plot.dataset.state = "plotted";
    }
    fig.layout.datarevision = `${S.rev}|${S.smooth}|${S.group}|${S.x}`;
    react(entry.plot, fig.traces, fig.layout);
  }
  renderGroupSummary();
  // Nothing chosen, nothing to export: the buttons say so instead of failing when pressed.
  const exportable = S.runIds.length > 0 && Boolean(diffKey());
  $("#report-html").disabled = !exportable;
  $("#report-csv").disabled = !exportable;
  $("#compare-empty").hidden = S.runIds.length > 0;
  // the rollout viewer takes at most 8 runs (GET /api/compare/rollouts): the first 8 chosen
  $("#rollouts-link").hidden = !S.runIds.length;
  $("#rollouts-link").href = `/compare/rollouts${qs({ runs: S.runIds.slice(0, 8).join(",") })}`;
  // the answers view pairs up to 50 runs' problems (GET /api/answers)
  $("#answers-link").hidden = !S.runIds.length;
  $("#answers-link").href = `/answers${qs({ runs: S.runIds.slice(0, 50).join(","), show: "disagree" })}`;
  const n = S.runIds.length;
  $("#compare-sub").textContent = n
    ? `${n} run${n === 1 ? "" : "s"} · ${S.keys.length} metric${S.keys.length === 1 ? "" : "s"}`
    : "";
}

async function reload({ keys = false } = {}) {
  syncUrl();
  if (keys) await loadKeys();
  renderRunList();
  renderKeyList();
  try {
    await loadData();
  } catch (err) {
    toast(`Could not load metrics: ${errorText(err)}`, "error");
  }
  draw();
  renderConfigDiff();
}

$("#run-list").addEventListener("change", async (ev) => {
  const id = Number(ev.target.value);
  if (ev.target.checked) {
    if (!S.runIds.includes(id)) S.runIds.push(id);
    const r = S.allRuns.find((x) => x.id === id);
    if (r) S.runs.set(id, r);
  } else {
    S.runIds = S.runIds.filter((x) => x !== id);
  }
  if (S.diff.length === 2 && !S.diff.every((d) => S.runIds.includes(d))) S.diff = [];
  await reload({ keys: true });
});
$("#key-list").addEventListener("change", (ev) => {
  const k = ev.target.value;
  S.keys = ev.target.checked ? [...S.keys, k] : S.keys.filter((x) => x !== k);
  reload();
});
$("#run-filter").addEventListener("input", debounce(renderRunList, 150));
$("#key-filter").addEventListener("input", debounce(renderKeyList, 150));
$("#group-by").addEventListener("change", (ev) => {
  S.group = ev.target.value.trim() === "none" ? "" : ev.target.value.trim();
  renderBaseSelect();
  renderRunList(); // the sidebar's swatches take their group's colour
  renderConfigDiff();
  syncUrl();
  draw();
});
$("#diff-base").addEventListener("change", (ev) => {
  S.base = ev.target.value;
  syncUrl();
  draw();
});
$("#x-axis").addEventListener("change", (ev) => {
  S.x = ev.target.value;
  reload();
});
$("#smooth").addEventListener(
  "input",
  debounce((ev) => {
    S.smooth = Number(ev.target.value);
    $("#smooth-val").textContent = S.smooth.toFixed(2);
    syncUrl();
    draw();
  }, 40),
);
for (const sel of ["#diff-a", "#diff-b", "#diff-key"]) {
  $(sel).addEventListener("change", () => {
    const a = Number($("#diff-a").value),
      b = Number($("#diff-b").value);
    S.diff = a && b && a !== b ? [a, b] : [];
    S.diffKey = $("#diff-key").value;
    syncUrl();
    draw();
  });
}
$("#show-all-config").addEventListener("change", (ev) => {
  S.showAll = ev.target.checked;
  syncUrl();
  renderConfigDiff();
});
// ---- reports: the server renders them (the study report's renderer); a fetch carries the token
function reportQuery() {
  const grouped = groups();
  return qs({
    runs: S.runIds,
    key: diffKey(),
    group: S.group,
    baseline: grouped && grouped.size > 1 ? baseGroup([...grouped.keys()]) : "",
    k: SUMMARY_LAST_N,
  });
}

async function download(path, filename) {
  if (!S.runIds.length) return toast("Pick runs first", "error");
  try {
    const resp = await fetch(path, {
      headers: window.CONSPO_TOKEN ? { Authorization: `Bearer ${window.CONSPO_TOKEN}` } : {},
    });
    if (!resp.ok) throw new Error(`${resp.status}: ${(await resp.text()).slice(0, 300)}`);
    const href = URL.createObjectURL(await resp.blob());
    const link = h("a", { href, download: filename, hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(href), 60_000);
  } catch (err) {
    toast(`Could not export: ${errorText(err)}`, "error");
  }
}
$("#report-html").addEventListener("click", () =>
  download(`/api/compare/report.html${reportQuery()}`, "comparison.html"),
);
$("#report-csv").addEventListener("click", () =>
  download(`/api/compare/objective.csv${reportQuery()}`, "comparison.csv"),
);
$("#copy-link").addEventListener("click", async () => {
  try {
    await navigator.clipboard.writeText(location.href);
    toast("Link copied", "ok");
  } catch {
    toast(location.href);
  }
});

// Live: while any chosen run is unfinished, refresh every 5 s (zoom is kept by uirevision).
setInterval(async () => {
  const live = S.runIds.some((id) => {
    const r = S.runs.get(id);
    return r && !FINISHED.has(r.status);
  });
  if (!live || document.hidden) return;
  await refreshRuns();
  try {
    await loadData();
  } catch {
    return;
  }
  draw();
  renderConfigDiff();
}, 5000);

async function init() {
  const groupId = url.get("group_id");
  if (groupId && !S.runIds.length) {
    try {
      const data = await get(`/api/runs${qs({ group_id: groupId, limit: 50 })}`);
      S.runIds = data.items.map((r) => r.id).sort((a, b) => a - b);
      for (const r of data.items) S.runs.set(r.id, r);
      // a study's runs by their arm (ConSPO and its ablation share an algorithm), else by algorithm
      if (!S.group) S.group = data.items.some((r) => r.arm) ? "arm" : "algorithm";
    } catch (err) {
      toast(`Could not load group ${groupId}: ${errorText(err)}`, "error");
    }
  }
  if (S.diff.length !== 2 && S.runIds.length === 2) S.diff = [S.runIds[0], S.runIds[1]];
  $("#group-by").value = S.group;
  $("#x-axis").value = S.x;
  $("#smooth").value = String(S.smooth);
  $("#smooth-val").textContent = S.smooth.toFixed(2);
  $("#show-all-config").checked = S.showAll;
  // The picker, each run's keys and the series at once (early.js sent the three from <head>):
  // the default metrics are asked for before the keys say which the runs logged.
  const defaulted = !S.keys.length;
  if (defaulted) S.keys = DEFAULT_KEYS.slice();
  let failed = null;
  await Promise.all([loadPicker(), loadKeys(), loadData().catch((err) => (failed = err))]);
  if (defaulted) {
    S.keys = S.keys.filter((k) => S.keysAvailable.includes(k));
    if (!S.keys.length) {
      S.keys = S.keysAvailable.slice(0, 4);
      failed = await loadData().catch((err) => err);
    }
  }
  if (failed) toast(`Could not load metrics: ${errorText(failed)}`, "error");
  syncUrl();
  renderRunList();
  renderKeyList();
  await draw({ inTurn: true });
  renderConfigDiff();
}
init();
