// Run-level charts drawn as SVG with DOM APIs: scatter (X, Y, size, colour, log axes, dropped count),
// box (quartiles, whiskers, jittered points, outliers per group) and bar (one per run up to 60, or
// group mean with min–max whiskers). The numbers come from POST /api/chart (Python computes them,
// the same data the CSV/PNG exports use); labels are SVG text nodes and <title> tooltips.

import { api } from "../api";
import { runExport, tableOrder } from "../actions";
import { columnTitle, runLabels } from "../columns";
import { debounce, h, replace, s, svgTitle } from "../dom";
import { fmtNum } from "../format";
import { store } from "../store";
import type { BarResponse, BoxResponse, ScatterResponse } from "../types";
import { emptyState, errorText, field, paletteColor, select, swatch, toggle } from "../ui";
import { columnOptions } from "./runs";
import { ellipsize, extent, jitter, linearScale, logScale, type Scale, tickLabel } from "./scales";

/** The runs a run-level chart uses: the selection, or every shown table row when none is selected. */
export function chartKeys(): { keys: string[]; scope: string } {
  const sel = store.ui.selection.filter((k) => store.runs.has(k));
  if (sel.length) return { keys: sel, scope: `${sel.length} selected run${sel.length === 1 ? "" : "s"}` };
  const keys = tableOrder();
  return { keys, scope: keys.length === 1 ? "the 1 shown run (none selected)" : `all ${keys.length} shown runs (none selected)` };
}

interface GroupMean {
  label: string;
  color: string;
  n: number;
  mx: number;
  my: number;
  sx: number;
  sy: number;
}

/** Per table group, the mean and (population) standard deviation of its drawn points. */
function groupMeans(pts: { key: string; x: number; y: number }[]): GroupMean[] {
  const out: GroupMean[] = [];
  for (const g of store.table?.groups ?? []) {
    const members = new Set(g.keys);
    const mine = pts.filter((p) => members.has(p.key));
    if (!mine.length) continue;
    const mean = (vs: number[]) => vs.reduce((a, b) => a + b, 0) / vs.length;
    const sd = (vs: number[], m: number) => Math.sqrt(vs.reduce((a, v) => a + (v - m) * (v - m), 0) / vs.length);
    const xs = mine.map((p) => p.x);
    const ys = mine.map((p) => p.y);
    const mx = mean(xs);
    const my = mean(ys);
    out.push({ label: g.label, color: paletteColor(g.color), n: mine.length, mx, my, sx: sd(xs, mx), sy: sd(ys, my) });
  }
  return out;
}

/** A group's mean as a diamond with ± std whiskers in x and y. */
function meanMark(m: GroupMean, xsc: Scale, ysc: Scale, xName: string, yName: string): SVGElement {
  // Whiskers stop at the axes' ends (a wide spread would run off the plot).
  const clampX = (v: number) => Math.min(Math.max(v, xsc.domain[0]), xsc.domain[1]);
  const clampY = (v: number) => Math.min(Math.max(v, ysc.domain[0]), ysc.domain[1]);
  const cx = xsc(m.mx);
  const cy = ysc(m.my);
  const g = s("g", { class: "group-mean", "data-testid": "scatter-group-mean", "data-group": m.label });
  g.appendChild(s("line", { x1: xsc(clampX(m.mx - m.sx)), x2: xsc(clampX(m.mx + m.sx)), y1: cy, y2: cy, class: "whisker", stroke: m.color }));
  g.appendChild(s("line", { x1: cx, x2: cx, y1: ysc(clampY(m.my - m.sy)), y2: ysc(clampY(m.my + m.sy)), class: "whisker", stroke: m.color }));
  const d = 7;
  g.appendChild(s("path", { d: `M${cx} ${cy - d}L${cx + d} ${cy}L${cx} ${cy + d}L${cx - d} ${cy}Z`, fill: m.color, stroke: "#0b0d12", class: "mean-mark" }));
  g.appendChild(svgTitle(`${m.label} (n=${m.n})\nmean ${xName} = ${fmtNum(m.mx)} ± ${fmtNum(m.sx)}\nmean ${yName} = ${fmtNum(m.my)} ± ${fmtNum(m.sy)}`));
  return g;
}

/** Labels of the charted runs (a short id added where names collide), by key. */
function runLabelsOf(keys: (string | null)[]): Map<string, string> {
  const runs = [];
  for (const k of keys) {
    const r = k ? store.runs.get(k) : undefined;
    if (r) runs.push(r);
  }
  return runLabels(runs);
}

function numericColumns(): string[] {
  return store.table?.columns.numeric ?? [];
}

function firstOf(cands: string[], prefer: string[]): string | null {
  for (const p of prefer) {
    const hit = cands.find((c) => c === p || c.startsWith(p));
    if (hit) return hit;
  }
  return cands[0] ?? null;
}

function defaultMetricField(): string | null {
  return firstOf(numericColumns(), ["run.best.val/auc", "run.best.", "summary.", "run.last."]);
}

function defaultGroupField(): string | null {
  return firstOf(store.table?.columns.available ?? [], ["config.data.dataset", "group"]);
}

interface Frame {
  svg: SVGSVGElement;
  w: number;
  h: number;
  m: { l: number; r: number; t: number; b: number };
}

function frame(host: HTMLElement, height: number, m = { l: 64, r: 24, t: 16, b: 46 }): Frame {
  const w = Math.max(420, host.clientWidth || 800);
  const svg = s("svg", { class: "svg-chart", width: w, height, viewBox: `0 0 ${w} ${height}`, role: "img" });
  return { svg, w, h: height, m };
}

/** The scatter's padding inside its axes, as a share of the plot's width (height). */
const SCATTER_PAD = 0.03;

function xAxis(f: Frame, sc: Scale, label: string): void {
  const y0 = f.h - f.m.b;
  const g = s("g", { class: "axis axis-x" });
  g.appendChild(s("line", { x1: f.m.l, x2: f.w - f.m.r, y1: y0, y2: y0, class: "axis-line" }));
  for (const t of sc.ticks) {
    const x = sc(t);
    if (x < f.m.l - 0.5 || x > f.w - f.m.r + 0.5) continue;
    g.appendChild(s("line", { x1: x, x2: x, y1: f.m.t, y2: y0, class: "grid-line" }));
    g.appendChild(s("text", { x, y: y0 + 16, "text-anchor": "middle", class: "tick" }, tickLabel(t, sc.log)));
  }
  g.appendChild(s("text", { x: (f.m.l + f.w - f.m.r) / 2, y: f.h - 8, "text-anchor": "middle", class: "axis-label" }, label));
  f.svg.appendChild(g);
}

function yAxis(f: Frame, sc: Scale, label: string): void {
  const g = s("g", { class: "axis axis-y" });
  g.appendChild(s("line", { x1: f.m.l, x2: f.m.l, y1: f.m.t, y2: f.h - f.m.b, class: "axis-line" }));
  for (const t of sc.ticks) {
    const y = sc(t);
    if (y < f.m.t - 0.5 || y > f.h - f.m.b + 0.5) continue;
    g.appendChild(s("line", { x1: f.m.l, x2: f.w - f.m.r, y1: y, y2: y, class: "grid-line" }));
    g.appendChild(s("text", { x: f.m.l - 8, y: y + 4, "text-anchor": "end", class: "tick" }, tickLabel(t, sc.log)));
  }
  const cy = (f.m.t + f.h - f.m.b) / 2;
  g.appendChild(s("text", { x: 14, y: cy, transform: `rotate(-90 14 ${cy})`, "text-anchor": "middle", class: "axis-label" }, label));
  f.svg.appendChild(g);
}

function groupLegend(groups: Map<string, number>, title: string | null): HTMLElement | null {
  if (groups.size < 1 || (groups.size === 1 && groups.has(""))) return null;
  return h(
    "div",
    { class: "legend legend-groups" },
    title ? h("span", { class: "legend-title", text: title }) : null,
    ...[...groups.entries()].map(([label, i]) => h("span", { class: "legend-group" }, swatch(paletteColor(i)), h("span", { text: label || "(none)" }))),
  );
}

/** Shared fetch/draw life cycle of the three run-level charts. */
abstract class RunChart<T> {
  readonly toolbar = h("div", { class: "toolbar chart-toolbar" });
  protected body = h("div", { class: "svg-host" });
  protected data: T | null = null;
  protected error: string | null = null;
  private seq = 0;
  private fetchedFor = "";
  protected visible = false;

  private drawnWidth = 0;

  constructor(protected host: HTMLElement) {
    host.appendChild(this.body);
    // SVG charts are laid out for the width they get: redraw when it changes (window, inspector).
    new ResizeObserver(
      debounce(() => {
        const w = this.body.clientWidth;
        if (this.visible && this.data && w > 0 && Math.abs(w - this.drawnWidth) > 4) {
          this.drawnWidth = w;
          this.draw();
        }
      }, 120),
    ).observe(this.body);
  }

  setVisible(v: boolean): void {
    this.visible = v;
    if (v) this.refresh();
  }

  protected abstract specSig(): unknown;
  protected abstract load(keys: string[]): Promise<T> | null;
  protected abstract renderToolbar(): void;
  protected abstract draw(): void;
  /** Export the chart; a string says why there is nothing to export. */
  abstract exportChart(format: "csv" | "png"): Promise<string | null> | string;

  refresh(force = false): void {
    this.renderToolbar();
    if (!this.visible) return;
    const { keys } = chartKeys();
    const sig = JSON.stringify([keys, this.specSig()]);
    if (!force && sig === this.fetchedFor) {
      this.draw();
      return;
    }
    this.fetchedFor = sig;
    void this.fetch(keys);
  }

  private async fetch(keys: string[]): Promise<void> {
    const seq = ++this.seq;
    const p = keys.length ? this.load(keys) : null;
    if (!p) {
      this.data = null;
      this.error = null;
      this.draw();
      return;
    }
    try {
      const res = await p;
      if (seq !== this.seq) return;
      this.data = res;
      this.error = null;
    } catch (err) {
      if (seq !== this.seq) return;
      this.error = errorText(err);
    }
    this.draw();
  }

  protected empty(title: string, hint?: string): void {
    replace(this.body, emptyState(title, hint, undefined, "chart-empty"));
  }

  protected showError(): boolean {
    if (!this.error) return false;
    replace(this.body, h("div", { class: "callout callout-error", testid: "chart-error", text: this.error }));
    return true;
  }
}

// -- scatter ----------------------------------------------------------------------------------------

export class ScatterChart extends RunChart<ScatterResponse> {
  private st() {
    const sc = store.ui.scatter;
    const num = numericColumns();
    return {
      ...sc,
      x: sc.x ?? firstOf(num, ["config.optim.lr", "config."]) ?? defaultMetricField(),
      y: sc.y ?? defaultMetricField(),
    };
  }

  protected specSig(): unknown {
    return this.st();
  }

  protected load(keys: string[]): Promise<ScatterResponse> | null {
    const st = this.st();
    if (!st.x || !st.y) return null;
    return api.scatter({ keys, x_field: st.x, y_field: st.y, size_field: st.size, color_field: st.color, log_x: st.logX, log_y: st.logY });
  }

  private setField(key: "x" | "y" | "size" | "color", v: string): void {
    store.set("scatter", { ...this.st(), [key]: v || null });
    this.refresh();
  }

  protected renderToolbar(): void {
    const st = this.st();
    const num = numericColumns();
    const all = store.table?.columns.available ?? [];
    replace(
      this.toolbar,
      field("X", select(columnOptions(num), st.x ?? "", (v) => this.setField("x", v), "scatter-x")),
      field("Y", select(columnOptions(num), st.y ?? "", (v) => this.setField("y", v), "scatter-y")),
      field("Size", select(columnOptions(num, "none"), st.size ?? "", (v) => this.setField("size", v), "scatter-size")),
      field("Colour", select(columnOptions(all, "none"), st.color ?? "", (v) => this.setField("color", v), "scatter-color")),
      toggle("Log x", st.logX, (on) => {
        store.set("scatter", { ...this.st(), logX: on });
        this.refresh();
      }, "scatter-log-x"),
      toggle("Log y", st.logY, (on) => {
        store.set("scatter", { ...this.st(), logY: on });
        this.refresh();
      }, "scatter-log-y"),
      store.ui.group !== null
        ? toggle("Group means", store.ui.plotGroups, (on) => {
            store.set("plotGroups", on);
            this.refresh();
          }, "scatter-group-means", `The mean ± std of each group of ${store.ui.group} over its points`)
        : null,
    );
  }

  protected draw(): void {
    if (this.showError()) return;
    const st = this.st();
    if (!st.x || !st.y) return this.empty("No numeric columns to plot", "Scatter needs numeric params or metrics.");
    const d = this.data;
    if (!d) return this.empty("No runs to plot", "Select runs, or clear the table filters.");
    const names = runLabelsOf(d.points.map((p) => p.key));
    let pts = d.points.filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y)).map((p) => ({ ...p, label: names.get(p.key) ?? p.label }));
    const beforeLog = pts.length;
    if (st.logX) pts = pts.filter((p) => p.x > 0);
    if (st.logY) pts = pts.filter((p) => p.y > 0);
    const notPositive = beforeLog - pts.length;
    const f = frame(this.body, 460);
    // 3 % of the plot inside each axis line: a point at the lowest or highest value (x = 0, say)
    // does not sit on the axis; the ticks stay at the data's values (no axis below zero).
    const padX = (f.w - f.m.r - f.m.l) * SCATTER_PAD;
    const padY = (f.h - f.m.b - f.m.t) * SCATTER_PAD;
    const xr: [number, number] = [f.m.l + padX, f.w - f.m.r - padX];
    const yr: [number, number] = [f.h - f.m.b - padY, f.m.t + padY];
    const xs = pts.map((p) => p.x);
    const ys = pts.map((p) => p.y);
    const xsc = st.logX ? logScale([Math.min(...xs), Math.max(...xs)], xr) : linearScale(extent(xs), xr);
    const ysc = st.logY ? logScale([Math.min(...ys), Math.max(...ys)], yr) : linearScale(extent(ys), yr);
    xAxis(f, xsc, st.x);
    yAxis(f, ysc, st.y);
    const sizes = pts.map((p) => p.size).filter((v): v is number => v !== null && Number.isFinite(v));
    const sMin = Math.min(...sizes);
    const sMax = Math.max(...sizes);
    const radius = (v: number | null) => {
      if (v === null || !sizes.length) return 5;
      if (sMax === sMin) return 7;
      return 3 + Math.sqrt((v - sMin) / (sMax - sMin)) * 11;
    };
    const groups = new Map<string, number>();
    const g = s("g", { class: "points" });
    // Big points first so small ones stay clickable on top.
    const order = [...pts].sort((a, b) => radius(b.size) - radius(a.size));
    for (const p of order) {
      const label = p.group ?? "";
      let gi = groups.get(label);
      if (gi === undefined) {
        gi = groups.size;
        groups.set(label, gi);
      }
      const color = st.color ? paletteColor(gi) : store.isSelected(p.key) ? paletteColor(store.colorOf(p.key)) : paletteColor(0);
      const c = s("circle", {
        cx: xsc(p.x),
        cy: ysc(p.y),
        r: radius(p.size),
        class: "dot",
        fill: color,
        stroke: color,
        "data-key": p.key,
        "data-testid": "scatter-point",
      });
      const tip = [
        p.label,
        `${st.x} = ${fmtNum(p.x)}`,
        `${st.y} = ${fmtNum(p.y)}`,
        st.size ? `${st.size} = ${p.size === null ? "missing (default size)" : fmtNum(p.size)}` : null,
        st.color ? `${st.color} = ${p.group ?? "(none)"}` : null,
      ]
        .filter(Boolean)
        .join("\n");
      c.appendChild(svgTitle(tip));
      c.addEventListener("click", () => store.openInspector(p.key));
      g.appendChild(c);
    }
    f.svg.appendChild(g);
    const means = store.ui.plotGroups && store.ui.group !== null ? groupMeans(pts) : [];
    for (const m of means) f.svg.appendChild(meanMark(m, xsc, ysc, st.x, st.y));
    const dropped = d.dropped;
    replace(
      this.body,
      h(
        "div",
        { class: "chart-meta" },
        h("span", { testid: "scatter-count", text: `${pts.length} run${pts.length === 1 ? "" : "s"} plotted` }),
        h("span", {
          class: dropped ? "meta-warn" : "muted",
          testid: "scatter-dropped",
          text: `${dropped} run${dropped === 1 ? "" : "s"} dropped (no X or Y value)`,
        }),
        notPositive ? h("span", { class: "meta-warn", text: `${notPositive} not drawn (≤ 0 on a log axis)` }) : null,
      ),
      st.color ? groupLegend(groups, columnTitle(st.color)) : null,
      means.length
        ? h(
            "div",
            { class: "legend-groups" },
            h("span", { class: "legend-title", text: `mean ± std by ${store.ui.group ?? ""}` }),
            ...means.map((m) => h("span", { class: "legend-group" }, swatch(m.color), h("span", { text: `${m.label} (n=${m.n})` }))),
          )
        : null,
      h("div", { class: "chart-card", testid: "chart-scatter" }, f.svg),
    );
  }

  exportChart(format: "csv" | "png"): Promise<string | null> | string {
    const st = this.st();
    const { keys } = chartKeys();
    if (!keys.length) return "Nothing to export: no runs are shown (select runs, or clear the filters).";
    if (!st.x || !st.y) return "Nothing to export: choose the x and y fields first.";
    return runExport(`Scatter ${format.toUpperCase()}`, () =>
      api.exportChart(
        {
          chart: "scatter",
          keys,
          x_field: st.x!,
          y_field: st.y!,
          size_field: st.size,
          color_field: st.color,
          log_x: st.logX,
          log_y: st.logY,
          group_by: store.ui.plotGroups ? store.ui.group : null,
        },
        format,
      ),
    );
  }
}

// -- box --------------------------------------------------------------------------------------------

export class BoxChart extends RunChart<BoxResponse> {
  private st() {
    const b = store.ui.box;
    return { field: b.field ?? defaultMetricField(), groupBy: b.groupBy ?? defaultGroupField() };
  }

  protected specSig(): unknown {
    return this.st();
  }

  protected load(keys: string[]): Promise<BoxResponse> | null {
    const st = this.st();
    if (!st.field) return null;
    return api.box({ keys, field: st.field, group_by: st.groupBy });
  }

  protected renderToolbar(): void {
    const st = this.st();
    replace(
      this.toolbar,
      field(
        "Value",
        select(columnOptions(numericColumns()), st.field ?? "", (v) => {
          store.set("box", { ...this.st(), field: v || null });
          this.refresh();
        }, "box-field"),
      ),
      field(
        "Group by",
        select(columnOptions(store.table?.columns.available ?? []), st.groupBy ?? "", (v) => {
          store.set("box", { ...this.st(), groupBy: v || null });
          this.refresh();
        }, "box-group-by"),
      ),
    );
  }

  protected draw(): void {
    if (this.showError()) return;
    const st = this.st();
    if (!st.field) return this.empty("No numeric columns to plot");
    const d = this.data;
    if (!d || !d.groups.length) return this.empty("No values to plot", "None of the runs has a value in this column.");
    const f = frame(this.body, 440, { l: 64, r: 24, t: 16, b: 58 });
    const vals = d.groups.flatMap((g) => [g.low, g.high, ...g.points.map((p) => p.value)]);
    const ysc = linearScale(extent(vals), [f.h - f.m.b, f.m.t]);
    yAxis(f, ysc, st.field);
    const n = d.groups.length;
    const band = (f.w - f.m.l - f.m.r) / n;
    const boxW = Math.min(80, band * 0.5);
    d.groups.forEach((g, gi) => {
      const cx = f.m.l + band * (gi + 0.5);
      const color = paletteColor(gi);
      const grp = s("g", { class: "box", "data-testid": "box-group", "data-group": g.label });
      const tip = `${g.label}\nn = ${g.n}\nmedian ${fmtNum(g.median)}\nq1 ${fmtNum(g.q1)} · q3 ${fmtNum(g.q3)}\nwhiskers ${fmtNum(g.low)} – ${fmtNum(g.high)}`;
      grp.appendChild(s("line", { x1: cx, x2: cx, y1: ysc(g.low), y2: ysc(g.q1), class: "whisker", stroke: color }));
      grp.appendChild(s("line", { x1: cx, x2: cx, y1: ysc(g.q3), y2: ysc(g.high), class: "whisker", stroke: color }));
      for (const v of [g.low, g.high]) {
        grp.appendChild(s("line", { x1: cx - boxW / 4, x2: cx + boxW / 4, y1: ysc(v), y2: ysc(v), class: "whisker", stroke: color }));
      }
      const top = ysc(g.q3);
      const rect = s("rect", {
        x: cx - boxW / 2,
        y: top,
        width: boxW,
        height: Math.max(1, ysc(g.q1) - top),
        class: "box-rect",
        fill: color,
        stroke: color,
        rx: 3,
      });
      rect.appendChild(svgTitle(tip));
      grp.appendChild(rect);
      grp.appendChild(s("line", { x1: cx - boxW / 2, x2: cx + boxW / 2, y1: ysc(g.median), y2: ysc(g.median), class: "median" }));
      for (const p of g.points) {
        const c = s("circle", {
          cx: cx + jitter(p.key) * boxW * 0.42,
          cy: ysc(p.value),
          r: p.outlier ? 4 : 3,
          class: p.outlier ? "dot outlier" : "dot jitter",
          fill: p.outlier ? "none" : color,
          stroke: color,
          "data-key": p.key,
          "data-testid": p.outlier ? "box-outlier" : "box-point",
        });
        c.appendChild(svgTitle(`${p.label}\n${fmtNum(p.value)}${p.outlier ? " (outlier)" : ""}`));
        c.addEventListener("click", () => store.openInspector(p.key));
        grp.appendChild(c);
      }
      const lbl = s("text", { x: cx, y: f.h - f.m.b + 18, "text-anchor": "middle", class: "tick tick-strong" }, ellipsize(g.label, Math.max(6, Math.floor(band / 7))));
      lbl.appendChild(svgTitle(g.label));
      grp.appendChild(lbl);
      grp.appendChild(s("text", { x: cx, y: f.h - f.m.b + 33, "text-anchor": "middle", class: "tick" }, `n=${g.n}`));
      f.svg.appendChild(grp);
    });
    replace(
      this.body,
      h("div", { class: "chart-meta" }, h("span", { text: `${d.groups.length} group${d.groups.length === 1 ? "" : "s"} by ${st.groupBy ?? "group"}` })),
      h("div", { class: "chart-card", testid: "chart-box" }, f.svg),
    );
  }

  exportChart(format: "csv" | "png"): Promise<string | null> | string {
    const st = this.st();
    const { keys } = chartKeys();
    if (!keys.length) return "Nothing to export: no runs are shown (select runs, or clear the filters).";
    if (!st.field) return "Nothing to export: choose a field first.";
    return runExport(`Box plot ${format.toUpperCase()}`, () =>
      api.exportChart({ chart: "box", keys, field: st.field!, group_by: st.groupBy }, format),
    );
  }
}

// -- bar --------------------------------------------------------------------------------------------

export class BarChart extends RunChart<BarResponse> {
  private st() {
    const b = store.ui.bar;
    return { field: b.field ?? defaultMetricField(), groupBy: b.groupBy };
  }

  protected specSig(): unknown {
    return this.st();
  }

  protected load(keys: string[]): Promise<BarResponse> | null {
    const st = this.st();
    if (!st.field) return null;
    return api.bar({ keys, field: st.field, group_by: st.groupBy });
  }

  protected renderToolbar(): void {
    const st = this.st();
    replace(
      this.toolbar,
      field(
        "Value",
        select(columnOptions(numericColumns()), st.field ?? "", (v) => {
          store.set("bar", { ...this.st(), field: v || null });
          this.refresh();
        }, "bar-field"),
      ),
      field(
        "Bars",
        select(columnOptions(store.table?.columns.available ?? [], "one per run"), st.groupBy ?? "", (v) => {
          store.set("bar", { ...this.st(), groupBy: v || null });
          this.refresh();
        }, "bar-group-by", "One bar per run, or the mean of each group with min–max whiskers"),
      ),
    );
  }

  protected draw(): void {
    if (this.showError()) return;
    const st = this.st();
    if (!st.field) return this.empty("No numeric columns to plot");
    const d = this.data;
    if (!d || !d.bars.length) return this.empty("No values to plot", `None of the ${chartKeys().keys.length} runs has a value in this column.`);
    const names = runLabelsOf(d.bars.map((b) => b.key));
    const bars = d.bars.slice(0, d.limit || 60).map((b) => (b.key && names.has(b.key) ? { ...b, label: names.get(b.key)! } : b));
    const dropped = d.dropped ?? 0;
    const grouped = !!st.groupBy;
    const rowH = 24;
    const labelW = 190;
    const f = frame(this.body, bars.length * rowH + 56, { l: labelW + 12, r: 120, t: 8, b: 40 });
    const vals = bars.flatMap((b) => [b.value, b.min, b.max]).filter((v): v is number => v !== null);
    const xsc = linearScale(extent(vals, true, 0.02), [f.m.l, f.w - f.m.r]);
    xAxis(f, xsc, grouped ? `mean ${st.field}` : st.field);
    const zero = xsc(Math.max(xsc.domain[0], Math.min(0, xsc.domain[1])));
    const groups = new Map<string, number>();
    bars.forEach((b, i) => {
      const y = f.m.t + i * rowH;
      const glabel = b.group ?? "";
      let gi = groups.get(glabel);
      if (gi === undefined) {
        gi = groups.size;
        groups.set(glabel, gi);
      }
      const color = grouped || b.group !== null ? paletteColor(gi) : b.key && store.isSelected(b.key) ? paletteColor(store.colorOf(b.key)) : paletteColor(0);
      const g = s("g", { class: "bar", "data-testid": "bar", "data-key": b.key ?? "", "data-label": b.label });
      const lbl = s("text", { x: f.m.l - 10, y: y + rowH / 2 + 4, "text-anchor": "end", class: "tick tick-strong" }, ellipsize(b.label, 28));
      lbl.appendChild(svgTitle(b.label));
      g.appendChild(lbl);
      if (b.value !== null) {
        const x1 = xsc(b.value);
        const rect = s("rect", {
          x: Math.min(zero, x1),
          y: y + 4,
          width: Math.max(1, Math.abs(x1 - zero)),
          height: rowH - 8,
          rx: 3,
          class: "bar-rect",
          fill: color,
        });
        const tip = [
          b.label,
          `${grouped ? "mean " : ""}${st.field} = ${fmtNum(b.value)}`,
          b.min !== null && b.max !== null ? `min ${fmtNum(b.min)} · max ${fmtNum(b.max)}` : null,
          grouped ? `n = ${b.n}` : null,
        ]
          .filter(Boolean)
          .join("\n");
        rect.appendChild(svgTitle(tip));
        g.appendChild(rect);
        if (b.min !== null && b.max !== null && grouped) {
          const cy = y + rowH / 2;
          g.appendChild(s("line", { x1: xsc(b.min), x2: xsc(b.max), y1: cy, y2: cy, class: "whisker bar-whisker" }));
          for (const v of [b.min, b.max]) g.appendChild(s("line", { x1: xsc(v), x2: xsc(v), y1: cy - 5, y2: cy + 5, class: "whisker bar-whisker" }));
        }
        const tx = Math.max(x1, zero, b.max !== null && grouped ? xsc(b.max) : -Infinity) + 6;
        g.appendChild(s("text", { x: tx, y: y + rowH / 2 + 4, class: "tick bar-value" }, `${fmtNum(b.value)}${grouped ? ` (n=${b.n})` : ""}`));
      }
      if (b.key) {
        const key = b.key;
        g.addEventListener("click", () => store.openInspector(key));
        g.classList.add("is-clickable");
      }
      f.svg.appendChild(g);
    });
    const more = d.total > bars.length;
    replace(
      this.body,
      h(
        "div",
        { class: "chart-meta" },
        h("span", {
          testid: "bar-count",
          // "8 runs", or "60 of 100 runs drawn" when the bar limit cuts them (never "8 of 8").
          text: grouped
            ? `${bars.length} group${bars.length === 1 ? "" : "s"}`
            : more
              ? `${bars.length} of ${d.total} runs drawn`
              : `${bars.length} run${bars.length === 1 ? "" : "s"}`,
        }),
        h("span", {
          class: dropped ? "meta-warn" : "muted",
          testid: "bar-dropped",
          text: `${dropped} run${dropped === 1 ? "" : "s"} without a value left out`,
        }),
        more ? h("span", { class: "meta-warn", testid: "bar-limit", text: `only the first ${bars.length} are drawn; the CSV export has all ${d.total}` }) : null,
      ),
      !grouped && groups.size > 1 ? groupLegend(groups, "group") : null,
      h("div", { class: "chart-card", testid: "chart-bar" }, f.svg),
    );
  }

  exportChart(format: "csv" | "png"): Promise<string | null> | string {
    const st = this.st();
    const { keys } = chartKeys();
    if (!keys.length) return "Nothing to export: no runs are shown (select runs, or clear the filters).";
    if (!st.field) return "Nothing to export: choose a field first.";
    return runExport(`Bar chart ${format.toUpperCase()}`, () =>
      api.exportChart({ chart: "bar", keys, field: st.field!, group_by: st.groupBy }, format),
    );
  }
}
