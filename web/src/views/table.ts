// The run table: Tabulator with virtual rendering. Python decides which rows, in which order and in
// which groups (GET /api/table); this module only draws them. Sorting is sent back to the server
// (click a header, shift-click to add a sort level). Every formatter returns a DOM node with text,
// never an HTML string.

import {
  type CellComponent,
  type ColumnComponent,
  type ColumnDefinition,
  FormatModule,
  FrozenColumnsModule,
  GroupRowsModule,
  InteractionModule,
  ResizeColumnsModule,
  type RowComponent,
  Tabulator,
} from "tabulator-tables";
import { queryTable, shownColumns } from "../actions";
import { cellValue, columnTitle, KIND_LABEL, splitColumn } from "../columns";
import { h } from "../dom";
import { fmtDuration, fmtNum, fmtTime, rawText } from "../format";
import { icon } from "../icons";
import { store } from "../store";
import type { RunRow } from "../types";
import { emptyState, paletteColor, statusBadge, swatch } from "../ui";

Tabulator.registerModule([FormatModule, GroupRowsModule, InteractionModule, ResizeColumnsModule, FrozenColumnsModule]);

interface Row {
  _key: string;
  _g: number;
  [column: string]: unknown;
}

const SEL = "_sel";
const WARN = "_warn";

export interface TableHooks {
  /** Open the filter editor of a column, anchored at the header's funnel button. */
  editFilter(column: string, anchor: HTMLElement): void;
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
  private widths = new Map<string, number>();
  private pending = false;

  constructor(
    private host: HTMLElement,
    private hooks: TableHooks,
  ) {
    store.on("selection", () => this.syncSelection());
  }

  /** Draw the latest table answer (call when visible). */
  render(): void {
    if (!store.table) return;
    if (!this.tab) {
      this.create();
      return;
    }
    if (!this.built) {
      this.pending = true;
      return;
    }
    this.update();
  }

  redraw(): void {
    if (this.tab && this.built) this.tab.redraw(true);
  }

  private create(): void {
    const placeholder = emptyState("No runs match", "Clear the search, the filters or the status segment.", undefined, "table-empty");
    this.tab = new Tabulator(this.host, {
      height: "100%",
      layout: "fitData",
      index: "_key",
      nestedFieldSeparator: false,
      data: [],
      columns: [],
      placeholder,
      renderVertical: "virtual",
      groupToggleElement: "arrow",
      groupStartOpen: true,
      rowFormatter: (row: RowComponent) => this.formatRow(row),
    });
    this.tab.on("tableBuilt", () => {
      this.built = true;
      this.update();
      if (this.pending) {
        this.pending = false;
        this.update();
      }
    });
    this.tab.on("headerClick", (e: UIEvent, column: ColumnComponent) => this.onHeaderClick(e as MouseEvent, column));
    this.tab.on("rowClick", (e: UIEvent, row: RowComponent) => {
      const t = e.target as HTMLElement;
      if (t.closest(".cell-check")) return;
      const key = (row.getData() as Row)._key;
      store.openInspector(key);
    });
    this.tab.on("columnResized", (col: ColumnComponent) => {
      this.widths.set(col.getField(), col.getWidth());
    });
  }

  private update(): void {
    const tab = this.tab;
    const t = store.table;
    if (!tab || !t) return;
    const columns = shownColumns();
    const numeric = new Set(t.columns.numeric);
    const sig = JSON.stringify([columns, [...numeric].filter((c) => columns.includes(c))]);
    if (sig !== this.columnsSig) {
      this.columnsSig = sig;
      tab.setColumns(this.columnDefs(columns, numeric));
    }
    const rows: Row[] = [];
    if (t.groups) {
      t.groups.forEach((g, gi) => {
        for (const k of g.keys) {
          const run = store.runs.get(k);
          if (run) rows.push(this.rowData(run, columns, gi));
        }
      });
    } else {
      for (const k of t.keys) {
        const run = store.runs.get(k);
        if (run) rows.push(this.rowData(run, columns, 0));
      }
    }
    const groupSig = t.groups ? JSON.stringify(t.groups.map((g) => g.label)) : "";
    if (groupSig !== this.groupSig) {
      this.groupSig = groupSig;
      this.groupChecks.clear();
      if (t.groups) {
        tab.setGroupBy((data: Row) => data._g);
        tab.setGroupValues([t.groups.map((_, i) => i)]);
        // Tabulator accepts a DOM node from the header function (its typings only say string).
        tab.setGroupHeader(((value: unknown, count: number) => this.groupHeader(Number(value), count)) as unknown as (value: unknown, count: number, data: unknown) => string);
      } else {
        tab.setGroupBy(false as unknown as string);
      }
    }
    void tab.replaceData(rows).then(() => this.syncSelection());
    this.updateSortMarks();
  }

  private rowData(run: RunRow, columns: string[], g: number): Row {
    const row: Row = { _key: run.key, _g: g };
    for (const c of columns) row[c] = cellValue(run, c);
    return row;
  }

  // -- columns --------------------------------------------------------------------------------------

  private columnDefs(columns: string[], numeric: Set<string>): ColumnDefinition[] {
    this.sortEls.clear();
    this.filterBtns.clear();
    const defs: ColumnDefinition[] = [
      {
        title: "",
        field: SEL,
        width: 38,
        minWidth: 38,
        resizable: false,
        frozen: true,
        hozAlign: "center",
        headerHozAlign: "center",
        cssClass: "cell-check",
        titleFormatter: () => this.headerCheckbox(),
        formatter: (cell: CellComponent) => this.checkbox(cell),
      },
      {
        title: "",
        field: WARN,
        width: 30,
        minWidth: 30,
        resizable: false,
        frozen: true,
        hozAlign: "center",
        cssClass: "cell-warn",
        titleFormatter: () => h("span", { class: "col-icon", title: "File problems" }, icon("warning")),
        formatter: (cell: CellComponent) => this.warnCell(cell),
      },
    ];
    for (const c of columns) {
      const isNum = numeric.has(c);
      const def: ColumnDefinition = {
        title: c,
        field: c,
        minWidth: c === "name" ? 140 : 70,
        maxWidth: 420,
        hozAlign: isNum ? "right" : "left",
        headerHozAlign: isNum ? "right" : "left",
        titleFormatter: () => this.title(c),
        formatter: (cell: CellComponent) => this.cell(cell, c, isNum),
      };
      if (c === "name") def.frozen = true;
      const w = this.widths.get(c);
      if (w) def.width = w;
      defs.push(def);
    }
    return defs;
  }

  private title(column: string): HTMLElement {
    const [kind] = splitColumn(column);
    const sortEl = h("span", { class: "col-sort" });
    this.sortEls.set(column, sortEl);
    const filterBtn = h(
      "button",
      { type: "button", class: "col-filter", title: `Filter ${column}`, testid: "column-filter", data: { column } },
      icon("filter"),
    );
    filterBtn.addEventListener("click", (ev) => {
      ev.stopPropagation();
      this.hooks.editFilter(column, filterBtn);
    });
    this.filterBtns.set(column, filterBtn);
    return h(
      "div",
      { class: "col-title", title: column, data: { column } },
      kind !== "fixed" ? h("span", { class: `col-kind kind-${kind.replace(".", "-")}`, text: KIND_LABEL[kind] }) : null,
      h("span", { class: "col-name", text: columnTitle(column) }),
      sortEl,
      filterBtn,
    );
  }

  updateSortMarks(): void {
    const sort = store.ui.sort;
    for (const [col, el] of this.sortEls) {
      const i = sort.findIndex((s) => s === col || s === `-${col}`);
      if (i < 0) {
        el.textContent = "";
        el.parentElement?.classList.remove("is-sorted");
        continue;
      }
      const desc = sort[i]!.startsWith("-");
      el.textContent = `${desc ? "↓" : "↑"}${sort.length > 1 ? String(i + 1) : ""}`;
      el.parentElement?.classList.add("is-sorted");
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
    el.setAttribute("aria-label", `${run.warnings.length} file problem(s)`);
    return el;
  }

  private cell(cell: CellComponent, column: string, isNum: boolean): HTMLElement | string {
    const v = cell.getValue() as RunRow["params"][string] | undefined;
    const key = (cell.getRow().getData() as Row)._key;
    const run = store.runs.get(key);
    if (column === "status" && run) {
      const err = run.error;
      const tip = err ? [err.type, err.message].filter(Boolean).join(": ") || undefined : undefined;
      return statusBadge(String(v ?? "unknown"), tip);
    }
    if (column === "name" && run) {
      const el = h("span", { class: "cell-name", text: rawText(v) || run.id });
      const wrap = h("span", { class: "cell-name-wrap" });
      if (store.isSelected(key)) wrap.appendChild(swatch(paletteColor(store.colorOf(key)), "swatch swatch-sm"));
      wrap.appendChild(el);
      if (store.hidden.has(key)) wrap.appendChild(h("span", { class: "tag tag-muted", text: "hidden" }));
      wrap.title = run.id;
      return wrap;
    }
    if (v === null || v === undefined || v === "") return h("span", { class: "cell-null", text: "–" });
    if (column === "started" || column === "ended" || column === "heartbeat") {
      return h("span", { text: fmtTime(String(v)), title: String(v) });
    }
    if (column === "duration_s" && typeof v === "number") {
      return h("span", { text: fmtDuration(v), title: `${v} s` });
    }
    if (column === "tags" && run) {
      return h("span", { class: "cell-tags" }, ...run.tags.map((t) => h("span", { class: "tag", text: t })));
    }
    if (typeof v === "number") {
      return h("span", { class: "cell-num", text: fmtNum(v), title: String(v) });
    }
    const text = rawText(v);
    return h("span", { class: isNum ? "cell-num" : "cell-text", text, title: text.length > 24 ? text : undefined });
  }

  private formatRow(row: RowComponent): void {
    const key = (row.getData() as Row)._key;
    const el = row.getElement();
    el.classList.toggle("is-selected", store.isSelected(key));
    el.classList.toggle("is-hidden-run", store.hidden.has(key));
    el.classList.toggle("is-inspected", store.inspector === key);
    el.setAttribute("data-key", key);
    el.setAttribute("data-testid", "run-row");
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
    return (t.groups ? t.groups.flatMap((g) => g.keys) : t.keys).filter((k) => store.runs.has(k));
  }

  private syncSelection(): void {
    if (!this.tab || !this.built) return;
    for (const row of this.tab.getRows()) {
      const key = (row.getData() as Row)._key;
      const el = row.getElement();
      if (!el) continue;
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
    for (const gi of this.groupChecks.keys()) this.syncGroupCheck(gi);
    if (this.headCheck) {
      const keys = this.shownKeys();
      const n = keys.filter((k) => store.isSelected(k)).length;
      this.headCheck.checked = n > 0 && n === keys.length;
      this.headCheck.indeterminate = n > 0 && n < keys.length;
    }
  }

  /** Mark the inspected row. */
  syncInspected(): void {
    this.syncSelection();
  }
}
