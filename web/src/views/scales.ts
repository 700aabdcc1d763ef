// Axis scales and ticks for the SVG charts (scatter, box, bar).

import { fmtNum } from "../format";

export interface Scale {
  (v: number): number;
  ticks: number[];
  log: boolean;
  domain: [number, number];
}

/** 1, 2, 5 × 10^k steps giving about `count` ticks over [lo, hi]. */
export function niceTicks(lo: number, hi: number, count = 6): number[] {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [];
  if (lo === hi) {
    const d = lo === 0 ? 1 : Math.abs(lo) * 0.1;
    lo -= d;
    hi += d;
  }
  const raw = (hi - lo) / Math.max(1, count);
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const norm = raw / mag;
  const step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  const out: number[] = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/** A padded domain covering `values` (and zero when `withZero`). */
export function extent(values: number[], withZero = false, pad = 0.05): [number, number] {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v)) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  if (lo === Infinity) return [0, 1];
  if (withZero) {
    lo = Math.min(lo, 0);
    hi = Math.max(hi, 0);
  }
  if (lo === hi) {
    const d = lo === 0 ? 1 : Math.abs(lo) * 0.1;
    return [lo - d, hi + d];
  }
  const p = (hi - lo) * pad;
  // Padding never crosses zero: values that are all ≥ 0 keep a non-negative axis (and ≤ 0 likewise).
  const padLo = lo >= 0 ? Math.max(0, lo - p) : lo - p;
  const padHi = hi <= 0 ? Math.min(0, hi + p) : hi + p;
  return [withZero && lo === 0 ? 0 : padLo, withZero && hi === 0 ? 0 : padHi];
}

export function linearScale(domain: [number, number], range: [number, number], tickCount = 6): Scale {
  const ticks = niceTicks(domain[0], domain[1], tickCount);
  // The axis ends on a label when the next tick is close (at most 8 % of the range away); a far
  // one would pad the chart with empty space (AUC bars up to 1.2, a scatter from −0.5).
  if (ticks.length >= 2) {
    const step = ticks[1]! - ticks[0]!;
    const near = (domain[1] - domain[0]) * 0.08;
    const up = Number((ticks[ticks.length - 1]! + step).toPrecision(12));
    const down = Number((ticks[0]! - step).toPrecision(12));
    if (ticks[ticks.length - 1]! < domain[1] - step * 1e-9 && up - domain[1] <= near) ticks.push(up);
    if (ticks[0]! > domain[0] + step * 1e-9 && domain[0] - down <= near) ticks.unshift(down);
  }
  const d0 = Math.min(domain[0], ticks[0] ?? domain[0]);
  const d1 = Math.max(domain[1], ticks[ticks.length - 1] ?? domain[1]);
  const f = ((v: number) => range[0] + ((v - d0) / (d1 - d0 || 1)) * (range[1] - range[0])) as Scale;
  f.ticks = ticks;
  f.log = false;
  f.domain = [d0, d1];
  return f;
}

export function logScale(domain: [number, number], range: [number, number]): Scale {
  const lo = Math.floor(Math.log10(Math.max(domain[0], 1e-300)));
  let hi = Math.ceil(Math.log10(Math.max(domain[1], 1e-300)));
  if (hi === lo) hi = lo + 1;
  const f = ((v: number) => range[0] + ((Math.log10(v) - lo) / (hi - lo)) * (range[1] - range[0])) as Scale;
  const ticks: number[] = [];
  const every = Math.max(1, Math.ceil((hi - lo) / 8));
  for (let e = lo; e <= hi; e += every) ticks.push(Math.pow(10, e));
  f.ticks = ticks;
  f.log = true;
  f.domain = [Math.pow(10, lo), Math.pow(10, hi)];
  return f;
}

export function tickLabel(v: number, log: boolean): string {
  if (log) {
    const e = Math.round(Math.log10(v));
    return e >= -2 && e <= 3 ? fmtNum(v) : `1e${e}`;
  }
  return fmtNum(v);
}

/** A deterministic jitter in [-1, 1] from a string (so points do not jump on redraw). */
export function jitter(key: string): number {
  let h = 2166136261;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return ((h >>> 0) / 4294967295) * 2 - 1;
}

/** Shorten a label to `n` characters with an ellipsis. */
export function ellipsize(text: string, n: number): string {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

/**
 * `ticks` (evenly spaced, ascending) grown by whole steps until the last is at or above `hi` and
 * the first at or below `lo`: an axis drawn over the result ends on a labelled tick on both sides,
 * so a plateau at the top of the data can be read off a tick.
 */
export function ticksCovering(ticks: number[], lo: number, hi: number): number[] {
  if (ticks.length < 2) return ticks;
  const out = [...ticks];
  const step = out[1]! - out[0]!;
  if (!(step > 0)) return out;
  while (out[out.length - 1]! < hi - step * 1e-9) out.push(Number((out[out.length - 1]! + step).toPrecision(12)));
  while (out[0]! > lo + step * 1e-9) out.unshift(Number((out[0]! - step).toPrecision(12)));
  return out;
}
