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


def capture_digits(work: Path, name: str, *, ranks: int = 1, plant: str | None = None) -> Path:
    """One epoch of the digits example captured by the real ``traceml run --mode quiet`` into
    ``work/traceml/runs``, on ``ranks`` CPU ranks with an optional planted fault. Returns the run
    folder; skips without torch or scikit-learn, fails with the command's output if it failed."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from traceml_ai.examples import TRAIN_DIGITS

    root = work / "traceml" / "runs"
    launcher = ["--nproc-per-node", str(ranks)] if ranks > 1 else []
    planted = ["--plant", plant] if plant else []
    done = run_traceml("run", "--mode", "quiet", "--name", name, "--logs-dir", str(root), *launcher,
                       str(TRAIN_DIGITS), "--epochs", "1", *planted, cwd=work, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    assert (run_dir / "aggregator" / "final_summary.json").is_file()
    return run_dir


@pytest.fixture(autouse=True)
def _no_attach_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The viewer's cache for roots outside a traceml/ project goes under $XDG_CACHE_HOME: never the real one.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "xdg-cache"))
    # A developer's shell may have these set; tests must not write into a real run.
    for name in ("TRACEML_RUN_DIR", "TRACEML_LOGS_DIR", "TRACEML_ROOTS", "TRACEML_STALE_AFTER_SECONDS"):
        monkeypatch.delenv(name, raising=False)
