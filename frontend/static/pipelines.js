// Pipelines list (/pipelines): every pipeline with its stages (what each trains, its run and
// status, each stage's progress), newest first; a row links to its pipeline page. Refreshed while
// any is active.
import { errorText, get } from "/static/api.js";
import { $, FINISHED, fmtTime, h, progressBar, statusBadge, toast } from "/static/util.js";

const HEAD = ["id", "name", "status", "stages", "progress", "created"];

/** "1. sft ✓ → 2. conspo ▸": each stage's kind (its algorithm for RL) and where it is. */
function stagesCell(p) {
  return p.stages.map((st, i) =>
    h(
      "span.stage",
      { title: st.run ? `run #${st.run.id}: ${st.run.status}` : st.skipped ? "never ran" : "not started" },
      i ? " → " : "",
      st.run
        ? h("a", { href: `/runs/${st.run.id}` }, `${i + 1}. ${st.algorithm || st.kind}`)
        : `${i + 1}. ${st.algorithm || st.kind}`,
    ),
  );
}

/** Each stage's progress on a line of its own ("2. conspo ▮▮▯ 3/10"; a stage with no run yet
 * says why), under how many stages have finished: a pipeline is several runs, and the one
 * running now is not all of it. */
function stagesProgress(p) {
  const done = p.stages.filter((st) => st.run?.status === "succeeded").length;
  return h(
    "div.stages-progress",
    {},
    h("div.small.muted.stages-done", {}, `${done}/${p.stages.length} stages done`),
    ...p.stages.map((st, i) =>
      h(
        "div.stage-progress",
        { "data-stage": i },
        h("span.stage-n", {}, `${i + 1}.`),
        st.run ? progressBar(st.run) : h("span.muted", {}, st.skipped ? "never ran" : "not started"),
      ),
    ),
  );
}

async function load() {
  let data;
  try {
    data = await get("/api/pipelines");
  } catch (err) {
    toast(`Could not list pipelines: ${errorText(err)}`, "error");
    return;
  }
  const items = data.pipelines;
  const rows = items.map((p) =>
    h(
      "tr",
      { "data-id": p.id },
      h("td.num", {}, h("a", { href: `/pipelines/${p.id}` }, `#${p.id}`)),
      h("td", {}, h("a", { href: `/pipelines/${p.id}` }, p.name)),
      h("td", {}, statusBadge({ status: p.status })),
      h("td", {}, stagesCell(p)),
      h("td", {}, stagesProgress(p)),
      h("td", {}, fmtTime(p.created_at)),
    ),
  );
  $("#pipelines-table").replaceChildren(
    h("thead", {}, h("tr", {}, ...HEAD.map((c) => h("th", {}, c)))),
    h(
      "tbody",
      {},
      ...(rows.length
        ? rows
        : [h("tr", {}, h("td.muted", { colspan: HEAD.length }, "No pipeline yet: tick “pipeline” in the run form."))]),
    ),
  );
  $("#pipelines-sub").textContent = `${items.length} pipeline${items.length === 1 ? "" : "s"}`;
  if (items.some((p) => !FINISHED.has(p.status))) setTimeout(load, 5000);
}

load();
