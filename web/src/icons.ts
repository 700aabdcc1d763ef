// Stroke icons (24×24 viewBox, drawn with currentColor) built as SVG DOM nodes.

import { s } from "./dom";

const PATHS: Record<string, string[]> = {
  overview: ["M3 3h7v9H3z", "M14 3h7v5h-7z", "M14 12h7v9h-7z", "M3 16h7v5H3z"],
  runs: ["M3 5h18", "M3 12h18", "M3 19h18", "M8 3v18"],
  charts: ["M3 3v18h18", "M7 15l4-5 3 3 5-7"],
  compare: ["M4 4h6v16H4z", "M14 4h6v16h-6z"],
  performance: ["M3 20h18", "M5 20V11", "M10 20V5", "M15 20v-7", "M20 20V9"],
  refresh: ["M21 12a9 9 0 1 1-2.64-6.36", "M21 3v6h-6"],
  close: ["M6 6l12 12", "M18 6L6 18"],
  filter: ["M3 4h18l-7 8.5V19l-4 2v-8.5z"],
  columns: ["M3 4h18v16H3z", "M9 4v16", "M15 4v16"],
  download: ["M12 3v12", "M7 10l5 5 5-5", "M4 21h16"],
  copy: ["M9 9h11v11H9z", "M5 15H4V4h11v1"],
  eye: ["M1 12s4-7 11-7 11 7 11 7-4 7-11 7S1 12 1 12z", "M12 9a3 3 0 1 0 0 6 3 3 0 0 0 0-6z"],
  eyeOff: ["M3 3l18 18", "M10.6 5.1A10 10 0 0 1 12 5c7 0 11 7 11 7a17 17 0 0 1-3.2 3.9", "M6.3 6.3A17 17 0 0 0 1 12s4 7 11 7a10 10 0 0 0 5.7-1.7"],
  chevronDown: ["M6 9l6 6 6-6"],
  chevronRight: ["M9 6l6 6-6 6"],
  warning: ["M12 3L2 21h20z", "M12 10v5", "M12 18v.5"],
  file: ["M6 2h9l5 5v15H6z", "M14 2v6h6"],
  external: ["M14 4h6v6", "M20 4l-9 9", "M18 14v6H4V6h6"],
  search: ["M11 4a7 7 0 1 0 0 14 7 7 0 0 0 0-14z", "M21 21l-5-5"],
  image: ["M3 4h18v16H3z", "M3 16l5-5 4 4 3-3 6 6", "M15.5 8.5h.01"],
  folder: ["M3 6h6l2 2h10v11H3z"],
  settings: ["M12 9a3 3 0 1 0 0 6 3 3 0 0 0 0-6z", "M4 12h2", "M18 12h2", "M12 4v2", "M12 18v2", "M6.3 6.3l1.4 1.4", "M16.3 16.3l1.4 1.4", "M6.3 17.7l1.4-1.4", "M16.3 7.7l1.4-1.4"],
  selection: ["M4 4h16v16H4z", "M8 12l3 3 5-6"],
  plus: ["M12 5v14", "M5 12h14"],
  zoomOut: ["M11 4a7 7 0 1 0 0 14 7 7 0 0 0 0-14z", "M21 21l-5-5", "M8 11h6"],
  group: ["M4 6h16", "M8 12h12", "M8 18h12", "M4 12v6"],
};

export type IconName = keyof typeof PATHS;

export function icon(name: IconName, cls = "icon"): SVGSVGElement {
  const el = s("svg", {
    viewBox: "0 0 24 24",
    class: cls,
    fill: "none",
    stroke: "currentColor",
    "stroke-width": 2,
    "stroke-linecap": "round",
    "stroke-linejoin": "round",
    "aria-hidden": "true",
  });
  for (const d of PATHS[name] ?? []) el.appendChild(s("path", { d }));
  return el;
}
