// DOM building without HTML strings: every text goes in through textContent / createTextNode, so a
// run named `<img src=x onerror=alert(1)>` shows as literal text. No inline `style` attributes
// either (the CSP has no 'unsafe-inline'); styling is by class, geometry by `el.style.x` from JS.

export type Child = Node | string | number | null | undefined | false;

export interface Props {
  class?: string;
  id?: string;
  testid?: string;
  title?: string;
  text?: string;
  type?: string;
  attrs?: Record<string, string | number | boolean | null | undefined>;
  data?: Record<string, string>;
  on?: { [K in keyof HTMLElementEventMap]?: (ev: HTMLElementEventMap[K]) => void };
}

function checkAttr(name: string): void {
  const n = name.toLowerCase();
  if (n === "style" || n.startsWith("on")) throw new Error(`attribute ${name} is not allowed`);
}

function applyProps(el: Element, props: Props | undefined): void {
  if (!props) return;
  if (props.class) el.setAttribute("class", props.class);
  if (props.id) el.id = props.id;
  if (props.testid) el.setAttribute("data-testid", props.testid);
  if (props.title !== undefined) el.setAttribute("title", props.title);
  if (props.type) el.setAttribute("type", props.type);
  if (props.attrs) {
    for (const [k, v] of Object.entries(props.attrs)) {
      checkAttr(k);
      if (v === null || v === undefined || v === false) continue;
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  if (props.data) {
    for (const [k, v] of Object.entries(props.data)) el.setAttribute(`data-${k}`, v);
  }
  if (props.on) {
    for (const [ev, fn] of Object.entries(props.on)) {
      if (fn) el.addEventListener(ev, fn as EventListener);
    }
  }
  if (props.text !== undefined) el.textContent = props.text;
}

export function append(el: Node, children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
}

/** Create an HTML element: `h("div", {class: "x"}, "text", child)`. */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props?: Props,
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  applyProps(el, props);
  append(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

/** Create an SVG element with numeric/string attributes. */
export function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs?: Record<string, string | number | null | undefined>,
  ...children: Child[]
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG_NS, tag);
  if (attrs) {
    for (const [k, v] of Object.entries(attrs)) {
      checkAttr(k);
      if (v === null || v === undefined) continue;
      if (k === "class") el.setAttribute("class", String(v));
      else el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

/** An SVG `<title>` tooltip (text only). */
export function svgTitle(text: string): SVGTitleElement {
  const t = document.createElementNS(SVG_NS, "title");
  t.textContent = text;
  return t;
}

export function clear(el: Node): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

export function replace(el: Node, ...children: Child[]): void {
  clear(el);
  append(el, children);
}

/** Debounce a function by `ms`. */
export function debounce<A extends unknown[]>(fn: (...args: A) => void, ms: number): (...args: A) => void {
  let t: number | undefined;
  return (...args: A) => {
    if (t !== undefined) window.clearTimeout(t);
    t = window.setTimeout(() => {
      t = undefined;
      fn(...args);
    }, ms);
  };
}
