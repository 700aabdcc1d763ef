"""finalization_warning.json: written only when something was lost, and it says what (DESIGN §3.2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceml_ai.aggregator.finalize import WARNING_NAME, finalize, loss_report
from traceml_ai.aggregator.stats import IngestStats
from traceml_ai.aggregator.store import StoreStats


def clean_run(world_size: int = 2) -> IngestStats:
    stats = IngestStats()
    for rank in range(world_size):
        r = stats.rank(rank)
        r.hellos, r.batches, r.rows, r.finished, r.sent_batches, r.dropped_batches = 1, 5, 50, True, 5, 0
    return stats


def test_nothing_lost_means_no_file(tmp_path: Path) -> None:
    called: list[Path] = []
    assert finalize(tmp_path, clean_run(), StoreStats(), session_id="s", world_size=2,
                    on_finalized=called.append) is None
    assert not (tmp_path / "aggregator" / WARNING_NAME).exists()
    assert called == [tmp_path]  # the diagnose hook runs either way


def test_discarded_steps_are_not_a_telemetry_loss(tmp_path: Path) -> None:
    from traceml_ai.aggregator.__main__ import step_counts

    stats = clean_run()
    stats.ranks[0].step_counts = {"discarded_steps": 2, "dropped_updates": 0, "dropped_micro_batches": 0}
    stats.ranks[1].step_counts = {"discarded_steps": 1, "dropped_updates": 1, "dropped_micro_batches": 3}
    # The user's loop caught an exception inside trace_step: counted in the summary, not a loss.
    assert finalize(tmp_path, stats, StoreStats(), session_id="s", world_size=2) is None
    assert step_counts(stats) == {"discarded_steps": 3, "dropped_updates": 1, "dropped_micro_batches": 3}
    assert step_counts(clean_run()) is None  # no rank reported any


def test_missing_ranks_dropped_and_undelivered_batches(tmp_path: Path) -> None:
    stats = clean_run(3)
    stats.ranks[1].dropped_batches = 4
    stats.ranks[2].finished, stats.ranks[2].sent_batches = False, None   # connected, never finished
    stats.rank(0).sent_batches = 8                                          # sent 8, 5 arrived
    path = finalize(tmp_path, stats, StoreStats(), session_id="s1", world_size=5, world_size_source="argument")
    assert path == tmp_path / "aggregator" / WARNING_NAME
    report = json.loads(path.read_text())
    assert report["session_id"] == "s1" and report["schema_version"] == 1
    assert report["world_size"] == 5 and report["world_size_source"] == "argument"
    assert report["missing_ranks"] == {"never_connected": [3, 4], "never_finished": [2]}
    assert report["dropped_batches"] == {"1": 4}
    assert report["undelivered_batches"] == {"0": 3}
    assert report["ranks"]["1"]["dropped_batches"] == 4 and report["ranks"]["0"]["rows"] == 50
    assert len(report["summary"]) == 4
    assert [p.name for p in path.parent.iterdir()] == [WARNING_NAME]  # no temporary file left behind


def test_output_lines_and_rows_a_rank_dropped_before_sending_are_reported() -> None:
    stats = clean_run(2)
    stats.ranks[1].dropped_output_lines = 12
    stats.ranks[0].lost_rows = {"step_time": 3, "step_memory": 3}
    report = loss_report(stats, StoreStats(), session_id="s", world_size=2)
    assert report is not None
    assert report["dropped_output_lines"] == {"1": 12}
    assert report["lost_rows"] == {"0": {"step_memory": 3, "step_time": 3}}
    assert report["ranks"]["1"]["dropped_output_lines"] == 12
    assert "rank 0 dropped 3 step_time rows before sending (its hand-off queue was full)" in report["summary"]
    assert "rank 1 dropped 12 stdout/stderr lines (its output buffer was full)" in report["summary"]


def test_rows_a_rank_could_not_encode_are_reported_as_such_not_as_a_full_queue() -> None:
    """Review 11d: an integer beyond 64 bits was reported as "its send queue was full"."""
    stats = clean_run(1)
    stats.ranks[0].unencodable_rows = {"process": 2}
    report = loss_report(stats, StoreStats(), session_id="s", world_size=1)
    assert report is not None and report["unencodable_rows"] == {"0": {"process": 2}}
    assert report["summary"] == ["rank 0 left out 2 process rows it could not encode (a value msgpack cannot "
                                 "hold, e.g. an integer beyond 64 bits)"]
    assert report["dropped_batches"] == {}


def test_rejected_frames_projection_and_sqlite_losses_are_reported() -> None:
    stats = clean_run()
    stats.reject(0, "rank 0: payload of session 'old'", batch=True)
    stats.reject(None, "no hello within 30 s", known=False)
    stats.projection_skipped = 3
    stats.unknown_streams = {"kernels": 7}
    store = StoreStats(errors=1, lost_rows=500, messages=["flush of 500 rows failed: disk I/O error"])
    report = loss_report(stats, store, session_id="s", world_size=2)
    assert report is not None
    assert report["rejected_frames"] == {"total": 2, "by_rank": {"0": 1, "unknown": 1},
                                         "reasons": ["rank 0: payload of session 'old'", "no hello within 30 s"]}
    assert report["projection"] == {"skipped": 3, "unknown_streams": {"kernels": 7}, "failures": []}
    assert report["sqlite"] == {"errors": 1, "lost_rows": 500, "messages": ["flush of 500 rows failed: disk I/O error"]}
    assert report["missing_ranks"] == {"never_connected": [], "never_finished": []}


def test_without_a_world_size_only_unfinished_ranks_are_missing() -> None:
    stats = clean_run(1)
    none_rank = stats.rank(None)
    none_rank.hellos = 1
    report = loss_report(stats, StoreStats(), session_id="s")
    assert report is not None
    assert report["missing_ranks"] == {"never_connected": [], "never_finished": ["unknown"]}
    assert report["world_size"] is None and report["world_size_source"] is None


@pytest.mark.parametrize("lost", [True, False])
def test_an_extra_block_is_included_and_can_be_the_loss(lost: bool) -> None:
    export = {"exporter_failed": lost, "failed_records": 10 if lost else 0}
    report = loss_report(clean_run(), StoreStats(), session_id="s", world_size=2, extra={"export": export},
                         extra_lost=lost)
    assert (report is not None) == lost
    if report is not None:
        assert report["export"] == export


def test_a_failing_hook_does_not_stop_finalization(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def hook(run_dir: Path) -> None:
        raise RuntimeError("diagnose failed")

    stats = clean_run()
    stats.ranks[0].dropped_batches = 1
    assert finalize(tmp_path, stats, StoreStats(), session_id="s", world_size=2, on_finalized=hook) is not None
    err = capsys.readouterr().err
    assert err.startswith("[TraceML]") and "diagnose failed" in err and err.count("\n") == 1
