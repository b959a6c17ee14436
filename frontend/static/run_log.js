// The run's log (GET /api/runs/{id}/log): what its training process printed, secrets redacted,
// bounded by the server (its first 256 KiB and last 768 KiB; a "cut" chunk marks the middle).
// The Logs tab reads on from the last chunk it has (`since`), every 2 s while it is open and the
// run is not over, so it follows a running run and picks up where it was after a reconnect or a
// closed laptop. Text goes in as text nodes: nothing printed is ever parsed as HTML.
import { errorText, get, qs } from "/static/api.js";
import { $, h } from "/static/util.js";

const POLL_MS = 2000;

export function logView(runId, isFinished) {
  const pre = $("#run-log");
  const note = $("#log-note");
  const follow = $("#log-follow");
  let since = 0;
  let timer = null;
  let open = false;
  let busy = false;

  async function pull() {
    if (busy) return;
    busy = true;
    try {
      for (;;) {
        const page = await get(`/api/runs/${runId}/log${qs({ since, limit: 200 })}`);
        if (!page.chunks.length) break;
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        for (const c of page.chunks) {
          pre.append(c.cut ? h("span.log-cut", {}, c.text) : document.createTextNode(c.text));
        }
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
            h("pre.log-tail", {}, lines.join("\n")),
          ]
        : []),
    );
  } catch {
    into.replaceChildren(); // the error itself is still shown
  }
}
