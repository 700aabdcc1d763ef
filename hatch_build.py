"""Hatch build hook: build the web viewer's bundle before the wheel is made (DESIGN §1).

The front end lives in ``web/`` (TypeScript, bundled with esbuild). Its output,
``src/traceml_ai/ui/static/{index.html,app.js,app.css,favicon.svg}``, is not committed; this hook
makes it whenever a wheel is built, ``pip install -e .`` included:

- when a bundle file is missing, or older than any source file of ``web/`` (``src/``, ``public/``,
  ``package.json``, ``package-lock.json``, ``build.mjs``, ``tsconfig.json``), it runs
  ``npm ci`` (``npm install`` when there is no lock file; skipped while ``node_modules`` is newer
  than the lock file) and then ``npm run build`` in ``web/``;
- when the bundle is up to date it does nothing, so Node.js is only needed to build, never to run;
- without ``npm`` on PATH it stops the build with one message that says what to install.

``TRACEML_SKIP_WEB_BUILD=1`` skips the step (for a wheel built where the bundle was made by an
earlier step); the viewer then serves whatever bundle is present.
The built files get into the wheel through ``artifacts`` in pyproject.toml (they are gitignored).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BUNDLE_FILES = ("index.html", "app.js", "app.css")
WEB_INPUTS = ("src", "public", "package.json", "package-lock.json", "build.mjs", "tsconfig.json")


class WebBuildError(RuntimeError):
    """The web bundle could not be built; the message says why and what to do."""


def _newest_mtime(paths: list[Path]) -> float:
    newest = 0.0
    for p in paths:
        if p.is_dir():
            for f in p.rglob("*"):
                if f.is_file():
                    newest = max(newest, f.stat().st_mtime)
        elif p.is_file():
            newest = max(newest, p.stat().st_mtime)
    return newest


def bundle_is_stale(web: Path, static: Path) -> bool:
    """True when a bundle file is missing or older than any input file of ``web/``."""
    outputs = [static / name for name in BUNDLE_FILES]
    if not all(p.is_file() for p in outputs):
        return True
    oldest_output = min(p.stat().st_mtime for p in outputs)
    return _newest_mtime([web / name for name in WEB_INPUTS]) > oldest_output


def _run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        raise WebBuildError(f"`{' '.join(cmd)}` failed in {cwd} (exit {proc.returncode}):\n{tail}")


def build_web(root: Path) -> bool:
    """Build ``web/`` into ``src/traceml_ai/ui/static/`` when needed; returns True when it built.

    Raises:
        WebBuildError: npm is missing, or ``npm ci`` / ``npm run build`` failed.
    """
    web = root / "web"
    static = root / "src" / "traceml_ai" / "ui" / "static"
    if not (web / "package.json").is_file():
        # An sdist or checkout without the front-end sources: use the bundle if it is there.
        if all((static / n).is_file() for n in BUNDLE_FILES):
            return False
        raise WebBuildError(f"the viewer bundle is missing from {static} and there is no web/ folder to build it from")
    if not bundle_is_stale(web, static):
        return False
    npm = shutil.which("npm")
    if npm is None:
        raise WebBuildError(
            "building TraceML's web viewer needs Node.js (>= 18) and npm, and `npm` is not on PATH. "
            "Install Node.js from https://nodejs.org or your package manager (e.g. `apt install nodejs npm`), "
            "then run the install again; or set TRACEML_SKIP_WEB_BUILD=1 to install without rebuilding the viewer."
        )
    lock = web / "package-lock.json"
    marker = web / "node_modules" / ".package-lock.json"
    if not marker.is_file() or (lock.is_file() and lock.stat().st_mtime > marker.stat().st_mtime):
        _run([npm, "ci" if lock.is_file() else "install", "--no-audit", "--no-fund"], web)
    _run([npm, "run", "build"], web)
    missing = [n for n in BUNDLE_FILES if not (static / n).is_file()]
    if missing:
        raise WebBuildError(f"`npm run build` finished but {', '.join(missing)} is missing from {static}")
    return True


class WebBundleHook(BuildHookInterface):  # type: ignore[type-arg]
    """Runs :func:`build_web` before hatchling builds a wheel (editable installs included)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if os.environ.get("TRACEML_SKIP_WEB_BUILD", "").strip() not in ("", "0"):
            self.app.display_info("TRACEML_SKIP_WEB_BUILD is set: not building the web viewer")
            return
        try:
            built = build_web(Path(self.root))
        except WebBuildError as exc:
            # One readable line (plus npm's tail) instead of a hook traceback.
            self.app.display_error(f"TraceML web viewer: {exc}")
            raise SystemExit(1) from None
        if built:
            self.app.display_info("built the TraceML web viewer into src/traceml_ai/ui/static/")
