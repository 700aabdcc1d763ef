// Builds the viewer bundle into ../src/traceml_ai/ui/static/ (app.js, early.js, app.css, index.html,
// favicon.svg). Minified, no source maps: the wheel ships exactly these five files. NOMIN=1 leaves
// the names readable, for a browser profile.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const outdir = join(here, "..", "src", "traceml_ai", "ui", "static");

rmSync(outdir, { recursive: true, force: true });
mkdirSync(outdir, { recursive: true });

// uPlot builds an Intl number formatter and reads the local time zone through Intl when its module
// is evaluated; the first Intl object of a page costs tens of milliseconds (locale data), and the
// viewer's charts never use either (their axes format their own ticks). This makes both lazy: same
// behaviour, built on first use. Exact text, or the file is left as it is.
const UPLOT_LAZY_INTL = [
  [
    "const numFormatter = new Intl.NumberFormat(domEnv ? nav.language : 'en-US');\nconst fmtNum = val => numFormatter.format(val);",
    "let numFormatter = null;\nconst fmtNum = val => (numFormatter ??= new Intl.NumberFormat(domEnv ? nav.language : 'en-US')).format(val);",
  ],
  ["const localTz = new Intl.DateTimeFormat().resolvedOptions().timeZone;", "let localTz = null;"],
  ["\telse if (tz == localTz)", "\telse if (tz == (localTz ??= new Intl.DateTimeFormat().resolvedOptions().timeZone))"],
];
const uplotLazyIntl = {
  name: "uplot-lazy-intl",
  setup(b) {
    b.onLoad({ filter: /uplot[\\/]dist[\\/]uPlot\.esm\.js$/ }, (args) => {
      let text = readFileSync(args.path, "utf8");
      if (!UPLOT_LAZY_INTL.every(([from]) => text.split(from).length === 2)) {
        console.warn("uplot-lazy-intl: uPlot's source changed; bundling it unchanged");
        return undefined;
      }
      for (const [from, to] of UPLOT_LAZY_INTL) text = text.replace(from, to);
      return { contents: text, loader: "js" };
    });
  },
};

await build({
  plugins: [uplotLazyIntl],
  entryPoints: { app: join(here, "src", "main.ts"), early: join(here, "src", "early.ts") },
  outdir,
  bundle: true,
  minify: process.env.NOMIN ? false : true,
  sourcemap: false,
  format: "iife",
  target: ["es2020"],
  legalComments: "none",
  logLevel: "warning",
});

// The stylesheet is written with design tokens (custom properties on :root, styles/tokens.css). A
// rule that reads a token through var() costs the browser a substitution per element and property
// on every style pass; a token set once, on :root, and nowhere else never changes, so its var()
// uses are replaced by its value here (about a sixth of the page's style time). Tokens set anywhere
// else (the per-status --st) stay var(); the :root definitions stay for the script to read.
function inlineStaticTokens(css) {
  const root = /:root\{([^}]*)\}/.exec(css);
  if (!root) return css;
  const counts = new Map();
  for (const m of css.matchAll(/(--[\w-]+)\s*:/g)) counts.set(m[1], (counts.get(m[1]) ?? 0) + 1);
  const values = new Map();
  for (const m of root[1].matchAll(/(--[\w-]+)\s*:\s*([^;]*)/g)) {
    if (counts.get(m[1]) === 1) values.set(m[1], m[2].trim());
  }
  const resolve = (text, depth) =>
    text.replace(/var\((--[\w-]+)\)/g, (whole, name) =>
      values.has(name) && depth < 8 ? resolve(values.get(name), depth + 1) : whole,
    );
  const end = root.index + root[0].length;
  return resolve(css.slice(0, root.index), 0) + root[0] + resolve(css.slice(end), 0);
}

const cssPath = join(outdir, "app.css");
writeFileSync(cssPath, inlineStaticTokens(readFileSync(cssPath, "utf8")));

for (const name of ["index.html", "favicon.svg"]) {
  copyFileSync(join(here, "public", name), join(outdir, name));
}
console.log(`built ${outdir}`);
