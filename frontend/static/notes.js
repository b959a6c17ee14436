// A note (Markdown) and, for runs, the tags, shown and edited in place. PATCH `path` with
// {note} or {note, tags}; the server renders the note (note_html: Markdown with raw HTML
// escaped and link schemes checked, backend/markdown.py), which is the only HTML put into the
// page here — what the user typed is never parsed as HTML in the browser.
import { errorText, get, patch } from "/static/api.js";
import { h, toast } from "/static/util.js";

/**
 * Fill `root` with the notes panel. `path`: the resource (/api/runs/1); `withTags`: edit the
 * tags too; `onSaved(resource)`: the PATCH's answer. Returns `show(resource)`, which redraws the
 * panel from a resource (a run from the live stream carries its note but not its HTML: the HTML
 * is read again only when the note changed).
 */
export function noteEditor(root, { path, withTags = false, onSaved = () => {} }) {
  const body = h("div.note-body", { id: "note-body" });
  const edit = h("button.btn.btn-sm", { type: "button", id: "notes-edit" }, "Edit");
  const input = h("textarea", { id: "note-input", rows: 6, maxlength: 20000, "aria-label": "note (Markdown)" });
  const tags = h("input", { id: "tags-input", type: "text", "aria-label": "tags", placeholder: "best, baseline" });
  const error = h("span.error-text", { id: "notes-error", role: "alert" });
  const form = h(
    "form",
    { id: "notes-form", hidden: true },
    h("label.block", {}, "Note (Markdown; HTML is shown as text)", input),
    withTags ? h("label.block", {}, "Tags (comma-separated)", tags) : "",
    h(
      "div.notes-actions",
      {},
      h("button.btn.btn-sm.btn-primary", { type: "submit", id: "notes-save" }, "Save"),
      h("button.btn.btn-sm", { type: "button", id: "notes-cancel", onclick: () => close() }, "Cancel"),
      error,
    ),
  );
  root.replaceChildren(h("div.notes-head", {}, h("h3", {}, "Notes"), edit), body, form);
  let current = null;
  let shownNote = null;

  function close() {
    form.hidden = true;
    body.hidden = false;
    edit.hidden = false;
    error.textContent = "";
  }

  async function show(resource) {
    current = resource;
    const note = resource.note || "";
    if (note === shownNote && resource.note_html === undefined) return;
    let html = resource.note_html;
    if (html === undefined || html === null) html = note ? (await get(path)).note_html || "" : "";
    shownNote = note;
    if (!note) body.replaceChildren(h("span.muted", {}, "No note yet."));
    else body.innerHTML = html; // server-rendered, raw HTML escaped (see the top of this file)
  }

  edit.addEventListener("click", () => {
    input.value = current?.note || "";
    tags.value = (current?.tags || []).join(", ");
    form.hidden = false;
    body.hidden = true;
    edit.hidden = true;
    input.focus();
  });

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const change = { note: input.value };
    if (withTags) {
      change.tags = tags.value
        .split(",")
        .map((t) => t.trim())
        .filter(Boolean);
    }
    try {
      const saved = await patch(path, change);
      close();
      await show(saved);
      onSaved(saved);
      toast("Saved", "ok");
    } catch (err) {
      error.textContent = errorText(err); // names the field, e.g. "body.tags.1: …"
    }
  });
  return show;
}

/** The first line of a note, for lists (plain text). */
export function noteLine(note) {
  const line = (note || "")
    .split("\n")
    .map((l) => l.replace(/^#+\s*/, "").trim())
    .find(Boolean);
  return line ? (line.length > 120 ? `${line.slice(0, 119)}…` : line) : "";
}
