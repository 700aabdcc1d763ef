// Small UI building blocks shared by the views: buttons, switches, segmented controls, selects,
// chips, popovers, modals, empty states, status badges, toasts and the palette.

import { type Child, clear, h } from "./dom";
import { type IconName, icon } from "./icons";
import { PALETTE_SIZE } from "./store";

// -- palette (the colours live in styles/tokens.css) -----------------------------------------------

let paletteCache: string[] | null = null;

/** Colour `i` of the series palette, read from the `--series-<i>` CSS tokens. */
export function paletteColor(i: number): string {
  if (!paletteCache) {
    const cs = getComputedStyle(document.documentElement);
    paletteCache = [];
    for (let k = 0; k < PALETTE_SIZE; k++) {
      paletteCache.push(cs.getPropertyValue(`--series-${k}`).trim() || "#5b9dff");
    }
  }
  const n = paletteCache.length;
  return paletteCache[((i % n) + n) % n] ?? "#5b9dff";
}

const tokenCache = new Map<string, string>();

/**
 * A CSS token's value (e.g. `--text-2`), for canvas drawing. Read once: the tokens never change at
 * run time, and each read would force a style pass over whatever the page just changed.
 */
export function token(name: string, fallback: string): string {
  let v = tokenCache.get(name);
  if (v === undefined) {
    v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    tokenCache.set(name, v);
  }
  return v || fallback;
}

/** `#rrggbb` with an alpha, as `rgba(...)`. */
export function withAlpha(color: string, alpha: number): string {
  const m = /^#([0-9a-f]{6})$/i.exec(color);
  if (!m || !m[1]) return color;
  const n = parseInt(m[1], 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${alpha})`;
}

/** A coloured square. */
export function swatch(color: string, cls = "swatch"): HTMLElement {
  const el = h("span", { class: cls });
  el.style.backgroundColor = color;
  return el;
}

// -- controls ---------------------------------------------------------------------------------------

export interface ButtonOpts {
  icon?: IconName;
  testid?: string;
  title?: string;
  kind?: "default" | "primary" | "ghost" | "danger";
  small?: boolean;
  disabled?: boolean;
  onClick?: (ev: MouseEvent) => void;
}

export function button(label: string, opts: ButtonOpts = {}): HTMLButtonElement {
  const cls = ["btn", `btn-${opts.kind ?? "default"}`];
  if (opts.small) cls.push("btn-sm");
  if (!label) cls.push("btn-icon");
  const b = h(
    "button",
    { type: "button", class: cls.join(" "), testid: opts.testid, title: opts.title },
    opts.icon ? icon(opts.icon) : null,
    label ? h("span", { text: label }) : null,
  );
  if (!label && opts.title) b.setAttribute("aria-label", opts.title);
  b.disabled = !!opts.disabled;
  if (opts.onClick) b.addEventListener("click", opts.onClick);
  return b;
}

/** A labelled on/off switch. */
export function toggle(
  label: string,
  checked: boolean,
  onChange: (on: boolean) => void,
  testid?: string,
  title?: string,
): HTMLLabelElement {
  const input = h("input", { type: "checkbox", testid });
  input.checked = checked;
  input.addEventListener("change", () => onChange(input.checked));
  return h("label", { class: "switch", title }, input, h("span", { class: "switch-track" }), h("span", { text: label }));
}

export interface SegOption<T extends string> {
  value: T;
  label: string;
  count?: number;
  title?: string;
}

/** A row of mutually exclusive buttons; `testid(value)` names each segment. */
export function segmented<T extends string>(
  options: SegOption<T>[],
  value: T,
  onChange: (v: T) => void,
  testid?: (v: T) => string,
  cls = "",
): HTMLElement {
  const wrap = h("div", { class: `segmented ${cls}`, attrs: { role: "tablist" } });
  for (const o of options) {
    const b = h(
      "button",
      {
        type: "button",
        class: `seg${o.value === value ? " is-active" : ""}`,
        testid: testid ? testid(o.value) : undefined,
        title: o.title,
        attrs: { role: "tab", "aria-selected": o.value === value ? "true" : "false" },
        data: { value: o.value },
      },
      h("span", { text: o.label }),
      o.count !== undefined ? h("span", { class: "seg-count", text: String(o.count) }) : null,
    );
    b.addEventListener("click", () => onChange(o.value));
    wrap.appendChild(b);
  }
  return wrap;
}

export interface SelectOption {
  value: string;
  label: string;
  group?: string;
}

/** A native select; options with a `group` go into optgroups. */
export function select(
  options: SelectOption[],
  value: string,
  onChange: (v: string) => void,
  testid?: string,
  title?: string,
): HTMLSelectElement {
  const sel = h("select", { class: "select", testid, title });
  const groups = new Map<string, HTMLOptGroupElement>();
  for (const o of options) {
    const opt = h("option", { text: o.label });
    opt.value = o.value;
    if (o.group) {
      let g = groups.get(o.group);
      if (!g) {
        g = h("optgroup");
        g.label = o.group;
        groups.set(o.group, g);
        sel.appendChild(g);
      }
      g.appendChild(opt);
    } else sel.appendChild(opt);
  }
  sel.value = value;
  sel.addEventListener("change", () => onChange(sel.value));
  return sel;
}

/** A labelled field for toolbars: `Label [control]`. */
export function field(label: string, control: Node, cls = ""): HTMLElement {
  return h("label", { class: `field ${cls}` }, h("span", { class: "field-label", text: label }), control);
}

export function chip(parts: Child[], onRemove?: () => void, onClick?: () => void, testid = "chip"): HTMLElement {
  const el = h("span", { class: "chip", testid }, ...parts);
  if (onClick) {
    el.classList.add("is-clickable");
    el.addEventListener("click", onClick);
  }
  if (onRemove) {
    const x = h("button", { type: "button", class: "chip-x", title: "Remove", testid: `${testid}-remove` }, icon("close"));
    x.addEventListener("click", (ev) => {
      ev.stopPropagation();
      onRemove();
    });
    el.appendChild(x);
  }
  return el;
}

// -- status -----------------------------------------------------------------------------------------

export function statusClass(status: string): string {
  const known = ["running", "stale", "completed", "failed", "killed", "legacy"];
  if (status === "running?") return "running-q";
  return known.includes(status) ? status : "unknown";
}

export function statusBadge(status: string, title?: string): HTMLElement {
  return h(
    "span",
    { class: `badge status-${statusClass(status)}`, title, testid: "status-badge" },
    h("span", { class: "badge-dot" }),
    h("span", { text: status }),
  );
}

// -- popovers and modals ----------------------------------------------------------------------------

let openPopover: { el: HTMLElement; close: () => void } | null = null;

/** Show `content` in a popover under `anchor`; closes on outside click, Escape, or `close()`. */
export function popover(anchor: HTMLElement, content: HTMLElement, testid?: string): () => void {
  closePopover();
  const el = h("div", { class: "popover", testid, attrs: { role: "dialog" } }, content);
  document.body.appendChild(el);
  const r = anchor.getBoundingClientRect();
  const width = el.offsetWidth;
  const left = Math.max(8, Math.min(r.left, window.innerWidth - width - 8));
  el.style.left = `${left}px`;
  const below = r.bottom + 6;
  const maxH = window.innerHeight - below - 12;
  if (maxH < 200 && r.top > window.innerHeight / 2) {
    el.style.bottom = `${window.innerHeight - r.top + 6}px`;
    el.style.maxHeight = `${r.top - 18}px`;
  } else {
    el.style.top = `${below}px`;
    el.style.maxHeight = `${Math.max(160, maxH)}px`;
  }
  const onDown = (ev: MouseEvent) => {
    const t = ev.target as Node;
    if (!el.contains(t) && !anchor.contains(t)) close();
  };
  const onKey = (ev: KeyboardEvent) => {
    if (ev.key !== "Escape") return;
    // Escape closes only the topmost layer (not also the inspector underneath).
    ev.stopPropagation();
    close();
  };
  const close = () => {
    document.removeEventListener("mousedown", onDown, true);
    document.removeEventListener("keydown", onKey, true);
    el.remove();
    if (openPopover?.el === el) openPopover = null;
  };
  document.addEventListener("mousedown", onDown, true);
  document.addEventListener("keydown", onKey, true);
  openPopover = { el, close };
  const first = el.querySelector<HTMLElement>("input, select, button");
  first?.focus();
  return close;
}

export function closePopover(): void {
  openPopover?.close();
}

/** A modal dialog with a title; returns the close function. */
export function modal(title: Child, body: HTMLElement, testid?: string, actions: HTMLElement[] = []): () => void {
  const closeBtn = button("", { icon: "close", kind: "ghost", title: "Close", testid: "modal-close" });
  const box = h(
    "div",
    { class: "modal", testid, attrs: { role: "dialog", "aria-modal": "true" } },
    h("div", { class: "modal-head" }, h("div", { class: "modal-title" }, title), ...actions, closeBtn),
    h("div", { class: "modal-body" }, body),
  );
  const backdrop = h("div", { class: "modal-backdrop" }, box);
  const onKey = (ev: KeyboardEvent) => {
    if (ev.key !== "Escape") return;
    // Escape closes only the topmost layer (not also the inspector underneath).
    ev.stopPropagation();
    close();
  };
  const close = () => {
    document.removeEventListener("keydown", onKey, true);
    backdrop.remove();
  };
  backdrop.addEventListener("mousedown", (ev) => {
    if (ev.target === backdrop) close();
  });
  closeBtn.addEventListener("click", close);
  document.addEventListener("keydown", onKey, true);
  document.body.appendChild(backdrop);
  return close;
}

/**
 * Keep a scrolling box of log lines at its end, the newest lines, like `tail -f`: now, when it is
 * first laid out (a box built before it is in the page, or inside a closed section, cannot scroll
 * yet) unless the user has scrolled up since to read older lines, and again after each call of
 * the returned function (its lines were replaced).
 */
export function stickToEnd(el: HTMLElement): () => void {
  let pinned = true;
  const toEnd = () => {
    if (pinned) el.scrollTop = el.scrollHeight;
  };
  el.addEventListener("scroll", () => {
    pinned = el.scrollTop + el.clientHeight >= el.scrollHeight - 4;
  });
  new ResizeObserver(toEnd).observe(el);
  toEnd();
  return () => {
    pinned = true;
    toEnd();
  };
}

export function emptyState(title: string, hint?: string, action?: HTMLElement, testid = "empty"): HTMLElement {
  return h(
    "div",
    { class: "empty", testid },
    h("div", { class: "empty-title", text: title }),
    hint ? h("div", { class: "empty-hint", text: hint }) : null,
    action ?? null,
  );
}

// -- toasts -----------------------------------------------------------------------------------------

let toastHost: HTMLElement | null = null;

export function toast(message: string, kind: "error" | "info" = "info"): void {
  if (!toastHost) {
    toastHost = h("div", { class: "toasts", attrs: { "aria-live": "polite" } });
    document.body.appendChild(toastHost);
  }
  const t = h("div", { class: `toast toast-${kind}`, testid: "toast", text: message });
  toastHost.appendChild(t);
  window.setTimeout(() => t.classList.add("is-leaving"), kind === "error" ? 6000 : 3000);
  window.setTimeout(() => t.remove(), kind === "error" ? 6400 : 3400);
}

export function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Remove all children of a host and add a loading line. */
export function loading(el: HTMLElement, text = "Loading…"): void {
  clear(el);
  el.appendChild(h("div", { class: "loading", text }));
}

/** Copy text to the clipboard (falls back to a hidden textarea). */
export async function copyText(text: string): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    const ta = h("textarea", { class: "offscreen" });
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    ta.remove();
    return ok;
  }
}
