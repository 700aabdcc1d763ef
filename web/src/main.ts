// Entry point: load the remembered view and the runs, build the shell, then go live. index.html
// preloads GET /api/ui-state, GET /api/runs?since=0 and the table as the remembered view asks for it
// (GET /api/table?remembered=1), so all three download while this script loads; the table is asked
// again only when the remembered view turns out to ask another question.

import "./styles/app.css";
import { enableSaving, loadRuns, loadUiState, queryFirstTable, restoreUi } from "./actions";
import { discardEarly } from "./api";
import { openingUi, syncHash } from "./hash";
import { h, replace } from "./dom";
import { connectLive } from "./live";
import { Shell } from "./shell";
import { prefetchPerformance } from "./perfAnswers";
import { parseUiState, store } from "./store";
import { errorText, toast } from "./ui";
import { ChartsView } from "./views/charts";
import { CompareView } from "./views/compare";
import { loadUPlot } from "./views/lineChart";
import { Inspector } from "./views/inspector";
import { OverviewView } from "./views/overview";
import { MAX_PERF_RUNS, PerformanceView } from "./views/performance";
import { RunsView } from "./views/runs";

async function boot(): Promise<void> {
  const host = document.getElementById("app");
  if (!host) return;
  const remembered = await loadUiState();
  // A view in the URL (a bookmark, a shared link) wins over the remembered one; a reload does not.
  const linked = openingUi();
  store.ui = linked ?? parseUiState(remembered);
  prefetchPerformance(store.ui, MAX_PERF_RUNS);
  discardEarly(); // (what the prefetch did not take was sent for another view than this one opens)
  const table = queryFirstTable();
  const runs = loadRuns(true);
  // The Runs view is drawn once the first table answer (which brings the rows of its first screen)
  // is here, while the runs stream in; the other views draw from every run, so a page opening on
  // one waits for the whole listing (issue 16: 100,000 runs). A listing that fails first is the
  // page's error.
  const early = store.ui.view === "runs";
  try {
    await Promise.race([early ? table : runs, runs]);
  } catch (err) {
    replace(
      host,
      h(
        "div",
        { class: "boot boot-error", testid: "boot-error" },
        h("div", { class: "empty-title", text: "TraceML could not load the runs" }),
        h("div", { class: "empty-hint", text: errorText(err) }),
      ),
    );
    return;
  }
  store.setSelection(store.selectable(store.ui.selection));
  const shell = new Shell(host, {
    overview: new OverviewView(),
    runs: new RunsView(),
    charts: new ChartsView(),
    compare: new CompareView(),
    performance: new PerformanceView(),
  });
  new Inspector(shell.inspectorHost);
  await table;
  shell.renderCounts();
  shell.showView(store.ui.view);
  // A view opened from a link becomes the remembered one, as any view shown later does (review 16b:
  // after `#v=runs` a plain open still showed the Charts plotted before).
  enableSaving(linked !== null);
  if (early) runs.catch((err: unknown) => toast(`The runs did not all load: ${errorText(err)}`, "error"));
  const onUiChange = syncHash(() => store.ui, restoreUi);
  store.on("ui", onUiChange);
  connectLive();
  // The other views are built, and the chart library loaded, once the first view is on screen
  // (after the next frame).
  requestAnimationFrame(() =>
    window.setTimeout(() => {
      shell.mountAll();
      void loadUPlot();
    }, 0),
  );
}

void boot();
