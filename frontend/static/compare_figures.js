// The compare page's figures: one chart per metric (a line per run, or per group its mean with
// the 95% t interval of the mean, as the comparison report draws it), the A − B difference of
// two runs, and each group against the baseline group (paired by seed when the seeds match,
// Welch otherwise).
import { isDeterministic, isFraction, unitOf } from "/static/catalogue.js";
import { bandTraces, baseLayout, lineTraces, padSingleX, sampledAnnotation, X_TITLES } from "/static/charts.js";
import { aggregate, baseGroup, groups, runColor, runName, S, xAt, xFor } from "/static/compare_state.js";
import { interp, mean, t975, tHalfWidth, variance } from "/static/series.js";
import { color, ema, seedsWithData } from "/static/util.js";

/** seed → run id for a group whose runs all have distinct seeds; null otherwise. */
function seedMap(ids) {
  const out = new Map();
  for (const id of ids) {
    const seed = S.runs.get(id)?.seed;
    if (seed === null || seed === undefined || out.has(seed)) return null;
    out.set(seed, id);
  }
  return out;
}

/** How a group difference is computed: paired over the seeds both groups ran (at least 2 of
 * them), else unpaired (Welch). */
function pairing(idsA, idsB) {
  const a = seedMap(idsA);
  const b = seedMap(idsB);
  const common = a && b ? [...a.keys()].filter((seed) => b.has(seed)).sort((x, y) => x - y) : [];
  if (common.length >= 2) return { paired: true, pairs: common.map((seed) => [a.get(seed), b.get(seed)]) };
  return { paired: false };
}

/** B − A per step on the union of steps: paired, the mean of per-seed differences with a t band
 * over the seeds that reached the step; unpaired, the difference of means with a Welch band.
 * `n` is the seeds (pairs) contributing at each step, `full` how many there could be. */
function groupDifference(idsA, idsB, key) {
  const series = (id) => S.data[id]?.[key];
  const at = (id, st) => {
    const s = series(id);
    if (!s?.steps.length) return null;
    const v = interp(s.steps, s.values, st);
    return v === null || !Number.isFinite(v) ? null : v;
  };
  const stepSet = new Set();
  for (const id of [...idsA, ...idsB]) for (const st of series(id)?.steps || []) stepSet.add(st);
  const steps = [...stepSet].sort((x, y) => x - y);
  const how = pairing(idsA, idsB);
  const out = { paired: how.paired, xs: [], mean: [], lo: [], hi: [], n: [], full: 0, sampled: false };
  out.full = how.paired ? how.pairs.length : idsA.length + idsB.length;
  out.sampled = [...idsA, ...idsB].some((id) => series(id)?.sampled);
  const xOf = (ids, st) => {
    const xv = ids.map((id) => (series(id) ? xAt(id, series(id), st) : null)).filter((x) => x !== null);
    return xv.length ? mean(xv) : st;
  };
  for (const st of steps) {
    let m, half, n;
    if (how.paired) {
      const d = how.pairs
        .map(([a, b]) => [at(a, st), at(b, st)])
        .filter(([va, vb]) => va !== null && vb !== null)
        .map(([va, vb]) => vb - va);
      if (!d.length) continue;
      n = d.length;
      m = mean(d);
      half = tHalfWidth(d);
    } else {
      const va = idsA.map((id) => at(id, st)).filter((v) => v !== null);
      const vb = idsB.map((id) => at(id, st)).filter((v) => v !== null);
      if (!va.length || !vb.length) continue;
      n = va.length + vb.length;
      m = mean(vb) - mean(va);
      half = null;
      if (va.length > 1 && vb.length > 1) {
        const qa = variance(va) / va.length;
        const qb = variance(vb) / vb.length;
        const df = (qa + qb) ** 2 / (qa ** 2 / (va.length - 1) + qb ** 2 / (vb.length - 1) || 1);
        half = (t975(df) ?? 1.96) * Math.sqrt(qa + qb);
      }
    }
    out.xs.push(xOf([...idsA, ...idsB], st));
    out.mean.push(m);
    out.lo.push(half === null ? null : m - half);
    out.hi.push(half === null ? null : m + half);
    out.n.push(n);
  }
  return out.xs.length ? out : null;
}

export function groupDiffFigure(key) {
  const grouped = groups();
  if (!grouped || grouped.size < 2) return null;
  const labels = [...grouped.keys()];
  const base = baseGroup(labels);
  const smooth = isDeterministic(key) ? 0 : S.smooth;
  const traces = [];
  const used = [];
  const kinds = new Set();
  labels.forEach((label, gi) => {
    if (label === base) return;
    const diff = groupDifference(grouped.get(base), grouped.get(label), key);
    if (!diff) return;
    kinds.add(diff.paired ? "paired" : "welch");
    const c = color(gi);
    const name = `${label} − ${base}`;
    const m = ema(diff.mean, smooth);
    if (diff.lo.some((v) => v !== null))
      traces.push(
        ...bandTraces(diff.xs, ema(diff.lo, smooth), ema(diff.hi, smooth), {
          color: c,
          name: `${name} 95% CI`,
          group: name,
        }),
      );
    const unit = diff.paired ? "seeds" : "runs";
    const text = diff.n.map((k) => `n = ${k} of ${diff.full} ${unit}`);
    const full = m.map((v, i) => (diff.n[i] === diff.full ? v : null));
    const short = m.map((v, i) =>
      diff.n[i] < diff.full || diff.n[i - 1] < diff.full || diff.n[i + 1] < diff.full ? v : null,
    );
    const line = { x: diff.xs, text, type: "scatter", mode: "lines", legendgroup: name, customdata: diff.n };
    const hovertemplate = `%{y:+.4g} · %{text}<extra>${name}</extra>`;
    traces.push({
      ...line,
      y: full,
      line: { width: 2, color: c },
      name: `${name} (${diff.paired ? `paired, ${diff.full} seeds` : "unpaired"})`,
      meta: { pairing: diff.paired ? "paired" : "welch", raw: diff.mean, n: diff.n },
      hovertemplate,
    });
    if (short.some((v) => v !== null))
      traces.push({
        ...line,
        y: short,
        line: { width: 1.5, color: c, dash: "dot" },
        name: `${name}: fewer`,
        showlegend: false,
        hovertemplate,
      });
    used.push(...[...grouped.get(base), ...grouped.get(label)].map((id) => S.data[id]?.[key]).filter(Boolean));
  });
  if (!traces.length) return null;
  const layout = baseLayout({ uirevision: `${S.x}|gdiff|${base}`, xTitle: X_TITLES[S.x], yTitle: unitOf(key) });
  layout.shapes = [
    { type: "line", xref: "paper", x0: 0, x1: 1, y0: 0, y1: 0, line: { color: "#9ca3af", width: 1, dash: "dot" } },
  ];
  const said = [];
  if (kinds.has("paired")) said.push("paired by seed: mean of per-seed differences, band = 95% t CI over seeds");
  if (kinds.has("welch")) said.push("unpaired (seeds differ): difference of group means, band = 95% Welch CI");
  said.push("dotted: fewer seeds");
  if (smooth) said.push(`EMA smoothing ${smooth.toFixed(2)}`);
  const notes = [...sampledAnnotation(used).map((a) => a.text), ...said];
  return { traces, layout, notes, pairing: [...kinds].join(",") };
}

// ---- charts -------------------------------------------------------------------------------------
export function metricFigure(key) {
  const smooth = isDeterministic(key) ? 0 : S.smooth; // schedules are exact: never smoothed
  const traces = [];
  const used = [];
  const grouped = groups();
  if (grouped) {
    let gi = 0;
    for (const [label, ids] of grouped) {
      const agg = aggregate(ids, key);
      const c = color(gi++);
      if (!agg) continue;
      used.push(...agg.series);
      const m = ema(agg.mean, smooth);
      // A mean of fractions cannot leave [0, 1], nor can its interval (the report cuts it too).
      const cut = isFraction(key) ? (v) => (v === null ? null : Math.min(1, Math.max(0, v))) : (v) => v;
      const lo = ema(agg.lo, smooth).map(cut),
        hi = ema(agg.hi, smooth).map(cut);
      if (agg.lo.some((v) => v !== null)) {
        traces.push(...bandTraces(agg.xs, lo, hi, { color: c, name: `${label} 95% CI`, group: label, opacity: 0.16 }));
      }
      // The mean is drawn solid only where every run of the group has reached the step; where
      // fewer have, it is dotted and the hover says how many (a dropped seed is never silent).
      const text = agg.counts.map((k) => `n = ${k} of ${agg.n}`);
      const full = m.map((v, i) => (agg.counts[i] === agg.n ? v : null));
      const short = m.map((v, i) =>
        agg.counts[i] < agg.n || agg.counts[i - 1] < agg.n || agg.counts[i + 1] < agg.n ? v : null,
      );
      traces.push({
        x: agg.xs,
        y: full,
        text,
        type: "scatter",
        mode: "lines",
        line: { width: 2, color: c },
        name: `${label} (${seedsWithData(agg.counts, agg.n)})`,
        legendgroup: label,
        hovertemplate: `%{y:.4g} · %{text}<extra>${label}</extra>`,
      });
      if (short.some((v) => v !== null)) {
        traces.push({
          x: agg.xs,
          y: short,
          text,
          type: "scatter",
          mode: "lines",
          line: { width: 1.5, color: c, dash: "dot" },
          name: `${label}: fewer runs`,
          legendgroup: label,
          showlegend: false,
          hovertemplate: `%{y:.4g} · %{text}<extra>${label}</extra>`,
        });
      }
    }
  } else {
    for (const id of S.runIds) {
      const s = S.data[id]?.[key];
      const run = S.runs.get(id);
      if (!s?.steps.length || !run) continue;
      used.push(s);
      traces.push(
        ...lineTraces(xFor(id, s.steps, s.wall_time), s, {
          name: runName(run),
          color: runColor(id),
          smooth,
          group: `run${id}`,
        }),
      );
    }
  }
  if (!traces.length) return null;
  const layout = baseLayout({ uirevision: `${S.x}|${S.group}`, xTitle: X_TITLES[S.x], yTitle: unitOf(key) });
  if (isFraction(key)) layout.yaxis.range = [-0.03, 1.03]; // a fraction on its whole range, as on the run page
  padSingleX(layout, traces, S.x === "step" ? 0.5 : null);
  const notes = sampledAnnotation(used).map((a) => a.text);
  if (grouped && [...grouped.values()].some((ids) => ids.length > 1))
    notes.push("line = mean across runs (dotted: fewer runs) · band = 95% t CI of the mean");
  if (smooth) notes.push(`EMA smoothing ${smooth.toFixed(2)}`);
  return { traces, layout, notes };
}

export function diffFigure(key) {
  const [a, b] = S.diff;
  const sa = S.data[a]?.[key];
  const sb = S.data[b]?.[key];
  if (!sa || !sb || !sa.steps.length || !sb.steps.length) return null;
  const steps = [],
    vals = [],
    wall = [];
  sa.steps.forEach((st, i) => {
    const vb = interp(sb.steps, sb.values, st);
    if (vb === null || sa.values[i] === null) return;
    steps.push(st);
    vals.push(sa.values[i] - vb);
    wall.push(sa.wall_time ? sa.wall_time[i] : null);
  });
  if (!steps.length) return null;
  const s = { steps, values: vals, sampled: false };
  const smooth = isDeterministic(key) ? 0 : S.smooth;
  const traces = lineTraces(xFor(a, steps, wall), s, { name: `#${a} − #${b}`, color: "#7c3aed", smooth });
  const layout = baseLayout({ uirevision: `${S.x}|diff`, xTitle: X_TITLES[S.x], yTitle: unitOf(key) });
  layout.shapes = [
    { type: "line", xref: "paper", x0: 0, x1: 1, y0: 0, y1: 0, line: { color: "#9ca3af", width: 1, dash: "dot" } },
  ];
  return { traces, layout };
}
