// The pipeline page (/pipelines/{id}): GET /api/pipelines/{id} as a table of stages in order
// (the run of each, its status, the checkpoint it started from, its held-out eval at step 0 and at
// its last evaluated step) and the hand-offs between stages: stage k's final eval beside stage
// k+1's step-0 eval, which must agree when k+1 starts from k's last checkpoint; a stage that did
// not evaluate its start (eval.at_start off) says so instead. Refreshed every few
// seconds until the pipeline ends; "Cancel pipeline" is POST /api/pipelines/{id}/cancel.
import { errorText, get, post } from "/static/api.js";
import { metricInfo } from "/static/catalogue.js";
import { noteEditor } from "/static/notes.js";
import { $, FINISHED, fmtNum, h, progressBar, statusBadge, toast } from "/static/util.js";

const root = $("#pipeline");
const pipelineId = Number(root.dataset.pipelineId);
const ENDED = new Set(["succeeded", "failed", "cancelled"]);
const showNote = noteEditor($("#pipeline-notes"), { path: `/api/pipelines/${pipelineId}` });
let last = "";

const label = (key) => metricInfo(key)?.label || key;

/** "eval/accuracy 0.250 · eval/pass@k 0.500 (step 0)" as a small list. */
function evalCell(point) {
  if (!point) return h("span.muted", {}, "–");
  return h(
    "div.eval-cell",
    { "data-step": point.step },
    h("div.muted.small", {}, `step ${point.step}`),
    Object.entries(point.values).map(([k, v]) =>
      h("div", { title: k, "data-key": k }, `${label(k)} `, h("b.mono", {}, fmtNum(v, 4))),
    ),
  );
}

/** What the "at start" cell and the hand-off say of a run that evaluated, but not at step 0. */
const NO_START_TEXT = "not evaluated at step 0 (eval.at_start off)";
const noStart = () => h("span.muted.small", { "data-no-start": "1" }, NO_START_TEXT);

function fromText(stage) {
  const f = stage.from;
  if (f.run) return h("span", {}, h("a", { href: `/runs/${f.run}` }, `#${f.run}`), ` (${f.step})`);
  return h("span.mono", {}, f.base || "–");
}

function stageRow(stage) {
  const run = stage.run;
  const trains = stage.label; // as the API words it ("rl · grpo", "sft")
  let status;
  if (run) status = statusBadge(run);
  else if (stage.skipped) status = h("span.badge.st-cancelled", { title: "the pipeline stopped before it" }, "not run");
  else status = h("span.badge", { title: `waits for stage ${stage.waiting_for + 1} to succeed` }, "waiting");
  return h(
    "tr",
    { "data-stage": stage.stage, "data-status": run ? run.status : stage.skipped ? "skipped" : "waiting" },
    h("td", {}, String(stage.stage + 1)),
    h("td", {}, trains),
    h(
      "td.name",
      {},
      run ? h("a", { href: `/runs/${run.id}` }, run.name || `run ${run.id}`, ` #${run.id}`) : stage.name || "–",
    ),
    h("td", {}, status),
    h("td", {}, run ? progressBar(run) : ""),
    h("td", {}, fromText(stage)),
    h("td", {}, stage.eval && !stage.eval.start ? noStart() : evalCell(stage.eval?.start)),
    h("td", {}, evalCell(stage.eval?.end)),
  );
}

/** Stage k's final eval beside stage k+1's step-0 one, key by key, equal ones marked. */
function handoffs(stages) {
  const out = [];
  for (let i = 1; i < stages.length; i++) {
    const before = stages[i - 1].eval?.end;
    const after = stages[i].eval?.start;
    const head = `Stage ${i} → stage ${i + 1}`;
    if (stages[i].eval && !after) {
      const text = `${head}: stage ${i + 1} was ${NO_START_TEXT}: nothing to set beside stage ${i}'s final eval`;
      out.push(h("p.handoff.muted", { "data-handoff": i, "data-no-start": "1" }, text));
      continue;
    }
    if (!before || !after) {
      out.push(h("p.handoff.muted", { "data-handoff": i }, `${head}: not evaluated yet`));
      continue;
    }
    const keys = Object.keys(before.values).filter((k) => k in after.values);
    const rows = keys.map((k) => {
      const a = before.values[k];
      const b = after.values[k];
      const equal = a === b || (a !== null && b !== null && Math.abs(a - b) < 1e-9);
      return h(
        "tr",
        { "data-key": k, "data-equal": String(equal) },
        h("td", { title: k }, label(k)),
        h("td.num.mono", {}, fmtNum(a, 4)),
        h("td.num.mono", {}, fmtNum(b, 4)),
        h("td", {}, equal ? h("span.equal", {}, "= equal") : h("span.muted", {}, "differs")),
      );
    });
    out.push(
      h(
        "div.handoff",
        { "data-handoff": i },
        h(
          "h4",
          {},
          `${head}: ${stages[i - 1].kind} final (step ${before.step}) vs ${stages[i].kind} start (step ${after.step})`,
        ),
        h(
          "table.grid.compact",
          {},
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              h("th", {}, "metric"),
              h("th", {}, `stage ${i} end`),
              h("th", {}, `stage ${i + 1} start`),
              h("th", {}, ""),
            ),
          ),
          h("tbody", {}, rows),
        ),
      ),
    );
  }
  return out.length ? out : [h("p.muted", {}, "A single stage: no hand-off.")];
}

function render(p) {
  document.title = `${p.name} · pipeline ${p.id} · ConSPO Lab`;
  $("#pipeline-title").replaceChildren(p.name, " ", h("span.rid", {}, `#${p.id}`));
  $("#pipeline-status").replaceChildren(
    statusBadge({ status: p.status }),
    h("span.muted.small", {}, ` ${p.stages.length} stages`),
  );
  $("#pipeline-cancel").hidden = ENDED.has(p.status);
  $("#stages-body").replaceChildren(...p.stages.map(stageRow));
  $("#handoffs").replaceChildren(...handoffs(p.stages));
  showNote(p);
}

async function refresh() {
  try {
    const p = await get(`/api/pipelines/${pipelineId}`);
    const text = JSON.stringify(p);
    if (text !== last) {
      last = text;
      render(p);
    }
    const active = !ENDED.has(p.status) || p.stages.some((s) => s.run && !FINISHED.has(s.run.status));
    if (active) setTimeout(refresh, 2000);
  } catch (err) {
    toast(errorText(err), "error");
    setTimeout(refresh, 10000);
  }
}

$("#pipeline-cancel").addEventListener("click", async () => {
  if (!confirm("Cancel this pipeline? The current stage stops and the later ones never run.")) return;
  try {
    render(await post(`/api/pipelines/${pipelineId}/cancel`));
    setTimeout(refresh, 1000);
  } catch (err) {
    toast(errorText(err), "error");
  }
});

refresh();
