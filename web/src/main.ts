// Entry point: load the remembered view and the runs, build the shell, then go live. index.html
// preloads GET /api/ui-state and GET /api/runs?since=0, so both download while this script loads;
// the table (which needs the remembered filters, sort and columns) is asked for before the runs are
// parsed, and the two answers overlap.

import "./styles/app.css";
import { enableSaving, loadRuns, loadUiState, queryTable } from "./actions";
import { h, replace } from "./dom";
import { connectLive } from "./live";
import { Shell } from "./shell";
import { parseUiState, store } from "./store";
import { errorText } from "./ui";
import { ChartsView } from "./views/charts";
import { CompareView } from "./views/compare";
import { Inspector } from "./views/inspector";
import { OverviewView } from "./views/overview";
import { RunsView } from "./views/runs";

async function boot(): Promise<void> {
  const host = document.getElementById("app");
  if (!host) return;
  const remembered = await loadUiState();
  store.ui = parseUiState(remembered);
  const table = queryTable();
  const runs = loadRuns(true);
  try {
    await runs;
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
  store.setSelection(store.ui.selection.filter((k) => store.runs.has(k)));
  const shell = new Shell(host, {
    overview: new OverviewView(),
    runs: new RunsView(),
    charts: new ChartsView(),
    compare: new CompareView(),
  });
  new Inspector(shell.inspectorHost);
  await table;
  shell.renderCounts();
  shell.showView(store.ui.view);
  enableSaving();
  connectLive();
}

void boot();
