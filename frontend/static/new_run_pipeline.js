// The run form's pipeline mode: one config per stage (tabs above the form; each later stage
// starts from the one before), submitted as one POST /api/pipelines; a 422 shows the first
// stage with errors, with its messages at its fields.
import { post } from "/static/api.js";
import { withDefaults } from "/static/form.js";
import { applyKind, buildRequest, kindUses, pipeline, presets, render, typed } from "/static/new_run_fields.js";
import { $, h } from "/static/util.js";

/** POST /api/pipelines's body: every stage's config (the one on screen read from the form);
 * a later stage's model.from_run is the server's to set (the stage before it). */
export function buildPipeline() {
  saveStage();
  const stages = pipeline.stages.map((st, i) => {
    const config = structuredClone(st.config);
    if (i > 0 && config.model) delete config.model.from_run;
    return config;
  });
  return { name: pipeline.name || "pipeline", stages, tags: buildRequest().tags };
}

/** Keep what the form shows as the current stage's config. */
export function saveStage() {
  if (!pipeline.on) return;
  const req = buildRequest();
  pipeline.stages[pipeline.at] = {
    config: req.config,
    seeds: $("[name='seeds']").value,
    tags: $("[name='tags']").value,
  };
}

export function showStage(i) {
  saveStage();
  pipeline.at = i;
  const st = pipeline.stages[i];
  for (const k of Object.keys(typed)) delete typed[k];
  render(withDefaults(presets.defaults, st.config), { seeds: st.seeds, tags: st.tags });
  renderStageTabs();
}

export function renderStageTabs() {
  $("#pipeline-controls").hidden = !pipeline.on;
  $("#stage-tabs").replaceChildren(
    ...pipeline.stages.map((st, i) => {
      const c = st.config;
      const kind = c.kind ?? presets.defaults.kind;
      const what = kindUses(kind, "algorithm") ? c.algorithm : kind; // "grpo" says more than "rl"
      const tab = h(
        `button.btn.btn-sm${i === pipeline.at ? ".btn-primary" : ""}`,
        { type: "button", role: "tab", "data-stage": i, "aria-selected": String(i === pipeline.at) },
        `${i + 1}. ${what}`,
      );
      tab.addEventListener("click", () => showStage(i));
      return h("span", {}, i ? " → " : "", tab);
    }),
  );
  $("#remove-stage").disabled = pipeline.stages.length < 2;
  applyKind();
}

export function setPipelineMode(on) {
  pipeline.on = on;
  if (on) {
    pipeline.at = 0;
    pipeline.stages = [];
    saveStage();
  }
  renderStageTabs();
}

export function addStage() {
  saveStage();
  // The next stage copies this one (same task, model, eval) as a stage of the default kind (RL):
  // the usual SFT → RL recipe is "sft", then "+ Add stage".
  const config = structuredClone(pipeline.stages[pipeline.at].config);
  config.kind = presets.defaults.kind;
  config.kind_params = {};
  config.name = null;
  if (config.model) delete config.model.from_run;
  pipeline.stages.push({ config, seeds: pipeline.stages[pipeline.at].seeds, tags: "" });
  pipeline.at = pipeline.stages.length - 1;
  const st = pipeline.stages[pipeline.at];
  render(withDefaults(presets.defaults, st.config), { seeds: st.seeds, tags: st.tags });
  renderStageTabs();
}

export function removeStage() {
  if (pipeline.stages.length < 2) return;
  pipeline.stages.splice(pipeline.at, 1);
  pipeline.at = Math.max(0, pipeline.at - 1);
  const st = pipeline.stages[pipeline.at];
  render(withDefaults(presets.defaults, st.config), { seeds: st.seeds, tags: st.tags });
  renderStageTabs();
}

export async function submitPipeline() {
  const body = buildPipeline();
  const res = await post("/api/pipelines", body);
  $("#submit-note").textContent = `Created pipeline #${res.id}`;
  location.href = `/pipelines/${res.id}`;
}
