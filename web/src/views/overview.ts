// Overview: status counts, active runs with their heartbeat age, recent runs, discovery problems.

import { queryTable } from "../actions";
import { h, replace } from "../dom";
import { ageSeconds, fmtAgo, fmtDuration, fmtNum, fmtTime } from "../format";
import { icon } from "../icons";
import type { ViewModule } from "../shell";
import { type StatusSegment, store } from "../store";
import type { RunRow } from "../types";
import { emptyState, statusBadge, statusClass } from "../ui";

const CARDS: { status: StatusSegment; label: string; match: string[] }[] = [
  { status: "running", label: "Running", match: ["running", "running?"] },
  { status: "stale", label: "Stale", match: ["stale"] },
  { status: "completed", label: "Completed", match: ["completed"] },
  { status: "failed", label: "Failed", match: ["failed"] },
  { status: "killed", label: "Killed", match: ["killed"] },
  { status: "legacy", label: "Legacy", match: ["legacy"] },
];

/**
 * ISO-8601 UTC times in text order (which is time order); a missing one first. Plain comparison,
 * not localeCompare, which builds an ICU collator on first use and compares far slower.
 */
function byText(a: string | null, b: string | null): number {
  const x = a ?? "";
  const y = b ?? "";
  return x < y ? -1 : x > y ? 1 : 0;
}

/** The headline metric of a run: best val/auc, else the first best, else the last val/loss. */
function headline(run: RunRow): string {
  const pick = run.best["val/auc"] ? "val/auc" : Object.keys(run.best)[0];
  if (pick) {
    const v = run.best[pick]?.value;
    if (v !== null && v !== undefined) return `best ${pick} ${fmtNum(v)}`;
  }
  for (const m of ["val/loss", "train/loss"]) {
    const v = run.last[m];
    if (typeof v === "number") return `${m} ${fmtNum(v)}`;
  }
  return "";
}

export class OverviewView implements ViewModule {
  private host!: HTMLElement;
  private visible = false;
  private timer: number | undefined;

  mount(host: HTMLElement): void {
    this.host = h("div", { class: "overview", testid: "overview" });
    host.appendChild(this.host);
    store.on("runs", () => {
      if (this.visible) this.render();
    });
  }

  show(): void {
    this.visible = true;
    this.render();
    // Heartbeat ages move on by themselves.
    this.timer = window.setInterval(() => this.render(), 5000);
  }

  hide(): void {
    this.visible = false;
    window.clearInterval(this.timer);
  }

  private render(): void {
    const runs = store.visibleRuns();
    if (!runs.length) {
      replace(
        this.host,
        emptyState(
          "No runs yet",
          "TraceML lists every run folder in the roots on the left. Start a training script that logs with traceml_ai.Run, or try `traceml fake-runs`.",
        ),
      );
      return;
    }
    const cards = h("div", { class: "stat-cards" });
    for (const c of CARDS) {
      const n = runs.filter((r) => c.match.includes(r.display_status)).length;
      const card = h(
        "button",
        { type: "button", class: `stat-card status-${c.status}${n ? "" : " is-zero"}`, testid: `overview-status-${c.status}` },
        h("span", { class: "stat-label" }, h("span", { class: "badge-dot" }), c.label),
        h("span", { class: "stat-n", text: String(n) }),
      );
      card.addEventListener("click", () => {
        store.set("status", c.status);
        store.setView("runs");
        void queryTable();
      });
      cards.appendChild(card);
    }
    const total = h(
      "div",
      { class: "stat-card stat-total" },
      h("span", { class: "stat-label", text: "All runs" }),
      h("span", { class: "stat-n", text: String(runs.length) }),
    );
    cards.prepend(total);

    const active = runs
      .filter((r) => ["running", "running?", "stale"].includes(r.display_status))
      .sort((a, b) => (ageSeconds(a.heartbeat_at) ?? 1e12) - (ageSeconds(b.heartbeat_at) ?? 1e12));
    const recent = [...runs].sort((a, b) => byText(b.started_at, a.started_at)).slice(0, 12);
    const failed = runs
      .filter((r) => r.display_status === "failed")
      .sort((a, b) => byText(b.ended_at, a.ended_at))
      .slice(0, 6);

    const activeList = active.length
      ? h("div", { class: "run-list", testid: "active-runs" }, ...active.map((r) => this.activeRow(r)))
      : h("div", { class: "panel-empty", text: "Nothing is training right now." });
    const recentList = h("div", { class: "run-list", testid: "recent-runs" }, ...recent.map((r) => this.recentRow(r)));

    const problems = store.warnings.length
      ? h(
          "section",
          { class: "panel panel-warn", testid: "discovery-warnings" },
          h("h2", { class: "panel-title" }, icon("warning"), `Discovery problems (${store.warnings.length})`),
          h("ul", { class: "warn-list" }, ...store.warnings.map((w) => h("li", { text: w }))),
        )
      : null;

    replace(
      this.host,
      cards,
      h(
        "div",
        { class: "overview-grid" },
        h(
          "div",
          { class: "overview-col" },
          h("section", { class: "panel" }, h("h2", { class: "panel-title", text: `Active runs (${active.length})` }), activeList),
          failed.length
          ? h(
              "section",
              { class: "panel" },
              h("h2", { class: "panel-title", text: "Recent failures" }),
              h("div", { class: "run-list", testid: "failed-runs" }, ...failed.map((r) => this.failedRow(r))),
            )
          : null,
          problems,
        ),
        h("section", { class: "panel" }, h("h2", { class: "panel-title", text: "Recent runs" }), recentList),
      ),
    );
  }

  private open(row: HTMLElement, run: RunRow): HTMLElement {
    row.addEventListener("click", () => store.openInspector(run.key));
    row.setAttribute("data-key", run.key);
    return row;
  }

  private activeRow(r: RunRow): HTMLElement {
    const age = ageSeconds(r.heartbeat_at);
    const late = age !== null && age > store.staleAfter;
    return this.open(
      h(
        "button",
        { type: "button", class: `run-item status-${statusClass(r.display_status)}`, testid: "active-run" },
        h(
          "span",
          { class: "run-item-main" },
          h("span", { class: "run-item-name", text: r.name || r.id }),
          h("span", { class: "run-item-sub", text: [r.group, r.step !== null ? `step ${r.step}` : null, headline(r)].filter(Boolean).join(" · ") }),
        ),
        h(
          "span",
          { class: `heartbeat${late ? " is-late" : ""}`, title: r.heartbeat_at ?? "no heartbeat", testid: "heartbeat-age" },
          icon("refresh"),
          r.heartbeat_at ? fmtAgo(r.heartbeat_at) : "no heartbeat",
        ),
        statusBadge(r.display_status),
      ),
      r,
    );
  }

  private recentRow(r: RunRow): HTMLElement {
    return this.open(
      h(
        "button",
        { type: "button", class: "run-item", testid: "recent-run" },
        h(
          "span",
          { class: "run-item-main" },
          h("span", { class: "run-item-name", text: r.name || r.id }),
          h(
            "span",
            { class: "run-item-sub", text: [fmtTime(r.started_at), fmtDuration(r.duration_s), headline(r)].filter(Boolean).join(" · ") },
          ),
        ),
        r.warnings.length ? h("span", { class: "file-problem", title: r.warnings.join("\n") }, icon("warning")) : null,
        statusBadge(r.display_status),
      ),
      r,
    );
  }

  private failedRow(r: RunRow): HTMLElement {
    const e = r.error;
    const msg = e ? [e.type, e.message].filter(Boolean).join(": ") : "";
    return this.open(
      h(
        "button",
        { type: "button", class: "run-item", testid: "failed-run" },
        h(
          "span",
          { class: "run-item-main" },
          h("span", { class: "run-item-name", text: r.name || r.id }),
          h("span", { class: "run-item-sub run-item-error", text: msg || "failed", title: msg }),
        ),
        h("span", { class: "run-item-when", text: fmtAgo(r.ended_at) }),
      ),
      r,
    );
  }
}
