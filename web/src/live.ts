// Live refresh: the server pushes `event: runs` over server-sent events when a poll changed
// something; the page then fetches only the changed runs (GET /api/runs?since=) and re-queries the
// table. Sort, filters, selection, zoom and column choices live in the store, so nothing is lost.

import { loadRuns } from "./actions";
import { store } from "./store";

export function connectLive(): void {
  let source: EventSource | null = null;
  let retry = 1000;

  // Why the stream closed: a 403 is a server that runs but no longer knows this page's token.
  const probe = async () => {
    let refused = false;
    try {
      const res = await fetch("/api/ui-state", { credentials: "same-origin", cache: "no-store" });
      refused = res.status === 403;
    } catch {
      refused = false; // no answer at all: the server is gone (or the network)
    }
    if (store.disconnected && refused !== store.tokenRefused) {
      store.tokenRefused = refused;
      store.emit("live");
    }
  };

  const open = () => {
    source = new EventSource("/api/events");
    source.addEventListener("open", () => {
      retry = 1000;
      store.live = true;
      store.disconnected = false;
      store.tokenRefused = false;
      store.emit("live");
      // Catch up on whatever changed while we were away.
      void loadRuns();
    });
    source.addEventListener("runs", (ev) => {
      let version: number | null = null;
      try {
        const data = JSON.parse((ev as MessageEvent<string>).data) as { version?: unknown; refreshed_at?: unknown };
        version = typeof data.version === "number" ? data.version : null;
        // Every poll sends one, changed or not: "Refreshed N s ago" counts from the last poll.
        if (typeof data.refreshed_at === "string") store.notePolled(data.refreshed_at);
      } catch {
        version = null;
      }
      if (version === null || version !== store.version) void loadRuns();
    });
    source.addEventListener("error", () => {
      // The server stopped (Ctrl+C of traceml ui) or cannot be reached: say so until it answers.
      store.live = false;
      store.disconnected = true;
      store.emit("live");
      if (source && source.readyState === EventSource.CLOSED) {
        // The browser gave up (e.g. a 403 or the server went away): try again later.
        source = null;
        void probe();
        window.setTimeout(open, retry);
        retry = Math.min(retry * 2, 30000);
      }
    });
  };
  open();
}
