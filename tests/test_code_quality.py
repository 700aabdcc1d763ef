"""The code stays ruff- and mypy-clean (STYLE.md), and the layering of DESIGN §1 holds."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "traceml_ai"

# DESIGN §1: which of our packages each package may import.
ALLOWED = {
    "runs": set(),
    "telemetry": set(),
    "sdk": {"runs", "capture", "settings"},
    "capture": {"telemetry"},
    "aggregator": {"telemetry", "diagnose"},
    "diagnose": {"telemetry"},
    "launcher": {"aggregator", "runs", "capture", "settings"},
    "catalog": {"runs"},
    "ui": {"runs", "catalog", "diagnose", "settings"},
    "settings": set(),
}


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} is not installed in this environment")
    return found


def test_ruff_is_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "src", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_is_clean() -> None:
    proc = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "traceml_ai" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_layering_of_design_section_1() -> None:
    problems = []
    for package, allowed in ALLOWED.items():
        folder = SRC / package
        files = list(folder.rglob("*.py")) if folder.is_dir() else [SRC / f"{package}.py"]
        for path in files:
            if not path.exists():
                continue
            for imported in _imports(path) - allowed - {package}:
                problems.append(f"{path.relative_to(ROOT)} imports traceml_ai.{imported}")
    assert not problems, "\n".join(problems)


def test_nothing_imports_torch_at_import_time() -> None:
    code = "import sys, traceml_ai, traceml_ai.runs.store, traceml_ai.cli.main; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"
