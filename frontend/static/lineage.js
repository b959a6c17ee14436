// Where a run comes from, as the runs list and the run page say it: its job kind, the run whose
// checkpoint it started from (model.from_run, model.step) and its place in a pipeline
// ("stage 2 of 2 · from #12", linking the pipeline page). A pipeline's number of stages is read
// once per page from GET /api/pipelines/{id} (with its name, for the runs list's group row);
// `onLoad` re-renders when it arrives.
import { get } from "/static/api.js";
import { h } from "/static/util.js";

const pipelines = new Map(); // pipeline id → {stages, name} once read, null while being read
const waiting = new Map(); // pipeline id → the callbacks to call when it arrives (a Set: a
// caller that passes the same function on every render is called once)

/** A pipeline's {stages (its number of stages), name}, read once per page, or null until it
 * arrives: then every `onLoad(id)` passed meanwhile is called. */
export function pipelineInfo(id, onLoad) {
  if (pipelines.get(id)) return pipelines.get(id);
  if (onLoad) waiting.set(id, (waiting.get(id) || new Set()).add(onLoad));
  if (!pipelines.has(id)) {
    pipelines.set(id, null);
    get(`/api/pipelines/${id}`)
      .then((p) => {
        pipelines.set(id, { stages: p.stages.length, name: p.name });
        const callbacks = waiting.get(id) || [];
        waiting.delete(id);
        for (const f of callbacks) f(id);
      })
      .catch(() => {}); // the link still works; only "of N" and its name are missing
  }
  return null;
}

/** "from #12 (last)" of a chained run, else "". */
export function fromText(run) {
  const model = run.config?.model || {};
  return model.from_run ? `from #${model.from_run} (${model.step ?? "last"})` : "";
}

/** The pipeline link of a run that is a stage of one ("stage 2 of 2 · from #12"), else null. */
export function pipelineLink(run, onLoad, cls = "a.small") {
  if (run.pipeline_id === null || run.pipeline_id === undefined) return null;
  const n = pipelineInfo(run.pipeline_id, onLoad)?.stages;
  const from = fromText(run);
  const text = `stage ${run.pipeline_stage + 1}${n ? ` of ${n}` : ""}${from ? ` · ${from}` : ""}`;
  return h(
    cls,
    {
      href: `/pipelines/${run.pipeline_id}`,
      "data-pipeline": run.pipeline_id,
      title: `Open pipeline #${run.pipeline_id}`,
    },
    text,
  );
}

/** The run page's header line: "kind: sft · from #12 (best)" and its pipeline, if any. */
export function kindLine(run, onLoad) {
  const kind = run.config?.kind ?? "rl";
  const parts = [`kind: ${kind}`];
  const link = pipelineLink(run, onLoad, "a");
  if (!link && fromText(run)) parts.push(fromText(run));
  return [
    h("span.kind-line", {}, parts.join(" · ")),
    link ? " · " : "",
    link || "",
    link ? h("span", {}, ` of pipeline #${run.pipeline_id}`) : "",
  ];
}

/** "#12 step last ← #9 step best ← tiny": a model's chain of starting points. */
export function lineageText(lineage) {
  return (lineage || []).map((l) => (l.base ? l.base : `#${l.run} (${l.step})`)).join(" ← ");
}
