// The Performance page's answers (GET /api/runs/<key>/performance-page: the telemetry answer and the
// per-rank answer of one run, built by the server from one read), kept per run for the page's life.
// The inspector and the Performance view share them: opening a run's inspector fetches what its
// Performance view draws, and reopening the view (or the inspector) shows the kept answer with no
// request and no redraw. A kept answer is used until the server says the run changed (its key in a
// "runs" event: a live run's telemetry grew, its final summary arrived, Refresh found a change); the
// answer shown meanwhile stays on screen until the new one arrives (issue 13 item 5).

import { api } from "./api";
import { store } from "./store";
import type { PerformancePage } from "./types";

interface Kept {
  answer: PerformancePage;
  /** The server said the run changed since: fetch again before trusting it. */
  stale: boolean;
}

const kept = new Map<string, Kept>();
/** The request under way per run, with the number of changes the server had said when it was sent. */
const inFlight = new Map<string, { promise: Promise<PerformancePage>; changes: number }>();
/** How many times the server said each kept (or asked-for) run changed: a change said while its
 * request was under way may be newer than the answer that request brings. */
const changes = new Map<string, number>();
const changesOf = (key: string): number => changes.get(key) ?? 0;
/** Runs whose kept answer changed (a fetch brought a new stamp), in order: listeners redraw them. */
type Listener = (key: string, answer: PerformancePage) => void;
const listeners: Listener[] = [];
const MAX_KEPT = 16;

/** Whether the page has taken its first listing of the runs. */
let listed = false;

store.on("runs", (changed) => {
  if (!Array.isArray(changed)) return;
  // The page's first listing names every run, but none changed since the page asked for its
  // answers: counted, it sent the prefetch of a view opened from its address a second time once the
  // first answer came (a second download and parse of it, ~0.1 s of the cold open, issue 13 item 5).
  const first = !listed;
  listed = true;
  if (first) return;
  for (const key of changed as string[]) {
    const k = kept.get(key);
    if (k) k.stale = true;
    if (k || inFlight.has(key)) changes.set(key, changesOf(key) + 1);
  }
});

/** The kept answer of run `key` (possibly stale), or undefined. */
export function keptAnswer(key: string): PerformancePage | undefined {
  return kept.get(key)?.answer;
}

/** True when run `key` has a kept answer the server has not said changed. */
export function isFresh(key: string): boolean {
  const k = kept.get(key);
  return !!k && !k.stale;
}

/** Call `fn` whenever a fetch brings run `key` a new answer. */
export function onAnswer(fn: Listener): void {
  listeners.push(fn);
}

/**
 * The answer of run `key`: the kept one when the run has not changed since (no request), else a
 * fetch (one at a time per run: a second caller gets the same promise). `force`: fetch even so.
 */
export function perfAnswer(key: string, force = false): Promise<PerformancePage> {
  const k = kept.get(key);
  if (k && !k.stale && !force) return Promise.resolve(k.answer);
  const pending = inFlight.get(key);
  if (pending) {
    if (pending.changes === changesOf(key)) return pending.promise;
    // The run changed after that request was sent (e.g. it ended while its answer was built): that
    // answer may say what was before, so ask again once it is back.
    const again = () => perfAnswer(key);
    return pending.promise.then(again, again);
  }
  const sent = changesOf(key);
  const p = api.performancePage(key).then(
    (answer) => {
      inFlight.delete(key);
      const before = kept.get(key);
      // The same stamp and both finished: the same files, so the same answer: keep the object
      // (views skip a redraw). A run that stopped being live has the same files but a new answer.
      const same = before && before.answer.stamp === answer.stamp && !answer.live && !before.answer.live;
      const value = same ? before.answer : answer;
      kept.delete(key);
      // Still stale when the server said the run changed while this request was under way.
      kept.set(key, { answer: value, stale: changesOf(key) !== sent });
      while (kept.size > MAX_KEPT) {
        const old = kept.keys().next().value as string;
        kept.delete(old);
        if (!inFlight.has(old)) changes.delete(old);
      }
      if (!same) for (const fn of listeners) fn(key, value);
      return value;
    },
    (err: unknown) => {
      inFlight.delete(key);
      throw err;
    },
  );
  inFlight.set(key, { promise: p, changes: sent });
  return p;
}

/**
 * Ask early for the answers a Performance view opened from its address (or remembered) will draw,
 * while the page still loads the runs and the table: the server builds them meanwhile, and the view
 * then finds them in flight or kept. The same runs as the view shows (its focus run, else the
 * selection, at most `max`); a key that is no captured run just gets its error, unused.
 */
export function prefetchPerformance(ui: { view: string; selection: string[]; perfRun: string | null }, max: number): void {
  if (ui.view !== "performance") return;
  const focus = ui.perfRun;
  const keys = ui.selection.length && (!focus || ui.selection.includes(focus)) ? ui.selection.slice(0, max) : focus ? [focus] : [];
  for (const key of keys) perfAnswer(key).catch(() => undefined);
}
