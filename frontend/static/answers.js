// The answers view (/answers?runs=1,2&step=last&source=held_out&show=all): the runs' held-out
// (or a benchmark's) problems at one evaluation each, paired by problem (GET /api/answers): who
// was right, each run's answer side by side, a problem's history across a run's evaluations
// (GET /api/runs/{id}/answers/history), and per pair of runs the problems each solved alone
// with McNemar's exact p. Every text is the model's or the dataset's: shown as text, never HTML.
import { errorText, get, qs } from "/static/api.js";
import { $, color, fmtNum, h } from "/static/util.js";

const PAGE = 50;
const params = new URLSearchParams(location.search);
const runIds = (params.get("runs") || "")
  .split(",")
  .map((s) => s.trim())
  .filter((s) => /^[1-9][0-9]*$/.test(s));
const state = {
  step: params.get("step") || "last",
  source: params.get("source") || "held_out",
  show: params.get("show") || "all",
  a: params.get("a"),
  b: params.get("b"),
  offset: 0,
  runs: [],
  problems: [],
};

const SHOWS = [
  ["all", "every problem"],
  ["disagree", "where the runs disagree"],
  ["regressed", "solved at a run's first evaluation, not now"],
  ["all_wrong", "no run solved"],
  ["all_right", "every run solved"],
];

function syncUrl() {
  const q = { runs: runIds.join(","), step: state.step, source: state.source, show: state.show };
  if (state.show === "only") Object.assign(q, { a: state.a, b: state.b });
  history.replaceState(null, "", `/answers${qs(q)}`);
}

function request(offset) {
  const q = {
    runs: runIds.join(","),
    step: state.step,
    source: state.source,
    show: state.show,
    text: "true",
    limit: PAGE,
    offset,
  };
  if (state.show === "only") Object.assign(q, { a: state.a, b: state.b });
  return get(`/api/answers${qs(q)}`);
}

function runName(run) {
  return `#${run.id} ${run.name}`;
}

function renderControls(out) {
  $("#ans-controls").hidden = false;
  const steps = new Set();
  for (const r of out.runs) for (const s of r.evaluations) steps.add(s);
  const common = [...steps].filter((s) => out.runs.every((r) => r.evaluations.includes(s))).sort((x, y) => x - y);
  const stepSel = $("#ans-step");
  stepSel.replaceChildren(
    h("option", { value: "last" }, "each run's last"),
    h("option", { value: "first" }, "each run's first"),
    ...common.map((s) => h("option", { value: String(s) }, `step ${s}`)),
  );
  stepSel.value = state.step;
  const sourceSel = $("#ans-source");
  const sources = new Set([state.source, ...out.sources]);
  sourceSel.replaceChildren(
    ...[...sources].map((s) => h("option", { value: s }, s === "held_out" ? "the held-out split" : s)),
  );
  sourceSel.value = state.source;
  const showSel = $("#ans-show");
  const options = SHOWS.map(([v, t]) => h("option", { value: v }, t));
  for (const a of out.runs) {
    for (const b of out.runs) {
      if (a.id !== b.id)
        options.push(h("option", { value: `only:${a.id}:${b.id}` }, `solved by #${a.id}, not by #${b.id}`));
    }
  }
  showSel.replaceChildren(...options);
  showSel.value = state.show === "only" ? `only:${state.a}:${state.b}` : state.show;
  $("#ans-counts").textContent = `${out.total} of ${out.problems_seen} problems`;
}

function renderSummary(out) {
  const box = $("#ans-summary");
  box.hidden = false;
  const runs = out.runs.map((r, i) =>
    h(
      "div.ans-run",
      { style: `border-left-color:${color(i)}` },
      h("a", { href: `/runs/${r.id}` }, runName(r)),
      ` — ${r.solved} of ${r.problems} solved at step ${r.step}`,
      h("span.muted.small", {}, ` (evaluations kept: ${r.evaluations.join(", ")})`),
    ),
  );
  const pairs = out.pairs.map((p) =>
    h(
      "div.ans-pair",
      { dataset: { pair: `${p.a}-${p.b}` } },
      h("a", { href: "#", onclick: (ev) => pick(ev, p.a, p.b) }, `#${p.a} alone: ${p.a_only}`),
      " · ",
      h("a", { href: "#", onclick: (ev) => pick(ev, p.b, p.a) }, `#${p.b} alone: ${p.b_only}`),
      ` · both: ${p.both} · neither: ${p.neither} · `,
      h(
        "span.mono",
        { title: "McNemar's exact test on the problems one run solved and the other did not" },
        `McNemar p = ${fmtNum(p.mcnemar_p, 3)}`,
      ),
    ),
  );
  box.replaceChildren(...runs, ...(pairs.length ? [h("h3", {}, "Pairs"), ...pairs] : []));
}

function pick(ev, a, b) {
  ev.preventDefault();
  Object.assign(state, { show: "only", a: String(a), b: String(b) });
  load();
}

function mark(answer) {
  if (!answer) return h("td.muted", { title: "not in this run's evaluation" }, "–");
  const k = answer.samples ? ` ${answer.samples_correct}/${answer.samples}` : "";
  return h(
    "td",
    {
      class: answer.solved ? "ans-ok" : "ans-bad",
      title: `s_θ ${answer.score === null ? "–" : fmtNum(answer.score)}; pass@k samples right${k}`,
    },
    answer.solved ? "✓" : "✗",
    h("span.muted.small", {}, k),
  );
}

function detailRow(problem, runs) {
  const cols = runs.map((r, i) => {
    const a = problem.answers[String(r.id)];
    return h(
      "div.ans-answer",
      { style: `border-top-color:${color(i)}` },
      h("div.small", {}, runName(r), a ? (a.solved ? " — right" : " — wrong") : " — not evaluated"),
      h("pre.ans-text", {}, a ? a.answer || "(empty answer)" : ""),
      h("div.ans-history.small.muted", { dataset: { run: r.id } }),
    );
  });
  const reference = Object.values(problem.answers)[0]?.reference ?? "";
  const historyBtn = h("button.btn.btn-sm", { type: "button" }, "History across evaluations");
  historyBtn.addEventListener("click", async () => {
    historyBtn.disabled = true;
    for (const r of runs) {
      const el = cols[runs.indexOf(r)].querySelector(".ans-history");
      try {
        const hist = await get(
          `/api/runs/${r.id}/answers/history${qs({ problem: problem.key, source: state.source })}`,
        );
        el.replaceChildren(
          ...hist.steps.map((s) =>
            h(
              "span",
              { class: s.solved ? "ans-ok" : "ans-bad", title: `step ${s.step}` },
              `${s.step}:${s.solved ? "✓" : "✗"} `,
            ),
          ),
        );
      } catch (err) {
        el.textContent = errorText(err);
      }
    }
  });
  return h(
    "tr.ans-detail",
    {},
    h(
      "td",
      { colspan: runs.length + 1 },
      h("div.small", {}, h("strong", {}, "Problem: "), h("pre.ans-text", {}, problem.prompt)),
      h("div.small", {}, h("strong", {}, "Reference: "), h("span.mono", {}, reference)),
      h("div.ans-answers", {}, ...cols),
      historyBtn,
    ),
  );
}

function problemRow(problem, runs) {
  const prompt = problem.prompt.length > 160 ? `${problem.prompt.slice(0, 159)}…` : problem.prompt;
  const row = h(
    "tr.ans-row",
    { dataset: { key: problem.key }, tabindex: 0, title: "Open the answers side by side" },
    h("td.ans-prompt", {}, prompt),
    ...runs.map((r) => mark(problem.answers[String(r.id)])),
  );
  let detail = null;
  const toggle = () => {
    if (detail) {
      detail.remove();
      detail = null;
    } else {
      detail = detailRow(problem, runs);
      row.after(detail);
    }
  };
  row.addEventListener("click", toggle);
  row.addEventListener("keydown", (ev) => ev.key === "Enter" && toggle());
  return row;
}

function renderTable(out, append) {
  $("#ans-head").replaceChildren(
    h(
      "tr",
      {},
      h("th", {}, "problem"),
      ...out.runs.map((r, i) => h("th", { style: `border-bottom:3px solid ${color(i)}` }, runName(r))),
    ),
  );
  const body = $("#ans-body");
  const rows = out.problems.map((p) => problemRow(p, out.runs));
  if (append) body.append(...rows);
  else
    body.replaceChildren(
      ...(rows.length ? rows : [h("tr", {}, h("td.muted", { colspan: out.runs.length + 1 }, "No problem matches."))]),
    );
  state.offset = out.offset + out.problems.length;
  $("#ans-more").hidden = state.offset >= out.total;
}

async function load(append = false) {
  syncUrl();
  try {
    const out = await request(append ? state.offset : 0);
    state.runs = out.runs;
    $("#ans-sub").textContent =
      `${out.runs.length} run${out.runs.length === 1 ? "" : "s"}, ${out.source === "held_out" ? "held-out split" : out.source}`;
    $("#ans-compare").href = `/compare${qs({ runs: runIds.join(",") })}`;
    renderControls(out);
    renderSummary(out);
    renderTable(out, append);
  } catch (err) {
    $("#ans-body").replaceChildren(
      h("tr", {}, h("td.error-text", { id: "ans-error" }, `Could not load the answers: ${errorText(err)}`)),
    );
  }
}

$("#ans-step").addEventListener("change", (ev) => {
  state.step = ev.target.value;
  load();
});
$("#ans-source").addEventListener("change", (ev) => {
  state.source = ev.target.value;
  load();
});
$("#ans-show").addEventListener("change", (ev) => {
  const [show, a, b] = ev.target.value.split(":");
  Object.assign(state, { show, a: a || null, b: b || null });
  load();
});
$("#ans-more").addEventListener("click", () => load(true));

if (runIds.length) load();
else
  $("#ans-body").replaceChildren(
    h("tr", {}, h("td.muted", {}, "Choose runs: open this page from the compare page, a study or a run.")),
  );
