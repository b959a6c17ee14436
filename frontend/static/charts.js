// Plotly helpers shared by the run and compare pages. Charts are redrawn with Plotly.react and a
// stable layout.uirevision, so live updates never reset the user's zoom or legend choices.
import { ema, h } from "/static/util.js";

export const PLOT_CONFIG = {
  displaylogo: false,
  responsive: true,
  modeBarButtonsToRemove: ["lasso2d", "select2d", "autoScale2d"],
  toImageButtonOptions: { format: "png", scale: 2 },
};

export const X_TITLES = { step: "step", wall_time: "wall time (min)", rollouts: "rollouts seen" };

export function baseLayout({ uirevision = "keep", xTitle = "step", yTitle = "", extra = {} } = {}) {
  return {
    uirevision,
    margin: { l: 52, r: 14, t: 26, b: 36 },
    font: { family: "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size: 11, color: "#1c2430" },
    paper_bgcolor: "#fff",
    plot_bgcolor: "#fff",
    hovermode: "x unified",
    hoverlabel: { font: { size: 11 } },
    showlegend: true,
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom", font: { size: 10.5 }, bgcolor: "rgba(0,0,0,0)" },
    xaxis: {
      title: { text: xTitle, font: { size: 10.5 }, standoff: 4 },
      gridcolor: "#eef0f3",
      zeroline: false,
      automargin: true,
    },
    yaxis: {
      title: { text: yTitle, font: { size: 10.5 } },
      gridcolor: "#eef0f3",
      zerolinecolor: "#c9ced6",
      automargin: true,
    },
    ...extra,
  };
}

/** "sampled: N of M points" annotation(s) for series the server bucketed. */
export function sampledAnnotation(seriesList) {
  const sampled = seriesList.filter((s) => s?.sampled);
  if (!sampled.length) return [];
  const shown = Math.max(...sampled.map((s) => s.steps.length));
  const total = Math.max(...sampled.map((s) => s.total_points || s.steps.length));
  return [
    noteAnnotation(`sampled: ${shown.toLocaleString()} of ${total.toLocaleString()} points · band = bucket min–max`),
  ];
}

/** A small amber note drawn above the legend row (the layout makes room with margin.t). */
export function noteAnnotation(text) {
  return {
    xref: "paper",
    yref: "paper",
    x: 1,
    y: 1,
    xanchor: "right",
    yanchor: "bottom",
    yshift: 25,
    showarrow: false,
    text,
    font: { size: 10, color: "#b45309" },
    bgcolor: "#fffbeb",
  };
}

/** Give notes their own row above the legend. */
export function withNotes(layout, annotations) {
  layout.annotations = [...(layout.annotations || []), ...annotations];
  if (annotations.length) layout.margin = { ...layout.margin, t: 50 };
  return layout;
}

/** Hex colour → rgba string with alpha. */
export function alpha(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
}

/** Line traces for one series: raw (faint when smoothed), smoothed, and a min–max band when sampled. */
export function hasFinite(s) {
  return Boolean(s?.values?.some((v) => v !== null && Number.isFinite(v)));
}

export function lineTraces(
  xs,
  s,
  { name, color, smooth = 0, dash, mode = "lines", group, showBand = true, hoverName } = {},
) {
  const traces = [];
  const lg = group || name;
  if (showBand && s.sampled && s.min && s.max) {
    traces.push(...bandTraces(xs, s.min, s.max, { color, name: `${name} min–max`, group: lg }));
  }
  // Copies: Plotly keeps references to what it drew, and the page appends to its own arrays.
  xs = xs.slice();
  const values = s.values.slice();
  // A line through one point draws nothing (a metric evaluated once so far): mark it.
  if (mode === "lines" && values.filter((v) => v !== null && Number.isFinite(v)).length === 1) {
    mode = "lines+markers";
  }
  if (smooth > 0) {
    traces.push({
      x: xs,
      y: values,
      type: "scatter",
      mode: "lines",
      line: { width: 1, color: alpha(color, 0.25), dash },
      hoverinfo: "skip",
      showlegend: false,
      legendgroup: lg,
      name: `${name} raw`,
    });
    traces.push({
      x: xs,
      y: ema(values, smooth),
      type: "scatter",
      mode,
      line: { width: 1.8, color, dash },
      cliponaxis: false, // a marker at the first or last step is drawn whole, not cut in half
      name: hoverName || name,
      legendgroup: lg,
      connectgaps: true,
    });
  } else {
    traces.push({
      x: xs,
      y: values,
      type: "scatter",
      mode,
      line: { width: 1.6, color, dash },
      marker: { size: 5, color },
      cliponaxis: false,
      name: hoverName || name,
      legendgroup: lg,
      connectgaps: true,
    });
  }
  return traces;
}

/** A chart whose points all sit at one x (a single evaluation so far): Plotly would span it ±1
 * (a step axis from −1 to 1), so it gets a range centred on the point, `half` each side (half a
 * step on a step axis; else 5% of x, or 0.5 at 0). A chart the page already spans wider (every
 * panel's steps aligned) is left alone. */
export function padSingleX(layout, traces, half = null) {
  const include = layout.xaxis.autorangeoptions?.include;
  if (include && include[0] !== include[1]) return;
  const xs = new Set();
  for (const t of traces)
    (t.x || []).forEach((x, i) => {
      if (x !== null && Number.isFinite(x) && t.y?.[i] !== null && t.y?.[i] !== undefined) xs.add(x);
    });
  if (xs.size !== 1) return;
  const [x] = xs;
  const pad = half ?? (Math.abs(x) * 0.05 || 0.5);
  layout.xaxis.range = [x - pad, x + pad];
  layout.xaxis.autorange = false;
  delete layout.xaxis.autorangeoptions;
}

/**
 * A filled band between `lo` and `hi` (two traces: the upper edge, then the lower one filled up
 * to it). Shown in the legend only with `legend` (then clicking it hides the band).
 */
export function bandTraces(xs, lo, hi, { color, name, group, opacity = 0.15, legend = false }) {
  const edge = {
    type: "scatter",
    mode: "lines",
    line: { width: 0, color },
    hoverinfo: "skip",
    legendgroup: group || name,
  };
  return [
    { ...edge, x: xs.slice(), y: hi.slice(), showlegend: false, name: `${name} upper` },
    {
      ...edge,
      x: xs.slice(),
      y: lo.slice(),
      fill: "tonexty",
      fillcolor: alpha(color, opacity),
      showlegend: legend,
      name,
    },
  ];
}

/** A chart card: header with title and help, and a plot div. */
export function chartCard(id, title, help, { wide = false } = {}) {
  const plot = h("div.plot", { id: `plot-${id}` });
  const card = h(
    `div.chart-card${wide ? ".wide" : ""}`,
    { "data-chart": id },
    h("div.chart-head", {}, h("span.chart-title", {}, title), h("span.chart-help", {}, help || "")),
    plot,
  );
  return { card, plot };
}

export function react(plot, traces, layout) {
  integerSteps(layout, traces);
  return window.Plotly.react(plot, traces, layout, PLOT_CONFIG);
}

/** Steps are whole numbers: on a step axis spanning a dozen steps or fewer, Plotly's automatic
 * ticks fall on halves ("1.5"), so the ticks go one per step; wider spans get whole ticks. */
function integerSteps(layout, traces) {
  const axis = layout.xaxis;
  if (!axis || axis.title?.text !== X_TITLES.step || axis.dtick !== undefined) return;
  let lo = Infinity;
  let hi = -Infinity;
  for (const t of traces)
    for (const x of t.x || [])
      if (typeof x === "number" && Number.isFinite(x)) {
        lo = Math.min(lo, x);
        hi = Math.max(hi, x);
      }
  if (hi >= lo && hi - lo <= 12) {
    axis.tick0 = 0;
    axis.dtick = 1;
  }
}

/** The notes of a chart card ("constant 0 over 300 steps: …", "paired by seed: …"), as a line
 * of text above its plot: a long note as a Plotly annotation is clipped and runs into the
 * legend. No notes: the line is removed. */
export function setCardNote(card, plot, notes) {
  let el = card.querySelector(".chart-note");
  if (!notes.length) {
    el?.remove();
    return;
  }
  if (!el) {
    el = h("div.chart-note");
    plot.before(el);
  }
  el.textContent = notes.join(" · ");
}
