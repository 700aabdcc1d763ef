// Display formatting of values. Full precision always stays available as a tooltip: the table
// shows `0.8912`, the tooltip (and the CSV export) `0.89123456`.

import type { Scalar } from "./types";

/** A number in at most ~4 significant digits; exponent form for very small or large values. */
export function fmtNum(v: number): string {
  if (!Number.isFinite(v)) return String(v);
  if (Number.isInteger(v) && Math.abs(v) < 1e7) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e7)) {
    return v.toExponential(2).replace(/\.?0+e/, "e");
  }
  const digits = a >= 1000 ? 1 : a >= 100 ? 2 : a >= 10 ? 3 : 4;
  return String(Number(v.toFixed(digits)));
}

/** The labels of an axis's ticks: as {@link fmtNum} writes each, unless that makes two of them
 *  the same (a chart zoomed into 0.99990 … 0.99998 is not five `0.9999`): then every label with
 *  as many decimals as the tick spacing needs, one more at a time until they all differ. */
export function fmtTicks(splits: (number | null)[]): string[] {
  const plain = splits.map((v) => (v === null ? "" : fmtNum(v)));
  const shown = plain.filter((t) => t !== "");
  if (new Set(shown).size === shown.length) return plain;
  const vals = splits.filter((v): v is number => v !== null && Number.isFinite(v)).sort((a, b) => a - b);
  let step = Infinity;
  for (let i = 1; i < vals.length; i++) {
    const d = vals[i]! - vals[i - 1]!;
    if (d > 0 && d < step) step = d;
  }
  if (!Number.isFinite(step)) return plain;
  for (let digits = Math.min(20, Math.max(0, -Math.floor(Math.log10(step)))); digits <= 20; digits++) {
    const out = splits.map((v) => (v === null ? "" : v.toFixed(digits)));
    const seen = out.filter((t) => t !== "");
    if (new Set(seen).size === seen.length) return out;
  }
  return plain;
}

/** The exact text of a value (as the CSV export writes it). */
export function rawText(v: Scalar | undefined): string {
  if (v === null || v === undefined) return "";
  if (typeof v === "boolean") return v ? "true" : "false";
  return String(v);
}

/** A cell value for display. */
export function fmtValue(v: Scalar | undefined): string {
  if (v === null || v === undefined) return "";
  if (typeof v === "number") return fmtNum(v);
  if (typeof v === "boolean") return v ? "true" : "false";
  return v;
}

/** Seconds as `1h 02m`, `3m 05s`, `12.5 s`. */
export function fmtDuration(sec: number | null | undefined): string {
  if (sec === null || sec === undefined || !Number.isFinite(sec)) return "";
  if (sec < 60) return `${Number(sec.toFixed(sec < 10 ? 1 : 0))} s`;
  const s = Math.round(sec);
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  const ss = s % 60;
  if (d > 0) return `${d}d ${String(hh).padStart(2, "0")}h`;
  if (hh > 0) return `${hh}h ${String(mm).padStart(2, "0")}m`;
  return `${mm}m ${String(ss).padStart(2, "0")}s`;
}

/** An ISO-8601 time as local `YYYY-MM-DD HH:MM`. */
export function fmtTime(iso: string | null | undefined): string {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const p = (n: number) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}`;
}

/** Seconds since an ISO time, or null. */
export function ageSeconds(iso: string | null | undefined, now = Date.now()): number | null {
  if (!iso) return null;
  const t = new Date(iso).getTime();
  if (Number.isNaN(t)) return null;
  return Math.max(0, (now - t) / 1000);
}

/** `12 s ago`, `4 min ago`, `3 h ago`, `2 d ago`. */
export function fmtAgo(iso: string | null | undefined, now = Date.now()): string {
  const a = ageSeconds(iso, now);
  if (a === null) return "never";
  if (a < 5) return "just now";
  if (a < 60) return `${Math.floor(a)} s ago`;
  if (a < 3600) return `${Math.floor(a / 60)} min ago`;
  if (a < 86400) return `${Math.floor(a / 3600)} h ago`;
  return `${Math.floor(a / 86400)} d ago`;
}

/** Bytes in 1024-based units, named as such: `812 B`, `4.1 KiB`, `2.3 MiB`, `1.5 GiB`, `2.0 TiB`. */
export function fmtBytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = Math.abs(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${n < 0 ? "-" : ""}${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

// Clock steps of a wall-time axis in seconds: 1-2-5 below a second, then 1 2 5 10 15 30 s, 1 2 5 10
// 15 30 min, 1 2 3 6 12 h, 1 2 7 14 d, …
const CLOCK_STEPS: number[] = [
  ...[-3, -2, -1].flatMap((k) => [1, 2, 5].map((m) => m * Math.pow(10, k))),
  1, 2, 5, 10, 15, 30,
  60, 120, 300, 600, 900, 1800,
  3600, 7200, 10800, 21600, 43200,
  86400, 172800, 604800, 1209600, 2592000,
];

/**
 * Ticks of a wall-time axis over [min, max] seconds at clock steps, at most about `count` of them:
 * the positions (seconds) and their labels, each in the units it needs (`0s 15s 30s 45s 1m 1m 15s`,
 * `0 1m 2m 3m`, `1h 30m`), see {@link fmtClock}.
 */
export function clockTicks(min: number, max: number, count = 6): { ticks: number[]; labels: string[]; step: number } {
  if (!Number.isFinite(min) || !Number.isFinite(max) || max <= min) return { ticks: [], labels: [], step: 0 };
  const raw = (max - min) / Math.max(1, count);
  const step = CLOCK_STEPS.find((s) => s >= raw * (1 - 1e-9)) ?? Math.ceil(raw / 2592000) * 2592000;
  const ticks: number[] = [];
  for (let i = Math.ceil(min / step - 1e-9); i * step <= max + step * 1e-9; i++) ticks.push(Number((i * step).toPrecision(12)));
  return { ticks, labels: ticks.map((v) => fmtClock(v, step)), step };
}

/**
 * `sec` seconds as a clock axis label for ticks `step` seconds apart: days, hours, minutes and
 * seconds that are not zero (`1m 15s`, `2h`, `1d 12h`); 0 is `0s` on a seconds axis, else `0`; under
 * a one-second step, seconds with the decimals the step needs (`1.5s`).
 */
export function fmtClock(sec: number, step: number): string {
  const sign = sec < 0 ? "-" : "";
  let a = Math.abs(sec);
  if (step < 1) {
    const digits = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
    return `${sign}${Number(a.toFixed(digits))}s`;
  }
  a = Math.round(a);
  if (a === 0) return step < 60 ? "0s" : "0";
  const parts: string[] = [];
  for (const [size, unit] of [[86400, "d"], [3600, "h"], [60, "m"], [1, "s"]] as const) {
    const n = Math.floor(a / size);
    a -= n * size;
    if (n) parts.push(`${n}${unit}`);
  }
  return sign + parts.join(" ");
}

const BYTE_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/**
 * Ticks of a bytes axis over [min, max] at a power-of-two step of at least one byte (128 MiB,
 * 256 MiB, 512 MiB, 1 GiB …), at most about `count` of them; labels all in the 1024-based unit of
 * the largest (`0 128 MiB 256 MiB 384 MiB`, `0 0.5 GiB 1 GiB 1.5 GiB`).
 */
export function binaryTicks(min: number, max: number, count = 5): { ticks: number[]; labels: string[] } {
  if (!Number.isFinite(min) || !Number.isFinite(max) || max <= min) return { ticks: [], labels: [] };
  const raw = (max - min) / Math.max(1, count);
  const step = Math.pow(2, Math.max(0, Math.ceil(Math.log2(raw) - 1e-9)));
  const ticks: number[] = [];
  for (let i = Math.ceil(min / step - 1e-9); i * step <= max + step * 1e-9; i++) ticks.push(i * step);
  return { ticks, labels: fmtBinaryTicks(ticks) };
}

/** Labels of byte ticks, all in the 1024-based unit of the largest (`0 0.5 GiB 1 GiB`); null: no tick there. */
export function fmtBinaryTicks(ticks: (number | null)[]): string[] {
  const top = Math.max(1, ...ticks.map((v) => (v === null ? 0 : Math.abs(v))));
  const u = Math.min(BYTE_UNITS.length - 1, Math.floor(Math.log2(top) / 10));
  const div = Math.pow(1024, u);
  return ticks.map((v) => (v === null ? "" : v === 0 ? "0" : `${fmtNum(Number((v / div).toPrecision(12)))} ${BYTE_UNITS[u]}`));
}

export type TimeUnit = "s" | "min" | "h";

/** The unit a wall-time axis over [min, max] seconds reads in: seconds under 3 min, minutes under 3 h, else hours. */
export function timeUnit(min: number, max: number): { unit: TimeUnit; div: number } {
  const span = Math.abs(max - min);
  if (!Number.isFinite(span) || span < 180) return { unit: "s", div: 1 };
  if (span < 3 * 3600) return { unit: "min", div: 60 };
  return { unit: "h", div: 3600 };
}

/**
 * Clean ticks for a wall-time axis over [min, max] seconds: the positions in seconds, their labels
 * as plain numbers in the axis unit (`0 10 20 30` under "min"), at most about `count` of them.
 * Steps are 1-2-5 decades and, per unit, the clock's own steps (15 and 30 s or min; 3, 6, 12, 24 h).
 */
export function timeTicks(min: number, max: number, count = 6): { unit: TimeUnit; ticks: number[]; labels: string[] } {
  const { unit, div } = timeUnit(min, max);
  if (!Number.isFinite(min) || !Number.isFinite(max) || max <= min) return { unit, ticks: [], labels: [] };
  const lo = min / div;
  const hi = max / div;
  const raw = (hi - lo) / Math.max(1, count);
  const steps: number[] = unit === "h" ? [0.25, 3, 6, 12, 24, 48] : [15, 30];
  for (let k = -3; k <= 6; k++) for (const m of [1, 2, 5]) steps.push(m * Math.pow(10, k));
  steps.sort((a, b) => a - b);
  const step = steps.find((s) => s >= raw * (1 - 1e-9)) ?? raw;
  const ticks: number[] = [];
  const labels: string[] = [];
  for (let i = Math.ceil(lo / step - 1e-9); i * step <= hi + step * 1e-9; i++) {
    const v = Number((i * step).toPrecision(12));
    ticks.push(v * div);
    labels.push(fmtNum(v));
  }
  return { unit, ticks, labels };
}

/** A wall-time value for a tooltip: `42 s`, `12.5 min`, `1.25 h`. */
export function fmtWallTime(sec: number): string {
  const a = Math.abs(sec);
  if (a < 180) return `${fmtNum(sec)} s`;
  if (a < 3 * 3600) return `${fmtNum(sec / 60)} min`;
  return `${fmtNum(sec / 3600)} h`;
}

/** Ranks in words, as `traceml summary` writes them (cli/summary.py `rank_list`): `rank 0`,
 *  `ranks 0–3`, `ranks 0, 2–3`; consecutive ranks as `a–b`, an unknown rank `?`. */
export function rankList(ranks: readonly (number | null)[]): string {
  const known = ranks.filter((r): r is number => r !== null).sort((a, b) => a - b);
  const parts: string[] = [];
  for (const r of known) {
    const last = parts[parts.length - 1];
    if (last !== undefined && r === Number(last.split("–").pop()) + 1) parts[parts.length - 1] = `${last.split("–")[0]}–${r}`;
    else parts.push(String(r));
  }
  for (let i = known.length; i < ranks.length; i++) parts.push("?");
  return (ranks.length === 1 ? "rank " : "ranks ") + parts.join(", ");
}

/** The ranks that reported, as `traceml summary`'s "ranks" line (cli/summary.py `ranks_text`):
 *  `1 rank (rank 0)` for a one-process run, `ranks 0–3 of 4`, `rank 1 of 4`, `none`; never a
 *  bare count, which reads as a rank number. */
export function ranksText(ranks: readonly (number | null)[], worldSize: number | null | undefined): string {
  if (!ranks.length) return worldSize == null ? "none" : `none of ${worldSize}`;
  const text = rankList(ranks);
  if (worldSize == null || (worldSize === 1 && ranks.length === 1)) return ranks.length === 1 ? `1 rank (${text})` : text;
  return `${text} of ${worldSize}`;
}
