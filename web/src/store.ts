// Page state: the runs the page holds (merged from GET /api/runs deltas), the last table answer,
// and the remembered view (GET/PUT /api/ui-state). A tiny event bus tells views what changed.

import type { ChartKind, RunRow, RootInfo, RunsHeader, RunsResponse, TableResponse, XAxis } from "./types";

export type View = "overview" | "runs" | "charts" | "compare" | "performance";
export const VIEWS: View[] = ["overview", "runs", "charts", "compare", "performance"];

export const STATUS_SEGMENTS = ["all", "running", "stale", "completed", "failed", "killed", "legacy"] as const;
export type StatusSegment = (typeof STATUS_SEGMENTS)[number];

export interface FilterChip {
  column: string;
  expr: string;
}

export interface ScatterState {
  x: string | null;
  y: string | null;
  size: string | null;
  color: string | null;
  logX: boolean;
  logY: boolean;
}

export interface FieldState {
  field: string | null;
  groupBy: string | null;
}

/** What GET/PUT /api/ui-state remembers. */
export interface UiState {
  view: View;
  selection: string[];
  search: string;
  filters: FilterChip[];
  status: StatusSegment;
  sort: string[];
  group: string | null;
  columns: string[] | null;
  differing: boolean;
  showHidden: boolean;
  metrics: string[] | null;
  x: XAxis;
  ema: number;
  logY: boolean;
  colorBy: string | null;
  chart: ChartKind;
  scatter: ScatterState;
  box: FieldState;
  bar: FieldState;
  compareOnlyDiff: boolean;
  /** Show (and export) at most this many table rows, in table order; null: all. */
  maxRows: number | null;
  /** Line charts of a grouped table: one mean line per group with a band, not one line per run. */
  plotGroups: boolean;
  /** The band around a group's mean: min–max or ± one standard deviation. */
  band: "minmax" | "std";
  /** The run the inspector opened the Performance view on (shown when the selection does not hold
   * it); kept in the address so a reload or a shared link opens the same run. */
  perfRun: string | null;
  /** The step range each run's phase chart (the Performance view's stacked area) is zoomed to, by
   * run key: in the address, so a reload, Back/Forward or a shared link shows the same steps. */
  perfZoom: Record<string, [number, number]>;
  /** The phase chart's scale: milliseconds per step or share of the step (in the address too). */
  perfMode: "ms" | "share";
}

export function defaultUiState(): UiState {
  return {
    view: "runs",
    selection: [],
    search: "",
    filters: [],
    status: "all",
    sort: [],
    group: null,
    columns: null,
    differing: false,
    showHidden: false,
    metrics: null,
    x: "step",
    ema: 0,
    logY: false,
    colorBy: null,
    chart: "line",
    scatter: { x: null, y: null, size: null, color: null, logX: false, logY: false },
    box: { field: null, groupBy: null },
    bar: { field: null, groupBy: null },
    compareOnlyDiff: false,
    maxRows: null,
    plotGroups: false,
    band: "minmax",
    perfRun: null,
    perfZoom: {},
    perfMode: "ms",
  };
}

// -- validation of a remembered view (any JSON object may come back) ------------------------------

const isStr = (v: unknown): v is string => typeof v === "string";
const strOrNull = (v: unknown, d: string | null): string | null => (v === null ? null : isStr(v) ? v : d);
const bool = (v: unknown, d: boolean): boolean => (typeof v === "boolean" ? v : d);
const strList = (v: unknown): string[] | null => (Array.isArray(v) && v.every(isStr) ? v : null);
/** At most this many runs keep a phase-chart zoom (the most recently zoomed ones). */
export const MAX_PERF_ZOOMS = 20;
/** Step ranges by run key: a pair of finite steps, low before high; anything else left out. */
function stepRanges(v: unknown): Record<string, [number, number]> {
  const out: Record<string, [number, number]> = {};
  if (!v || typeof v !== "object" || Array.isArray(v)) return out;
  const ok = Object.entries(v as Record<string, unknown>).filter(
    (e): e is [string, [number, number]] =>
      Array.isArray(e[1]) && e[1].length === 2 && e[1].every((x) => typeof x === "number" && Number.isFinite(x)) && e[1][0] < e[1][1],
  );
  for (const [k, r] of ok.slice(-MAX_PERF_ZOOMS)) out[k] = [r[0], r[1]];
  return out;
}

export function parseUiState(raw: unknown): UiState {
  const d = defaultUiState();
  if (!raw || typeof raw !== "object" || Array.isArray(raw)) return d;
  const r = raw as Record<string, unknown>;
  const scatter = (r.scatter && typeof r.scatter === "object" ? r.scatter : {}) as Record<string, unknown>;
  const box = (r.box && typeof r.box === "object" ? r.box : {}) as Record<string, unknown>;
  const bar = (r.bar && typeof r.bar === "object" ? r.bar : {}) as Record<string, unknown>;
  const filters = Array.isArray(r.filters)
    ? r.filters.filter(
        (f): f is FilterChip =>
          !!f && typeof f === "object" && isStr((f as FilterChip).column) && isStr((f as FilterChip).expr),
      )
    : [];
  return {
    view: VIEWS.includes(r.view as View) ? (r.view as View) : d.view,
    selection: strList(r.selection) ?? [],
    search: isStr(r.search) ? r.search : "",
    filters: filters.map((f) => ({ column: f.column, expr: f.expr })),
    status: (STATUS_SEGMENTS as readonly string[]).includes(r.status as string) ? (r.status as StatusSegment) : "all",
    sort: strList(r.sort) ?? [],
    group: strOrNull(r.group, null),
    columns: strList(r.columns),
    differing: bool(r.differing, false),
    showHidden: bool(r.showHidden, false),
    metrics: strList(r.metrics),
    x: r.x === "epoch" || r.x === "time" ? r.x : "step",
    ema: typeof r.ema === "number" && r.ema >= 0 && r.ema <= 0.99 ? r.ema : 0,
    logY: bool(r.logY, false),
    colorBy: strOrNull(r.colorBy, null),
    chart: r.chart === "scatter" || r.chart === "box" || r.chart === "bar" ? r.chart : "line",
    scatter: {
      x: strOrNull(scatter.x, null),
      y: strOrNull(scatter.y, null),
      size: strOrNull(scatter.size, null),
      color: strOrNull(scatter.color, null),
      logX: bool(scatter.logX, false),
      logY: bool(scatter.logY, false),
    },
    box: { field: strOrNull(box.field, null), groupBy: strOrNull(box.groupBy, null) },
    bar: { field: strOrNull(bar.field, null), groupBy: strOrNull(bar.groupBy, null) },
    compareOnlyDiff: bool(r.compareOnlyDiff, false),
    maxRows: typeof r.maxRows === "number" && Number.isInteger(r.maxRows) && r.maxRows >= 1 ? r.maxRows : null,
    plotGroups: bool(r.plotGroups, false),
    band: r.band === "std" ? "std" : "minmax",
    perfRun: strOrNull(r.perfRun, null),
    perfZoom: stepRanges(r.perfZoom),
    perfMode: r.perfMode === "share" ? "share" : "ms",
  };
}

// -- the store --------------------------------------------------------------------------------------

/** How many run listings a selected key that was never listed (from an address) waits in the
 * selection for its run before it is dropped: the server lists a new run folder within a poll or two. */
const UNLISTED_LISTINGS = 4;

export type Topic =
  | "runs" // run data changed (payload: changed keys)
  | "rows" // rows of a streamed listing arrived; nothing changed on the server (payload: their keys)
  | "listed" // a streamed listing ended
  | "table" // a new table answer
  | "selection"
  | "view"
  | "ui" // any remembered setting changed
  | "inspector"
  | "live" // events stream connected/disconnected
  | "restored" // the whole view was replaced (Back/Forward): views re-read their controls
  | "polled"; // the server polled (changed or not): the "refreshed" time moved

type Listener = (detail?: unknown) => void;

export const PALETTE_SIZE = 12;
export const MAX_SERIES_RUNS = 30;
/** Plot by groups averages up to this many selected runs (the server's MAX_GROUP_RUNS). */
export const MAX_GROUP_RUNS = 2000;

export class Store {
  ui: UiState = defaultUiState();
  runs = new Map<string, RunRow>();
  version = 0;
  hidden = new Set<string>();
  roots: RootInfo[] = [];
  warnings: string[] = [];
  refreshedAt: string | null = null;
  /** True while a view from the address (Back/Forward) is being applied: its selection change is not the user's. */
  restoring = false;
  refreshInterval = 5;
  staleAfter = 60;
  table: TableResponse | null = null;
  inspector: string | null = null;
  live = false;
  /** The event stream failed (the server stopped, or the network): the page says so and retries. */
  disconnected = false;
  /** While disconnected: the server answers but refuses this page's token (a restarted
   *  traceml ui has a new one), so retrying cannot help until its printed URL is opened. */
  tokenRefused = false;
  private colorSlots = new Map<string, number>();
  private listeners = new Map<Topic, Set<Listener>>();

  on(topic: Topic, fn: Listener): void {
    let set = this.listeners.get(topic);
    if (!set) this.listeners.set(topic, (set = new Set()));
    set.add(fn);
  }

  emit(topic: Topic, detail?: unknown): void {
    for (const fn of this.listeners.get(topic) ?? []) {
      try {
        fn(detail);
      } catch (err) {
        console.error(err);
      }
    }
  }

  /**
   * Merge a GET /api/runs (or POST /api/refresh) answer; returns the changed, removed, hidden or
   * shown-again keys (empty when the answer changed nothing).
   */
  applyRuns(res: RunsResponse): string[] {
    const changed: string[] = [];
    if (res.full) {
      for (const k of this.runs.keys()) changed.push(k);
      this.runs.clear();
    }
    for (const r of res.runs) {
      this.runs.set(r.key, r);
      changed.push(r.key);
    }
    changed.push(...this.applyHeader(res));
    this.settleSelection();
    return changed;
  }

  /**
   * A streamed full listing begins (GET /api/runs?stream=1): the runs the page holds stay until the
   * listing has ended (the first table's rows among them), its header applies when it comes
   * (listingHeader), and the table draws rows whose run has not arrived yet with empty cells
   * (`listing` is true until the end).
   */
  startListing(): void {
    this.listing = true;
    this.listingCount = null;
    this.listed = new Set();
  }

  /** The header of the streamed listing under way came; returns the removed, hidden or shown-again keys. */
  listingHeader(res: RunsHeader): string[] {
    this.listingCount = res.count ?? null;
    return this.applyHeader(res);
  }

  /** A chunk of a streamed listing arrived; returns its keys (for the "rows" topic). */
  addListed(rows: RunRow[]): string[] {
    const keys = new Array<string>(rows.length);
    for (let i = 0; i < rows.length; i++) {
      const r = rows[i]!;
      this.runs.set(r.key, r);
      this.listed?.add(r.key);
      keys[i] = r.key;
    }
    return keys;
  }

  /** The streamed listing ended: when `complete`, the runs it did not list went (returns their
   *  keys); a listing cut off removes nothing. */
  endListing(complete: boolean): string[] {
    const listed = this.listed;
    const gone: string[] = [];
    if (listed && complete) for (const k of this.runs.keys()) if (!listed.has(k)) gone.push(k);
    for (const k of gone) this.runs.delete(k);
    this.listing = false;
    this.listed = null;
    this.settleSelection();
    return gone;
  }

  /** Rows that came with a table answer (its first screen) for runs the page does not hold yet. */
  addRows(rows: RunRow[] | undefined): string[] {
    const added: string[] = [];
    for (const r of rows ?? []) {
      if (this.runs.has(r.key)) continue;
      this.runs.set(r.key, r);
      added.push(r.key);
    }
    return added;
  }

  /** Whether a streamed full listing is still arriving (see beginListing). */
  listing = false;
  /** How many rows the listing under way brings (its header's `count`). */
  listingCount: number | null = null;
  /** The keys the streamed listing under way brought so far. */
  private listed: Set<string> | null = null;

  /** What a listing's header says besides its rows; returns the removed, hidden or shown-again keys. */
  private applyHeader(res: RunsHeader): string[] {
    const changed: string[] = [];
    for (const k of res.removed) {
      if (this.runs.delete(k)) changed.push(k);
    }
    this.version = res.version;
    const hidden = new Set(res.hidden);
    // A run hidden or shown again (e.g. from another tab) changed too.
    for (const k of hidden) if (!this.hidden.has(k)) changed.push(k);
    for (const k of this.hidden) if (!hidden.has(k)) changed.push(k);
    this.hidden = hidden;
    this.roots = res.roots;
    this.warnings = res.warnings;
    this.notePolled(res.refreshed_at);
    this.refreshInterval = res.refresh_interval_seconds;
    this.staleAfter = res.stale_after_seconds;
    return changed;
  }

  /** After a listing: the selection without the runs that went. */
  private settleSelection(): void {
    if (this.listing) return; // (a streamed listing settles it at its end)
    // Runs that disappeared leave the selection. A key never listed (from an address, for a run
    // the server has not found yet) stays for a few listings, so the run is shown once it is
    // listed (review 13i: it was dropped at once, and the address with it).
    const sel = this.ui.selection.filter((k) => {
      if (this.runs.has(k)) {
        this.unlisted.delete(k);
        return true;
      }
      if (this.listedOnce.has(k)) return false;
      const seen = (this.unlisted.get(k) ?? 0) + 1;
      this.unlisted.set(k, seen);
      return seen <= UNLISTED_LISTINGS;
    });
    for (const k of this.runs.keys()) this.listedOnce.add(k);
    if (sel.length !== this.ui.selection.length) this.setSelection(sel);
  }

  /** ``keys`` less those of runs that went: a key never listed (from an address) is kept while it
   * waits for its run (see applyRuns). */
  selectable(keys: string[]): string[] {
    return keys.filter((k) => this.runs.has(k) || (!this.listedOnce.has(k) && (this.unlisted.get(k) ?? 0) <= UNLISTED_LISTINGS));
  }

  /** Selected keys not listed yet, with the listings that came without them. */
  private unlisted = new Map<string, number>();
  /** Every key a listing held: such a key missing from a later listing is a run that went. */
  private listedOnce = new Set<string>();

  /** The server's last poll time (ISO-8601 UTC); never moves back (an older answer can come late). */
  notePolled(iso: string | null): void {
    if (!iso || (this.refreshedAt && iso < this.refreshedAt)) return;
    this.refreshedAt = iso;
    this.emit("polled");
  }

  /** How many runs the user may see, in all and per display status (one pass over the runs). */
  statusCounts(): { total: number; by: Map<string, number> } {
    const by = new Map<string, number>();
    let total = 0;
    const all = this.ui.showHidden || this.hidden.size === 0;
    for (const r of this.runs.values()) {
      if (!all && this.hidden.has(r.key)) continue;
      total++;
      by.set(r.display_status, (by.get(r.display_status) ?? 0) + 1);
    }
    return { total, by };
  }

  /** Hidden runs that are still on disk. */
  hiddenCount(): number {
    let n = 0;
    for (const k of this.hidden) if (this.runs.has(k)) n++;
    return n;
  }

  /** Runs the user may see (hidden ones only with "show hidden runs"). */
  visibleRuns(): RunRow[] {
    const out: RunRow[] = [];
    for (const r of this.runs.values()) if (this.ui.showHidden || !this.hidden.has(r.key)) out.push(r);
    return out;
  }

  set<K extends keyof UiState>(key: K, value: UiState[K]): void {
    this.ui[key] = value;
    this.emit("ui", key);
  }

  setView(view: View): void {
    if (this.ui.view === view) return;
    this.set("view", view);
    this.emit("view");
  }

  isSelected(key: string): boolean {
    return this.selectionSet.has(key);
  }

  private selectionSet = new Set<string>();

  setSelection(keys: string[]): void {
    const uniq = [...new Set(keys)];
    this.ui.selection = uniq;
    this.selectionSet = new Set(uniq);
    this.assignColors();
    this.emit("selection");
    this.emit("ui", "selection");
  }

  toggleSelected(key: string, on?: boolean): void {
    const want = on ?? !this.selectionSet.has(key);
    if (want === this.selectionSet.has(key)) return;
    this.setSelection(want ? [...this.ui.selection, key] : this.ui.selection.filter((k) => k !== key));
  }

  selectMany(keys: string[], on: boolean): void {
    if (on) this.setSelection([...this.ui.selection, ...keys]);
    else {
      const drop = new Set(keys);
      this.setSelection(this.ui.selection.filter((k) => !drop.has(k)));
    }
  }

  /**
   * A run's palette slot: given when first coloured (the lowest slot no selected run holds), kept
   * after, unless the run comes back into a selection where another run now holds it.
   */
  colorOf(key: string): number {
    let slot = this.colorSlots.get(key);
    if (slot === undefined) {
      slot = this.leastUsedSlot();
      this.colorSlots.set(key, slot);
    }
    return slot;
  }

  /** The lowest slot among the least used by the selected runs (with ≤ PALETTE_SIZE of them: a free one). */
  private leastUsedSlot(): number {
    const use = new Array<number>(PALETTE_SIZE).fill(0);
    for (const k of this.ui.selection) {
      const s = this.colorSlots.get(k);
      if (s !== undefined) use[s] = (use[s] ?? 0) + 1;
    }
    let best = 0;
    for (let i = 1; i < PALETTE_SIZE; i++) if ((use[i] ?? 0) < (use[best] ?? 0)) best = i;
    return best;
  }

  /** The selection as last coloured: its runs keep their slots when a run joins it. */
  private colored: string[] = [];

  /**
   * Give every selected run a slot no other selected run holds (while the palette lasts). Runs
   * that were selected before keep theirs; one joining (a new run, or one selected again whose old
   * slot another run took meanwhile) gets the lowest free slot.
   */
  private assignColors(): void {
    const before = new Set(this.colored);
    const order = [...this.ui.selection.filter((k) => before.has(k)), ...this.ui.selection.filter((k) => !before.has(k))];
    const taken = new Map<number, number>();
    for (const k of order) {
      let slot = this.colorSlots.get(k);
      if (slot === undefined || ((taken.get(slot) ?? 0) > 0 && taken.size < PALETTE_SIZE)) {
        const use = new Array<number>(PALETTE_SIZE).fill(0);
        for (const [s, n] of taken) use[s] = n;
        slot = 0;
        for (let i = 1; i < PALETTE_SIZE; i++) if ((use[i] ?? 0) < (use[slot] ?? 0)) slot = i;
        this.colorSlots.set(k, slot);
      }
      taken.set(slot, (taken.get(slot) ?? 0) + 1);
    }
    this.colored = [...this.ui.selection];
  }

  openInspector(key: string | null): void {
    this.inspector = key;
    this.emit("inspector");
  }
}

export const store = new Store();
