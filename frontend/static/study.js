// The study page (/studies/{id}): renders GET /api/studies/{id} with study_render.js and
// refreshes it every few seconds while the study is active or any of its runs still runs (zoom
// is kept by re-rendering only when something changed). "Cancel study" is
// POST /api/studies/{id}/cancel.
import { ApiError, errorText, get, post } from "/static/api.js";
import { noteEditor } from "/static/notes.js";
import { renderStudy } from "/static/study_render.js";
import { $, h, toast } from "/static/util.js";

const root = document.getElementById("study");
const studyId = Number(root.dataset.studyId);
let last = "";
// Outside the re-rendered root: a refresh never loses a note being typed.
const showNote = noteEditor(document.getElementById("study-notes"), { path: `/api/studies/${studyId}` });

let timer = null;

function show(view) {
  const text = JSON.stringify(view);
  if (text !== last) {
    last = text;
    renderStudy(view, root, window.Plotly);
    showNote(view);
  }
  $("#study-cancel").hidden = view.status !== "active";
}

/** A cancelled study's running runs take seconds to stop: follow them until they have. */
function moving(view) {
  return view.status === "active" || Boolean(view.counts.queued || view.counts.running);
}

async function refresh() {
  clearTimeout(timer);
  try {
    const view = await get(`/api/studies/${studyId}`);
    show(view);
    if (moving(view)) timer = setTimeout(refresh, 3000);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      // deleted (or never was): say so once, not "loading…" for ever
      root.replaceChildren(
        h("div.panel.empty", {}, `Study ${studyId} not found. `, h("a", { href: "/studies" }, "All studies")),
      );
      return;
    }
    toast(errorText(err), "error");
    timer = setTimeout(refresh, 10000);
  }
}

$("#study-cancel").addEventListener("click", async () => {
  if (!confirm("Cancel this study? Its pending runs are dropped and its queued and running runs cancelled.")) return;
  try {
    await post(`/api/studies/${studyId}/cancel`);
    toast(`Study ${studyId} cancelled`);
  } catch (err) {
    toast(errorText(err), "error");
  }
  refresh();
});

refresh();
