// Builds the viewer bundle into ../src/traceml_ai/ui/static/ (app.js, app.css, index.html,
// favicon.svg). Minified, no source maps: the wheel ships exactly these four files. NOMIN=1 leaves
// the names readable, for a browser profile.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const outdir = join(here, "..", "src", "traceml_ai", "ui", "static");

rmSync(outdir, { recursive: true, force: true });
mkdirSync(outdir, { recursive: true });

await build({
  entryPoints: { app: join(here, "src", "main.ts") },
  outdir,
  bundle: true,
  minify: process.env.NOMIN ? false : true,
  sourcemap: false,
  format: "iife",
  target: ["es2020"],
  legalComments: "none",
  logLevel: "warning",
});

for (const name of ["index.html", "favicon.svg"]) {
  copyFileSync(join(here, "public", name), join(outdir, name));
}
console.log(`built ${outdir}`);
