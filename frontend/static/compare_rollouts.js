// Rollouts side by side (/compare/rollouts?runs=1,2&step=N&disagree=1): several runs' sampled
// rollouts at one step from GET /api/compare/rollouts, one block per prompt — the prompt once,
// then a column per run with its group of that prompt: each rollout's reward (correct or not),
// score, length and answer, and the group's mean reward and score gap. The API pairs groups by
// the prompt's text, not their number, and names the runs that lack a prompt; the page draws
// what it says. Every prompt and answer is model or dataset text, so hostile: h() makes each a
// text node, never HTML.
import { ApiError, errorText, get, qs } from "/static/api.js";
import { $, color, fmtNum, h, toast } from "/static/util.js";

const FOLD_CHARS = 600; // an answer longer than this is folded to its first lines
const url = new URLSearchParams(location.search);
const runIds = (url.get("runs") || "")
  .split(",")
  .map((s) => s.trim())
  .filter(Boolean);
const S = {
  step: url.has("step") ? Number(url.get("step")) : null,
  disagree: url.get("disagree") === "1",
  body: null,
};

function syncUrl() {
  const q = qs({ runs: runIds.join(","), step: S.step ?? undefined, disagree: S.disagree ? "1" : undefined });
  history.replaceState(null, "", `${location.pathname}${q}`);
}

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

function runTitle(run) {
  const what = [run.arm || run.algorithm, `seed ${run.seed}`].filter(Boolean).join(" · ");
  return `#${run.id} ${run.name} (${what})`;
}

/** A text shown whole when short; folded to its first FOLD_CHARS characters with a button
 * that unfolds it when long. */
function foldedText(text, cls) {
  if (text.length <= FOLD_CHARS) return h(`pre.${cls}`, {}, text);
  const pre = h(`pre.${cls}.folded`, {}, `${text.slice(0, FOLD_CHARS)}…`);
  const more = `show all ${text.length.toLocaleString()} characters`;
  const button = h("button.btn.btn-sm.xr-unfold", {
    type: "button",
    onclick: () => {
      const folded = pre.classList.toggle("folded");
      pre.textContent = folded ? `${text.slice(0, FOLD_CHARS)}…` : text;
      button.textContent = folded ? more : "fold";
    },
  });
  button.textContent = more;
  return h("div", {}, pre, button);
}

/** An environment episode, compactly: the first observation, then each turn's action and the
 * environment's answer (or why the turn failed), folded under a line that sums it up. */
function episodeView(ep) {
  const outcome = ep.failure != null ? "failed" : ep.succeeded ? "won" : ep.truncated ? "cut" : "lost";
  const summary = `episode: ${plural(ep.turns.length, "turn")} · ${outcome} · total reward ${fmtNum(ep.total_reward)}`;
  return h(
    "details.xr-episode",
    {},
    h("summary", {}, summary),
    h("pre", {}, ep.first_observation),
    ...ep.turns.map((t, i) =>
      h(
        "div.xr-turn",
        {},
        h("div.muted.small", {}, `turn ${i + 1} · reward ${fmtNum(t.reward)}${t.done ? " · done" : ""}`),
        h("pre", {}, t.action),
        h(`pre${t.error ? ".xr-turn-error" : ".muted"}`, {}, t.error || t.observation),
      ),
    ),
  );
}

function rolloutView(r) {
  const kind = r.reward === null ? "unscored" : r.reward > 0 ? "pos" : "neg";
  const verdict = { pos: "✓ correct", neg: "✗ wrong", unscored: "no reward" }[kind];
  const meta = [
    `reward ${fmtNum(r.reward)}`,
    `score ${fmtNum(r.score)}`,
    `${r.length} tokens${r.truncated ? " (truncated)" : ""}`,
  ].join(" · ");
  return h(
    `div.xr-rollout.${kind}`,
    { dataset: { group: r.group, index: r.index } },
    h("div.xr-meta", {}, h("b", {}, verdict), ` #${r.index} · ${meta}`),
    r.episode
      ? episodeView(r.episode)
      : r.completion
        ? foldedText(r.completion, "xr-text")
        : h("div.empty-completion", {}, "(no answer stored)"),
    r.critique ? h("details.critique", {}, h("summary", {}, "judge's critique"), h("pre", {}, r.critique)) : null,
  );
}

function columnView(col, run, i, step) {
  const head = h(
    "div.xr-col-head",
    { style: `border-top-color:${color(i)}` },
    h("a", { href: `/runs/${run.id}` }, runTitle(run)),
  );
  if (!col.n)
    return h(
      "div.xr-col.xr-missing",
      { dataset: { run: run.id } },
      head,
      h("p.muted", {}, `no rollout of this prompt at step ${step}`),
    );
  const gap =
    col.score_gap === null ? "score gap – (needs rewarded and unrewarded)" : `score gap ${fmtNum(col.score_gap)}`;
  const stats = [
    `${col.groups.length === 1 ? "group" : "groups"} ${col.groups.join(", ")}`,
    `${col.rewarded}/${col.n} rewarded`,
    `mean reward ${fmtNum(col.mean_reward)}`,
    gap,
  ].join(" · ");
  return h(
    "div.xr-col",
    { dataset: { run: run.id, solved: String(col.solved) } },
    head,
    h("div.xr-stats.small", {}, stats),
    ...col.rollouts.map(rolloutView),
  );
}

function promptView(item, body) {
  const runs = new Map(body.runs.map((r, i) => [r.id, [r, i]]));
  const notes = [];
  if (item.disagree) notes.push(h("span.badge.xr-disagree", {}, "runs disagree"));
  if (item.missing.length)
    notes.push(
      h(
        "span.xr-partner",
        {},
        `no partner in ${item.missing.map((id) => runTitle(runs.get(id)[0])).join(", ")} at step ${body.step}`,
      ),
    );
  if (item.key === null) notes.push(h("span.muted", {}, "stored without its prompt: cannot be paired"));
  const columns = h(
    "div.xr-columns",
    { style: `grid-template-columns: repeat(${item.columns.length}, minmax(280px, 1fr))` },
    ...item.columns.map((col) => {
      const [run, i] = runs.get(col.run_id);
      return columnView(col, run, i, body.step);
    }),
  );
  return h(
    "section.panel.xr-prompt",
    { dataset: { key: item.key ?? "", disagree: String(item.disagree) } },
    h("div.xr-prompt-head", {}, h("h3", {}, "prompt"), ...notes),
    item.prompt ? foldedText(item.prompt, "xr-prompt-text") : h("p.muted", {}, "(no prompt stored)"),
    h("div.xr-scroll", { "data-scroll-x": "" }, columns),
  );
}

function render(body) {
  $("#xr-controls").hidden = false;
  const select = $("#xr-step");
  select.replaceChildren(...body.steps.map((s) => h("option", { value: s, selected: s === body.step }, `step ${s}`)));
  $("#xr-disagree").checked = S.disagree;
  const listed = body.steps.length < body.steps_in_common ? ` (${body.steps.length} of them listed)` : "";
  $("#xr-sub").textContent =
    `${plural(body.runs.length, "run")} · step ${body.step} · ${plural(body.steps_in_common, "step")} every run sampled${listed}`;
  $("#xr-counts").textContent =
    `${plural(body.prompts, "prompt")} at this step · ${body.paired} in every run · ${body.disagree} where the runs disagree`;
  $("#xr-runs").replaceChildren(
    ...body.runs.map((r, i) =>
      h(
        "span.xr-run",
        { style: `border-left-color:${color(i)}` },
        h("a", { href: `/runs/${r.id}` }, runTitle(r)),
        ` ${r.status} · ${plural(r.rollouts, "rollout")}, ${plural(r.prompts, "prompt")} at this step`,
        r.cut ? h("span.xr-partner", {}, " · only the first 4,096 rollouts of the step were read") : null,
      ),
    ),
  );
  const blocks = body.items.map((item) => promptView(item, body));
  if (!blocks.length)
    blocks.push(
      h(
        "div.panel.empty",
        {},
        S.disagree ? `The runs agree on every prompt at step ${body.step}.` : `No rollouts at step ${body.step}.`,
      ),
    );
  if (body.left_out)
    blocks.push(
      h(
        "p.muted.xr-left-out",
        {},
        `${plural(body.left_out, "more prompt")} not shown: an answer holds at most ${body.limits.rows.toLocaleString()} rollouts (whole prompts). Filter by disagreement or pick fewer runs to see others.`,
      ),
    );
  $("#xr-prompts").replaceChildren(...blocks);
}

function showProblem(text) {
  $("#xr-prompts").replaceChildren(h("div.panel.empty", {}, text));
}

async function load() {
  syncUrl();
  try {
    S.body = await get(
      `/api/compare/rollouts${qs({ runs: runIds.join(","), step: S.step ?? undefined, disagree: S.disagree || undefined })}`,
    );
    S.step = S.body.step;
    syncUrl();
    render(S.body);
  } catch (err) {
    const atStep = err instanceof ApiError && err.status === 422 && err.detail?.[0]?.loc?.[1] === "step";
    if (atStep && S.step !== null) {
      toast(errorText(err), "error"); // a step they do not share: show the latest they do
      S.step = null;
      return load();
    }
    showProblem(`Could not load the rollouts: ${errorText(err)}`);
  }
}

$("#xr-step").addEventListener("change", (ev) => {
  S.step = Number(ev.target.value);
  load();
});
$("#xr-disagree").addEventListener("change", (ev) => {
  S.disagree = ev.target.checked;
  load();
});
$("#xr-back").href = `/compare${qs({ runs: runIds.join(",") })}`;

if (runIds.length) load();
else
  $("#xr-prompts").replaceChildren(
    h(
      "div.panel.empty",
      {},
      "No runs chosen. Open this page from the compare page (",
      h("a", { href: "/compare" }, "Rollouts side by side"),
      ") or a study's seed, or add ?runs=1,2 to its address.",
    ),
  );
