// The run page's header and details: status, progress and ETA, lineage, the meta grid, the
// config and summary tables.
import { EVAL_ACCURACY, EVAL_PROBLEMS, helpOf, keyApplies } from "/static/catalogue.js";
import { kindLine } from "/static/lineage.js";
import { S } from "/static/run_state.js";
import {
  $,
  etaLabel,
  FINISHED,
  flatten,
  fmtAgo,
  fmtDuration,
  fmtNum,
  fmtTime,
  fmtValue,
  h,
  progress,
  progressBar,
  resourcesText,
  statusBadge,
  waitingNote,
} from "/static/util.js";

function queueText(run) {
  const parts = [];
  if (run.queue_position) parts.push(`#${run.queue_position} in the queue`);
  return parts.join(" · ");
}

/** A run's group, named as a person would: its study, or the seeds of one submission. */
function groupLink(run) {
  const study = /^study-(\d+)$/.exec(run.group_id);
  const href = `/compare?${new URLSearchParams({ group_id: run.group_id })}`;
  return study
    ? h("a", { href: `/studies/${study[1]}` }, `study ${study[1]}`)
    : h("a", { href, title: "compare the seeds of this submission" }, "its seeds (compare)");
}

function metaItem(k, v, title, id = null) {
  return h(
    "div",
    {},
    h("div.k", {}, k),
    h("div.v", { id, title: title || (typeof v === "string" ? v : null) }, v ?? "–"),
  );
}

/** The run's progress everywhere the page shows it (the header's bar and ETA, the details'
 * step, ETA and last sign of life), from one computation at one moment: they never disagree.
 * Called on every logged step and every few seconds. */
export function renderProgress() {
  const run = S.run;
  if (!run) return;
  const pace = run.pace_s;
  const p = progress(run);
  const finished = FINISHED.has(run.status);
  $("#run-progress").replaceChildren(progressBar(run));
  const set = (id, text, title) => {
    const el = document.getElementById(id);
    if (!el) return;
    el.textContent = text;
    if (title !== undefined) el.title = title;
  };
  set("meta-step", `${p.step} / ${p.total || "?"}`);
  if (finished) {
    const duration = run.started_at ? (run.finished_at || Date.now() / 1000) - run.started_at : null;
    set("meta-eta", fmtDuration(duration));
  } else {
    const paceText = pace ? `${fmtNum(pace, 3)} s per step lately` : "";
    const evalText = p.evaluating ? "; an evaluation takes the last one's time (estimated before one is measured)" : "";
    set("meta-eta", etaLabel(p) || "–", paceText + evalText);
  }
  // A logged step is a sign of life as good as a heartbeat, and arrives far more often. A
  // finished run gives none any more: its last one is a moment, not an age that keeps growing.
  if (finished) {
    const last = Math.max(run.heartbeat_at || 0, run.finished_at || 0) || null;
    set("meta-heartbeat", fmtTime(last), `the run has ${run.status}: its last heartbeat or its finish`);
    return;
  }
  const alive = Math.max(run.heartbeat_at || 0, S.lastWall || 0);
  set("meta-heartbeat", alive ? fmtAgo(alive) : "–", fmtTime(alive || null));
}

export function renderRun() {
  const run = S.run;
  document.title = `${run.name || `Run ${run.id}`} · ConSPO Lab`;
  $("#run-title").replaceChildren(run.name || `Run ${run.id}`, " ", h("span.rid", {}, `#${run.id}`));
  $("#run-status").replaceChildren(
    ...[statusBadge(run), phaseNote(run), attemptNote(run), waitingNote(run)].filter(Boolean),
  );
  $("#run-lineage").replaceChildren(
    ...kindLine(run, () => S.run && renderRun()),
    run.cloned_from ? " · " : "",
    run.cloned_from ? h("a", { href: `/runs/${run.cloned_from}` }, `cloned from #${run.cloned_from}`) : "",
  );
  const waiting = run.status === "queued" ? queueText(run) : "";
  $("#run-queue").textContent = waiting;
  const finished = FINISHED.has(run.status);
  if (finished && !S.liveSettled) {
    // A finished run has nothing more to stream: "live" is unticked, and says why.
    S.liveSettled = true;
    const live = $("#live-toggle");
    live.checked = false;
    live.disabled = true;
    live.parentElement.title = `run ${run.status}: no live updates`;
  }
  const meta = [
    metaItem("algorithm", run.algorithm),
    metaItem("task", run.task),
    metaItem("model", run.model),
    metaItem("resources", resourcesText(run), `strategy ${run.config?.resources?.strategy || "ddp"}`),
    metaItem("owner", run.owner),
    metaItem("seed", String(run.seed ?? "–")),
    metaItem("group", run.group_id ? groupLink(run) : "–", run.group_id ? `group ${run.group_id}` : null),
    metaItem(
      "tags",
      (run.tags || []).length
        ? h(
            "span",
            {},
            run.tags.map((t) => h("span.tag", {}, t)),
          )
        : "–",
    ),
    metaItem("step", "", null, "meta-step"),
    metaItem(finished ? "duration" : "ETA", "", null, "meta-eta"),
    metaItem("created", fmtTime(run.created_at)),
    metaItem("started", fmtTime(run.started_at)),
    metaItem("finished", fmtTime(run.finished_at)),
    metaItem("last sign of life", "", null, "meta-heartbeat"),
    metaItem("worker host", run.worker_host || "–"),
    metaItem("device", run.device || "–"),
    metaItem("dtype", run.dtype || "–"),
    heldOutItem(run),
    attemptsItem(run),
    run.ray_job_id ? metaItem("Ray job", run.ray_job_id) : null,
    // How it was run (the job kind is in the header's "kind:" line).
    metaItem("source", run.external ? "external (logged over HTTP)" : "queued job"),
  ];
  $("#run-meta").replaceChildren(...meta.filter(Boolean));
  renderProgress();
  const err = $("#run-error");
  err.hidden = !run.error;
  err.replaceChildren(...(run.error ? errorParts(run.error) : []));
  $("#cancel-btn").hidden = finished || run.cancel_requested;
  $("#clone-btn").hidden = Boolean(run.external); // logged from elsewhere: nothing to rerun
  $("#edit-btn").hidden = Boolean(run.external);
  $("#config-table").replaceChildren(
    ...Object.entries(flatten(run.config || {})).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, fmtValue(v)))),
  );
  const summary = Object.entries(run.summary || {})
    .filter(([k]) => keyApplies(k, run))
    .sort(([a], [b]) => a.localeCompare(b));
  $("#summary-table").replaceChildren(
    ...(summary.length
      ? summary.map(([k, v]) => h("tr", {}, h("td", { title: helpOf(k) }, k), h("td", {}, summaryValue(k, v, run))))
      : [h("tr", {}, h("td", {}, "no metrics yet"), h("td"))]),
  );
}

/** A failed run's error as the box shows it: the line that says why first, in full view, and the
 * traceback folded under it. The worker puts a config's fault (out of memory, refused) before
 * the traceback; otherwise why is the traceback's last line, which a box of a fixed height left
 * below its fold. */
function errorParts(error) {
  const lines = error.split("\n");
  const traced = lines[0].startsWith("Traceback");
  const why = traced ? lines.filter((l) => l.trim() && !/^\s/.test(l)).pop() : lines[0];
  const rest = traced ? error : lines.slice(1).join("\n").trim();
  return [
    h("div.error-why#run-error-why", {}, `Error: ${why}`),
    rest ? h("details.error-trace", {}, h("summary", {}, "traceback"), h("pre", {}, rest)) : null,
  ].filter(Boolean);
}

/** A summary value; the accuracy with the n it was scored on (its interval is on the chart). */
function summaryValue(key, value, run) {
  const n = run.summary?.[EVAL_PROBLEMS];
  if (key === EVAL_ACCURACY && n > 0 && Number.isFinite(value)) return `${fmtNum(value, 6)} (n = ${n})`;
  return fmtNum(value, 6);
}

/** Beside the status of a running run: what it does between steps when that is not a step
 * (an evaluation may take minutes with no step logged: the bar alone would look stuck). */
function phaseNote(run) {
  if (run.status !== "running") return null;
  if (run.phase === "evaluating") {
    const title = "scoring the held-out split (eval settings): no step is logged until it ends";
    return h("span.phase#run-phase", { title }, "evaluating");
  }
  if (!run.phase && !run.external) {
    return h("span.phase#run-phase", { title: "loading the model and the task" }, "setting up");
  }
  return null;
}

/** Beside the status of a run on a later attempt: which, and where it picked up (steps up to
 * the step shown are trained again after a resume from an earlier checkpoint). */
function attemptNote(run) {
  if ((run.attempt || 0) <= 1 || FINISHED.has(run.status)) return null;
  const from = run.resumed_from_step;
  const where = from === null || from === undefined ? "" : from > 0 ? `, resumed from step ${from}` : ", started over";
  return h("span.muted.small#attempt-note", { title: run.last_worker_death || "" }, `attempt ${run.attempt}${where}`);
}

/** A run handed back or whose worker died: its attempt, the deaths (the last one's cause in the
 * tooltip) and where the latest attempt resumed (null for a first attempt with no death). */
function attemptsItem(run) {
  const deaths = run.worker_deaths || 0;
  if ((run.attempt || 0) <= 1 && !deaths) return null;
  const parts = [`attempt ${run.attempt}`];
  if (deaths) parts.push(`${deaths} worker death${deaths === 1 ? "" : "s"}`);
  const from = run.resumed_from_step;
  if (from !== null && from !== undefined)
    parts.push(from > 0 ? `resumed from step ${from}` : "started over (no checkpoint)");
  const why = deaths && run.last_worker_death ? `last death: ${run.last_worker_death}` : null;
  const item = metaItem("attempts", parts.join(" · "), why, "meta-attempts");
  if (deaths) item.classList.add("warn");
  return item;
}

/** How many held-out problems the evaluations scored, against task.eval_size: a task whose
 * held-out split has fewer scores fewer, and says so here (null before the first evaluation). */
function heldOutItem(run) {
  const scored = run.summary?.[EVAL_PROBLEMS];
  if (scored === undefined || scored === null) return null;
  const asked = run.config?.task?.eval_size;
  const short = asked !== undefined && scored < asked;
  const text = short ? `${scored} of ${asked} asked` : String(scored);
  const why = short ? "the task's held-out split has no more distinct problems" : null;
  const item = metaItem("held-out n", text, why, "meta-held-out");
  if (short) item.classList.add("warn");
  return item;
}
