// The run's log (GET /api/runs/{id}/log): what its training process printed, secrets redacted,
// bounded by the server (its first 256 KiB and last 768 KiB; a "cut" chunk marks the middle).
// The Logs tab reads on from the last chunk it has (`since`), every 2 s while it is open and the
// run is not over, so it follows a running run and picks up where it was after a reconnect or a
// closed laptop. Text goes in as text nodes: nothing printed is ever parsed as HTML. A carriage
// return acts as on a terminal (tqdm redraws its bar with them): what follows it writes over the
// line from its start, so a bar shows its last state, not every state run together.
import { errorText, get, qs } from "/static/api.js";
import { $, h } from "/static/util.js";

const POLL_MS = 2000;

/** ``text`` typed onto a terminal whose cursor is at ``col`` of the unfinished ``line``: the
 * lines it finishes (each ending in "\n") and the line and column it leaves. "\r\n" ends a line;
 * a lone "\r" returns to the line's start, and what follows overwrites it character by character
 * (a shorter redraw leaves the rest, as a terminal does). State carries over between chunks, so a
 * redraw split across two of them still lands on its line. */
export function typeOnto({ line, col }, text) {
  let done = "";
  for (const piece of text.split(/(\r?\n|\r)/)) {
    if (piece === "\n" || piece === "\r\n") {
      done += `${line}\n`;
      line = "";
      col = 0;
    } else if (piece === "\r") {
      col = 0;
    } else if (piece) {
      line = line.slice(0, col) + piece + line.slice(col + piece.length);
      col += piece.length;
    }
  }
  return { done, line, col };
}

/** Printed ``text`` as a terminal leaves it on screen. */
export const asOnTerminal = (text) => {
  const { done, line } = typeOnto({ line: "", col: 0 }, text);
  return done + line;
};

export function logView(runId, isFinished) {
  const pre = $("#run-log");
  const note = $("#log-note");
  const follow = $("#log-follow");
  let since = 0;
  let timer = null;
  let open = false;
  let busy = false;
  // The unfinished last line lives in its own text node, always the log's last: a carriage
  // return in a later chunk rewrites it in place.
  let terminal = { line: "", col: 0 };
  const current = document.createTextNode("");
  pre.append(current);

  function print(text) {
    const { done, ...rest } = typeOnto(terminal, text);
    terminal = rest;
    if (done) current.before(document.createTextNode(done));
    current.data = terminal.line;
  }

  function cutHere(text) {
    // the line the cut interrupts stays as it was; the marker, then a fresh line
    current.before(document.createTextNode(terminal.line), h("span.log-cut", {}, text));
    terminal = { line: "", col: 0 };
    current.data = "";
  }

  async function pull() {
    if (busy) return;
    busy = true;
    try {
      for (;;) {
        const page = await get(`/api/runs/${runId}/log${qs({ since, limit: 200 })}`);
        if (!page.chunks.length) break;
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        for (const c of page.chunks) (c.cut ? cutHere : print)(c.text);
        since = page.next;
        if (follow.checked && atBottom) pre.scrollTop = pre.scrollHeight;
        if (page.chunks.length < 200) break;
      }
      note.textContent = pre.textContent ? "" : isFinished() ? "This run printed nothing." : "Nothing printed yet.";
    } catch (err) {
      note.textContent = `Could not read the log: ${errorText(err)} (retrying)`;
    } finally {
      busy = false;
    }
  }

  function schedule() {
    clearTimeout(timer);
    if (!open) return;
    timer = setTimeout(async () => {
      await pull();
      if (!isFinished()) schedule();
      else pull(); // the lines printed before the end
    }, POLL_MS);
  }

  return {
    show() {
      open = true;
      pull().then(() => {
        if (follow.checked) pre.scrollTop = pre.scrollHeight;
        if (!isFinished()) schedule();
      });
    },
    hide() {
      open = false;
      clearTimeout(timer);
    },
  };
}

/** Under a failed run's error: the last lines its process printed. */
export async function logTail(runId, into) {
  try {
    const page = await get(`/api/runs/${runId}/log${qs({ tail: 25 })}`);
    const lines = page.lines || [];
    into.replaceChildren(
      ...(lines.length
        ? [
            h("div.small.muted", {}, "The last lines it printed (Logs tab: all of it):"),
            h("pre.log-tail", {}, asOnTerminal(lines.join("\n"))),
          ]
        : []),
    );
  } catch {
    into.replaceChildren(); // the error itself is still shown
  }
}
