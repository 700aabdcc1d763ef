// The inspector's Attachments section: the attachments of the catalog run that holds this run
// folder's session (GET /api/runs/{key}/attachments; docs/catalog.md, "In the viewer"). A local
// file opens read-only as text and a local folder is listed (GET /api/attachments/{token}); a remote
// one is a plain link that the page never fetches. The page holds tokens, never paths, and every
// value from the server goes in as text.

import "../styles/attachments.css";
import { api } from "../api";
import { type Child, h, replace } from "../dom";
import { fmtBytes } from "../format";
import { icon } from "../icons";
import type { AttachmentItem, AttachmentsResponse, RunRow } from "../types";
import { button, errorText, modal, toast } from "../ui";

/** The Attachments section of the inspector for `run`; fills itself when the answer arrives. */
export function attachmentsSection(run: RunRow): HTMLElement {
  const body = h("div", { class: "attach-body" }, h("div", { class: "loading", text: "Loading…" }));
  const det = h(
    "details",
    { class: "insp-section", testid: "inspector-attachments" },
    h("summary", { class: "insp-section-title", text: "Attachments" }),
    body,
  );
  det.open = true;
  api
    .attachments(run.key)
    .then((res) => replace(body, ...render(run, res)))
    .catch((err: unknown) => replace(body, h("div", { class: "callout callout-error", text: errorText(err) })));
  return det;
}

function render(run: RunRow, res: AttachmentsResponse): Child[] {
  if (res.catalog_run === null) {
    return [h("div", { class: "muted", text: "Not in the run catalog: this run folder holds no TraceML session (aggregator/manifest.json)." })];
  }
  const head = h(
    "div",
    { class: "attach-run", testid: "attachments-run" },
    h("span", { class: "attach-run-label", text: res.explicit ? "Envelope run" : "Catalog run" }),
    h("code", { class: "attach-run-id", text: res.catalog_run }),
    res.title ? h("span", { class: "attach-run-title", text: res.title }) : null,
  );
  if (!res.attachments.length) return [head, h("div", { class: "muted", text: "No attachments." })];
  return [head, h("ul", { class: "attach-list" }, ...res.attachments.map((a) => item(run, a)))];
}

function item(run: RunRow, a: AttachmentItem): HTMLElement {
  const meta = [a.kind, a.storage, a.rank !== null ? `rank ${a.rank}` : "", a.session ? `session ${a.session}` : ""]
    .filter(Boolean)
    .join(" · ");
  return h(
    "li",
    { class: "attach-item", testid: "attachment", data: { id: a.id, state: a.state } },
    h(
      "div",
      { class: "attach-main" },
      icon(a.state === "folder" ? "folder" : "file"),
      h("span", { class: "attach-title", text: a.title ?? a.id, title: a.id }),
      a.size_bytes !== null ? h("span", { class: "attach-size", text: fmtBytes(a.size_bytes) }) : null,
    ),
    h("div", { class: "attach-meta", text: meta }),
    action(run, a),
  );
}

/** What the user can do with an attachment: a link (remote), Open/List (local), or why not. */
function action(run: RunRow, a: AttachmentItem): HTMLElement {
  if (a.state === "remote") {
    const url = a.url ?? "";
    // Only web addresses become links (never javascript: or file:); the rest is shown as text.
    if (!/^https?:\/\//i.test(url)) return h("code", { class: "attach-url", testid: "attachment-url", text: url });
    return h("a", {
      class: "attach-url",
      testid: "attachment-link",
      text: url,
      title: `${url}\nOpens in a new tab; TraceML does not fetch it`,
      attrs: { href: url, target: "_blank", rel: "noopener noreferrer", referrerpolicy: "no-referrer" },
    });
  }
  if ((a.state === "file" || a.state === "folder") && a.token) {
    const token = a.token;
    const label = a.state === "folder" ? "List" : "Open";
    return button(label, {
      small: true,
      testid: "attachment-open",
      title: a.state === "folder" ? "List the folder's entries (read-only)" : "Open as text (read-only)",
      onClick: () => void open(run, a, token),
    });
  }
  const outside = a.state === "outside_root";
  return h("span", {
    class: "attach-refused",
    testid: "attachment-refused",
    text: outside ? "outside the roots: not opened" : "missing on disk",
    title: outside ? "The viewer only opens files inside the folders it was started on" : "The file is not there",
  });
}

async function open(run: RunRow, a: AttachmentItem, token: string): Promise<void> {
  const pre = h("pre", { class: "file-view", testid: "attachment-content", text: "Loading…" });
  modal(
    h(
      "span",
      {},
      h("span", { class: "modal-file", text: a.title ?? a.id }),
      h("span", { class: "modal-sub", text: ` · ${run.name || run.id} · read-only` }),
    ),
    pre,
    "attachment-viewer",
  );
  try {
    pre.textContent = await api.attachment(token);
  } catch (err) {
    pre.textContent = errorText(err);
    toast(errorText(err), "error");
  }
}
