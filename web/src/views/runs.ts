// The Runs view: search, status segments, group by, differing-params toggle, column chooser, export,
// per-column filter chips, hide/unhide, and the table itself.

import { exportTable, queryTable, queryTableSoon, setHidden } from "../actions";
import { columnTitle, KIND_LABEL, type Kind, splitColumn } from "../columns";
import { debounce, h, replace } from "../dom";
import { icon } from "../icons";
import type { ViewModule } from "../shell";
import { type FilterChip, STATUS_SEGMENTS, type StatusSegment, store } from "../store";
import { button, chip, closePopover, popover, segmented, select, type SelectOption, toggle } from "../ui";
import { RunTable } from "./table";

/** Options the column chooser lists per kind before its search is used (every chosen one besides). */
const MAX_OPTIONS = 200;
const KIND_ORDER: Kind[] = ["fixed", "config", "run.best", "run.last", "run.start", "summary", "perf"];
const KIND_HEADING: Record<Kind, string> = {
  fixed: "Run",
  config: "Config (params.yaml)",
  "run.best": "Best",
  "run.last": "Last",
  "run.start": "Start",
  summary: "Summary",
  perf: "Performance (telemetry)",
};

/**
 * Options for a column picker, grouped by kind: each column once, and where two kinds have a column
 * of the same name (a param and a metric both called `lr`, or a metric's best, last and start
 * values) each says its kind, `lr (config)`, `lr (best)`: a closed dropdown shows the label
 * alone, without the group heading.
 */
export function columnOptions(columns: string[], empty?: string): SelectOption[] {
  const opts: SelectOption[] = empty !== undefined ? [{ value: "", label: empty }] : [];
  const unique = [...new Set(columns)];
  const label = columnLabeller(unique);
  for (const kind of KIND_ORDER) {
    for (const c of unique) if (splitColumn(c)[0] === kind) opts.push({ value: c, label: label(c), group: KIND_HEADING[kind] });
  }
  return opts;
}

/** Labels for `columns` shown together: the column's title, with ` (kind)` where another column
 *  among them has the same title (`val/auc (best)` beside `val/auc (last)`). */
export function columnLabeller(columns: Iterable<string>): (column: string) => string {
  const title = (c: string) => (splitColumn(c)[0] === "fixed" ? c : columnTitle(c));
  const uses = new Map<string, number>();
  for (const c of new Set(columns)) uses.set(title(c), (uses.get(title(c)) ?? 0) + 1);
  return (c) => {
    const t = title(c);
    return (uses.get(t) ?? 0) > 1 ? `${t} (${KIND_LABEL[splitColumn(c)[0]]})` : t;
  };
}

export class RunsView implements ViewModule {
  private segEl = h("div", { class: "toolbar-segments" });
  private groupEl = h("div", { class: "toolbar-group" });
  private chipsEl = h("div", { class: "filter-chips", testid: "filter-chips" });
  private infoEl = h("div", { class: "toolbar-info", testid: "table-info" });
  private errorEl = h("div", { class: "filter-error", testid: "filter-error", attrs: { hidden: true } });
  private selActions = h("div", { class: "toolbar-selection" });
  private search = h("input", {
    type: "search",
    class: "input search-input",
    testid: "search",
    attrs: { placeholder: "Search runs…", "aria-label": "Search runs", spellcheck: "false" },
  });
  private differing = h("span");
  private maxRowsEl = h("label", { class: "max-rows" });
  private table!: RunTable;
  private visible = false;

  mount(host: HTMLElement): void {
    this.search.value = store.ui.search;
    const onSearch = debounce(() => {
      store.set("search", this.search.value);
      void queryTable();
    }, 200);
    this.search.addEventListener("input", onSearch);
    const searchBox = h("div", { class: "search" }, icon("search"), this.search);

    const columnsBtn = button("Columns", { icon: "columns", testid: "column-chooser", onClick: () => this.chooseColumns(columnsBtn) });
    const exportBtn = button("Export CSV", {
      icon: "download",
      testid: "export-table",
      title: "Write the shown rows and columns to a CSV file in the cache folder",
      onClick: () => void exportTable(),
    });
    const addFilter = button("Filter", {
      icon: "plus",
      small: true,
      kind: "ghost",
      testid: "add-filter",
      onClick: () => this.editFilter(null, addFilter),
    });

    const toolbar = h("div", { class: "toolbar" }, searchBox, this.segEl, h("div", { class: "spacer" }), columnsBtn, exportBtn);
    const filterbar = h(
      "div",
      { class: "filterbar" },
      addFilter,
      this.chipsEl,
      h("div", { class: "spacer" }),
      this.selActions,
      this.groupEl,
      this.maxRowsEl,
      this.differing,
      this.infoEl,
    );
    const tableHost = h("div", { class: "table-host", testid: "runs-table" });
    host.append(toolbar, filterbar, this.errorEl, tableHost);
    this.table = new RunTable(tableHost, {
      editFilter: (c, a) => this.editFilter(c, a),
      columnsMoved: (order) => {
        // With "differing params only" the config columns are the differing ones, not a choice:
        // the chosen config columns keep their places and the others take the dragged order.
        const chosen = store.table?.columns.shown ?? [];
        const next = store.ui.differing
          ? [...order.filter((c) => !c.startsWith("config.")), ...chosen.filter((c) => c.startsWith("config."))]
          : order;
        store.set("columns", next);
        void queryTable();
      },
    });

    store.on("table", () => {
      this.renderToolbar();
      if (this.visible) this.table.render();
    });
    store.on("runs", (changed) => {
      // An answer that changed no run (the catch-up after connecting, a quiet refresh) changes nothing here.
      if (Array.isArray(changed) && !changed.length) return;
      this.renderSegments();
      queryTableSoon();
    });
    store.on("listed", () => this.renderSegments()); // (the status counts of every run)
    store.on("selection", () => this.renderSelectionActions());
    store.on("inspector", () => this.table.syncInspected());
    store.on("restored", () => {
      // Back/Forward chose another view: the box shows its search, also while it has the focus
      // (the table already answers that search; the box must not keep the one typed before).
      this.search.value = store.ui.search;
      this.renderToolbar();
      this.table.updateSortMarks();
    });
    this.renderToolbar();
  }

  show(): void {
    this.visible = true;
    this.table.render();
    this.table.redraw();
  }

  hide(): void {
    this.visible = false;
  }

  private renderToolbar(): void {
    this.renderSegments();
    this.renderMaxRows();
    this.renderGroup();
    this.renderChips();
    this.renderInfo();
    this.renderSelectionActions();
    replace(
      this.differing,
      toggle(
        "Differing params only",
        store.ui.differing,
        (on) => {
          store.set("differing", on);
          // The differing params come right after the name: scroll back so they are in view.
          void queryTable().then(() => {
            if (on) this.table.scrollToFirstColumns();
          });
        },
        "differing-toggle",
        "Show only the config columns whose value differs between the shown runs",
      ),
    );
  }

  private renderSegments(): void {
    const { total, by } = store.statusCounts();
    const n = (status: string) => by.get(status) ?? 0;
    const count = (s: StatusSegment) => (s === "all" ? total : s === "running" ? n("running") + n("running?") : n(s));
    replace(
      this.segEl,
      segmented<StatusSegment>(
        // (no counts while the listing streams: they would count the runs arrived so far, review 16b)
        STATUS_SEGMENTS.map((s) => ({
          value: s,
          label: s.charAt(0).toUpperCase() + s.slice(1),
          count: store.listing ? undefined : count(s),
        })),
        store.ui.status,
        (v) => {
          store.set("status", v);
          this.renderSegments();
          void queryTable();
        },
        (v) => `status-segment-${v}`,
        "status-segments",
      ),
    );
  }

  private renderGroup(): void {
    const available = store.table?.columns.available ?? [];
    const opts = columnOptions(available, "No grouping");
    const sel = select(
      opts,
      store.ui.group ?? "",
      (v) => {
        store.set("group", v || null);
        void queryTable();
      },
      "group-by",
      "Group the runs by a column",
    );
    replace(this.groupEl, h("span", { class: "toolbar-label" }, icon("group"), "Group"), sel);
  }

  private renderChips(): void {
    // A chip names its column as the dropdowns do: `val/auc (best)` where a last value shares the name.
    const label = columnLabeller([...(store.table?.columns.available ?? []), ...store.ui.filters.map((f) => f.column)]);
    const chips = store.ui.filters.map((f, i) =>
      chip(
        [
          h("span", { class: "chip-col", text: label(f.column) }),
          h("span", { class: "chip-expr", text: f.expr }),
        ],
        () => {
          const next = store.ui.filters.filter((_, j) => j !== i);
          store.set("filters", next);
          this.renderChips();
          void queryTable();
        },
        () => {
          const el = this.chipsEl.children[i] as HTMLElement | undefined;
          if (el) this.editFilter(f.column, el);
        },
        "filter-chip",
      ),
    );
    if (chips.length > 1) {
      chips.push(
        button("Clear all", {
          small: true,
          kind: "ghost",
          testid: "clear-filters",
          onClick: () => {
            store.set("filters", []);
            this.renderChips();
            void queryTable();
          },
        }),
      );
    }
    replace(this.chipsEl, ...chips);
    for (const [i, el] of [...this.chipsEl.querySelectorAll<HTMLElement>(".chip")].entries()) {
      el.title = `${store.ui.filters[i]?.column ?? ""} ${store.ui.filters[i]?.expr ?? ""}`;
    }
    const err = store.table?.error ?? null;
    this.errorEl.hidden = !err;
    replace(this.errorEl, err ? icon("warning") : null, err ?? "");
  }

  private renderInfo(): void {
    const t = store.table;
    if (!t) {
      this.infoEl.textContent = "";
      return;
    }
    const max = store.ui.maxRows;
    // "24 runs", or "5 of 24 runs" when a filter, the search or a status hides some (never "24 of 24").
    this.infoEl.textContent = t.shown === t.total ? `${t.total} run${t.total === 1 ? "" : "s"}` : `${t.shown} of ${t.total} runs`;
    this.infoEl.title = "";
    // Hidden runs are not in the total: say how many there are, and how to see them.
    const hidden = store.ui.showHidden ? 0 : store.hiddenCount();
    if (hidden) {
      this.infoEl.textContent += ` · ${hidden} hidden`;
      this.infoEl.title = `${hidden} hidden run${hidden === 1 ? " is" : "s are"} left out: "Show hidden runs" in the sidebar shows them`;
    }
    if (max !== null && t.shown > max) {
      this.infoEl.textContent += ` · first ${max} shown`;
      this.infoEl.title = [`Max rows ${max}: the table and its CSV export hold the first ${max} rows in table order`, this.infoEl.title].filter(Boolean).join("\n");
    }
  }

  private renderMaxRows(): void {
    const input = h("input", {
      type: "number",
      class: "input input-num",
      testid: "max-rows",
      attrs: { min: 1, step: 1, placeholder: "all", "aria-label": "Max rows", title: "Show and export at most this many rows (empty: all)" },
    });
    input.value = store.ui.maxRows === null ? "" : String(store.ui.maxRows);
    input.addEventListener("change", () => {
      const v = Math.floor(Number(input.value));
      const next = input.value.trim() === "" || !Number.isFinite(v) || v < 1 ? null : v;
      input.value = next === null ? "" : String(next);
      if (next === store.ui.maxRows) return;
      store.set("maxRows", next);
      this.renderInfo();
      store.emit("table"); // same answer, fewer (or more) rows drawn
    });
    replace(this.maxRowsEl, h("span", { class: "toolbar-label", text: "Max rows" }), input);
  }

  private renderSelectionActions(): void {
    const sel = store.ui.selection;
    const hiddenSel = sel.filter((k) => store.hidden.has(k));
    const shownSel = sel.filter((k) => !store.hidden.has(k));
    replace(
      this.selActions,
      shownSel.length
        ? button(`Hide ${shownSel.length}`, {
            icon: "eyeOff",
            small: true,
            kind: "ghost",
            testid: "hide-selected",
            title: "Hide the selected runs in TraceML (their folders stay untouched)",
            onClick: () => void setHidden(shownSel, true),
          })
        : null,
      hiddenSel.length
        ? button(`Unhide ${hiddenSel.length}`, {
            icon: "eye",
            small: true,
            kind: "ghost",
            testid: "unhide-selected",
            onClick: () => void setHidden(hiddenSel, false),
          })
        : null,
    );
  }

  // -- filters --------------------------------------------------------------------------------------

  /** Edit (or add) the filter of `column`; `null` lets the user pick the column. */
  editFilter(column: string | null, anchor: HTMLElement): void {
    const existing = column ? store.ui.filters.find((f) => f.column === column) : undefined;
    const available = store.table?.columns.available ?? [];
    let col = column ?? available.find((c) => c.startsWith("run.best.")) ?? "name";
    const colSel = select(columnOptions(available), col, (v) => (col = v), "filter-column");
    const input = h("input", {
      type: "text",
      class: "input",
      testid: "filter-input",
      attrs: { placeholder: ">0.8   0.1..0.3   /re/   text", spellcheck: "false", "aria-label": "Filter expression" },
    });
    input.value = existing?.expr ?? "";
    const apply = () => {
      const expr = input.value.trim();
      const others = store.ui.filters.filter((f) => f.column !== col);
      const next: FilterChip[] = expr ? [...others, { column: col, expr }] : others;
      store.set("filters", next);
      closePopover();
      this.renderChips();
      void queryTable();
    };
    input.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter") apply();
    });
    const body = h(
      "div",
      { class: "filter-pop" },
      h("div", { class: "pop-title", text: column ? `Filter ${columnTitle(column)}` : "Add a filter" }),
      column ? h("div", { class: "pop-sub", text: column }) : colSel,
      input,
      h(
        "div",
        { class: "pop-help" },
        ...[
          [">0.8  <=1e-3", "compare numbers"],
          ["0.1..0.3", "inclusive range"],
          ["/^vit/", "regular expression"],
          ["=failed  !=x", "equal / not equal"],
          ["text", "contains (numbers: equals)"],
        ].map(([code, what]) => h("div", { class: "help-row" }, h("code", { text: code! }), h("span", { text: what! }))),
      ),
      h(
        "div",
        { class: "pop-actions" },
        existing
          ? button("Remove", {
              small: true,
              kind: "ghost",
              testid: "filter-remove",
              onClick: () => {
                input.value = "";
                apply();
              },
            })
          : null,
        h("div", { class: "spacer" }),
        button("Apply", { small: true, kind: "primary", testid: "filter-apply", onClick: apply }),
      ),
    );
    popover(anchor, body, "filter-popover");
    input.focus();
  }

  // -- column chooser -------------------------------------------------------------------------------

  private chooseColumns(anchor: HTMLElement): void {
    const t = store.table;
    if (!t) return;
    let chosen = [...(store.ui.columns ?? t.columns.shown)];
    const list = h("div", { class: "col-list" });
    const filter = h("input", {
      type: "search",
      class: "input",
      testid: "column-search",
      attrs: { placeholder: "Find a column…", spellcheck: "false" },
    });
    const commit = () => {
      store.set("columns", chosen);
      void queryTable();
    };
    const defaults = new Set(t.columns.default);
    const draw = () => {
      const q = filter.value.trim().toLowerCase();
      const picked = new Set(chosen);
      const items: HTMLElement[] = [];
      for (const kind of KIND_ORDER) {
        const cols = t.columns.available.filter((c) => splitColumn(c)[0] === kind && (!q || c.toLowerCase().includes(q)));
        if (!cols.length) continue;
        items.push(h("div", { class: "col-list-head", text: `${KIND_HEADING[kind]} · ${cols.length}` }));
        // At most MAX_OPTIONS a kind (and every chosen one): 8,000 logged keys as options froze the
        // page for 1.5 s each time it opened (review 16a); the search finds the others.
        const shown = cols.length > MAX_OPTIONS ? cols.filter((c, i) => i < MAX_OPTIONS || picked.has(c)) : cols;
        for (const c of shown) {
          const cb = h("input", { type: "checkbox", testid: "column-option", data: { column: c } });
          cb.checked = picked.has(c);
          cb.addEventListener("change", () => {
            chosen = cb.checked ? [...chosen, c] : chosen.filter((x) => x !== c);
            commit();
          });
          items.push(
            h(
              "label",
              { class: "col-list-item", title: c },
              cb,
              kind !== "fixed" ? h("span", { class: `col-kind kind-${kind.replace(".", "-")}`, text: KIND_LABEL[kind] }) : null,
              h("span", { text: columnTitle(c) }),
              defaults.has(c) ? h("span", { class: "col-default", text: "default" }) : null,
            ),
          );
        }
        if (shown.length < cols.length) {
          const more = (cols.length - shown.length).toLocaleString("en-US");
          items.push(h("div", { class: "col-list-more", testid: "column-more", text: `${more} more: type to find them` }));
        }
      }
      replace(list, ...items);
    };
    filter.addEventListener("input", draw);
    draw();
    const body = h(
      "div",
      { class: "col-pop" },
      h(
        "div",
        { class: "pop-row" },
        filter,
        button("Defaults", {
          small: true,
          kind: "ghost",
          testid: "columns-default",
          onClick: () => {
            chosen = [...t.columns.default];
            store.set("columns", null);
            void queryTable();
            draw();
          },
        }),
      ),
      list,
    );
    popover(anchor, body, "column-popover");
  }
}
