// The telemetry of a run TraceML captured (DESIGN §4), from the telemetry half of GET
// /api/runs/<key>/performance-page (perfAnswers.ts: kept per run, shared by the inspector and the
// Performance view). Two variants: in the inspector a compact summary (what went wrong, the
// diagnoses with the headline numbers, and a link to the Performance view); on the Performance page
// the diagnoses (the page shows the headline above them), the page's own blocks (phase breakdown,
// ranks × steps), memory, host/GPU load and the captured rank logs. Each thing is shown once: the
// page's heatmap is the per-rank view and its stacked area the step breakdown. Log lines and every
// other value from the run's files go in as text (textContent), never as HTML.

import type uPlot from "uplot";
import { fmtPerf } from "../columns";
import { type Child, debounce, h, replace } from "../dom";
import { binaryTicks, clockTicks, fmtBinaryTicks, fmtBytes, fmtClock, fmtNum, fmtWallTime, ranksText } from "../format";
import { icon } from "../icons";
import { isFresh, keptAnswer, perfAnswer } from "../perfAnswers";
import { store } from "../store";
import type { Diagnoses, Finding, RankLog, TelemetryChart, TelemetryResponse } from "../types";
import { button, errorText, paletteColor, segmented, select, stickToEnd, swatch, token, withAlpha } from "../ui";
import { loadUPlot, placePlotTip } from "./lineChart";
import { niceTicks, ticksCovering } from "./scales";

const PLOT_H = 200;
const STATE_TEXT: Record<string, string> = {
  missing: "No telemetry database in this run.",
  empty: "The telemetry database holds no rows yet.",
  corrupt: "The telemetry database is damaged: its charts cannot be drawn.",
  unreadable: "The telemetry database cannot be read now (locked or not permitted).",
};

type Stream = "all" | "stdout" | "stderr";

interface Line {
  label: string;
  color: string;
  width: number;
  values: (number | null)[];
  dash?: number[];
}

interface PlotOpts {
  xLabel: string;
  xFmt: (v: number) => string;
  yFmt: (v: number) => string;
  logY?: boolean;
  spanGaps?: boolean;
  /** A shaded x range (the warm-up steps). */
  band?: [number, number] | null;
  /** The chart's name: a zoom made on it is kept across live redraws of the same run. */
  id?: string;
  /** x is wall time (seconds): ticks at clock steps (`0s 15s 30s 45s 1m 1m 15s`). */
  xTime?: boolean;
  /** y is bytes: ticks at power-of-two steps (`128 MiB 256 MiB`). */
  yBytes?: boolean;
}

/** What a chart of the "Memory and system" block draws. */
interface TimeChart {
  title: string;
  testid: string;
  chart: TelemetryChart | null | undefined;
  /** "step" (x = step) or "time" (x = seconds since the run's first sample). */
  x: "step" | "time";
  y: "bytes" | "percent" | "watts" | "celsius";
  /** A line's colour group and dash from its series name (a GPU's power and its limit share a colour). */
  style?: (name: string) => { group: string; dash?: number[] };
}

const Y_FMT: Record<TimeChart["y"], (v: number) => string> = {
  bytes: fmtBytesShort,
  percent: (v) => `${fmtNum(v)}%`,
  watts: (v) => `${fmtNum(v)} W`,
  celsius: (v) => `${fmtNum(v)} °C`,
};

/** `1.2 GiB` style bytes (1024-based) for axes and tooltips, shorter than format.ts's fmtBytes. */
function fmtBytesShort(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Math.abs(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${n < 0 ? "-" : ""}${v >= 100 || i === 0 ? Math.round(v) : Number(v.toFixed(1))} ${units[i]}`;
}

export class TelemetryPanel {
  /** Where the section goes in the inspector; empty (hidden) while the run has no telemetry. */
  readonly host = h("div", { class: "telem-host", testid: "telemetry-host" });
  private key: string | null = null;
  private seq = 0;
  private data: TelemetryResponse | null = null;
  private error: string | null = null;
  private plots: uPlot[] = [];
  private logRank: string | null = null;
  private logStream: Stream = "all";
  private open = true;
  /** The x range the user zoomed each chart to (by PlotOpts.id), restored when a live update redraws it. */
  private zooms = new Map<string, [number, number]>();
  private resizeObs = new ResizeObserver(debounce(() => this.resize(), 80));

  /**
   * `variant`: "summary" (the inspector: the diagnoses and a link to the Performance view, opened by
   * `openPage`) or "page" (the Performance view: `extra`'s blocks for the same answer right after
   * the diagnoses, then memory, host and GPU, and the captured output); `title`: the section's title.
   */
  constructor(
    private opts: { variant?: "summary" | "page"; extra?: (d: TelemetryResponse) => Child[]; title?: string; openPage?: (key: string) => void } = {},
  ) {
    this.resizeObs.observe(this.host);
  }

  private get page(): boolean {
    return this.opts.variant === "page";
  }

  /** The answer last shown (null before the first one). */
  get current(): TelemetryResponse | null {
    return this.data;
  }

  /** Show run `key` (a new run starts from a clean state). The answer kept for it is drawn at
   * once (nothing is redrawn when it is the one on screen); it is fetched only when the server said
   * the run changed since, or when none is kept. `force`: draw again even if unchanged. */
  show(key: string, force = false): void {
    if (key !== this.key) {
      this.key = key;
      this.data = null;
      this.error = null;
      this.logRank = null;
      this.logStream = "all";
      this.zooms.clear();
      this.destroyPlots();
      replace(this.host);
    }
    const kept = keptAnswer(key)?.telemetry;
    if (kept && (kept !== this.data || force)) {
      this.data = kept;
      this.error = null;
      this.render();
    }
    if (!isFresh(key)) void this.fetch(key);
  }

  /** Draw the answer on screen again (a setting of the page's blocks changed). */
  redraw(): void {
    if (this.data || this.error) this.render();
  }

  private async fetch(key: string): Promise<void> {
    const seq = ++this.seq;
    try {
      const answer = await perfAnswer(key);
      if (seq !== this.seq || key !== this.key) return;
      if (answer.telemetry === this.data && !this.error) return; // unchanged: nothing to redraw
      this.data = answer.telemetry;
      this.error = null;
    } catch (err) {
      if (seq !== this.seq || key !== this.key) return;
      this.error = errorText(err);
    }
    this.render();
  }

  // -- the section ----------------------------------------------------------------------------------

  private render(): void {
    this.destroyPlots();
    const d = this.data;
    if (this.error && !d) {
      replace(this.host, this.section(h("div", { class: "callout callout-error", testid: "telemetry-error", text: this.error })));
      return;
    }
    if (!d || d.state === "none") {
      replace(this.host);
      return;
    }
    const mounts: (() => void)[] = [];
    const body = this.page
      ? h("div", { class: "telem" }, this.notices(d), this.diagnoses(d), ...(this.opts.extra ? this.opts.extra(d) : []), this.timeCharts(d, mounts), this.logs(d))
      : h("div", { class: "telem" }, this.notices(d), this.diagnoses(d), this.pageLink(d));
    replace(this.host, this.section(body));
    if (!mounts.length) return;
    if (!uPlotCtor) {
      void loadUPlot().then((m) => {
        uPlotCtor = m;
        if (this.data === d) this.render();
      });
      return;
    }
    for (const m of mounts) m();
  }

  private section(content: Child): HTMLElement {
    const det = h(
      "details",
      { class: "insp-section", testid: this.page ? "perf-telemetry" : "inspector-telemetry" },
      h("summary", { class: "insp-section-title" }, h("span", { text: this.opts.title ?? "Telemetry" }), this.data?.live ? h("span", { class: "telem-live", text: this.data.finalizing ? "finalizing" : "live" }) : null),
      content,
    );
    det.open = this.open;
    det.addEventListener("toggle", () => {
      if (det.open === this.open) return; // the open state set above, not a click
      this.open = det.open;
      if (det.open) this.render(); // charts measure their width: draw them once visible
    });
    return det;
  }

  private notices(d: TelemetryResponse): HTMLElement | null {
    const items: Child[] = [];
    const status = d.diagnoses?.status;
    if (status && status !== "ok") {
      items.push(
        h(
          "div",
          { class: "callout callout-warn telem-callout", testid: "telemetry-status" },
          h("div", { class: "callout-head" }, icon("warning"), h("span", { text: `Telemetry ${status}` })),
          d.diagnoses?.detail ? h("div", { class: "telem-callout-text", text: d.diagnoses.detail }) : null,
        ),
      );
    } else if (d.state !== "ok") {
      items.push(
        h(
          "div",
          { class: "callout callout-warn telem-callout", testid: "telemetry-status" },
          h("div", { class: "callout-head" }, icon("warning"), h("span", { text: STATE_TEXT[d.state] ?? `Telemetry ${d.state}` })),
          d.detail ? h("div", { class: "telem-callout-text", text: d.detail }) : null,
        ),
      );
    }
    // The database's own problem is said once, in the callout above, not again in the list below.
    const warnings = d.detail && d.state !== "ok" ? d.warnings.filter((w) => !w.endsWith(d.detail!)) : d.warnings;
    if (d.finalization?.unreadable) {
      items.push(
        h(
          "div",
          { class: "callout callout-warn telem-callout", testid: "telemetry-partial" },
          h("div", { class: "callout-head" }, icon("warning"), h("span", { text: "Partial telemetry: what was lost during capture is unknown" })),
          h("div", { class: "telem-callout-text", text: d.finalization.unreadable }),
        ),
      );
    } else if (d.finalization && d.finalization.summary.length) {
      items.push(
        h(
          "div",
          { class: "callout callout-warn telem-callout", testid: "telemetry-partial" },
          h("div", { class: "callout-head" }, icon("warning"), h("span", { text: "Partial telemetry: something was lost during capture" })),
          h("ul", { class: "warn-list" }, ...d.finalization.summary.map((line) => h("li", { text: line }))),
        ),
      );
    }
    if (warnings.length) {
      items.push(
        h(
          "div",
          { class: "callout callout-warn telem-callout", testid: "telemetry-warnings" },
          h("div", { class: "callout-head" }, icon("warning"), h("span", { text: `Problems reading the telemetry (${warnings.length})` })),
          h("ul", { class: "warn-list" }, ...warnings.map((w) => h("li", { text: w }))),
        ),
      );
    }
    return items.length ? h("div", { class: "telem-notices" }, ...items) : null;
  }

  /** The inspector's pointer to the rest: the charts live on the Performance page, once. */
  private pageLink(d: TelemetryResponse): HTMLElement | null {
    const key = this.key;
    if (!key || !this.opts.openPage || d.state === "none") return null;
    const open = this.opts.openPage;
    return h(
      "div",
      { class: "telem-block telem-more", testid: "telemetry-more" },
      h("span", { class: "telem-note", text: "The step time by phase, each rank's step times, memory, host and GPU, and the captured output: in the Performance view." }),
      button("Open Performance view", { small: true, kind: "default", icon: "performance", testid: "telemetry-open-performance", onClick: () => open(key) }),
    );
  }

  // -- diagnoses ------------------------------------------------------------------------------------

  private diagnoses(d: TelemetryResponse): HTMLElement | null {
    const diag = d.diagnoses;
    if (!diag) return null;
    const stats: [string, string][] = [];
    if (this.page) {
      // The page's facts above say these once.
    } else if (d.ranks) {
      // As the table and the Performance view print them (review 13h: "47.311 ms", "21.137" here)
      const median = d.ranks.iteration_median_ms;
      stats.push(["median step", median === null || median === undefined ? "–" : fmtPerf("perf.step_ms.p50", median)]);
      if (d.ranks.throughput_steps_per_s !== null) stats.push(["steps per second", fmtPerf("perf.steps_per_s", d.ranks.throughput_steps_per_s)]);
    }
    if (!this.page && diag.steps?.seen !== undefined && diag.steps.seen !== null) stats.push(["steps", String(diag.steps.seen)]);
    const seen = diag.ranks?.seen;
    if (!this.page && seen !== undefined) stats.push(["ranks", ranksText(seen, diag.ranks?.world_size)]);
    const findings = diag.findings;
    return h(
      "div",
      { class: "telem-block", testid: "telemetry-diagnoses" },
      h(
        "div",
        { class: "telem-sub" },
        h("span", { text: "Diagnoses" }),
        diag.source === "live" && d.live ? h("span", { class: "telem-note", testid: "diagnoses-provisional", text: "provisional: from the rows written so far", title: "No final summary yet: the rules ran over the telemetry as it is now" }) : null,
      ),
      diag.source === "live" && !d.live
        ? h("div", {
            class: "callout callout-warn",
            testid: "diagnoses-no-verdict",
            // A summary that exists but cannot be read is not a summary that was never written.
            text: d.final_summary_error
              ? `No final verdict: ${d.final_summary_error}. Below, the rules run over the rows in aggregator/telemetry.sqlite; \`traceml summary ${this.runRef()}\` prints the same in a terminal.`
              : `The run ended without a final verdict (no aggregator/final_summary.json: the aggregator stopped before writing it). Below, the rules run over the rows it wrote; \`traceml summary ${this.runRef()}\` prints the same in a terminal.`,
          })
        : null,
      stats.length
        ? h("div", { class: "telem-stats" }, ...stats.map(([k, v]) => h("div", { class: "telem-stat", testid: `telemetry-stat-${k.replace(/[^a-z0-9]+/g, "-")}` }, h("span", { class: "telem-stat-k", text: k }), h("span", { class: "telem-stat-v", text: v }))))
        : null,
      findings.length ? h("div", { class: "findings" }, ...findings.map((f) => this.finding(f))) : null,
      diag.unread_findings
        ? h("div", { class: "callout callout-error", testid: "finding-unread", text: `${diag.unread_findings} finding${diag.unread_findings === 1 ? "" : "s"} of the summary could not be read (an unknown severity or shape) and ${diag.unread_findings === 1 ? "is" : "are"} left out: no verdict can be given.` })
        : findings.length
          ? null
          : diag.verdict && diag.verdict.kind !== "healthy"
            ? h("div", { class: "finding finding-unjudged", testid: "finding-not-judged", text: diag.verdict.text })
          : h("div", { class: "finding finding-ok", testid: "finding-none", text: "No problem found in the telemetry." }),
      this.abstentions(diag),
    );
  }

  /** How `traceml summary` names the run shown: its id, else its folder. */
  private runRef(): string {
    const run = this.key ? store.runs.get(this.key) : undefined;
    return run?.id || this.key || "RUN";
  }

  private finding(f: Finding): HTMLElement {
    const sev = ["info", "warning", "critical"].includes(f.severity) ? f.severity : "info";
    const e = f.evidence;
    const bits: string[] = [];
    if (e?.metric) {
      let s = e.metric;
      if (e.value !== null && e.value !== undefined) s += ` = ${fmtNum(e.value)}`;
      if (e.threshold !== null && e.threshold !== undefined) s += ` (threshold ${fmtNum(e.threshold)})`;
      bits.push(s);
    }
    if (e?.ranks && e.ranks.length) bits.push(`ranks ${e.ranks.map((r) => (r === null ? "?" : String(r))).join(", ")}`);
    if (e?.steps) bits.push(`steps ${e.steps[0]}–${e.steps[1]}`);
    return h(
      "div",
      { class: `finding sev-${sev}`, testid: "finding", data: { kind: f.kind, severity: sev } },
      h("div", { class: "finding-head" }, h("span", { class: `sev-badge sev-${sev}`, testid: "finding-severity", text: sev }), h("span", { class: "finding-kind", text: f.kind })),
      h("div", { class: "finding-summary", testid: "finding-summary", text: f.summary }),
      f.action ? h("div", { class: "finding-action", text: f.action }) : null,
      bits.length ? h("div", { class: "finding-evidence", text: bits.join(" · ") }) : null,
    );
  }

  private abstentions(diag: Diagnoses): HTMLElement | null {
    if (!diag.abstained.length) return null;
    return h(
      "details",
      { class: "abstained", testid: "abstentions" },
      h("summary", { text: `${diag.abstained.length} rule${diag.abstained.length === 1 ? "" : "s"} could not judge` }),
      h(
        "ul",
        { class: "abstained-list" },
        ...diag.abstained.map((a) => h("li", {}, h("span", { class: "abstained-rule", text: a.rule ?? "?" }), h("span", { text: a.reason ?? "" }))),
      ),
    );
  }

  // -- charts ---------------------------------------------------------------------------------------

  private card(title: string, testid: string, chart: TelemetryChart, extra?: Child): { card: HTMLElement; plot: HTMLElement; legend: HTMLElement } {
    const plot = h("div", { class: "plot telem-plot" });
    const legend = h("div", { class: "telem-legend" });
    const card = h(
      "div",
      { class: "chart-card telem-card", testid },
      h(
        "div",
        { class: "chart-card-head" },
        h("span", { class: "chart-card-title", text: title }),
        chart.downsampled ? h("span", { class: "chart-card-note", title: `${chart.raw_points} points`, text: "downsampled" }) : null,
        extra ?? null,
      ),
      legend,
      plot,
    );
    return { card, plot, legend };
  }

  private timeCharts(d: TelemetryResponse, mounts: (() => void)[]): HTMLElement | null {
    const cards: HTMLElement[] = [];
    // A GPU's power limit is drawn dashed in its power line's colour.
    const power = (name: string) => (name.endsWith(" power limit") ? { group: name.slice(0, -" power limit".length), dash: [4, 3] } : { group: name.replace(/ power$/, "") });
    const charts: TimeChart[] = [
      { title: "Peak memory per step", testid: "telemetry-memory", chart: d.memory, x: "step", y: "bytes" },
      { title: "Process RSS per rank", testid: "telemetry-rss", chart: d.rss, x: "time", y: "bytes" },
      { title: "Host CPU and RAM (%)", testid: "telemetry-host", chart: d.host, x: "time", y: "percent" },
      { title: "GPU utilisation and memory (%)", testid: "telemetry-gpu", chart: d.gpu, x: "time", y: "percent" },
      { title: "GPU power draw and limit (W)", testid: "telemetry-gpu-power", chart: d.gpu_power, x: "time", y: "watts", style: power },
      { title: "GPU temperature (°C)", testid: "telemetry-gpu-temperature", chart: d.gpu_temperature, x: "time", y: "celsius" },
    ];
    for (const t of charts) {
      const c = t.chart;
      if (!c || !c.x.length || !c.series.length) continue;
      const { card, plot, legend } = this.card(t.title, t.testid, c);
      const groups: string[] = [];
      const lines: Line[] = c.series.map((s, i) => {
        const st = t.style?.(s.name);
        if (!st) return { label: s.name, color: paletteColor(i), width: 1.5, values: s.y };
        if (!groups.includes(st.group)) groups.push(st.group);
        return { label: s.name, color: paletteColor(groups.indexOf(st.group)), width: 1.5, values: s.y, dash: st.dash };
      });
      const time = t.x === "time";
      const opts: PlotOpts = { xLabel: time ? "wall time" : "step", xFmt: time ? fmtWallTime : fmtNum, yFmt: Y_FMT[t.y], spanGaps: time, id: t.testid, xTime: time, yBytes: t.y === "bytes" };
      mounts.push(() => this.mountPlot(plot, legend, c.x, lines, opts));
      cards.push(card);
    }
    if (!cards.length) return null;
    return h("div", { class: "telem-block" }, h("div", { class: "telem-sub", text: "Memory and system" }), ...cards);
  }

  private mountPlot(el: HTMLElement, legend: HTMLElement, x: number[], lines: Line[], o: PlotOpts): void {
    const UPlot = uPlotCtor;
    if (!UPlot) return;
    const fix = (v: number | null) => (v === null || (o.logY && v <= 0) ? null : v);
    const data = [x, ...lines.map((l) => l.values.map(fix))] as uPlot.AlignedData;
    const axisColor = token("--text-2", "#8b949e");
    const gridColor = token("--chart-grid", "rgba(255,255,255,0.06)");
    const bandColor = withAlpha(token("--st-stale", "#d9a32e"), 0.08);
    const tooltip = h("div", { class: "plot-tip", attrs: { hidden: true } });
    const band = o.band;
    // A zoom (drag) is remembered per chart and put back on the redraw a live update brings; zoomed
    // out to the whole data (double-click) it is forgotten, and the chart follows the run again.
    const id = o.id;
    let armed = false;
    // The tick labels as drawn, on the chart's element for tests (`|` between them: a label may hold a space).
    let xTicks: string[] = [];
    let yTicks: string[] = [];
    // The y axis ends on a tick at or above the largest value (and starts at 0 or below the
    // smallest): RSS at 480 MiB shows a 512 MiB tick, a GPU at 92 % a 100 % one.
    let ySplits: number[] = [];
    const yRange = (_u: uPlot, min: number | null, max: number | null): uPlot.Range.MinMax => {
      const lo = Math.min(0, min ?? 0);
      const hi = max !== null && Number.isFinite(max) && max > lo ? max : lo + 1;
      ySplits = ticksCovering(o.yBytes ? binaryTicks(lo, hi, 6).ticks : niceTicks(lo, hi, 5), lo, hi);
      return [Math.min(lo, ySplits[0] ?? lo), Math.max(hi, ySplits[ySplits.length - 1] ?? hi)];
    };
    const zoomHooks = id
      ? {
          setScale: [
            (pu: uPlot, key: string) => {
              if (!armed || key !== "x" || !x.length) return;
              const { min, max } = pu.scales.x!;
              if (min === undefined || max === undefined || min === null || max === null) return;
              if (min <= x[0]! && max >= x[x.length - 1]!) this.zooms.delete(id);
              else this.zooms.set(id, [min, max]);
              pu.root.dataset.zoomed = this.zooms.has(id) ? "1" : "0";
            },
          ],
        }
      : {};
    const u = new UPlot(
      {
        width: Math.max(240, el.clientWidth || 400),
        height: PLOT_H,
        legend: { show: false },
        cursor: { drag: { x: true, y: false, setScale: true }, points: { size: 5 } },
        scales: {
          // A wall-time axis starts at 0 s (the run's first sample) even when this chart's first
          // sample came later, so its first tick reads "0s"; a zoom keeps its own start.
          x: o.xTime ? { time: false, range: (_u, min, max) => [min !== null && min > 0 && x.length && min <= x[0]! ? 0 : min, max] } : { time: false },
          y: o.logY ? { distr: 3, log: 10 } : { auto: true, range: yRange },
        },
        axes: [
          {
            stroke: axisColor,
            grid: { stroke: gridColor, width: 1 },
            ticks: { stroke: gridColor, width: 1 },
            font: "11px system-ui, sans-serif",
            // the tick (10 px), its gap and an 11 px label, clear of the axis title below
            size: 30,
            label: o.xLabel,
            labelFont: "11px system-ui, sans-serif",
            labelSize: 14,
            labelGap: 0,
            ...(o.xTime
              ? {
                  // Clock steps (15 s, 1 min, 5 min …) labelled in the units they need, not uPlot's 1.0833m.
                  splits: (su: uPlot, _ai: number, lo: number, hi: number) => clockTicks(lo, hi, Math.max(2, Math.floor(su.bbox.width / devicePixelRatio / 80))).ticks,
                  values: (_u: uPlot, splits: (number | null)[]) => {
                    const nums = splits.filter((v): v is number => v !== null);
                    const step = nums.length > 1 ? nums[1]! - nums[0]! : 1;
                    return (xTicks = splits.map((v) => (v === null ? "" : fmtClock(v, step))));
                  },
                }
              : { values: (_u: uPlot, splits: (number | null)[]) => (xTicks = splits.map((v) => (v === null ? "" : o.xFmt(v)))) }),
          },
          {
            stroke: axisColor,
            grid: { stroke: gridColor, width: 1 },
            ticks: { stroke: gridColor, width: 1 },
            font: "11px system-ui, sans-serif",
            // wide enough for the longest tick label (`381 MiB`, `100%`, `40`)
            size: (_u: uPlot, values: string[] | null) => Math.max(40, 22 + 7 * Math.max(0, ...(values ?? []).map((v) => v.length))),
            ...(o.yBytes
              ? {
                  // Power-of-two steps in one unit (128 MiB, 256 MiB), not 191 MiB and 381 MiB.
                  // (every chart is PLOT_H tall: 3 to 6 ticks)
                  splits: (_su: uPlot, _ai: number, lo: number, hi: number) => (o.logY ? binaryTicks(lo, hi, 6).ticks : ySplits),
                  values: (_u: uPlot, splits: (number | null)[]) => (yTicks = fmtBinaryTicks(splits)),
                }
              : {
                  ...(o.logY ? {} : { splits: () => ySplits }),
                  values: (_u: uPlot, splits: (number | null)[]) => (yTicks = splits.map((v) => (v === null ? "" : o.yFmt(v)))),
                }),
          },
        ],
        // A short run has a few samples per line: draw them as points too, or a lone sample is invisible.
        series: [{}, ...lines.map((l) => ({ label: l.label, stroke: l.color, width: l.width, dash: l.dash, spanGaps: !!o.spanGaps, points: { show: x.length <= 60, size: 5, fill: l.color } }))],
        hooks: {
          drawClear: band
            ? [
                (pu: uPlot) => {
                  const left = pu.valToPos(band[0] - 0.5, "x", true);
                  const right = pu.valToPos(band[1] + 0.5, "x", true);
                  const l = Math.max(pu.bbox.left, left);
                  const r = Math.min(pu.bbox.left + pu.bbox.width, right);
                  if (r <= l) return;
                  pu.ctx.save();
                  pu.ctx.fillStyle = bandColor;
                  pu.ctx.fillRect(l, pu.bbox.top, r - l, pu.bbox.height);
                  pu.ctx.restore();
                },
              ]
            : [],
          setCursor: [(pu: uPlot) => this.tip(pu, tooltip, lines, o)],
          draw: [
            () => {
              el.dataset.xTicks = xTicks.filter((t) => t !== "").join("|");
              el.dataset.yTicks = yTicks.filter((t) => t !== "").join("|");
            },
          ],
          ...zoomHooks,
        },
      },
      data,
      el,
    );
    if (id) {
      // uPlot sets its first x range in a microtask queued while it was built; after that one, put
      // the remembered zoom back and start recording the user's.
      queueMicrotask(() => {
        armed = true;
        const z = this.zooms.get(id);
        if (z && u.root.isConnected) u.setScale("x", { min: z[0], max: z[1] });
      });
    }
    el.appendChild(tooltip);
    u.over.addEventListener("mouseleave", () => {
      tooltip.hidden = true;
    });
    this.plots.push(u);
    replace(
      legend,
      ...lines.map((l, i) => {
        const item = h("button", { type: "button", class: "legend-item", testid: "telemetry-legend-item", title: "click: hide/show" }, swatch(l.color), h("span", { text: l.label }));
        item.addEventListener("click", () => {
          const shown = u.series[i + 1]?.show !== false;
          u.setSeries(i + 1, { show: !shown });
          item.classList.toggle("is-off", shown);
        });
        return item;
      }),
    );
  }

  private tip(u: uPlot, el: HTMLElement, lines: Line[], o: PlotOpts): void {
    const idx = u.cursor.idx;
    if (idx === null || idx === undefined || u.cursor.left === undefined || u.cursor.left < 0) {
      el.hidden = true;
      return;
    }
    const xv = u.data[0][idx];
    const rows: HTMLElement[] = [];
    lines.forEach((l, i) => {
      if (u.series[i + 1]?.show === false) return;
      const v = u.data[i + 1]?.[idx];
      if (v === null || v === undefined) return;
      rows.push(h("div", { class: "plot-tip-row" }, swatch(l.color, "swatch swatch-sm"), h("span", { class: "plot-tip-name", text: l.label }), h("span", { class: "plot-tip-v", text: o.yFmt(v) })));
    });
    if (!rows.length || xv === undefined) {
      el.hidden = true;
      return;
    }
    replace(el, h("div", { class: "plot-tip-x", text: `${o.xLabel} ${o.xFmt(xv)}` }), ...rows);
    el.hidden = false;
    placePlotTip(el, u);
  }

  private destroyPlots(): void {
    for (const p of this.plots) p.destroy();
    this.plots = [];
  }

  private resize(): void {
    for (const p of this.plots) {
      const parent = p.root.parentElement;
      // A hidden view (or a closed section) has no width: its charts keep theirs, not shrunk and
      // widened again when it is shown.
      if (!parent || !parent.isConnected || parent.clientWidth === 0) continue;
      const w = Math.max(240, parent.clientWidth);
      if (Math.abs(w - p.width) > 2) p.setSize({ width: w, height: PLOT_H });
    }
  }

  // -- logs -----------------------------------------------------------------------------------------

  private logs(d: TelemetryResponse): HTMLElement {
    const logs = d.logs;
    const head = h("div", { class: "telem-sub" }, h("span", { text: "Captured output" }));
    if (!logs.length) return h("div", { class: "telem-block", testid: "telemetry-logs" }, head, h("div", { class: "muted", text: "No captured stdout/stderr." }));
    if (this.logRank === null || !logs.some((l) => l.rank === this.logRank)) this.logRank = logs[0]!.rank;
    const log = logs.find((l) => l.rank === this.logRank)!;
    const view = h("div", { class: "log-view", testid: "telemetry-log", attrs: { role: "log", tabindex: 0 } });
    const count = h("span", { class: "telem-note" });
    const toEnd = stickToEnd(view);
    const drawLines = (which: RankLog) => {
      const shown = which.lines.filter(([stream]) => this.logStream === "all" || stream === this.logStream);
      replace(
        view,
        ...(shown.length
          ? shown.map(([stream, text]) => h("div", { class: `log-line${stream === "stderr" ? " log-stderr" : ""}`, testid: "log-line", data: { stream: stream ?? "" }, text }))
          : [h("div", { class: "muted", text: "No lines for this filter." })]),
      );
      count.textContent = `${shown.length} line${shown.length === 1 ? "" : "s"}` + (which.truncated ? ` · last ${which.lines.length} of ${fmtBytes(which.size)}` : "");
      toEnd();
    };
    const rankSel =
      logs.length > 1
        ? select(
            logs.map((l) => ({ value: l.rank, label: `rank ${l.rank}` })),
            this.logRank,
            (v) => {
              this.logRank = v;
              const next = logs.find((l) => l.rank === v);
              if (next) drawLines(next);
            },
            "telemetry-log-rank",
            "Which rank's output",
          )
        : h("span", { class: "telem-note", text: `rank ${log.rank}` });
    const streams = segmented<Stream>(
      [
        { value: "all", label: "All" },
        { value: "stdout", label: "stdout" },
        { value: "stderr", label: "stderr" },
      ],
      this.logStream,
      (v) => {
        this.logStream = v;
        for (const b of streams.querySelectorAll<HTMLElement>(".seg")) {
          const on = b.dataset.value === v;
          b.classList.toggle("is-active", on);
          b.setAttribute("aria-selected", on ? "true" : "false");
        }
        const current = logs.find((l) => l.rank === this.logRank);
        if (current) drawLines(current);
      },
      (v) => `telemetry-log-${v}`,
      "segmented-sm",
    );
    drawLines(log);
    return h("div", { class: "telem-block", testid: "telemetry-logs" }, head, h("div", { class: "log-tools" }, rankSel, streams, count), view);
  }
}

// uPlot's constructor once loaded (loaded on first use, as lineChart.ts does).
let uPlotCtor: typeof uPlot | null = null;
