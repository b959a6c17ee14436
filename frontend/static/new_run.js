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
import { clearErrors, fieldAt, showErrors as showFieldErrors, withDefaults } from "/static/form.js";
import { lineageText } from "/static/lineage.js";
import {
  buildRequest,
  kindOfSelect,
  kindUses,
  pipeline,
  presets,
  registryModels,
  render,
  startForm,
  switchEntry,
  typed,
} from "/static/new_run_fields.js";
import { refreshGeneratorFields, syncGeneratorFields } from "/static/new_run_generator.js";
import {
  addStage,
  buildPipeline,
  removeStage,
  renderStageTabs,
  saveStage,
  setPipelineMode,
  showStage,
  submitPipeline,
} from "/static/new_run_pipeline.js";
import { $, debounce, fmtDuration, h } from "/static/util.js";

function updatePreview() {
  if (pipeline.on) {
    $("#preview").textContent = `POST /api/pipelines\n${JSON.stringify(buildPipeline(), null, 2)}`;
    const n = pipeline.stages.length;
    $("#submit-btn").textContent = `Start pipeline (${n} ${n === 1 ? "stage" : "stages"})`;
    return;
  }
  const req = buildRequest();
  $("#preview").textContent = `POST /api/runs\n${JSON.stringify(req, null, 2)}`;
  // Seeds that are not whole numbers start nothing (the server names them): no count for them.
  const seeds = req.seeds || [];
  const n = seeds.length ? seeds.filter(Number.isInteger).length : 1;
  const bad = seeds.length - (seeds.length ? n : 0);
  $("#submit-btn").textContent = bad ? "Start runs (fix the seeds)" : n > 1 ? `Start ${n} runs` : "Start run";
}

let estimateSeq = 0;

const GIB = 2 ** 30;
/** Bytes as a person reads them: "3.2 GiB", "632.5 TiB" (never "647,680.9 GiB"). */
function gib(n) {
  const [size, unit] = n >= 2 ** 40 ? [n / 2 ** 40, "TiB"] : [n / GIB, "GiB"];
  return `${size.toLocaleString(undefined, { maximumFractionDigits: n < GIB ? 3 : 1 })} ${unit}`;
}

/** Ask the server for the config's memory estimate; red when submitting would be refused. */
async function refreshEstimate() {
  const seq = ++estimateSeq;
  const box = $("#estimate");
  let report = null;
  let problem = null;
  try {
    report = await post("/api/runs/estimate", buildRequest());
  } catch (err) {
    problem = errorText(err);
  }
  if (seq !== estimateSeq) return; // a later edit's answer wins
  if (report) {
    // The server's checks as you type (what Start would be refused for): each field it names is
    // marked now, not after Start; a config it accepts clears the marks. A pipeline's box above
    // the form keeps what its submit said of the other stages.
    clearErrors({ keepSummary: pipeline.on });
    if (report.errors?.length) showErrors(report.errors, { summary: false, focus: false });
  }
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
    box.textContent = `Memory ≈ ${gib(report.total_bytes)} of ${gib(report.limit_bytes)}${verdict}${paceText(report.pace)}`;
    box.title = report.text;
  }
  box.dataset.totalBytes = report?.total_bytes ?? "";
  showTaskCheck(report?.task ?? null);
  // Busy helpers ("retry shortly", checked: false) are asked again by the page: left for the
  // next edit, the line said busy until the person changed a field (issue 49's walk: choosing
  // SmolLM2's recipe sends a burst of estimates while the first reasoning-gym check imports).
  if (report?.task?.checked === false) {
    setTimeout(() => {
      if (seq === estimateSeq) refreshEstimate(); // a later edit asked already
    }, TASK_CHECK_RETRY_MS);
  }
}

const TASK_CHECK_RETRY_MS = 2000; // the server's Retry-After for a busy task check

/** " · ≈ 62 s a step (median of 4 runs like it, on cpu)": earlier runs of the same model and
 * shape; nothing when there are none (a first run of its kind has no pace to go by). */
function paceText(pace) {
  if (!pace) return "";
  const where = pace.devices.length ? `, on ${pace.devices.join(" / ")}` : "";
  const runs = pace.runs === 1 ? "1 run like it" : `median of ${pace.runs} runs like it`;
  return ` · ≈ ${fmtDuration(pace.seconds_per_step)} a step (${runs}${where})`;
}

/** What building the task said (held-out problems, a task refused): warned as you type, before
 * Start. The server builds it only for a caller with a token, in a helper process. */
function showTaskCheck(check) {
  const line = $("#task-check");
  line.hidden = !check;
  if (!check) return;
  line.classList.toggle("over", check.refused);
  line.textContent = check.refused ? `Task: ${check.text} (would be refused)` : `Task: ${check.text}`;
  line.dataset.heldOut = check.held_out ?? "";
}

const refreshEstimateSoon = debounce(refreshEstimate, 300);

/** The estimate shown is for an earlier form until the answer for this edit arrives (tests wait
 * on ``data-pending``). */
function markEstimateStale() {
  $("#estimate").dataset.pending = "1";
}

function formChanged() {
  updatePreview();
  updateModelNote();
  markEstimateStale();
  refreshEstimateSoon();
  // the generator's fields follow the task and dataset shown (drawn again only when they change)
  const dataset = document.querySelector("[name='config.task.params.dataset']");
  const panel = document.querySelector("#generator-fields");
  if ((dataset?.value ?? null) !== (panel?.dataset.generator ?? null)) refreshGeneratorFields();
}

/** The field a run request's 422 `loc` names ("body.config.steps", "body.seeds.1"; a loc
 * without "config" is a config path), or null. */
function fieldForLoc(loc) {
  let parts = [...loc];
  if (parts[0] === "body") parts = parts.slice(1);
  if (parts[0] !== "config" && parts[0] !== "seeds" && parts[0] !== "tags" && parts[0] !== "name")
    parts = ["config", ...parts];
  if (parts[0] === "name") parts = ["config", "name"];
  return fieldAt(parts);
}

function showErrors(detail, options = {}) {
  showFieldErrors(detail, { fieldOf: fieldForLoc, ...options });
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
      // a 403 (a run another user has not shared) is located at its field like a 422
      if (err instanceof ApiError && [422, 403].includes(err.status)) showPipelineErrors(err.detail);
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
    if (err instanceof ApiError && [422, 403].includes(err.status)) showErrors(err.detail);
    else if (err instanceof ApiError && err.status === 401)
      showErrors(
        `Not authorised (${errorText(err)}). Start the server with CONSPO_UI_TOKEN_INJECT=true or log in with a token.`,
      );
    else showErrors(errorText(err));
  } finally {
    btn.disabled = false;
  }
}

/** The form's config for a run that starts from run ``id``'s model: what that run trained on
 * (its task, prompt, sampling, model settings such as LoRA, evaluation), since the next run
 * most likely goes on with it, where the tiny demo's defaults would silently change them all.
 * A kind that trains no algorithm (sft, dpo, distill) hands over to the default kind: RL from
 * its weights. The defaults when the run cannot be read. */
async function startingFrom(id) {
  try {
    const source = (await get(`/api/runs/${id}`)).config;
    if (!kindUses(source.kind ?? presets.defaults.kind, "algorithm")) {
      for (const key of ["kind", "kind_params", "algorithm", "params"]) delete source[key];
    }
    if (source.model) delete source.model.step; // which checkpoint of *its* source it took
    return withDefaults(presets.defaults, source);
  } catch {
    return structuredClone(presets.defaults);
  }
}

async function init() {
  let loaded = null;
  try {
    loaded = await get("/api/presets");
  } catch (err) {
    $("#form-body").replaceChildren(h("div.form-error", {}, `Could not load /api/presets: ${errorText(err)}`));
    return;
  }
  let models = [];
  try {
    models = (await get("/api/models")).models;
  } catch {
    // the form works without it: from_run is then typed by id
  }
  startForm(loaded, models, formChanged);
  const url = new URLSearchParams(location.search);
  const fromRun = url.get("from_run");
  if (fromRun && /^\d+$/.test(fromRun)) {
    const config = await startingFrom(Number(fromRun));
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
        // A study's own tag marks its runs; a rerun outside the study is not one of them.
        tags: (run.tags || []).filter((t) => !/^study:\d+$/.test(t)).join(", "),
      });
      return;
    } catch (err) {
      $("#form-error").textContent = `Could not load run ${from}: ${errorText(err)}`;
      $("#form-error").hidden = false;
    }
  }
  render(structuredClone(presets.defaults));
}

/** `over` merged into `base` section by section; a section naming another registry entry (a task
 * of another name) replaces the one there, parameters and all. */
function withRecommended(base, over) {
  const out = { ...base };
  for (const [key, value] of Object.entries(over)) {
    const here = out[key];
    const both = value && here && typeof value === "object" && typeof here === "object" && !Array.isArray(value);
    if (!both) out[key] = structuredClone(value);
    else out[key] = "name" in value && value.name !== here.name ? structuredClone(value) : withRecommended(here, value);
  }
  return out;
}

/** Choosing a catalogue model with recommended settings (GET /api/presets `models`) applies them
 * over the form's and says so: the tiny demo's defaults (6 new tokens, no LoRA, an answer tag)
 * are a trap for a real model. Choosing it again after edits applies them again. */
function applyRecommended(name) {
  const model = presets.models.find((m) => m.name === name);
  recommendedFor = model && Object.keys(model.recommended || {}).length ? model : null;
  if (!recommendedFor) return updateModelNote();
  const { config } = buildRequest();
  render(withRecommended(config, model.recommended), { name: config.name }); // the note follows
}

let recommendedFor = null; // the catalogue model whose recommended settings were applied last

/** The note says what holds now: the settings applied, then those changed since by name; it
 * goes when the model is no longer the one they were applied for. */
function updateModelNote() {
  const note = $("#model-note");
  const config = recommendedFor && buildRequest().config;
  if (!recommendedFor || config.model?.name !== recommendedFor.name) {
    recommendedFor = null;
    note.hidden = true;
    return;
  }
  const { name, recommended_why: why } = recommendedFor;
  const changed = changedFrom(recommendedFor.recommended, config);
  note.textContent = changed.length
    ? `${name}: its recommended settings were applied (${why}); changed since: ${changed.join(", ")}.`
    : `${name}: its recommended settings are applied (${why}).`;
  note.hidden = false;
}

/** The dot paths of `recommended` whose value `config` no longer has. */
function changedFrom(recommended, config, prefix = "") {
  return Object.entries(recommended).flatMap(([key, value]) => {
    const path = `${prefix}${key}`;
    const now = config?.[key];
    if (value && typeof value === "object" && !Array.isArray(value)) return changedFrom(value, now, `${path}.`);
    return JSON.stringify(value) === JSON.stringify(now) ? [] : [path];
  });
}

/** The base model a registry entry's chain ends at (what model.name should say). */
const baseOf = (m) => m.lineage[m.lineage.length - 1]?.base ?? presets.defaults.model.name;

const form = $("#run-form");
form.addEventListener("submit", submit);
form.addEventListener("input", markEstimateStale);
form.addEventListener("input", (ev) => syncGeneratorFields(ev.target));
form.addEventListener("input", debounce(formChanged, 150));
form.addEventListener("change", (ev) => {
  if (ev.target.id === "pipeline-mode") {
    setPipelineMode(ev.target.checked);
    return formChanged();
  }
  if (ev.target.id === "pipeline-name") {
    pipeline.name = ev.target.value.trim();
    return formChanged();
  }
  const kind = kindOfSelect(ev.target.name);
  if (kind) switchEntry(kind, ev.target.value);
  if (ev.target.name === "config.model.name") applyRecommended(ev.target.value.trim());
  if (ev.target.name === "config.model.from_run") {
    const m = registryModels.find((x) => x.run_id === Number(ev.target.value));
    if (m) $("[name='config.model.name']").value = baseOf(m);
  }
  if (pipeline.on && (kind === "kind" || kind === "algorithm")) {
    saveStage();
    renderStageTabs();
  }
  // An edited field keeps its mark and message until the estimate of this edit says whether the
  // server still refuses it (refreshEstimate): taking the class alone off left the message there
  // for good, and clearing both here moved the form under the user's next click.
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
  recommendedFor = null;
  render(structuredClone(presets.defaults));
});
init();
