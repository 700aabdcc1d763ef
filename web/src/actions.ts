// Actions that call the server and update the store: loading run deltas, querying the table model,
// hiding runs, exports, and remembering the view.

import { api, FIRST_ROWS, sameQuestion, type TableQuery, tableQuestion } from "./api";
import { debounce } from "./dom";
import { type StatusSegment, store, type UiState } from "./store";
import type { ExportResponse, TableResponse } from "./types";
import { errorText, toast } from "./ui";

let runsInFlight: Promise<void> | null = null;
let runsAgain = false;

/** Fetch what changed since the version the page holds, and tell the views. `full`: every run, as a
 *  streamed listing. */
export function loadRuns(full = false): Promise<void> {
  if (runsInFlight) {
    runsAgain = true;
    return runsInFlight;
  }
  runsInFlight = (async () => {
    try {
      if (full) await streamListing();
      else runsAgain = true;
      while (runsAgain) {
        runsAgain = false;
        const res = await api.runs(store.version);
        const changed = store.applyRuns(res);
        store.emit("runs", changed);
      }
    } finally {
      runsInFlight = null;
    }
  })();
  return runsInFlight;
}

/** Every run, a chunk at a time: each chunk's rows are drawn as they come ("rows"), and the runs the
 *  listing left out go at its end. Changes made meanwhile come with the next delta (since=version). */
async function streamListing(): Promise<void> {
  let complete = false;
  store.startListing();
  try {
    await api.listing({
      header: (res) => {
        store.emit("runs", store.listingHeader(res)); // (also when empty: the roots, the refresh settings)
        store.emit("rows", []);
      },
      rows: (rows) => store.emit("rows", store.addListed(rows)),
    });
    complete = true;
  } finally {
    if (store.listing) {
      const gone = store.endListing(complete);
      store.emit("listed");
      if (gone.length) store.emit("runs", gone);
    }
  }
}

/** POST /api/refresh: re-check finished runs too, then re-query the table. */
export async function refreshNow(): Promise<void> {
  try {
    const res = await api.refresh(store.version);
    const changed = store.applyRuns(res);
    store.emit("runs", changed);
    await queryTable();
  } catch (err) {
    toast(errorText(err), "error");
  }
}

export function statusList(seg: StatusSegment): string[] {
  if (seg === "all") return [];
  if (seg === "running") return ["running", "running?"];
  return [seg];
}

export function currentTableQuery(): TableQuery {
  const ui = store.ui;
  return {
    filters: ui.filters.map((f) => `${f.column}:${f.expr}`),
    sort: ui.sort,
    group: ui.group,
    search: ui.search,
    status: statusList(ui.status),
    differing: ui.differing,
    columns: ui.columns,
    showHidden: ui.showHidden,
  };
}

let tableSeq = 0;

/** The rows a table answer brought, for the runs the page does not hold yet (drawn at once). */
function takeRows(res: TableResponse): void {
  const added = store.addRows(res.rows);
  if (added.length) store.emit("rows", added);
}

/** GET /api/table with the current view; only the newest answer is applied. `rows`: also the rows of
 *  its first runs (the first table, while the listing streams). */
export async function queryTable(rows = 0): Promise<TableResponse | null> {
  const seq = ++tableSeq;
  try {
    const res = await api.table(currentTableQuery(), rows || (store.listing ? FIRST_ROWS : 0));
    takeRows(res);
    if (seq !== tableSeq) return null;
    store.table = res;
    store.emit("table");
    return res;
  } catch (err) {
    if (seq === tableSeq) toast(errorText(err), "error");
    return null;
  }
}

/**
 * The first table of the page: the answer index.html preloaded for the remembered view, when it
 * answers the question this page asks (it does unless the view changed in between); else asked.
 */
export async function queryFirstTable(): Promise<TableResponse | null> {
  const seq = ++tableSeq;
  try {
    const res = await api.rememberedTable();
    takeRows(res);
    if (seq === tableSeq && sameQuestion(res.query, tableQuestion(currentTableQuery()))) {
      store.table = res;
      store.emit("table");
      return res;
    }
  } catch {
    // ask the usual way below
  }
  return seq === tableSeq ? queryTable(FIRST_ROWS) : null;
}

export const queryTableSoon = debounce(() => void queryTable(), 180);

/** Keys of the table in the order it is drawn (group by group when grouped), at most Max rows. */
export function tableOrder(): string[] {
  const t = store.table;
  if (!t) return [];
  const keys = t.groups ? t.groups.flatMap((g) => g.keys) : t.keys;
  return limitRows(keys.filter((k) => store.runs.has(k)));
}

/** The first Max rows of `keys` (all of them without a limit). */
export function limitRows<T>(keys: T[]): T[] {
  const n = store.ui.maxRows;
  return n !== null && keys.length > n ? keys.slice(0, n) : keys;
}

/**
 * The columns the table shows. With "differing params only" on, the config columns are exactly the
 * params whose value differs between the shown runs (placed after the run columns), whatever the
 * column chooser holds; the other columns stay as chosen.
 */
export function shownColumns(): string[] {
  const t = store.table;
  if (!t) return [];
  if (!store.ui.differing) return t.columns.shown;
  // Right after the (frozen) name column: in view at once, however wide the other run columns are.
  const rest = t.columns.shown.filter((c) => !c.startsWith("config."));
  const at = rest.indexOf("name");
  const cut = at < 0 ? 0 : at + 1;
  return [...rest.slice(0, cut), ...t.differing, ...rest.slice(cut)];
}

export async function setHidden(keys: string[], hidden: boolean): Promise<void> {
  if (!keys.length) return;
  try {
    const res = await api.hide(keys, hidden);
    store.hidden = new Set(res.hidden);
    if (hidden && !store.ui.showHidden) store.selectMany(keys, false);
    store.emit("runs", keys);
    await queryTable();
    toast(`${keys.length} run${keys.length === 1 ? "" : "s"} ${hidden ? "hidden" : "shown again"}`);
  } catch (err) {
    toast(errorText(err), "error");
  }
}

// -- exports ----------------------------------------------------------------------------------------

export interface ExportNotice {
  what: string;
  res: ExportResponse;
}

let exportListener: ((n: ExportNotice) => void) | null = null;

export function onExport(fn: (n: ExportNotice) => void): void {
  exportListener = fn;
}

/** Run an export and show its bar; resolves to the error text when it failed (also toasted), else null. */
export async function runExport(what: string, call: () => Promise<ExportResponse>): Promise<string | null> {
  try {
    const res = await call();
    exportListener?.({ what, res });
    return null;
  } catch (err) {
    const text = errorText(err);
    toast(text, "error");
    return text;
  }
}

export function exportTable(): Promise<string | null> {
  const keys = tableOrder();
  if (!keys.length) {
    // An empty table is not exported: latest.csv keeps the last export that had rows.
    const text = "Nothing to export: the table shows no runs (latest.csv is left as it was).";
    toast(text, "error");
    return Promise.resolve(text);
  }
  return runExport(`Table CSV (${keys.length} run${keys.length === 1 ? "" : "s"})`, () => api.exportTable(keys, shownColumns()));
}

// -- remembered view --------------------------------------------------------------------------------

let saveEnabled = false;

const saveNow = debounce(() => {
  api.putUiState(store.ui).catch((err: unknown) => console.warn("ui-state not saved:", errorText(err)));
}, 600);

export async function loadUiState(): Promise<Record<string, unknown>> {
  try {
    return await api.getUiState();
  } catch (err) {
    console.warn("ui-state not loaded:", errorText(err));
    return {};
  }
}

/** Save the view whenever it changes from now on; `now`: also save the view shown now. */
export function enableSaving(now = false): void {
  saveEnabled = true;
  if (now) saveNow();
  store.on("ui", () => {
    if (saveEnabled) saveNow();
  });
}

// -- the view from the URL (Back/Forward, an edited hash) -------------------------------------------

/**
 * Show the view `next` (from the URL hash): the table is asked again only when its question
 * changed; the selection, the view and every view's controls follow. Saved as the remembered view.
 */
export function restoreUi(next: UiState): void {
  const before = store.ui;
  const question = (differing: boolean) => JSON.stringify([tableQuestion(currentTableQuery()), differing]);
  const asked = question(before.differing);
  store.ui = { ...next, selection: before.selection };
  if (JSON.stringify(next.selection) !== JSON.stringify(before.selection)) {
    store.restoring = true;
    try {
      store.setSelection(store.selectable(next.selection));
    } finally {
      store.restoring = false;
    }
  }
  if (question(next.differing) !== asked) void queryTable();
  store.emit("restored");
  if (next.view !== before.view) store.emit("view");
  store.emit("ui", "restored");
}
