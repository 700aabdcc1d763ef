// Column names of the table model (traceml_ai.runs.table): fixed columns, and logged values named by
// kind (config.<key>, run.start.<m>, run.last.<m>, run.best.<m>, summary.<key>). The page only reads
// cells out of RunRows it already holds; filtering, sorting and grouping are done in Python.

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

export type Kind = "fixed" | "config" | "run.start" | "run.last" | "run.best" | "summary";

const PREFIXES: [string, Kind][] = [
  ["config.", "config"],
  ["run.start.", "run.start"],
  ["run.last.", "run.last"],
  ["run.best.", "run.best"],
  ["summary.", "summary"],
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
  return key;
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
