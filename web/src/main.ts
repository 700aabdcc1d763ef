// Entry point: load the remembered view and the runs, build the shell, then go live.

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
  try {
    await loadRuns(true);
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
  await queryTable();
  shell.renderCounts();
  shell.showView(store.ui.view);
  enableSaving();
  connectLive();
}

void boot();
