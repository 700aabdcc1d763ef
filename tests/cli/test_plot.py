"""`traceml plot`, run as a real command: the viewer's chart export from the command line."""

from __future__ import annotations

import csv
import io
import struct
from pathlib import Path

import pytest

from tests.conftest import run_traceml
from traceml_ai.runs.fake import generate


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ws") / "traceml" / "runs"
    generate(root, runs=12, seed=0)
    return root


def test_plot_writes_a_300_dpi_png_beside_the_runs(fake_root: Path) -> None:
    pytest.importorskip("matplotlib")
    proc = run_traceml("plot", "baseline", "high-lr", "--metric", "val/auc", "--ema", "0.6", "--log-y",
                       "--root", str(fake_root))
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path.parent == fake_root.parent / ".cache" / "plots"
    assert path.name.startswith("plot-val-auc-") and path.suffix == ".png"
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    phys = data.index(b"pHYs")
    assert struct.unpack(">IIB", data[phys + 4 : phys + 13]) == (11811, 11811, 1)


def test_plot_csv_is_the_full_history_in_the_cache_dir_given(fake_root: Path, tmp_path: Path) -> None:
    run_folder = next(p for p in fake_root.iterdir() if "_baseline_" in p.name)
    proc = run_traceml("plot", str(run_folder), "--metric", "val/auc", "--metric", "train/loss", "--x", "epoch",
                       "--format", "csv", "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path.parent == tmp_path / "cache" / "plots" and path.name.startswith("plot-val-auc-train-loss-")
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert rows[0] == ["run", "path", "step", "epoch", "time_s", "val/auc", "train/loss"]
    logged = [line for line in (run_folder / "metrics.jsonl").read_text().splitlines()
              if '"val/auc"' in line or '"train/loss"' in line]
    assert len(rows) - 1 == len(logged)
    assert {row[0] for row in rows[1:]} == {"baseline"}


def test_plot_errors_are_one_line(fake_root: Path) -> None:
    proc = run_traceml("plot", "baseline", "--metric", "no/such", "--root", str(fake_root))
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "no/such" in proc.stderr and "val/auc" in proc.stderr
    proc = run_traceml("plot", "no-such-run", "--metric", "val/auc", "--root", str(fake_root))
    assert proc.returncode == 1 and "no-such-run" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_traceml("plot", "baseline", "--metric", "val/auc", "--ema", "1.5", "--root", str(fake_root))
    assert proc.returncode == 2
    proc = run_traceml("plot", "baseline", "--metric", "val/auc", "--x", "wall", "--root", str(fake_root))
    assert proc.returncode == 2
