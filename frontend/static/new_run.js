// New-run form, rendered from GET /api/presets (RunConfig's JSON schema and the params_schema of
// each algorithm and task), submitted with fetch to POST /api/runs. A 422 puts each message next
// to the field its `loc` names; the form is never reloaded, so what the user typed stays.
// Sub-objects (model.lora) render as nested field groups, lists of objects (eval.benchmarks) as
// rows to add and remove, lists of strings as comma-separated text; every input's name is its dot
// path in the request, array indices included (config.eval.benchmarks.0.path), which is also the
// `loc` of a 422 about it. Beside the submit button, POST /api/runs/estimate's memory estimate.
//
// Job kinds (rl, sft, distill, dpo: GET /api/presets `kinds`) are a registry like the algorithms:
// the kind's own parameters render from its params_schema under config.kind_params, and the
// sections a kind does not train with (its `sections` lack them) are hidden. The model section
// offers the model registry (GET /api/models) as model.from_run. Pipeline mode keeps one config
// per stage (tabs above the form; each later stage starts from the one before) and submits them
// as one POST /api/pipelines, then opens the pipeline page. `?from_run=N` prefills model.from_run.
import { ApiError, errorText, get, post, qs } from "/static/api.js";
import { KEY_METRICS } from "/static/catalogue.js";
import { $, $$, debounce, h } from "/static/util.js";

// The held-out accuracy: the one key metric of the eval namespace (conspo.metrics.KEY_METRICS).
const HELD_OUT_ACCURACY = KEY_METRICS.find((key) => key.startsWith("eval/"));

let presets = null;
let schema = null; // RunConfig JSON schema

// The registered kinds whose entry is picked by a select and whose parameters are rendered from
// that entry's params_schema, all by one code path (paramsBox). Adding an algorithm or a task
// needs nothing here.
const REGISTRIES = {
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
const current = {}; // registry → the entry shown
let registryModels = []; // GET /api/models: finished runs' checkpoints, usable as model.from_run

// Sections only some job kinds train with (the kind's `sections`); the rest apply to every kind.
// The held-out eval of every kind generates up to sampling.max_new_tokens, so that field stays.
const KIND_SECTIONS = ["algorithm", "sampling", "rewards"];
const EVERY_KIND_FIELDS = new Set(["config.sampling.max_new_tokens"]);

// Pipeline mode: one config per stage, the form showing stage `pipeline.at`.
const pipeline = { on: false, at: 0, stages: [], name: "" };
const typed = {}; // kind → entry name → {param: typed value}, so switching back keeps edits

// Which RunConfig sections are shown openly, and which go under "Advanced".
const SECTIONS = [
  { key: "task", title: "Task", params: "task" }, // the task's own parameters go in its section
  { key: "prompt", title: "Prompt" },
  { key: "model", title: "Model" },
  { key: "sampling", title: "Sampling" },
  { key: "optim", title: "Optimiser" },
  { key: "resources", title: "Resources" }, // GPUs per node, nodes (Ray), ddp or fsdp
];
const ADVANCED = [
  { title: "Precision and memory", keys: ["model", "sampling", "optim"], advanced: true },
  { key: "eval", title: "Evaluation and benchmarks" },
  { key: "checkpoint", title: "Checkpoints" },
  { key: "logging", title: "Logging" },
  { list: "rewards", title: "Reward functions" }, // a list of {name, weight, params} rows
];
// Fields of the open sections that are rarely changed: shown under Advanced instead.
const ADVANCED_FIELDS = new Set([
  "model.dtype",
  "model.mixed_precision",
  "model.device",
  "model.attn_implementation",
  "model.gradient_checkpointing",
  "sampling.vllm_memory_fraction",
  "optim.micro_batch_tokens",
]);

// Friendlier labels than pydantic's auto titles, where those read badly.
const LABELS = {
  lr: "Learning rate",
  top_p: "Top-p",
  tau: "τ (temperature)",
  max_new_tokens: "Max new tokens",
  prompts_per_step: "Prompts per step",
  group_size: "Group size (G)",
  margin_max: "Margin M",
  margin_warmup: "Margin warmup α",
  pass_k: "k of pass@k",
  beta: "KL β",
  clip_low: "Clip ε low",
  clip_high: "Clip ε high",
  loss_agg: "Loss aggregation",
  num_operands: "Operands",
  lora: "LoRA adapters",
  fields: "Dataset columns",
  rank: "LoRA rank r",
  alpha: "LoRA α",
  target_modules: "Target modules",
  attn_implementation: "Attention",
  vllm_memory_fraction: "vLLM memory fraction",
  micro_batch_tokens: "Micro-batch tokens",
};

function resolve(prop) {
  if (!prop) return {};
  if (prop.$ref) return resolve(schema.$defs[prop.$ref.split("/").pop()]);
  if (prop.anyOf) {
    const nonNull = prop.anyOf.filter((p) => p.type !== "null");
    const merged = { ...resolve(nonNull[0] || {}), ...prop, nullable: nonNull.length < prop.anyOf.length };
    delete merged.anyOf;
    return merged;
  }
  if (prop.allOf && prop.allOf.length === 1) return { ...resolve(prop.allOf[0]), ...prop, allOf: undefined };
  return prop;
}

function boundsText(p) {
  const parts = [];
  if (p.minimum !== undefined) parts.push(`≥ ${p.minimum}`);
  if (p.exclusiveMinimum !== undefined) parts.push(`> ${p.exclusiveMinimum}`);
  if (p.maximum !== undefined) parts.push(`≤ ${p.maximum}`);
  if (p.exclusiveMaximum !== undefined) parts.push(`< ${p.exclusiveMaximum}`);
  return parts.join(", ");
}

/** One input for a schema property. `path` is its dot path in the request (config.* / params.*). */
function field(path, rawProp, value, opts = {}) {
  const p = resolve(rawProp);
  const id = `f-${path.replace(/[^\w]/g, "_")}`;
  const last = path.split(".").pop();
  const label = opts.label || LABELS[last] || p.title || last;
  const help = [opts.help || p.description, boundsText(p)].filter(Boolean).join(" ");
  const common = { id, name: path, "data-type": p.type || "string", "data-nullable": p.nullable ? "1" : null };
  let input;
  if (p.type === "boolean") {
    input = h("input", { ...common, type: "checkbox", checked: Boolean(value) });
    return h(
      "div.field.check",
      { "data-field": path },
      input,
      h(
        "div",
        {},
        h("label", { for: id, title: path }, label),
        h("span.help", {}, help),
        h("span.err", { hidden: true }),
      ),
    );
  }
  if (p.enum || opts.options) {
    const options = opts.options || p.enum.map((v) => ({ value: v, label: v }));
    input = h(
      "select",
      common,
      options.map((o) => h("option", { value: o.value, title: o.title || null }, o.label)),
    );
    input.value = value ?? "";
  } else {
    const numeric = p.type === "integer" || p.type === "number";
    input = h("input", {
      ...common,
      type: "text",
      inputmode: numeric ? (p.type === "integer" ? "numeric" : "decimal") : null,
      list: opts.list || null,
      placeholder: opts.placeholder || (p.nullable ? "(none)" : null),
      spellcheck: "false",
    });
    input.value = value === null || value === undefined ? "" : String(value);
  }
  return h(
    `div.field${opts.wide ? ".wide" : ""}`,
    { "data-field": path },
    h("label", { for: id, title: path }, label),
    input,
    h("span.help", {}, help),
    h("span.err", { hidden: true }),
  );
}

function entryOptions(kind) {
  return REGISTRIES[kind].entries().map((e) => ({ value: e.name, label: e.name, title: e.description }));
}

/** The fields of a RunConfig section; `advanced` picks those of ADVANCED_FIELDS, else the rest. */
function sectionFields(sectionKey, values, advanced = false) {
  const def = resolve(schema.properties[sectionKey]);
  return Object.entries(def.properties || {}).flatMap(([name, prop]) => {
    const path = `config.${sectionKey}.${name}`;
    const v = values ? values[name] : undefined;
    if (name === "params") return []; // rendered by paramsBox from the chosen entry's schema
    if (ADVANCED_FIELDS.has(`${sectionKey}.${name}`) !== advanced) return [];
    const kind = kindOfSelect(path);
    if (kind) return field(path, prop, v, { label: titleCase(kind), options: entryOptions(kind) });
    if (sectionKey === "model" && name === "name") {
      return field(path, prop, v, { label: "Model", list: "model-list", wide: false });
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

/** "#12 step last ← #9 step best ← tiny": a model's chain of starting points. */
export function lineageText(lineage) {
  return (lineage || []).map((l) => (l.base ? l.base : `#${l.run} (${l.step})`)).join(" ← ");
}

/** The input(s) for a property of any shape: sub-object, list, prompt template or plain field. */
function anyField(path, rawProp, value) {
  const p = resolve(rawProp);
  const items = p.type === "array" ? resolve(p.items) : null;
  if (path === "config.prompt.template") return templateField(path, p, value);
  if (p.type === "object" && p.properties) return subObject(path, p, value);
  if (items?.type === "object") return objectList(path, p, items, value);
  // A free-form mapping (a reward's params): JSON text, parsed on submit.
  if (p.type === "object") return field(path, { ...p, type: "json" }, JSON.stringify(value ?? {}));
  if (items) return field(path, { ...p, type: "list" }, (value || []).join(", "));
  return field(path, rawProp, value);
}

function groupHead(path, p, ...extra) {
  const last = path.split(".").pop();
  return h(
    "div.group-head",
    {},
    // Not p.title: for a nested model that is its class name (LoraConfig).
    h("label", { title: path }, LABELS[last] || titleCase(last)),
    h("span.help", {}, p.description || ""),
    ...extra,
    h("span.err", { hidden: true }),
  );
}

/** A nested object (model.lora, a benchmark's fields mapping): its own fields, grouped. */
function subObject(path, p, value) {
  const values = value || {};
  return h(
    "fieldset.field.wide.group",
    { "data-field": path },
    groupHead(path, p),
    h(
      "div.fields",
      {},
      Object.entries(p.properties).map(([k, prop]) => anyField(`${path}.${k}`, prop, valueOr(values, k, prop))),
    ),
  );
}

/** A list of objects (eval.benchmarks): one row of fields per item, rows added and removed. */
function objectList(path, p, items, value) {
  const rows = h("div.rows");
  const box = h("div.field.wide.group", { "data-field": path, "data-list": "1" });
  const renderRows = (list) => {
    rows.replaceChildren(
      ...list.map((item, i) => {
        const rowPath = `${path}.${i}`;
        const remove = h("button.btn.btn-sm", { type: "button", "data-remove": rowPath }, "Remove");
        remove.addEventListener("click", () => {
          renderRows(currentItems().filter((_, j) => j !== i));
          formChanged();
        });
        return h(
          "div.list-row",
          { "data-field": rowPath },
          h(
            "div.fields",
            {},
            Object.entries(items.properties).map(([k, prop]) =>
              anyField(`${rowPath}.${k}`, prop, valueOr(item, k, prop)),
            ),
          ),
          remove,
        );
      }),
    );
  };
  const currentItems = () => collect(path) || [];
  const add = h("button.btn.btn-sm", { type: "button", "data-add": path }, `Add ${singular(path)}`);
  add.addEventListener("click", () => {
    renderRows([...currentItems(), {}]);
    formChanged();
  });
  renderRows(value || []);
  box.append(groupHead(path, p), rows, add);
  return box;
}

/** ``config`` with every key it lacks, at any depth, taken from ``defaults`` (a run stored
 * before a section existed, or an external run's partial config, prefills the form whole). */
function withDefaults(defaults, config) {
  const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
  if (!isObject(defaults) || !isObject(config)) return structuredClone(config ?? defaults);
  const out = structuredClone(defaults);
  // `params` belong to the entry the config names (its algorithm, its task), not the default one.
  delete out.params;
  for (const [k, v] of Object.entries(config)) {
    out[k] = k in defaults && k !== "params" ? withDefaults(defaults[k], v) : structuredClone(v);
  }
  return out;
}

// A new list row (or a nested object the config lacks) starts from the schema's defaults.
const valueOr = (values, key, prop) => values?.[key] ?? resolve(prop).default;

const singular = (path) => path.split(".").pop().replace(/s$/, "");

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

const titleCase = (text) => text[0].toUpperCase() + text.slice(1);
const kindOfSelect = (path) => Object.keys(REGISTRIES).find((k) => REGISTRIES[k].select === path);

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

/** ``build()`` with ``rootSchema``'s $defs resolvable (an entry's params_schema has its own). */
function withDefs(rootSchema, build) {
  const saved = schema;
  schema = { ...rootSchema, $defs: { ...(saved.$defs || {}), ...(rootSchema.$defs || {}) } };
  try {
    return build();
  } finally {
    schema = saved;
  }
}

function render(config, extra = {}) {
  current.kind = config.kind ?? "rl";
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
      field("config.kind", schema.properties.kind, config.kind ?? "rl", {
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
    h("summary", {}, "Advanced: precision and memory, evaluation and benchmarks, checkpoints, logging, rewards"),
    ADVANCED.map((s) =>
      h(
        "div.form-section",
        { "data-section": s.key || null },
        h("h3", {}, s.title),
        h(
          "div.fields",
          {},
          s.list
            ? anyField(`config.${s.list}`, schema.properties[s.list], config[s.list])
            : (s.keys || [s.key]).flatMap((k) => sectionFields(k, config[k], Boolean(s.advanced))),
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
  $("#form-body").replaceChildren(top, kindParams, params, ...sections, adv, models, steps);
  applyKind();
  formChanged();
}

/** Hide what the chosen job kind does not train with (the values are still sent: defaults). */
function applyKind() {
  const kind = presets.kinds.find((k) => k.name === current.kind);
  const uses = new Set(kind ? kind.sections : KIND_SECTIONS);
  $("[data-field='config.algorithm']").hidden = !uses.has("algorithm");
  for (const el of $$("[data-uses]")) el.hidden = !uses.has(el.dataset.uses);
  for (const el of $$("[data-field^='config.sampling.']"))
    el.hidden = !uses.has("sampling") && !EVERY_KIND_FIELDS.has(el.dataset.field);
  const rewards = $("[data-field='config.rewards']")?.closest(".form-section");
  if (rewards) rewards.hidden = !uses.has("rewards");
  const laterStage = pipeline.on && pipeline.at > 0;
  const fromRun = $("[data-field='config.model.from_run']");
  fromRun.hidden = laterStage; // a later stage starts from the stage before it
  $("#stage-note").textContent = laterStage
    ? `Stage ${pipeline.at + 1} starts from stage ${pipeline.at}'s checkpoint (model.step picks which).`
    : "";
}

function rememberParams(kind) {
  const { prefix } = REGISTRIES[kind];
  typed[kind] ??= {};
  const saved = {};
  typed[kind][current[kind]] = saved;
  for (const el of $$(`[name^='${prefix}.']`)) {
    saved[el.name.slice(prefix.length + 1)] = el.type === "checkbox" ? el.checked : el.value;
  }
}

function switchEntry(kind, name) {
  rememberParams(kind);
  current[kind] = name;
  $(`#params-${kind}`).replaceWith(paramsBox(kind, name, null));
  if (kind === "kind") applyKind();
}

/** The typed value of an input: numbers when they parse, the raw text otherwise (the server says why). */
function readValue(el) {
  if (el.type === "checkbox") return el.checked;
  const text = el.value.trim();
  const type = el.dataset.type;
  if (type === "list")
    return text
      .split(",")
      .map((t) => t.trim())
      .filter(Boolean);
  if (text === "") return el.dataset.nullable ? null : undefined;
  if (type === "json") {
    try {
      return JSON.parse(text);
    } catch {
      return text; // not JSON: the server's 422 says so next to the field
    }
  }
  if (type === "integer" && /^[+-]?\d+$/.test(text)) return Number(text);
  if (type === "number" && text !== "" && Number.isFinite(Number(text))) return Number(text);
  return text;
}

/** Set obj[parts...] = value; a numeric part indexes an array (eval.benchmarks.0.path). */
function setPath(obj, parts, value) {
  let cur = obj;
  parts.slice(0, -1).forEach((p, i) => {
    cur = cur[p] ??= /^\d+$/.test(parts[i + 1]) ? [] : {};
  });
  cur[parts[parts.length - 1]] = value;
}

/** The value the inputs under dot path `prefix` spell (an object, an array or a scalar). */
function collect(prefix) {
  const root = {};
  for (const el of $$("#form-body [name]")) {
    if (el.name !== prefix && !el.name.startsWith(`${prefix}.`)) continue;
    const v = readValue(el);
    if (v !== undefined) setPath(root, el.name.split("."), v);
  }
  return prefix.split(".").reduce((cur, p) => cur?.[p], root);
}

function buildRequest() {
  const config = collect("config") || {};
  config.params ??= {};
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
function buildPipeline() {
  saveStage();
  const stages = pipeline.stages.map((st, i) => {
    const config = structuredClone(st.config);
    if (i > 0 && config.model) delete config.model.from_run;
    return config;
  });
  return { name: pipeline.name || "pipeline", stages, tags: buildRequest().tags };
}

/** Keep what the form shows as the current stage's config. */
function saveStage() {
  if (!pipeline.on) return;
  const req = buildRequest();
  pipeline.stages[pipeline.at] = {
    config: req.config,
    seeds: $("[name='seeds']").value,
    tags: $("[name='tags']").value,
  };
}

function showStage(i) {
  saveStage();
  pipeline.at = i;
  const st = pipeline.stages[i];
  for (const k of Object.keys(typed)) delete typed[k];
  render(withDefaults(presets.defaults, st.config), { seeds: st.seeds, tags: st.tags });
  renderStageTabs();
}

function renderStageTabs() {
  $("#pipeline-controls").hidden = !pipeline.on;
  $("#stage-tabs").replaceChildren(
    ...pipeline.stages.map((st, i) => {
      const c = st.config;
      const what = (c.kind ?? "rl") === "rl" ? c.algorithm : c.kind;
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

function setPipelineMode(on) {
  pipeline.on = on;
  if (on) {
    pipeline.at = 0;
    pipeline.stages = [];
    saveStage();
  }
  renderStageTabs();
  formChanged();
}

function addStage() {
  saveStage();
  // The next stage copies this one (same task, model, eval) as an RL stage: the usual
  // SFT → RL recipe is "sft", then "+ Add stage".
  const config = structuredClone(pipeline.stages[pipeline.at].config);
  config.kind = "rl";
  config.kind_params = {};
  config.name = null;
  if (config.model) delete config.model.from_run;
  pipeline.stages.push({ config, seeds: pipeline.stages[pipeline.at].seeds, tags: "" });
  pipeline.at = pipeline.stages.length - 1;
  const st = pipeline.stages[pipeline.at];
  render(withDefaults(presets.defaults, st.config), { seeds: st.seeds, tags: st.tags });
  renderStageTabs();
}

function removeStage() {
  if (pipeline.stages.length < 2) return;
  pipeline.stages.splice(pipeline.at, 1);
  pipeline.at = Math.max(0, pipeline.at - 1);
  const st = pipeline.stages[pipeline.at];
  render(withDefaults(presets.defaults, st.config), { seeds: st.seeds, tags: st.tags });
  renderStageTabs();
}

function updatePreview() {
  if (pipeline.on) {
    $("#preview").textContent = `POST /api/pipelines\n${JSON.stringify(buildPipeline(), null, 2)}`;
    $("#submit-btn").textContent = `Start pipeline (${pipeline.stages.length} stages)`;
    return;
  }
  const req = buildRequest();
  $("#preview").textContent = `POST /api/runs\n${JSON.stringify(req, null, 2)}`;
  const n = req.seeds ? req.seeds.length : 1;
  $("#submit-btn").textContent = n > 1 ? `Start ${n} runs` : "Start run";
}

let estimateSeq = 0;

const GIB = 2 ** 30;
const gib = (n) => `${(n / GIB).toLocaleString(undefined, { maximumFractionDigits: n < GIB ? 3 : 1 })} GiB`;

/** Ask the server for the config's memory estimate; red when submitting would be refused. */
async function refreshEstimate() {
  const seq = ++estimateSeq;
  const box = $("#estimate");
  let report = null;
  let problem = null;
  try {
    report = await post("/api/runs/estimate", buildRequest());
  } catch (err) {
    problem = err instanceof ApiError && err.status === 422 ? "fix the fields above to estimate" : errorText(err);
  }
  if (seq !== estimateSeq) return; // a later edit's answer wins
  delete box.dataset.pending;
  box.classList.toggle("over", report?.fits === false);
  if (problem) {
    box.textContent = `Memory: ${problem}`;
    box.title = "";
  } else if (report.total_bytes === null) {
    box.textContent = `Memory: ${report.text}`; // an invalid config, or a model not readable here
    box.title = report.text;
  } else {
    const verdict = report.fits ? "" : " (over the limit: would be refused)";
    box.textContent = `Memory ≈ ${gib(report.total_bytes)} of ${gib(report.limit_bytes)}${verdict}`;
    box.title = report.text;
  }
  box.dataset.totalBytes = report?.total_bytes ?? "";
}

const refreshEstimateSoon = debounce(refreshEstimate, 300);

/** The estimate shown is for an earlier form until the answer for this edit arrives (tests wait
 * on ``data-pending``). */
function markEstimateStale() {
  $("#estimate").dataset.pending = "1";
}

function formChanged() {
  updatePreview();
  markEstimateStale();
  refreshEstimateSoon();
}

function clearErrors() {
  $("#form-error").hidden = true;
  for (const f of $$(".field.has-error")) {
    f.classList.remove("has-error");
    const e = f.querySelector(".err");
    e.hidden = true;
    e.textContent = "";
  }
}

/** Map a FastAPI error `loc` to the field that shows it; null when no field matches. */
function fieldForLoc(loc) {
  let parts = [...loc];
  if (parts[0] === "body") parts = parts.slice(1);
  if (parts[0] !== "config" && parts[0] !== "seeds" && parts[0] !== "tags" && parts[0] !== "name")
    parts = ["config", ...parts];
  if (parts[0] === "name") parts = ["config", "name"];
  for (let n = parts.length; n > 0; n--) {
    const path = parts.slice(0, n).join(".");
    const el = document.querySelector(`[data-field="${CSS.escape(path)}"]`);
    if (el) return el;
  }
  return null;
}

function showErrors(detail) {
  const general = [];
  if (!Array.isArray(detail)) {
    general.push(typeof detail === "string" ? detail : JSON.stringify(detail));
  } else {
    for (const e of detail) {
      const f = fieldForLoc(e.loc || []);
      if (f) {
        f.classList.add("has-error");
        const err = f.querySelector(".err");
        err.hidden = false;
        err.textContent = err.textContent ? `${err.textContent}; ${e.msg}` : e.msg;
        const det = f.closest("details");
        if (det) det.open = true;
      } else {
        general.push(`${(e.loc || []).filter((x) => x !== "body").join(".") || "request"}: ${e.msg}`);
      }
    }
  }
  const marked = $$(".field.has-error");
  if (marked.length) {
    const names = marked.map((f) => f.querySelector("label").textContent.trim());
    general.unshift(
      `The server refused ${marked.length} field${marked.length === 1 ? "" : "s"}: ${names.join(", ")} (see the messages below each).`,
    );
  }
  if (general.length) {
    const box = $("#form-error");
    box.textContent = general.join("\n");
    box.hidden = false;
  }
  const first = $(".field.has-error input, .field.has-error select") || $("#form-error:not([hidden])");
  if (first) first.scrollIntoView({ block: "center" });
  if (first?.focus) first.focus({ preventScroll: true });
}

/** A 422 of POST /api/pipelines: the first stage with errors is shown with its messages at
 * its fields; the other stages' messages go to the box above the form. */
function showPipelineErrors(detail) {
  if (!Array.isArray(detail)) return showErrors(detail);
  const stageOf = (e) => (e.loc?.[1] === "stages" && Number.isInteger(e.loc[2]) ? e.loc[2] : null);
  const first = detail.map(stageOf).find((i) => i !== null);
  if (first !== null && first !== undefined && first !== pipeline.at) showStage(first);
  showErrors(
    detail.map((e) => {
      const i = stageOf(e);
      if (i === pipeline.at) return { ...e, loc: ["body", "config", ...e.loc.slice(3)] };
      if (i !== null) return { ...e, loc: [`stage ${i + 1}`, ...e.loc.slice(3)] };
      return e;
    }),
  );
}

async function submitPipeline() {
  const body = buildPipeline();
  const res = await post("/api/pipelines", body);
  $("#submit-note").textContent = `Created pipeline #${res.id}`;
  location.href = `/pipelines/${res.id}`;
}

async function submit(ev) {
  ev.preventDefault();
  clearErrors();
  if (pipeline.on) {
    const btn = $("#submit-btn");
    btn.disabled = true;
    $("#submit-note").textContent = "Submitting…";
    try {
      await submitPipeline();
    } catch (err) {
      $("#submit-note").textContent = "";
      if (err instanceof ApiError && err.status === 422) showPipelineErrors(err.detail);
      else showErrors(errorText(err));
    } finally {
      btn.disabled = false;
    }
    return;
  }
  const req = buildRequest();
  const btn = $("#submit-btn");
  btn.disabled = true;
  $("#submit-note").textContent = "Submitting…";
  try {
    const res = await post("/api/runs", req);
    const ids = res.runs.map((r) => r.id);
    $("#submit-note").textContent = `Created ${ids.map((i) => `#${i}`).join(", ")}`;
    // Several seeds: the runs list of that group (each run's status, queue place, progress),
    // not a compare page that has nothing to draw until the first steps are logged.
    location.href = ids.length === 1 ? `/runs/${ids[0]}` : `/${qs({ group: res.group_id })}`;
  } catch (err) {
    $("#submit-note").textContent = "";
    if (err instanceof ApiError && err.status === 422) showErrors(err.detail);
    else if (err instanceof ApiError && err.status === 401)
      showErrors(
        `Not authorised (${errorText(err)}). Start the server with CONSPO_UI_TOKEN_INJECT=true or log in with a token.`,
      );
    else showErrors(errorText(err));
  } finally {
    btn.disabled = false;
  }
}

async function init() {
  try {
    presets = await get("/api/presets");
  } catch (err) {
    $("#form-body").replaceChildren(h("div.form-error", {}, `Could not load /api/presets: ${errorText(err)}`));
    return;
  }
  schema = presets.config_schema;
  try {
    registryModels = (await get("/api/models")).models;
  } catch {
    registryModels = []; // the form works without it: from_run is then typed by id
  }
  const url = new URLSearchParams(location.search);
  const fromRun = url.get("from_run");
  if (fromRun && /^\d+$/.test(fromRun)) {
    const config = structuredClone(presets.defaults);
    const m = registryModels.find((x) => x.run_id === Number(fromRun));
    // a chained run names its source's base model (model.name), then starts from its weights
    config.model = { ...config.model, from_run: Number(fromRun), name: m ? baseOf(m) : config.model.name };
    if (m) {
      $("#form-title").textContent = `New run from model #${m.run_id}`;
      $("#form-sub").textContent = `Starts from ${m.name}'s checkpoint (${lineageText(m.lineage)}).`;
    }
    render(config);
    return;
  }
  const from = url.get("from");
  if (from) {
    try {
      const run = await get(`/api/runs/${encodeURIComponent(from)}`);
      $("#form-title").textContent = `New run from #${run.id}`;
      $("#form-sub").textContent =
        `Prefilled with the config of ${run.name || `run ${run.id}`}; change anything and start.`;
      render(withDefaults(presets.defaults, run.config), {
        name: run.name ? `${run.name}-copy` : null,
        seeds: String(run.seed ?? run.config.seed ?? 0),
        tags: (run.tags || []).join(", "),
      });
      return;
    } catch (err) {
      $("#form-error").textContent = `Could not load run ${from}: ${errorText(err)}`;
      $("#form-error").hidden = false;
    }
  }
  render(structuredClone(presets.defaults));
}

/** The base model a registry entry's chain ends at (what model.name should say). */
const baseOf = (m) => m.lineage[m.lineage.length - 1]?.base ?? presets.defaults.model.name;

const form = $("#run-form");
form.addEventListener("submit", submit);
form.addEventListener("input", markEstimateStale);
form.addEventListener("input", debounce(formChanged, 150));
form.addEventListener("change", (ev) => {
  if (ev.target.id === "pipeline-mode") return setPipelineMode(ev.target.checked);
  if (ev.target.id === "pipeline-name") {
    pipeline.name = ev.target.value.trim();
    return formChanged();
  }
  const kind = kindOfSelect(ev.target.name);
  if (kind) switchEntry(kind, ev.target.value);
  if (ev.target.name === "config.model.from_run") {
    const m = registryModels.find((x) => x.run_id === Number(ev.target.value));
    if (m) $("[name='config.model.name']").value = baseOf(m);
  }
  if (pipeline.on && (kind === "kind" || kind === "algorithm")) {
    saveStage();
    renderStageTabs();
  }
  const f = ev.target.closest(".field.has-error");
  if (f) f.classList.remove("has-error");
  formChanged();
});
$("#pipeline-name").addEventListener("input", (ev) => {
  pipeline.name = ev.target.value.trim();
});
$("#add-stage").addEventListener("click", () => {
  addStage();
  formChanged();
});
$("#remove-stage").addEventListener("click", () => {
  removeStage();
  formChanged();
});
$("#reset-btn").addEventListener("click", () => {
  for (const k of Object.keys(typed)) delete typed[k];
  clearErrors();
  render(structuredClone(presets.defaults));
});
init();
