// The reasoning_gym task's generator config as fields: the chosen generator's own parameters
// (GET /api/presets/generators/{name}: type, default, caps) drawn under its JSON field, which
// stays what the form sends. Typing in a field writes its key into the JSON (blank: the key
// goes, the generator's default applies); editing the JSON by hand updates the fields. The JSON
// belongs to one generator (its `data-generator`): switching the dataset to another empties it,
// and the panel says what was dropped, so no generator is sent another's settings.
import { get } from "/static/api.js";
import { h } from "/static/util.js";

const CONFIG = "config.task.params.config";
const DATASET = "config.task.params.dataset";
const known = new Map(); // generator → its parameters

function parsed(text) {
  try {
    const value = JSON.parse(text.value.trim() || "{}");
    return value && typeof value === "object" && !Array.isArray(value) ? value : null;
  } catch {
    return null;
  }
}

function input(param, value) {
  const attrs = { name: `generator.${param.name}`, "data-param": param.name, "aria-label": param.name };
  const placeholder = param.default === null ? "" : String(param.default);
  if (param.type === "boolean") {
    const select = h(
      "select",
      attrs,
      h("option", { value: "" }, `default (${placeholder || "–"})`),
      h("option", { value: "true" }, "true"),
      h("option", { value: "false" }, "false"),
    );
    select.value = value === undefined ? "" : String(value);
    return select;
  }
  const number = param.type === "integer" || param.type === "number";
  const el = h("input", {
    ...attrs,
    type: number ? "number" : "text",
    step: param.type === "integer" ? "1" : number ? "any" : null,
    min: number && param.min !== null ? String(param.min) : null,
    max: number && param.max !== null ? String(param.max) : null,
    placeholder,
  });
  el.value = value === undefined ? "" : String(value);
  return el;
}

function readInput(el, param) {
  const raw = el.value.trim();
  if (raw === "") return undefined;
  if (param.type === "boolean") return raw === "true";
  if (param.type === "integer" || param.type === "number") return Number(raw);
  return raw;
}

/** The JSON's settings of another generator than `name`, removed: what was dropped, said for
 * the panel ("" when nothing was). The first generator the JSON is drawn for owns it (a run
 * prefilled, a model's recommended settings); an unknown name being typed is no switch yet. */
function dropForeignConfig(text, name) {
  const owner = text.dataset.generator;
  text.dataset.generator = name;
  const config = parsed(text);
  if (owner === undefined || owner === name || (config && !Object.keys(config).length)) return "";
  const old = text.value.trim();
  text.value = "";
  text.dispatchEvent(new Event("input", { bubbles: true })); // the request follows
  return `${owner}'s settings were dropped with it: ${old}`;
}

/** Draw (or redraw) the fields of the generator the dataset field names; nothing for another
 * task or an unknown generator. */
export async function refreshGeneratorFields() {
  const box = document.querySelector(`[data-field="${CONFIG}"]`);
  const dataset = document.querySelector(`[name="${DATASET}"]`);
  if (!box || !dataset) {
    document.querySelector("#generator-fields")?.remove();
    return;
  }
  const name = dataset.value.trim();
  if (!known.has(name)) {
    let found = null; // an unknown generator: no fields (the submit names it), asked once
    try {
      found = (await get(`/api/presets/generators/${encodeURIComponent(name)}`)).parameters;
    } catch {
      found = null;
    }
    known.set(name, found);
  }
  const params = known.get(name);
  if (dataset.value.trim() !== name || !box.isConnected) return; // changed meanwhile
  const shown = document.querySelector("#generator-fields");
  if (shown?.dataset.generator === name && shown.previousElementSibling === box) return; // drawn by an overlapping call
  shown?.remove();
  if (!params) return;
  const text = box.querySelector("input, textarea");
  const dropped = dropForeignConfig(text, name);
  const values = parsed(text) || {};
  const typed = params.filter((p) => p.type !== "other");
  const fields = typed.map((p) => {
    const el = input(p, values[p.name]);
    const bounds = p.min !== null ? ` ${p.min} … ${p.max}` : "";
    return h(
      "label.generator-field",
      { title: `${p.name}: default ${p.default ?? "–"}${bounds ? `; within${bounds}` : ""}` },
      h("span", {}, p.name),
      el,
    );
  });
  const others = params.filter((p) => p.type === "other").map((p) => p.name);
  const panel = h(
    "div.generator-fields#generator-fields",
    { "data-generator": name },
    h("div.muted.small", {}, `${name}'s parameters (blank: the generator's default)`),
    dropped ? h("div.small.generator-dropped", {}, dropped) : null,
    h("div.generator-grid", {}, fields),
    others.length ? h("div.muted.small", {}, `Set in the JSON only: ${others.join(", ")}`) : null,
  );
  panel.addEventListener("input", (ev) => {
    const param = typed.find((p) => p.name === ev.target.dataset.param);
    const config = parsed(text);
    if (!param || config === null) return; // hand-written JSON that does not parse: left alone
    const value = readInput(ev.target, param);
    if (value === undefined) delete config[param.name];
    else config[param.name] = value;
    text.value = Object.keys(config).length ? JSON.stringify(config) : "";
    text.dataset.fromFields = "1";
    text.dispatchEvent(new Event("input", { bubbles: true }));
  });
  panel.addEventListener("change", (ev) => ev.stopPropagation()); // the JSON's own events suffice
  box.after(panel);
}

/** The JSON edited by hand: the fields show what it now sets. */
export function syncGeneratorFields(target) {
  if (target?.name !== CONFIG) return;
  if (target.dataset.fromFields) {
    delete target.dataset.fromFields;
    return;
  }
  const config = parsed(target);
  if (config === null) return;
  for (const el of document.querySelectorAll("#generator-fields [data-param]")) {
    const value = config[el.dataset.param];
    el.value = value === undefined ? "" : String(value);
  }
}
