// Charts & analysis: Line (metric history) | Scatter | Box | Bar, with CSV and PNG export.

import { h, replace } from "../dom";
import type { ViewModule } from "../shell";
import { MAX_SERIES_RUNS, store } from "../store";
import type { ChartKind } from "../types";
import { button, segmented } from "../ui";
import { LineCharts } from "./lineChart";
import { BarChart, BoxChart, chartKeys, ScatterChart } from "./svgCharts";

interface ChartPart {
  readonly toolbar: HTMLElement;
  setVisible(v: boolean): void;
  refresh(force?: boolean): void;
  exportChart(format: "csv" | "png"): Promise<string | null> | string;
}

export class ChartsView implements ViewModule {
  private kindEl = h("div");
  private scopeEl = h("span", { class: "toolbar-info", testid: "chart-scope" });
  private toolHost = h("div", { class: "chart-tools" });
  private parts!: Record<ChartKind, ChartPart>;
  private hosts = new Map<ChartKind, HTMLElement>();
  private visible = false;
  private exportStatus = h("span", { class: "export-status", testid: "export-status", attrs: { "aria-live": "polite" } });

  mount(host: HTMLElement): void {
    const mk = (k: ChartKind) => {
      const el = h("div", { class: `chart-pane chart-pane-${k}`, testid: `chart-pane-${k}`, attrs: { hidden: true } });
      this.hosts.set(k, el);
      return el;
    };
    const panes = (["line", "scatter", "box", "bar"] as ChartKind[]).map(mk);
    this.parts = {
      line: new LineCharts(this.hosts.get("line")!),
      scatter: new ScatterChart(this.hosts.get("scatter")!),
      box: new BoxChart(this.hosts.get("box")!),
      bar: new BarChart(this.hosts.get("bar")!),
    };
    const exportCsv = button("CSV", {
      icon: "download",
      small: true,
      testid: "export-chart-csv",
      title: "Save the data behind this chart as CSV in the cache folder",
      onClick: () => void this.runExport("csv", exportCsv, exportPng),
    });
    const exportPng = button("PNG", {
      icon: "image",
      small: true,
      testid: "export-chart-png",
      title: "Save this chart as a 300 DPI PNG (rendered by the server)",
      onClick: () => void this.runExport("png", exportPng, exportCsv),
    });
    const head = h("div", { class: "toolbar" }, this.kindEl, this.scopeEl, h("div", { class: "spacer" }), this.exportStatus, exportCsv, exportPng);
    host.append(head, this.toolHost, h("div", { class: "chart-scroll" }, ...panes));
    this.renderKind();

    store.on("selection", () => {
      if (this.exportStatus.classList.contains("is-error")) replace(this.exportStatus);
      this.refresh();
    });
    store.on("table", () => {
      // The line charts do not depend on the table (only their colour-by choices do).
      if (store.ui.chart === "line") {
        this.renderScope();
        // Plot by groups draws the table's groups: a new grouping redraws the charts.
        if (this.visible && store.ui.plotGroups) this.parts.line.refresh();
        else if (this.visible) (this.parts.line as LineCharts).renderToolbar();
      } else this.refresh();
    });
    store.on("restored", () => {
      for (const [k, part] of Object.entries(this.parts)) if (k !== store.ui.chart) part.setVisible(false);
      if (this.visible) this.show();
    });
    store.on("runs", (changed) => {
      if (!this.visible) return;
      const kind = store.ui.chart;
      if (kind === "line") (this.parts.line as LineCharts).onRunsChanged(Array.isArray(changed) ? (changed as string[]) : []);
      else this.parts[kind].refresh(true);
    });
  }

  /** One export at a time: both buttons wait, the status says what is being saved, then any error. */
  private async runExport(format: "csv" | "png", btn: HTMLButtonElement, other: HTMLButtonElement): Promise<void> {
    const st = this.exportStatus;
    const result = this.parts[store.ui.chart].exportChart(format);
    if (typeof result === "string") {
      st.className = "export-status is-error";
      st.textContent = result;
      return;
    }
    btn.disabled = other.disabled = true;
    btn.classList.add("is-busy");
    st.className = "export-status is-busy";
    st.textContent = format === "png" ? "Rendering PNG…" : "Saving CSV…";
    try {
      const error = await result;
      st.className = `export-status${error ? " is-error" : ""}`;
      st.textContent = error ? `${format.toUpperCase()} export failed: ${error}` : "";
    } finally {
      btn.disabled = other.disabled = false;
      btn.classList.remove("is-busy");
    }
  }

  private refresh(): void {
    this.renderScope();
    if (this.visible) this.parts[store.ui.chart].refresh();
  }

  private renderKind(): void {
    replace(
      this.kindEl,
      segmented<ChartKind>(
        [
          { value: "line", label: "Line", title: "Metric history of the selected runs" },
          { value: "scatter", label: "Scatter", title: "One point per run" },
          { value: "box", label: "Box", title: "Distribution per group" },
          { value: "bar", label: "Bar", title: "One bar per run or per group" },
        ],
        store.ui.chart,
        (v) => {
          this.parts[store.ui.chart].setVisible(false);
          store.set("chart", v);
          this.renderKind();
          this.activate();
        },
        (v) => `chart-kind-${v}`,
      ),
    );
  }

  private renderScope(): void {
    if (store.ui.chart === "line") {
      const n = store.ui.selection.length;
      // "3 selected runs", or "first 30 of 45 selected runs" past the line charts' limit.
      this.scopeEl.textContent = !n
        ? "no runs selected"
        : n > MAX_SERIES_RUNS
          ? `first ${MAX_SERIES_RUNS} of ${n} selected runs`
          : `${n} selected run${n === 1 ? "" : "s"}`;
    } else {
      this.scopeEl.textContent = chartKeys().scope;
    }
  }

  private activate(): void {
    const kind = store.ui.chart;
    for (const [k, el] of this.hosts) el.hidden = k !== kind;
    replace(this.toolHost, this.parts[kind].toolbar);
    this.renderScope();
    this.parts[kind].setVisible(this.visible);
  }

  show(): void {
    this.visible = true;
    this.renderKind();
    this.activate();
  }

  hide(): void {
    this.visible = false;
    this.parts[store.ui.chart].setVisible(false);
  }
}
