// The view in the URL hash: view, selection, search, filters, status, sort, group, columns, toggles
// and chart settings, so Back/Forward move between views and a bookmark or a shared link opens the
// same view. Only settings that differ from the defaults are written (short URLs). The token never
// appears: the server takes it out of the address on the first visit (an HttpOnly cookie holds it),
// and the hash holds view settings only.
//
// A change of view or chart kind adds a history entry, and so does a change of the table's question
// (search, filters, status, sort, group, differing params, hidden runs, max rows: the settings
// `ENTRY_KEYS` names), so Back after a sort or a filter shows the table as it was before it, not
// the site before the app. Every other change (selection, columns, chart settings) replaces the
// current entry. A hash that is not ours (or empty) leaves the remembered view as it is; a view
// opened from a link becomes the remembered one (main.ts).

import { debounce } from "./dom";
import { defaultUiState, parseUiState, store, type UiState } from "./store";

const MARK = "v";
/** The settings whose change adds a history entry (besides the view and the chart kind). */
const ENTRY_KEYS: ReadonlySet<unknown> = new Set(["search", "filters", "status", "sort", "group", "differing", "showHidden", "maxRows"]);
const MAX_URL_SELECTION = 200;
/** sessionStorage key: the hash this tab wrote last (to tell a reload from an opened link). */
const WRITTEN = "traceml.hash";

/**
 * The view of the address the page opened with, or null to use the remembered one. A link, a
 * bookmark or an edited hash wins; a reload of this tab (the hash it wrote itself) does not, so
 * the remembered view, which another tab may have changed since, is shown as before.
 */
export function openingUi(): UiState | null {
  const hash = window.location.hash;
  let written: string | null = null;
  try {
    written = window.sessionStorage.getItem(WRITTEN);
  } catch {
    written = null; // storage refused: treat the hash as a link
  }
  return hash && hash !== written ? hashToUi(hash) : null;
}

/** `#…` for a view (the defaults left out). */
export function uiToHash(ui: UiState): string {
  const d = defaultUiState();
  const p = new URLSearchParams();
  p.set(MARK, ui.view);
  // A very large selection stays out of the address (a URL of megabytes helps nobody): "sx"
  // says the selection is not in it, and Back/Forward then keep the page's own.
  if (ui.selection.length <= MAX_URL_SELECTION) for (const k of ui.selection) p.append("s", k);
  else p.set("sx", String(ui.selection.length));
  if (ui.search) p.set("q", ui.search);
  for (const f of ui.filters) p.append("f", `${f.column}:${f.expr}`);
  if (ui.status !== d.status) p.set("st", ui.status);
  for (const s of ui.sort) p.append("o", s);
  if (ui.group !== null) p.set("g", ui.group);
  if (ui.columns !== null) ui.columns.length ? ui.columns.forEach((c) => p.append("c", c)) : p.set("c", "");
  if (ui.differing) p.set("d", "1");
  if (ui.showHidden) p.set("h", "1");
  if (ui.metrics !== null) ui.metrics.length ? ui.metrics.forEach((m) => p.append("m", m)) : p.set("m", "");
  if (ui.x !== d.x) p.set("x", ui.x);
  if (ui.ema !== d.ema) p.set("ema", String(ui.ema));
  if (ui.logY) p.set("ly", "1");
  if (ui.colorBy !== null) p.set("cb", ui.colorBy);
  if (ui.chart !== d.chart) p.set("k", ui.chart);
  const json = (key: string, v: object, dv: object) => {
    if (JSON.stringify(v) !== JSON.stringify(dv)) p.set(key, JSON.stringify(v));
  };
  json("sc", ui.scatter, d.scatter);
  json("bx", ui.box, d.box);
  json("br", ui.bar, d.bar);
  if (ui.compareOnlyDiff) p.set("cd", "1");
  if (ui.maxRows !== null) p.set("n", String(ui.maxRows));
  if (ui.plotGroups) p.set("pg", "1");
  if (ui.band !== d.band) p.set("band", ui.band);
  if (ui.perfRun !== null) p.set("pr", ui.perfRun);
  json("pz", ui.perfZoom, d.perfZoom);
  if (ui.perfMode !== d.perfMode) p.set("pm", ui.perfMode);
  return `#${p.toString()}`;
}

/** The view a hash describes (validated like a remembered view), or null when it holds none. */
export function hashToUi(hash: string): UiState | null {
  const p = new URLSearchParams(hash.replace(/^#/, ""));
  if (!p.has(MARK)) return null;
  const list = (key: string): string[] | null => (p.has(key) ? p.getAll(key).filter((v) => v !== "") : null);
  const obj = (key: string): unknown => {
    try {
      return JSON.parse(p.get(key) ?? "null");
    } catch {
      return null;
    }
  };
  const raw: Record<string, unknown> = {
    view: p.get(MARK),
    selection: p.has("sx") ? store.ui.selection : p.getAll("s"),
    search: p.get("q") ?? "",
    filters: p.getAll("f").flatMap((f) => {
      const at = f.indexOf(":");
      return at > 0 ? [{ column: f.slice(0, at), expr: f.slice(at + 1) }] : [];
    }),
    status: p.get("st") ?? undefined,
    sort: p.getAll("o"),
    group: p.get("g"),
    columns: list("c"),
    differing: p.get("d") === "1",
    showHidden: p.get("h") === "1",
    metrics: list("m"),
    x: p.get("x") ?? undefined,
    ema: p.has("ema") ? Number(p.get("ema")) : 0,
    logY: p.get("ly") === "1",
    colorBy: p.get("cb"),
    chart: p.get("k") ?? undefined,
    scatter: obj("sc") ?? undefined,
    box: obj("bx") ?? undefined,
    bar: obj("br") ?? undefined,
    compareOnlyDiff: p.get("cd") === "1",
    maxRows: p.has("n") ? Number(p.get("n")) : null,
    plotGroups: p.get("pg") === "1",
    band: p.get("band") ?? undefined,
    perfRun: p.get("pr"),
    perfZoom: obj("pz") ?? undefined,
    perfMode: p.get("pm") ?? undefined,
  };
  return parseUiState(raw);
}

/**
 * Keep the hash in step with the page: `read()` gives the current view, `onChange` is wired to the
 * store's "ui" events by the caller; `apply` is called with the view of a Back/Forward (or an edited
 * hash). Returns the function to call on each settings change (`key` = the setting).
 */
export function syncHash(read: () => UiState, apply: (ui: UiState) => void): (key: unknown) => void {
  let applying = false;
  // The view and chart kind of the history entry shown now: a new entry keeps, in the one it
  // leaves, the settings changed there just before (a replacement still waiting to be written).
  let entry = { view: read().view, chart: read().chart };
  const url = (hash: string) => `${window.location.pathname}${window.location.search}${hash}`;
  // A change of the table's question waiting to be written (debounced: typing a search makes one
  // entry, not one per pause).
  let entryPending = false;
  const write = (mode: "replace" | "view") => {
    const ui = read();
    const hash = uiToHash(ui);
    const pending = entryPending;
    entryPending = false;
    try {
      window.sessionStorage.setItem(WRITTEN, hash);
    } catch {
      // no storage: a reload then opens the view of the address
    }
    if (hash === window.location.hash) return;
    if (mode === "view" && (ui.view !== entry.view || ui.chart !== entry.chart)) {
      // The entry left keeps what was changed there just before; a table change still waiting
      // becomes an entry of its own, so Back goes to it and then to the table before it.
      const left = url(uiToHash({ ...ui, ...entry }));
      if (pending) history.pushState(null, "", left);
      else history.replaceState(null, "", left);
      history.pushState(null, "", url(hash));
    } else if (pending) history.pushState(null, "", url(hash));
    else history.replaceState(null, "", url(hash));
    entry = { view: ui.view, chart: ui.chart };
  };
  const writeSoon = debounce(() => write("replace"), 150);
  const onPop = () => {
    const ui = hashToUi(window.location.hash);
    if (!ui) return;
    entry = { view: ui.view, chart: ui.chart };
    entryPending = false; // the entry shown now is the one Back/Forward chose
    applying = true;
    try {
      apply(ui);
    } finally {
      applying = false;
    }
  };
  window.addEventListener("popstate", onPop);
  window.addEventListener("hashchange", onPop);
  write("replace");
  return (key: unknown) => {
    if (applying) return;
    if (key === "view" || key === "chart") write("view");
    else {
      if (ENTRY_KEYS.has(key)) entryPending = true;
      writeSoon();
    }
  };
}
