// The run form's tools (config.tools): the registered tools a rollout may call (GET /api/presets
// `tools`), one row each, added from a picker and removed, a tool that runs model-written code
// marked as running it in the sandbox; then the section's limits (max_turns, timeout_s, and
// under "Limits of each call" the fields the schema marks advanced), their help texts from
// RunConfig's schema. Inputs are named config.tools.names.<i> and config.tools.<field>: the
// shape of the request and the `loc` of a 422 about them (a tool refused for want of a worker
// with a sandbox is marked on its row). No tool listed: plain single-turn rollouts.
import { anyField, collect, field, resolve } from "/static/form.js";
import { h } from "/static/util.js";

const PATH = "config.tools";

/** The tools section's fields: `tools` (config.tools) with the picker, then its limits.
 * `presets`: GET /api/presets; `onChange()`: after a row is added or removed. Resolves against
 * RunConfig's schema (configureForm). */
export function toolsFields(tools, presets, toolsProp, onChange) {
  const def = resolve(toolsProp);
  const props = def.properties;
  const entries = Object.fromEntries(presets.tools.map((t) => [t.name, t]));
  const names = resolve(props.names);
  const rows = h("div.rows");
  const choice = h("select#tool-choice", { "aria-label": "Tool to add" });
  const add = h("button.btn.btn-sm#add-tool", { type: "button" }, "Add tool");
  const listed = () => collect(`${PATH}.names`) || [];

  function row(name, i) {
    const rowPath = `${PATH}.names.${i}`;
    const entry = entries[name];
    const remove = h("button.btn.btn-sm", { type: "button", "data-remove": rowPath }, "Remove");
    remove.addEventListener("click", () => {
      renderRows(listed().filter((_, j) => j !== i));
      onChange();
    });
    return h(
      "div.list-row",
      { "data-tool": name },
      h(
        "div.field.wide",
        { "data-field": rowPath },
        h("input", { type: "hidden", name: rowPath, value: name, "data-type": "string" }),
        h(
          "div",
          {},
          h("strong.reward-name", {}, name),
          entry ? h("span.muted.small", {}, ` · called as <${entry.tag}>…</${entry.tag}> `) : null,
          entry?.sandboxed
            ? h(
                "span.badge.sandboxed",
                { title: "a run with it needs a worker whose sandbox works" },
                "runs code in the sandbox",
              )
            : null,
        ),
        h("span.help", {}, entry?.description ?? "not a registered tool"),
        h("span.err", { hidden: true }),
      ),
      remove,
    );
  }

  function renderRows(list) {
    rows.replaceChildren(...list.map(row));
    const have = new Set(list);
    const offered = presets.tools.filter((t) => !have.has(t.name));
    choice.replaceChildren(
      ...offered.map((t) =>
        h(
          "option",
          { value: t.name, title: t.description },
          t.sandboxed ? `${t.name} (runs code in the sandbox)` : t.name,
        ),
      ),
    );
    choice.disabled = add.disabled = !offered.length;
  }

  add.addEventListener("click", () => {
    if (!entries[choice.value]) return;
    renderRows([...listed(), choice.value]);
    onChange();
  });
  renderRows(tools?.names || []);

  const limit = (name) => {
    // a mapping (tools.params: each tool's own parameters) is JSON text, as a reward's params
    if (resolve(props[name]).type === "object") return anyField(`${PATH}.${name}`, props[name], tools?.[name]);
    let help = null;
    if (name === "timeout_s" && presets.tool_timeout_max_s)
      help = `${resolve(props[name]).description} This platform allows at most ${presets.tool_timeout_max_s} s.`;
    return field(`${PATH}.${name}`, props[name], tools?.[name], { help });
  };
  const fieldNames = Object.keys(props).filter((k) => k !== "names");
  const advanced = fieldNames.filter((k) => resolve(props[k]).advanced);
  return [
    h(
      "div.field.wide.group",
      { "data-field": `${PATH}.names`, "data-list": "1" },
      h(
        "div.group-head",
        {},
        h("label", { title: `${PATH}.names` }, names.title || "Tools"),
        h("span.help", {}, names.description || ""),
        h("span.err", { hidden: true }),
      ),
      rows,
      h("div.reward-add", {}, choice, add),
    ),
    ...fieldNames.filter((k) => !advanced.includes(k)).map(limit),
    h(
      "details.field.wide.tool-limits",
      {},
      h("summary", {}, "Limits of each call"),
      h("div.fields", {}, advanced.map(limit)),
    ),
  ];
}
