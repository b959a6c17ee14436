// The study page (/studies/{id}): renders GET /api/studies/{id} with study_render.js and
// refreshes it every few seconds while the study is active or any of its runs still runs (zoom
// is kept by re-rendering only when something changed). "Cancel study" is
// POST /api/studies/{id}/cancel.
import { ApiError, errorText, get, post } from "/static/api.js";
import { noteEditor } from "/static/notes.js";
import { renderStudy } from "/static/study_render.js";
import { $, h, toast } from "/static/util.js";

const root = document.getElementById("study");
const studyId = Number(root.dataset.studyId);
let last = "";
// Outside the re-rendered root: a refresh never loses a note being typed.
const showNote = noteEditor(document.getElementById("study-notes"), { path: `/api/studies/${studyId}` });

let timer = null;

/** Problem by problem: each arm against the baseline at its runs' last evaluation, pooled over
 * seeds (GET /api/studies/{id}/answers), with McNemar's p, and per seed a link to the answers
 * view of the problems the arm solved and the baseline did not. */
async function showAnswers() {
  const box = document.getElementById("study-answers");
  let out;
  try {
    out = await get(`/api/studies/${studyId}/answers`);
  } catch (err) {
    box.replaceChildren(h("p.muted.small", {}, `Answers: ${errorText(err)}`));
    return;
  }
  const arms = out.arms.filter((a) => a.seeds.length);
  if (!arms.length) {
    box.replaceChildren();
    return;
  }
  const rows = arms.map((a) =>
    h(
      "tr",
      { dataset: { arm: a.arm } },
      h("td", {}, a.arm),
      h("td.num", {}, String(a.solved_alone)),
      h("td.num", {}, String(a.baseline_alone)),
      h("td.num", {}, String(a.shared)),
      h("td.num.mono", {}, a.mcnemar_p.toPrecision(3)),
      h(
        "td",
        {},
        ...a.seeds.flatMap((s, i) => [
          i ? " · " : "",
          h(
            "a",
            {
              href: `/answers?runs=${s.baseline_run},${s.run}&show=only&a=${s.run}&b=${s.baseline_run}`,
              title: `${s.run_name} against ${s.baseline_name}`,
            },
            `seed ${s.seed}: ${s.solved_alone} vs ${s.baseline_alone}`,
          ),
        ]),
      ),
    ),
  );
  box.replaceChildren(
    h("h3.section-title", {}, `Problem by problem against ${out.baseline}`),
    h(
      "div.panel",
      { style: "overflow:auto", "data-scroll-x": "" },
      h(
        "table.grid#study-answers-table",
        {},
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ...[
              "arm",
              `solved, ${out.baseline} not`,
              `${out.baseline} solved, arm not`,
              "(seed, problem) pairs",
              "McNemar p",
              "answers view per seed",
            ].map((t) => h("th", {}, t)),
          ),
        ),
        h("tbody", {}, ...rows),
      ),
    ),
    h(
      "p.muted.small",
      {},
      "Each run's last evaluation; pairs are (seed, problem) where both runs have stored answers; McNemar's exact test on the problems one side solved alone.",
    ),
  );
}

function show(view) {
  const text = JSON.stringify(view);
  if (text !== last) {
    last = text;
    renderStudy(view, root, window.Plotly);
    showNote(view);
    showAnswers();
  }
  $("#study-cancel").hidden = view.status !== "active";
}

/** A cancelled study's running runs take seconds to stop: follow them until they have. */
function moving(view) {
  return view.status === "active" || Boolean(view.counts.queued || view.counts.running);
}

async function refresh() {
  clearTimeout(timer);
  try {
    const view = await get(`/api/studies/${studyId}`);
    show(view);
    if (moving(view)) timer = setTimeout(refresh, 3000);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      // deleted (or never was): say so once, not "loading…" for ever
      root.replaceChildren(
        h("div.panel.empty", {}, `Study ${studyId} not found. `, h("a", { href: "/studies" }, "All studies")),
      );
      return;
    }
    toast(errorText(err), "error");
    timer = setTimeout(refresh, 10000);
  }
}

$("#study-cancel").addEventListener("click", async () => {
  if (!confirm("Cancel this study? Its pending runs are dropped and its queued and running runs cancelled.")) return;
  try {
    await post(`/api/studies/${studyId}/cancel`);
    toast(`Study ${studyId} cancelled`);
  } catch (err) {
    toast(errorText(err), "error");
  }
  refresh();
});

refresh();
