// Studies list (/studies): every study with its status, arms, seeds and baseline, newest first;
// a row links to its study page (the verdict).
import { errorText, get, qs } from "/static/api.js";
import { $, countsText, fmtTime, h, stepsBar, toast } from "/static/util.js";

const HEAD = ["id", "name", "status", "progress", "arms", "seeds", "baseline", "owner", "created"];

/** "1,290/4,500" over "2 running · 3 succeeded · 10 pending": steps done against the planned
 * work and its runs per status, its pending runs too (`progress`, as the study page and the runs
 * list's study row show it). */
function progressCell(p) {
  if (!p) return "–";
  return [
    stepsBar(p.steps, p.total_steps, `steps done / planned (${p.started} of ${p.runs} runs started, ${p.ended} ended)`),
    h("div.muted.small.study-counts", {}, countsText(p.counts)),
  ];
}

async function load() {
  let data;
  try {
    data = await get(`/api/studies${qs({ limit: 200 })}`);
  } catch (err) {
    toast(`Could not list studies: ${errorText(err)}`, "error");
    return;
  }
  const rows = data.items.map((s) =>
    h(
      "tr",
      { "data-id": s.id },
      h("td.num", {}, h("a", { href: `/studies/${s.id}` }, `#${s.id}`)),
      h("td", {}, h("a", { href: `/studies/${s.id}` }, s.name)),
      h("td", {}, h("span.badge", {}, s.status)),
      h("td", {}, progressCell(s.progress)),
      h("td", {}, s.search ? h("span.muted", {}, "search") : s.arms.join(", ")),
      h("td", {}, s.seeds.join(", ")),
      h("td", {}, s.baseline || "–"),
      h("td", {}, s.owner || "–"),
      h("td", {}, fmtTime(s.created_at)),
    ),
  );
  $("#studies-table").replaceChildren(
    h("thead", {}, h("tr", {}, ...HEAD.map((c) => h("th", {}, c)))),
    h(
      "tbody",
      {},
      ...(rows.length
        ? rows
        : [h("tr", {}, h("td.muted", { colspan: HEAD.length }, "No study yet: start one with “+ New study”."))]),
    ),
  );
  $("#studies-sub").textContent = `${data.total} stud${data.total === 1 ? "y" : "ies"}`;
}

load();
