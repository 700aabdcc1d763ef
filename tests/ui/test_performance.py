"""``GET /api/runs/{key}/performance``: each rank's step time over the steps, for the Performance
view's heatmap (issue 13 item 2), from a real telemetry database."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.diagnose.telemetry_db import HEALTHY_CPU, T0_NS, RunSpec, TelemetryDB, cpu_events, write_run
from traceml_ai.diagnose.thresholds import WARMUP_STEPS
from traceml_ai.runs.model import RunSummary
from traceml_ai.ui.performance import PerformanceViews, heatmap


def test_the_heatmap_buckets_each_ranks_steps_and_shows_the_slow_rank(tmp_path: Path) -> None:
    db = write_run(tmp_path / "run", RunSpec(ranks=2, steps=100, noise=0.0,
                                             phases=lambda r, s: {**HEALTHY_CPU, "other": 10.0 if r else 0.5}))
    hm = heatmap(str(db), max_buckets=30)
    assert hm["state"] == "ok" and hm["ranks"] == [0, 1]
    assert hm["first_step"] == 0 and hm["bucket_steps"] == math.ceil(100 / 30)
    assert [len(row) for row in hm["z"]] == [math.ceil(100 / hm["bucket_steps"])] * 2
    fast, slow = (np.array(row, dtype=float) for row in hm["z"])
    assert np.all(slow - fast == np.float64(9.5).round(4))  # rank 1's extra 9.5 ms in every bucket
    assert hm["warmup_steps"] == WARMUP_STEPS
    whole = heatmap(str(db))
    assert whole["bucket_steps"] == 1 and len(whole["z"][0]) == 100


def test_the_heatmaps_last_bucket_ends_at_the_runs_last_step(tmp_path: Path) -> None:
    """1,001 steps in buckets of 5: the 201st bucket holds one step (1000), and the answer says the
    axis ends there, not at 1004 (review 13c: "step 17279" under a run that ended at 17243)."""
    db = write_run(tmp_path / "run", RunSpec(ranks=1, steps=1001, noise=0.0, phases=lambda r, s: HEALTHY_CPU))
    hm = heatmap(str(db), max_buckets=240)
    assert hm["bucket_steps"] == 5 and len(hm["z"][0]) == 201
    assert (hm["first_step"], hm["last_step"]) == (0, 1000)
    assert hm["z"][0][-1] is not None  # the narrow last bucket holds step 1000's time


def test_a_sampled_long_run_still_ends_its_charts_at_its_last_step(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 13d: a run read one step in 40 ended its heatmap at step 99,960 and its phase chart
    at 99,920, not at its last step 99,999 (the read keeps the last rows written)."""
    from traceml_ai.diagnose import thresholds
    from traceml_ai.ui.performance import breakdown

    monkeypatch.setattr(thresholds, "MAX_STEP_ROWS", 640)
    db = tmp_path / "run" / "aggregator" / "telemetry.sqlite"
    out = TelemetryDB(db)
    for step in range(1999):  # the ranks' rows interleaved, in the order they arrive
        for rank in (0, 1):
            out.step(rank, step, cpu_events({**HEALTHY_CPU, "traceml:step": 15.0 + rank}),
                     ts_ns=T0_NS + step * 10**7, world_size=2, seq=step)
    out.close()
    hm = heatmap(str(db), max_buckets=240)
    assert (hm["first_step"], hm["last_step"]) == (0, 1998)
    b = breakdown(str(db), max_points=100)
    assert b is not None and b["bucket_steps"] > 1 and b["last_step"] == 1998
    assert b["x"][-1] < 1998  # the last bucket starts before it


def test_a_missing_or_corrupt_database_says_why(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r"
    (run_dir / "aggregator").mkdir(parents=True)
    run = RunSummary(key=str(run_dir), id="r", root=str(tmp_path / "runs"), name="r")
    views = PerformanceViews()
    assert views.payload(run)["heatmap"]["state"] == "missing"
    (run_dir / "aggregator" / "telemetry.sqlite").write_bytes(b"not a database at all" * 100)
    hm = views.payload(run)["heatmap"]
    assert hm["state"] == "corrupt" and hm["z"] == [] and hm["detail"]
    plain = RunSummary(key=str(tmp_path / "runs" / "plain"), id="plain", root=str(tmp_path / "runs"), name="plain")
    assert views.payload(plain)["heatmap"]["state"] == "none"


def test_answers_are_cached_until_the_database_changes(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r"
    write_run(run_dir, RunSpec(steps=30))
    run = RunSummary(key=str(run_dir), id="r", root=str(tmp_path / "runs"), name="r")
    views = PerformanceViews()
    first = views.payload(run)
    assert views.payload(run) is first and views.reads == 1
    write_run(run_dir, RunSpec(steps=30, seed=1))  # more rows: the file's size changes
    assert views.payload(run) is not first and views.reads == 2


def test_the_breakdown_shows_one_rank_the_summarys_slowest_and_its_phases_add_up(tmp_path: Path) -> None:
    """Issue 13 review: the panel's rank flipped from step to step (the per-step slowest). It shows
    one rank at every step, the final summary's worst_rank (the straggler measure), and says so."""
    from traceml_ai.diagnose.readers import read_telemetry
    from traceml_ai.diagnose.summary import summarise
    from traceml_ai.telemetry import schema
    from traceml_ai.ui.performance import breakdown

    # rank 0 is slow on even steps only, rank 1 steadily a bit slower: the per-step slowest rank
    # flips, the slowest over the run is rank 1.
    def phases(rank: int, step: int) -> dict[str, float]:
        return {**HEALTHY_CPU, schema.FORWARD: 20.0 if rank else (30.0 if step % 2 == 0 else 4.0)}

    db = write_run(tmp_path / "run", RunSpec(ranks=2, steps=40, noise=0.0, phases=phases))
    b = breakdown(str(db), max_points=1000)
    assert b is not None and b["bucket_steps"] == 1 and b["x"] == list(range(40))
    summary = summarise(read_telemetry(str(db)))
    assert summary.step_time is not None and summary.step_time.worst_rank == 1
    assert b["rank"] == 1 and b["rank_basis"] == "straggler measure"
    for i in range(len(b["x"])):
        total = sum(s["y"][i] or 0.0 for s in b["series"])
        assert total == pytest.approx(b["iteration"][i], abs=1e-3)
    forward = next(s["y"] for s in b["series"] if s["name"] == schema.FORWARD)
    assert forward == pytest.approx([20.0] * 40, abs=1e-3)  # rank 1's, at every step
    assert {s["name"] for s in b["series"]} >= {schema.FORWARD, schema.BACKWARD, "other"}
    coarse = breakdown(str(db), max_points=7)
    assert coarse is not None and coarse["bucket_steps"] == 6 and len(coarse["x"]) == len(coarse["iteration"]) == 7


def test_the_heatmap_has_the_work_outside_backward_and_the_summarys_medians(tmp_path: Path) -> None:
    """Issue 13 nit: under DDP a straggler's iteration can read lowest (the others wait for it in
    backward); its work outside backward is what the heatmap and its medians show it by."""
    from traceml_ai.diagnose.readers import read_telemetry
    from traceml_ai.diagnose.summary import summarise
    from traceml_ai.telemetry import schema

    def phases(rank: int, step: int) -> dict[str, float]:
        # rank 1 spends 12 ms more before backward; rank 0 waits those 12 ms inside backward
        return {**HEALTHY_CPU, schema.FORWARD: 4.0 + (12.0 if rank else 0.0),
                schema.BACKWARD: 7.0 + (0.0 if rank else 12.3)}

    db = write_run(tmp_path / "run", RunSpec(ranks=2, steps=90, phases=phases, noise=0.02))
    hm = heatmap(str(db), max_buckets=20)
    medians = {rank: m for rank, m in zip(hm["ranks"], hm["medians"], strict=True)}
    assert medians[1]["median_ms"] < medians[0]["median_ms"]  # the straggler's iteration reads lower ...
    assert medians[1]["outside_backward_ms"] > 2 * medians[0]["outside_backward_ms"]  # ... its own work higher
    local = np.array(hm["z_local"], dtype=float)
    assert np.all(local[1] > local[0] + 10)
    summary = summarise(read_telemetry(db)).to_dict()
    for r in summary["step_time"]["per_rank"]:
        assert medians[r["rank"]]["median_ms"] == pytest.approx(r["median_ms"], rel=1e-3)
        assert medians[r["rank"]]["outside_backward_ms"] == pytest.approx(r["outside_backward_median_ms"], rel=1e-3)


@pytest.mark.parametrize("buckets", [7, 30, 200])
def test_bucket_medians_are_the_median_of_each_buckets_steps(tmp_path: Path, buckets: int) -> None:
    from traceml_ai.diagnose.readers import read_telemetry
    from traceml_ai.diagnose.timeline import build_step_table

    db = write_run(tmp_path / "run", RunSpec(ranks=1, steps=150, noise=0.3))
    hm = heatmap(str(db), max_buckets=buckets)
    (tl,) = build_step_table(read_telemetry(db).steps, warmup_steps=0).ranks
    width = hm["bucket_steps"]
    for j, got in enumerate(hm["z"][0]):
        chunk = tl.iteration_ms[(tl.steps >= j * width) & (tl.steps < (j + 1) * width)]
        assert got == pytest.approx(round(float(np.median(chunk)), 4))


def test_the_two_answers_of_the_performance_view_share_one_read(tmp_path: Path) -> None:
    from traceml_ai.ui.reads import SharedReads

    db = write_run(tmp_path / "run", RunSpec(steps=30))
    reads = SharedReads(keep_s=60)
    first = reads.read(db)
    assert reads.read(db) is first and reads.reads == 1
    write_run(tmp_path / "run", RunSpec(steps=30, seed=1))  # the database changed: read again
    again = reads.read(db)
    assert again is not first and reads.reads == 2 and len(again.process) > len(first.process)
    assert SharedReads(keep_s=0).read(db) is not again  # kept no longer than keep_s


def test_a_live_run_is_read_again_at_most_once_per_interval(tmp_path: Path) -> None:
    from dataclasses import replace

    run_dir = tmp_path / "runs" / "r"
    write_run(run_dir, RunSpec(steps=30))
    done = RunSummary(key=str(run_dir), id="r", root=str(tmp_path / "runs"), name="r", status="completed",
                      display_status="completed")
    live = replace(done, status="running", display_status="running")
    views = PerformanceViews(live_min_interval_s=3600)
    first = views.payload(live)
    write_run(run_dir, RunSpec(steps=30, seed=1))  # the live run wrote more
    assert views.payload(live) is first and views.reads == 1  # too soon: the last answer
    assert views.payload(done) is not first and views.reads == 2  # a finished run: its stamps decide
    eager = PerformanceViews(live_min_interval_s=0, live_cost_factor=0)
    eager.payload(live)
    write_run(run_dir, RunSpec(steps=30, seed=2))
    eager.payload(live)
    assert eager.reads == 2


def test_the_compare_answer_is_traceml_compares_and_says_why_for_an_uncaptured_run(tmp_path: Path) -> None:
    from traceml_ai.diagnose.compare import compare
    from traceml_ai.telemetry import schema
    from traceml_ai.ui.performance import CompareViews

    root = tmp_path / "runs"
    write_run(root / "a", RunSpec(steps=60))
    write_run(root / "b", RunSpec(steps=60, phases=lambda r, s: {**HEALTHY_CPU, schema.DATALOADER_NEXT: 9.0}))
    (root / "plain").mkdir()
    a, b, plain = (RunSummary(key=str(root / n), id=n, root=str(root), name=n, status="completed",
                              display_status="completed") for n in ("a", "b", "plain"))
    views = CompareViews()
    got = views.payload(a, b)
    want = compare(root / "a", root / "b").to_dict()
    assert [(m["metric"], m["verdict"], m["ratio"]) for m in got["metrics"]] == \
        [(m["metric"], m["verdict"], m["ratio"]) for m in want["metrics"]]
    assert next(m for m in got["metrics"] if m["metric"] == "dataloader_next_ms")["verdict"] == "regression"
    assert got["run_a"] == "a" and got["run_b"] == "b" and got["live"] is False
    assert views.payload(a, b) is got and views.reads == 1  # cached until a database changes
    none = views.payload(a, plain)
    assert {m["verdict"] for m in none["metrics"]} == {"inconclusive"}
    assert any("plain: no aggregator/telemetry.sqlite (not captured by TraceML)" in p for p in none["problems"])
    # a captured run whose database was removed since is not called "not captured" (review 13h), and
    # it is said in the words of the run table and the CLI (review 13i)
    from traceml_ai.diagnose import write_final_summary

    write_final_summary(root / "b")
    (root / "b" / "aggregator" / "telemetry.sqlite").unlink()
    gone = views.payload(a, b)
    assert any("b: telemetry database is missing (removed after the final summary was written)" in p
               for p in gone["problems"]), gone["problems"]
    assert not any("not captured" in p for p in gone["problems"])
    card = PerformanceViews().payload(b)["heatmap"]
    assert card["detail"] == "telemetry database is missing (removed after the final summary was written)"


def test_a_finished_run_is_read_once_without_totals_and_a_run_without_summary_with_them(tmp_path: Path) -> None:
    from traceml_ai.diagnose import write_final_summary
    from traceml_ai.ui.reads import SHARED
    from traceml_ai.ui.telemetry import TelemetryViews

    root = tmp_path / "runs"
    for name in ("done", "going"):
        write_run(root / name, RunSpec(ranks=2, steps=40, gpu=True))
    write_final_summary(root / "done")
    for name, totals in (("done", False), ("going", True)):
        run = RunSummary(key=str(root / name), id=name, root=str(root), name=name)
        SHARED.clear()
        before = SHARED.reads
        body = TelemetryViews().payload(run)
        perf = PerformanceViews().payload(run)
        # One read serves both answers; the run without a final summary is diagnosed from it now.
        assert SHARED.reads - before == 1 and perf["heatmap"]["state"] == "ok" and body["steps"] is not None
        assert body["diagnoses"]["source"] == ("live" if totals else "final_summary")
        tel = SHARED.read(root / name / "aggregator" / "telemetry.sqlite", totals=False)
        assert SHARED.reads - before == 1 and (tel.step_span is not None) == totals
        SHARED.read(root / name / "aggregator" / "telemetry.sqlite")  # totals asked: read again unless kept
        assert SHARED.reads - before == (1 if totals else 2)
