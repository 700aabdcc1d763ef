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
const inFlight = new Map<string, Promise<PerformancePage>>();
/** Runs whose kept answer changed (a fetch brought a new stamp), in order: listeners redraw them. */
type Listener = (key: string, answer: PerformancePage) => void;
const listeners: Listener[] = [];
const MAX_KEPT = 16;

store.on("runs", (changed) => {
  if (!Array.isArray(changed)) return;
  for (const key of changed as string[]) {
    const k = kept.get(key);
    if (k) k.stale = true;
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
  if (pending) return pending;
  const p = api.performancePage(key).then(
    (answer) => {
      inFlight.delete(key);
      const before = kept.get(key);
      // The same stamp: the same files, so the same answer: keep the object (views skip a redraw).
      const same = before && before.answer.stamp === answer.stamp && !answer.live;
      const value = same ? before.answer : answer;
      kept.delete(key);
      kept.set(key, { answer: value, stale: false });
      while (kept.size > MAX_KEPT) kept.delete(kept.keys().next().value as string);
      if (!same) for (const fn of listeners) fn(key, value);
      return value;
    },
    (err: unknown) => {
      inFlight.delete(key);
      throw err;
    },
  );
  inFlight.set(key, p);
  return p;
}
