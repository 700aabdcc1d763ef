// Column names of the table model (traceml_ai.runs.table): fixed columns, and logged values named by
// kind (config.<key>, run.start.<m>, run.last.<m>, run.best.<m>, summary.<key>) and the performance
// facts of captured runs (perf.<key>, joined on in Python from final_summary.json). The page only reads
// cells out of RunRows it already holds; filtering, sorting and grouping are done in Python.

import { fmtBytes, fmtNum } from "./format";
import type { RunRow, Scalar } from "./types";

export const FIXED_COLUMNS = [
  "id",
  "name",
  "status",
  "group",
  "tags",
  "path",
  "started",
  "ended",
  "heartbeat",
  "duration_s",
  "step",
  "epoch",
  "notes",
  "legacy",
  "warnings",
] as const;

export type Kind = "fixed" | "config" | "run.start" | "run.last" | "run.best" | "summary" | "perf";

const PREFIXES: [string, Kind][] = [
  ["config.", "config"],
  ["run.start.", "run.start"],
  ["run.last.", "run.last"],
  ["run.best.", "run.best"],
  ["summary.", "summary"],
  ["perf.", "perf"],
];

export function splitColumn(column: string): [Kind, string] {
  if ((FIXED_COLUMNS as readonly string[]).includes(column)) return ["fixed", column];
  for (const [prefix, kind] of PREFIXES) {
    if (column.startsWith(prefix)) return [kind, column.slice(prefix.length)];
  }
  return ["fixed", column];
}

export const KIND_LABEL: Record<Kind, string> = {
  fixed: "run",
  config: "config",
  "run.start": "start",
  "run.last": "last",
  "run.best": "best",
  summary: "summary",
  perf: "perf",
};

/** The value of one column for one run (mirrors traceml_ai.runs.table.cell). */
export function cellValue(run: RunRow, column: string): Scalar {
  return cellGetter(column)(run);
}

const getters = new Map<string, (run: RunRow) => Scalar>();

/** A function reading one column out of RunRows (the column name is parsed once, not per row). */
export function cellGetter(column: string): (run: RunRow) => Scalar {
  let get = getters.get(column);
  if (get) return get;
  const [kind, key] = splitColumn(column);
  switch (kind) {
    case "config":
      get = (run) => run.params[key] ?? null;
      break;
    case "run.start":
      get = (run) => run.start[key] ?? null;
      break;
    case "run.last":
      get = (run) => run.last[key] ?? null;
      break;
    case "run.best":
      get = (run) => run.best[key]?.value ?? null;
      break;
    case "summary":
      get = (run) => run.summary[key] ?? null;
      break;
    case "perf":
      get = (run) => run.perf?.[key] ?? null;
      break;
    default:
      get = (run) => fixedCell(run, key);
  }
  getters.set(column, get);
  return get;
}

function fixedCell(run: RunRow, column: string): Scalar {
  switch (column) {
    case "id":
      return run.id;
    case "name":
      return run.name;
    case "status":
      return run.display_status;
    case "group":
      return run.group || null;
    case "tags":
      return run.tags.length ? run.tags.join(";") : null;
    case "path":
      return run.path;
    case "started":
      return run.started_at;
    case "ended":
      return run.ended_at;
    case "heartbeat":
      return run.heartbeat_at;
    case "duration_s":
      return run.duration_s;
    case "step":
      return run.step;
    case "epoch":
      return run.epoch;
    case "notes":
      return run.notes || null;
    case "legacy":
      return run.legacy;
    case "warnings":
      return run.warnings.length;
    case "catalog_run":
      return run.catalog_run ?? null;
    default:
      return null;
  }
}

/** Short header text: the key of a logged value, the name of a fixed column. */
export function columnTitle(column: string): string {
  const [kind, key] = splitColumn(column);
  if (kind === "fixed") return column === "duration_s" ? "duration" : column === "catalog_run" ? "Catalog run" : column;
  if (kind === "perf") return PERF_TITLES[key] ?? key;
  return key;
}

/** Header text of the perf.* columns (the column name stays the tooltip and the filter name). */
export const PERF_TITLES: Record<string, string> = {
  telemetry: "telemetry",
  verdict: "verdict",
  severity: "severity",
  findings: "findings",
  steps: "perf steps",
  ranks: "ranks",
  "step_ms.p50": "step ms p50",
  "step_ms.p95": "step ms p95",
  steps_per_s: "steps/s",
  "share.dataloader": "input share",
  "share.h2d": "h2d share",
  "share.forward": "forward share",
  "share.backward": "backward share",
  "share.optimizer": "optimizer share",
  "share.other": "other share",
  skew_pct: "rank skew %",
  worst_rank: "slowest rank",
  straggler: "straggler",
  "peak_mem.gpu": "peak GPU mem",
  "peak_mem.host": "peak host RSS",
  gpu_util_pct: "GPU util %",
};

/** A perf.* number as the table shows it: shares as percent, memory in bytes units, the rest as numbers. */
export function fmtPerf(column: string, v: number): string {
  if (column.startsWith("perf.share.")) return `${(v * 100).toFixed(1)}%`;
  if (column.startsWith("perf.peak_mem.")) return fmtBytes(v);
  if (column === "perf.skew_pct" || column === "perf.gpu_util_pct") return `${fmtNum(v)}%`;
  if (column.startsWith("perf.step_ms.")) return `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)} ms`;
  if (column === "perf.steps_per_s") return `${v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)}/s`;
  return fmtNum(v);
}

/** Why a perf.* cell of `run` is empty (`–`), for its tooltip: a captured run's missing fact says
 * what was not measured and why (h2d on a CPU run: "not measured: no CUDA device ..."), from the
 * run's other facts; null when the cell has a value. */
export function perfMissingReason(run: RunRow, column: string): string | null {
  const p = run.perf ?? {};
  const key = column.startsWith("perf.") ? column.slice(5) : column;
  const v = p[key];
  if (v !== null && v !== undefined && v !== "") return null;
  if (!isCaptured(run)) return "not captured by traceml run (no aggregator/ folder)";
  if (p.telemetry === "pending") return "no final summary yet: the run is still running";
  if (p.telemetry === "no_summary") return "no final summary: the run ended without one (traceml summary RUN diagnoses its rows)";
  if (p.steps === undefined || p.steps === null) return "not read: the final summary could not be used (see the run's warnings)";
  // A GPU run has per-step device memory or GPU utilisation samples; a run with neither had no CUDA device.
  const gpu = typeof p["peak_mem.gpu"] === "number" || typeof p.gpu_util_pct === "number";
  const ranks = typeof p.ranks === "number" ? p.ranks : 1;
  switch (key) {
    case "share.h2d":
      return gpu
        ? "not measured: the script timed no host-to-device copy (no traceml:h2d events)"
        : "not measured: no CUDA device (h2d is the time of host-to-GPU copies)";
    case "peak_mem.gpu":
      return "not measured: no CUDA device (a CPU run has no device memory; see peak host RSS)";
    case "gpu_util_pct":
      return "not measured: no GPU utilisation samples (no GPU on this host, or NVML unavailable)";
    case "skew_pct":
    case "worst_rank":
      return ranks < 2 ? "one rank: no skew between ranks to measure" : "not measured: too few steps on some rank";
    case "straggler":
      return ranks < 2 ? "one rank: no straggler possible" : "no straggler found";
    case "severity":
      return "no finding";
    case "step_ms.p95":
      return "not in this summary (written by an older TraceML)";
    default:
      return key.startsWith("share.") ? "not measured: the script did not time this phase" : "not measured in this run";
  }
}

/** Whether a run was captured by `traceml run` (it has perf facts; every captured run has perf.telemetry). */
export function isCaptured(run: RunRow | undefined): boolean {
  return run?.perf?.telemetry !== undefined && run?.perf?.telemetry !== null;
}

/** Metric name prefix group for the picker: train/ val/ test/ sys/ other. */
export const METRIC_GROUPS = ["train", "val", "test", "sys", "other"] as const;
export type MetricGroup = (typeof METRIC_GROUPS)[number];

export function metricGroup(metric: string): MetricGroup {
  const slash = metric.indexOf("/");
  if (slash > 0) {
    const p = metric.slice(0, slash);
    if (p === "train" || p === "val" || p === "test" || p === "sys") return p;
  }
  return "other";
}

export const DEFAULT_METRICS = ["train/loss", "val/loss", "val/auc"];

/** The short form of a run id: its random tail (`…_e9df` → `e9df`), else its last 6 characters. */
export function shortId(id: string): string {
  const tail = id.slice(id.lastIndexOf("_") + 1);
  return tail && tail.length <= 8 && tail !== id ? tail : id.slice(-6);
}

/**
 * Display labels of runs shown together (legend, compare columns, chart points): the run's name,
 * with ` · <short id>` added where two of them share a name (the full id where short ids collide too).
 */
export function runLabels(runs: Iterable<RunRow>): Map<string, string> {
  const list = [...new Map([...runs].map((r) => [r.key, r])).values()];
  const byName = new Map<string, number>();
  for (const r of list) byName.set(r.name || r.id, (byName.get(r.name || r.id) ?? 0) + 1);
  const out = new Map<string, string>();
  const taken = new Set<string>();
  for (const r of list) {
    const name = r.name || r.id;
    if ((byName.get(name) ?? 0) < 2) out.set(r.key, name);
    else {
      let label = `${name} · ${shortId(r.id)}`;
      if (taken.has(label)) label = `${name} · ${r.id}`;
      taken.add(label);
      out.set(r.key, label);
    }
  }
  return out;
}
