// Generated from the pydantic models in src/traceml_ai/ui/requests.py by
// `python -m traceml_ai.ui.requests > web/src/requests.ts`; do not edit
// (tests/ui/test_requests.py checks it).

/** `POST /api/series`: the runs (keys) and metrics to draw, the x axis, and the EMA weight (0 = no smoothing; in [0, 1)). */
export interface SeriesRequest {
  keys?: string[];
  metrics?: string[];
  x?: "step" | "epoch" | "time";
  ema?: number;
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
