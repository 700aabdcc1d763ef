"""The code stays ruff- and mypy-clean (STYLE.md), the layering of DESIGN §1 holds (import-linter), and the
web page type-checks strictly (tsc)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed in this environment")
    return found


def test_ruff_is_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "src", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(900)  # a cold strict run over src/ on a busy machine
def test_mypy_strict_is_clean() -> None:
    proc = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_layering_of_design_section_1() -> None:
    """DESIGN §1's table as import-linter contracts ([tool.importlinter] in pyproject.toml): every
    import of ``src/traceml_ai`` counts, relative ones, ``from traceml_ai import ui`` and imports
    inside functions included; none of ours imports the real ``stormlog`` (a test dependency)."""
    proc = subprocess.run([_tool("lint-imports"), "--no-cache", "--no-logo"], cwd=ROOT, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_the_web_page_type_checks_strictly() -> None:
    """``tsc --noEmit`` with web/tsconfig.json (``strict``, no unused names, checked indexing) on the
    viewer's TypeScript: the bundle build (esbuild) strips types without checking them."""
    web = ROOT / "web"
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("Node.js and npm are not installed (the web build needs them too)")
    tsc = web / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():  # the bundle was up to date at install, so no `npm ci` ran
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=web, capture_output=True, check=True,
                       timeout=280)
    proc = subprocess.run([str(tsc), "--noEmit", "-p", "tsconfig.json"], cwd=web, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_nothing_imports_torch_at_import_time() -> None:
    code = "import sys, traceml_ai, traceml_ai.runs.store, traceml_ai.cli.main; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"
