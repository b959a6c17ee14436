// The study page (/studies/{id}): renders GET /api/studies/{id} with study_render.js and
// refreshes it every few seconds while the study is active (zoom is kept by re-rendering only
// when something changed).
import { ApiError, errorText, get } from "/static/api.js";
import { noteEditor } from "/static/notes.js";
import { renderStudy } from "/static/study_render.js";
import { h, toast } from "/static/util.js";

const root = document.getElementById("study");
const studyId = Number(root.dataset.studyId);
let last = "";
// Outside the re-rendered root: a refresh never loses a note being typed.
const showNote = noteEditor(document.getElementById("study-notes"), { path: `/api/studies/${studyId}` });

async function refresh() {
  try {
    const view = await get(`/api/studies/${studyId}`);
    const text = JSON.stringify(view);
    if (text !== last) {
      last = text;
      renderStudy(view, root, window.Plotly);
      showNote(view);
    }
    if (view.status === "active") setTimeout(refresh, 3000);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      // deleted (or never was): say so once, not "loading…" for ever
      root.replaceChildren(
        h("div.panel.empty", {}, `Study ${studyId} not found. `, h("a", { href: "/studies" }, "All studies")),
      );
      return;
    }
    toast(errorText(err), "error");
    setTimeout(refresh, 10000);
  }
}

refresh();
