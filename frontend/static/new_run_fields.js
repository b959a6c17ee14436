// The run form's RunConfig fields: the registries (job kinds, algorithms, tasks) whose chosen
// entry's params_schema renders its own parameters, the reward functions (new_run_rewards.js),
// the tools a rollout may call (new_run_tools.js), the sections shown openly and under
// "Advanced", what a job kind hides, and the request the inputs spell. Shared by the run form
// and each of its pipeline stages (new_run_pipeline.js).
import { KEY_METRICS } from "/static/catalogue.js";
import { anyField, collect, configureForm, field, resolve, titleCase, withDefs } from "/static/form.js";
import { lineageText } from "/static/lineage.js";
import { refreshRewardChoices, rewardsField } from "/static/new_run_rewards.js";
import { toolsFields } from "/static/new_run_tools.js";
import { $, $$, h } from "/static/util.js";

// The held-out accuracy: the one key metric of the eval namespace (conspo.metrics.KEY_METRICS).
const HELD_OUT_ACCURACY = KEY_METRICS.find((key) => key.startsWith("eval/"));

export let presets = null; // GET /api/presets
export let registryModels = []; // GET /api/models: finished runs' checkpoints, usable as model.from_run
let schema = null; // RunConfig's JSON schema
let changed = () => {};

/** Start the form on the server's presets and model registry; `onChange` runs after every
 * re-render and row edit (the preview and estimate follow the form). */
export function startForm(loaded, models, onChange) {
  presets = loaded;
  registryModels = models;
  changed = onChange;
  schema = presets.config_schema;
  configureForm(schema, { special, changed });
}

/** The fields this form renders its own way (the generic form does the rest). */
function special(path, p, value) {
  if (path === "config.prompt.template") return templateField(path, p, value);
  if (path === "config.task.params.environment") return environmentField(path, p, value);
  return null;
}

/** The environment task's params.environment: a select of the registered environments (GET
 * /api/presets `environments`), so their names are in sight rather than to be known and typed.
 * A name no longer registered (a run copied from a removed plugin's) stays offered, for the
 * server's 422 to name at the field. */
function environmentField(path, p, value) {
  const options = presets.environments.map((e) => ({ value: e.name, label: e.name, title: e.description }));
  if (value && !options.some((o) => o.value === value)) options.push({ value, label: `${value} (not registered)` });
  return field(path, p, value, { label: "Environment", options });
}

// The registered kinds whose entry is picked by a select and whose parameters are rendered from
// that entry's params_schema, all by one code path (paramsBox). Adding an algorithm or a task
// needs nothing here.
export const REGISTRIES = {
  kind: {
    entries: () => presets.kinds,
    select: "config.kind",
    prefix: "config.kind_params",
    heading: (name) => `${name} parameters`,
    values: (config) => config.kind_params,
  },
  algorithm: {
    entries: () => presets.algorithms,
    select: "config.algorithm",
    prefix: "config.params",
    heading: (name) => `${name} hyperparameters`,
    values: (config) => config.params,
  },
  task: {
    entries: () => presets.tasks,
    select: "config.task.name",
    prefix: "config.task.params",
    // A run stored before tasks had params keeps them flat beside the name ({name, digits}).
    values: (config) => ({ ...flatTaskParams(config.task), ...config.task?.params }),
  },
};
export const current = {}; // registry → the entry shown

// Sections only some job kinds train with (the kind's `sections`); the rest apply to every kind.
// The held-out eval of every kind generates up to sampling.max_new_tokens, so that field stays.
const KIND_SECTIONS = ["algorithm", "sampling", "rewards"];
const EVERY_KIND_FIELDS = new Set(["config.sampling.max_new_tokens"]);

// Pipeline mode: one config per stage, the form showing stage `pipeline.at`.
export const pipeline = { on: false, at: 0, stages: [], name: "" };
export const typed = {}; // kind → entry name → {param: typed value}, so switching back keeps edits

// Which RunConfig sections are shown openly, and which go under "Advanced".
const SECTIONS = [
  { key: "task", title: "Task", params: "task" }, // the task's own parameters go in its section
  { key: "prompt", title: "Prompt" },
  { key: "model", title: "Model" },
  { key: "sampling", title: "Sampling" },
  { key: "optim", title: "Optimiser" },
  { key: "resources", title: "Resources" }, // GPUs per node, nodes (Ray), ddp or fsdp
  // turns, credit and γ of a task that plays an environment (task "environment"); the config
  // refuses a credit other than outcome for any other task, at its field
  { key: "environment", title: "Environment (multi-turn tasks)" },
];
const ADVANCED = [
  { title: "Precision and memory", keys: ["model", "sampling", "optim"], advanced: true },
  { key: "eval", title: "Evaluation and benchmarks" },
  { title: "Environment limits", keys: ["environment"], advanced: true },
  { key: "checkpoint", title: "Checkpoints" },
  { key: "logging", title: "Logging" },
];

function entryOptions(kind) {
  return REGISTRIES[kind].entries().map((e) => ({ value: e.name, label: e.name, title: e.description }));
}

/** The fields of a RunConfig section; `advanced` picks those whose Field says so, else the rest. */
function sectionFields(sectionKey, values, advanced = false) {
  const def = resolve(schema.properties[sectionKey]);
  return Object.entries(def.properties || {}).flatMap(([name, prop]) => {
    const path = `config.${sectionKey}.${name}`;
    const v = values ? values[name] : undefined;
    if (name === "params") return []; // rendered by paramsBox from the chosen entry's schema
    if (Boolean(resolve(prop).advanced) !== advanced) return []; // the Field's "advanced" flag
    const kind = kindOfSelect(path);
    if (kind) return field(path, prop, v, { label: titleCase(kind), options: entryOptions(kind) });
    if (sectionKey === "model" && name === "name") {
      const f = field(path, prop, v, { label: "Model", list: "model-list", wide: false });
      // the catalogue in sight (the datalist shows only while typing): a click picks a model,
      // as typing its name does (its recommended settings follow, new_run.js)
      const input = f.querySelector("input");
      const pick = (ev) => {
        input.value = ev.currentTarget.dataset.model;
        input.dispatchEvent(new Event("input", { bubbles: true }));
        input.dispatchEvent(new Event("change", { bubbles: true }));
      };
      input.after(
        h(
          "div.model-chips",
          {},
          presets.models.map((m) =>
            h("button.chip", { type: "button", title: m.description, "data-model": m.name, onclick: pick }, m.name),
          ),
        ),
      );
      return f;
    }
    if (path === "config.model.from_run") return fromRunField(path, prop, v);
    if (path === "config.model.step") {
      // best | last | a kept step number: typed as an integer when it is one
      return field(path, { ...resolve(prop), enum: undefined, type: "integer" }, v, { list: "step-list" });
    }
    return anyField(path, prop, v);
  });
}

/** model.from_run: a select of the registry's models (finished runs with a checkpoint). */
function fromRunField(path, prop, value) {
  const options = [{ value: "", label: "(none: model.name's own weights)" }];
  for (const m of registryModels) {
    const last = m.checkpoints.last?.step;
    const acc = m.eval[HELD_OUT_ACCURACY];
    options.push({
      value: String(m.run_id),
      label: `#${m.run_id} ${m.name} · ${m.kind}${last !== undefined && last !== null ? ` · step ${last}` : ""}${
        acc !== undefined && acc !== null ? ` · eval ${Number(acc).toFixed(3)}` : ""
      }`,
      title: lineageText(m.lineage),
    });
  }
  if (value && !registryModels.some((m) => m.run_id === Number(value)))
    options.push({ value: String(value), label: `#${value} (not in the registry)` });
  const f = field(path, { ...resolve(prop), type: "integer" }, value ?? "", {
    label: "Start from run",
    options,
    help: "A finished run's checkpoint (the model registry); model.step picks which.",
  });
  return f;
}

/** prompt.template: a select of the named templates plus "custom", whose text is edited below. */
function templateField(path, p, value) {
  const named = presets.prompt_templates || {};
  const isNamed = value in named;
  const text = h("textarea", {
    id: "f-prompt-template",
    name: path,
    "data-type": "string",
    rows: 3,
    spellcheck: "false",
    hidden: isNamed || null,
  });
  text.value = value ?? "";
  const choice = h(
    "select#f-prompt-template-choice",
    {},
    [...Object.keys(named), "custom"].map((n) => h("option", { value: n, title: named[n] || null }, n)),
  );
  choice.value = isNamed ? value : "custom";
  choice.addEventListener("change", () => {
    const custom = choice.value === "custom";
    // A custom template starts from the text of the named one it replaces.
    text.value = custom ? (named[text.value] ?? text.value) : choice.value;
    text.hidden = !custom;
  });
  return h(
    "div.field.wide",
    { "data-field": path },
    h("label", { for: "f-prompt-template-choice", title: path }, "Template"),
    choice,
    text,
    h("span.help", {}, p.description || ""),
    h("span.err", { hidden: true }),
  );
}

export const kindOfSelect = (path) => Object.keys(REGISTRIES).find((k) => REGISTRIES[k].select === path);

/** The parameter fields of entry `name` of a registry (an algorithm, a task), from its schema. */
function paramsBox(kind, name, values) {
  const reg = REGISTRIES[kind];
  const entries = reg.entries();
  const entry = entries.find((e) => e.name === name);
  const box = h(`div.params-box#params-${kind}`);
  if (reg.heading) box.append(h("h3", {}, reg.heading(name)));
  if (!entry) return box;
  const ps = entry.params_schema;
  const saved = typed[kind]?.[name] || {};
  // Knobs every entry of the registry shares go after the entry's own.
  const shared = new Set(
    Object.keys(ps.properties || {}).filter(
      (k) => entries.length > 1 && entries.every((e) => e.params_schema.properties && k in e.params_schema.properties),
    ),
  );
  const own = [],
    common = [];
  for (const [param, prop] of Object.entries(ps.properties || {})) {
    const v = param in saved ? saved[param] : values && param in values ? values[param] : entry.defaults[param];
    // anyField: a parameter may be a sub-object (the math task's column mapping) or a list.
    const f = withDefs(ps, () => anyField(`${reg.prefix}.${param}`, prop, v));
    (shared.has(param) ? common : own).push(f);
  }
  box.append(
    h("p.entry-desc", {}, entry.description || ""),
    h("div.fields", {}, own.length ? own : h("span.muted", {}, `No ${kind}-specific parameters.`)),
  );
  if (common.length) {
    box.append(h("h3", { style: "margin:14px 0 8px" }, "Shared knobs"), h("div.fields", {}, common));
  }
  return box;
}

/** Keys of a task section that RunConfig's schema does not know: parameters of the flat form. */
function flatTaskParams(task) {
  const known = resolve(schema.properties.task).properties || {};
  return Object.fromEntries(Object.entries(task || {}).filter(([k]) => !(k in known)));
}

/** Whether job kind `kind` trains with RunConfig section `section` (GET /api/presets `kinds`). */
export function kindUses(kind, section) {
  const entry = presets.kinds.find((k) => k.name === kind);
  return (entry ? entry.sections : KIND_SECTIONS).includes(section);
}

export function render(config, extra = {}) {
  current.kind = config.kind ?? presets.defaults.kind;
  current.algorithm = config.algorithm;
  current.task = config.task?.name;
  const top = h(
    "div.form-section",
    {},
    h("h3", {}, "Run"),
    h(
      "div.fields",
      {},
      field("config.name", schema.properties.name, extra.name ?? config.name, {
        label: "Name",
        placeholder: "(automatic)",
      }),
      field("config.kind", schema.properties.kind, current.kind, {
        label: "Kind",
        options: entryOptions("kind"),
      }),
      field("config.algorithm", schema.properties.algorithm, config.algorithm, {
        label: "Algorithm",
        options: entryOptions("algorithm"),
      }),
      field("config.steps", schema.properties.steps, config.steps),
      field("seeds", { type: "string" }, extra.seeds ?? String(config.seed ?? 0), {
        label: "Seeds",
        help: "Comma-separated; two or more start a group of runs (one per seed) to compare with a mean ± band.",
        placeholder: "0, 1, 2",
      }),
      field("tags", { type: "string" }, extra.tags ?? "", {
        label: "Tags",
        help: "Comma-separated labels for filtering.",
        placeholder: "baseline, sweep-1",
      }),
    ),
  );
  const params = h(
    "div.form-section",
    { "data-uses": "algorithm" },
    paramsBox("algorithm", config.algorithm, REGISTRIES.algorithm.values(config)),
  );
  const kindParams = h(
    "div.form-section",
    { "data-section": "kind_params" },
    paramsBox("kind", current.kind, REGISTRIES.kind.values(config)),
  );
  const rewards = h(
    "div.form-section",
    { "data-section": "rewards", "data-uses": "rewards" },
    h("h3", {}, "Reward functions"),
    h(
      "div.fields",
      {},
      rewardsField(config.rewards, presets, schema.properties.rewards, () => current.task, changed),
    ),
  );
  // Tools change how a run samples, its held-out evaluation included: every kind has them (an
  // SFT on tool traces lists its tool here, and its evaluation then reports the tool-call rate).
  const tools = h(
    "div.form-section",
    { "data-section": "tools" },
    h("h3", {}, "Tools"),
    h("div.fields", {}, toolsFields(config.tools, presets, schema.properties.tools, changed)),
  );
  const sections = SECTIONS.map((s) =>
    h(
      "div.form-section",
      { "data-section": s.key },
      h("h3", {}, s.title),
      h("div.fields", {}, sectionFields(s.key, config[s.key])),
      s.params ? paramsBox(s.params, current[s.params], REGISTRIES[s.params].values(config)) : null,
    ),
  );
  const adv = h(
    "details.adv",
    { open: extra.openAdvanced || null },
    h(
      "summary",
      {},
      "Advanced: precision and memory, evaluation and benchmarks, environment limits, checkpoints, logging",
    ),
    ADVANCED.map((s) =>
      h(
        "div.form-section",
        { "data-section": s.key || null },
        h("h3", {}, s.title),
        h(
          "div.fields",
          {},
          (s.keys || [s.key]).flatMap((k) => sectionFields(k, config[k], Boolean(s.advanced))),
        ),
      ),
    ),
  );
  const models = h(
    "datalist#model-list",
    {},
    presets.models.map((m) => h("option", { value: m.name }, m.description)),
  );
  const steps = h("datalist#step-list", {}, h("option", { value: "last" }), h("option", { value: "best" }));
  $("#form-body").replaceChildren(top, kindParams, params, ...sections, rewards, tools, adv, models, steps);
  applyKind();
  changed();
}

/** Hide what the chosen job kind does not train with (the values are still sent: defaults). */
export function applyKind() {
  const uses = (section) => kindUses(current.kind, section);
  $("[data-field='config.algorithm']").hidden = !uses("algorithm");
  for (const el of $$("[data-uses]")) el.hidden = !uses(el.dataset.uses);
  for (const el of $$("[data-field^='config.sampling.']"))
    el.hidden = !uses("sampling") && !EVERY_KIND_FIELDS.has(el.dataset.field);
  const laterStage = pipeline.on && pipeline.at > 0;
  const fromRun = $("[data-field='config.model.from_run']");
  fromRun.hidden = laterStage; // a later stage starts from the stage before it
  $("#stage-note").textContent = laterStage
    ? `Stage ${pipeline.at + 1} starts from stage ${pipeline.at}'s checkpoint (model.step picks which).`
    : "";
}

/** What was typed into `kind`'s parameters, as values (a generator's config an object, a list an
 * array): switching back rebuilds the fields from them. Kept as the inputs' text, a JSON field's
 * came back quoted as a string (and the server refused it as one). */
function rememberParams(kind) {
  typed[kind] ??= {};
  typed[kind][current[kind]] = collect(REGISTRIES[kind].prefix) || {};
}

export function switchEntry(kind, name) {
  rememberParams(kind);
  current[kind] = name;
  $(`#params-${kind}`).replaceWith(paramsBox(kind, name, null));
  if (kind === "kind") applyKind();
  if (kind === "task") refreshRewardChoices(); // a reward may need a method of the task's
}

/** The algorithm's parameters that differ from its defaults: the server fills in the rest (and
 * a default may depend on the rest of the config: DAPO's overlong buffer shrinks to fit a short
 * response cap). */
function withoutDefaults(params, entry) {
  const defaults = entry?.defaults || {};
  return Object.fromEntries(
    Object.entries(params || {}).filter(([k, v]) => JSON.stringify(v) !== JSON.stringify(defaults[k])),
  );
}

export function buildRequest() {
  const config = collect("config") || {};
  config.params = withoutDefaults(
    config.params,
    presets.algorithms.find((a) => a.name === config.algorithm),
  );
  const seedsText = $("[name='seeds']").value.trim();
  let seeds = null;
  if (seedsText) {
    seeds = seedsText
      .split(/[\s,]+/)
      .filter(Boolean)
      .map((s) => (/^\d+$/.test(s) ? Number(s) : s));
    if (typeof seeds[0] === "number") config.seed = seeds[0];
  }
  const tags = $("[name='tags']")
    .value.split(",")
    .map((t) => t.trim())
    .filter(Boolean);
  const name = config.name ?? null;
  return { config, seeds, tags, name };
}

/** POST /api/pipelines's body: every stage's config (the one on screen read from the form);
 * a later stage's model.from_run is the server's to set (the stage before it). */
