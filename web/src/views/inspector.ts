// The run inspector (side panel): error callout, file problems, metrics, params, config tree, run
// info, and the six run files opened read-only (GET /api/file, shown as text).

import { api } from "../api";
import { isCaptured } from "../columns";
import { setHidden } from "../actions";
import { type Child, h, replace } from "../dom";
import { fmtAgo, fmtBytes, fmtDuration, fmtNum, fmtTime, rawText } from "../format";
import { icon } from "../icons";
import { store } from "../store";
import { attachmentsSection } from "./attachments";
import type { RunDetail, RunRow, Scalar } from "../types";
import { button, errorText, loading, modal, paletteColor, statusBadge, stickToEnd, swatch, toast } from "../ui";
import { openPerformance } from "./performance";
import { TelemetryPanel } from "./telemetry";

const FILES = ["run.json", "params.yaml", "config.json", "metrics.jsonl", "metrics.json", "aggregator/final_summary.json", "logs/run.log"];
const TRACEBACK_TAIL = 25;
/** Files read from their end (newest lines last): the viewer opens them scrolled to the end. */
const TAIL_FILES = /(\.log|\.jsonl)$/;

export class Inspector {
  private body = h("div", { class: "insp-body" });
  private head = h("div", { class: "insp-head" });
  private key: string | null = null;
  private seq = 0;
  private telemetry = new TelemetryPanel({ variant: "summary", openPage: (key) => openPerformance(key) });

  constructor(host: HTMLElement) {
    host.append(this.head, this.body);
    store.on("inspector", () => void this.load());
    store.on("runs", (changed) => {
      if (this.key && Array.isArray(changed) && changed.includes(this.key)) void this.load(true);
    });
    store.on("selection", () => {
      if (this.key) this.renderHead(store.runs.get(this.key) ?? null);
    });
    document.addEventListener("keydown", (ev) => {
      if (ev.key === "Escape" && this.key && !document.querySelector(".modal-backdrop, .popover")) store.openInspector(null);
    });
  }

  private async load(quiet = false): Promise<void> {
    const key = store.inspector;
    this.key = key;
    if (!key) return;
    const seq = ++this.seq;
    const run = store.runs.get(key) ?? null;
    this.renderHead(run);
    if (!quiet) loading(this.body);
    try {
      const detail = await api.run(key);
      if (seq !== this.seq) return;
      this.renderHead(detail.run);
      this.renderBody(detail);
      this.telemetry.show(key);
    } catch (err) {
      if (seq !== this.seq) return;
      replace(this.body, h("div", { class: "callout callout-error", text: errorText(err) }));
    }
  }

  private renderHead(run: RunRow | null): void {
    const close = button("", {
      icon: "close",
      kind: "ghost",
      title: "Close (Esc)",
      testid: "inspector-close",
      onClick: () => store.openInspector(null),
    });
    if (!run) {
      replace(this.head, h("div", { class: "insp-title", text: "Run" }), close);
      return;
    }
    const selected = store.isSelected(run.key);
    const hidden = store.hidden.has(run.key);
    const sel = button(selected ? "Selected" : "Select", {
      small: true,
      kind: selected ? "primary" : "default",
      testid: "inspector-select",
      title: "Add to or remove from the selection (charts, compare)",
      onClick: () => store.toggleSelected(run.key),
    });
    const hide = button(hidden ? "Unhide" : "Hide", {
      small: true,
      kind: "ghost",
      icon: hidden ? "eye" : "eyeOff",
      testid: "inspector-hide",
      title: hidden ? "Show this run again" : "Hide this run in TraceML (its folder stays untouched)",
      onClick: () => void setHidden([run.key], !hidden),
    });
    const perf = isCaptured(run)
      ? button("Performance", {
          small: true,
          kind: "ghost",
          icon: "performance",
          testid: "inspector-performance",
          title: "Open Performance view: this run's telemetry on a full page",
          onClick: () => openPerformance(run.key),
        })
      : null;
    replace(
      this.head,
      h(
        "div",
        { class: "insp-titles" },
        h(
          "div",
          { class: "insp-title" },
          selected ? swatch(paletteColor(store.colorOf(run.key))) : null,
          h("span", { class: "insp-name", testid: "inspector-name", text: run.name || run.id }),
          statusBadge(run.display_status),
        ),
        h("div", { class: "insp-id", text: run.id, title: run.path }),
      ),
      h("div", { class: "insp-actions" }, perf, sel, hide, close),
    );
  }

  private renderBody(d: RunDetail): void {
    const run = d.run;
    replace(
      this.body,
      this.errorCallout(d),
      this.problems(run),
      this.section("Metrics", this.metrics(run), "inspector-metrics"),
      this.telemetry.host,
      this.section("Params", this.params(run), "inspector-params"),
      this.section("Config", this.config(d.config), "config-tree", true),
      this.section("Run info", this.info(run, d.run_json), "inspector-info"),
      this.section("Files", this.files(run, d.files), "inspector-files"),
      attachmentsSection(run),
    );
  }

  private section(title: string, content: Child, testid: string, collapsed = false): HTMLElement {
    const det = h("details", { class: "insp-section", testid }, h("summary", { class: "insp-section-title", text: title }), content);
    det.open = !collapsed;
    return det;
  }

  // -- error ----------------------------------------------------------------------------------------

  private errorCallout(d: RunDetail): HTMLElement | null {
    const e = d.run.error;
    const tb = d.traceback;
    if (!e && !tb) return null;
    const exitBits: string[] = [];
    if (e?.code !== null && e?.code !== undefined) exitBits.push(`exit code ${e.code}`);
    if (e?.signal) exitBits.push(`signal ${e.signal}`);
    let tail: string | null = null;
    let cut = 0;
    if (tb) {
      const lines = tb.replace(/\s+$/, "").split("\n");
      cut = Math.max(0, lines.length - TRACEBACK_TAIL);
      tail = lines.slice(cut).join("\n");
    }
    const pre = tail !== null ? h("pre", { class: "traceback", testid: "traceback", text: tail }) : null;
    const full =
      tb && cut > 0
        ? button(`Show all ${cut + TRACEBACK_TAIL} lines`, {
            small: true,
            kind: "ghost",
            onClick: () => {
              if (pre) pre.textContent = tb;
              full?.remove();
            },
          })
        : null;
    return h(
      "div",
      { class: "callout callout-error", testid: "error-callout" },
      h(
        "div",
        { class: "callout-head" },
        icon("warning"),
        h("span", { class: "error-type", testid: "error-type", text: e?.type ?? "Error" }),
        exitBits.length ? h("span", { class: "error-exit", testid: "error-exit", text: exitBits.join(" · ") }) : null,
      ),
      e?.message ? h("div", { class: "error-message", testid: "error-message", text: e.message }) : null,
      pre,
      full,
    );
  }

  private problems(run: RunRow): HTMLElement | null {
    if (!run.warnings.length) return null;
    return h(
      "div",
      { class: "callout callout-warn", testid: "file-problems" },
      h("div", { class: "callout-head" }, icon("warning"), h("span", { text: `File problems (${run.warnings.length})` })),
      h("ul", { class: "warn-list" }, ...run.warnings.map((w) => h("li", { text: w }))),
    );
  }

  // -- metrics and params ---------------------------------------------------------------------------

  private metrics(run: RunRow): HTMLElement {
    const names = new Set<string>([...Object.keys(run.start), ...Object.keys(run.last), ...Object.keys(run.best)]);
    const summaryKeys = Object.keys(run.summary);
    if (!names.size && !summaryKeys.length) return h("div", { class: "muted", text: "No metrics logged." });
    const num = (v: number | null | undefined) =>
      v === null || v === undefined ? h("span", { class: "cell-null", text: "–" }) : h("span", { text: fmtNum(v), title: String(v) });
    const rows: HTMLElement[] = [...names].sort().map((m) => {
      const b = run.best[m];
      return h(
        "tr",
        {},
        h("td", { class: "kv-key", text: m, title: m }),
        h("td", { class: "num" }, num(run.start[m])),
        h("td", { class: "num" }, num(run.last[m])),
        h(
          "td",
          { class: "num" },
          b ? num(b.value) : num(null),
          b && b.step !== null ? h("span", { class: "best-step", text: ` @${b.step}`, title: `mode ${b.mode ?? "?"}` }) : null,
        ),
      );
    });
    const table = h(
      "table",
      { class: "kv-table metrics-table" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          h("th", { text: "metric" }),
          h("th", { class: "num", text: "start" }),
          h("th", { class: "num", text: "last" }),
          h("th", { class: "num", text: "best" }),
        ),
      ),
      h("tbody", {}, ...rows),
    );
    const summary = summaryKeys.length
      ? h(
          "table",
          { class: "kv-table", testid: "inspector-summary" },
          h("thead", {}, h("tr", {}, h("th", { text: "summary" }), h("th", { class: "num", text: "value" }))),
          h("tbody", {}, ...summaryKeys.sort().map((k) => this.kvRow(k, run.summary[k] ?? null))),
        )
      : null;
    return h("div", {}, names.size ? table : null, summary);
  }

  private kvRow(k: string, v: Scalar): HTMLElement {
    const isNum = typeof v === "number";
    return h(
      "tr",
      {},
      h("td", { class: "kv-key", text: k, title: k }),
      h("td", { class: isNum ? "kv-val mono" : "kv-val", title: v === null ? "no value (null)" : rawText(v) }, v === null ? h("span", { class: "cell-null", testid: "no-value", text: "–" }) : isNum ? fmtNum(v) : rawText(v)),
    );
  }

  private params(run: RunRow): HTMLElement {
    const keys = Object.keys(run.params).sort();
    if (!keys.length) return h("div", { class: "muted", text: "No params.yaml values." });
    return h("table", { class: "kv-table" }, h("tbody", {}, ...keys.map((k) => this.kvRow(k, run.params[k] ?? null))));
  }

  // -- config tree ----------------------------------------------------------------------------------

  private config(config: unknown): HTMLElement {
    if (config === null || config === undefined) return h("div", { class: "muted", text: "No config.json." });
    return h("div", { class: "tree" }, this.treeNode(null, config, 0));
  }

  private treeNode(key: string | null, value: unknown, depth: number): HTMLElement {
    const keyEl = key !== null ? h("span", { class: "tree-key", text: key }) : null;
    if (value !== null && typeof value === "object") {
      const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v] as const) : Object.entries(value as object);
      const det = h(
        "details",
        { class: "tree-branch" },
        h(
          "summary",
          {},
          keyEl,
          h("span", { class: "tree-meta", text: Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}` }),
        ),
        h("div", { class: "tree-children" }, ...entries.slice(0, 500).map(([k, v]) => this.treeNode(k, v, depth + 1))),
        entries.length > 500 ? h("div", { class: "muted", text: `… ${entries.length - 500} more` }) : null,
      );
      det.open = depth < 2;
      return det;
    }
    const cls = value === null ? "tree-null" : typeof value === "string" ? "tree-str" : typeof value === "number" ? "tree-num" : "tree-bool";
    // A missing value reads "–" as in the table (the tooltip says it is a JSON null).
    const text = value === null ? "–" : typeof value === "string" ? JSON.stringify(value) : String(value);
    return h("div", { class: "tree-leaf" }, keyEl, h("span", { class: cls, text, title: value === null ? "null" : undefined }));
  }

  // -- run info and files ---------------------------------------------------------------------------

  private info(run: RunRow, rj: Record<string, unknown> | null): HTMLElement {
    const rows: [string, Child][] = [
      ["id", run.id],
      ["name", run.name],
      ["group", run.group ?? ""],
      ["tags", run.tags.join(", ")],
      ["notes", run.notes],
      // run.json without a status reads "–" (never "null"), with what the table shows instead.
      ["status", `${run.status ?? "–"}${run.display_status !== run.status ? ` (shown as ${run.display_status})` : ""}`],
      ["started", run.started_at ? `${fmtTime(run.started_at)}  (${run.started_at})` : ""],
      ["ended", run.ended_at ? `${fmtTime(run.ended_at)}  (${run.ended_at})` : ""],
      ["heartbeat", run.heartbeat_at ? `${fmtAgo(run.heartbeat_at)}  (${run.heartbeat_at})` : ""],
      ["duration", run.duration_derived && run.duration_s !== null ? `${fmtDuration(run.duration_s)} (derived from the times)` : fmtDuration(run.duration_s)],
      ["step / epoch", [run.step, run.epoch].map((v) => (v === null ? "–" : String(v))).join(" / ")],
      ["path", h("code", { class: "path", text: run.path })],
      ["root", h("code", { class: "path", text: run.root })],
    ];
    if (rj) {
      const cmd = rj.command;
      if (Array.isArray(cmd)) rows.push(["command", h("code", { class: "path", text: cmd.filter((c) => c !== null && c !== undefined).map((c) => String(c)).join(" ") })]);
      else if (typeof cmd === "string") rows.push(["command", h("code", { class: "path", text: cmd })]);
      if (typeof rj.cwd === "string") rows.push(["cwd", h("code", { class: "path", text: rj.cwd })]);
      for (const k of ["host", "git"]) {
        const v = rj[k];
        if (v && typeof v === "object" && !Array.isArray(v)) {
          for (const [kk, vv] of Object.entries(v as Record<string, unknown>)) {
            rows.push([`${k}.${kk}`, vv === null || vv === undefined ? "–" : typeof vv === "object" ? JSON.stringify(vv) : String(vv)]);
          }
        } else if (v !== undefined && v !== null) rows.push([k, String(v)]);
      }
      if (rj.schema_version !== undefined && rj.schema_version !== null) rows.push(["schema_version", String(rj.schema_version)]);
    }
    return h(
      "table",
      { class: "kv-table" },
      h(
        "tbody",
        {},
        ...rows
          .filter(([, v]) => v !== "" && v !== null)
          .map(([k, v]) => h("tr", {}, h("td", { class: "kv-key", text: k, title: k }), h("td", { class: "kv-val" }, v))),
      ),
    );
  }

  private files(run: RunRow, files: Record<string, number | null>): HTMLElement {
    return h(
      "div",
      { class: "file-buttons" },
      ...FILES.map((name) => {
        const size = files[name];
        const present = size !== null && size !== undefined;
        const b = h(
          "button",
          { type: "button", class: "file-btn", testid: "file-button", data: { file: name }, title: present ? `Open ${name} (read-only)` : `${name} is absent` },
          icon("file"),
          h("span", { class: "file-name", text: name }),
          h("span", { class: "file-size", text: present ? fmtBytes(size) : "absent" }),
        );
        b.disabled = !present;
        b.addEventListener("click", () => void this.openFile(run, name));
        return b;
      }),
    );
  }

  private async openFile(run: RunRow, name: string): Promise<void> {
    const pre = h("pre", { class: "file-view", testid: "file-content", text: "Loading…" });
    modal(
      h("span", {}, h("span", { class: "modal-file", text: name }), h("span", { class: "modal-sub", text: ` · ${run.name || run.id} · read-only` })),
      pre,
      "file-viewer",
    );
    try {
      const text = await api.file(run.key, name);
      pre.textContent = typeof text === "string" ? text : JSON.stringify(text, null, 2);
      // A log (and metrics.jsonl) grows at its end: it opens there, on the newest lines, as a
      // terminal's tail does; the server sends the last part of a long one.
      const body = pre.closest<HTMLElement>(".modal-body");
      if (body && TAIL_FILES.test(name)) stickToEnd(body);
    } catch (err) {
      pre.textContent = errorText(err);
      toast(errorText(err), "error");
    }
  }
}
