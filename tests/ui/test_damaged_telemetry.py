"""A finished captured run whose ``aggregator/telemetry.sqlite`` was damaged afterwards (truncated,
garbage over its header, garbage inside): the run table says ``perf.telemetry`` partial with one
warning, the Performance view's answers say why their panels are empty ("telemetry database is
damaged: ..."), ``traceml summary`` and ``traceml runs show`` warn once, and nothing crashes.
The run is captured by the real ``traceml run`` on the digits example."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import capture_digits, run_traceml
from traceml_ai.diagnose.perf import read_perf_facts
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.performance import PerformanceViews
from traceml_ai.ui.reads import SHARED
from traceml_ai.ui.service import Viewer
from traceml_ai.ui.telemetry import TelemetryViews

DAMAGED = "telemetry database is damaged: "


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run folder captured by ``traceml run`` (1 rank, 1 epoch), with its final summary."""
    return capture_digits(tmp_path_factory.mktemp("captured"), "digits")


def damaged_copy(captured: Path, tmp_path: Path, damage: str) -> Path:
    root = tmp_path / "traceml" / "runs"
    run_dir = root / captured.name
    shutil.copytree(captured, run_dir)
    db = run_dir / "aggregator" / "telemetry.sqlite"
    data = db.read_bytes()
    if damage == "truncated":
        db.write_bytes(data[: len(data) // 3])
    elif damage == "emptied":
        db.write_bytes(b"")
    elif damage == "tail":  # bytes appended: the header and every page are intact, SQLite reads it
        db.write_bytes(data + b"junk!")
    elif damage == "garbage_header":
        db.write_bytes(b"\x00garbage" * 8 + data[64:])
    else:  # garbage over the pages after the first few: the header is intact
        db.write_bytes(data[:8192] + b"\xde\xad\xbe\xef" * ((len(data) - 8192) // 4))
    return run_dir


@pytest.mark.timeout(600)  # the module fixture runs a real training first
def test_the_intact_capture_is_ok_without_warnings(captured: Path) -> None:
    facts, warning = read_perf_facts(captured)
    assert facts["telemetry"] == "ok" and warning is None
    done = run_traceml("summary", str(captured))
    assert done.returncode == 0 and "damaged" not in done.stderr


@pytest.mark.parametrize("damage", ["truncated", "garbage_header", "emptied"])
def test_a_visibly_damaged_database_makes_the_run_partial_with_one_warning(captured: Path, tmp_path: Path,
                                                                           damage: str) -> None:
    run_dir = damaged_copy(captured, tmp_path, damage)
    facts, warning = read_perf_facts(run_dir)
    assert facts["telemetry"] == "partial" and facts.get("verdict")  # the summary's verdict is kept
    assert warning is not None and warning.startswith(f"aggregator/telemetry.sqlite: {DAMAGED}")

    viewer = Viewer(RunStore([run_dir.parent]), None)
    viewer.poll()
    (row,) = viewer.runs_payload(0)["runs"]
    assert row.perf["telemetry"] == "partial"
    assert [w for w in row.warnings if "telemetry.sqlite" in w] == [warning]

    summary = run_traceml("summary", str(run_dir))
    assert summary.returncode == 0, summary.stderr
    assert summary.stderr.count(DAMAGED) == 1 and "Traceback" not in summary.stderr
    # The header says what is true now, not the "ok" the summary was written with.
    assert "telemetry  partial: telemetry database is damaged" in " ".join(summary.stdout.split()).replace(
        "telemetry partial", "telemetry  partial")
    shown = run_traceml("runs", "show", run_dir.name, "--root", str(run_dir.parent))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count(DAMAGED) == 1


@pytest.mark.parametrize("damage", ["truncated", "garbage_header", "garbage_inside"])
def test_the_performance_view_says_the_database_is_damaged_in_every_panel(captured: Path, tmp_path: Path,
                                                                          damage: str) -> None:
    run_dir = damaged_copy(captured, tmp_path, damage)
    store = RunStore([run_dir.parent])
    store.poll()
    (run,) = store.runs()
    SHARED.clear()
    body = TelemetryViews().payload(run)
    perf = PerformanceViews().payload(run)
    assert body["state"] == "corrupt" and (body["detail"] or "").startswith(DAMAGED)
    # One warning for the database; the diagnoses made before the damage are still shown.
    assert [w for w in body["warnings"] if DAMAGED in w] == [f"aggregator/telemetry.sqlite: {body['detail']}"]
    assert body["diagnoses"] is not None and body["diagnoses"]["source"] == "final_summary"
    assert body["steps"] is None and body["memory"] is None and body["gpu"] is None and body["host"] is None
    assert body["logs"], "the captured output is still shown"
    assert perf["heatmap"]["state"] == "corrupt" and perf["heatmap"]["detail"] == body["detail"]
    assert perf["breakdown"] is None


def test_a_final_summary_that_cannot_be_read_is_not_called_missing(captured: Path, tmp_path: Path) -> None:
    """Issue 13 review: a truncated final_summary.json was reported as "no final_summary.json yet"."""
    root = tmp_path / "traceml" / "runs"
    run_dir = root / captured.name
    shutil.copytree(captured, run_dir)
    final = run_dir / "aggregator" / "final_summary.json"
    final.write_bytes(final.read_bytes()[:200])
    done = run_traceml("summary", str(run_dir))
    assert done.returncode == 0, done.stderr
    assert "warning: aggregator/final_summary.json cannot be read (damaged): not valid JSON" in done.stderr
    words = " ".join(done.stdout.split())
    assert "(final_summary.json cannot be read)" in words and "no final_summary.json yet" not in words


@pytest.mark.parametrize("damage", ["truncated", "garbage_header", "garbage_inside"])
def test_compare_and_plot_refuse_a_damaged_database_in_the_viewers_words(captured: Path, tmp_path: Path,
                                                                          damage: str) -> None:
    """Issue 13 review: ``traceml compare`` blamed "too few samples" and ``traceml plot --telemetry``
    saved a picture of nothing, both exiting 0."""
    run_dir = damaged_copy(captured, tmp_path, damage)
    for a, b, side in ((captured, run_dir, "B"), (run_dir, captured, "A")):
        done = run_traceml("compare", str(a), str(b))
        assert done.returncode == 1, done.stdout + done.stderr
        line = done.stderr.strip()
        assert "\n" not in line and "Traceback" not in line and done.stdout == ""
        assert line.startswith(f"error: nothing to compare: run {side} ({captured.name}): "
                               f"aggregator/telemetry.sqlite: {DAMAGED}"), line
        assert "too few samples" not in line
    for panel, fmt in (("step", "png"), ("memory", "csv")):
        done = run_traceml("plot", str(run_dir), "--telemetry", panel, "--format", fmt,
                           "--cache-dir", str(tmp_path / "cache"))
        assert done.returncode == 1, done.stdout + done.stderr
        line = done.stderr.strip()
        assert line.startswith(f"error: digits: aggregator/telemetry.sqlite: {DAMAGED}"), line
        assert line.endswith("; nothing to draw") and "\n" not in line
        assert done.stdout == ""
    assert not (tmp_path / "cache" / "plots").exists() or not list((tmp_path / "cache" / "plots").iterdir())


def test_compare_and_plot_warn_and_go_on_when_the_damaged_database_still_reads(captured: Path,
                                                                                tmp_path: Path) -> None:
    run_dir = damaged_copy(captured, tmp_path, "tail")
    done = run_traceml("compare", str(captured), str(run_dir), "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["unusable"] == [] and any(m["verdict"] != "inconclusive" for m in doc["metrics"])
    assert done.stderr.count(DAMAGED) == 1
    assert f"B: aggregator/telemetry.sqlite: {DAMAGED}truncated" in done.stderr
    assert "compared on the rows still readable" in done.stderr
    done = run_traceml("plot", str(run_dir), "--telemetry", "step", "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_file()
    assert done.stderr.count(DAMAGED) == 1 and "drawn from the rows still readable" in done.stderr
