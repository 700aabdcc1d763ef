// Compare: the selected runs side by side (run info, params, best/last metrics, summary), rows whose
// values differ marked, with an only-differences toggle.

import { columnTitle, fmtPerf, PERF_TITLES, perfMissingReason, runLabels } from "../columns";
import { h, replace } from "../dom";
import { fmtDuration, fmtNum, fmtTime, rawText } from "../format";
import type { ViewModule } from "../shell";
import { store } from "../store";
import type { RunRow, Scalar } from "../types";
import { button, emptyState, paletteColor, statusBadge, swatch, toggle } from "../ui";

interface Section {
  title: string;
  rows: { label: string; values: Scalar[]; display?: (v: Scalar, run: RunRow) => Node | string }[];
}

/** True when the texts shown differ (a missing value is never the same as a shown one). */
function differs(texts: (string | null)[]): boolean {
  return new Set(texts.map((t) => (t === null ? "\u0000" : t))).size > 1;
}

function rawDiffers(values: Scalar[]): boolean {
  return differs(values.map((v) => (v === null || v === undefined ? null : rawText(v))));
}

function textOf(c: Node | string): string {
  return typeof c === "string" ? c : (c.textContent ?? "");
}

export class CompareView implements ViewModule {
  private host!: HTMLElement;
  private visible = false;

  mount(host: HTMLElement): void {
    this.host = h("div", { class: "compare", testid: "compare" });
    host.appendChild(this.host);
    const again = () => {
      if (this.visible) this.render();
    };
    store.on("runs", again);
    store.on("selection", again);
    store.on("restored", again);
  }

  show(): void {
    this.visible = true;
    this.render();
  }

  hide(): void {
    this.visible = false;
  }

  private render(): void {
    const runs = store.ui.selection.map((k) => store.runs.get(k)).filter((r): r is RunRow => !!r);
    if (runs.length < 2) {
      replace(
        this.host,
        emptyState(
          "Select two or more runs to compare",
          "Tick runs in the Runs table (or a whole group), then come back here.",
          button("Go to Runs", { kind: "primary", onClick: () => store.setView("runs") }),
          "compare-empty",
        ),
      );
      return;
    }
    const sections = this.sections(runs);
    const labels = runLabels(runs);
    const onlyDiff = store.ui.compareOnlyDiff;
    let diffCount = 0;
    const table = h("table", { class: "compare-table", testid: "compare-table" });
    const head = h(
      "tr",
      {},
      h("th", { class: "compare-corner", text: `${runs.length} runs` }),
      ...runs.map((r) => {
        const th = h(
          "th",
          { class: "compare-run", title: r.id },
          h("span", { class: "compare-run-name" }, swatch(paletteColor(store.colorOf(r.key))), h("span", { testid: "compare-run-name", text: labels.get(r.key) ?? r.name })),
          statusBadge(r.display_status),
        );
        th.addEventListener("click", () => store.openInspector(r.key));
        return th;
      }),
    );
    table.appendChild(h("thead", {}, head));
    const body = h("tbody");
    for (const sec of sections) {
      const rows: HTMLElement[] = [];
      for (const row of sec.rows) {
        // "Differs" is about what the row shows: runs started the same minute, or durations of
        // one rounded second, read alike and are not marked. A plain value that the short format
        // would show alike (lr 1.00001e-4 and 1e-4) is shown in full instead, so it reads different.
        let contents = row.values.map((v, i) => (row.display ? row.display(v, runs[i]!) : this.display(v)));
        let diff = differs(contents.map((c, i) => (row.values[i] === null || row.values[i] === undefined ? null : textOf(c))));
        if (!diff && !row.display && rawDiffers(row.values)) {
          contents = row.values.map((v) => (v === null || v === undefined ? this.display(v) : rawText(v)));
          diff = true;
        }
        if (diff) diffCount++;
        if (onlyDiff && !diff) continue;
        rows.push(
          h(
            "tr",
            { class: diff ? "is-diff" : "", testid: "compare-row", data: { diff: diff ? "1" : "0" } },
            h("td", { class: "compare-key", title: row.label }, diff ? h("span", { class: "diff-mark", title: "values differ" }) : null, row.label),
            ...row.values.map((v, i) => h("td", { class: typeof v === "number" ? "num" : "", title: rawText(v) }, contents[i]!)),
          ),
        );
      }
      if (!rows.length) continue;
      body.appendChild(h("tr", { class: "compare-section" }, h("td", { attrs: { colspan: runs.length + 1 }, text: sec.title })));
      for (const r of rows) body.appendChild(r);
    }
    table.appendChild(body);
    const bar = h(
      "div",
      { class: "toolbar" },
      toggle(
        "Only differences",
        onlyDiff,
        (on) => {
          store.set("compareOnlyDiff", on);
          this.render();
        },
        "compare-only-diff",
      ),
      h("span", { class: "toolbar-info", testid: "compare-diff-count", text: `${diffCount} differing row${diffCount === 1 ? "" : "s"}` }),
    );
    replace(this.host, bar, h("div", { class: "compare-scroll" }, table));
  }

  private display(v: Scalar): Node | string {
    if (v === null || v === undefined) return h("span", { class: "cell-null", text: "–" });
    if (typeof v === "number") return fmtNum(v);
    return rawText(v);
  }

  private sections(runs: RunRow[]): Section[] {
    const keysOf = (pick: (r: RunRow) => Record<string, unknown>) => [...new Set(runs.flatMap((r) => Object.keys(pick(r))))].sort();
    const info: Section = {
      title: "Run",
      rows: [
        { label: "status", values: runs.map((r) => r.display_status) },
        { label: "group", values: runs.map((r) => r.group) },
        { label: "tags", values: runs.map((r) => r.tags.join(", ") || null) },
        {
          label: "started",
          values: runs.map((r) => r.started_at),
          display: (v) => (v ? fmtTime(String(v)) : this.display(null)),
        },
        { label: "duration", values: runs.map((r) => r.duration_s), display: (v) => (typeof v === "number" ? fmtDuration(v) : this.display(null)) },
        { label: "step", values: runs.map((r) => r.step) },
        { label: "epoch", values: runs.map((r) => r.epoch) },
        {
          label: "error",
          values: runs.map((r) => (r.error ? [r.error.type, r.error.message].filter(Boolean).join(": ") || "error" : null)),
        },
      ],
    };
    // Params in the order the runs' params.yaml lists them (as the table's default columns take
    // them), not by name: a sweep's own grouping of its settings stays.
    const paramKeys = [...new Set(runs.flatMap((r) => Object.keys(r.params)))];
    const params: Section = {
      title: "Params",
      rows: paramKeys.map((k) => ({ label: k, values: runs.map((r) => r.params[k] ?? null) })),
    };
    const best: Section = {
      title: "Best",
      rows: keysOf((r) => r.best).map((k) => ({ label: k, values: runs.map((r) => r.best[k]?.value ?? null) })),
    };
    const last: Section = {
      title: "Last",
      rows: keysOf((r) => r.last).map((k) => ({ label: k, values: runs.map((r) => r.last[k] ?? null) })),
    };
    const summary: Section = {
      title: "Summary",
      rows: keysOf((r) => r.summary).map((k) => ({ label: k, values: runs.map((r) => r.summary[k] ?? null) })),
    };
    // In the chooser's order (verdict, step time, shares, ...), not alphabetically.
    const order = Object.keys(PERF_TITLES);
    const rank = (k: string) => (order.includes(k) ? order.indexOf(k) : order.length);
    const perfKeys = keysOf((r) => r.perf ?? {}).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    const perf: Section = {
      title: "Performance",
      rows: perfKeys.map((k) => ({
        label: columnTitle(`perf.${k}`),
        values: runs.map((r) => r.perf?.[k] ?? null),
        display: (v: Scalar, run: RunRow) => {
          if (typeof v === "number") return fmtPerf(`perf.${k}`, v);
          const why = v === null ? perfMissingReason(run, `perf.${k}`) : null;
          return why ? h("span", { class: "cell-null", text: "–", title: why, testid: "compare-perf-missing" }) : this.display(v);
        },
      })),
    };
    return [info, params, best, last, summary, perf];
  }
}
