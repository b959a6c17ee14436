// The run page's Alerts tab: the rules that watch this run (its own, its study's, its owner's
// "every run" rules; GET /api/alerts?run_id=), what they fired for it and whether the webhook
// took it (GET /api/alerts/firings?run_id=, read again every few seconds while the tab shows),
// and a form that adds a rule for this run (POST /api/alerts; a 422 is shown at its field).
// A webhook URL is a secret: the server never sends it back, only its scheme and host.
import { del, errorText, get, post } from "/static/api.js";
import { EVAL_ACCURACY } from "/static/catalogue.js";
import { fmtNum, h, toast } from "/static/util.js";

const REFRESH_MS = 3000;
const FIELDS = ["event", "metric", "comparison", "threshold", "stall_minutes", "webhook", "format", "name"];

function describe(rule) {
  if (rule.event === "metric") {
    return rule.comparison === "nonfinite"
      ? `${rule.metric} not finite`
      : `${rule.metric} ${rule.comparison} ${fmtNum(rule.threshold)}`;
  }
  if (rule.event === "stalled") return `stalled for ${fmtNum(rule.stall_minutes)} min`;
  return rule.event;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

export function alertsView(root, runId) {
  const signedIn = Boolean(window.CONSPO_TOKEN);
  const rulesBody = h("tbody", { id: "alert-rules" });
  const firingsBody = h("tbody", { id: "alert-firings" });
  const note = h("span.muted.small", { id: "alerts-note" });
  const field = (name, label, input, help = "") =>
    h(
      "label.block.field",
      { dataset: { field: name } },
      label,
      input,
      help ? h("span.help.small.muted", {}, help) : "",
      h("span.err.error-text"),
    );
  const inputs = {
    event: h(
      "select",
      { name: "alert.event", "aria-label": "event" },
      h("option", { value: "failed" }, "the run fails"),
      h("option", { value: "finished" }, "the run ends (succeeded, failed or cancelled)"),
      h("option", { value: "stalled" }, "the run stalls (no step for a while)"),
      h("option", { value: "metric" }, "a metric crosses a line"),
    ),
    metric: h("input", { name: "alert.metric", type: "text", placeholder: EVAL_ACCURACY, "aria-label": "metric" }),
    comparison: h(
      "select",
      { name: "alert.comparison", "aria-label": "comparison" },
      h("option", { value: "below" }, "below"),
      h("option", { value: "above" }, "above"),
      h("option", { value: "nonfinite" }, "not finite (NaN, ±Inf)"),
    ),
    threshold: h("input", { name: "alert.threshold", type: "number", step: "any", "aria-label": "threshold" }),
    stall_minutes: h("input", {
      name: "alert.stall_minutes",
      type: "number",
      min: "1",
      step: "any",
      placeholder: "10",
      "aria-label": "minutes without a step",
    }),
    webhook: h("input", {
      name: "alert.webhook",
      type: "url",
      autocomplete: "off",
      placeholder: "https://hooks.slack.com/services/…",
      "aria-label": "webhook URL",
    }),
    format: h(
      "select",
      { name: "alert.format", "aria-label": "format" },
      h("option", { value: "slack" }, "Slack"),
      h("option", { value: "discord" }, "Discord"),
      h("option", { value: "json" }, "JSON (every field)"),
    ),
    name: h("input", {
      name: "alert.name",
      type: "text",
      maxlength: 200,
      placeholder: "optional",
      "aria-label": "rule name",
    }),
  };
  const rows = {
    metric: field("metric", "Metric", inputs.metric),
    comparison: field("comparison", "When it is", inputs.comparison),
    threshold: field("threshold", "Line", inputs.threshold),
    stall_minutes: field("stall_minutes", "Minutes without a step", inputs.stall_minutes),
  };
  const error = h("span.error-text", { id: "alert-error", role: "alert" });
  const form = h(
    "form.alert-form",
    { id: "alert-form" },
    h("h3", {}, "Add an alert for this run"),
    field("event", "Tell me when", inputs.event),
    rows.metric,
    rows.comparison,
    rows.threshold,
    rows.stall_minutes,
    field(
      "webhook",
      "Webhook URL",
      inputs.webhook,
      "Slack or Discord incoming webhook, or any URL that takes a JSON POST. Kept secret: only its host is shown again.",
    ),
    field("format", "Format", inputs.format),
    field("name", "Name", inputs.name),
    h(
      "div.notes-actions",
      {},
      h("button.btn.btn-sm.btn-primary", { type: "submit", id: "alert-add" }, "Add alert"),
      error,
    ),
  );

  function showFields() {
    const ev = inputs.event.value;
    rows.metric.hidden = rows.comparison.hidden = ev !== "metric";
    rows.threshold.hidden = ev !== "metric" || inputs.comparison.value === "nonfinite";
    rows.stall_minutes.hidden = ev !== "stalled";
  }
  inputs.event.addEventListener("change", showFields);
  inputs.comparison.addEventListener("change", showFields);
  showFields();

  function clearErrors() {
    error.textContent = "";
    for (const el of form.querySelectorAll(".field")) {
      el.classList.remove("has-error");
      el.querySelector(".err").textContent = "";
    }
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    const ev_ = inputs.event.value;
    const body = {
      run_id: Number(runId),
      event: ev_,
      webhook: inputs.webhook.value.trim(),
      format: inputs.format.value,
    };
    if (inputs.name.value.trim()) body.name = inputs.name.value.trim();
    if (ev_ === "metric") {
      body.metric = inputs.metric.value.trim() || null;
      body.comparison = inputs.comparison.value;
      if (body.comparison !== "nonfinite")
        body.threshold = inputs.threshold.value === "" ? null : Number(inputs.threshold.value);
    }
    if (ev_ === "stalled" && inputs.stall_minutes.value !== "") body.stall_minutes = Number(inputs.stall_minutes.value);
    try {
      await post("/api/alerts", body);
      inputs.webhook.value = "";
      toast("Alert added", "ok");
      await refresh();
    } catch (err) {
      const marked = showFieldErrors(err);
      if (!marked) error.textContent = errorText(err);
    }
  });

  function showFieldErrors(err) {
    if (!Array.isArray(err.detail)) return false;
    let marked = 0;
    for (const e of err.detail) {
      const name = (e.loc || [])[1];
      const el = FIELDS.includes(name) ? form.querySelector(`[data-field="${name}"]`) : null;
      if (!el) continue;
      el.classList.add("has-error");
      el.querySelector(".err").textContent = e.msg;
      marked += 1;
    }
    return marked === err.detail.length;
  }

  function ruleRow(rule) {
    const test = h(
      "button.btn.btn-sm",
      { type: "button", title: "Call its webhook once now with a test message" },
      "Test",
    );
    const remove = h("button.btn.btn-sm.btn-danger", { type: "button" }, "Delete");
    test.addEventListener("click", async () => {
      try {
        const out = await post(`/api/alerts/${rule.id}/test`);
        toast(
          out.delivered ? "The webhook took the test message" : `Not delivered: ${out.error}`,
          out.delivered ? "ok" : "error",
        );
      } catch (err) {
        toast(`Test failed: ${errorText(err)}`, "error");
      }
    });
    remove.addEventListener("click", async () => {
      if (!confirm(`Delete alert #${rule.id}?`)) return;
      try {
        await del(`/api/alerts/${rule.id}`);
        await refresh();
      } catch (err) {
        toast(`Delete failed: ${errorText(err)}`, "error");
      }
    });
    return h(
      "tr",
      { dataset: { rule: rule.id } },
      h("td", {}, `#${rule.id}`, rule.name ? ` ${rule.name}` : ""),
      h("td", {}, describe(rule)),
      h("td", {}, rule.scope),
      h("td.mono", {}, rule.webhook, h("span.muted", {}, ` (${rule.format})`)),
      h("td.num", {}, String(rule.fired)),
      h("td", {}, test, " ", remove),
    );
  }

  function firingRow(f) {
    let state = f.state;
    if (f.state === "pending" && f.attempts) state = `retrying (${f.attempts} tried)`;
    if (f.state === "delivered") state = `delivered ${when(f.delivered_at)}`;
    return h(
      "tr",
      { dataset: { firing: f.id, state: f.state } },
      h("td", {}, when(f.created_at)),
      h("td", {}, `#${f.rule_id}`, f.rule_name ? ` ${f.rule_name}` : ""),
      h("td.alert-message", {}, f.message),
      h("td", { class: `alert-${f.state}` }, state, f.last_error ? h("div.small.muted", {}, f.last_error) : ""),
    );
  }

  async function refresh() {
    if (!signedIn) return;
    try {
      const [rules, fired] = await Promise.all([
        get(`/api/alerts?run_id=${runId}`),
        get(`/api/alerts/firings?run_id=${runId}`),
      ]);
      rulesBody.replaceChildren(
        ...(rules.rules.length
          ? rules.rules.map(ruleRow)
          : [h("tr", {}, h("td.muted", { colspan: 6 }, "No alert watches this run."))]),
      );
      firingsBody.replaceChildren(
        ...(fired.firings.length
          ? fired.firings.map(firingRow)
          : [h("tr", {}, h("td.muted", { colspan: 4 }, "Nothing fired yet."))]),
      );
      note.textContent = "";
    } catch (err) {
      note.textContent = `Could not read the alerts: ${errorText(err)} (retrying)`;
    }
  }

  const table = (id, heads, body) =>
    h("table.grid", { id }, h("thead", {}, h("tr", {}, ...heads.map((t) => h("th", {}, t)))), body);
  if (!signedIn) {
    root.replaceChildren(
      h("p.muted", {}, "Alerts belong to a user: open this page with an API token to see and set them."),
    );
    return { show() {}, hide() {} };
  }
  root.replaceChildren(
    h("div.toolbar", {}, h("h3", {}, "Alert rules watching this run"), note),
    table("alert-rules-table", ["rule", "when", "scope", "webhook", "fired", ""], rulesBody),
    h("h3", {}, "Fired for this run"),
    table("alert-firings-table", ["when", "rule", "what", "delivery"], firingsBody),
    form,
  );
  let timer = null;
  return {
    show() {
      refresh();
      clearInterval(timer);
      timer = setInterval(refresh, REFRESH_MS);
    },
    hide() {
      clearInterval(timer);
      timer = null;
    },
  };
}
