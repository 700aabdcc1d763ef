// The only module that talks to the server (docs/viewer-api.md). The token lives in an HttpOnly
// cookie set by the first visit, so requests are plain same-origin fetches.

import type { AttachmentsResponse, RunRow, RunsHeader, BarResponse, BarSpec, BoxResponse, BoxSpec, CompareResponse, ExportResponse, LineSpec, PerformancePage, PerformanceResponse, RememberedTableResponse, RunDetail, RunsResponse, ScatterResponse, ScatterSpec, SeriesResponse, TableQuestion, TableResponse, TelemetryResponse, XAxis, ZoomedBreakdown } from "./types";
import type { ExportPerformanceRequest, ExportTableRequest, HideRequest, RefreshRequest, SeriesRequest } from "./requests";

/** A failed API call; `message` is the server's one-line `error` when it sent one. */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
  ) {
    super(message);
  }
}

/** The request early.ts sent for `path` before the app loaded (taken once), or undefined. */
function takeEarly(path: string): Promise<Response> | undefined {
  const early = (window as unknown as { __tracemlEarly?: Record<string, Promise<Response>> }).__tracemlEarly;
  const sent = early?.[path];
  if (early && sent) delete early[path];
  return sent;
}

/** Forget the early requests the page's start did not take over: a later question about the same
 * run must get a fresh answer, not one sent before the app loaded. */
export function discardEarly(): void {
  delete (window as unknown as { __tracemlEarly?: Record<string, Promise<Response>> }).__tracemlEarly;
}

/** The error of a failed answer: the server's one-line `error` when it sent one. */
async function failure(method: string, path: string, res: Response): Promise<ApiError> {
  const type = res.headers.get("Content-Type") ?? "";
  let message = `${method} ${path.split("?")[0]}: HTTP ${res.status}`;
  if (type.includes("json")) {
    try {
      const data = (await res.json()) as { error?: unknown };
      if (typeof data.error === "string") message = data.error;
    } catch {
      // keep the generic message
    }
  }
  if (res.status === 403 && !type.includes("json")) {
    message = "access refused: open the URL with ?token=… that `traceml ui` printed";
  }
  return new ApiError(message, res.status);
}

const UNREACHABLE = "cannot reach the TraceML server (is `traceml ui` still running?)";

async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  const init: RequestInit = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { "Content-Type": "application/json" };
  }
  let res: Response;
  try {
    res = await ((method === "GET" && body === undefined ? takeEarly(path) : undefined) ?? fetch(path, init));
  } catch {
    throw new ApiError(UNREACHABLE, 0);
  }
  if (!res.ok) throw await failure(method, path, res);
  const type = res.headers.get("Content-Type") ?? "";
  if (type.includes("json")) return (await res.json()) as T;
  return (await res.text()) as unknown as T;
}

/** The rows of the whole page, as a streamed listing: the header, then the rows a chunk at a time. */
export interface ListingSink {
  header(res: RunsHeader): void;
  rows(rows: RunRow[]): void;
}

/**
 * GET /api/runs?since=0&stream=1 (docs/viewer-api.md, "Streamed listing"): one JSON object per line,
 * each handed on as soon as its line has arrived, so 100,000 runs come as ~50 parses of a few MB
 * (one parse of 165 MB froze the tab for seconds) and the table draws before the last of them.
 * Resolves with the number of rows once the end line has come; a listing cut off before it fails.
 */
async function streamRuns(sink: ListingSink): Promise<number> {
  const path = "/api/runs?since=0&stream=1";
  let res: Response;
  try {
    res = await fetch(path, { method: "GET", credentials: "same-origin" });
  } catch {
    throw new ApiError(UNREACHABLE, 0);
  }
  if (!res.ok) throw await failure("GET", path, res);
  if (!res.body) throw new ApiError("GET /api/runs: the answer has no body", res.status);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  // A line of ~3 MB comes in many pieces: each piece is searched for a newline once, and the pieces
  // of a line are joined once it is whole (not appended and searched again piece by piece).
  let pieces: string[] = [];
  let lines = 0;
  let end: number | null = null;
  const take = (line: string) => {
    let obj: { runs?: RunRow[]; end?: boolean; count?: number };
    try {
      obj = JSON.parse(line) as typeof obj;
    } catch (err) {
      throw new ApiError(`GET /api/runs: a line of the listing is not JSON (${(err as Error).message})`, 200);
    }
    if (lines++ === 0) sink.header(obj as unknown as RunsHeader);
    else if (obj.end) end = obj.count ?? 0;
    else if (obj.runs) sink.rows(obj.runs);
  };
  // Only the network is "cannot reach": a bad line or a fault in the sink keeps its own message.
  const read = async () => {
    try {
      return await reader.read();
    } catch {
      throw new ApiError(UNREACHABLE, 0);
    }
  };
  for (;;) {
    const { value, done } = await read();
    if (done) break;
    let from = 0;
    let nl = value.indexOf("\n");
    while (nl >= 0) {
      pieces.push(value.slice(from, nl));
      take(pieces.join(""));
      pieces = [];
      from = nl + 1;
      nl = value.indexOf("\n", from);
    }
    if (from < value.length) pieces.push(value.slice(from));
  }
  if (end === null) throw new ApiError("GET /api/runs: the listing was cut off before its end (the server stopped?)", 200);
  return end;
}

/** Rows the first table answer brings (`rows=`): more than a tall screen draws, with its buffer. */
export const FIRST_ROWS = 200;

export interface TableQuery {
  filters: string[];
  sort: string[];
  group: string | null;
  search: string;
  status: string[];
  differing: boolean;
  columns: string[] | null;
  showHidden: boolean;
}

/** The question `q` puts to GET /api/table, as the server reads it from `tableParams(q)`. */
export function tableQuestion(q: TableQuery): TableQuestion {
  const columns = q.columns && q.columns.length ? q.columns.join(",").split(",").filter(Boolean) : [];
  return {
    filters: q.filters,
    sort: q.sort,
    group: q.group || null,
    search: q.search.trim(),
    status: q.status,
    columns: columns.length ? columns : null,
    show_hidden: q.showHidden,
  };
}

/** Whether two table questions are the same (field by field, in a fixed order). */
export function sameQuestion(a: TableQuestion, b: TableQuestion): boolean {
  const flat = (x: TableQuestion) =>
    JSON.stringify([x.filters, x.sort, x.group, x.search, x.status, x.columns, x.show_hidden]);
  return flat(a) === flat(b);
}

export function tableParams(q: TableQuery): URLSearchParams {
  const p = new URLSearchParams();
  for (const f of q.filters) p.append("filter", f);
  for (const s of q.sort) p.append("sort", s);
  if (q.group) p.set("group", q.group);
  if (q.search.trim()) p.set("search", q.search.trim());
  if (q.status.length) p.set("status", q.status.join(","));
  if (q.differing) p.set("differing", "1");
  if (q.columns && q.columns.length) p.set("columns", q.columns.join(","));
  if (q.showHidden) p.set("show_hidden", "1");
  return p;
}

export const api = {
  runs: (since: number) => request<RunsResponse>("GET", `/api/runs?since=${since}`),
  /** Every run, streamed (index.html preloads exactly this URL). */
  listing: streamRuns,
  refresh: (since: number) => request<RunsResponse>("POST", "/api/refresh", { since } satisfies RefreshRequest),
  table: (q: TableQuery, rows = 0) => {
    const p = tableParams(q);
    if (rows) p.set("rows", String(rows));
    return request<TableResponse>("GET", `/api/table?${p.toString()}`);
  },
  /** The table as the remembered view asks for it (index.html preloads exactly this URL). */
  rememberedTable: () => request<RememberedTableResponse>("GET", `/api/table?remembered=1&rows=${FIRST_ROWS}`),
  /** `xRange`: a zoomed chart's visible x range; the buckets then cover only it (finer points).
   *  `groupBy` (Plot by groups): the answer also holds each group's mean and band (`groups`). */
  series: (keys: string[], metrics: string[], x: XAxis, ema: number, xRange?: [number, number], groupBy?: string | null) =>
    request<SeriesResponse>("POST", "/api/series", {
      keys,
      metrics,
      x,
      ema,
      ...(xRange ? { x_range: xRange } : {}),
      ...(groupBy ? { group_by: groupBy } : {}),
    } satisfies SeriesRequest),
  bar: (spec: BarSpec) => request<BarResponse>("POST", "/api/chart", { chart: "bar", ...spec }),
  scatter: (spec: ScatterSpec) => request<ScatterResponse>("POST", "/api/chart", { chart: "scatter", ...spec }),
  box: (spec: BoxSpec) => request<BoxResponse>("POST", "/api/chart", { chart: "box", ...spec }),
  run: (key: string) => request<RunDetail>("GET", `/api/run?key=${encodeURIComponent(key)}`),
  file: (key: string, name: string) =>
    request<string>("GET", `/api/file?key=${encodeURIComponent(key)}&name=${encodeURIComponent(name)}`),
  telemetry: (key: string) => request<TelemetryResponse>("GET", `/api/runs/${encodeURIComponent(key)}/telemetry`),
  performance: (key: string) => request<PerformanceResponse>("GET", `/api/runs/${encodeURIComponent(key)}/performance`),
  performancePage: (key: string) => request<PerformancePage>("GET", `/api/runs/${encodeURIComponent(key)}/performance-page`),
  zoomedBreakdown: (key: string, from: number, to: number) =>
    request<ZoomedBreakdown>("GET", `/api/runs/${encodeURIComponent(key)}/performance-page?from=${encodeURIComponent(from)}&to=${encodeURIComponent(to)}`),
  compare: (key: string, baseline: string) =>
    request<CompareResponse>("GET", `/api/runs/${encodeURIComponent(key)}/compare?baseline=${encodeURIComponent(baseline)}`),
  exportPerformance: (key: string, panel: "step" | "ranks" | "memory" | "gpu", format: "csv" | "png", share = false, heat: "iteration" | "local" | null = null) =>
    request<ExportResponse>("POST", "/api/export/performance", { key, panel, format, share, heat } satisfies ExportPerformanceRequest),
  attachments: (key: string) => request<AttachmentsResponse>("GET", `/api/runs/${encodeURIComponent(key)}/attachments`),
  attachment: (token: string) => request<string>("GET", `/api/attachments/${encodeURIComponent(token)}`),
  hide: (keys: string[], hidden: boolean) =>
    request<{ hidden: string[] }>("POST", "/api/hide", { keys, hidden } satisfies HideRequest),
  getUiState: () => request<Record<string, unknown>>("GET", "/api/ui-state"),
  putUiState: (state: object) => request<{ ok: boolean }>("PUT", "/api/ui-state", state),
  exportTable: (keys: string[], columns: string[]) =>
    request<ExportResponse>("POST", "/api/export/table", { keys, columns } satisfies ExportTableRequest),
  exportChart: (
    spec:
      | ({ chart: "line" } & LineSpec)
      | ({ chart: "bar" } & BarSpec)
      | ({ chart: "scatter" } & ScatterSpec)
      | ({ chart: "box" } & BoxSpec),
    format: "csv" | "png",
  ) => request<ExportResponse>("POST", "/api/export/chart", { ...spec, format }),
};
