// Shapes of the viewer JSON API (docs/viewer-api.md). Everything here comes from run files or the
// server and is untrusted text: it is only ever put into the page with textContent.

export type Scalar = string | number | boolean | null;

export type DisplayStatus =
  | "running"
  | "running?"
  | "stale"
  | "completed"
  | "failed"
  | "killed"
  | "legacy"
  | "unknown";

export interface BestValue {
  value: number | null;
  step: number | null;
  epoch: number | null;
  mode: string | null;
}

export interface RunError {
  type: string | null;
  message: string | null;
  code: number | null;
  signal: string | null;
}

export interface RunRow {
  key: string;
  id: string;
  name: string;
  group: string | null;
  tags: string[];
  notes: string;
  /** run.json's status; null when run.json has none (display_status then says what is shown). */
  status: string | null;
  display_status: DisplayStatus | string;
  legacy: boolean;
  started_at: string | null;
  ended_at: string | null;
  heartbeat_at: string | null;
  duration_s: number | null;
  step: number | null;
  epoch: number | null;
  path: string;
  root: string;
  warnings: string[];
  error: RunError | null;
  params: Record<string, Scalar>;
  start: Record<string, number | null>;
  last: Record<string, number | null>;
  best: Record<string, BestValue>;
  summary: Record<string, Scalar>;
  metric_names: string[];
  /** The perf.* facts of a captured run ({} when not captured; docs/viewer-api.md, "Performance columns"). */
  perf: Record<string, Scalar>;
  /** The catalog run holding this run folder's session (docs/catalog.md, "In the viewer"). */
  catalog_run: string | null;
  /** True when duration_s is derived from run.json's times, not written (docs/viewer-api.md). */
  duration_derived?: boolean;
}

/** One attachment of a catalog run (GET /api/runs/{key}/attachments). */
export interface AttachmentItem {
  id: string;
  title: string | null;
  kind: string;
  storage: string;
  rank: number | null;
  session: string | null;
  url: string | null;
  token: string | null;
  state: "remote" | "file" | "folder" | "missing" | "outside_root";
  size_bytes: number | null;
}

export interface AttachmentsResponse {
  catalog_run: string | null;
  explicit: boolean;
  title: string | null;
  attachments: AttachmentItem[];
}

export interface RootInfo {
  path: string;
  count: number;
  missing: boolean;
}

/** A GET /api/runs answer without its rows: the first line of a streamed listing (with `count`,
 *  the number of rows that follow) and what applies to the page with any listing. */
export interface RunsHeader {
  version: number;
  full: boolean;
  removed: string[];
  hidden: string[];
  roots: RootInfo[];
  warnings: string[];
  refreshed_at: string | null;
  refresh_interval_seconds: number;
  stale_after_seconds: number;
  count?: number;
}

export interface RunsResponse extends RunsHeader {
  runs: RunRow[];
}

export interface TableGroup {
  label: string;
  keys: string[];
  color: number;
}

export interface TableColumns {
  available: string[];
  default: string[];
  numeric: string[];
  shown: string[];
}

export interface TableResponse {
  version: number;
  keys: string[];
  total: number;
  shown: number;
  groups: TableGroup[] | null;
  columns: TableColumns;
  differing: string[];
  error: string | null;
  /** With `rows=N`: the rows of the first N runs as drawn, for the first screen before the listing. */
  rows?: RunRow[];
}

/** The question a table answer answers, as GET /api/table?remembered=1 echoes it. */
export interface TableQuestion {
  filters: string[];
  sort: string[];
  group: string | null;
  search: string;
  status: string[];
  columns: string[] | null;
  show_hidden: boolean;
}

export interface RememberedTableResponse extends TableResponse {
  query: TableQuestion;
}

export type XAxis = "step" | "epoch" | "time";

export interface Series {
  key: string;
  metric: string;
  x: (number | null)[];
  y: (number | null)[];
  smoothed: (number | null)[] | null;
  raw_points: number;
  downsampled: boolean;
}

/** Plot by groups: one group's mean and band by step of one metric, computed over the runs' full
 *  histories on the server, then downsampled (the extremes of the mean and both band kinds kept). */
export interface GroupSeries {
  metric: string;
  label: string;
  keys: string[];
  step: number[];
  mean: number[];
  min: number[];
  max: number[];
  std: number[];
  n_runs: number[];
  raw_points: number;
  downsampled: boolean;
}

export interface SeriesResponse {
  version: number;
  series: Series[];
  warnings: Record<string, string[]>;
  /** On x = time: what the time counts from, e.g. "time since start (s)"; null otherwise. */
  time_label?: string | null;
  /** With `group_by` in the request only. */
  groups?: GroupSeries[];
}

export interface BarItem {
  key: string | null;
  label: string;
  value: number | null;
  min: number | null;
  max: number | null;
  n: number;
  group: string | null;
}

export interface BarResponse {
  bars: BarItem[];
  total: number;
  limit: number;
  /** Charted runs without a numeric value in the field (no bar, not in any group mean). */
  dropped?: number;
}

export interface ScatterPoint {
  key: string;
  label: string;
  x: number;
  y: number;
  size: number | null;
  group: string | null;
}

export interface ScatterResponse {
  points: ScatterPoint[];
  dropped: number;
}

export interface BoxPoint {
  key: string;
  label: string;
  value: number;
  outlier: boolean;
}

export interface BoxGroup {
  label: string;
  n: number;
  q1: number;
  median: number;
  q3: number;
  low: number;
  high: number;
  points: BoxPoint[];
}

export interface BoxResponse {
  groups: BoxGroup[];
}

export interface RunDetail {
  run: RunRow;
  config: unknown;
  run_json: Record<string, unknown> | null;
  traceback: string | null;
  files: Record<string, number | null>;
}

export interface ExportResponse {
  path: string;
  latest?: string;
  rows?: number;
}

export type ChartKind = "line" | "scatter" | "box" | "bar";

export interface LineSpec {
  keys: string[];
  metrics: string[];
  x: XAxis;
  ema: number;
  log_y: boolean;
  group_by: string | null;
  /** With group_by: the band around each mean the PNG draws (the CSV holds min, max and std). */
  band: "minmax" | "std";
}

export interface BarSpec {
  keys: string[];
  field: string;
  group_by: string | null;
}

export interface ScatterSpec {
  keys: string[];
  x_field: string;
  y_field: string;
  size_field: string | null;
  color_field: string | null;
  log_x: boolean;
  log_y: boolean;
  /** Export only: the chart CSV then holds each group's mean ± std (Plot by groups). */
  group_by?: string | null;
}

export interface BoxSpec {
  keys: string[];
  field: string;
  group_by: string | null;
}

// -- GET /api/runs/<key>/telemetry (docs/viewer-api.md) ---------------------------------------------

/** Several series on one x axis (steps, or seconds since `t0_unix_ns`); null = no value there. */
export interface TelemetryChart {
  x: number[];
  series: { name: string; y: (number | null)[] }[];
  raw_points: number;
  downsampled: boolean;
}

export interface StepChart extends TelemetryChart {
  unit: "ms";
  first_step: number | null;
  last_step: number | null;
  warmup_steps: number;
  ranks: number;
  sampled_every: number;
}

export interface Finding {
  kind: string;
  severity: "info" | "warning" | "critical" | string;
  summary: string;
  action: string;
  evidence: {
    metric?: string;
    value?: number | null;
    threshold?: number | null;
    ranks?: (number | null)[];
    steps?: [number, number] | null;
  } | null;
}

export interface Diagnoses {
  source: "final_summary" | "live";
  generated_at: string | null;
  status: string | null;
  detail: string | null;
  problems: string[];
  findings: Finding[];
  abstained: { rule?: string; reason?: string }[];
  rules_checked: string[];
  healthy: boolean;
  /** Findings of the summary that could not be read (an unknown severity): no "no problem" then. */
  unread_findings?: number;
  /** The one-line verdict as `traceml summary` gives it: `not_judged` when no step was timed. */
  verdict?: { kind: "findings" | "healthy" | "not_judged" | "no_verdict"; text: string };
  steps: { seen?: number; first?: number | null; last?: number | null; analysed?: number } | null;
  ranks: { seen?: (number | null)[]; world_size?: number | null; missing?: number[] } | null;
}

export interface RankStat {
  rank: number | null;
  steps: number | null;
  median_ms: number | null;
  p90_ms: number | null;
  outside_backward_median_ms: number | null;
}

export interface RankLog {
  rank: string;
  name: string;
  size: number | null;
  truncated: boolean;
  lines: ["stdout" | "stderr" | null, string][];
}

/** GET /api/runs/<key>/performance (docs/viewer-api.md). */
export interface PerformanceResponse {
  heatmap: {
    state: string;
    detail: string | null;
    ranks: (number | null)[];
    first_step: number | null;
    /** The highest step any rank measured: where the last (maybe narrower) bucket ends. */
    last_step?: number | null;
    bucket_steps: number;
    z: (number | null)[][];
    /** The work outside backward (iteration minus backward), per rank and bucket: what tells a DDP straggler. */
    z_local?: (number | null)[][];
    /** Each rank's medians after warm-up (aligned with `ranks`). */
    medians?: { median_ms: number | null; outside_backward_ms: number | null }[];
    warmup_steps: number;
    unit: "ms";
  };
  breakdown: {
    x: number[];
    bucket_steps: number;
    /** The last step (where the last bucket ends; x holds each bucket's first step). */
    last_step?: number | null;
    series: { name: string; y: (number | null)[] }[];
    iteration: (number | null)[];
    /** The one rank shown at every step: the slowest by the straggler measure (the summary's worst_rank). */
    rank: number | null;
    rank_basis: "straggler measure" | "only rank" | "highest median iteration";
  } | null;
}

/** GET /api/runs/<key>/performance-page (docs/viewer-api.md): both answers from one read. */
export interface PerformancePage {
  telemetry: TelemetryResponse;
  performance: PerformanceResponse;
  /** Names the files the answer was built from: the same stamp, the same answer. */
  stamp: string;
  live: boolean;
}

/** GET /api/runs/<key>/performance-page?from=&to=: the phase breakdown of a zoomed range. */
export interface ZoomedBreakdown {
  breakdown: (NonNullable<PerformanceResponse["breakdown"]> & { range?: [number, number] }) | null;
}

export interface TelemetryResponse {
  state: "ok" | "none" | "missing" | "empty" | "corrupt" | "unreadable";
  detail: string | null;
  warnings: string[];
  live: boolean;
  /** The run ended and its aggregator is still writing final_summary.json (live is true then). */
  finalizing?: boolean;
  manifest: Record<string, string | number | null> | null;
  diagnoses: Diagnoses | null;
  /** What finalization_warning.json says was lost; `unreadable`: the file is there but cannot be read. */
  finalization: { summary: string[]; unreadable?: string } | null;
  steps: StepChart | null;
  ranks: {
    per_rank: RankStat[];
    worst_rank: number | null;
    skew: number | null;
    /** Which median the skew compares: the iteration, or the work outside backward (the straggler rule's two measures). */
    skew_measure?: "iteration" | "outside_backward" | null;
    iteration_median_ms: number | null;
    iteration_p95_ms?: number | null;
    throughput_steps_per_s: number | null;
  } | null;
  memory: TelemetryChart | null;
  rss: TelemetryChart | null;
  host: TelemetryChart | null;
  gpu: TelemetryChart | null;
  /** Each GPU's power draw and limit in watts ("GPU 0 power", "GPU 0 power limit"); null without a reading. */
  gpu_power?: TelemetryChart | null;
  /** Each GPU's temperature in degrees Celsius ("GPU 0"); null without a reading. */
  gpu_temperature?: TelemetryChart | null;
  t0_unix_ns: number | null;
  /** A final_summary.json that exists but cannot be used ("aggregator/final_summary.json cannot be
   * read (damaged): ..."): the reason the run has no verdict; null when it was read or is absent. */
  final_summary_error?: string | null;
  logs: RankLog[];
}

/** GET /api/runs/<key>/compare?baseline=<key>: `traceml compare`'s verdicts (docs/viewer-api.md). */
export interface CompareResponse {
  run_a: string;
  run_b: string;
  live: boolean;
  metrics: {
    metric: string;
    unit: string;
    better: "lower" | "higher";
    median_a: number | null;
    median_b: number | null;
    /** B/A and its bootstrap interval (null when no interval was computed). */
    ratio?: number | null;
    ci_low?: number | null;
    ci_high?: number | null;
    change_pct: number | null;
    verdict: "regression" | "improvement" | "equivalent" | "inconclusive";
    reason: string;
  }[];
  problems: string[];
  /** Runs with no telemetry rows to compare ("B: telemetry database is damaged: ..."): every verdict is then inconclusive for that reason. */
  unusable?: string[];
}
