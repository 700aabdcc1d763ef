// Line charts (uPlot): one chart per metric, one line per selected run (at most 30), x = step, epoch
// or relative wall time, optional log y, EMA smoothing computed in Python (raw line faint, smoothed
// solid), colour by run or by a column's value, drag to zoom (kept across live updates, synced
// across charts), nulls as gaps with isolated points still drawn, legend click hides a run.

import type uPlot from "uplot";
import { api } from "../api";
import { runExport } from "../actions";
import { cellValue, DEFAULT_METRICS, METRIC_GROUPS, metricGroup, runLabels } from "../columns";
import { debounce, h, replace } from "../dom";
import { fmtNum, fmtTicks, fmtWallTime, rawText, timeTicks, timeUnit } from "../format";
import { icon } from "../icons";
import { MAX_GROUP_RUNS, MAX_SERIES_RUNS, store } from "../store";
import type { GroupSeries, LineSpec, Series, SeriesResponse, XAxis } from "../types";
import { button, emptyState, errorText, field, paletteColor, popover, select, swatch, toggle, token, withAlpha } from "../ui";
import { columnOptions } from "./runs";

const X_LABEL: Record<XAxis, string> = { step: "step", epoch: "epoch", time: "wall time" };

/** The x axis label; on wall time it says what the time counts from (the server's `time_label`:
 * the runs' `started_at` or their first logged row) and names the unit the ticks read in (s, min or
 * h), once. */
function xLabel(u: uPlot, x: XAxis, timeLabel: string | null | undefined): string {
  if (x !== "time") return X_LABEL[x];
  const sc = u.scales.x;
  const base = (timeLabel ?? X_LABEL.time).replace(/ \(s\)$/, "");
  return `${base} (${timeUnit(sc?.min ?? 0, sc?.max ?? 0).unit})`;
}

// uPlot is evaluated on first use, not with the page's script: its module sets up Intl number and
// date formatters, which cost as much as the rest of the script together, and the first screen (the
// run table) draws no chart. The page starts loading it once that screen is painted.
let UPlot: typeof uPlot | null = null;
let uPlotLoading: Promise<typeof uPlot> | null = null;

/** Load uPlot (once); resolves when charts can be drawn. */
/** Puts a chart's hover tooltip beside the cursor, on its left when it would overflow the plot. */
export function placePlotTip(el: HTMLElement, u: uPlot): void {
  const left = (u.cursor.left ?? 0) + 14;
  const w = el.offsetWidth;
  const plotW = u.over.clientWidth;
  el.style.left = `${(left + w > plotW ? (u.cursor.left ?? 0) - w - 14 : left) + u.over.offsetLeft}px`;
  el.style.top = `${u.over.offsetTop + 8}px`;
}

export function loadUPlot(): Promise<typeof uPlot> {
  uPlotLoading ??= import("uplot").then((m) => (UPlot = m.default));
  return uPlotLoading;
}

/** Indices of values that have no drawn neighbour (a gap or nothing on both sides): drawn as points. */
export function isolatedPoints(ys: (number | null | undefined)[]): number[] {
  const out: number[] = [];
  let prev: number | null | undefined = undefined; // last defined value before i
  for (let i = 0; i < ys.length; i++) {
    const v = ys[i];
    if (v === undefined) continue;
    if (v !== null) {
      let j = i + 1;
      while (j < ys.length && ys[j] === undefined) j++;
      const next = j < ys.length ? ys[j] : undefined;
      if ((prev === undefined || prev === null) && (next === undefined || next === null)) out.push(i);
    }
    prev = v;
  }
  return out;
}

/** Y tick labels; on a log axis only decades (and 2, 5 when the range is under two decades). */
function logTickLabels(u: uPlot, splits: (number | null)[], log: boolean): string[] {
  if (!log) return fmtTicks(splits);
  const min = u.scales.y?.min ?? 1;
  const max = u.scales.y?.max ?? 10;
  const decades = Math.log10(Math.max(max, 1e-300)) - Math.log10(Math.max(min, 1e-300));
  const fine = fmtTicks(splits);
  return splits.map((v, i) => {
    if (v === null || v <= 0) return "";
    const m = Math.round(v / Math.pow(10, Math.floor(Math.log10(v))) * 1000) / 1000;
    if (decades < 1) return fine[i]!;
    return m === 1 || (decades < 2 && (m === 2 || m === 5)) ? fmtNum(v) : "";
  });
}

/** The y axis's width: enough for the labels a narrow zoom needs (0.999906), never cut at the left. */
function yAxisSize(_u: uPlot, values: string[] | null): number {
  return Math.max(56, 16 + 6.5 * Math.max(0, ...(values ?? []).map((v) => v.length)));
}

/** How far apart rows logged at the same wall time are drawn on the time axis (seconds). */
const TIME_TIE_S = 1e-6;

/** Tick steps of a step axis: whole numbers, 1, 2 and 5 times a power of ten. */
const STEP_INCRS = Array.from({ length: 10 }, (_, k) => [1, 2, 5].map((m) => m * 10 ** k)).flat();

/** One group's drawn points, for its tooltip (Plot by groups). */
interface GroupTipStats {
  label: string;
  color: string;
  step: number[];
  mean: (number | null)[];
  lo: (number | null)[];
  hi: (number | null)[];
  n: number[];
}

/** The index of the x nearest `x` among `xs` (ascending; the earlier on a tie), or -1 when empty. */
export function nearestIndex(xs: number[], x: number): number {
  let lo = 0;
  let hi = xs.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (xs[mid]! < x) lo = mid + 1;
    else hi = mid;
  }
  if (lo === xs.length) return xs.length - 1;
  return lo > 0 && x - xs[lo - 1]! <= xs[lo]! - x ? lo - 1 : lo;
}

/** True when `x` lies within the first and last of `xs` (ascending). */
function spans(xs: number[], x: number): boolean {
  return xs.length > 0 && x >= xs[0]! && x <= xs[xs.length - 1]!;
}

/** One run's drawn line, for the tooltip. */
interface TipLine {
  name: string;
  color: string;
  xs: number[];
  ys: (number | null)[];
}

/** A group of the plotted runs (Plot by groups). */
interface PlotGroup {
  label: string;
  color: string;
  keys: string[];
}

export class LineCharts {
  readonly toolbar = h("div", { class: "toolbar chart-toolbar" });
  private grid = h("div", { class: "line-grid" });
  private legend = h("div", { class: "legend", testid: "chart-legend" });
  private note = h("div", { class: "chart-note" });
  private plots: uPlot[] = [];
  private data: SeriesResponse | null = null;
  private fetchedFor = "";
  private seq = 0;
  private zoom: { min: number; max: number } | null = null;
  private applying = false;
  private hiddenRuns = new Set<string>();
  private visible = false;
  private resizeObs: ResizeObserver;
  private error: string | null = null;
  /** Finer points for the zoomed range (when the full series were downsampled), and that range. */
  private zoomData: { range: { min: number; max: number }; res: SeriesResponse } | null = null;
  private zoomSeq = 0;
  private fetchZoomSoon = debounce(() => void this.fetchZoom(), 250);

  constructor(host: HTMLElement) {
    host.append(this.note, this.legend, this.grid);
    this.resizeObs = new ResizeObserver(debounce(() => this.resize(), 80));
    this.resizeObs.observe(this.grid);
  }

  setVisible(v: boolean): void {
    this.visible = v;
    if (v) this.refresh();
  }

  /** Plotted runs: the selection in order, at most 30 lines; with Plot by groups every selected
   *  run (up to MAX_GROUP_RUNS) is in its group's mean and band. */
  keys(): string[] {
    return store.ui.selection.filter((k) => store.runs.has(k)).slice(0, this.groupMode() ? MAX_GROUP_RUNS : MAX_SERIES_RUNS);
  }

  availableMetrics(): string[] {
    const sel = this.keys();
    const runs = sel.length ? sel.map((k) => store.runs.get(k)!) : store.visibleRuns();
    const names = new Set<string>();
    for (const r of runs) for (const m of r.metric_names) names.add(m);
    return [...names].sort();
  }

  metrics(): string[] {
    const avail = this.availableMetrics();
    if (store.ui.metrics) return store.ui.metrics;
    const defaults = DEFAULT_METRICS.filter((m) => avail.includes(m));
    return defaults.length ? defaults : avail.slice(0, 3);
  }

  /** What the CSV/PNG export draws: the runs shown on screen (legend-hidden ones left out), one
   *  line per run, or with "Plot by groups" one mean line per group (`group_by`) inside the band
   *  shown (`band`), as on screen; the chart CSV then holds group, step, mean, min, max, std and
   *  n_runs. */
  spec(): LineSpec {
    return {
      keys: this.keys().filter((k) => !this.hiddenRuns.has(k)),
      metrics: this.metrics(),
      x: this.xAxis(),
      ema: store.ui.ema,
      log_y: store.ui.logY,
      group_by: this.groupMode() ? store.ui.group : null,
      band: store.ui.band,
    };
  }

  /** Plot by groups: the table is grouped and the toggle is on (means per group, over steps). */
  groupMode(): boolean {
    return store.ui.plotGroups && store.ui.group !== null;
  }

  /** The column whose groups the server averages (Plot by groups), or null. */
  groupBy(): string | null {
    return this.groupMode() ? store.ui.group : null;
  }

  /** The x axis drawn: group means are taken step by step (as the CSV and PNG exports do). */
  xAxis(): XAxis {
    return this.groupMode() ? "step" : store.ui.x;
  }

  /** Re-fetch when what is plotted changed (or `force`), else just redraw. */
  refresh(force = false): void {
    this.renderToolbar();
    if (!this.visible) return;
    const keys = this.keys();
    const metrics = this.metrics();
    const sig = JSON.stringify([keys, metrics, this.xAxis(), store.ui.ema, this.groupBy()]);
    if (force || sig !== this.fetchedFor) void this.fetch(sig, keys, metrics);
    else this.draw();
  }

  /** Runs changed on disk: re-fetch when a plotted run is among them. */
  onRunsChanged(changed: string[]): void {
    const plotted = new Set(this.keys());
    if (changed.some((k) => plotted.has(k))) this.refresh(true);
    else this.renderToolbar();
  }

  private async fetch(sig: string, keys: string[], metrics: string[]): Promise<void> {
    const seq = ++this.seq;
    if (!keys.length || !metrics.length) {
      this.data = null;
      this.fetchedFor = sig;
      this.error = null;
      this.draw();
      return;
    }
    try {
      const res = await api.series(keys, metrics, this.xAxis(), store.ui.ema, undefined, this.groupBy());
      if (seq !== this.seq) return;
      // A zoom range on another x axis means nothing on this one.
      const prevX = this.fetchedFor ? (JSON.parse(this.fetchedFor) as unknown[])[2] : null;
      if (prevX !== this.xAxis()) this.zoom = null;
      this.data = res;
      this.fetchedFor = sig;
      this.error = null;
      this.zoomData = null;
      if (this.zoom) this.fetchZoomSoon();
    } catch (err) {
      if (seq !== this.seq) return;
      this.error = errorText(err);
    }
    this.draw();
  }

  /**
   * Zoomed into series that were downsampled: ask for the visible range again, bucketed over that
   * range only (the same min/max buckets, so finer points), and draw those while the zoom lasts.
   */
  private async fetchZoom(): Promise<void> {
    const zoom = this.zoom;
    const data = this.data;
    if (!zoom || !data || !(data.series.some((s) => s.downsampled) || data.groups?.some((g) => g.downsampled))) return;
    if (this.zoomData && this.zoomData.range.min === zoom.min && this.zoomData.range.max === zoom.max) return;
    const seq = ++this.zoomSeq;
    const sig = this.fetchedFor;
    try {
      const res = await api.series(this.keys(), this.metrics(), this.xAxis(), store.ui.ema, [zoom.min, zoom.max], this.groupBy());
      if (seq !== this.zoomSeq || sig !== this.fetchedFor || this.zoom !== zoom) return;
      this.zoomData = { range: zoom, res };
      this.draw();
    } catch (err) {
      console.warn("finer points for the zoom not loaded:", errorText(err));
    }
  }

  /** The series to draw: the zoom's finer ones while zoomed into the range they cover. */
  private shownData(): SeriesResponse | null {
    const z = this.zoomData;
    if (z && this.zoom && z.range.min === this.zoom.min && z.range.max === this.zoom.max) return z.res;
    return this.data;
  }

  // -- toolbar --------------------------------------------------------------------------------------

  renderToolbar(): void {
    const metrics = this.metrics();
    const pickBtn = button(`Metrics (${metrics.length})`, {
      icon: "charts",
      testid: "metric-picker",
      onClick: () => this.pickMetrics(pickBtn),
    });
    const xSel = select(
      [
        { value: "step", label: "step" },
        { value: "epoch", label: "epoch" },
        { value: "time", label: "relative wall time" },
      ],
      // While groups are plotted the chart is drawn by step: show that; the user's choice stays
      // remembered (store.ui.x) and comes back when groups are turned off.
      this.xAxis(),
      (v) => {
        store.set("x", v as XAxis);
        this.zoom = null;
        this.refresh();
      },
      "x-axis",
    );
    if (this.groupMode()) {
      xSel.disabled = true;
      xSel.title = "Group means are taken step by step";
    }
    // Plot by groups: offered while the table is grouped.
    const grouped = store.ui.group !== null;
    const byGroups = grouped
      ? toggle(
          "Plot by groups",
          store.ui.plotGroups,
          (on) => {
            store.set("plotGroups", on);
            this.zoom = null;
            this.refresh();
          },
          "plot-groups",
          `One line per group of ${store.ui.group}: the mean of its plotted runs at each step, with a band`,
        )
      : null;
    const band =
      grouped && store.ui.plotGroups
        ? select(
            [
              { value: "minmax", label: "min–max band" },
              { value: "std", label: "± population std band" },
            ],
            store.ui.band,
            (v) => {
              store.set("band", v === "std" ? "std" : "minmax");
              this.draw();
            },
            "band",
          )
        : null;
    const logY = toggle(
      "Log y",
      store.ui.logY,
      (on) => {
        store.set("logY", on);
        this.draw();
      },
      "log-y",
    );
    const emaVal = h("span", { class: "ema-value", testid: "ema-value", text: store.ui.ema.toFixed(2) });
    const ema = h("input", {
      type: "range",
      class: "range",
      testid: "ema",
      attrs: { min: 0, max: 0.99, step: 0.01, "aria-label": "EMA smoothing" },
    });
    ema.value = String(store.ui.ema);
    const applyEma = debounce(() => this.refresh(), 250);
    ema.addEventListener("input", () => {
      const v = Math.min(0.99, Math.max(0, Number(ema.value)));
      emaVal.textContent = v.toFixed(2);
      store.set("ema", v);
      applyEma();
    });
    const colorBy = select(
      columnOptions(store.table?.columns.available ?? [], "each run"),
      store.ui.colorBy ?? "",
      (v) => {
        store.set("colorBy", v || null);
        this.draw();
      },
      "color-by",
      "Colour the lines by a column's value",
    );
    const reset = button("", {
      icon: "zoomOut",
      kind: "ghost",
      title: "Reset zoom (or double-click a chart)",
      testid: "reset-zoom",
      disabled: !this.zoom,
      onClick: () => {
        this.zoom = null;
        this.draw();
      },
    });
    replace(
      this.toolbar,
      pickBtn,
      field("X", xSel),
      field("Smoothing", h("span", { class: "ema" }, ema, emaVal), "field-ema"),
      logY,
      this.groupMode() ? null : field("Colour", colorBy),
      byGroups,
      band,
      reset,
    );
  }

  private pickMetrics(anchor: HTMLElement): void {
    const avail = this.availableMetrics();
    let chosen = [...this.metrics()];
    const list = h("div", { class: "metric-list" });
    const find = h("input", { type: "search", class: "input", testid: "metric-search", attrs: { placeholder: "Find a metric…", spellcheck: "false" } });
    const commit = () => {
      store.set("metrics", chosen);
      this.refresh();
    };
    const draw = () => {
      const q = find.value.trim().toLowerCase();
      const parts: HTMLElement[] = [];
      for (const g of METRIC_GROUPS) {
        const ms = avail.filter((m) => metricGroup(m) === g && (!q || m.toLowerCase().includes(q)));
        if (!ms.length) continue;
        parts.push(h("div", { class: "col-list-head", text: g === "other" ? "other" : `${g}/` }));
        for (const m of ms) {
          const cb = h("input", { type: "checkbox", testid: "metric-option", data: { metric: m } });
          cb.checked = chosen.includes(m);
          cb.addEventListener("change", () => {
            chosen = cb.checked ? [...chosen, m] : chosen.filter((x) => x !== m);
            commit();
          });
          parts.push(h("label", { class: "col-list-item" }, cb, h("span", { text: m })));
        }
      }
      if (!parts.length) parts.push(h("div", { class: "muted", text: avail.length ? "No metric matches." : "The runs logged no metrics." }));
      replace(list, ...parts);
    };
    find.addEventListener("input", draw);
    draw();
    popover(
      anchor,
      h(
        "div",
        { class: "col-pop" },
        h(
          "div",
          { class: "pop-row" },
          find,
          button("Defaults", {
            small: true,
            kind: "ghost",
            testid: "metrics-default",
            onClick: () => {
              store.set("metrics", null);
              chosen = [...this.metrics()];
              this.refresh();
              draw();
            },
          }),
        ),
        list,
      ),
      "metric-popover",
    );
  }

  // -- colours --------------------------------------------------------------------------------------

  /** Colour of each plotted run, and the group legend when colouring by a column. */
  private colors(keys: string[]): { byKey: Map<string, string>; groups: [string, string][] } {
    const byKey = new Map<string, string>();
    const groups: [string, string][] = [];
    const col = store.ui.colorBy;
    if (!col) {
      for (const k of keys) byKey.set(k, paletteColor(store.colorOf(k)));
      return { byKey, groups };
    }
    const index = new Map<string, number>();
    for (const k of keys) {
      const run = store.runs.get(k);
      const v = run ? cellValue(run, col) : null;
      const label = v === null || v === "" ? "(none)" : rawText(v);
      let i = index.get(label);
      if (i === undefined) {
        i = index.size;
        index.set(label, i);
        groups.push([label, paletteColor(i)]);
      }
      byKey.set(k, paletteColor(i));
    }
    return { byKey, groups };
  }

  // -- drawing --------------------------------------------------------------------------------------

  private destroyPlots(): void {
    for (const p of this.plots) p.destroy();
    this.plots = [];
  }

  draw(): void {
    this.renderToolbar();
    this.destroyPlots();
    const selected = store.ui.selection.filter((k) => store.runs.has(k));
    const keys = this.keys();
    const cap = this.groupMode() ? MAX_GROUP_RUNS : MAX_SERIES_RUNS;
    replace(
      this.note,
      selected.length > cap
        ? h(
            "div",
            { class: "callout callout-warn", testid: "series-cap" },
            icon("warning"),
            this.groupMode()
              ? `${selected.length} runs are selected; the group means are of the first ${cap} of them.`
              : `${selected.length} runs are selected; line charts show the first ${cap} (Plot by groups averages all of them).`,
          )
        : null,
      this.error ? h("div", { class: "callout callout-error", testid: "series-error", text: this.error }) : null,
    );
    if (!keys.length) {
      replace(this.legend);
      replace(
        this.grid,
        emptyState(
          "Select runs to plot their metrics",
          "Tick runs in the Runs table (up to 30 are plotted), or tick a whole group.",
          button("Go to Runs", { kind: "primary", onClick: () => store.setView("runs") }),
          "chart-empty",
        ),
      );
      return;
    }
    const metrics = this.metrics();
    if (!metrics.length) {
      replace(this.legend);
      replace(this.grid, emptyState("No metrics to plot", "The selected runs logged no metrics yet.", undefined, "chart-empty"));
      return;
    }
    const data = this.shownData();
    const zoomed = data !== this.data;
    const grouping = this.groupMode() ? this.groupsOf(data) : null;
    const { byKey, groups } = this.colors(keys);
    if (grouping) this.renderGroupLegend(grouping);
    else this.renderLegend(keys, byKey, groups);
    const cards: HTMLElement[] = [];
    const mounts: { el: HTMLElement; series: Series[]; groups: GroupSeries[] }[] = [];
    for (const metric of metrics) {
      const series = (data?.series ?? []).filter((s) => s.metric === metric && byKey.has(s.key));
      const gs = grouping ? (data?.groups ?? []).filter((g) => g.metric === metric) : [];
      const plotEl = h("div", { class: "plot" });
      const drawn: { raw_points: number; downsampled: boolean }[] = grouping ? gs : series;
      const raw = drawn.reduce((n, s) => n + s.raw_points, 0);
      const down = drawn.some((s) => s.downsampled);
      const card = h(
        "div",
        { class: "chart-card", testid: "chart-line", data: { metric } },
        h(
          "div",
          { class: "chart-card-head" },
          h("span", { class: "chart-card-title", text: metric }),
          down || zoomed
            ? h("span", {
                class: "chart-card-note",
                testid: "series-detail",
                data: { detail: zoomed ? (down ? "zoom-downsampled" : "zoom-full") : "downsampled" },
                title: zoomed ? `${raw} raw points in the zoomed range` : `${raw} raw points`,
                text: zoomed ? (down ? "zoom: downsampled" : "zoom: every point") : "downsampled",
              })
            : null,
        ),
        plotEl,
      );
      cards.push(card);
      if (grouping ? !gs.length : !series.some((s) => s.y.some((v) => v !== null))) {
        const loaded = data && (!grouping || data.groups);
        plotEl.appendChild(h("div", { class: "plot-empty", text: loaded ? "No values for the plotted runs." : "Loading…" }));
        continue;
      }
      mounts.push({ el: plotEl, series, groups: gs });
    }
    replace(this.grid, ...cards);
    if (!UPlot && mounts.length) {
      for (const m of mounts) m.el.appendChild(h("div", { class: "plot-empty", text: "Loading…" }));
      const drawn = this.seq;
      void loadUPlot().then(() => {
        if (this.seq === drawn) this.draw();
      });
      return;
    }
    // Read every plot's width before the first chart is drawn (one page layout, not one per chart).
    const widths = mounts.map((m) => m.el.clientWidth);
    mounts.forEach((m, i) =>
      grouping ? this.mountGroupPlot(m.el, m.groups, grouping, widths[i] ?? 0) : this.mountPlot(m.el, m.series, byKey, widths[i] ?? 0),
    );
  }

  /** Run names as the legend shows them: a short id is added where plotted runs share a name. */
  private labels(keys: string[]): Map<string, string> {
    return runLabels(this.keys().concat(keys).map((k) => store.runs.get(k)).filter((r) => r !== undefined));
  }

  /** The groups of the plotted runs as the server formed them (the export's groups, in the
   *  table's group order), coloured as the table's groups; a group the table does not show (its runs
   *  are filtered out of the table) is drawn in the muted text colour. */
  private groupsOf(data: SeriesResponse | null): PlotGroup[] {
    const colors = new Map((store.table?.groups ?? []).map((g) => [g.label, paletteColor(g.color)]));
    const out = new Map<string, PlotGroup>();
    for (const g of data?.groups ?? []) {
      if (!out.has(g.label)) out.set(g.label, { label: g.label, color: colors.get(g.label) ?? token("--text-2", "#8b949e"), keys: g.keys });
    }
    return [...out.values()];
  }

  /** `45 runs`, or `2000 of 2100 runs` when the selection is past what is averaged. */
  private groupRunsText(groups: PlotGroup[]): string {
    const n = groups.reduce((t, g) => t + g.keys.length, 0);
    const selected = store.ui.selection.filter((k) => store.runs.has(k)).length;
    const of = selected > this.keys().length ? ` of ${selected}` : "";
    return `${n}${of} run${n === 1 && !of ? "" : "s"}`;
  }

  private renderGroupLegend(groups: PlotGroup[]): void {
    replace(
      this.legend,
      h(
        "div",
        { class: "legend-groups" },
        h("span", {
          class: "legend-title",
          testid: "group-legend-title",
          text: `mean of ${this.groupRunsText(groups)} by ${store.ui.group ?? ""} · band: ${store.ui.band === "std" ? "± population std" : "min–max"}`,
        }),
        ...groups.map((g) =>
          h(
            "span",
            { class: "legend-group", testid: "legend-group", data: { group: g.label } },
            swatch(g.color),
            h("span", { text: `${g.label} (${g.keys.length} run${g.keys.length === 1 ? "" : "s"})` }),
          ),
        ),
      ),
    );
  }

  /** One metric by groups: per group the mean over its runs at each step, a band (min–max or
   *  ± std) around it, and the number of runs with a value there (in the tooltip). The server
   *  computes all of it over the runs' full histories and then downsamples it (`groups` of the
   *  series answer): a spike the per-run downsampling drops still shows in the band. */
  private mountGroupPlot(el: HTMLElement, series: GroupSeries[], groups: PlotGroup[], elWidth: number): void {
    const std = store.ui.band === "std";
    const logY = store.ui.logY;
    const tables: uPlot.AlignedData[] = [];
    const opts: uPlot.Series[] = [{}];
    const bands: uPlot.Band[] = [];
    const stats: GroupTipStats[] = [];
    const colorOf = new Map(groups.map((g) => [g.label, g.color]));
    for (const s of series) {
      if (!s.step.length) continue;
      const g = { label: s.label, color: colorOf.get(s.label) ?? token("--text-2", "#8b949e") };
      const fix = (v: number) => (logY && v <= 0 ? null : v);
      const mean = s.mean.map(fix);
      const lo = s.mean.map((m, i) => fix(std ? m - (s.std[i] ?? 0) : (s.min[i] ?? m)));
      const hi = s.mean.map((m, i) => fix(std ? m + (s.std[i] ?? 0) : (s.max[i] ?? m)));
      tables.push([s.step, mean, lo, hi] as uPlot.AlignedData);
      const base = opts.length;
      opts.push({ ...this.seriesOpts(g.label, g.color, 2), points: { show: false } });
      opts.push({ label: `${g.label} low`, stroke: "transparent", width: 0, spanGaps: false, points: { show: false } });
      opts.push({ label: `${g.label} high`, stroke: "transparent", width: 0, spanGaps: false, points: { show: false } });
      bands.push({ series: [base + 2, base + 1], fill: withAlpha(g.color, 0.16) });
      stats.push({ label: g.label, color: g.color, step: s.step, mean, lo, hi, n: s.n_runs });
    }
    if (!tables.length) {
      el.appendChild(h("div", { class: "plot-empty", text: "No values for the plotted runs." }));
      return;
    }
    const data = UPlot!.join(tables);
    const axisColor = token("--text-2", "#8b949e");
    const gridColor = token("--chart-grid", "rgba(255,255,255,0.06)");
    const tooltip = h("div", { class: "plot-tip", attrs: { hidden: true } });
    const self = this;
    const u = new UPlot!(
      {
        width: Math.max(280, elWidth || 600),
        height: 240,
        legend: { show: false },
        cursor: { drag: { x: true, y: false, setScale: true }, sync: { key: "traceml-line", setSeries: false }, points: { size: 6 } },
        scales: { x: { time: false }, y: logY ? { distr: 3, log: 10 } : { auto: true } },
        axes: [
          { stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor, width: 1 }, font: "11px system-ui, sans-serif", size: 26, label: "step", labelFont: "11px system-ui, sans-serif", labelSize: 14, labelGap: 0, incrs: STEP_INCRS },
          { stroke: axisColor, grid: { stroke: gridColor, width: 1 }, ticks: { stroke: gridColor, width: 1 }, font: "11px system-ui, sans-serif", size: yAxisSize, values: (vu: uPlot, splits: (number | null)[]) => logTickLabels(vu, splits, logY) },
        ],
        series: opts,
        bands,
        hooks: {
          setScale: [
            (pu: uPlot, key: string) => {
              if (key !== "x" || self.applying || pu.status === 0) return;
              const min = pu.scales.x!.min;
              const max = pu.scales.x!.max;
              if (min === undefined || max === undefined || min === null || max === null) return;
              self.zoom = { min, max };
              self.applying = true;
              for (const other of self.plots) if (other !== pu) other.setScale("x", { min, max });
              self.applying = false;
              self.renderToolbar();
              self.fetchZoomSoon();
            },
          ],
          setCursor: [(pu: uPlot) => self.groupTip(pu, tooltip, stats, std)],
        },
      },
      data,
      el,
    );
    el.appendChild(tooltip);
    el.dataset.groups = String(stats.length);
    u.over.addEventListener("dblclick", () => {
      this.zoom = null;
      // Drawn from the zoom's finer band: draw the whole one again (uPlot only knows those).
      if (this.zoomData) {
        this.zoomData = null;
        this.draw();
      } else this.renderToolbar();
    });
    u.over.addEventListener("mouseleave", () => {
      tooltip.hidden = true;
    });
    this.plots.push(u);
    if (this.zoom) {
      this.applying = true;
      u.setScale("x", this.zoom);
      this.applying = false;
    }
  }

  /** The tooltip of a grouped chart: for every group its point nearest the cursor's step (groups
   *  log at different steps, so the hovered step may be none of theirs), with the group's full run
   *  count there (n) and its band. */
  private groupTip(u: uPlot, el: HTMLElement, stats: GroupTipStats[], std: boolean): void {
    const left = u.cursor.left;
    if (left === undefined || left === null || left < 0) {
      el.hidden = true;
      return;
    }
    // The step the cursor snapped to (a drawn step of some group), else the step under the cursor.
    const idx = u.cursor.idx;
    const xv = (idx === null || idx === undefined ? undefined : u.data[0][idx]) ?? u.posToVal(left, "x");
    const rows: HTMLElement[] = [];
    for (const st of stats) {
      if (!spans(st.step, xv)) continue;
      const i = nearestIndex(st.step, xv);
      const m = st.mean[i];
      if (m === null || m === undefined) continue; // a gap there (log y and a mean ≤ 0)
      const l = st.lo[i];
      const hgh = st.hi[i];
      const at = st.step[i]!;
      const band =
        l !== null && l !== undefined && hgh !== null && hgh !== undefined
          ? std
            ? `± ${fmtNum((hgh - l) / 2)} (population std)`
            : `min–max ${fmtNum(l)} – ${fmtNum(hgh)}`
          : "";
      rows.push(
        h(
          "div",
          { class: "plot-tip-group", testid: "group-tip-row", data: { group: st.label, step: String(at), n: String(st.n[i] ?? 0) } },
          h(
            "div",
            { class: "plot-tip-row" },
            swatch(st.color, "swatch swatch-sm"),
            h("span", { class: "plot-tip-name", text: st.label }),
            h("span", { class: "plot-tip-n", text: `n=${st.n[i] ?? 0}` }),
            h("span", { class: "plot-tip-v", text: fmtNum(m) }),
          ),
          h("div", { class: "plot-tip-sub", text: [band, `step ${fmtNum(at)}`].filter(Boolean).join(" · ") }),
        ),
      );
    }
    if (!rows.length) {
      el.hidden = true;
      return;
    }
    replace(el, h("div", { class: "plot-tip-x", text: `step ${fmtNum(Math.round(xv))}` }), ...rows);
    el.hidden = false;
    placePlotTip(el, u);
  }

  private renderLegend(keys: string[], byKey: Map<string, string>, groups: [string, string][]): void {
    const items: HTMLElement[] = [];
    if (groups.length) {
      items.push(
        h(
          "div",
          { class: "legend-groups" },
          h("span", { class: "legend-title", text: store.ui.colorBy ?? "" }),
          ...groups.map(([label, color]) => h("span", { class: "legend-group" }, swatch(color), h("span", { text: label }))),
        ),
      );
    }
    const runs = h("div", { class: "legend-runs" });
    const labels = this.labels(keys);
    for (const k of keys) {
      const run = store.runs.get(k)!;
      const off = this.hiddenRuns.has(k);
      const item = h(
        "button",
        {
          type: "button",
          class: `legend-item${off ? " is-off" : ""}`,
          testid: "legend-item",
          data: { key: k },
          title: `${run.id}\nclick: hide/show · shift-click: show only this run`,
        },
        swatch(byKey.get(k) ?? "#888"),
        h("span", { text: labels.get(k) ?? run.name ?? run.id }),
      );
      item.addEventListener("click", (ev) => {
        if (ev.shiftKey) {
          const only = !this.hiddenRuns.has(k) && this.hiddenRuns.size === keys.length - 1;
          this.hiddenRuns = only ? new Set() : new Set(keys.filter((x) => x !== k));
        } else if (off) this.hiddenRuns.delete(k);
        else this.hiddenRuns.add(k);
        this.draw();
      });
      runs.appendChild(item);
    }
    items.push(runs);
    replace(this.legend, ...items);
  }

  private mountPlot(el: HTMLElement, series: Series[], byKey: Map<string, string>, elWidth: number): void {
    const timeLabel = this.shownData()?.time_label;
    const logY = store.ui.logY;
    const smooth = store.ui.ema > 0;
    const shown = series.filter((s) => !this.hiddenRuns.has(s.key));
    const tables: uPlot.AlignedData[] = [];
    const opts: uPlot.Series[] = [{}];
    const report: TipLine[] = [];
    const labels = this.labels(series.map((s) => s.key));
    const byTime = this.xAxis() === "time";
    for (const s of shown) {
      const xs: number[] = [];
      const ys: (number | null)[] = [];
      const sm: (number | null)[] = [];
      const fix = (v: number | null | undefined) => (v === null || v === undefined || (logY && v <= 0) ? null : v);
      let rawLast = -Infinity;
      for (let i = 0; i < s.x.length; i++) {
        let x = s.x[i];
        if (x === null || x === undefined) continue;
        if (byTime && xs.length && x >= rawLast && x <= xs[xs.length - 1]!) {
          // Rows logged at the same wall time (50 in one millisecond) are all drawn, in the order
          // logged: each a microsecond after the one before (uPlot needs increasing x).
          rawLast = x;
          x = xs[xs.length - 1]! + TIME_TIE_S;
        } else if (x > rawLast) rawLast = x;
        if (xs.length && x <= xs[xs.length - 1]!) {
          // Keep x strictly increasing for the join: a repeated step keeps its latest value.
          if (x === xs[xs.length - 1]) {
            ys[ys.length - 1] = fix(s.y[i]);
            sm[sm.length - 1] = fix(s.smoothed?.[i]);
          }
          continue;
        }
        xs.push(x);
        ys.push(fix(s.y[i]));
        sm.push(fix(s.smoothed?.[i]));
      }
      const color = byKey.get(s.key) ?? "#888";
      const name = labels.get(s.key) ?? s.key;
      if (smooth && s.smoothed) {
        tables.push([xs, ys, sm] as uPlot.AlignedData);
        opts.push(this.seriesOpts(name, withAlpha(color, 0.28), 1));
        opts.push(this.seriesOpts(`${name} (EMA)`, color, 2));
        report.push({ name, color, xs, ys: sm });
      } else {
        tables.push([xs, ys] as uPlot.AlignedData);
        opts.push(this.seriesOpts(name, color, 1.75));
        report.push({ name, color, xs, ys });
      }
    }
    if (!tables.length) {
      el.appendChild(h("div", { class: "plot-empty", text: "All runs hidden: click a name in the legend." }));
      return;
    }
    const data = UPlot!.join(tables);
    const isolated = data.slice(1).map((ys) => isolatedPoints(ys as (number | null | undefined)[]));
    opts.forEach((o, i) => {
      if (i === 0) return;
      const idx = isolated[i - 1] ?? [];
      o.points = {
        show: false,
        size: 6,
        fill: (o.stroke as string) ?? "#888",
        filter: (_u: uPlot, _si: number, show: boolean) => (show ? null : idx),
      };
    });
    const axisColor = token("--text-2", "#8b949e");
    const gridColor = token("--chart-grid", "rgba(255,255,255,0.06)");
    const x = this.xAxis();
    const tooltip = h("div", { class: "plot-tip", attrs: { hidden: true } });
    const width = Math.max(280, elWidth || 600);
    const self = this;
    // The tick labels and x axis label as drawn (the canvas has no text to read): on the plot
    // element as data-x-ticks / data-y-ticks / data-x-label, for tests and assistive reading.
    let xTicks: string[] = [];
    let yTicks: string[] = [];
    const u = new UPlot!(
      {
        width,
        height: 240,
        legend: { show: false },
        cursor: {
          drag: { x: true, y: false, setScale: true },
          sync: { key: "traceml-line", setSeries: false },
          points: { size: 6 },
        },
        scales: {
          x: { time: false },
          y: logY ? { distr: 3, log: 10 } : { auto: true },
        },
        axes: [
          {
            stroke: axisColor,
            grid: { stroke: gridColor, width: 1 },
            ticks: { stroke: gridColor, width: 1 },
            font: "11px system-ui, sans-serif",
            size: 26,
            label: (lu: uPlot) => xLabel(lu, x, timeLabel),
            labelFont: "11px system-ui, sans-serif",
            labelSize: 14,
            labelGap: 0,
            ...(x === "time"
              ? {
                  // Clean steps in one unit (s, min or h, named in the label), not uPlot's 8.3333m.
                  splits: (su: uPlot, _ai: number, lo: number, hi: number) =>
                    timeTicks(lo, hi, Math.max(2, Math.floor(su.bbox.width / devicePixelRatio / 90))).ticks,
                  values: (vu: uPlot, splits: (number | null)[]) => {
                    const sc = vu.scales.x;
                    const { unit } = timeUnit(sc?.min ?? 0, sc?.max ?? 0);
                    const div = unit === "h" ? 3600 : unit === "min" ? 60 : 1;
                    return (xTicks = fmtTicks(splits.map((v) => (v === null ? null : Number((v / div).toPrecision(12))))));
                  },
                }
              : {
                  // Steps are whole numbers: ticks at 1, 2, 5 × 10^k only (not 2.5, 7.5).
                  ...(x === "step" ? { incrs: STEP_INCRS } : {}),
                  values: (_u: uPlot, splits: (number | null)[]) => (xTicks = fmtTicks(splits)),
                }),
          },
          {
            stroke: axisColor,
            grid: { stroke: gridColor, width: 1 },
            ticks: { stroke: gridColor, width: 1 },
            font: "11px system-ui, sans-serif",
            size: yAxisSize,
            values: (vu: uPlot, splits: (number | null)[]) => (yTicks = logTickLabels(vu, splits, logY)),
          },
        ],
        series: opts,
        hooks: {
          setScale: [
            (pu: uPlot, key: string) => {
              if (key !== "x" || self.applying || pu.status === 0) return; // status 0: uPlot's own first scale, not a zoom
              const min = pu.scales.x!.min;
              const max = pu.scales.x!.max;
              if (min === undefined || max === undefined || min === null || max === null) return;
              self.zoom = { min, max };
              self.applying = true;
              for (const other of self.plots) if (other !== pu) other.setScale("x", { min, max });
              self.applying = false;
              self.renderToolbar();
              self.fetchZoomSoon();
            },
          ],
          setCursor: [(pu: uPlot) => self.tip(pu, tooltip, report)],
          draw: [
            (du: uPlot) => {
              el.dataset.xLabel = xLabel(du, x, timeLabel);
              el.dataset.xTicks = xTicks.filter((t) => t !== "").join(" ");
              el.dataset.yTicks = yTicks.filter((t) => t !== "").join(" ");
            },
          ],
        },
      },
      data,
      el,
    );
    el.appendChild(tooltip);
    u.over.addEventListener("dblclick", () => {
      this.zoom = null;
      // Drawn from the zoom's finer points: draw the whole series again (uPlot only knows those).
      if (this.zoomData) {
        this.zoomData = null;
        this.draw();
      } else this.renderToolbar();
    });
    u.over.addEventListener("mouseleave", () => {
      tooltip.hidden = true;
    });
    this.plots.push(u);
    if (this.zoom) {
      this.applying = true;
      u.setScale("x", this.zoom);
      this.applying = false;
    }
  }

  private seriesOpts(label: string, stroke: string, width: number): uPlot.Series {
    return { label, stroke, width, spanGaps: false };
  }

  /** The tooltip of a line chart: every shown run whose steps (or times) span the cursor's x, at
   *  its point nearest to it (runs log at different x, on wall time nearly always). */
  private tip(u: uPlot, el: HTMLElement, report: TipLine[]): void {
    const idx = u.cursor.idx;
    if (idx === null || idx === undefined || u.cursor.left === undefined || u.cursor.left < 0) {
      el.hidden = true;
      return;
    }
    const xv = u.data[0][idx];
    const rows: [string, number, string][] = [];
    for (const r of report) {
      if (xv === undefined || !spans(r.xs, xv)) continue;
      const v = r.ys[nearestIndex(r.xs, xv)];
      if (v !== null && v !== undefined) rows.push([r.name, v, r.color]); // null: a gap there
    }
    if (!rows.length || xv === undefined) {
      el.hidden = true;
      return;
    }
    rows.sort((a, b) => b[1] - a[1]);
    const xs = this.xAxis() === "time" ? fmtWallTime(xv) : fmtNum(xv);
    replace(
      el,
      h("div", { class: "plot-tip-x", text: `${this.xAxis()} ${xs}` }),
      ...rows.slice(0, 10).map(([name, v, color]) => h("div", { class: "plot-tip-row" }, swatch(color, "swatch swatch-sm"), h("span", { class: "plot-tip-name", text: name }), h("span", { class: "plot-tip-v", text: fmtNum(v) }))),
      rows.length > 10 ? h("div", { class: "muted", text: `+${rows.length - 10} more` }) : null,
    );
    el.hidden = false;
    placePlotTip(el, u);
  }

  private resize(): void {
    for (const p of this.plots) {
      const parent = p.root.parentElement;
      if (!parent || parent.clientWidth === 0) continue; // a hidden view: the chart keeps its size
      const w = Math.max(280, parent.clientWidth);
      if (Math.abs(w - p.width) > 2) p.setSize({ width: w, height: 240 });
    }
  }

  /** Export the chart; a string says why there is nothing to export. */
  exportChart(format: "csv" | "png"): Promise<string | null> | string {
    const spec = this.spec();
    if (!this.keys().length) return "Nothing to export: select runs to plot first (tick them in the Runs table).";
    if (!spec.keys.length) return "Nothing to export: every plotted run is hidden in the legend.";
    if (!spec.metrics.length) return "Nothing to export: the plotted runs have no metrics.";
    return runExport(`Line chart ${format.toUpperCase()}`, () => api.exportChart({ chart: "line", ...spec }, format));
  }
}
