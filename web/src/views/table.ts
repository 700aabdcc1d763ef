// The run table: Tabulator with virtual rendering. Python decides which rows, in which order and in
// which groups (GET /api/table); this module only draws them. Sorting is sent back to the server
// (click a header, shift-click to add a sort level). Every formatter returns a DOM node with text,
// never an HTML string.
//
// Speed (the first screen costs about the same at 100 or 10,000 runs): a row is only {key, group
// index} and its cells read the RunRow when drawn; rows have one fixed height and only a few are
// drawn beyond the visible ones; every column has an explicit width applied by the "fixedWidths"
// layout, so Tabulator never measures cells (its fitData layout forces one page layout per column).
// The widths are measured here in one batch, off screen, from the first rows and the longest texts;
// they only grow while a column stays (no jumping on live updates), and a width the user dragged is
// kept. A new answer with the same rows in the same order redraws only the runs that changed.

import {
  type CellComponent,
  type ColumnComponent,
  type ColumnDefinition,
  FormatModule,
  FrozenColumnsModule,
  GroupRowsModule,
  InteractionModule,
  MoveColumnsModule,
  type Options,
  ResizeColumnsModule,
  type RowComponent,
  Tabulator,
} from "tabulator-tables";
import { limitRows, queryTable, shownColumns } from "../actions";
import { cellGetter, columnTitle, fmtPerf, isCaptured, KIND_LABEL, perfMissingReason, splitColumn } from "../columns";
import { h } from "../dom";
import { fmtDuration, fmtNum, fmtTime, rawText } from "../format";
import { icon } from "../icons";
import { store } from "../store";
import type { RunRow } from "../types";
import { emptyState, paletteColor, statusBadge, swatch } from "../ui";

Tabulator.registerModule([FormatModule, GroupRowsModule, InteractionModule, MoveColumnsModule, ResizeColumnsModule, FrozenColumnsModule]);

/** Tabulator's column object as the layout modes see it (internal API). */
interface LayoutColumn {
  field?: string;
  definition: ColumnDefinition;
  width: number;
  setWidth(width: number): void;
}

/** Per table: the width of each column by field (set by RunTable). */
const columnWidths = new WeakMap<object, (field: string) => number | undefined>();

// Every column's width comes from the table (measured here, or dragged by the user): apply them all
// in one go and measure nothing. Tabulator's fitData reads each column's width after writing the
// previous one (one forced page layout per column), and a width in a column definition is applied
// when the column is created, before the frozen columns' layout is held back (again a page layout
// per column).
Tabulator.extendModule("layout", "modes", {
  fixedWidths(this: { table: object }, columns: LayoutColumn[]) {
    const widthOf = columnWidths.get(this.table);
    for (const c of columns) {
      const w = (c.field ? widthOf?.(c.field) : undefined) ?? c.definition.width;
      if (typeof w === "number" && c.width !== w) c.setWidth(w);
    }
  },
});

/** What one table answer asks to draw. */
interface Plan {
  columns: string[];
  numeric: Set<string>;
  columnsSig: string;
  keys: string[];
  gids: number[];
  /** Number of groups, null when not grouped. */
  groups: number | null;
  groupSig: string;
}

/** A table row: the run's key and group index. Cells read the RunRow itself (no copy per cell). */
interface Row {
  _key: string;
  _g: number;
}

/** What `reorder` uses of Tabulator's internals (6.5). */
interface InternalRowComponent {
  _row: unknown;
}
interface InternalRowManager {
  rows: unknown[];
  refreshActiveData(handler: false, skipStage: boolean, renderInPosition: boolean): void;
}

const SEL = "_sel";
const WARN = "_warn";

export interface TableHooks {
  /** Open the filter editor of a column, anchored at the header's funnel button. */
  editFilter(column: string, anchor: HTMLElement): void;
  /** The user dragged a header: the shown columns in their new order. */
  columnsMoved(order: string[]): void;
}

export class RunTable {
  private tab: Tabulator | null = null;
  private built = false;
  private columnsSig = "";
  private groupSig = "";
  private sortEls = new Map<string, HTMLElement>();
  private filterBtns = new Map<string, HTMLElement>();
  private groupChecks = new Map<number, HTMLInputElement>();
  private headCheck: HTMLInputElement | null = null;
  /** Widths the user dragged. */
  private widths = new Map<string, number>();
  /** Widths measured from the cells (only grow while the column is shown). */
  private autoWidths = new Map<string, number>();
  /** Keys (and group indices) as last drawn, to tell a re-order from a value change. */
  private drawnKeys: string[] = [];
  private drawnGroups: number[] = [];
  /** Runs changed since the last draw (from the store's "runs" events). */
  private dirty = new Set<string>();
  /**
   * Row components by key, for in-place updates (Tabulator's own lookup by index is a linear scan).
   * Built on the first update that needs it, not with the table: for 10,000 rows that is tens of
   * milliseconds the first screen does not wait for.
   */
  private rowsByKey: Map<string, RowComponent> | null = null;
  private rowsReady = false;
  /** The rows' fixed height as Tabulator writes it on every cell (see `fixHeight`). */
  private cellHeight = "";
  /** Row elements Tabulator built (the rendered ones), for selection marks without touching the rest. */
  private rowEls = new Map<string, HTMLElement>();

  /** The keyboard cursor: the row the arrow keys move, Enter inspects and Space ticks. */
  private cursor: string | null = null;

  constructor(
    private host: HTMLElement,
    private hooks: TableHooks,
  ) {
    host.tabIndex = 0;
    host.setAttribute("aria-label", "Runs: arrow keys move, Enter opens the inspector, Space ticks");
    host.addEventListener("keydown", (ev) => this.onKey(ev));
    store.on("selection", () => this.syncSelection());
    store.on("runs", (changed) => {
      if (Array.isArray(changed)) for (const k of changed as string[]) this.dirty.add(k);
    });
    store.on("rows", (keys) => this.drawArrived(keys as string[]));
    store.on("listed", () => {
      this.drawArrived(this.arrivedBlanks());
      // Rows still empty are of runs the listing did not bring (gone, or a listing cut off): the
      // page holds nothing of them, so they are not drawn.
      const missing = this.blank.size > 0;
      this.blank.clear();
      if (missing && this.tab) this.render();
    });
  }

  /** Rows drawn with empty cells, their run not arrived yet (while the listing streams). */
  private blank = new Set<string>();

  /** The rows drawn empty whose run has arrived since (while the rows were not ready to redraw). */
  private arrivedBlanks(): string[] {
    return [...this.blank].filter((k) => store.runs.has(k));
  }

  /** Runs of a streamed listing arrived: redraw the rows drawn empty among them, in place. */
  private drawArrived(keys: string[]): void {
    const tab = this.tab;
    if (!tab || !this.built || !this.rowsReady || !this.blank.size) return;
    const byKey = this.rowComponents(tab);
    const comps: RowComponent[] = [];
    for (const k of keys) {
      if (!this.blank.delete(k)) continue;
      const comp = byKey.get(k);
      if (comp) comps.push(comp);
    }
    if (!comps.length) return;
    // (the columns only: plan() walks every key of the answer, 100,000 of them, per chunk)
    const numeric = new Set(store.table?.columns.numeric ?? []);
    const grown = this.growWidths(shownColumns(), numeric, comps.map((c) => c.getData() as Row), false);
    for (const comp of comps) comp.reformat();
    if (grown) tab.redraw();
  }

  /** Draw the latest table answer (call when visible). */
  render(): void {
    if (!store.table) return;
    if (!this.tab) {
      this.create();
      return;
    }
    if (!this.built) return; // tableBuilt draws the latest answer
    this.update();
  }

  /** Scroll the table back to its first columns (after "Differing params only" put them there). */
  scrollToFirstColumns(): void {
    const holder = this.host.querySelector<HTMLElement>(".tabulator-tableholder");
    if (holder) holder.scrollLeft = 0;
  }

  /** The view became visible again: fit the table to its (maybe resized) box. */
  redraw(): void {
    if (this.tab && this.built) this.tab.redraw();
  }

  /** What the latest answer asks to draw: columns and rows in display order (group by group). */
  private plan(): Plan | null {
    const t = store.table;
    if (!t) return null;
    const columns = shownColumns();
    const numeric = new Set(t.columns.numeric);
    const keys: string[] = [];
    const gids: number[] = [];
    const max = store.ui.maxRows ?? Infinity;
    const push = (k: string, g: number) => {
      // (while the listing streams, a run not arrived yet is drawn with empty cells: drawArrived)
      if (keys.length < max && (store.listing || store.runs.has(k))) {
        keys.push(k);
        gids.push(g);
      }
    };
    if (t.groups) t.groups.forEach((g, gi) => g.keys.forEach((k) => push(k, gi)));
    else for (const k of t.keys) push(k, 0);
    return {
      columns,
      numeric,
      columnsSig: JSON.stringify([columns, columns.filter((c) => numeric.has(c))]),
      keys,
      gids,
      groups: t.groups ? t.groups.length : null,
      groupSig: t.groups ? JSON.stringify(t.groups.map((g) => g.label)) : "",
    };
  }

  private rowsOf(p: Plan): Row[] {
    const rows: Row[] = new Array<Row>(p.keys.length);
    for (let i = 0; i < p.keys.length; i++) rows[i] = { _key: p.keys[i]!, _g: p.gids[i]! };
    return rows;
  }

  /** Build the table with the first answer's columns and rows (one render, no empty first pass). */
  private create(): void {
    const p = this.plan();
    if (!p) return;
    const rows = this.rowsOf(p);
    this.growWidths(p.columns, p.numeric, rows, true);
    this.columnsSig = p.columnsSig;
    this.groupSig = p.groupSig;
    this.drawnKeys = p.keys;
    this.drawnGroups = p.gids;
    this.dirty.clear();
    const builtFrom = store.table;
    // An empty folder is not a filter problem: say how to get runs into it.
    const placeholder = (): HTMLElement =>
      (store.table?.total ?? 0) === 0
        ? emptyState("No runs in this folder yet", "Start one with traceml run SCRIPT, or try the viewer on traceml fake-runs.", undefined, "table-empty")
        : emptyState("No runs match", "Clear the search, the filters or the status segment.", undefined, "table-empty");
    const rowHeight = parseFloat(getComputedStyle(document.documentElement).getPropertyValue("--row-h")) || 32;
    this.cellHeight = `${rowHeight}px`;
    const options: Options = {
      height: "100%",
      layout: "fixedWidths" as "fitData",
      index: "_key",
      nestedFieldSeparator: false,
      data: rows,
      columns: this.columnDefs(p.columns, p.numeric),
      placeholder,
      renderVertical: "virtual",
      rowHeight,
      // Rows drawn beyond the visible ones: a few, not a screenful (each drawn row costs page layout).
      renderVerticalBuffer: rowHeight * 4,
      // Resize handles in the header only (one per column, not one per cell).
      columnDefaults: { resizable: "header" },
      // Drag a header to reorder; the order is kept in the remembered view and the CSV export.
      movableColumns: true,
      groupToggleElement: "arrow",
      groupStartOpen: true,
      rowFormatter: (row: RowComponent) => this.formatRow(row),
    };
    if (p.groups !== null) Object.assign(options, this.groupOptions(p.groups));
    const tab = new Tabulator(this.host, options);
    this.tab = tab;
    columnWidths.set(tab, (field) => this.widthOf(field));
    tab.on("tableBuilt", () => {
      this.built = true;
      this.rowsReady = true;
      this.drawArrived(this.arrivedBlanks());
      this.updateSortMarks();
      this.syncHeadChecks();
      // A newer answer (or changed runs) arrived while the table was being built.
      if (store.table !== builtFrom || this.dirty.size) this.update();
    });
    tab.on("headerClick", (e: UIEvent, column: ColumnComponent) => this.onHeaderClick(e as MouseEvent, column));
    tab.on("rowClick", (e: UIEvent, row: RowComponent) => {
      const t = e.target as HTMLElement;
      if (t.closest(".cell-check")) return;
      const key = (row.getData() as Row)._key;
      this.moveCursor(key, false);
      this.host.focus({ preventScroll: true });
      store.openInspector(key);
    });
    tab.on("columnMoved", () => {
      const order = tab
        .getColumns()
        .map((c) => c.getField())
        .filter((f) => f && f !== SEL && f !== WARN);
      this.hooks.columnsMoved(order);
    });
    tab.on("columnResized", (col: ColumnComponent) => {
      this.widths.set(col.getField(), col.getWidth());
    });
  }

  /** Grouping by the answer's group index (`_g`), groups in the answer's order. */
  private groupOptions(n: number): Pick<Options, "groupBy" | "groupValues" | "groupHeader"> {
    return {
      groupBy: (data: Row) => data._g,
      groupValues: [Array.from({ length: n }, (_, i) => i)],
      // Tabulator accepts a DOM node from the header function (its typings only say string).
      groupHeader: ((value: unknown, count: number) => this.groupHeader(Number(value), count)) as unknown as (
        value: unknown,
        count: number,
        data: unknown,
      ) => string,
    };
  }

  private widthOf(field: string): number | undefined {
    if (field === SEL) return SEL_WIDTH;
    if (field === WARN) return WARN_WIDTH;
    return this.widths.get(field) ?? this.autoWidths.get(field);
  }

  /** Draw a new answer: in place when only run values changed, else replace the rows. */
  private update(): void {
    const tab = this.tab;
    const p = this.plan();
    if (!tab || !p) return;
    const { columns, numeric, keys, gids } = p;
    const columnsChanged = p.columnsSig !== this.columnsSig;
    const groupsChanged = p.groupSig !== this.groupSig;
    const sameOrder = !columnsChanged && !groupsChanged && sameList(keys, this.drawnKeys) && sameList(gids, this.drawnGroups);
    const dirty: RowComponent[] = [];
    if (this.dirty.size && this.rowsReady) {
      const byKey = this.rowComponents(tab);
      for (const k of this.dirty) {
        const comp = byKey.get(k);
        if (comp && store.runs.has(k)) dirty.push(comp);
      }
    }
    this.dirty.clear();

    if (sameOrder && this.rowsReady && dirty.length <= MAX_IN_PLACE) {
      // Same rows in the same order: redraw the changed runs in place (keeps scroll, no re-render).
      if (dirty.length) {
        const grown = this.growWidths(columns, numeric, dirty.map((comp) => comp.getData() as Row), false);
        for (const comp of dirty) comp.reformat();
        if (grown) tab.redraw();
      }
      this.syncHeadChecks();
      this.updateSortMarks();
      return;
    }

    if (!columnsChanged && this.rowsReady && this.reorder(tab, p, groupsChanged, dirty)) return;

    const rows = this.rowsOf(p);
    let grown = false;
    if (columnsChanged) {
      this.columnsSig = p.columnsSig;
      // Measured widths of columns that left the table are forgotten.
      for (const c of [...this.autoWidths.keys()]) if (!columns.includes(c)) this.autoWidths.delete(c);
      this.growWidths(columns, numeric, rows, true);
      tab.setColumns(this.columnDefs(columns, numeric));
    } else {
      grown = this.growWidths(columns, numeric, rows, false);
    }
    if (groupsChanged) this.applyGroups(tab, p);
    this.drawnKeys = keys;
    this.drawnGroups = gids;
    this.rowEls.clear();
    this.rowsByKey = null;
    this.rowsReady = false;
    const drawn = keys;
    const replaced = tab.replaceData(rows);
    if (grown) tab.redraw();
    void replaced.then(() => {
      if (this.drawnKeys !== drawn) return; // a newer answer is being drawn
      this.rowsReady = true;
      this.drawArrived(this.arrivedBlanks());
      this.syncHeadChecks();
    });
    this.updateSortMarks();
  }

  /** Set the table's grouping to the plan's groups (or none). */
  private applyGroups(tab: Tabulator, p: Plan): void {
    this.groupSig = p.groupSig;
    this.groupChecks.clear();
    if (p.groups !== null) {
      const g = this.groupOptions(p.groups);
      tab.setGroupBy(g.groupBy as (data: unknown) => unknown as unknown as string);
      tab.setGroupValues(g.groupValues!);
      tab.setGroupHeader(g.groupHeader!);
    } else {
      tab.setGroupBy(false as unknown as string);
    }
  }

  /** Draw an answer that holds the drawn runs in another order or other groups (a sort, a group
   *  by) by moving the rows Tabulator already has, not building new ones: `replaceData` of 100,000
   *  rows froze the tab for 0.6 s (issue 16). Tabulator's row list is set to the new order and its
   *  pipeline runs once (the group settings are applied with redraws held back). False, having
   *  changed nothing, when the answer holds other runs. Uses Tabulator's internals (`rowManager`,
   *  a component's `_row`), pinned by package-lock; the browser tests check the drawn order. */
  private reorder(tab: Tabulator, p: Plan, groupsChanged: boolean, dirty: RowComponent[]): boolean {
    const { keys, gids } = p;
    if (keys.length !== this.drawnKeys.length) return false;
    const byKey = this.rowComponents(tab);
    const comps: RowComponent[] = new Array<RowComponent>(keys.length);
    for (let i = 0; i < keys.length; i++) {
      const comp = byKey.get(keys[i]!);
      if (!comp) return false;
      comps[i] = comp;
    }
    const rows: unknown[] = new Array<unknown>(keys.length);
    for (let i = 0; i < keys.length; i++) {
      rows[i] = (comps[i] as unknown as InternalRowComponent)._row;
      (comps[i]!.getData() as Row)._g = gids[i]!;
    }
    const manager = (tab as unknown as { rowManager: InternalRowManager }).rowManager;
    tab.blockRedraw();
    try {
      if (groupsChanged) this.applyGroups(tab, p);
      manager.rows = rows;
      // No handler: the pipeline starts again from `rows` (a named stage would keep its old copy);
      // held until restoreRedraw, one pass for this and the group settings.
      manager.refreshActiveData(false, false, true);
    } finally {
      tab.restoreRedraw();
    }
    this.drawnKeys = keys;
    this.drawnGroups = gids;
    // The widths grow as a new answer's would (the same runs: only the first rows are new to them).
    const sampled = [...comps.slice(0, SAMPLE_ROWS), ...dirty].map((comp) => comp.getData() as Row);
    const grown = this.growWidths(p.columns, p.numeric, sampled, false);
    for (const comp of dirty) comp.reformat();
    if (grown) tab.redraw();
    this.drawArrived(this.arrivedBlanks());
    this.syncHeadChecks();
    this.updateSortMarks();
    return true;
  }

  /** Row components by key (built once per set of rows; see `rowsByKey`). */
  private rowComponents(tab: Tabulator): Map<string, RowComponent> {
    if (!this.rowsByKey) {
      this.rowsByKey = new Map();
      for (const r of tab.getRows()) this.rowsByKey.set((r.getData() as Row)._key, r);
    }
    return this.rowsByKey;
  }

  /** The value of `column` in the row's run. */
  private value(row: Row, column: string): unknown {
    const run = store.runs.get(row._key);
    return run ? cellGetter(column)(run) : null;
  }

  // -- widths ---------------------------------------------------------------------------------------

  /**
   * Measure the columns' content off screen in one layout pass: the header and, per column, the
   * widest-looking cells (longest texts) among the first rows and the rows with the longest values.
   * A measured width only grows.
   * `all` measures every column; else only the ones already shown with room to grow. Returns whether
   * a width grew: new column definitions pick the widths up, shown columns need `tab.redraw()` (the
   * "fixedWidths" layout applies them all in one pass).
   */
  private growWidths(columns: string[], numeric: Set<string>, rows: Row[], all: boolean): boolean {
    const todo = columns.filter((c) => !this.widths.has(c) && (all || (this.autoWidths.get(c) ?? 0) < MAX_WIDTH));
    if (!todo.length) return false;
    const first = rows.slice(0, SAMPLE_ROWS);
    const longest = rows.length > SAMPLE_ROWS ? longestTexts(rows, todo.filter((c) => !numeric.has(c) && !SHORT_TEXT.has(c))) : null;
    const sample = (c: string) => [...first, ...(longest?.get(c) ?? [])];
    const box = h("div", { class: "tabulator table-measure" });
    const parts: [string, HTMLElement, HTMLElement][] = [];
    for (const c of todo) {
      const isNum = numeric.has(c);
      const title = this.titleNode(c, true).el;
      const rowsOfC = sample(c);
      const col = h(
        "div",
        { class: "tabulator-col" },
        h("div", { class: "tabulator-col-content" }, h("div", { class: "tabulator-col-title-holder" }, h("div", { class: "tabulator-col-title" }, title))),
      );
      const head = h("div", { class: "tabulator-header" }, col);
      const cells = h("div", { class: "tabulator-row" });
      for (const r of widestCandidates(rowsOfC, (r) => this.cellText(r._key, c, this.value(r, c)))) {
        const cell = h("div", { class: "tabulator-cell" });
        const content = this.cellNode(cell, r._key, c, isNum, this.value(r, c), true);
        if (typeof content === "string") cell.textContent = content;
        else cell.appendChild(content);
        cells.appendChild(cell);
      }
      box.append(head, cells);
      parts.push([c, col, cells]);
    }
    document.body.appendChild(box);
    const measured = parts.map(([c, col, cells]) => [c, Math.max(col.offsetWidth, cells.offsetWidth) + 1] as const);
    box.remove();
    let grown = false;
    for (const [c, w0] of measured) {
      const w = Math.min(MAX_WIDTH, Math.max(minWidth(c), Math.ceil(w0)));
      if (w <= (this.autoWidths.get(c) ?? 0)) continue;
      this.autoWidths.set(c, w);
      grown = true;
    }
    return grown;
  }

  // -- columns --------------------------------------------------------------------------------------

  private columnDefs(columns: string[], numeric: Set<string>): ColumnDefinition[] {
    this.sortEls.clear();
    this.filterBtns.clear();
    const defs: ColumnDefinition[] = [
      {
        title: "",
        field: SEL,
        minWidth: SEL_WIDTH,
        resizable: false,
        frozen: true,
        hozAlign: "center",
        headerHozAlign: "center",
        cssClass: "cell-check",
        titleFormatter: () => this.headerCheckbox(),
        formatter: (cell: CellComponent) => this.checkbox(this.fixHeight(cell)),
      },
      {
        title: "",
        field: WARN,
        minWidth: WARN_WIDTH,
        resizable: false,
        frozen: true,
        hozAlign: "center",
        cssClass: "cell-warn",
        titleFormatter: () => h("span", { class: "col-icon", title: "File problems" }, icon("warning")),
        formatter: (cell: CellComponent) => this.warnCell(this.fixHeight(cell)),
      },
    ];
    for (const c of columns) {
      const isNum = numeric.has(c);
      const def: ColumnDefinition = {
        title: c,
        field: c,
        minWidth: minWidth(c),
        maxWidth: MAX_WIDTH,
        hozAlign: isNum ? "right" : "left",
        headerHozAlign: isNum ? "right" : "left",
        titleFormatter: () => this.title(c),
        formatter: (cell: CellComponent) => {
          const row = this.fixHeight(cell).getRow().getData() as Row;
          return this.cellNode(cell.getElement(), row._key, c, isNum, this.value(row, c)) as string;
        },
      };
      if (c === "name") def.frozen = true;
      defs.push(def);
    }
    return defs;
  }

  private title(column: string): HTMLElement {
    const { el, sortEl, filterBtn } = this.titleNode(column, false);
    this.sortEls.set(column, sortEl);
    this.filterBtns.set(column, filterBtn);
    return el;
  }

  /** The header of a column; `measuring` builds a copy to measure (with its current sort mark). */
  private titleNode(column: string, measuring: boolean): { el: HTMLElement; sortEl: HTMLElement; filterBtn: HTMLElement } {
    const [kind] = splitColumn(column);
    const sortEl = h("span", { class: "col-sort", text: measuring ? sortMark(column) : undefined });
    const filterBtn = h(
      "button",
      { type: "button", class: "col-filter", title: `Filter ${column}`, testid: "column-filter", data: { column } },
      icon("filter"),
    );
    if (!measuring) {
      filterBtn.addEventListener("click", (ev) => {
        ev.stopPropagation();
        this.hooks.editFilter(column, filterBtn);
      });
    }
    const el = h(
      "div",
      { class: "col-title", title: column, data: { column } },
      kind !== "fixed" ? h("span", { class: `col-kind kind-${kind.replace(".", "-")}`, text: KIND_LABEL[kind] }) : null,
      h("span", { class: "col-name", text: columnTitle(column) }),
      sortEl,
      filterBtn,
    );
    return { el, sortEl, filterBtn };
  }

  updateSortMarks(): void {
    for (const [col, el] of this.sortEls) {
      const mark = sortMark(col);
      el.textContent = mark;
      el.parentElement?.classList.toggle("is-sorted", mark !== "");
    }
    const filtered = new Set(store.ui.filters.map((f) => f.column));
    for (const [col, el] of this.filterBtns) el.classList.toggle("is-active", filtered.has(col));
  }

  private onHeaderClick(e: MouseEvent, column: ColumnComponent): void {
    const field = column.getField();
    if (!field || field === SEL || field === WARN) return;
    const t = e.target as HTMLElement;
    if (t.closest(".col-filter") || t.closest(".tabulator-col-resize-handle")) return;
    const sort = [...store.ui.sort];
    const i = sort.findIndex((s) => s === field || s === `-${field}`);
    let next: string[];
    if (e.shiftKey) {
      if (i < 0) sort.push(field);
      else if (!sort[i]!.startsWith("-")) sort[i] = `-${field}`;
      else sort.splice(i, 1);
      next = sort;
    } else if (i < 0 || sort.length > 1) {
      next = [field];
    } else {
      next = sort[0]!.startsWith("-") ? [] : [`-${field}`];
    }
    store.set("sort", next);
    this.updateSortMarks();
    void queryTable();
  }

  // -- cells ----------------------------------------------------------------------------------------

  /**
   * Give a new cell the height Tabulator sets on it once the row is in the page. Written before, the
   * same value later changes nothing; written after, it restyles every drawn cell a second time.
   */
  private fixHeight(cell: CellComponent): CellComponent {
    cell.getElement().style.height = this.cellHeight;
    return cell;
  }

  private checkbox(cell: CellComponent): HTMLElement {
    const key = (cell.getRow().getData() as Row)._key;
    const input = h("input", { type: "checkbox", class: "row-check", testid: "row-check", attrs: { "aria-label": "Select run" } });
    input.checked = store.isSelected(key);
    input.addEventListener("click", (ev) => ev.stopPropagation());
    input.addEventListener("change", () => store.toggleSelected(key, input.checked));
    return input;
  }

  private headerCheckbox(): HTMLElement {
    const input = h("input", { type: "checkbox", class: "head-check", testid: "select-all", title: "Select all shown runs" });
    input.addEventListener("click", (ev) => ev.stopPropagation());
    input.addEventListener("change", () => {
      const keys = this.shownKeys();
      store.selectMany(keys, input.checked);
    });
    this.headCheck = input;
    return input;
  }

  private warnCell(cell: CellComponent): HTMLElement | string {
    const run = store.runs.get((cell.getRow().getData() as Row)._key);
    if (!run || !run.warnings.length) return "";
    const el = h("span", { class: "file-problem", testid: "file-problem", title: run.warnings.join("\n") }, icon("warning"));
    el.setAttribute("aria-label", `${run.warnings.length} file problem${run.warnings.length === 1 ? "" : "s"}`);
    return el;
  }

  /** The text a cell shows (what decides its width; mirrors `cellNode`). */
  private cellText(key: string, column: string, value: unknown): string {
    const v = value as RunRow["params"][string] | undefined;
    const run = store.runs.get(key);
    if (column === "status" && run) return String(v ?? "unknown");
    if (column === "name" && run) return `${rawText(v) || run.id}${store.hidden.has(key) ? " [hidden]" : ""}`;
    if (v === null || v === undefined || v === "") return "–";
    if (column === "started" || column === "ended" || column === "heartbeat") return fmtTime(String(v));
    if (column === "duration_s" && typeof v === "number") return fmtDuration(v);
    if (column === "tags" && run) return run.tags.join("  ");
    if (typeof v === "number") return fmtNum(v);
    return rawText(v);
  }

  /**
   * A cell's content, for the cell element `host`. Plain values are a text node, their class and
   * tooltip set on the cell itself (one element per cell, not two). `measuring` draws the widest
   * form (the name with its selection swatch).
   */
  private cellNode(host: HTMLElement, key: string, column: string, isNum: boolean, value: unknown, measuring = false): Node | string {
    const v = value as RunRow["params"][string] | undefined;
    const run = store.runs.get(key);
    if (!run && store.listing && !measuring) this.blank.add(key);
    host.classList.remove("cell-num", "cell-text", "cell-null");
    host.removeAttribute("title");
    if (column === "status" && run) {
      const err = run.error;
      const tip = err ? [err.type, err.message].filter(Boolean).join(": ") || undefined : undefined;
      return statusBadge(String(v ?? "unknown"), tip);
    }
    if (column === "name" && run) {
      const el = h("span", { class: "cell-name", text: rawText(v) || run.id });
      const wrap = h("span", { class: "cell-name-wrap" });
      // Measuring leaves room for the selection swatch (without giving the run a colour).
      if (measuring || store.isSelected(key)) {
        // (No palette colour while measuring: reading it forces a style pass of the whole page
        // before the one the measurement itself needs.)
        wrap.appendChild(swatch(measuring ? "transparent" : paletteColor(store.colorOf(key)), "swatch swatch-sm"));
      }
      wrap.appendChild(el);
      if (isCaptured(run)) wrap.appendChild(perfBadge(run));
      if (store.hidden.has(key)) wrap.appendChild(h("span", { class: "tag tag-muted", text: "hidden" }));
      wrap.title = run.id;
      return wrap;
    }
    if (v === null || v === undefined || v === "") {
      return plainCell(host, "–", "cell-null", column.startsWith("perf.") && run ? (perfMissingReason(run, column) ?? undefined) : undefined);
    }
    if (column === "started" || column === "ended" || column === "heartbeat") {
      return plainCell(host, fmtTime(String(v)), null, String(v));
    }
    if (column === "duration_s" && typeof v === "number") {
      return plainCell(host, fmtDuration(v), null, `${v} s`);
    }
    if (column === "tags" && run) {
      return h("span", { class: "cell-tags" }, ...run.tags.map((t) => h("span", { class: "tag", text: t })));
    }
    if (typeof v === "number" && column.startsWith("perf.")) return plainCell(host, fmtPerf(column, v), "cell-num", String(v));
    if (typeof v === "number") return plainCell(host, fmtNum(v), "cell-num", String(v));
    const text = rawText(v);
    return plainCell(host, text, isNum ? "cell-num" : "cell-text", text.length > 24 ? text : undefined);
  }

  private formatRow(row: RowComponent): void {
    const key = (row.getData() as Row)._key;
    const el = row.getElement();
    el.classList.toggle("is-selected", store.isSelected(key));
    el.classList.toggle("is-hidden-run", store.hidden.has(key));
    el.classList.toggle("is-inspected", store.inspector === key);
    el.classList.toggle("is-cursor", this.cursor === key);
    el.setAttribute("data-key", key);
    el.setAttribute("data-testid", "run-row");
    this.rowEls.set(key, el);
  }

  // -- keyboard -------------------------------------------------------------------------------------

  /** ↑/↓ (and Home/End, PageUp/PageDown) move the cursor row, Enter opens it in the inspector,
   *  Space ticks it. Keys typed into the header's checkbox or filter buttons are theirs. */
  private onKey(ev: KeyboardEvent): void {
    if (ev.altKey || ev.ctrlKey || ev.metaKey) return;
    const t = ev.target as HTMLElement;
    if (t !== this.host && t.closest("input, button, select, textarea, .tabulator-header")) return;
    const keys = this.drawnKeys;
    if (!keys.length) return;
    const at = this.cursor === null ? -1 : keys.indexOf(this.cursor);
    const page = Math.max(1, Math.floor((this.host.clientHeight || 320) / (parseFloat(this.cellHeight) || 32)) - 2);
    let next: number | null = null;
    switch (ev.key) {
      case "ArrowDown":
        next = at < 0 ? 0 : Math.min(keys.length - 1, at + 1);
        break;
      case "ArrowUp":
        next = at < 0 ? 0 : Math.max(0, at - 1);
        break;
      case "PageDown":
        next = Math.min(keys.length - 1, Math.max(0, at) + page);
        break;
      case "PageUp":
        next = Math.max(0, at - page);
        break;
      case "Home":
        next = 0;
        break;
      case "End":
        next = keys.length - 1;
        break;
      case "Enter":
        if (at >= 0) store.openInspector(keys[at]!);
        ev.preventDefault();
        return;
      case " ":
        if (at >= 0) store.toggleSelected(keys[at]!);
        ev.preventDefault();
        return;
      default:
        return;
    }
    ev.preventDefault();
    const key = keys[next]!;
    this.moveCursor(key, true);
    // An open inspector follows the cursor.
    if (store.inspector !== null && store.inspector !== key) store.openInspector(key);
  }

  private moveCursor(key: string, scroll: boolean): void {
    const before = this.cursor;
    this.cursor = key;
    if (before !== null) this.rowEls.get(before)?.classList.remove("is-cursor");
    this.rowEls.get(key)?.classList.add("is-cursor");
    this.host.setAttribute("data-cursor", key);
    if (scroll && this.tab) void this.tab.scrollToRow(key, "nearest", false).catch(() => undefined);
  }

  // -- groups ---------------------------------------------------------------------------------------

  private groupHeader(gi: number, count: number): HTMLElement {
    const g = store.table?.groups?.[gi];
    const label = g?.label ?? "";
    const color = paletteColor(g?.color ?? gi);
    const input = h("input", { type: "checkbox", class: "group-check", testid: "group-select", title: `Select the runs of ${label}` });
    input.addEventListener("click", (ev) => ev.stopPropagation());
    input.addEventListener("change", () => store.selectMany(g?.keys ?? [], input.checked));
    this.groupChecks.set(gi, input);
    this.syncGroupCheck(gi);
    const bar = h("span", { class: "group-bar" });
    bar.style.backgroundColor = color;
    return h(
      "span",
      { class: "group-head", testid: "group-header", data: { group: label } },
      input,
      bar,
      h("span", { class: "group-label", text: label }),
      h("span", { class: "group-count", text: `${count} run${count === 1 ? "" : "s"}` }),
    );
  }

  private syncGroupCheck(gi: number): void {
    const input = this.groupChecks.get(gi);
    const g = store.table?.groups?.[gi];
    if (!input || !g) return;
    const n = g.keys.filter((k) => store.isSelected(k)).length;
    input.checked = n > 0 && n === g.keys.length;
    input.indeterminate = n > 0 && n < g.keys.length;
  }

  // -- selection ------------------------------------------------------------------------------------

  private shownKeys(): string[] {
    const t = store.table;
    if (!t) return [];
    return limitRows((t.groups ? t.groups.flatMap((g) => g.keys) : t.keys).filter((k) => store.runs.has(k)));
  }

  /** Selection and inspector marks on the rows Tabulator built; rows built later read the store. */
  private syncSelection(): void {
    if (!this.tab || !this.built) return;
    for (const [key, el] of this.rowEls) {
      const sel = store.isSelected(key);
      el.classList.toggle("is-selected", sel);
      el.classList.toggle("is-inspected", store.inspector === key);
      const input = el.querySelector<HTMLInputElement>("input.row-check");
      if (input) input.checked = sel;
      const nameWrap = el.querySelector<HTMLElement>(".cell-name-wrap");
      if (nameWrap) {
        const sw = nameWrap.querySelector(".swatch");
        if (sel && !sw) nameWrap.insertBefore(swatch(paletteColor(store.colorOf(key)), "swatch swatch-sm"), nameWrap.firstChild);
        if (!sel && sw) sw.remove();
      }
    }
    this.syncHeadChecks();
  }

  /** The group and select-all checkboxes. */
  private syncHeadChecks(): void {
    for (const gi of this.groupChecks.keys()) this.syncGroupCheck(gi);
    if (this.headCheck) {
      const keys = this.shownKeys();
      let n = 0;
      for (const k of keys) if (store.isSelected(k)) n++;
      this.headCheck.checked = n > 0 && n === keys.length;
      this.headCheck.indeterminate = n > 0 && n < keys.length;
    }
  }

  /** Mark the inspected row. */
  syncInspected(): void {
    this.syncSelection();
  }
}

/** Plain cell content: a text node; class and tooltip go on the cell (`cellNode` resets both). */
/** The badge of a captured run in its name cell: "perf", coloured by the verdict's severity. */
function perfBadge(run: RunRow): HTMLElement {
  const p = run.perf;
  const sev = typeof p.severity === "string" ? p.severity : "";
  const verdict = typeof p.verdict === "string" ? p.verdict : "no verdict";
  const tip = `Captured by traceml run · telemetry ${String(p.telemetry)} · ${verdict}${sev ? ` (${sev})` : ""}`;
  return h("span", {
    class: `perf-badge${sev ? ` sev-${sev}` : ""}`,
    testid: "perf-badge",
    title: tip,
    text: "perf",
    data: { verdict, severity: sev || "none" },
  });
}

function plainCell(host: HTMLElement, text: string, cls: string | null, title?: string): Text {
  if (cls) host.classList.add(cls);
  if (title) host.title = title;
  return document.createTextNode(text);
}

const SEL_WIDTH = 38;
const WARN_WIDTH = 30;
const MAX_WIDTH = 420;
/** More changed rows than this in one answer: replace the data instead of updating row by row. */
const MAX_IN_PLACE = 200;
/** Rows measured for the column widths: the first ones (what Tabulator draws first) … */
const SAMPLE_ROWS = 40;
/** … and, per column, the ones with the longest texts. */
const LONGEST_ROWS = 3;

/** The sort mark of a column's header: `↑`, `↓`, with the level when sorting by several columns. */
function sortMark(column: string): string {
  const sort = store.ui.sort;
  const i = sort.findIndex((s) => s === column || s === `-${column}`);
  if (i < 0) return "";
  return `${sort[i]!.startsWith("-") ? "↓" : "↑"}${sort.length > 1 ? String(i + 1) : ""}`;
}

function minWidth(column: string): number {
  return column === "name" ? 140 : 70;
}

function sameList<T>(a: T[], b: T[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** Cells measured per column: the ones with the longest distinct texts. */
const WIDEST_CELLS = 4;

/** The rows whose cell text is among the `WIDEST_CELLS` longest distinct texts. */
function widestCandidates(rows: Row[], text: (r: Row) => string): Row[] {
  const byText = new Map<string, Row>();
  for (const r of rows) {
    const t = text(r);
    if (!byText.has(t)) byText.set(t, r);
  }
  return [...byText.entries()]
    .sort((a, b) => b[0].length - a[0].length)
    .slice(0, WIDEST_CELLS)
    .map((e) => e[1]);
}

/** Columns whose texts have about one length (times, durations, status names): the first rows do. */
const SHORT_TEXT = new Set(["status", "started", "ended", "heartbeat", "duration_s"]);

/** Per column, the `LONGEST_ROWS` rows with the longest text value; one pass over the rows. */
function longestTexts(rows: Row[], columns: string[]): Map<string, Row[]> {
  const getters = columns.map((c) => cellGetter(c));
  const best: { row: Row; len: number }[][] = columns.map(() => []);
  for (const row of rows) {
    const run = store.runs.get(row._key);
    if (!run) continue;
    for (let i = 0; i < getters.length; i++) {
      const v = getters[i]!(run);
      if (typeof v !== "string") continue;
      const list = best[i]!;
      const len = v.length;
      if (list.length === LONGEST_ROWS && len <= list[LONGEST_ROWS - 1]!.len) continue;
      list.push({ row, len });
      list.sort((a, b) => b.len - a.len);
      if (list.length > LONGEST_ROWS) list.pop();
    }
  }
  return new Map(columns.map((c, i) => [c, best[i]!.map((b) => b.row)]));
}
