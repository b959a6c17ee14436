// The compare page's tables and sidebar: the per-group summary, the config diff, the run and
// metric pickers and the baseline-group select.
import { helpOf } from "/static/catalogue.js";
import { baseGroup, diffKey, groups, lastMean, runColor, runName, S, SUMMARY_LAST_N } from "/static/compare_state.js";
import { mean, tHalfWidth } from "/static/series.js";
import { $, color, flatten, fmtNum, fmtValue, h, statusBadge } from "/static/util.js";

/** Per group and metric: the mean over runs of each run's last-N mean, its 95% t CI, and n. */
export function renderGroupSummary() {
  const table = $("#group-summary");
  if (!table) return;
  const grouped = groups() || new Map(S.runIds.map((id) => [runName(S.runs.get(id) || { id }), [id]]));
  const rows = [];
  let gi = 0;
  for (const [label, ids] of grouped) {
    const c = groups() ? color(gi++) : runColor(ids[0]);
    for (const key of S.keys) {
      const values = ids.map((id) => lastMean(id, key)).filter((v) => v !== null);
      if (!values.length) continue;
      const n = values.length;
      const half = tHalfWidth(values);
      rows.push(
        h(
          "tr",
          {},
          h("td", {}, h("span.swatch", { style: `background:${c}` }), " ", label),
          h("td.mono", {}, key),
          h("td.num", {}, `${n} of ${ids.length}`),
          h("td.num", {}, fmtNum(mean(values))),
          h("td.num", {}, half === null ? "–" : `± ${fmtNum(half, 3)}`),
        ),
      );
    }
  }
  table.replaceChildren(
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ...["group", "metric", "n", `mean of last ${SUMMARY_LAST_N}`, "95% CI (t)"].map((t) => h("th", {}, t)),
      ),
    ),
    h("tbody", {}, ...rows),
  );
}

// ---- config diff ---------------------------------------------------------------------------------
export function renderConfigDiff() {
  const table = $("#config-diff");
  const runs = S.runIds.map((id) => S.runs.get(id)).filter(Boolean);
  if (!runs.length) {
    table.replaceChildren();
    return;
  }
  const rows = new Map();
  const add = (key, getter) => rows.set(key, runs.map(getter));
  // A kind that trains no algorithm (sft, distill, dpo) has none: shown as missing ("–"), not "null".
  for (const k of ["algorithm", "task", "model", "seed", "status"])
    add(k, (r) => (k === "status" ? r.status : (r[k] ?? undefined)));
  add("tags", (r) => r.tags || []);
  const flats = runs.map((r) => flatten(r.config || {}));
  const allKeys = new Set();
  for (const f of flats) for (const k of Object.keys(f)) allKeys.add(k);
  for (const k of [...allKeys].sort())
    if (!["algorithm", "seed", "task.name", "model.name"].includes(k))
      rows.set(
        k,
        flats.map((f) => f[k]),
      );
  const differs = (vals) => new Set(vals.map((v) => JSON.stringify(v ?? null))).size > 1;
  const shown = [...rows].filter(([, vals]) => S.showAll || differs(vals));
  const head = h(
    "tr",
    {},
    h("th", {}, "key"),
    runs.map((r) =>
      h(
        "th",
        {},
        h("span.swatch", { style: `background:${runColor(r.id)}` }),
        " ",
        h("a", { href: `/runs/${r.id}` }, runName(r)),
      ),
    ),
  );
  const body = shown.length
    ? shown.map(([k, vals]) => {
        const d = differs(vals);
        return h(
          "tr",
          { "data-key": k },
          h("td", {}, k),
          vals.map((v) =>
            h(
              `td${d ? ".differs" : ""}`,
              {},
              k === "status" ? statusBadge(runs[vals.indexOf(v)] || runs[0]) : fmtValue(v),
            ),
          ),
        );
      })
    : [
        h(
          "tr",
          {},
          h("td.muted", { colspan: runs.length + 1 }, "All configs are identical (tick “show all keys” to list them)."),
        ),
      ];
  // Last values of the charted metrics, for a quick numeric comparison.
  const lastRows = S.keys.map((k) =>
    h(
      "tr.summary-row",
      {},
      h("td", {}, `last ${k}`),
      runs.map((r) => {
        const s = S.data[r.id] && S.data[r.id][k];
        const v = s?.values.length ? s.values[s.values.length - 1] : r.summary ? r.summary[k] : undefined;
        return h("td", {}, fmtNum(v));
      }),
    ),
  );
  const sep = h("tr.sep", {}, h("td", { colspan: runs.length + 1 }, "last logged values"));
  table.replaceChildren(h("thead", {}, head), h("tbody", {}, body, lastRows.length ? sep : null, lastRows));
}

// ---- sidebar -------------------------------------------------------------------------------------
export function renderRunList() {
  const filter = $("#run-filter").value.trim().toLowerCase();
  const sorted = [...S.allRuns].sort((a, b) => S.runIds.includes(b.id) - S.runIds.includes(a.id) || b.id - a.id);
  const seen = new Set();
  const items = [];
  for (const r of sorted) {
    if (seen.has(r.id)) continue;
    seen.add(r.id);
    const label = `${runName(r)} ${r.algorithm || ""} ${(r.tags || []).join(" ")}`.toLowerCase();
    if (filter && !label.includes(filter) && !S.runIds.includes(r.id)) continue;
    const checked = S.runIds.includes(r.id);
    items.push(
      h(
        "label",
        { title: `${runName(r)} · ${r.algorithm} · ${r.status}` },
        h("input", { type: "checkbox", value: r.id, checked, "aria-label": `compare run ${r.id}` }),
        h("span.swatch", { style: `background:${checked ? runColor(r.id) : "#e5e7eb"}` }),
        h("span", {}, runName(r)),
        h("span.muted.small", {}, ` ${r.algorithm || ""}`),
      ),
    );
  }
  $("#run-list").replaceChildren(...(items.length ? items : [h("span.muted", {}, "no runs")]));
  // A/B pickers
  for (const [sel, idx] of [
    ["#diff-a", 0],
    ["#diff-b", 1],
  ]) {
    const el = $(sel);
    el.replaceChildren(
      h("option", { value: "" }, idx ? "B: –" : "A: –"),
      ...S.runIds.map((id) => h("option", { value: id }, `${idx ? "B" : "A"}: #${id}`)),
    );
    el.value = S.diff.length === 2 ? String(S.diff[idx]) : "";
  }
  renderBaseSelect();
  $("#diff-key").replaceChildren(...S.keys.map((k) => h("option", { value: k }, k)));
  $("#diff-key").value = diffKey();
  // group-by suggestions: top-level fields and config paths that differ between the chosen runs
  const runs = S.runIds.map((id) => S.runs.get(id)).filter(Boolean);
  const flats = runs.map((r) => flatten(r.config || {}));
  const keys = new Set();
  for (const f of flats) for (const k of Object.keys(f)) keys.add(k);
  const differing = [...keys].filter((k) => new Set(flats.map((f) => JSON.stringify(f[k] ?? null))).size > 1);
  $("#group-options").replaceChildren(
    ...["algorithm", "task", "model", ...differing.filter((k) => k !== "algorithm")].map((k) =>
      h("option", { value: k }),
    ),
  );
}

/** The baseline-group picker, shown while the runs are grouped. */
export function renderBaseSelect() {
  const grouped = groups();
  const labels = grouped ? [...grouped.keys()] : [];
  $("#diff-base-row").hidden = labels.length < 2;
  $("#diff-base").replaceChildren(...labels.map((l) => h("option", { value: l }, l)));
  if (labels.length) $("#diff-base").value = baseGroup(labels);
}

export function renderKeyList() {
  const filter = $("#key-filter").value.trim().toLowerCase();
  const keys = [...new Set([...S.keysAvailable, ...S.keys])].sort();
  $("#key-list").replaceChildren(
    ...keys
      .filter((k) => !filter || k.includes(filter) || S.keys.includes(k))
      .map((k) =>
        h(
          "label",
          { title: helpOf(k) || k },
          h("input", { type: "checkbox", value: k, checked: S.keys.includes(k), "aria-label": `metric ${k}` }),
          k,
        ),
      ),
  );
  $("#key-count").textContent = `${S.keys.length}/${keys.length}`;
}
