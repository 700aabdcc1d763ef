// The application shell: sidebar (views, roots, selection, settings), header (status counts, last
// refresh, Refresh), the view area, the inspector panel and the export bar.

import { onExport, queryTable, refreshNow } from "./actions";
import { isCaptured } from "./columns";
import { h, replace } from "./dom";
import { fmtAgo } from "./format";
import { type IconName, icon } from "./icons";
import { MAX_SERIES_RUNS, type View, store } from "./store";
import { button, copyText, toast, toggle } from "./ui";

export interface ViewModule {
  /** Build the view's DOM once. */
  mount(host: HTMLElement): void;
  /** The view became visible. */
  show(): void;
  /** The view was hidden. */
  hide?(): void;
}

const VIEW_META: Record<View, { label: string; icon: IconName; title: string }> = {
  overview: { label: "Overview", icon: "overview", title: "Overview" },
  runs: { label: "Runs", icon: "runs", title: "Runs" },
  charts: { label: "Charts", icon: "charts", title: "Charts & analysis" },
  compare: { label: "Compare", icon: "compare", title: "Compare runs" },
  performance: { label: "Performance", icon: "performance", title: "Performance" },
};

function withCount(label: HTMLLabelElement, count: HTMLElement): HTMLLabelElement {
  label.appendChild(count);
  return label;
}

export class Shell {
  private root: HTMLElement;
  private navCounts = new Map<View, HTMLElement>();
  private navItems = new Map<View, HTMLElement>();
  private viewHosts = new Map<View, HTMLElement>();
  private rootsEl = h("div", { class: "side-list", testid: "roots" });
  private selectionEl = h("div", { class: "side-selection", testid: "selection" });
  private settingsEl = h("div", { class: "side-settings", testid: "settings" });
  private titleEl = h("h1", { class: "header-title" });
  private countsEl = h("div", { class: "header-counts" });
  private refreshedEl = h("span", { class: "header-refreshed", testid: "last-refreshed" });
  private liveEl = h("span", { class: "live-dot", title: "live updates" });
  private exportBar = h("div", { class: "exportbar", testid: "export-bar" });
  readonly inspectorHost = h("aside", { class: "inspector", testid: "inspector", attrs: { hidden: true } });
  private active: View | null = null;
  private mounted = new Set<View>();

  constructor(
    host: HTMLElement,
    private views: Record<View, ViewModule>,
  ) {
    this.root = host;
    this.exportBar.hidden = true;
    this.build();
    store.on("runs", (changed) => {
      // An answer that changed no run only moves the "refreshed" time.
      if (Array.isArray(changed) && !changed.length) this.renderRefreshed();
      else this.renderCounts();
    });
    store.on("table", () => this.renderCounts());
    // A streamed listing: the counts grow with its chunks (at most one redraw a frame); at its
    // end a view other than Runs, shown while it came, is drawn again with every run.
    store.on("rows", () => this.countsSoon());
    store.on("listed", () => {
      this.renderCounts();
      const v = this.active;
      if (v && v !== "runs") {
        this.views[v].hide?.(); // (show() starts what hide() stops: the Overview's timer)
        this.views[v].show();
      }
    });
    store.on("selection", () => {
      this.renderSelectionCounts();
      this.renderSelection();
    });
    store.on("view", () => this.showView(store.ui.view));
    store.on("live", () => this.renderLive());
    store.on("polled", () => this.renderRefreshed());
    store.on("inspector", () => {
      this.inspectorHost.hidden = store.inspector === null;
      this.root.classList.toggle("has-inspector", store.inspector !== null);
    });
    onExport((n) => this.showExport(n.what, n.res.path, n.res.latest));
    window.setInterval(() => this.renderRefreshed(), 1000);
  }

  private build(): void {
    const nav = h("nav", { class: "nav", attrs: { "aria-label": "Views" } });
    for (const v of Object.keys(VIEW_META) as View[]) {
      const meta = VIEW_META[v];
      // The count is shown, not read out as part of the name ("Performance2"): the accessible name
      // is the label, with the count in words when there is one (setCount).
      const count = h("span", { class: "nav-count", testid: `nav-count-${v}`, attrs: { "aria-hidden": "true" } });
      const item = h(
        "button",
        { type: "button", class: "nav-item", testid: `nav-${v}`, data: { view: v }, attrs: { "aria-label": meta.label } },
        icon(meta.icon),
        h("span", { class: "nav-label", text: meta.label }),
        count,
      );
      item.addEventListener("click", () => store.setView(v));
      this.navCounts.set(v, count);
      this.navItems.set(v, item);
      nav.appendChild(item);
    }
    const brand = h(
      "div",
      { class: "brand" },
      h("span", { class: "brand-mark" }, icon("charts")),
      h("span", { class: "brand-name", text: "TraceML" }),
    );
    const sidebar = h(
      "aside",
      { class: "sidebar", testid: "sidebar" },
      brand,
      nav,
      h("div", { class: "side-section" }, h("div", { class: "side-heading", text: "Roots" }), this.rootsEl),
      h("div", { class: "side-section" }, h("div", { class: "side-heading", text: "Selection" }), this.selectionEl),
      h("div", { class: "side-section side-bottom" }, h("div", { class: "side-heading", text: "Settings" }), this.settingsEl),
    );
    const refresh = button("Refresh", {
      icon: "refresh",
      testid: "refresh",
      title: "Re-check all runs, finished ones too",
      onClick: async () => {
        refresh.classList.add("is-busy");
        await refreshNow();
        refresh.classList.remove("is-busy");
      },
    });
    const header = h(
      "header",
      { class: "header", testid: "header" },
      this.titleEl,
      this.countsEl,
      h("div", { class: "spacer" }),
      h("div", { class: "header-status" }, this.liveEl, this.refreshedEl),
      refresh,
    );
    const viewsEl = h("div", { class: "views" });
    for (const v of Object.keys(VIEW_META) as View[]) {
      const host = h("section", { class: `view view-${v}`, testid: `view-${v}`, attrs: { hidden: true } });
      this.viewHosts.set(v, host);
      viewsEl.appendChild(host);
    }
    const main = h("div", { class: "main" }, header, viewsEl, this.exportBar);
    replace(this.root, sidebar, main, this.inspectorHost);
    this.root.classList.add("app");
    this.renderSettings();
    this.renderSelection();
    this.renderLive();
  }

  /** Build a view's DOM the first time it is needed (see `mountAll`). */
  private mount(v: View): void {
    if (this.mounted.has(v)) return;
    this.mounted.add(v);
    this.views[v].mount(this.viewHosts.get(v)!);
  }

  /**
   * Build the views not shown yet. The page calls this once the first view is painted: the first
   * screen does not wait for views it does not show, and they are ready before the user turns to
   * them.
   */
  mountAll(): void {
    for (const v of Object.keys(VIEW_META) as View[]) this.mount(v);
  }

  showView(v: View): void {
    if (this.active === v) return;
    this.mount(v);
    if (this.active) {
      this.viewHosts.get(this.active)!.hidden = true;
      this.views[this.active].hide?.();
    }
    this.active = v;
    for (const [k, el] of this.navItems) el.classList.toggle("is-active", k === v);
    this.viewHosts.get(v)!.hidden = false;
    this.titleEl.textContent = VIEW_META[v].title;
    this.views[v].show();
  }

  private countsFrame = 0;

  private countsSoon(): void {
    if (this.countsFrame) return;
    this.countsFrame = requestAnimationFrame(() => {
      this.countsFrame = 0;
      this.renderCounts();
    });
  }

  renderCounts(): void {
    const counts = store.statusCounts();
    const by = (s: string[]) => s.reduce((n, status) => n + (counts.by.get(status) ?? 0), 0);
    const running = by(["running", "running?"]);
    const stale = by(["stale"]);
    const failed = by(["failed"]);
    this.navCounts.get("overview")!.textContent = String(store.listing ? (store.listingCount ?? "…") : counts.total);
    this.navCounts.get("runs")!.textContent = store.table ? String(store.table.shown) : String(counts.total);
    this.renderSelectionCounts();
    const pill = (n: number, label: string, cls: string) =>
      h(
        "button",
        {
          type: "button",
          class: `count-pill status-${cls}${n ? "" : " is-zero"}`,
          testid: `count-${label}`,
          title: `Show ${label} runs`,
        },
        h("span", { class: "badge-dot" }),
        h("span", { class: "count-n", text: store.listing ? "…" : String(n) }), // (counted once every run is here)
        h("span", { text: label }),
      );
    const pills = [pill(running, "running", "running"), pill(stale, "stale", "stale"), pill(failed, "failed", "failed")];
    pills.forEach((p, i) =>
      p.addEventListener("click", () => {
        store.set("status", (["running", "stale", "failed"] as const)[i]!);
        store.setView("runs");
        void queryTable();
      }),
    );
    replace(this.countsEl, ...pills);
    this.renderRoots();
    this.renderRefreshed();
  }

  /** The counts that follow the selection (a tick in the table changes only these). */
  private renderSelectionCounts(): void {
    const sel = store.ui.selection.length;
    this.setCount("charts", Math.min(sel, MAX_SERIES_RUNS), "selected runs");
    this.setCount("compare", sel, "selected runs");
    const captured = store.ui.selection.filter((k) => isCaptured(store.runs.get(k))).length;
    this.setCount("performance", captured, "selected captured runs");
  }

  /** A nav item's count badge, and its accessible name (`Performance, 2 selected captured runs`). */
  private setCount(v: View, n: number, what: string): void {
    this.navCounts.get(v)!.textContent = n ? String(n) : "";
    this.navItems.get(v)?.setAttribute("aria-label", n ? `${VIEW_META[v].label}, ${n} ${what}` : VIEW_META[v].label);
  }

  private renderRoots(): void {
    if (!store.roots.length) {
      replace(this.rootsEl, h("div", { class: "side-muted", text: "no roots" }));
      return;
    }
    replace(
      this.rootsEl,
      ...store.roots.map((r) => {
        const parts = r.path.split(/[\\/]/).filter(Boolean);
        const base = parts.slice(-2).join("/") || r.path;
        return h(
          "div",
          { class: `side-root${r.missing ? " is-missing" : ""}`, title: r.path, testid: "root-item" },
          icon("folder"),
          h("span", { class: "side-root-name", text: base }),
          h("span", { class: "side-root-count", text: r.missing ? "missing" : String(r.count) }),
        );
      }),
    );
  }

  private renderSelection(): void {
    const n = store.ui.selection.length;
    const clear = button("Clear", {
      small: true,
      kind: "ghost",
      testid: "clear-selection",
      disabled: n === 0,
      onClick: () => store.setSelection([]),
    });
    const compare = button("Compare", {
      small: true,
      kind: "ghost",
      testid: "selection-compare",
      disabled: n < 2,
      onClick: () => store.setView("compare"),
    });
    const plot = button("Plot", {
      small: true,
      kind: "ghost",
      testid: "selection-plot",
      disabled: n === 0,
      onClick: () => {
        store.set("chart", "line");
        store.setView("charts");
      },
    });
    replace(
      this.selectionEl,
      h(
        "div",
        { class: "side-selection-count" },
        h("span", { class: "side-big", testid: "selection-count", text: String(n) }),
        h("span", { class: "side-muted", text: n === 1 ? " run selected" : " runs selected" }),
      ),
      n > MAX_SERIES_RUNS
        ? h("div", { class: "side-note", text: `Line charts plot the first ${MAX_SERIES_RUNS} (Plot by groups averages all of them).` })
        : null,
      h("div", { class: "side-actions" }, plot, compare, clear),
    );
  }

  renderSettings(): void {
    const interval = h("span", { class: "side-value", testid: "refresh-interval" });
    const hiddenN = h("span", { class: "side-muted", testid: "hidden-count" });
    const update = () => {
      interval.textContent = `${store.refreshInterval} s · stale after ${store.staleAfter} s`;
      const n = store.hiddenCount();
      hiddenN.textContent = n ? ` (${n})` : "";
    };
    update();
    store.on("runs", update);
    replace(
      this.settingsEl,
      h("div", { class: "side-kv" }, h("span", { class: "side-muted", text: "Refresh" }), interval),
      withCount(toggle(
        "Show hidden runs",
        store.ui.showHidden,
        (on) => {
          store.set("showHidden", on);
          store.emit("runs", []);
          void queryTable();
        },
        "show-hidden",
      ), hiddenN),
    );
  }

  private renderRefreshed(): void {
    if (store.disconnected && store.tokenRefused) {
      this.refreshedEl.textContent = "The viewer server restarted: open the URL traceml ui printed (this page's token is not valid there)";
      this.refreshedEl.title = "A restarted traceml ui has a new token";
      return;
    }
    if (store.disconnected) {
      const last = store.refreshedAt ? ` (last refreshed ${fmtAgo(store.refreshedAt)})` : "";
      this.refreshedEl.textContent = `Disconnected from the viewer server — retrying${last}`;
      this.refreshedEl.title = "The page lost its connection to traceml ui: what it shows is not updated until it answers again";
      return;
    }
    if (store.listing) {
      const total = store.listingCount;
      this.refreshedEl.textContent = `Loading runs… ${store.runs.size.toLocaleString("en-US")}${total === null ? "" : ` of ${total.toLocaleString("en-US")}`}`;
      this.refreshedEl.title = "The page draws the table's first rows while the others arrive";
      return;
    }
    this.refreshedEl.textContent = store.refreshedAt ? `Refreshed ${fmtAgo(store.refreshedAt)}` : "Not refreshed yet";
    this.refreshedEl.title = store.refreshedAt ?? "";
  }

  private renderLive(): void {
    this.liveEl.classList.toggle("is-live", store.live);
    this.liveEl.classList.toggle("is-disconnected", store.disconnected);
    this.refreshedEl.classList.toggle("is-disconnected", store.disconnected);
    this.refreshedEl.dataset.state = store.disconnected ? (store.tokenRefused ? "token-refused" : "disconnected") : store.live ? "live" : "connecting";
    this.liveEl.title = store.live
      ? "Live: the server pushes changes"
      : store.disconnected
        ? "Disconnected from the viewer server: retrying"
        : "Connecting: live updates paused";
    this.renderRefreshed();
  }

  private showExport(what: string, path: string, latest?: string): void {
    const pathEl = h("code", { class: "exportbar-path", testid: "export-path", text: path });
    const copy = button("Copy path", {
      icon: "copy",
      small: true,
      testid: "copy-path",
      onClick: async () => {
        const ok = await copyText(path);
        toast(ok ? "Path copied" : "Could not copy; select the path instead", ok ? "info" : "error");
      },
    });
    // The file as written, shown read-only in a new tab (served from the cache folder by name).
    const parts = path.split(/[\\/]/);
    const name = parts.slice(-2).join("/");
    const open = button("Open (read-only)", {
      icon: "external",
      small: true,
      testid: "open-export",
      title: "Show the saved file in a new tab (read-only)",
      onClick: () => {
        window.open(`/api/export/file?name=${encodeURIComponent(name)}`, "_blank", "noopener");
      },
    });
    const close = button("", {
      icon: "close",
      kind: "ghost",
      small: true,
      title: "Close",
      testid: "export-close",
      onClick: () => {
        this.exportBar.hidden = true;
      },
    });
    replace(
      this.exportBar,
      icon("download"),
      h("span", { class: "exportbar-what", text: `${what} saved:` }),
      pathEl,
      latest ? h("span", { class: "exportbar-latest", title: latest, text: "also latest.csv" }) : null,
      h("div", { class: "spacer" }),
      copy,
      open,
      close,
    );
    this.exportBar.hidden = false;
  }
}
