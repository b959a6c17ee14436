// Forms rendered from a JSON schema (pydantic's), shared by the run form and its pipeline
// stages: one input per property (sub-objects as field groups, lists of objects as rows, lists
// of strings as comma-separated text), each input named by its dot path in the request, which
// is also the `loc` of a 422 about it; reading the inputs back into a typed request; and a
// 422's messages put under the fields they name (the new-study form shares that part).
import { $, $$, h } from "/static/util.js";

let schema = { $defs: {} }; // the schema whose $refs resolve (RunConfig's, or an entry's params)
let hooks = { special: () => null, changed: () => {} };

/** The schema the fields resolve their $refs in; `special(path, prop, value)` renders a path
 * the generic form does not (null: the generic field); `changed()` runs after a row is added or
 * removed. */
export function configureForm(rootSchema, { special, changed } = {}) {
  schema = rootSchema;
  hooks = { special: special || hooks.special, changed: changed || hooks.changed };
}

export function resolve(prop) {
  if (!prop) return {};
  if (prop.$ref) {
    // A property's own keys (its title, description) win over the referenced model's; the
    // model's title is its class name, kept as refTitle so a label never shows it.
    const { $ref, ...own } = prop;
    const def = resolve(schema.$defs[$ref.split("/").pop()]);
    return { ...def, ...own, refTitle: def.title };
  }
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
export function field(path, rawProp, value, opts = {}) {
  const p = resolve(rawProp);
  const id = `f-${path.replace(/[^\w]/g, "_")}`;
  const last = path.split(".").pop();
  const label = opts.label || p.title || last; // the Field's title (pydantic's, or one it sets)
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
    // a nullable choice (the SFT's tool) can be set back to none: readValue sends "" as null
    const none = p.nullable ? [{ value: "", label: "(none)" }] : [];
    const options = opts.options || [...none, ...p.enum.map((v) => ({ value: v, label: v }))];
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

/** The input(s) for a property of any shape: sub-object, list, or plain field. */
export function anyField(path, rawProp, value) {
  const p = resolve(rawProp);
  const items = p.type === "array" ? resolve(p.items) : null;
  const special = hooks.special(path, p, value);
  if (special) return special;
  if (p.type === "object" && p.properties) return subObject(path, p, value);
  if (items?.type === "object") return objectList(path, p, items, value);
  // A free-form mapping (a reward's params): JSON text, parsed on submit; text that did not
  // parse is shown as it was typed, not quoted again.
  const json = typeof value === "string" ? value : JSON.stringify(value ?? {});
  if (p.type === "object") return field(path, { ...p, type: "json" }, json);
  if (items) return field(path, { ...p, type: "list" }, Array.isArray(value) ? value.join(", ") : (value ?? ""));
  return field(path, rawProp, value);
}

function groupHead(path, p, ...extra) {
  const last = path.split(".").pop();
  return h(
    "div.group-head",
    {},
    // The Field's own title; not the nested model's class name (LoraConfig).
    h("label", { title: path }, p.title && p.title !== p.refTitle ? p.title : titleCase(last)),
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
          hooks.changed();
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
    hooks.changed();
  });
  renderRows(value || []);
  box.append(groupHead(path, p), rows, add);
  return box;
}

/** ``config`` with every key it lacks, at any depth, taken from ``defaults`` (a run stored
 * before a section existed, or an external run's partial config, prefills the form whole). */
export function withDefaults(defaults, config) {
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
export const valueOr = (values, key, prop) => values?.[key] ?? resolve(prop).default;

const singular = (path) => path.split(".").pop().replace(/s$/, "");

export const titleCase = (text) => text[0].toUpperCase() + text.slice(1);

/** ``build()`` with ``rootSchema``'s $defs resolvable (an entry's params_schema has its own). */
export function withDefs(rootSchema, build) {
  const saved = schema;
  schema = { ...rootSchema, $defs: { ...(saved.$defs || {}), ...(rootSchema.$defs || {}) } };
  try {
    return build();
  } finally {
    schema = saved;
  }
}

/** The typed value of an input: numbers when they parse, the raw text otherwise (the server says why). */
export function readValue(el) {
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
export function setPath(obj, parts, value) {
  let cur = obj;
  parts.slice(0, -1).forEach((p, i) => {
    cur = cur[p] ??= /^\d+$/.test(parts[i + 1]) ? [] : {};
  });
  cur[parts[parts.length - 1]] = value;
}

/** The value the inputs under dot path `prefix` spell (an object, an array or a scalar). */
export function collect(prefix) {
  const root = {};
  for (const el of $$("#form-body [name]")) {
    if (el.name !== prefix && !el.name.startsWith(`${prefix}.`)) continue;
    const v = readValue(el);
    if (v !== undefined) setPath(root, el.name.split("."), v);
  }
  return prefix.split(".").reduce((cur, p) => cur?.[p], root);
}

// ---- a 422's messages, under the fields they name ------------------------------------------------
export function clearErrors({ keepSummary = false } = {}) {
  if (!keepSummary) $("#form-error").hidden = true;
  for (const f of $$(".field.has-error")) clearField(f);
}

/** Take `field`'s mark and its message away together (a message left showing under a field no
 * longer marked was never cleared again). */
function clearField(field) {
  field.classList.remove("has-error");
  const e = $(".err", field);
  e.hidden = true;
  e.textContent = "";
}

/** The field of the longest prefix of `parts` that names one (`data-field`), or null. */
export function fieldAt(parts) {
  for (let n = parts.length; n > 0; n--) {
    const el = document.querySelector(`[data-field="${CSS.escape(parts.slice(0, n).join("."))}"]`);
    if (el) return el;
  }
  return null;
}

/** Mark `field` as wrong, with `message` under it (after any it already shows); a field folded
 * away in a <details> is unfolded. */
export function markField(field, message) {
  field.classList.add("has-error");
  const err = $(".err", field);
  err.hidden = false;
  err.textContent = err.textContent ? `${err.textContent}; ${message}` : message;
  const folded = field.closest("details");
  if (folded) folded.open = true;
}

/** Show a 422's `detail` (or a message): each error under the field `fieldOf(loc)` returns (with
 * `messageOf(error, field)`), the rest in the box above the form, which also names the marked
 * fields; the first one is scrolled to and focused unless `focus` is false (a check while
 * the user types). */
export function showErrors(detail, { fieldOf, messageOf = (e) => e.msg, summary = true, focus = true } = {}) {
  const general = [];
  if (!Array.isArray(detail)) general.push(typeof detail === "string" ? detail : JSON.stringify(detail));
  else
    for (const e of detail) {
      const f = fieldOf(e.loc || []);
      if (f) markField(f, messageOf(e, f));
      else general.push(`${(e.loc || []).filter((x) => x !== "body").join(".") || "request"}: ${e.msg}`);
    }
  const marked = $$(".field.has-error");
  if (summary && marked.length) {
    const names = marked.map((f) => $("label", f).textContent.trim());
    general.unshift(
      `The server refused ${marked.length} field${marked.length === 1 ? "" : "s"}: ${names.join(", ")} (see the messages below each).`,
    );
  }
  if (general.length) {
    const box = $("#form-error");
    box.textContent = general.join("\n");
    box.hidden = false;
  }
  if (!focus) return;
  const first = $(".field.has-error input, .field.has-error select, .field.has-error textarea");
  const target = first || $("#form-error:not([hidden])");
  if (target) target.scrollIntoView({ block: "center" });
  if (first?.focus) first.focus({ preventScroll: true });
}
