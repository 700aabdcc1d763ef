"""final_summary.json: its shape, atomic writing, loading, and summaries of bad databases."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.diagnose.telemetry_db import HEALTHY_CPU, RunSpec, write_run
from traceml_ai.diagnose import (
    SummaryFileError,
    diagnose,
    final_summary_path,
    load_final_summary,
    write_final_summary,
)
from traceml_ai.diagnose.summary import read_final_summary, verdict
from traceml_ai.telemetry import schema


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "straggler"
    write_run(run_dir, RunSpec(ranks=2, steps=100, phases=lambda r, s: {**HEALTHY_CPU, "other": 10.0 if r else 0.5}))
    return run_dir


def test_summary_document_has_the_breakdown_ranks_and_findings(straggler_run: Path) -> None:
    doc = diagnose(straggler_run / "aggregator" / "telemetry.sqlite").to_dict()
    assert doc["schema_version"] == 1
    assert doc["generated_at"].endswith("Z") and "T" in doc["generated_at"]
    assert doc["telemetry"]["status"] == "ok"
    assert doc["steps"] == {"seen": 100, "first": 0, "last": 99, "analysed": 190, "sampled_every": 1,
                           "discarded": None, "dropped_updates": None, "dropped_micro_batches": None,
                           "failed": None}
    assert doc["ranks"] == {"seen": [0, 1], "world_size": 2, "missing": []}
    st = doc["step_time"]
    phases = {p["name"]: p for p in st["phases"]}
    assert list(phases) == [schema.DATALOADER_NEXT, schema.H2D, schema.FORWARD, schema.BACKWARD,
                            schema.OPTIMIZER_STEP, "other"]
    assert phases[schema.FORWARD]["median_ms"] == pytest.approx(4.0, rel=0.05)
    assert phases[schema.FORWARD]["p90_ms"] > phases[schema.FORWARD]["median_ms"]
    # Shares of the built-in phases and 'other' add up to the whole iteration.
    assert sum(p["share"] for p in st["phases"]) == pytest.approx(1.0, abs=0.01)
    assert [r["rank"] for r in st["per_rank"]] == [0, 1]
    assert st["per_rank"][1]["median_ms"] == pytest.approx(24.0, rel=0.05)
    assert st["per_rank"][1]["outside_backward_median_ms"] == pytest.approx(24.0 - 7.0, rel=0.05)
    assert st["worst_rank"] == 1 and st["skew"] == pytest.approx(24.0 / 14.5 - 1, rel=0.1)
    assert st["throughput_steps_per_s"] == pytest.approx(1000 / 24.0, rel=0.05)
    assert doc["memory"]["device"] == "cpu" and doc["memory"]["peak_alloc_bytes"] is None
    assert set(doc["memory"]["rss_peak_bytes"]) == {"0", "1"}
    assert doc["system"]["cpu_percent_median"] == pytest.approx(55.0)
    assert doc["findings"][0]["kind"] == "straggler"
    assert set(doc["findings"][0]) == {"kind", "severity", "summary", "action", "evidence"}
    assert set(doc["findings"][0]["evidence"]) == {"metric", "value", "threshold", "ranks", "steps"}
    assert doc["findings"][0]["evidence"]["ranks"] == [1]
    assert {"rule": "low_gpu_util", "reason": "no GPU utilisation samples (CPU-only run, or NVML unavailable)"} in \
        doc["abstained"]
    json.dumps(doc, allow_nan=False)  # strict JSON: no NaN or Infinity anywhere


def test_write_final_summary_writes_atomically_and_loads_back(straggler_run: Path) -> None:
    path = write_final_summary(straggler_run)
    assert path == final_summary_path(straggler_run) == straggler_run / "aggregator" / "final_summary.json"
    # Only the final file remains: no temporary file left behind.
    assert sorted(p for p in os.listdir(path.parent) if "final_summary" in p) == ["final_summary.json"]
    doc = load_final_summary(straggler_run)
    assert doc is not None and doc["findings"][0]["kind"] == "straggler"
    assert doc["telemetry"]["source"] == "aggregator/telemetry.sqlite"
    # Writing again replaces the file whole.
    path.write_text("{half a file")
    write_final_summary(straggler_run)
    assert load_final_summary(straggler_run) is not None


def test_the_ranks_step_counts_are_written_into_the_summary(straggler_run: Path) -> None:
    write_final_summary(straggler_run)  # nobody reported step counts (e.g. a live run's summary)
    doc = load_final_summary(straggler_run)
    assert doc is not None
    assert (doc["steps"]["discarded"], doc["steps"]["dropped_updates"], doc["steps"]["dropped_micro_batches"]) == \
        (None, None, None)
    write_final_summary(straggler_run, step_counts={"discarded_steps": 4, "dropped_updates": 1,
                                                    "dropped_micro_batches": 3, "a_newer_counter": 9})
    doc = load_final_summary(straggler_run)
    assert doc is not None
    assert (doc["steps"]["discarded"], doc["steps"]["dropped_updates"], doc["steps"]["dropped_micro_batches"]) == \
        (4, 1, 3)
    assert doc["findings"][0]["kind"] == "straggler"  # the diagnosis itself is the same


def test_a_corrupt_database_gives_a_summary_that_says_so(tmp_path: Path) -> None:
    db = tmp_path / "run" / "aggregator" / "telemetry.sqlite"
    db.parent.mkdir(parents=True)
    db.write_bytes(os.urandom(8192))
    write_final_summary(tmp_path / "run")
    doc = load_final_summary(tmp_path / "run")
    assert doc is not None
    assert doc["telemetry"]["status"] == "corrupt"
    assert doc["findings"] == [] and doc["rules_checked"] == []
    assert len(doc["abstained"]) == 10
    assert all("telemetry database is damaged" in a["reason"] for a in doc["abstained"])
    assert doc["step_time"] is None


def test_a_run_without_telemetry_gets_a_summary_saying_it_is_missing(tmp_path: Path) -> None:
    path = write_final_summary(tmp_path / "run")  # no aggregator folder yet: created
    doc = json.loads(path.read_text())
    assert doc["telemetry"]["status"] == "missing"
    assert doc["steps"]["seen"] == 0 and doc["ranks"]["seen"] == []


def test_a_rank_that_never_reported_is_listed_as_missing(tmp_path: Path) -> None:
    # Rank 1 of 2 never sent anything: write two ranks, then keep only rank 0's rows.
    db = write_run(tmp_path / "run", RunSpec(ranks=2, steps=20))
    import sqlite3

    with sqlite3.connect(db) as conn:
        for table in ("step_time_samples", "step_memory_samples", "process_samples"):
            conn.execute(f"DELETE FROM {table} WHERE global_rank = 1")
    doc = diagnose(db).to_dict()
    assert doc["ranks"] == {"seen": [0], "world_size": 2, "missing": [1]}


def test_load_final_summary_errors(tmp_path: Path) -> None:
    assert load_final_summary(tmp_path) is None
    path = final_summary_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("not json")
    with pytest.raises(SummaryFileError, match="not valid JSON"):
        load_final_summary(tmp_path)
    path.write_text("[1, 2]")
    with pytest.raises(SummaryFileError, match="not a JSON object"):
        load_final_summary(tmp_path)
    path.write_text('{"schema_version": 99}')
    with pytest.raises(SummaryFileError, match="schema_version 99"):
        load_final_summary(tmp_path)


def test_a_long_run_is_read_every_kth_step_but_memory_peaks_from_every_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.diagnose.telemetry_db import GIB
    from traceml_ai.diagnose import thresholds

    monkeypatch.setattr(thresholds, "MAX_STEP_ROWS", 100)
    db = write_run(tmp_path / "run", RunSpec(
        ranks=2, steps=200, gpu=True, phases=lambda r, s: {**HEALTHY_CPU, schema.DATALOADER_NEXT: 40.0},
        peak_reserved=lambda r, s: 79 * GIB if s == 7 else 12 * GIB))
    summary = diagnose(db)
    assert summary.sampled_every == 4
    assert (summary.steps_seen, summary.first_step, summary.last_step) == (200, 0, 199)  # all steps
    # per rank: steps 8, 12, ... 196 after the warm-up steps 0..4, and the last row written (rank 1's
    # step 199: a sampled read keeps the last rows, so the charts end at the run's last step)
    assert summary.steps_analysed == 2 * 48 + 1
    assert summary.problems == ()  # sampling is by design, not a problem (steps.sampled_every says it)
    # The statistics survive the even sample ...
    assert summary.findings[0].kind == "input_bound"
    # ... and the one-step memory spike at step 7, which the sample skips, is still found.
    assert any(f.kind == "memory_pressure" and f.severity == "critical" for f in summary.findings)


def test_a_failing_rule_abstains_and_the_others_still_judge(
    straggler_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from traceml_ai.diagnose import rules, summary

    def broken(ctx: rules.Context) -> rules.RuleResult:
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(summary, "RULES", (("input_bound", broken), *rules.RULES[1:]))
    result = diagnose(straggler_run / "aggregator" / "telemetry.sqlite")
    assert {"rule": "input_bound", "reason": "internal error in this rule: ZeroDivisionError: boom"} in \
        [a.to_dict() for a in result.abstained]
    assert result.findings[0].kind == "straggler"


@pytest.mark.parametrize("spec", [
    RunSpec(ranks=3, steps=40, phases=lambda r, s: {**HEALTHY_CPU, schema.FORWARD: 9.0 if r == 1 else 3.0}),
    RunSpec(steps=30, gpu=True, phases=lambda r, s: {**HEALTHY_CPU, schema.DATALOADER_NEXT: 30.0}),
    RunSpec(steps=0),
])
def test_the_typed_reader_gives_back_every_field_the_summary_wrote(tmp_path: Path, spec: RunSpec) -> None:
    """read_final_summary is the one reader of final_summary.json: what it returns writes back the
    same document, for runs with findings, GPU memory, several ranks, and none at all."""
    run_dir = tmp_path / "run"
    write_run(run_dir, spec)
    path = write_final_summary(run_dir, step_counts={"discarded_steps": 2, "dropped_updates": 1,
                                                     "dropped_micro_batches": 3})
    written = json.loads(path.read_text())
    summary = read_final_summary(run_dir)
    assert summary is not None
    assert summary.to_dict() == written


def test_the_typed_reader_tolerates_a_damaged_summary_and_says_what_it_left_out(tmp_path: Path) -> None:
    """A hand-edited or damaged summary document reads as far as it goes: wrong-typed fields are not
    given, an unreadable finding is counted in problems (never silently dropped, never a crash).
    As a run's file it is refused whole (review 13e: the table refused it while `traceml summary`
    showed its values as facts): every reader then diagnoses telemetry.sqlite and says why."""
    from traceml_ai.diagnose.summary import Summary, SummaryFileError

    run_dir = tmp_path / "run"
    (run_dir / "aggregator").mkdir(parents=True)
    (run_dir / "aggregator" / "final_summary.json").write_text(json.dumps({
        "schema_version": 1, "telemetry": {"status": "sideways", "problems": ["a", 3]},
        "steps": {"seen": "many", "first": 1, "last": 9}, "ranks": {"seen": [0, "x", None], "world_size": 2},
        "step_time": {"phases": [{"name": "traceml:forward", "median_ms": "fast"}, {"median_ms": 1}],
                      "per_rank": [{"rank": 0, "median_ms": 5}], "worst_rank": True},
        "memory": {"rss_peak_bytes": {"0": 100, "1": "big"}},
        "findings": [{"kind": "input_bound", "severity": "warning", "summary": "slow", "action": "fix",
                      "evidence": {"metric": "share", "value": 0.5, "ranks": [0], "steps": [1, 9]}},
                     {"kind": "x", "severity": "apocalyptic"}, "nonsense"],
        "abstained": [{"rule": "straggler", "reason": "one rank"}, {"rule": 1}],
    }))
    with pytest.raises(SummaryFileError, match="holds values TraceML never writes") as refused:
        read_final_summary(run_dir)
    assert "Invalid enum value 'sideways' - at `$.status`" in refused.value.reason
    summary = Summary.from_dict(json.loads((run_dir / "aggregator" / "final_summary.json").read_text()))
    assert summary.telemetry_status == "unreadable" and verdict(summary)[0] == "no_verdict"
    assert summary.steps_seen == 0 and (summary.first_step, summary.last_step) == (1, 9)
    assert summary.ranks == (0, None) and summary.missing_ranks == [1]
    assert summary.step_time is not None and summary.step_time.worst_rank is None
    assert [(p.name, p.median_ms) for p in summary.step_time.phases] == [("traceml:forward", None)]
    assert summary.memory.rss_peak_bytes == {"0": 100.0}
    (finding,) = summary.findings
    assert finding.kind == "input_bound" and finding.evidence.steps == (1, 9) and finding.evidence.ranks == (0,)
    assert [a.rule for a in summary.abstained] == ["straggler"]
    assert summary.problems == ("a", "2 finding(s) in the summary could not be read and are left out",
                                "1 abstention(s) in the summary could not be read and are left out")


def test_a_summary_whose_only_finding_is_unreadable_is_not_healthy(tmp_path: Path) -> None:
    """Issue 13 review: a finding of an unknown severity was left out and the page then said
    "No problem found". The summary counts it, and is not healthy."""
    from traceml_ai.diagnose.summary import Summary

    doc = {"schema_version": 1, "findings": [{"kind": "straggler", "severity": "catastrophic", "summary": "x"}],
           "rules_checked": ["straggler"]}
    summary = Summary.from_dict(doc)
    assert summary.findings == () and summary.unread_findings == 1
    assert not summary.healthy
    assert any("could not be read" in p for p in summary.problems)
