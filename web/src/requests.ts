// Generated from the pydantic models in src/traceml_ai/ui/requests.py by
// `python -m traceml_ai.ui.requests > web/src/requests.ts`; do not edit
// (tests/ui/test_requests.py checks it).

/** `POST /api/series`: the runs (keys) and metrics to draw, the x axis, the EMA weight (0 = no smoothing; in [0, 1)) and, for a zoomed chart, the visible x range. */
export interface SeriesRequest {
  keys?: string[];
  metrics?: string[];
  x?: "step" | "epoch" | "time";
  ema?: number;
  x_range?: number[] | null;
  group_by?: string | null;
}

/** `POST /api/refresh`: re-check every run now; `since` is the last change counter the page has (anything but an integer counts as 0: the whole table). */
export interface RefreshRequest {
  since?: number;
}

/** `POST /api/hide`: hide (or, with `hidden: false`, show again) the runs `keys`. */
export interface HideRequest {
  keys?: string[];
  hidden?: boolean;
}

/** `POST /api/export/table`: write the runs `keys` with `columns` as CSV into the cache. */
export interface ExportTableRequest {
  keys?: string[];
  columns?: string[];
}

/** `POST /api/export/performance`: write one Performance panel of the run `key` into the cache, as a 300-DPI PNG or CSV; `share` draws phases as shares of the step, `heat` picks the ranks heatmap's measure (`None`: the view's default). */
export interface ExportPerformanceRequest {
  key?: string;
  panel?: "step" | "ranks" | "memory" | "gpu";
  format?: "png" | "csv";
  share?: boolean;
  heat?: "iteration" | "local" | null;
}
