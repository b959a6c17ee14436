// Arithmetic on logged series shared by the pages: interpolation between logged steps, and the
// small statistics (mean, sample variance, Student t quantiles) the compare page's bands use.

/** y at `x` by linear interpolation between the points of (xs, ys), xs ascending. Outside the
 * logged range, or next to a missing value, there is no value: null (never extrapolated, so a
 * run that has not reached a step does not count as having reached it). */
export function interp(xs, ys, x) {
  if (!xs.length || x < xs[0] || x > xs[xs.length - 1]) return null;
  let lo = 0,
    hi = xs.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) lo = mid;
    else hi = mid;
  }
  if (xs[hi] === x) return ys[hi];
  if (xs[lo] === x) return ys[lo];
  if (ys[lo] === null || ys[hi] === null) return null;
  const t = (x - xs[lo]) / (xs[hi] - xs[lo] || 1);
  return ys[lo] + t * (ys[hi] - ys[lo]);
}

/** Quantile of a sorted numeric array. */
export function quantile(sorted, q) {
  if (!sorted.length) return null;
  const pos = (sorted.length - 1) * q;
  const lo = Math.floor(pos),
    hi = Math.ceil(pos);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

export const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
/** Sample variance (n − 1). */
export const variance = (xs, m = mean(xs)) => xs.reduce((a, b) => a + (b - m) ** 2, 0) / (xs.length - 1);

// Student t quantiles t_{0.975, df} for df = 1..30 (beyond, the normal's 1.96 is within 4%).
const T975 = [
  12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.16, 2.145, 2.131, 2.12, 2.11,
  2.101, 2.093, 2.086, 2.08, 2.074, 2.069, 2.064, 2.06, 2.056, 2.052, 2.048, 2.045, 2.042,
];
/** t_{0.975, df}; a fractional (Welch) df is rounded down, which widens the band a little. */
export const t975 = (df) => (df >= 1 ? (T975[Math.floor(df) - 1] ?? 1.96) : null);

/** Half-width of the 95% t interval of the mean of `values`; null below two values (one value
 * has no interval). */
export function tHalfWidth(values) {
  const n = values.length;
  if (n < 2) return null;
  return (t975(n - 1) * Math.sqrt(variance(values))) / Math.sqrt(n);
}
