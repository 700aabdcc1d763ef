"""Shared test helpers: run the real ``traceml`` command in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_traceml(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m traceml_ai ARGS`` as a user would run ``traceml ARGS``."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    full_env.pop("TRACEML_RUN_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "traceml_ai", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(autouse=True)
def _no_attach_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The viewer's cache for roots outside a traceml/ project goes under $XDG_CACHE_HOME: never the real one.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))
    # A developer's shell may have these set; tests must not write into a real run.
    for name in ("TRACEML_RUN_DIR", "TRACEML_LOGS_DIR", "TRACEML_ROOTS", "TRACEML_STALE_AFTER_SECONDS"):
        monkeypatch.delenv(name, raising=False)
