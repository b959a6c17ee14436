// A rollout that called tools, as its turns: the model's text, each call it wrote (the code
// between a tool's tags, monospace) and after a call the interpreter's output, labelled and
// drawn apart. The format is conspo.tools.base's, served by GET /api/presets (`tools`: each
// tool's tag; `tool_observation`: the text around an output). The text is the model's own
// output, so hostile: every piece becomes a text node (h() never parses it as HTML).
import { h } from "/static/util.js";

const escapeRe = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** The parser of a run's rollouts: `tools` the presets' tool entries a run may call
 * ({name, tag}), `observation` the presets' {before, after}. */
export function turnFormat(tools, observation) {
  const byTag = Object.fromEntries(tools.map((t) => [t.tag, t.name]));
  const tags = Object.keys(byTag).map(escapeRe).join("|");
  return {
    byTag,
    before: observation.before,
    // An output block, as conspo.tools.base.split_turns finds it (the shortest match).
    output: new RegExp(`${escapeRe(observation.before)}([\\s\\S]*?)${escapeRe(observation.after)}`, "g"),
    call: tags ? new RegExp(`<(${tags})>([\\s\\S]*?)</\\1>`, "g") : null,
  };
}

/** `text` as [{kind: "model" | "output", text, cut?}]: model text and the outputs between. An
 * output whose end was cut off (the stored text is capped) is the last piece, marked `cut`. */
export function splitTurns(text, format) {
  const pieces = [];
  let at = 0;
  for (const m of text.matchAll(format.output)) {
    if (m.index > at) pieces.push({ kind: "model", text: text.slice(at, m.index) });
    pieces.push({ kind: "output", text: m[1] });
    at = m.index + m[0].length;
  }
  const rest = text.slice(at);
  const open = rest.indexOf(format.before);
  if (open >= 0) {
    if (open > 0) pieces.push({ kind: "model", text: rest.slice(0, open) });
    pieces.push({ kind: "output", text: rest.slice(open + format.before.length), cut: true });
  } else if (rest || !pieces.length) pieces.push({ kind: "model", text: rest });
  return pieces;
}

/** A model piece as [{kind: "text" | "call", text, tool?}]: the calls written with a tool's tags. */
export function splitCalls(text, format) {
  if (!format.call) return [{ kind: "text", text }];
  const parts = [];
  let at = 0;
  for (const m of text.matchAll(format.call)) {
    if (m.index > at) parts.push({ kind: "text", text: text.slice(at, m.index) });
    parts.push({ kind: "call", tool: format.byTag[m[1]], text: m[2].replace(/^\n+|\n+$/g, "") });
    at = m.index + m[0].length;
  }
  if (at < text.length || !parts.length) parts.push({ kind: "text", text: text.slice(at) });
  return parts;
}

/** The turns of a rollout's text as elements: `div.turns` of `.turn-text`, `.turn-call` and
 * `.turn-output` blocks. A call ran when an output follows it (generation pauses right after
 * its closing tag); any other call is marked as not run (past tools.max_turns, or cut). */
export function turnsView(text, format) {
  const pieces = splitTurns(text, format);
  const blocks = [];
  pieces.forEach((piece, i) => {
    if (piece.kind === "output") {
      const label = piece.cut ? "interpreter output (cut: stored text ends here)" : "interpreter output";
      blocks.push(h("div.turn-output", {}, h("div.turn-label", {}, label), h("pre", {}, piece.text)));
      return;
    }
    const ranLast = pieces[i + 1]?.kind === "output";
    const parts = splitCalls(piece.text, format);
    parts.forEach((part, j) => {
      if (part.kind === "text") {
        if (part.text.trim()) blocks.push(h("div.turn-text", {}, part.text));
        return;
      }
      const ran = ranLast && parts.slice(j + 1).every((p) => p.kind === "text" && !p.text.trim());
      blocks.push(
        h(
          "div.turn-call",
          { "data-ran": ran ? "1" : "0" },
          h("div.turn-label", {}, `${part.tool} call${ran ? "" : " · not run"}`),
          h("pre", {}, part.text),
        ),
      );
    });
  });
  return h("div.turns", {}, blocks);
}
