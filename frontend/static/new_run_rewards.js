// The run form's reward functions (config.rewards): one row per reward, its weight and its own
// parameters rendered from the reward's params_schema (GET /api/presets `rewards`), the other
// registered rewards added from a picker and removed. The reward every run has (RewardConfig's
// default name: the verifier, which the config adds when it is not listed) is always a row and
// cannot be removed; the picker offers only the rewards the chosen task allows (a reward's
// `tasks`). Inputs are named config.rewards.<i>.name / .weight / .params.<param>: the shape of
// the request, and the `loc` of a 422 about them. A new reward needs nothing here.
import { anyField, collect, field, resolve, withDefs } from "/static/form.js";
import { h } from "/static/util.js";

let refresh = () => {}; // the picker of the section on screen

/** Offer again the rewards the chosen task allows (after the task changed). */
export function refreshRewardChoices() {
  refresh();
}

/** The rewards field: `rewards` (config.rewards) as rows, with the picker below them.
 * `presets`: GET /api/presets; `task()`: the task the form shows; `onChange()`: after a row is
 * added or removed. Resolves against RunConfig's schema (configureForm). */
export function rewardsField(rewards, presets, rewardsProp, task, onChange) {
  const list = resolve(rewardsProp);
  const rowProps = resolve(list.items).properties; // RewardConfig's fields
  const always = rowProps.name.default;
  const entries = Object.fromEntries(presets.rewards.map((r) => [r.name, r]));
  const rows = h("div.rows");
  const choice = h("select#reward-choice", { "aria-label": "Reward function to add" });
  const add = h("button.btn.btn-sm#add-reward", { type: "button" }, "Add reward");
  const path = "config.rewards";
  const listed = () => collect(path) || [];

  function row(item, i) {
    const rowPath = `${path}.${i}`;
    const entry = entries[item.name];
    const name = h(
      "div.field",
      { "data-field": `${rowPath}.name` },
      h("label", { title: `${rowPath}.name` }, "Reward"),
      h("input", { type: "hidden", name: `${rowPath}.name`, value: item.name, "data-type": "string" }),
      h("strong.reward-name", {}, item.name),
      h("span.help", {}, entry?.description ?? ""),
      h("span.err", { hidden: true }),
    );
    const weight = field(`${rowPath}.weight`, rowProps.weight, item.weight ?? entry?.default_weight, {
      label: "Weight",
    });
    // An unregistered name (a run stored elsewhere) keeps its params as JSON: the server says why.
    const params = entry
      ? Object.entries(entry.params_schema.properties || {}).map(([param, prop]) =>
          withDefs(entry.params_schema, () =>
            anyField(`${rowPath}.params.${param}`, prop, item.params?.[param] ?? entry.defaults[param]),
          ),
        )
      : [anyField(`${rowPath}.params`, rowProps.params, item.params)];
    let remove = null;
    if (item.name !== always) {
      remove = h("button.btn.btn-sm", { type: "button", "data-remove": rowPath }, "Remove");
      remove.addEventListener("click", () => {
        renderRows(listed().filter((_, j) => j !== i));
        onChange();
      });
    }
    return h(
      "div.list-row",
      { "data-field": rowPath, "data-reward": item.name },
      h("div.fields", {}, name, weight, ...params),
      remove,
    );
  }

  function renderRows(items) {
    rows.replaceChildren(...items.map(row));
    refresh();
  }

  refresh = () => {
    const have = new Set([...rows.children].map((r) => r.dataset.reward));
    const offered = presets.rewards.filter((r) => !have.has(r.name) && r.tasks.includes(task()));
    choice.replaceChildren(...offered.map((r) => h("option", { value: r.name, title: r.description }, r.name)));
    choice.disabled = add.disabled = !offered.length;
  };

  add.addEventListener("click", () => {
    const entry = entries[choice.value];
    if (!entry) return;
    renderRows([...listed(), { name: entry.name, weight: entry.default_weight, params: entry.defaults }]);
    onChange();
  });

  const start = rewards?.length ? rewards : [];
  renderRows(start.some((r) => r.name === always) ? start : [{ name: always }, ...start]);
  return h(
    "div.field.wide.group",
    { "data-field": path, "data-list": "1" },
    h(
      "div.group-head",
      {},
      h("label", { title: path }, list.title || "Rewards"),
      h("span.help", {}, list.description || ""),
      h("span.err", { hidden: true }),
    ),
    rows,
    h("div.reward-add", {}, choice, add),
  );
}
