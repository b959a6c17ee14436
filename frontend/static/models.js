// The models page (/models): the model registry, GET /api/models (every succeeded run with a
// checkpoint on disk), one row per model: its run, kind, lineage back to the base model, its last
// and best checkpoints and its last eval. "Export" is POST /api/models/{run}/export (the path of
// the Hugging Face directory is shown in the row, and under it its tar's size and SHA-256);
// "Download" exports it the same way, then follows its download_url (GET /api/runs/{run}/export,
// a tar of that directory, with a ticket standing for the token) as a plain link, which the
// browser resumes with a Range by itself; "Train from this" opens the form with
// model.from_run prefilled. A model is its owner's until they share it: the owner (or an admin)
// ticks "shared" (PATCH /api/runs/{run} {model_shared}, its error said in the row); others see
// the flag, and the buttons the API's may_start_from / may_export forbid are disabled.
import { errorText, get, patch, post } from "/static/api.js";
import { EVAL_PROBLEMS, metricInfo } from "/static/catalogue.js";
import { $, fmtNum, h, toast } from "/static/util.js";

const label = (key) => metricInfo(key)?.label || key;

function lineage(model) {
  return model.lineage.map((l, i) =>
    h(
      "span",
      {},
      i ? " ← " : "",
      l.base ? h("span.mono", { title: "base model" }, l.base) : h("a", { href: `/runs/${l.run}` }, `#${l.run}`),
      l.base ? "" : h("span.muted.small", {}, ` (${l.step})`),
    ),
  );
}

function checkpoints(model) {
  return Object.entries(model.checkpoints).map(([which, c]) =>
    h(
      "div",
      { title: c.path },
      `${which}${c.step !== null ? ` · step ${c.step}` : ""}`,
      c.lora ? h("span.badge", { title: "LoRA adapters: merged into the base on export" }, "LoRA") : "",
    ),
  );
}

/** Its last evaluation: each score with its n (the held-out problems scored), pass@k with its k. */
function evals(model) {
  const n = model.eval[EVAL_PROBLEMS];
  const entries = Object.entries(model.eval).filter(([k]) => k !== EVAL_PROBLEMS);
  if (!entries.length) return h("span.muted", {}, "–");
  const name = (k) => label(k).replace(/@k$/, `@${model.pass_k}`); // "pass@k" → "pass@4"
  const of = n === undefined || n === null ? "" : ` (n = ${n})`;
  return entries.map(([k, v]) => h("div", { title: k }, `${name(k)} `, h("b.mono", {}, fmtNum(v, 4)), of));
}

/** Why a model's action is not the caller's to take (the API said may_… false). */
function refused(model, action) {
  if (!window.CONSPO_TOKEN) return `${action} needs an API token`;
  return `${action} needs its owner (${model.owner || "a deleted user"}) to share it, and every run it was trained from to be shared`;
}

/** The sharing flag: a checkbox for its owner or an admin, the flag as text for the others. */
function sharing(model) {
  const owner = h("div.muted.small", {}, `owner: ${model.owner || "a deleted user"}`);
  if (!model.may_share) {
    const text = model.model_shared ? "shared" : "not shared";
    return h("td", {}, h("span", { "data-shared": String(model.model_shared) }, text), owner);
  }
  const box = h("input", { type: "checkbox", "data-act": "share", checked: model.model_shared });
  const error = h("div.share-error.small", { role: "alert" });
  box.addEventListener("change", async () => {
    box.disabled = true;
    error.textContent = "";
    try {
      const run = await patch(`/api/runs/${model.run_id}`, { model_shared: box.checked });
      box.checked = run.model_shared;
    } catch (err) {
      box.checked = !box.checked; // the change did not happen
      error.textContent = errorText(err);
    } finally {
      box.disabled = false;
    }
  });
  const title = "Other users may start from this model and export what they train from it";
  return h("td", {}, h("label", { title }, box, " shared"), owner, error);
}

function trainFrom(model) {
  if (!model.may_start_from) {
    const title = refused(model, "Starting from it");
    return h("button.btn.btn-xs", { type: "button", "data-act": "train", disabled: true, title }, "Train from this");
  }
  return h(
    "a.btn.btn-xs",
    {
      href: `/runs/new?from_run=${model.run_id}`,
      "data-act": "train",
      title: "Open the form with model.from_run set to this run",
    },
    "Train from this",
  );
}

/** Follow ``url`` as a plain link: the browser streams what it answers to the disk (a fetch and
 * a Blob held the whole tar, 541 MB at SmolLM2, in the page's memory). The export's download_url
 * carries a short-lived ticket in place of the token, which a link cannot send. */
function follow(url) {
  const link = h("a", { href: url, download: "", hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
}

/** A path in the row: breaks anywhere (it has no spaces), unlike the words around it. */
const pathText = (text) => h("span.path.mono", {}, text);

function fmtBytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  const i = Math.min(units.length - 1, Math.floor(Math.log10(Math.max(n, 1)) / 3));
  return `${fmtNum(n / 1000 ** i, 3)} ${units[i]}`;
}

/** The export's tar: its size and SHA-256 (what `sha256sum` of the downloaded tar prints). */
function showSum(sum, res) {
  sum.replaceChildren(
    `tar ${fmtBytes(res.size)} · sha256 `,
    h("span.mono", { style: "overflow-wrap: anywhere" }, res.sha256),
  );
  sum.title = `${res.size} bytes; the download's Repr-Digest header and conspo-lab models download check it`;
}

function row(model) {
  const out = h("div.export-path.small");
  const sum = h("div.export-sum.small.muted", { style: "max-width: 320px" });
  const exportBtn = h(
    "button.btn.btn-xs",
    {
      type: "button",
      "data-act": "export",
      disabled: !model.may_export,
      title: model.may_export
        ? "Write the last checkpoint as a Hugging Face directory"
        : refused(model, "Exporting it (yours only)"),
    },
    "Export",
  );
  exportBtn.addEventListener("click", async () => {
    exportBtn.disabled = true;
    out.textContent = "exporting…";
    try {
      const res = await post(`/api/models/${model.run_id}/export`, { step: "last" });
      out.replaceChildren(pathText(res.path));
      out.title = "loads with AutoModelForCausalLM.from_pretrained(path)";
      showSum(sum, res);
    } catch (err) {
      out.textContent = "";
      toast(errorText(err), "error");
    } finally {
      exportBtn.disabled = false;
    }
  });
  const downloadBtn = h(
    "button.btn.btn-xs",
    {
      type: "button",
      "data-act": "download",
      disabled: !model.may_export,
      title: model.may_export
        ? "Download the last checkpoint as a Hugging Face directory in a tar (exported first)"
        : refused(model, "Downloading it (yours only)"),
    },
    "Download",
  );
  downloadBtn.addEventListener("click", async () => {
    downloadBtn.disabled = true;
    out.textContent = "exporting…";
    try {
      // Exported first: a LoRA merge may take longer than a GET may wait (a POST is not cut).
      const res = await post(`/api/models/${model.run_id}/export`, { step: "last" });
      follow(res.download_url);
      const name = `${res.path.split("/").pop()}.tar`; // the name the server gives the tar
      out.replaceChildren(pathText(name), " downloading: tar -xf it, then from_pretrained its directory");
      showSum(sum, res);
    } catch (err) {
      out.textContent = "";
      toast(errorText(err), "error");
    } finally {
      downloadBtn.disabled = false;
    }
  });
  const kind = model.label; // what it trained, as the API words it ("rl · grpo", "sft")
  return h(
    "tr",
    { "data-run": model.run_id },
    h(
      "td.name",
      {},
      h("a", { href: `/runs/${model.run_id}` }, model.name || `run ${model.run_id}`),
      h("span.muted.small", {}, ` #${model.run_id}`),
      model.pipeline_id
        ? h("a.small", { href: `/pipelines/${model.pipeline_id}` }, ` · pipeline ${model.pipeline_id}`)
        : "",
    ),
    h("td", {}, kind),
    h("td", {}, lineage(model)),
    h("td", {}, checkpoints(model)),
    h("td", {}, evals(model)),
    sharing(model),
    h("td", {}, h("div.actions", {}, exportBtn, downloadBtn, trainFrom(model)), out, sum),
  );
}

async function init() {
  try {
    const { models } = await get("/api/models");
    $("#models-body").replaceChildren(...models.map(row));
    $("#models-empty").hidden = models.length > 0;
  } catch (err) {
    $("#models-body").replaceChildren(
      h("tr", {}, h("td", { colspan: 7 }, `Could not load /api/models: ${errorText(err)}`)),
    );
  }
}

init();
