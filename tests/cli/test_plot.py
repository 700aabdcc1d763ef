"""`traceml plot`, run as a real command: the viewer's chart export from the command line."""

from __future__ import annotations

import csv
import io
import struct
from pathlib import Path

import pytest

from tests.conftest import capture_digits, run_traceml
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


def test_plot_usage_errors_exit_2_in_one_line_naming_the_choices(fake_root: Path) -> None:
    """Issue 13 review: usage errors exited 1, --share was silently ignored off --telemetry step, and a
    bad --telemetry printed a validator's text."""
    def usage(*args: str) -> str:
        proc = run_traceml("plot", *args, "--root", str(fake_root))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
        return proc.stderr

    err = usage("baseline", "--telemetry", "heat")
    assert "'heat' is not one of: step, ranks, memory, gpu" in err and "Value error" not in err
    assert "not one of: png, csv" in usage("baseline", "--metric", "val/auc", "--format", "svg")
    assert "--share applies to --telemetry step only" in usage("baseline", "--telemetry", "ranks", "--share")
    assert "--share applies to --telemetry step only" in usage("baseline", "--metric", "val/auc", "--share")
    assert "not both" in usage("baseline", "--telemetry", "step", "--metric", "val/auc")
    assert "one run" in usage("baseline", "high-lr", "--telemetry", "step")
    assert "give a metric" in usage("baseline")
    # A --metric chart's options are refused by a --telemetry panel, never silently ignored.
    for opts, named in ((["--log-y"], "--log-y shapes a --metric chart only"),
                        (["--x", "time"], "--x shapes a --metric chart only"),
                        (["--ema", "0.6", "--log-y"], "--ema, --log-y shape a --metric chart only")):
        assert named in usage("baseline", "--telemetry", "step", *opts)
    assert "--x shapes a --metric chart only" in usage("baseline", "--telemetry", "memory", "--x", "step")


# -- --telemetry: a panel of the Performance view, on a real captured run (issue 13 item 4) ----------


@pytest.fixture(scope="module")
def captured_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A runs root holding one run ``traceml run`` captured: the digits example on 2 ranks with the
    planted straggler, beside a run that was not captured."""
    root = capture_digits(tmp_path_factory.mktemp("captured"), "lagging", ranks=2, plant="straggler").parent
    generate(root, runs=1, seed=4)
    return root


def png_dpi_of(data: bytes) -> tuple[int, int, int]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    phys = data.index(b"pHYs")
    x, y, unit = struct.unpack(">IIB", data[phys + 4 : phys + 13])
    return x, y, unit


@pytest.mark.parametrize("panel", ["step", "ranks", "memory", "gpu"])
def test_plot_telemetry_writes_each_panel_as_a_300_dpi_png(captured_root: Path, panel: str) -> None:
    pytest.importorskip("matplotlib")
    proc = run_traceml("plot", "lagging", "--telemetry", panel, "--root", str(captured_root))
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip())
    assert path.parent == captured_root.parent / ".cache" / "plots"
    assert path.name.startswith(f"plot-lagging-telemetry-{panel}-") and path.suffix == ".png"
    assert png_dpi_of(path.read_bytes()) == (11811, 11811, 1)


def test_plot_telemetry_csv_holds_the_numbers_of_traceml_summary(captured_root: Path, tmp_path: Path) -> None:
    import json
    import statistics

    from traceml_ai.diagnose.thresholds import WARMUP_STEPS

    (run_folder,) = [p for p in captured_root.iterdir() if "_lagging_" in p.name]
    summary = json.loads(run_traceml("summary", str(run_folder), "--json").stdout)
    proc = run_traceml("plot", str(run_folder), "--telemetry", "ranks", "--format", "csv",
                       "--cache-dir", str(tmp_path / "cache"))
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(Path(proc.stdout.strip()).read_text(encoding="utf-8"))))
    assert len(rows) == summary["steps"]["seen"]
    first = int(rows[0]["step"])
    for r in summary["step_time"]["per_rank"]:
        for column, key in ((f"rank_{r['rank']}_ms", "median_ms"),
                            (f"rank_{r['rank']}_outside_backward_ms", "outside_backward_median_ms")):
            values = [float(x[column]) for x in rows if int(x["step"]) >= first + WARMUP_STEPS and x[column]]
            assert statistics.median(values) == pytest.approx(r[key], rel=1e-4), column
    # the step panel: one row per step, the phases of the rank the job waited for add up to its step
    proc = run_traceml("plot", str(run_folder), "--telemetry", "step", "--format", "csv",
                       "--cache-dir", str(tmp_path / "cache"))
    steps = list(csv.DictReader(io.StringIO(Path(proc.stdout.strip()).read_text(encoding="utf-8"))))
    assert len(steps) == summary["steps"]["seen"]
    phases = [c for c in steps[0] if c.endswith("_ms") and c != "iteration_ms"]
    assert "other_ms" in phases and "backward_ms" in phases
    for x in steps:
        assert sum(float(x[c] or 0) for c in phases) == pytest.approx(float(x["iteration_ms"]), rel=1e-3)


def test_plot_telemetry_errors_are_one_line(captured_root: Path) -> None:
    fake = str(next(p for p in captured_root.iterdir() if "_lagging_" not in p.name))
    proc = run_traceml("plot", fake, "--telemetry", "ranks", "--root", str(captured_root))
    assert proc.returncode == 1 and "not captured" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    proc = run_traceml("plot", "lagging", fake, "--telemetry", "ranks", "--root", str(captured_root))
    assert proc.returncode == 2 and "one run" in proc.stderr  # usage errors exit 2
    proc = run_traceml("plot", "lagging", "--telemetry", "ranks", "--metric", "val/acc", "--root", str(captured_root))
    assert proc.returncode == 2 and "not both" in proc.stderr
    proc = run_traceml("plot", "lagging", "--telemetry", "heat", "--root", str(captured_root))
    assert proc.returncode == 2  # not a panel: the usage error lists the choices
    assert "step" in proc.stderr and "gpu" in proc.stderr


def test_a_mistyped_run_folder_path_is_named_as_such_by_every_command(tmp_path: Path) -> None:
    """Review 13c: ``traceml plot broken/nonexist --telemetry step`` said "no runs folder found"
    (the default root), not that the path it was given does not exist."""
    for args in (("plot", "broken/nonexist", "--telemetry", "step"), ("plot", "broken/nonexist", "--metric", "a"),
                 ("runs", "show", "broken/nonexist"), ("summary", "broken/nonexist")):
        proc = run_traceml(*args, cwd=tmp_path)
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stderr.strip() == "error: broken/nonexist is not a folder", (args, proc.stderr)


def _renamed_copy(run_folder: Path, root: Path, name: str) -> Path:
    """A copy of ``run_folder`` in ``root`` whose run.json names it ``name``."""
    import json
    import shutil

    copy = root / run_folder.name
    shutil.copytree(run_folder, copy)
    meta = json.loads((copy / "run.json").read_text())
    meta["name"] = name
    (copy / "run.json").write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize("kind", ["telemetry", "metric"])
def test_a_run_name_the_font_cannot_draw_is_one_line_not_a_warning_per_glyph(
        captured_root: Path, fake_root: Path, tmp_path: Path, kind: str) -> None:
    """Review 13f: ``plot 'ddp-日本語 ✓' --telemetry ranks`` printed three matplotlib UserWarnings
    (one per missing glyph, with a source line each); a command's problem is one line."""
    pytest.importorskip("matplotlib")
    root = tmp_path / "traceml" / "runs"
    if kind == "telemetry":
        source = next(p for p in captured_root.iterdir() if "_lagging_" in p.name)
        copy = _renamed_copy(source, root, "ddp-日本語")
        proc = run_traceml("plot", str(copy), "--telemetry", "ranks")
    else:
        source = next(p for p in fake_root.iterdir() if "_baseline_" in p.name)
        copy = _renamed_copy(source, root, "ddp-日本語")
        proc = run_traceml("plot", str(copy), "--metric", "val/auc")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).suffix == ".png"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "UserWarning" not in proc.stderr and "Glyph" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and "the font has no glyph for 日, 本, 語: drawn as boxes" in lines[0], proc.stderr


def test_plot_output_writes_the_file_where_asked(fake_root: Path, captured_root: Path, tmp_path: Path) -> None:
    """Review 13f: ``plot -o`` was "No such option"; the file could only go to the cache folder."""
    pytest.importorskip("matplotlib")
    target = tmp_path / "auc.png"
    proc = run_traceml("plot", "baseline", "--metric", "val/auc", "--root", str(fake_root), "-o", str(target))
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == target and target.read_bytes().startswith(b"\x89PNG")
    folder = tmp_path / "plots"
    folder.mkdir()
    proc = run_traceml("plot", "lagging", "--telemetry", "ranks", "--format", "csv", "--root", str(captured_root),
                       "--output", str(folder))
    assert proc.returncode == 0, proc.stderr
    written = Path(proc.stdout.strip())
    assert written.parent == folder and written.name.startswith("plot-lagging-telemetry-ranks-")
    assert written.read_text().startswith("step,rank_0_ms,rank_1_ms")
    proc = run_traceml("plot", "baseline", "--metric", "val/auc", "--root", str(fake_root),
                       "-o", str(tmp_path / "x.png"), "--format", "csv")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: --output {tmp_path / 'x.png'} ends in .png but --format csv writes .csv"), proc.stderr
    proc = run_traceml("plot", "baseline", "--metric", "val/auc", "--root", str(fake_root),
                       "-o", str(tmp_path / "nowhere" / "a.png"))
    assert proc.returncode == 1 and "the folder" in proc.stderr and "does not exist" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
