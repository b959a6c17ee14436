// New study form (/studies/new): name, seeds, concurrency, a base config and arms as JSON
// (each optionally tuned on the tuning seeds first), the objective and the baseline. Every change is checked against the server
// (POST /api/studies/check: the same validation as creating, nothing stored) and its 422s are
// shown under the field they name; submit creates the study and opens its page.
import { ApiError, errorText, post } from "/static/api.js";
import { KEY_METRICS } from "/static/catalogue.js";
import { clearErrors, fieldAt, markField, showErrors as showFormErrors } from "/static/form.js";
import { $, $$, debounce, h } from "/static/util.js";

const DEFAULT_ARMS = [
  { name: "grpo", overrides: { algorithm: "grpo" } },
  { name: "conspo", overrides: { algorithm: "conspo" } },
];
// A field's own problem (bad JSON, a seed that is not a number) is found here and never sent.
const localErrors = new Map(); // data-field → message

function armRow(arm, i) {
  return h(
    "div.list-row.arm-row",
    { "data-arm": i },
    h(
      "div.fields",
      {},
      h(
        "div.field",
        { "data-field": `arms.${i}.name` },
        h("label", { for: `f-arm-${i}-name` }, `Arm ${i + 1} name`),
        h("input.arm-name", { id: `f-arm-${i}-name`, value: arm.name }),
        h("span.err", { hidden: true }),
      ),
      h(
        "div.field.wide",
        { "data-field": `arms.${i}.overrides` },
        h(
          "label",
          { for: `f-arm-${i}-overrides` },
          "Overrides ",
          h("span.key", {}, 'JSON; dotted paths allowed: {"params.tau": 1.0}'),
        ),
        h(
          "textarea.arm-overrides",
          { id: `f-arm-${i}-overrides`, rows: 2 },
          typeof arm.overrides === "string" ? arm.overrides : JSON.stringify(arm.overrides),
        ),
        h("span.err", { hidden: true }),
      ),
      h(
        "div.field.wide",
        { "data-field": `arms.${i}.tune` },
        h(
          "label",
          { for: `f-arm-${i}-tune` },
          "Tune ",
          h(
            "span.key",
            {},
            'optional JSON: {"space": {"optim.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": true}}, "trials": 4}',
          ),
        ),
        h(
          "textarea.arm-tune",
          { id: `f-arm-${i}-tune`, rows: 1 },
          typeof arm.tune === "string" ? arm.tune : arm.tune ? JSON.stringify(arm.tune) : "",
        ),
        h("span.err", { hidden: true }),
      ),
    ),
    h(
      "button.btn.btn-sm.remove-arm",
      { type: "button", title: "remove this arm", "aria-label": `remove arm ${i + 1}` },
      "×",
    ),
  );
}

function readArms() {
  return $$(".arm-row").map((row) => ({
    name: $(".arm-name", row).value.trim(),
    overridesText: $(".arm-overrides", row).value,
    tuneText: $(".arm-tune", row).value,
  }));
}

function renderArms(arms) {
  $("#arms").replaceChildren(...arms.map(armRow));
  renderBaseline();
}

function renderBaseline() {
  const select = $("#f-baseline");
  const was = select.value;
  const names = readArms()
    .map((a) => a.name)
    .filter(Boolean);
  select.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
  if (names.includes(was)) select.value = was;
}

function parseJson(text, field) {
  try {
    const value = JSON.parse(text || "{}");
    if (value === null || typeof value !== "object" || Array.isArray(value)) throw new Error("must be a JSON object");
    return value;
  } catch (err) {
    localErrors.set(field, `not valid JSON: ${err.message}`);
    return {};
  }
}

/** The seeds typed in the field `name`; what is not a seed is a local error. */
function readSeeds(input, name) {
  const seeds = input.value
    .split(/[\s,]+/)
    .filter(Boolean)
    .map((s) => (/^\d+$/.test(s) ? Number(s) : s));
  const bad = seeds.filter((s) => typeof s !== "number");
  if (bad.length) localErrors.set(name, `not a seed (a whole number ≥ 0): ${bad.join(", ")}`);
  return seeds;
}

/** An arm as the API takes it: its tune block only when its field has text. */
function armBody(a, i) {
  const arm = { name: a.name, overrides: parseJson(a.overridesText, `arms.${i}.overrides`) };
  if (a.tuneText.trim()) arm.tune = parseJson(a.tuneText, `arms.${i}.tune`);
  return arm;
}

/** The request body, and the problems found before sending it (in `localErrors`). */
function buildBody() {
  localErrors.clear();
  const seeds = readSeeds($("#f-seeds"), "seeds");
  const tuningSeeds = readSeeds($("#f-tuning-seeds"), "tuning_seeds");
  const body = {
    name: $("#f-name").value.trim(),
    config: parseJson($("#f-config").value, "config"),
    arms: readArms().map(armBody),
    seeds,
    ...(tuningSeeds.length ? { tuning_seeds: tuningSeeds } : {}),
    tasks: $("#f-tasks")
      .value.split(/[\s,]+/)
      .filter(Boolean),
    objective: {
      metric: $("#f-metric").value.trim(),
      reduce: $("#f-reduce").value,
      k: Number($("#f-k").value),
      direction: $("#f-direction").value,
    },
    baseline: $("#f-baseline").value || null,
    concurrency: Number($("#f-concurrency").value),
  };
  $("#preview").textContent = JSON.stringify(body, null, 2);
  return body;
}

/** The field a 422's loc names: the longest data-field prefix of it (body.arms.1.overrides.x →
 * arms.1.overrides; body.objective.k → objective.k; body.seeds.2 → seeds). */
const fieldFor = (loc) => fieldAt((loc || []).filter((p) => p !== "body").map(String));

/** A path as the form names it: "arms.1.overrides.lr" → "Arm 2, overrides.lr" (arms count
 * from 1 on the page). */
const humanPath = (path) =>
  path.replace(/^arms\.(\d+)(?:\.|$)/, (whole, i) => `Arm ${Number(i) + 1}${whole.endsWith(".") ? ", " : ""}`);

/** A 422's messages under their fields; a message about a part of a field says which part;
 * the note beside Start says how many fields to fix. */
function showErrors(detail, focus = false) {
  showFormErrors(detail, {
    fieldOf: fieldFor,
    messageOf: (e, field) => {
      const rest = (e.loc || []).filter((p) => p !== "body").join(".");
      return field.dataset.field === rest ? e.msg : `${humanPath(rest)}: ${e.msg}`;
    },
    summary: false,
    focus,
  });
  const marked = document.querySelectorAll(".field.has-error").length;
  $("#check-note").textContent = marked
    ? `fix the ${marked === 1 ? "marked field" : `${marked} marked fields`}`
    : "the server refused the study (see above)";
}

function showLocal() {
  for (const [name, message] of localErrors) {
    const field = document.querySelector(`[data-field="${CSS.escape(name)}"]`);
    if (field) markField(field, message);
  }
}

let checking = 0;
async function check() {
  const mine = ++checking;
  const body = buildBody();
  clearErrors();
  if (localErrors.size) {
    showLocal();
    $("#check-note").textContent = "fix the marked fields";
    return false;
  }
  try {
    const plan = await post("/api/studies/check", body);
    if (mine !== checking) return false; // a later check is on its way
    const tasks = plan.tasks.length ? ` × ${plan.tasks.length} tasks` : "";
    $("#check-note").textContent =
      `${plan.runs} runs: ${plan.arms.length || "search"} arm${plan.arms.length === 1 ? "" : "s"}${tasks} × ${plan.seeds.length} seed${plan.seeds.length === 1 ? "" : "s"}, baseline ${plan.baseline ?? "–"}. Budget: ${plan.text}`;
    return true;
  } catch (err) {
    if (mine !== checking) return false;
    showErrors(err instanceof ApiError ? err.detail : errorText(err));
    return false;
  }
}
const checkSoon = debounce(check, 400);

async function submit(ev) {
  ev.preventDefault();
  const body = buildBody();
  clearErrors();
  if (localErrors.size) return showLocal();
  const btn = $("#submit-btn");
  btn.disabled = true;
  try {
    const study = await post("/api/studies", body);
    location.href = `/studies/${study.id}`;
  } catch (err) {
    showErrors(err instanceof ApiError ? err.detail : errorText(err), true);
  } finally {
    btn.disabled = false;
  }
}

const form = $("#study-form");
form.addEventListener("submit", submit);
form.addEventListener("input", (ev) => {
  if (ev.target.classList.contains("arm-name")) renderBaseline();
  buildBody();
  checkSoon();
});
form.addEventListener("change", checkSoon);
$("#add-arm").addEventListener("click", () => {
  const arms = readArms().map((a) => ({ name: a.name, overrides: safeJson(a.overridesText), tune: a.tuneText }));
  arms.push({ name: `arm${arms.length + 1}`, overrides: {} });
  renderArms(arms);
  checkSoon();
});
$("#arms").addEventListener("click", (ev) => {
  const button = ev.target.closest(".remove-arm");
  if (!button) return;
  const at = Number(button.closest(".arm-row").dataset.arm);
  const arms = readArms()
    .map((a) => ({ name: a.name, overrides: safeJson(a.overridesText), tune: a.tuneText }))
    .filter((_, i) => i !== at);
  renderArms(arms);
  checkSoon();
});

/** Keeps a half-typed overrides text when the rows are re-rendered (it is re-serialised only
 * when it parses). */
function safeJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

// The default objective: the held-out accuracy, the one key metric of the eval namespace.
$("#f-metric").value ||= KEY_METRICS.find((key) => key.startsWith("eval/")) || "";
$("#metric-options").replaceChildren(
  ...(window.CONSPO_CATALOGUE?.metrics || []).map((m) => h("option", { value: m.key })),
);
renderArms(DEFAULT_ARMS);
check();
