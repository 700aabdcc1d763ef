// The Performance view: the telemetry of one or more captured runs on a full page (issue 13 item 2).
// Per run: the diagnoses first (severity, evidence, action), then the step broken down by phase over
// the steps (a stacked area of rolling medians, the warm-up shaded, ms or share), the ranks × steps
// heatmap of step time with the per-rank medians and the straggler marked, then the inspector's
// telemetry blocks (memory, host and GPU, the captured output with stream and rank filters, what was
// lost). With two or more runs, their phase shares as paired bars with the difference on top, and
// `traceml compare`'s verdict per metric of each run against the first. A panel without data says why.
// Everything comes from GET /api/runs/<key>/performance-page (one answer per run, the telemetry and
// per-rank halves built from one read: perfAnswers.ts keeps it, so reopening the view neither fetches
// nor redraws) and /compare; every value from a run's files goes in as text. Live (issue 13 item 3):
// when the server pushes that a shown run changed (its telemetry grew), its answer is fetched again
// and the page redrawn in place, the step count and the charts from that one answer; the diagnoses of
// a run without a final summary are marked provisional, and a zoom on a chart is kept (the stacked
// area zooms like the line charts: drag, double-click to reset, finer points fetched for the range).
// Exports (item 4): each panel saves its data as CSV and its picture as a 300-DPI PNG, drawn by the
// server.

import { runExport } from "../actions";
import { api } from "../api";
import { fmtPerf, isCaptured, perfMissingReason, runLabels } from "../columns";
import { type Child, h, replace, s, svgTitle } from "../dom";
import { fmtNum, ranksText } from "../format";
import type { ViewModule } from "../shell";
import { MAX_PERF_ZOOMS, store } from "../store";
import { keptAnswer } from "../perfAnswers";
import type { CompareResponse, PerformanceResponse, RunRow, TelemetryResponse, ZoomedBreakdown } from "../types";
import { button, emptyState, paletteColor, segmented, swatch } from "../ui";
import { niceTicks } from "./scales";
import { TelemetryPanel } from "./telemetry";

/** Built-in phases in loop order: [telemetry series name, perf.share key, label]. */
const PHASES: [string, string, string][] = [
  ["traceml:dataloader_next", "dataloader", "dataloader"],
  ["traceml:h2d", "h2d", "h2d"],
  ["traceml:forward", "forward", "forward"],
  ["traceml:backward", "backward", "backward"],
  ["traceml:optimizer_step", "optimizer", "optimizer"],
  ["other", "other", "other"],
];
const PHASE_COLOR: Record<string, number> = { dataloader: 1, h2d: 5, forward: 0, backward: 4, optimizer: 2, other: 7 };
/** The most runs the view shows at once. */
export const MAX_PERF_RUNS = 4;
const MAX_RUNS = MAX_PERF_RUNS;
const W = 860;
type Panel = "step" | "ranks" | "memory" | "gpu";
const PANEL_LABEL: Record<Panel, string> = { step: "step time by phase", ranks: "step time per rank", memory: "memory", gpu: "host and GPU" };
const VERDICT_CLASS: Record<string, string> = { regression: "sev-critical", improvement: "sev-ok", equivalent: "sev-info", inconclusive: "sev-muted" };

/** Open the Performance view on run `key` (the inspector's link): shown alone unless it is selected,
 * until the selection changes. */
export function openPerformance(key: string): void {
  store.set("perfRun", key); // in the address: a reload or a shared link opens this run
  store.openInspector(null); // the full page needs the room
  store.setView("performance");
}

/** The captured runs the view shows: the selected ones, else the one the inspector opened. */
/** The captured runs among the selection (the view shows the first MAX_RUNS of them). */
function selectedCaptured(): RunRow[] {
  return store.ui.selection.map((k) => store.runs.get(k)).filter((r): r is RunRow => !!r && isCaptured(r));
}

function shownRuns(): RunRow[] {
  const selected = store.ui.selection.map((k) => store.runs.get(k)).filter((r): r is RunRow => !!r && isCaptured(r));
  const focusKey = store.ui.perfRun;
  if (selected.length && (!focusKey || store.ui.selection.includes(focusKey))) return selected.slice(0, MAX_RUNS);
  const focus = focusKey ? store.runs.get(focusKey) : undefined;
  if (focus && isCaptured(focus)) return [focus];
  return selected.slice(0, MAX_RUNS);
}

/** The selected runs the view leaves out, each with why: not captured by traceml run (no telemetry
 * to show), or not listed (a key from the address that no poll has brought). Empty while the view
 * shows the inspector's run instead of the selection. */
function leftOut(): { name: string; why: string }[] {
  const focusKey = store.ui.perfRun;
  if (focusKey && !store.ui.selection.includes(focusKey)) return [];
  return store.ui.selection.flatMap((k) => {
    const r = store.runs.get(k);
    if (r && isCaptured(r)) return [];
    const name = r ? r.name || r.id : k.split(/[\\/]/).filter(Boolean).pop() ?? k;
    return [{ name, why: r ? "not captured by traceml run" : "not listed by the server" }];
  });
}

function leftOutText(left: { name: string; why: string }[]): string {
  return left.map((l) => `${l.name} (${l.why})`).join(", ");
}

/** What the view shows, in short: the shown runs, or the run it waits for and whether it is listed. */
function shownState(): string {
  const runs = shownRuns();
  const focus = store.ui.perfRun;
  if (runs.length || !focus) return [...runs.map((r) => r.key), `left: ${leftOutText(leftOut())}`].join("\n");
  return `waiting\n${focus}\n${store.runs.has(focus) ? "listed" : ""}`;
}

/** `v` to 3 significant digits, never in exponent form (`1,234`, `12.3`, `0.0123`): the precision
 * of `traceml compare`'s reason lines, so a row's numbers and its reason agree. */
export function sig3(v: number): string {
  if (v === 0 || !Number.isFinite(v)) return String(v);
  const d = Math.min(6, Math.max(0, 2 - Math.floor(Math.log10(Math.abs(v)))));
  return v.toLocaleString("en-US", { minimumFractionDigits: d, maximumFractionDigits: d });
}

/** A compare median in its unit, as the reason lines write it (`12.3 ms`, `466 MiB`, `81.2 steps/s`, `40.0%`). */
function amount(v: number | null, unit: string): string {
  if (v === null) return "–";
  if (unit === "bytes") return `${sig3(v / 1048576)} MiB`;
  if (unit === "percent") return `${sig3(v)}%`;
  return `${sig3(v)} ${unit}`;
}

/** A signed change in percent, one decimal (`+3.2%`, `−0.4%`). */
function signedPct(p: number): string {
  return `${p >= 0 ? "+" : "−"}${Math.abs(p).toFixed(1)}%`;
}

/** The change B/A − 1 with its interval, every bound at the change's precision (`+3.2% [+1.0%, +5.5%]`). */
function changeText(m: CompareResponse["metrics"][number]): string {
  if (m.change_pct === null) return "–";
  const lo = m.ci_low;
  const hi = m.ci_high;
  const range = typeof lo === "number" && typeof hi === "number" ? ` [${signedPct((lo - 1) * 100)}, ${signedPct((hi - 1) * 100)}]` : "";
  return `${signedPct(m.change_pct)}${range}`;
}

/** A rolling median of `values` over `window` points (nulls skipped). */
function rollingMedian(values: (number | null)[], window: number): (number | null)[] {
  const half = Math.floor(window / 2);
  return values.map((_, i) => {
    const part = values.slice(Math.max(0, i - half), i + half + 1).filter((v): v is number => v !== null && Number.isFinite(v));
    if (!part.length) return null;
    part.sort((a, b) => a - b);
    const m = part.length >> 1;
    return part.length % 2 ? part[m]! : (part[m - 1]! + part[m]!) / 2;
  });
}

/** The step range run `key`'s stacked area is zoomed to, or null (the address keeps it: UiState.perfZoom). */
function zoomOf(key: string): [number, number] | null {
  return store.ui.perfZoom[key] ?? null;
}

/** Zoom run `key`'s stacked area to `range` (null: every step); the most recently zoomed runs are kept. */
function setZoom(key: string, range: [number, number] | null): void {
  const next = Object.fromEntries(Object.entries(store.ui.perfZoom).filter(([k]) => k !== key));
  if (range) next[key] = range;
  const keys = Object.keys(next);
  for (const k of keys.slice(0, Math.max(0, keys.length - MAX_PERF_ZOOMS))) delete next[k];
  store.set("perfZoom", next);
}

export class PerformanceView implements ViewModule {
  private host!: HTMLElement;
  private visible = false;
  private panels = new Map<string, TelemetryPanel>();
  /** Each run's "live" badge, kept across redraws and set from every telemetry answer. */
  private liveBadges = new Map<string, HTMLElement>();
  /** The finer breakdown fetched for a run's zoomed range, with the answer stamp it was cut from. */
  private zoomed = new Map<string, { range: [number, number]; stamp: string; data: ZoomedBreakdown["breakdown"] | "loading" }>();
  /** What the last full draw showed (the runs, their perf facts, the verdicts): the same on show() → no redraw. */
  private drawn = "";
  /** {@link shownState} when the view last rendered. */
  private drawnState = "";
  /** `traceml compare` answers by "baseline|run". */
  private verdicts = new Map<string, CompareResponse | string>();
  /** The phase chart's scale, kept in the address (review 13h: a reload lost it). */
  private get mode(): "ms" | "share" {
    return store.ui.perfMode;
  }
  /** What the heatmap colours: each rank's iteration, or its work outside backward (tells a DDP straggler). */
  private heatMode: "iteration" | "local" | null = null;

  mount(host: HTMLElement): void {
    this.host = h("div", { class: "perf-view", testid: "performance" });
    host.appendChild(this.host);
    let seen = store.ui.selection.join("\n");
    store.on("selection", () => {
      // A new selection is what the user wants to see; one from the address (Back/Forward) keeps its
      // run, and so does a "selection" event that changed nothing (a view re-applying the same keys).
      const now = store.ui.selection.join("\n");
      if (now !== seen && !store.restoring && store.ui.perfRun !== null) store.set("perfRun", null);
      seen = now;
      if (this.visible) this.render();
    });
    // Back/Forward (or an edited address) may zoom a shown run's stacked area elsewhere.
    store.on("restored", () => {
      if (this.visible) for (const run of shownRuns()) this.redrawBreakdown(run);
    });
    // Pushed over server-sent events (live.ts): a shown run changed (a live run's telemetry grew, or
    // its final summary arrived). Fetch its answers again; the old ones stay on screen until then.
    store.on("runs", (changed) => {
      if (!this.visible || !Array.isArray(changed)) return;
      const shown = shownRuns().map((r) => r.key);
      // A run the view was asked for but cannot show yet (a link to a run that just started: not
      // listed, or no telemetry yet) is drawn as soon as a poll brings it (review 13f).
      if (shownState() !== this.drawnState) {
        this.render();
        return;
      }
      const hit = shown.filter((k) => changed.includes(k));
      if (!hit.length) return;
      for (const key of hit) {
        this.panels.get(key)?.show(key); // its kept answer is stale now: fetched again, drawn when it comes
        for (const id of [...this.verdicts.keys()]) if (id.split("|").includes(key)) this.fetchVerdicts(id);
      }
    });
  }

  /** The per-rank half of run `key`'s answer, or an error text, or undefined before it came. */
  private perfOf(key: string): PerformanceResponse | undefined {
    return keptAnswer(key)?.performance;
  }

  private fetchVerdicts(id: string): void {
    const [base, key] = id.split("|") as [string, string];
    const done = (res: CompareResponse | string) => {
      this.verdicts.set(id, res);
      if (this.visible) this.render();
    };
    api.compare(key, base).then(done, (err: unknown) => done(String(err)));
  }

  /** CSV and PNG buttons of one panel: the server writes the file into its cache folder. */
  private exportButtons(run: RunRow, panel: Panel): HTMLElement {
    const go = (format: "csv" | "png") => () =>
      void runExport(`${run.name || run.id}: ${PANEL_LABEL[panel]} ${format.toUpperCase()}`, () => api.exportPerformance(run.key, panel, format, panel === "step" && this.mode === "share", panel === "ranks" ? this.heatMode : null));
    return h(
      "span",
      { class: "perf-export", data: { panel } },
      button("CSV", { small: true, kind: "ghost", icon: "download", testid: `perf-export-csv-${panel}`, title: `Save the ${PANEL_LABEL[panel]} data as CSV`, onClick: go("csv") }),
      button("PNG", { small: true, kind: "ghost", icon: "download", testid: `perf-export-png-${panel}`, title: `Save the ${PANEL_LABEL[panel]} as a 300-DPI PNG`, onClick: go("png") }),
    );
  }

  show(): void {
    this.visible = true;
    // Reopened on what it showed: the page is still there, drawn; each panel fetches only if the
    // server said its run changed meanwhile (then it redraws itself when the answer comes).
    if (this.drawn && this.drawn === this.drawSignature()) {
      for (const run of shownRuns()) this.panels.get(run.key)?.show(run.key);
      return;
    }
    this.render();
  }

  private drawSignature(): string {
    const runs = shownRuns();
    return JSON.stringify([runs.map((r) => [r.key, r.name, r.perf, store.colorOf(r.key)]), [...this.verdicts.entries()].map(([k, v]) => [k, typeof v === "string" ? v : 1]), selectedCaptured().length, leftOutText(leftOut())]);
  }

  hide(): void {
    this.visible = false;
  }

  private render(): void {
    const runs = shownRuns();
    this.drawn = "";
    this.drawnState = shownState();
    const focus = store.ui.perfRun;
    if (!runs.length && focus) {
      // Asked for one run (its address, a bookmark) that cannot be shown yet: say which and why,
      // and draw it once a poll brings it (the "runs" listener above).
      const run = store.runs.get(focus);
      const name = run ? run.name || run.id : focus.split(/[\\/]/).filter(Boolean).pop() ?? focus;
      replace(
        this.host,
        emptyState(
          run ? `${name} has no telemetry yet` : `Run ${name} is not listed yet`,
          run
            ? "A run started with traceml run shows here once its aggregator writes telemetry (a few seconds after the start); a run not captured by traceml run never has any. This view draws it as soon as it does."
            : "The server lists a new run folder within a poll or two, and this view draws the run as soon as it is listed. If the folder is elsewhere, start traceml ui on its runs root.",
          button("Go to Runs", { kind: "primary", onClick: () => store.setView("runs") }),
          "performance-waiting",
        ),
      );
      return;
    }
    const left = leftOut();
    if (!runs.length && left.length) {
      // Selected runs that have nothing to show: say which and why (review 13h), not the generic hint.
      replace(
        this.host,
        emptyState(
          left.length === 1 && left[0]!.why === "not listed by the server" ? `Run ${left[0]!.name} is not listed yet` : left.length === 1 ? `${left[0]!.name} has no telemetry to show` : "None of the selected runs has telemetry to show",
          `Left out: ${leftOutText(left)}. ${left.some((l) => l.why === "not listed by the server") ? "The server lists a new run folder within a poll or two, and this view draws it as soon as it is listed. " : ""}Tick runs with the PERF badge (captured by traceml run) in the Runs table.`,
          button("Go to Runs", { kind: "primary", onClick: () => store.setView("runs") }),
          "performance-empty",
        ),
      );
      return;
    }
    if (!runs.length) {
      replace(
        this.host,
        emptyState(
          "Select captured runs to see their performance",
          "Tick one or more runs with the PERF badge (captured by traceml run) in the Runs table, or open a run's inspector and press its “Performance” button.",
          button("Go to Runs", { kind: "primary", onClick: () => store.setView("runs") }),
          "performance-empty",
        ),
      );
      return;
    }
    const sections: Child[] = [];
    const captured = selectedCaptured();
    if (runs.length === MAX_RUNS && captured.length > MAX_RUNS && runs.every((r) => captured.includes(r))) {
      // Never fewer runs than were asked for without a word (review 13d: 14 selected, 4 drawn).
      sections.push(
        h("div", {
          class: "callout",
          testid: "perf-runs-capped",
          text: `Showing ${MAX_RUNS} of the ${captured.length} selected captured runs (the first ${MAX_RUNS} in selection order): the view compares at most ${MAX_RUNS}. Untick runs in the Runs table to choose which.`,
        }),
      );
    }
    if (left.length) {
      sections.push(h("div", { class: "callout", testid: "perf-runs-left-out", text: `Left out of this view: ${leftOutText(left)}.` }));
    }
    if (runs.length >= 2) sections.push(this.pairedShares(runs), this.verdictTable(runs));
    for (const run of runs) sections.push(this.runSection(run));
    replace(this.host, ...sections);
    this.drawn = this.drawSignature();
  }

  // -- two or more runs: phase shares side by side ----------------------------------------------------

  private pairedShares(runs: RunRow[]): HTMLElement {
    const base = runs[0]!;
    // Two runs sharing a name are told apart by their short id, as in Compare (`baseline · e9df`).
    const labels = runLabels(runs);
    const nameOf = (r: RunRow): string => labels.get(r.key) ?? (r.name || r.id);
    const rowH = 18 * runs.length + 14;
    const labelW = 110;
    const barW = 420;
    const height = PHASES.length * rowH + 24;
    const svg = s("svg", { class: "perf-pairs-svg", width: labelW + barW + 200, height, role: "img" });
    PHASES.forEach(([, key, label], i) => {
      const y0 = 8 + i * rowH;
      svg.appendChild(s("text", { x: 0, y: y0 + rowH / 2, class: "perf-axis-label", "dominant-baseline": "middle" }, label));
      const baseShare = typeof base.perf[`share.${key}`] === "number" ? (base.perf[`share.${key}`] as number) : null;
      runs.forEach((run, j) => {
        const v = run.perf[`share.${key}`];
        const share = typeof v === "number" ? v : null;
        const y = y0 + j * 18;
        const w = share === null ? 0 : Math.max(1, share * barW);
        const g = s("g", { "data-testid": "perf-pair-bar", "data-phase": key, "data-run": run.name, "data-label": nameOf(run), "data-share": share === null ? "" : String(share) });
        const why = share === null ? (perfMissingReason(run, `perf.share.${key}`) ?? "not measured") : null;
        g.appendChild(s("rect", { x: labelW, y, width: w, height: 14, rx: 2, fill: paletteColor(store.colorOf(run.key)) }, svgTitle(`${nameOf(run)}: ${why ?? fmtPerf(`perf.share.${key}`, share!)}`)));
        g.appendChild(s("text", { x: labelW + w + 6, y: y + 7, class: "perf-bar-value", "dominant-baseline": "middle", ...(why ? { "data-testid": "perf-pair-missing" } : {}) }, share === null ? "–" : fmtPerf(`perf.share.${key}`, share)));
        // The "–" says why on hover: the group's title covers it (a title inside the text would be read as its text).
        if (why) g.appendChild(svgTitle(why));
        if (j > 0 && share !== null && baseShare !== null) {
          const diff = (share - baseShare) * 100;
          const txt = `${diff >= 0 ? "+" : "−"}${Math.abs(diff).toFixed(1)} pp`;
          g.appendChild(s("text", { x: labelW + barW + 120, y: y + 7, class: `perf-diff ${Math.abs(diff) >= 5 ? "is-big" : ""}`, "data-testid": "perf-pair-diff", "dominant-baseline": "middle" }, txt));
        }
        svg.appendChild(g);
      });
    });
    const legend = h("div", { class: "perf-legend" }, ...runs.map((r) => h("span", { class: "legend-item" }, swatch(paletteColor(store.colorOf(r.key))), h("span", { testid: "perf-legend-label", text: nameOf(r) }))));
    return h(
      "section",
      { class: "perf-card", testid: "perf-pairs" },
      h("h2", { class: "perf-card-title", text: "Phase shares of the step" }),
      h("div", { class: "perf-card-hint", text: `Share of the iteration in each phase; the difference is against ${nameOf(base)}, in percentage points.` }),
      legend,
      svg,
    );
  }

  /** `traceml compare`'s verdict per metric of each run against the first (the baseline). */
  private verdictTable(runs: RunRow[]): HTMLElement {
    const base = runs[0]!;
    const labels = runLabels(runs);
    const nameOf = (r: RunRow): string => labels.get(r.key) ?? (r.name || r.id);
    const parts: Child[] = [];
    for (const run of runs.slice(1)) {
      const id = `${base.key}|${run.key}`;
      if (!this.verdicts.has(id)) {
        this.verdicts.set(id, "");
        this.fetchVerdicts(id);
      }
      const res = this.verdicts.get(id);
      const head = h("div", { class: "perf-card-hint", testid: "perf-verdict-head", text: `${nameOf(run)} against ${nameOf(base)}` });
      if (res === "" || res === undefined) {
        parts.push(head, h("div", { class: "muted", text: "Comparing…" }));
        continue;
      }
      if (typeof res === "string") {
        parts.push(head, h("div", { class: "callout callout-error", text: res }));
        continue;
      }
      const rows = res.metrics.map((m) =>
        h(
          "tr",
          { testid: "perf-verdict-row", data: { metric: m.metric, verdict: m.verdict, run: run.name } },
          h("td", { class: "perf-verdict-metric", text: m.metric }),
          h("td", { class: "num", text: amount(m.median_a, m.unit) }),
          h("td", { class: "num", text: amount(m.median_b, m.unit) }),
          h("td", { class: "num", testid: "perf-verdict-change", text: changeText(m) }),
          h("td", {}, h("span", { class: `sev-badge ${VERDICT_CLASS[m.verdict] ?? ""}`, testid: "perf-verdict", text: m.verdict, title: m.reason })),
          h("td", { class: "perf-verdict-reason muted", text: m.reason }),
        ),
      );
      parts.push(
        head,
        res.live ? h("div", { class: "telem-note", testid: "perf-verdicts-provisional", text: "provisional: a run is still live, the verdicts use the rows written so far" }) : null,
        h(
          "table",
          { class: "kv-table perf-verdicts-table" },
          h("thead", {}, h("tr", {}, ...["metric", nameOf(base), nameOf(run), "change [95% interval]", "verdict", "why"].map((t) => h("th", { text: t })))),
          h("tbody", {}, ...rows),
        ),
        ...res.problems.map((p) => h("div", { class: "telem-note", testid: "perf-verdict-problem", text: p })),
      );
    }
    return h(
      "section",
      { class: "perf-card", testid: "perf-verdicts" },
      h("h2", { class: "perf-card-title", text: "Verdict per metric (traceml compare)" }),
      h("div", { class: "perf-card-hint", text: "Ratio of medians after warm-up with a 95% bootstrap interval: regression or improvement only when the whole interval is past the margin." }),
      ...parts,
    );
  }

  // -- one run ----------------------------------------------------------------------------------------

  private runSection(run: RunRow): HTMLElement {
    let panel = this.panels.get(run.key);
    if (!panel) {
      panel = new TelemetryPanel({ variant: "page", title: "Diagnoses and telemetry", extra: (d) => this.extra(store.runs.get(run.key) ?? run, d) });
      this.panels.set(run.key, panel);
    }
    panel.show(run.key);
    const facts = h("dl", { class: "perf-facts" }, ...this.facts(run, panel.current));
    return h(
      "section",
      { class: "perf-run", testid: "perf-run", data: { key: run.key, name: run.name } },
      h(
        "div",
        { class: "perf-run-head" },
        swatch(paletteColor(store.colorOf(run.key))),
        h("h2", { class: "perf-run-name", text: run.name || run.id }),
        h("span", { class: "perf-run-id", text: run.id }),
        this.liveBadge(run.key, panel.current),
      ),
      facts,
      panel.host,
    );
  }

  private liveBadge(key: string, d: TelemetryResponse | null): HTMLElement {
    let badge = this.liveBadges.get(key);
    if (!badge) {
      badge = h("span", { class: "telem-live", testid: "perf-live", text: "live", title: "The run is still running: this page follows it" });
      this.liveBadges.set(key, badge);
    }
    badge.hidden = !d?.live;
    badge.textContent = d?.finalizing ? "finalizing" : "live";
    badge.title = d?.finalizing
      ? "The run ended; its aggregator is writing the final summary: this page follows it"
      : "The run is still running: this page follows it";
    return badge;
  }

  /** The run's headline facts: its perf.* columns, or, while it has no final summary yet, what the
   * rules find in the rows written so far (marked provisional). */
  private facts(run: RunRow, d: TelemetryResponse | null): HTMLElement[] {
    const p = run.perf;
    const live = d?.diagnoses?.source === "live" ? d : null;
    const ms = (v: unknown) => (typeof v === "number" ? fmtPerf("perf.step_ms.p50", v) : "–");
    let verdict = typeof p.verdict === "string" ? p.verdict : "–";
    // A run still running: what the rules find so far, provisional. A run that ended without a final
    // summary gets no verdict: it says so (the diagnoses below say how to get one in a terminal).
    if (live?.diagnoses) {
      const d = live.diagnoses;
      verdict = live.live
        ? `${d.findings[0]?.kind ?? (d.verdict?.kind === "healthy" ? "healthy" : d.verdict?.kind === "not_judged" ? "not_judged" : "–")} (provisional${live.finalizing ? ": the final summary is being written" : ""})`
        : live.final_summary_error
          ? "none: final_summary.json cannot be read" + (live.final_summary_error.includes("(damaged)") ? " (damaged)" : "")
          : "none: the run ended without a final summary";
    }
    const facts: [string, string][] = [
      ["verdict", verdict],
      ["median step", live ? ms(live.ranks?.iteration_median_ms) : ms(p["step_ms.p50"])],
      ["p95 step", live ? ms(live.ranks?.iteration_p95_ms) : ms(p["step_ms.p95"])],
      ["steps per second", live ? (typeof live.ranks?.throughput_steps_per_s === "number" ? fmtPerf("perf.steps_per_s", live.ranks.throughput_steps_per_s) : "–") : typeof p.steps_per_s === "number" ? fmtPerf("perf.steps_per_s", p.steps_per_s) : "–"],
      // From the same answer as the charts below: while a run is live the count and the chart's last step agree.
      ["steps", typeof d?.diagnoses?.steps?.seen === "number" ? String(d.diagnoses.steps.seen) : typeof p.steps === "number" ? String(p.steps) : "–"],
      ["ranks", d?.diagnoses?.ranks?.seen !== undefined ? ranksText(d.diagnoses.ranks.seen, d.diagnoses.ranks.world_size) : "–"],
      // Damage deep inside the database shows only once its rows are read: then it is partial too.
      ["telemetry", d?.state === "corrupt" && p.telemetry === "ok" ? "partial" : typeof p.telemetry === "string" ? p.telemetry : "–"],
    ];
    // An empty fact says why on hover, as its table cell does.
    const column: Record<string, string> = { "median step": "perf.step_ms.p50", "p95 step": "perf.step_ms.p95", "steps per second": "perf.steps_per_s" };
    return facts.flatMap(([k, v]) => {
      const why = v === "–" && column[k] ? perfMissingReason(run, column[k]!) : null;
      return [h("dt", { text: k }), h("dd", { testid: `perf-fact-${k.replace(/[^a-z0-9]+/g, "-")}`, text: v, title: why ?? undefined })];
    });
  }

  /** The blocks this view adds after the diagnoses of a run's telemetry answer. */
  private extra(run: RunRow, d: TelemetryResponse): Child[] {
    // The facts above the panel follow the answer just arrived (a live run's provisional verdict).
    const section = this.host.querySelector<HTMLElement>(`[data-testid=perf-run][data-key="${CSS.escape(run.key)}"] .perf-facts`);
    if (section) replace(section, ...this.facts(store.runs.get(run.key) ?? run, d));
    this.liveBadge(run.key, d);
    // Only the panels that have something to draw offer a file (a damaged database: none, review 13f).
    const savable = (["memory", "gpu"] as Panel[]).filter((p) =>
      p === "memory" ? !!(d.memory || d.rss) : !!(d.host || d.gpu || d.gpu_power || d.gpu_temperature));
    const exports = savable.length
      ? h(
          "div",
          { class: "telem-block perf-block perf-exports", testid: "perf-exports" },
          h("span", { class: "telem-note", text: "Save a panel:" }),
          ...savable.map((p) => h("span", { class: "perf-export-item" }, h("span", { text: PANEL_LABEL[p] }), this.exportButtons(run, p))),
        )
      : null;
    return [this.breakdown(run, d), this.heatmap(run, d), exports, this.missing(d)];
  }

  /** The step broken down by phase over the steps: a stacked area of rolling medians. Drag across
   * it to zoom into a step range (finer points are fetched for it), double-click to see every step
   * again; the zoom is kept when a live update redraws the chart. */
  private breakdown(run: RunRow, d: TelemetryResponse): HTMLElement {
    const block = (body: Child, ...head: Child[]) =>
      h("div", { class: "telem-block perf-block", testid: "perf-breakdown" }, h("div", { class: "telem-block-head" }, h("span", { class: "telem-block-title", text: "Step time by phase" }), ...head), body);
    // One rank at every step (/performance): the slowest by the straggler measure over the run, the
    // rank the diagnosis, the per-rank panel and perf.worst_rank name; its phases add up to its step.
    const res = this.perfOf(run.key);
    const unread = unreadable(d);
    if (res === undefined) return block(unread ? h("div", { class: "muted", testid: "perf-why", text: unread }) : h("div", { class: "muted", text: "Loading…" }));
    const whole = res.breakdown;
    if (unread && !whole) return block(h("div", { class: "muted", testid: "perf-why", text: unread }));
    if (!whole || !whole.x.length) return block(h("div", { class: "muted", testid: "perf-why", text: "No step times: this run was not traced with trace_step (or sent no step yet)." }));
    const warmupSteps = d.steps?.warmup_steps ?? res.heatmap.warmup_steps;
    const firstStep = whole.x[0]!;
    // Where the last bucket ends (x holds each bucket's first step): the run's last step, as the
    // heatmap says it (a long run read one step in k may not hold the shown rank's very last one).
    const lastStep = Math.max(whole.last_step ?? 0, whole.x[whole.x.length - 1]!, res.heatmap.last_step ?? 0);
    // The zoomed range: its finer points once fetched (for this answer), meanwhile the whole run's points in it.
    const zoom = zoomOf(run.key);
    let b = whole;
    if (zoom) {
      const stamp = keptAnswer(run.key)?.stamp ?? "";
      const got = this.zoomed.get(run.key);
      const current = got && got.range[0] === zoom[0] && got.range[1] === zoom[1];
      if (!current || got.stamp !== stamp) this.fetchZoom(run, zoom, stamp);
      if (current && got.data && got.data !== "loading") b = got.data;
      else {
        const keep = whole.x.map((x, i) => (x >= zoom[0] && x <= zoom[1] ? i : -1)).filter((i) => i >= 0);
        b = { ...whole, x: keep.map((i) => whole.x[i]!), iteration: keep.map((i) => whole.iteration[i] ?? null), series: whole.series.map((ser) => ({ name: ser.name, y: keep.map((i) => ser.y[i] ?? null) })) };
      }
    }
    const st = { x: b.x, series: b.series, warmup_steps: warmupSteps, downsampled: b.bucket_steps > 1 };
    const phases = PHASES.map(([name, key, label]) => ({ key, label, y: st.series.find((x) => x.name === name)?.y })).filter((p) => p.y) as { key: string; label: string; y: (number | null)[] }[];
    if (!phases.length) return block(h("div", { class: "muted", testid: "perf-why", text: "No phase times in this run's step rows." }));
    const n = st.x.length;
    const window = Math.max(1, Math.min(25, Math.round(n / 40)) | 1);
    const smooth = phases.map((p) => rollingMedian(p.y, window));
    const totals = Array.from({ length: n }, (_, i) => smooth.reduce((a, v) => a + (v[i] ?? 0), 0));
    const values = smooth.map((v) => v.map((x, i) => (this.mode === "share" ? (totals[i]! > 0 ? (x ?? 0) / totals[i]! : 0) : x ?? 0)));
    // Round y ticks (1, 2, 5 × 10^k ms; quarters of the step in share mode), the top one above the tallest step.
    const tallest = Math.max(1e-9, ...totals);
    const ticks = this.mode === "share" ? [0, 0.25, 0.5, 0.75, 1] : niceTicks(0, tallest, 4);
    if (this.mode !== "share" && ticks.length > 1 && ticks[ticks.length - 1]! < tallest) ticks.push(Number((ticks[ticks.length - 1]! + ticks[1]! - ticks[0]!).toPrecision(12)));
    const top = this.mode === "share" ? 1 : Math.max(tallest, ticks[ticks.length - 1] ?? tallest);
    const H = 220;
    const pad = { l: 78, r: 10, t: 8, b: 26 };
    const x0 = zoom ? zoom[0] : firstStep;
    const x1 = zoom ? zoom[1] : lastStep;
    const xs = (x: number) => pad.l + ((x - x0) / Math.max(1, x1 - x0)) * (W - pad.l - pad.r);
    const ys = (v: number) => pad.t + (1 - v / top) * (H - pad.t - pad.b);
    const svg = s("svg", {
      class: "perf-area-svg",
      viewBox: `0 0 ${W} ${H}`,
      width: W,
      height: H,
      "data-testid": "perf-area",
      "data-mode": this.mode,
      "data-top": top,
      "data-window": window,
      "data-rank": String(b.rank ?? "?"),
      "data-rank-basis": b.rank_basis,
      "data-last-step": lastStep,
      "data-zoomed": zoom ? "1" : "0",
      "data-x0": x0,
      "data-x1": x1,
      "data-bucket-steps": b.bucket_steps,
      "data-points": n,
    });
    const clip = `perf-clip-${Math.random().toString(36).slice(2)}`;
    svg.appendChild(s("defs", {}, s("clipPath", { id: clip }, s("rect", { x: pad.l, y: 0, width: W - pad.l - pad.r, height: H }))));
    const plot = s("g", { "clip-path": `url(#${clip})` });
    svg.appendChild(plot);
    const warmEnd = firstStep + st.warmup_steps;
    const base = new Array<number>(n).fill(0);
    // The last bucket's point at the last step it holds, so the area reaches the end of the axis.
    const endStep = zoom ? Math.max(b.last_step ?? 0, st.x[n - 1] ?? 0) : lastStep;
    const px = (i: number) => xs(i === n - 1 ? endStep : st.x[i]!).toFixed(1);
    values.forEach((vals, k) => {
      const upper = vals.map((v, i) => base[i]! + v);
      const pts = [...upper.map((v, i) => `${px(i)},${ys(v).toFixed(1)}`), ...base.map((v, i) => `${px(i)},${ys(v).toFixed(1)}`).reverse()];
      plot.appendChild(s("polygon", { points: pts.join(" "), fill: paletteColor(PHASE_COLOR[phases[k]!.key] ?? 7), "fill-opacity": 0.8, "data-testid": "perf-area-phase", "data-phase": phases[k]!.key }, svgTitle(phases[k]!.label)));
      for (let i = 0; i < n; i++) base[i] = upper[i]!;
    });
    if (st.warmup_steps > 0 && warmEnd > x0) {
      // Over the areas (translucent): under them it was hidden wherever they fill the chart, as
      // shares always do (review 13i).
      plot.appendChild(s("rect", { x: xs(Math.max(x0, firstStep)), y: pad.t, width: Math.max(0, xs(Math.min(warmEnd, x1)) - xs(Math.max(x0, firstStep))), height: H - pad.t - pad.b, class: "perf-warmup", "data-testid": "perf-warmup" }, svgTitle(`warm-up: the first ${st.warmup_steps} steps (left out of the diagnosis)`)));
    }
    for (const v of ticks) {
      svg.insertBefore(s("line", { x1: pad.l, x2: W - pad.r, y1: ys(v), y2: ys(v), class: "perf-grid" }), svg.firstChild); // under the areas
      svg.appendChild(s("text", { x: pad.l - 6, y: ys(v), class: "perf-axis-label", "data-testid": "perf-area-ytick", "text-anchor": "end", "dominant-baseline": "middle" }, this.mode === "share" ? `${Math.round(v * 100)}%` : `${fmtNum(v)} ms`));
    }
    svg.appendChild(s("text", { x: pad.l, y: H - 6, class: "perf-axis-label", "data-testid": "perf-area-from" }, `step ${fmtNum(Math.round(x0))}`));
    svg.appendChild(s("text", { x: W - pad.r, y: H - 6, class: "perf-axis-label", "text-anchor": "end", "data-testid": "perf-area-to" }, `step ${fmtNum(Math.round(x1))}`));
    this.zoomable(run, svg, pad, x0, x1, H);
    const legend = h("div", { class: "perf-legend" }, ...phases.map((p) => h("span", { class: "legend-item" }, swatch(paletteColor(PHASE_COLOR[p.key] ?? 7)), h("span", { text: p.label }))));
    const toggleMode = segmented<"ms" | "share">(
      [
        { value: "ms", label: "ms", title: "Milliseconds per step" },
        { value: "share", label: "Share", title: "Share of the step" },
      ],
      this.mode,
      (m) => {
        store.set("perfMode", m);
        this.redrawRuns();
      },
      (m) => `perf-mode-${m}`,
    );
    const rankId = String(b.rank ?? "?");
    const whose =
      b.rank_basis === "only rank"
        ? `The phases of rank ${rankId} at each step`
        : b.rank_basis === "straggler measure"
          ? `The phases of rank ${rankId}, the slowest rank by the straggler measure over the run (the rank the per-rank panel marks), at each step`
          : `The phases of rank ${rankId}, the rank with the highest median step (too few steps for the straggler measure), at each step`;
    const zoomText = zoom ? ` Steps ${fmtNum(Math.round(x0))}–${fmtNum(Math.round(x1))} shown: double-click for every step.` : " Drag across the chart to zoom into steps.";
    const hint = h("div", { class: "perf-card-hint", text: `${whose}, ${window === 1 ? "each step as measured" : `rolling median over ${window} points`}${st.downsampled ? ` (means of ${b.bucket_steps} steps)` : ""}; the shaded steps are the warm-up.${zoomText}` });
    return block(h("div", {}, hint, svg, legend), toggleMode, this.exportButtons(run, "step"));
  }

  /** Drag across the stacked area to zoom into those steps; double-click to zoom out (as the line charts). */
  private zoomable(run: RunRow, svg: SVGSVGElement, pad: { l: number; r: number; t: number; b: number }, x0: number, x1: number, H: number): void {
    const band = s("rect", { class: "perf-zoom-band", y: pad.t, height: H - pad.t - pad.b, width: 0, x: pad.l, "data-testid": "perf-zoom-band" });
    band.setAttribute("visibility", "hidden");
    const over = s("rect", { class: "perf-area-over", x: pad.l, y: pad.t, width: W - pad.l - pad.r, height: H - pad.t - pad.b, fill: "transparent", "data-testid": "perf-area-over" });
    svg.append(band, over);
    const toSvg = (clientX: number) => {
      const r = svg.getBoundingClientRect();
      const x = ((clientX - r.left) / Math.max(1, r.width)) * W;
      return Math.min(W - pad.r, Math.max(pad.l, x));
    };
    const toStep = (x: number) => x0 + ((x - pad.l) / (W - pad.l - pad.r)) * (x1 - x0);
    over.addEventListener("mousedown", (ev) => {
      if (ev.button !== 0) return;
      ev.preventDefault();
      const start = toSvg(ev.clientX);
      const move = (e: MouseEvent) => {
        const at = toSvg(e.clientX);
        band.setAttribute("x", String(Math.min(start, at)));
        band.setAttribute("width", String(Math.abs(at - start)));
        band.setAttribute("visibility", "visible");
      };
      const up = (e: MouseEvent) => {
        window.removeEventListener("mousemove", move);
        window.removeEventListener("mouseup", up);
        band.setAttribute("visibility", "hidden");
        const end = toSvg(e.clientX);
        if (Math.abs(end - start) < 5) return; // a click, not a drag
        const lo = toStep(Math.min(start, end));
        const hi = toStep(Math.max(start, end));
        if (hi - lo < 2) return; // fewer than two steps: nothing to see
        setZoom(run.key, [Math.floor(lo), Math.ceil(hi)]);
        this.redrawBreakdown(run);
      };
      window.addEventListener("mousemove", move);
      window.addEventListener("mouseup", up);
    });
    over.addEventListener("dblclick", () => {
      if (!zoomOf(run.key)) return;
      setZoom(run.key, null);
      this.zoomed.delete(run.key);
      this.redrawBreakdown(run);
    });
  }

  /** Fetch the breakdown of a zoomed range at full resolution (once per range and answer). */
  private fetchZoom(run: RunRow, range: [number, number], stamp: string): void {
    const got = this.zoomed.get(run.key);
    if (got && got.data === "loading" && got.range[0] === range[0] && got.range[1] === range[1] && got.stamp === stamp) return;
    // Until it comes, the points already fetched for this range stay drawn.
    const keep = got && got.range[0] === range[0] && got.range[1] === range[1] && got.data !== "loading" ? got.data : "loading";
    this.zoomed.set(run.key, { range, stamp, data: keep });
    api.zoomedBreakdown(run.key, range[0], range[1]).then(
      (res) => {
        const now = this.zoomed.get(run.key);
        const zoom = zoomOf(run.key);
        if (!now || !zoom || zoom[0] !== range[0] || zoom[1] !== range[1]) return; // zoomed elsewhere meanwhile
        this.zoomed.set(run.key, { range, stamp, data: res.breakdown });
        this.redrawBreakdown(run);
      },
      () => {
        // Keep drawing the coarser points of the range: the chart still shows the zoom.
        const now = this.zoomed.get(run.key);
        if (now && now.data === "loading") this.zoomed.set(run.key, { range, stamp, data: null });
      },
    );
  }

  /** Draw one run's stacked area again in place (a zoom, or its finer points arrived). */
  private redrawBreakdown(run: RunRow): void {
    const d = this.panels.get(run.key)?.current;
    const old = this.host.querySelector<HTMLElement>(`[data-testid=perf-run][data-key="${CSS.escape(run.key)}"] [data-testid=perf-breakdown]`);
    if (!d || !old) return;
    old.replaceWith(this.breakdown(store.runs.get(run.key) ?? run, d));
  }

  /** Draw every shown run's panel again (a setting of the page's blocks changed). */
  private redrawRuns(): void {
    for (const run of shownRuns()) this.panels.get(run.key)?.redraw();
  }

  /** Ranks × steps heatmap of step time, with each rank's median and the straggler marked. */
  private heatmap(run: RunRow, d: TelemetryResponse): HTMLElement {
    const tools: Child[] = [];
    // (the export buttons only over a drawn heatmap: without one an export can only fail, review 13f)
    let drawn = false;
    const block = (...body: Child[]) => h("div", { class: "telem-block perf-block", testid: "perf-heatmap" }, h("div", { class: "telem-block-head" }, h("span", { class: "telem-block-title", text: "Step time per rank" }), ...tools, drawn ? this.exportButtons(run, "ranks") : null), ...body);
    const res = this.perfOf(run.key);
    if (res === undefined) return block(h("div", { class: "muted", text: "Loading…" }));
    const hm = res.heatmap;
    if (hm.state !== "ok") return block(h("div", { class: "muted", testid: "perf-why", text: hm.detail ?? `telemetry ${hm.state}` }));
    if (!hm.ranks.length) return block(h("div", { class: "muted", testid: "perf-why", text: "No step times: this run was not traced with trace_step (or sent no step yet)." }));
    const stragglers = new Set((d.diagnoses?.findings ?? []).filter((f) => f.kind === "straggler").flatMap((f) => f.evidence?.ranks ?? []).map(String));
    // Under DDP the fast ranks wait for a straggler inside backward, so every iteration is alike (and
    // the straggler's can read lowest); its work outside backward is what stands out. With a
    // straggler named, that is what the heatmap shows first.
    const hasLocal = !!hm.z_local && hm.ranks.length > 1 && hm.z_local.some((row, i) => row.some((v, j) => v !== hm.z[i]![j]));
    const mode = hasLocal ? (this.heatMode ?? (stragglers.size ? "local" : "iteration")) : "iteration";
    if (hasLocal) {
      tools.push(
        segmented<"iteration" | "local">(
          [
            { value: "iteration", label: "Iteration" },
            { value: "local", label: "Outside backward" },
          ],
          mode,
          (m) => {
            this.heatMode = m;
            this.redrawRuns();
          },
          (m) => `perf-heat-${m}`,
          "segmented-sm",
        ),
      );
    }
    const z = mode === "local" && hm.z_local ? hm.z_local : hm.z;
    const medianOf = (i: number): number | null | undefined => (hm.medians ? (mode === "local" ? hm.medians[i]?.outside_backward_ms : hm.medians[i]?.median_ms) : d.ranks?.per_rank.find((r) => String(r.rank) === String(hm.ranks[i]))?.median_ms);
    const worst = d.ranks?.worst_rank;
    const all = z.flat().filter((v): v is number => v !== null);
    const lo = Math.min(...all);
    const hi = Math.max(...all);
    const cols = z[0]?.length ?? 0;
    const labelW = 150;
    const cellW = Math.max(2, Math.min(24, (W - labelW - 90) / Math.max(1, cols)));
    const cellH = Math.round(Math.max(14, Math.min(28, 200 / hm.ranks.length)));
    const heatW = labelW + cols * cellW + 90;
    const heatH = hm.ranks.length * cellH + 24;
    const firstStep = hm.first_step ?? 0;
    // The last bucket may be narrower than the others: it ends at the run's last measured step.
    const lastStep = hm.last_step ?? firstStep + cols * hm.bucket_steps - 1;
    const svg = s("svg", { class: "perf-heat-svg", viewBox: `0 0 ${heatW} ${heatH}`, width: heatW, height: heatH, "data-testid": "heat-svg", "data-mode": mode, "data-first-step": firstStep, "data-last-step": lastStep });
    // The cells are drawn in one canvas (a pixel column per step bucket, stretched without
    // smoothing), not one element each: 8 ranks x 400 buckets stay one element to lay out.
    const colour = (v: number | null) => {
      const t = v === null || hi <= lo ? 0 : (v - lo) / (hi - lo);
      return `hsl(${Math.round(210 - 210 * t)}, 70%, ${Math.round(30 + 25 * t)}%)`;
    };
    const canvas = h("canvas", { class: "perf-heat-cells", testid: "heat-cells" }) as HTMLCanvasElement;
    canvas.width = Math.max(1, cols);
    canvas.height = hm.ranks.length * cellH;
    const ctx = canvas.getContext("2d");
    z.forEach((row, i) =>
      row.forEach((v, j) => {
        if (v === null || !ctx) return;
        ctx.fillStyle = colour(v);
        ctx.fillRect(j, i * cellH + 1, 1, cellH - 2);
      }),
    );
    canvas.dataset.cols = String(cols);
    canvas.dataset.rows = String(hm.ranks.length);
    // What a cell holds, under the mouse (one title for the canvas, set as the mouse moves).
    canvas.addEventListener("mousemove", (ev) => {
      const r = canvas.getBoundingClientRect();
      const j = Math.floor(((ev.clientX - r.left) / Math.max(1, r.width)) * cols);
      const i = Math.floor(((ev.clientY - r.top) / Math.max(1, r.height)) * hm.ranks.length);
      const v = z[i]?.[j];
      if (v === undefined) return;
      const first = firstStep + j * hm.bucket_steps;
      const end = Math.min(lastStep, first + hm.bucket_steps - 1);
      canvas.title = `rank ${String(hm.ranks[i] ?? "?")}, ${end > first ? `steps ${first}–${end}` : `step ${first}`}: ${v === null ? "no step" : `${fmtNum(v)} ms`}`;
    });
    const cells = s("foreignObject", { x: labelW, y: 0, width: cols * cellW, height: hm.ranks.length * cellH });
    cells.appendChild(canvas);
    svg.appendChild(cells);
    hm.ranks.forEach((rank, i) => {
      const id = String(rank ?? "?");
      const straggler = stragglers.has(id);
      const g = s("g", { "data-testid": "heat-row", "data-rank": id, "data-straggler": straggler ? "1" : "0" });
      // With a straggler named, "slowest" would mislead: synchronised ranks wait for it, and the one
      // with the longest iteration is often a waiting one.
      const slowest = !stragglers.size && worst !== null && worst !== undefined && String(worst) === id;
      const label = `rank ${id}${straggler ? " · straggler" : slowest ? " · slowest" : ""}`;
      g.appendChild(s("text", { x: 0, y: i * cellH + cellH / 2, class: `perf-axis-label${straggler ? " is-straggler" : ""}`, "dominant-baseline": "middle" }, label));
      const m = medianOf(i);
      g.appendChild(s("text", { x: labelW + cols * cellW + 8, y: i * cellH + cellH / 2, class: "perf-bar-value", "dominant-baseline": "middle", "data-testid": "heat-median", "data-value": m ?? "" }, m === null || m === undefined ? "–" : fmtPerf("perf.step_ms.p50", m)));
      svg.appendChild(g);
    });
    svg.appendChild(s("text", { x: labelW, y: hm.ranks.length * cellH + 16, class: "perf-axis-label", "data-testid": "heat-first-label" }, `step ${firstStep}`));
    svg.appendChild(s("text", { x: labelW + cols * cellW, y: hm.ranks.length * cellH + 16, class: "perf-axis-label", "text-anchor": "end", "data-testid": "heat-last-label" }, `step ${lastStep}`));
    const what = mode === "local" ? "Work outside backward (the iteration minus backward, where DDP ranks wait for a straggler)" : "Iteration time";
    const hint = h("div", { class: "perf-card-hint", text: `${what} of each rank per step${hm.bucket_steps > 1 ? ` (median of ${hm.bucket_steps} steps per column)` : ""}, from ${sig3(lo)} ms (blue) to ${sig3(hi)} ms (red); the median after warm-up on the right.${hm.ranks.length < 2 ? " One rank: no skew to show." : ""}` });
    drawn = true;
    return block(hint, svg);
  }

  /** What this run has no data for, said instead of left out. */
  private missing(d: TelemetryResponse): HTMLElement | null {
    const why: string[] = [];
    const unread = unreadable(d);
    if (unread) {
      // The rows could not be read: say that, not what an intact run without them would mean.
      why.push(`GPU, device memory, process memory and host: ${unread}`);
    } else {
      if (!d.gpu) why.push("GPU: no GPU on this host (no GPU utilisation samples; NVML unavailable or a CPU-only run).");
      if (!d.memory) why.push("Device memory: no per-step memory rows (a CPU run measures host RSS only).");
      else if (!d.memory.series.some((x) => /alloc|reserved/.test(x.name))) why.push("Device memory: a CPU run (host RSS below).");
      if (!d.rss) why.push("Process memory: no process samples.");
      if (!d.host) why.push("Host: no system samples.");
    }
    if (!d.logs.length) why.push("Captured output: no rank logs in aggregator/.");
    if (!d.finalization) why.push("Nothing was lost during capture (no finalization_warning.json).");
    return why.length ? h("div", { class: "telem-block perf-block", testid: "perf-missing" }, h("div", { class: "telem-block-title", text: "Not in this run" }), h("ul", { class: "perf-why-list" }, ...why.map((w) => h("li", { testid: "perf-why", text: w })))) : null;
  }
}

/** Why a run's telemetry rows could not be read at all (a damaged, locked or empty database, or
 * none), as the server says it; null when they were read. */
function unreadable(d: TelemetryResponse): string | null {
  if (d.state === "ok" || d.state === "none") return null;
  return d.detail ?? `telemetry ${d.state}`;
}
