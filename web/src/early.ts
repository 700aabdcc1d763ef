// Runs while the page's HTML is parsed, before the app's script (400 KB: about a tenth of a second
// to load and start): a page opened on a Performance view's address (`#v=performance&pr=<key>`, a
// link, a bookmark, a reload) asks for that run's answer at once, so the server builds it while the
// app loads (issue 13 item 5). The app takes the request over (`takeEarly` in api.ts) instead of
// sending its own. The index.html preloads do the same for the runs, the view and the table.

(() => {
  const params = new URLSearchParams(location.hash.slice(1));
  const key = params.get("pr");
  if (params.get("v") !== "performance" || !key) return;
  const path = `/api/runs/${encodeURIComponent(key)}/performance-page`;
  const early: Record<string, Promise<Response>> = {};
  early[path] = fetch(path, { method: "GET", credentials: "same-origin" });
  (window as unknown as { __tracemlEarly?: Record<string, Promise<Response>> }).__tracemlEarly = early;
})();
