"""The viewer's state between requests (traceml_ai.ui.service): versions, the table answers it keeps,
the run database it writes (003 seed, "Live refresh", "The run database")."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import orjson
import pytest

from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer, run_row


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ws") / "traceml" / "runs"
    generate(root, runs=24, seed=0)
    return root


@pytest.fixture
def work(fake_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "traceml" / "runs"
    shutil.copytree(fake_root, root, symlinks=True)
    return root


def _viewer(root: Path) -> Viewer:
    return Viewer(RunStore([root]), CacheFolder(root.parent / ".cache", roots=[root]))


def test_a_viewer_started_from_the_run_database_rewrites_it_only_for_what_changed(work: Path) -> None:
    first = _viewer(work)
    first.poll()
    first.close()
    db = work.parent / ".cache" / "runs.sqlite"
    written = os.stat(db)

    again = _viewer(work)
    again.start()
    assert len(again.runs_payload(0)["runs"]) == 24
    again.poll()  # re-checks every run by stat: nothing changed
    again.close()
    same = os.stat(db)  # not rewritten
    assert (same.st_ino, same.st_mtime_ns, same.st_size) == (written.st_ino, written.st_mtime_ns, written.st_size)

    baseline = next(p for p in work.iterdir() if "_baseline_" in p.name)
    meta = json.loads((baseline / "run.json").read_text())
    (baseline / "run.json").write_text(json.dumps({**meta, "notes": "changed on disk"}))
    st = os.stat(baseline / "run.json")
    os.utime(baseline / "run.json", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    third = _viewer(work)
    third.start()
    third.poll(refresh=True)
    third.close()
    now = os.stat(db)  # rewritten: the changed run in the file itself (few runs changed)
    assert (now.st_ino, now.st_mtime_ns, now.st_size) != (written.st_ino, written.st_mtime_ns, written.st_size)
    loaded = CacheFolder(work.parent / ".cache", roots=[work]).load_run_db()
    assert loaded is not None
    assert loaded.runs[os.path.realpath(baseline)].summary.notes == "changed on disk"


def test_a_warm_start_takes_its_column_facts_from_the_database_and_they_follow_later_changes(work: Path) -> None:
    # Issue 16: the column index is saved with the runs, so a warm start walks no run's params;
    # its columns are those of a viewer that read every run folder, before and after a change.
    first = _viewer(work)
    first.poll()
    cold = first.table_payload()["columns"]
    first.close()

    warm = _viewer(work)
    warm.start()
    assert warm.table_payload()["columns"] == cold
    assert warm._columns.shapes_computed == 0

    baseline = next(p for p in work.iterdir() if "_baseline_" in p.name)
    (baseline / "params.yaml").write_text("optim:\n  lr: auto\nbrand_new: 3\n")
    st = os.stat(baseline / "params.yaml")
    os.utime(baseline / "params.yaml", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    warm.poll(refresh=True)
    columns = warm.table_payload()["columns"]
    warm.close()
    fresh = Viewer(RunStore([work]), None)
    fresh.poll()
    assert columns == fresh.table_payload()["columns"]
    assert "config.brand_new" in columns["available"] and "config.optim.lr" not in columns["numeric"]

    # The database written at that close holds the changed runs' index: the next start agrees too.
    # (The database wrote the changed run last; a seeded store still lists the runs as a poll does.)
    third = _viewer(work)
    third.start()
    assert [r.key for r in third.store.runs()] == [r.key for r in fresh.store.runs()]
    got = third.table_payload()["columns"]
    assert got == columns
    assert third._columns.shapes_computed == 0
    third.close()


def test_table_answers_follow_the_version(work: Path) -> None:
    viewer = _viewer(work)
    viewer.poll()
    first = viewer.table_payload()
    assert viewer.table_payload() is first  # the same question at the same version
    key = first["keys"][0]
    viewer.set_hidden([key], True)  # a new version
    after = viewer.table_payload()
    assert after["version"] > first["version"] and key not in after["keys"] and after["total"] == 23
    assert key in viewer.table_payload(show_hidden=True)["keys"]


def test_run_rows_encode_as_the_documented_run_row(work: Path) -> None:
    viewer = _viewer(work)
    viewer.poll()
    failed = next(r for r in viewer.store.runs() if r.name == "failed-run")
    row = orjson.loads(orjson.dumps(run_row(failed)))
    assert list(row) == [
        "key", "id", "name", "group", "tags", "notes", "status", "display_status", "legacy", "started_at",
        "ended_at", "heartbeat_at", "duration_s", "step", "epoch", "path", "root", "warnings", "error", "params",
        "start", "last", "best", "summary", "metric_names", "perf", "catalog_run", "duration_derived",
    ]
    assert row["path"] == row["key"] == failed.key
    assert set(row["error"]) == {"type", "message", "code", "signal"} and row["error"]["type"]
    best = next(iter(row["best"].values()))
    assert set(best) == {"value", "step", "epoch", "mode"}


def test_perf_columns_come_from_the_final_summary_and_a_no_change_poll_reads_nothing(work: Path) -> None:
    from tests.diagnose.telemetry_db import HEALTHY_CPU, RunSpec, write_run
    from traceml_ai.diagnose.summary import write_final_summary
    from traceml_ai.telemetry import schema

    baseline = next(p for p in work.iterdir() if "_baseline_" in p.name)
    write_run(baseline, RunSpec(steps=60, phases=lambda r, s: {**HEALTHY_CPU, schema.DATALOADER_NEXT: 40.0}))
    write_final_summary(baseline)
    key = os.path.realpath(baseline)
    viewer = _viewer(work)
    viewer.poll()
    rows = {r.key: r for r in viewer.runs_payload(0)["runs"]}
    assert rows[key].perf["verdict"] == "input_bound" and rows[key].perf["telemetry"] == "ok"
    assert sum(1 for r in rows.values() if r.perf) == 1  # the other runs were not captured
    body = viewer.table_payload(sorts=["-perf.share.dataloader"])
    assert body["keys"][0] == key
    assert "perf.verdict" in body["columns"]["default"] and "perf.share.dataloader" in body["columns"]["numeric"]
    version, reads = viewer.version, viewer.perf.reads
    viewer.poll()
    assert viewer.version == version and viewer.perf.reads == reads  # nothing changed, nothing read
    viewer.close()

    # A start from the run database shows the facts before any poll, and its poll rewrites nothing.
    db = work.parent / ".cache" / "runs.sqlite"
    written = os.stat(db)
    again = _viewer(work)
    again.start()
    assert {r.key: r for r in again.runs_payload(0)["runs"]}[key].perf["verdict"] == "input_bound"
    again.poll()
    again.close()
    assert os.stat(db).st_ino == written.st_ino

    # The summary changes on disk (a re-diagnosis): a poll leaves the finished run alone, Refresh
    # reads it and the version moves.
    summary = baseline / "aggregator" / "final_summary.json"
    doc = json.loads(summary.read_text())
    third = _viewer(work)
    third.start()
    third.poll()
    summary.write_text(json.dumps({**doc, "findings": []}))
    version = third.version
    third.poll()
    assert third.version == version
    third.poll(refresh=True)
    assert third.version > version
    assert third.runs_by_keys([key])[0].perf["verdict"] == "healthy"


def test_a_final_summary_written_after_the_first_poll_shows_at_a_later_no_change_poll(work: Path) -> None:
    # Polls that cost what changed (issue 16) still check a finished captured run whose final
    # summary is not there yet: the aggregator writes it after the run ended.
    from tests.diagnose.telemetry_db import HEALTHY_CPU, RunSpec, write_run
    from traceml_ai.diagnose.summary import write_final_summary
    from traceml_ai.telemetry import schema

    baseline = next(p for p in work.iterdir() if "_baseline_" in p.name)
    write_run(baseline, RunSpec(steps=60, phases=lambda r, s: {**HEALTHY_CPU, schema.DATALOADER_NEXT: 40.0}))
    key = os.path.realpath(baseline)
    viewer = _viewer(work)
    viewer.poll()
    assert viewer.runs_by_keys([key])[0].perf.get("verdict") != "input_bound"
    viewer.poll()
    write_final_summary(baseline)
    viewer.poll()
    assert viewer.runs_by_keys([key])[0].perf["verdict"] == "input_bound"


def test_a_run_captured_after_the_database_was_written_gets_its_perf_columns_at_the_start(work: Path) -> None:
    # A start from runs.sqlite skips the perf check of finished, uncaptured runs whose folder did not
    # change (issue 16); a run that gained an aggregator/ folder moved its folder's stamp and is read.
    from tests.diagnose.telemetry_db import HEALTHY_CPU, RunSpec, write_run
    from traceml_ai.diagnose.summary import write_final_summary
    from traceml_ai.telemetry import schema

    first = _viewer(work)
    first.poll()
    first.close()
    baseline = next(p for p in work.iterdir() if "_baseline_" in p.name)
    write_run(baseline, RunSpec(steps=60, phases=lambda r, s: {**HEALTHY_CPU, schema.DATALOADER_NEXT: 40.0}))
    write_final_summary(baseline)
    again = _viewer(work)
    again.start()
    again.poll()
    rows = {r.key: r for r in again.runs_payload(0)["runs"]}
    assert rows[os.path.realpath(baseline)].perf["verdict"] == "input_bound"
    assert sum(1 for r in rows.values() if r.perf) == 1
    assert len(again.store.unchanged_since_seed()) >= 15  # the finished runs nobody touched


def test_two_thousand_metric_keys_stay_searchable_and_the_default_columns_bounded(tmp_path: Path) -> None:
    # Tracker UIs froze at thousands of metric columns (issue 16): every key stays available for
    # the column chooser, the columns shown before the user picks stay few.
    from tests.runs.test_store import write_run
    from traceml_ai.runs.column_index import MAX_DEFAULT_VALUE_COLUMNS

    root = tmp_path / "runs"
    for n in range(20):
        best = {f"probe{n}/m{i}": {"value": float(i), "step": 1} for i in range(50)}
        summary = {f"probe{n}/s{i}": float(i) for i in range(50)}
        write_run(root, f"20260921-1200{n:02d}_r{n}_{n:04x}", metrics={"step": 1, "best": best, "summary": summary})
    viewer = Viewer(RunStore([root]), None)
    viewer.poll()
    columns = viewer.table_payload()["columns"]
    logged = [c for c in columns["available"] if c.startswith(("run.best.", "summary."))]
    assert len(logged) == 2000
    assert sum(c.startswith(("run.best.", "summary.")) for c in columns["default"]) == MAX_DEFAULT_VALUE_COLUMNS
    assert columns["shown"] == columns["default"] and columns["default"][:2] == ["name", "status"]
    chosen = viewer.table_payload(columns=["name", "summary.probe19/s49"])["columns"]["shown"]
    assert chosen == ["name", "summary.probe19/s49"]


def test_differing_params_follow_the_rows_not_their_order(work: Path) -> None:
    viewer = _viewer(work)
    viewer.poll()
    everything = viewer.table_payload()["differing"]
    assert "config.optim.lr" in everything
    assert viewer.table_payload(sorts=["name"])["differing"] == everything
    one = viewer.table_payload(filters=["name:/^baseline$/"])
    assert one["shown"] == 1 and one["differing"] == []
    assert viewer.table_payload(filters=["name:/^baseline$/"], sorts=["-started"])["differing"] == []
    assert viewer.table_payload(group="group")["differing"] == everything
