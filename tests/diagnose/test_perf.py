"""The perf.* facts of a run folder (issue 13 item 1): read from final_summary.json as the real
diagnosis writes it, and kept by file stamps so an unchanged folder is not read again."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from tests.diagnose.telemetry_db import GIB, HEALTHY_CPU, MIB, RunSpec, write_run
from traceml_ai.diagnose.perf import PERF_KEYS, PerfIndex, perf_facts, read_perf_facts
from traceml_ai.diagnose.summary import SummaryFileError, load_final_summary, write_final_summary
from traceml_ai.telemetry import schema


def captured(run_dir: Path, spec: RunSpec) -> dict[str, object]:
    write_run(run_dir, spec)
    write_final_summary(run_dir)
    doc: dict[str, object] = json.loads((run_dir / "aggregator" / "final_summary.json").read_text())
    return doc


def test_an_input_stall_run_has_its_dataloader_share_and_verdict(tmp_path: Path) -> None:
    run_dir = tmp_path / "stall"
    doc = captured(run_dir, RunSpec(steps=80, phases=lambda r, s: {**HEALTHY_CPU, schema.DATALOADER_NEXT: 40.0}))
    facts, warning = read_perf_facts(run_dir)
    assert warning is None
    st = doc["step_time"]
    assert isinstance(st, dict)
    shares = {p["name"]: p["share"] for p in st["phases"]}
    assert facts["telemetry"] == "ok"
    assert facts["verdict"] == "input_bound"
    assert facts["severity"] in ("warning", "critical")
    assert facts["share.dataloader"] == shares[schema.DATALOADER_NEXT] > 0.5
    assert facts["share.forward"] == shares[schema.FORWARD]
    assert facts["share.other"] == shares["other"]
    assert facts["step_ms.p50"] == st["iteration_median_ms"]
    assert facts["step_ms.p95"] == st["iteration_p95_ms"] >= st["iteration_p90_ms"]
    assert facts["steps_per_s"] == st["throughput_steps_per_s"]
    assert facts["steps"] == 80
    assert facts["ranks"] == 1
    memory = doc["memory"]
    assert isinstance(memory, dict)
    assert facts["peak_mem.host"] == max(memory["rss_peak_bytes"].values()) == pytest.approx(900 * MIB, rel=1e-5)
    assert "skew_pct" not in facts and "worst_rank" not in facts  # one rank: no skew
    assert "peak_mem.gpu" not in facts and "gpu_util_pct" not in facts  # CPU run
    assert set(facts) <= set(PERF_KEYS)


@pytest.mark.parametrize(("spec", "expected"), [
    (RunSpec(steps=80), "healthy"),  # compute-bound: an info finding only
    (RunSpec(steps=80, phases=lambda r, s: {**HEALTHY_CPU, schema.DATALOADER_NEXT: 40.0}), "findings"),
], ids=["info-only", "warning"])
def test_the_verdict_column_says_what_traceml_summary_says(tmp_path: Path, spec: RunSpec, expected: str) -> None:
    # Issue 14 review: the table showed an info finding's kind (cpu_pressure, compute_bound) where
    # `traceml summary` printed "no bottleneck found" for the same run.
    from traceml_ai.diagnose.summary import read_final_summary, verdict

    doc = captured(tmp_path / "run", spec)
    facts, _ = read_perf_facts(tmp_path / "run")
    summary = read_final_summary(tmp_path / "run")
    assert summary is not None
    kind, _text = verdict(summary)
    assert kind == expected
    findings = doc["findings"]
    assert isinstance(findings, list) and findings  # both runs have a finding, info or worse
    if kind == "healthy":
        assert facts["verdict"] == "healthy" and facts["severity"] == "info"
    else:
        assert kind == "findings"
        assert facts["verdict"] == next(f["kind"] for f in findings if f["severity"] in ("warning", "critical"))


def test_a_straggler_run_names_its_rank_and_skew(tmp_path: Path) -> None:
    run_dir = tmp_path / "straggler"
    doc = captured(run_dir, RunSpec(ranks=2, steps=100,
                                    phases=lambda r, s: {**HEALTHY_CPU, "other": 10.0 if r else 0.5}))
    facts, _ = read_perf_facts(run_dir)
    st = doc["step_time"]
    assert isinstance(st, dict)
    assert facts["verdict"] == "straggler"
    assert facts["straggler"] == "1"
    assert facts["worst_rank"] == 1
    assert facts["skew_pct"] == pytest.approx(st["skew"] * 100)
    assert facts["skew_pct"] > 15  # type: ignore[operator]


def test_a_gpu_run_has_peak_device_memory_and_mean_utilisation(tmp_path: Path) -> None:
    run_dir = tmp_path / "gpu"
    doc = captured(run_dir, RunSpec(steps=60, gpu=True, gpu_util=lambda t: 80.0 if int(t * 4) % 2 else 60.0))
    facts, _ = read_perf_facts(run_dir)
    system = doc["system"]
    assert isinstance(system, dict)
    memory = doc["memory"]
    assert isinstance(memory, dict)
    assert facts["peak_mem.gpu"] == memory["peak_alloc_bytes"] == pytest.approx(10 * GIB, rel=1e-5)
    assert facts["gpu_util_pct"] == system["gpu_util_mean"]
    assert 60.0 <= facts["gpu_util_pct"] <= 80.0  # type: ignore[operator]


def test_status_ok_degraded_partial_and_pending(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    doc = captured(run_dir, RunSpec(steps=30))
    assert perf_facts(doc)["telemetry"] == "ok"
    assert perf_facts(doc, lost=True)["telemetry"] == "partial"  # finalization_warning.json
    assert perf_facts({**doc, "telemetry": {**doc["telemetry"], "status": "degraded"}})["telemetry"] == "degraded"  # type: ignore[dict-item]
    assert perf_facts({**doc, "ranks": {"seen": [0], "world_size": 2, "missing": [1]}})["telemetry"] == "partial"
    corrupt = perf_facts({"schema_version": 1, "telemetry": {"status": "corrupt"}, "findings": [],
                          "rules_checked": []})
    assert corrupt["telemetry"] == "partial" and "verdict" not in corrupt  # no rule judged: no verdict
    (run_dir / "aggregator" / "finalization_warning.json").write_text('{"summary": ["3 lines lost"]}')
    assert read_perf_facts(run_dir)[0]["telemetry"] == "partial"
    pending = tmp_path / "live"
    (pending / "aggregator").mkdir(parents=True)
    assert read_perf_facts(pending) == ({"telemetry": "pending"}, None)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert read_perf_facts(plain) == ({}, None)
    # The words the filters accept (traceml_ai.verdicts) are those this reader writes.
    from traceml_ai.diagnose.perf import NO_SUMMARY, PENDING
    from traceml_ai.verdicts import TELEMETRY_STATES

    assert {"ok", "degraded", "partial", PENDING["telemetry"], NO_SUMMARY["telemetry"]} == set(TELEMETRY_STATES)


def test_a_bad_summary_is_a_warning_and_partial_never_a_crash(tmp_path: Path) -> None:
    run_dir = tmp_path / "bad"
    (run_dir / "aggregator").mkdir(parents=True)
    path = run_dir / "aggregator" / "final_summary.json"
    for text, says in (("{not json", "not valid JSON"), ("[1, 2]", "not an object"),
                       ('{"schema_version": 99}', "newer than this TraceML reads")):
        path.write_text(text)
        facts, warning = read_perf_facts(run_dir)
        assert facts == {"telemetry": "partial"}
        assert warning is not None and says in warning and "\n" not in warning
    # A hand-edited summary with values no TraceML writes is not believed, as `traceml summary` and
    # the page do not believe it (load_final_summary): partial, every cell empty, and said which
    # (review 13d/13e: a median of "fast" or a share of 1.7 became "–", or a fact, without a word).
    sqlite3.connect(run_dir / "aggregator" / "telemetry.sqlite").execute("CREATE TABLE t (x)").connection.close()
    path.write_text(json.dumps({"schema_version": 1, "telemetry": {"status": "ok"}, "steps": {"seen": "many"},
                                "step_time": {"iteration_median_ms": "fast", "phases": [{"name": 3}]},
                                "findings": [{"kind": "input_bound", "severity": "critical"}]}))
    facts, warning = read_perf_facts(run_dir)
    assert facts == {"telemetry": "partial"}
    assert warning is not None and "\n" not in warning and "holds values TraceML never writes" in warning
    assert "steps: Expected `int | null`, got `str` - at `$.seen`" in warning
    assert "step_time: Expected `float | null`, got `str` - at `$.iteration_median_ms`" in warning
    # Values no summary TraceML writes can hold: a share outside 0-1, a negative time or size, a
    # utilisation above 100 %, an unknown telemetry status.
    good = {"schema_version": 1, "telemetry": {"status": "ok"}, "findings": [],
            "step_time": {"iteration_median_ms": 12.0, "phases": [{"name": "traceml:forward", "share": 0.5}]}}
    path.write_text(json.dumps(good))
    assert read_perf_facts(run_dir) == ({"telemetry": "ok", "findings": 0, "verdict": "not_judged",
                                         "step_ms.p50": 12.0, "share.forward": 0.5}, None)
    for section, edit, says in (("step_time", {"phases": [{"name": "traceml:forward", "share": 7.5}]}, "<= 1.0"),
                                ("step_time", {"phases": [{"name": "traceml:forward", "share": -0.5}]}, ">= 0.0"),
                                ("step_time", {"iteration_median_ms": -3.0}, ">= 0.0"),
                                ("memory", {"rss_peak_bytes": {"0": -1.0}}, ">= 0.0"),
                                ("system", {"gpu_util_mean": 250.0}, "<= 100.0"),
                                ("telemetry", {"status": "weird"}, "Invalid enum value 'weird'")):
        path.write_text(json.dumps({**good, section: {**good.get(section, {}), **edit}}))  # type: ignore[dict-item]
        facts, warning = read_perf_facts(run_dir)
        assert facts == {"telemetry": "partial"}
        assert warning is not None and says in warning and f"never writes ({section}: " in warning, warning
        with pytest.raises(SummaryFileError, match="holds values TraceML never writes"):
            load_final_summary(run_dir)  # what `traceml summary` and the page read: the same refusal


def test_a_symlinked_summary_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"schema_version": 1, "telemetry": {"status": "ok"}, "findings": []}))
    run_dir = tmp_path / "linked"
    (run_dir / "aggregator").mkdir(parents=True)
    os.symlink(outside, run_dir / "aggregator" / "final_summary.json")
    assert read_perf_facts(run_dir) == ({"telemetry": "pending"}, None)


def test_the_index_reads_a_folder_again_only_when_its_summary_changed(tmp_path: Path) -> None:
    done = tmp_path / "done"
    captured(done, RunSpec(steps=30))
    live = tmp_path / "live"
    (live / "aggregator").mkdir(parents=True)
    plain = tmp_path / "plain"
    plain.mkdir()
    index = PerfIndex()
    runs = [(str(done), True), (str(live), False), (str(plain), True)]
    first = index.update(runs)
    assert set(first) == {str(done), str(live), str(plain)} and first[str(plain)] == {}  # all new
    assert first[str(live)] == {"telemetry": "pending"}
    reads = index.reads
    assert index.update(runs) == {}  # no change: nothing reported ...
    assert index.reads == reads  # ... and nothing read: the finished runs are frozen, the live one stat'ed
    # The live run finishes: its summary appears and is read once.
    write_run(live, RunSpec(steps=20))
    write_final_summary(live)
    changed = index.update([(str(done), True), (str(live), True), (str(plain), True)])
    assert list(changed) == [str(live)] and changed[str(live)]["telemetry"] == "ok"
    assert index.update([(str(done), True), (str(live), True)]) == {}
    # A frozen run is looked at again on a forced update (the viewer's Refresh).
    summary = done / "aggregator" / "final_summary.json"
    doc = json.loads(summary.read_text())
    doc["findings"] = []
    summary.write_text(json.dumps(doc))
    assert index.update([(str(done), True)]) == {}
    assert index.update([(str(done), True)], force=True)[str(done)]["verdict"] == "healthy"


def test_folders_assumed_not_captured_are_skipped_until_a_refresh_which_reads_each_on_its_own(
        tmp_path: Path) -> None:
    # A start from the run database records its unchanged, uncaptured runs without a look (issue 16:
    # 100,000 at a warm start share one entry); a Refresh looks at each again, and what one folder
    # holds then does not leak into the others.
    folders = [tmp_path / f"r{i}" for i in range(3)]
    for folder in folders:
        folder.mkdir()
    index = PerfIndex()
    index.assume_not_captured(str(f) for f in folders)
    captured(folders[1], RunSpec(steps=30))  # (captured since: only a Refresh looks)
    runs = [(str(f), True) for f in folders]
    assert index.update(runs) == {} and index.reads == 0
    changed = index.update(runs, force=True)
    assert list(changed) == [str(folders[1])] and changed[str(folders[1])]["telemetry"] == "ok"
    assert index.facts(str(folders[0])) == {} == index.facts(str(folders[2]))
    assert index.update(runs) == {} and index.pending() == []


def test_a_live_runs_growing_telemetry_is_reported_until_it_finishes(tmp_path: Path) -> None:
    """Issue 13 item 3: the viewer learns that a live run's database grew (and pushes it to the page)."""
    from tests.diagnose.telemetry_db import TelemetryDB, cpu_events
    from traceml_ai.runs.store import RunStore
    from traceml_ai.ui.perf import join_perf

    root = tmp_path / "runs"
    live = root / "live"
    live.mkdir(parents=True)
    (live / "run.json").write_text(json.dumps({"schema_version": 1, "id": "live", "name": "live",
                                               "status": "running"}))
    db = TelemetryDB(live / "aggregator" / "telemetry.sqlite")
    db.step(0, 0, cpu_events(HEALTHY_CPU), ts_ns=1)
    db.commit()
    index, grown = PerfIndex(), set[str]()
    assert index.update([(str(live), False)], grown=grown) == {str(live): {"telemetry": "pending"}}
    assert grown == set()  # first seen: in the answer already
    assert index.update([(str(live), False)], grown=grown) == {} and grown == set()  # nothing written
    db.step(0, 1, cpu_events(HEALTHY_CPU), ts_ns=2)
    db.commit()  # the WAL file grows
    assert index.update([(str(live), False)], grown=grown) == {} and grown == {str(live)}
    # join_perf hands the grown run to the viewer as changed, once per change
    store = RunStore([root])
    store.poll()
    index = PerfIndex()
    join_perf(store, index)
    assert join_perf(store, index) == []
    db.step(0, 2, cpu_events(HEALTHY_CPU), ts_ns=3)
    db.commit()
    assert join_perf(store, index) == [store.runs()[0].key]
    assert join_perf(store, index) == []
    db.close()
    # a finished run with its final summary is frozen: its database is not looked at
    write_final_summary(live)
    finished, grown = PerfIndex(), set[str]()
    finished.update([(str(live), True)], grown=grown)
    os.utime(live / "aggregator" / "telemetry.sqlite", ns=(1, 1))
    assert finished.update([(str(live), True)], grown=grown) == {} and grown == set()


def test_the_reader_names_the_files_and_schema_as_the_summary_writer_does() -> None:
    from traceml_ai.diagnose import perf, summary

    assert (perf.AGGREGATOR_DIR, perf.FINAL_SUMMARY, perf.SCHEMA_VERSION, perf.TELEMETRY_DB) == (
        summary.AGGREGATOR_DIR, summary.FINAL_SUMMARY, summary.SCHEMA_VERSION, summary.TELEMETRY_DB)


def test_a_ddp_straggler_is_the_worst_rank_column_too_not_the_rank_waiting_for_it(tmp_path: Path) -> None:
    """Issue 13 review: perf.worst_rank named the rank with the longest iteration, which under DDP
    is often one waiting in backward, while the diagnosis named the straggler. One measure now: the
    column names the rank the finding names, with the finding's skew."""
    def phases(rank: int, step: int) -> dict[str, float]:
        # rank 0 works 10 ms more before backward; rank 1 waits for it inside backward (and a little more)
        if rank == 0:
            return {**HEALTHY_CPU, schema.FORWARD: 14.0}
        return {**HEALTHY_CPU, schema.BACKWARD: 17.5}

    run_dir = tmp_path / "ddp"
    doc = captured(run_dir, RunSpec(ranks=2, steps=80, phases=phases))
    facts, _ = read_perf_facts(run_dir)
    findings = doc["findings"]
    assert isinstance(findings, list) and findings[0]["kind"] == "straggler"
    st = doc["step_time"]
    assert isinstance(st, dict)
    per_rank = {r["rank"]: r["median_ms"] for r in st["per_rank"]}
    assert per_rank[1] > per_rank[0]  # the waiting rank has the longer iteration
    assert findings[0]["evidence"]["ranks"] == [0]
    assert st["worst_rank"] == 0 and st["skew_measure"] == "outside_backward"
    assert st["skew"] == pytest.approx(findings[0]["evidence"]["value"], rel=1e-4)
    assert facts["worst_rank"] == 0 and facts["straggler"] == "0"
    assert facts["skew_pct"] == pytest.approx(findings[0]["evidence"]["value"] * 100, rel=1e-4)


def test_a_run_that_ended_without_a_final_summary_has_no_verdict_not_pending(tmp_path: Path) -> None:
    """Issue 13 review: a finished (or stale) captured run without final_summary.json read
    "pending" forever. Its perf.telemetry says it ended without one; a running one stays pending."""
    from tests.diagnose.telemetry_db import TelemetryDB, cpu_events
    from traceml_ai.runs.store import RunStore
    from traceml_ai.ui.perf import join_perf

    root = tmp_path / "runs"
    for name, status in (("ended", "failed"), ("going", "running")):
        run = root / name
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"schema_version": 1, "id": name, "name": name, "status": status,
                                                  "heartbeat_at": "2999-01-01T00:00:00Z"}))
        db = TelemetryDB(run / "aggregator" / "telemetry.sqlite")
        db.step(0, 0, cpu_events(HEALTHY_CPU), ts_ns=1)
        db.commit()
        db.close()
    store = RunStore([root])
    store.poll()
    index = PerfIndex()
    join_perf(store, index)
    by_name = {r.name: r for r in store.runs()}
    assert by_name["ended"].perf == {"telemetry": "no_summary"}
    assert by_name["going"].display_status in ("running", "running?")
    assert by_name["going"].perf == {"telemetry": "pending"}
    # the running one stops (run.json says completed) without writing a summary: no verdict, at the next poll
    (root / "going" / "run.json").write_text(json.dumps({"schema_version": 1, "id": "going", "name": "going",
                                                         "status": "completed"}))
    store.poll()
    assert str(root / "going") in join_perf(store, index, only=[*store.unfinished(), *index.pending()])
    assert {r.name: r.perf for r in store.runs()}["going"] == {"telemetry": "no_summary"}


def test_runs_ls_and_show_json_carry_the_unusable_final_summary_warning(tmp_path: Path) -> None:
    """Issue 13 review: the viewer listed "final_summary.json cannot be read (damaged): not valid JSON" among the run's
    warnings, the command line dropped it."""
    from tests.conftest import run_traceml

    root = tmp_path / "runs"
    run = root / "broken"
    (run / "aggregator").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"schema_version": 1, "id": "broken", "name": "broken",
                                              "status": "completed"}))
    (run / "aggregator" / "final_summary.json").write_text("{not json")
    ls = run_traceml("runs", "ls", str(root), "--json", "--columns", "perf.telemetry")
    assert ls.returncode == 0, ls.stderr
    row = json.loads(ls.stdout.splitlines()[0])
    assert row["values"]["perf.telemetry"] == "partial"
    damaged = "final_summary.json cannot be read (damaged): not valid JSON"
    assert any(damaged in w for w in row["warnings"]), row["warnings"]
    show = run_traceml("runs", "show", "broken", "--root", str(root), "--json")
    assert show.returncode == 0, show.stderr
    assert any(damaged in w for w in json.loads(show.stdout)["warnings"])
    text = run_traceml("runs", "show", "broken", "--root", str(root))
    assert text.returncode == 0, text.stderr
    assert text.stdout.count(damaged) == 1, text.stdout


def test_a_cpu_only_workspace_still_lists_every_perf_column_empty(tmp_path: Path) -> None:
    """Issue 13 review: with no GPU run the GPU columns vanished from the column chooser, and so did
    perf.share.h2d (a CPU run times no host-to-device copy): every perf.* column is offered."""
    from traceml_ai.runs import table
    from traceml_ai.runs.model import RunSummary
    from traceml_ai.runs.table import PERF_COLUMNS, cell, column_facts

    assert PERF_COLUMNS == PERF_KEYS  # the run layer's list of perf.* columns (it may not import this one)
    no_copy = {k: v for k, v in HEALTHY_CPU.items() if k != schema.H2D}  # a CPU run times no h2d copy
    captured(tmp_path / "cpu", RunSpec(steps=40, phases=lambda r, s: no_copy))
    facts, _ = read_perf_facts(tmp_path / "cpu")
    assert "share.h2d" not in facts and "peak_mem.gpu" not in facts  # not measured
    cpu = RunSummary(key="/r/a", id="a", root="/r", name="a", perf=facts)
    plain = RunSummary(key="/r/b", id="b", root="/r", name="b")
    chooser = column_facts([cpu, plain])
    assert [c for c in chooser.available if c.startswith("perf.")] == sorted(f"perf.{k}" for k in PERF_KEYS)
    for column in ("perf.share.h2d", "perf.peak_mem.gpu", "perf.gpu_util_pct", "perf.skew_pct"):
        assert column in chooser.numeric
        assert cell(cpu, column) is None  # empty: `–` in the page and the terminal, null in JSON
    assert "perf.verdict" not in chooser.numeric
    assert set(table.PERF_NUMERIC) | set(table.PERF_TEXT) == set(PERF_KEYS)
    assert "perf.peak_mem.gpu" not in column_facts([plain]).available  # nothing captured: no perf columns


def test_a_run_whose_aggregator_is_still_writing_its_verdict_is_pending_not_without_summary(tmp_path: Path) -> None:
    """Issue 13 review: for the seconds between the script's logger ending run.json (completed) and
    the aggregator writing final_summary.json, the table said no_summary and the Performance view
    "none: the run ended without a final summary". While the launcher's manifest still says running
    and the files are fresh, the run is finalizing: pending, followed like a live run."""
    import time

    from traceml_ai.diagnose.perf import FINALIZING_FRESH_S, aggregator_finalizing
    from traceml_ai.launcher.runfolder import RunIdentity, write_manifest
    from traceml_ai.runs.store import RunStore
    from traceml_ai.ui.perf import join_perf
    from traceml_ai.ui.telemetry import TelemetryViews

    root = tmp_path / "runs"
    run = root / "finishing"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"schema_version": 1, "id": "finishing", "name": "finishing",
                                              "status": "completed"}))
    write_run(run, RunSpec(steps=80))
    write_manifest(run, RunIdentity(mode="run", command=["python", "train.py"], session_id="s-1"), status="running",
                   started_at_ns=time.time_ns())
    assert aggregator_finalizing(run)
    store = RunStore([root])
    store.poll()
    index = PerfIndex()
    join_perf(store, index)
    (summary,) = store.runs()
    assert summary.display_status == "completed" and summary.perf == {"telemetry": "pending"}
    answer = TelemetryViews().payload(summary)
    assert answer["live"] is True and answer["finalizing"] is True
    assert answer["diagnoses"]["source"] == "live"  # the rules over the rows so far, marked provisional

    # The verdict arrives: the next poll shows it, and the run is no longer followed.
    write_final_summary(run)
    store.poll()
    join_perf(store, index, only=[*store.unfinished(), *index.pending()])
    (summary,) = store.runs()
    assert summary.perf["telemetry"] == "ok" and summary.perf["verdict"] == "healthy"  # (compute_bound is info)
    assert not aggregator_finalizing(run)
    answer = TelemetryViews().payload(summary)
    assert answer["live"] is False and answer["finalizing"] is False

    # A launcher and aggregator killed together leave "running" behind: once the files are old, the
    # run ended without a summary.
    (run / "aggregator" / "final_summary.json").unlink()
    assert aggregator_finalizing(run)
    assert not aggregator_finalizing(run, now=time.time() + FINALIZING_FRESH_S + 5)
    old = time.time() - FINALIZING_FRESH_S - 5
    for path in (run / "aggregator").iterdir():
        os.utime(path, (old, old))
    store = RunStore([root])  # (a finished run whose summary was read is frozen until Refresh)
    store.poll()
    join_perf(store, PerfIndex())
    assert store.runs()[0].perf == {"telemetry": "no_summary"}
    # A manifest that says the session ended is believed at once.
    write_manifest(run, RunIdentity(mode="run", command=["python", "train.py"], session_id="s-1"),
                   status="interrupted", started_at_ns=1, ended_at_ns=2)
    assert not aggregator_finalizing(run)


def test_a_run_of_too_few_steps_is_not_judged_for_that_reason_not_an_untimed_phase(tmp_path: Path) -> None:
    """Fresh-user review: 6 traced steps (all but one in the warm-up) said "not judged: no
    traceml:dataloader_next events were recorded", which is as true of a 40-step run that is judged;
    the reason that decided it is the step count."""
    from traceml_ai.diagnose.summary import read_final_summary, verdict

    phases = {k: v for k, v in HEALTHY_CPU.items() if k != schema.DATALOADER_NEXT}
    for steps, expected in ((6, ("not_judged", "fewer than 5 post-warm-up steps")), (40, ("healthy", "no bottleneck"))):
        run_dir = tmp_path / f"steps{steps}"
        captured(run_dir, RunSpec(steps=steps, phases=lambda r, s, p=phases: dict(p)))
        summary = read_final_summary(run_dir)
        assert summary is not None
        kind, text = verdict(summary)
        assert kind == expected[0] and expected[1] in text, (steps, text)


def test_a_telemetry_database_removed_after_the_verdict_makes_the_run_partial(tmp_path: Path) -> None:
    """Issue 13 review: deleting aggregator/telemetry.sqlite left perf.telemetry "ok" with no warning
    (a truncated copy was already "partial"). With a final summary the database was written first,
    so a missing one was removed since: partial, and the warning names it."""
    run_dir = tmp_path / "gone"
    (run_dir / "aggregator").mkdir(parents=True)
    db = run_dir / "aggregator" / "telemetry.sqlite"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    (run_dir / "aggregator" / "final_summary.json").write_text(json.dumps(
        {"schema_version": 1, "telemetry": {"status": "ok"}, "findings": [], "rules_checked": []}))
    facts, warning = read_perf_facts(run_dir)
    assert facts["telemetry"] == "ok" and warning is None
    db.unlink()
    facts, warning = read_perf_facts(run_dir)
    assert facts["telemetry"] == "partial"
    assert warning == ("aggregator/telemetry.sqlite: telemetry database is missing (removed after the final "
                       "summary was written)")


def test_a_healthy_run_read_every_kth_step_is_ok_and_says_it_was_sampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 13 review: a healthy 100k-step run read every 16th step (MAX_STEP_ROWS) said
    perf.telemetry partial and showed a problems banner: sampling is by design, not a loss."""
    from tests.conftest import run_traceml
    from traceml_ai.diagnose import thresholds
    from traceml_ai.diagnose.summary import read_final_summary
    from traceml_ai.runs.model import RunSummary
    from traceml_ai.ui.telemetry import TelemetryViews

    monkeypatch.setattr(thresholds, "MAX_STEP_ROWS", 100)  # 400 rows: read every 4th step
    run_dir = tmp_path / "long"
    doc = captured(run_dir, RunSpec(ranks=2, steps=200))
    steps, telemetry = doc["steps"], doc["telemetry"]
    assert isinstance(steps, dict) and isinstance(telemetry, dict)
    assert steps["sampled_every"] == 4
    assert telemetry["problems"] == []
    facts, warning = read_perf_facts(run_dir)
    assert warning is None and facts["telemetry"] == "ok" and facts["verdict"] == "healthy"
    # The page: no problem among the telemetry answer's warnings; the step chart says it was sampled.
    body = TelemetryViews().payload(RunSummary(key=str(run_dir), id="long", root=str(tmp_path), name="long"))
    assert body["warnings"] == [], body["warnings"]
    assert body["steps"]["sampled_every"] == 4
    # The terminal: said as a note, not a problem.
    text = run_traceml("summary", str(run_dir))
    assert text.returncode == 0, text.stderr
    assert "sampled: one step in 4 read" in text.stdout and "problem" not in text.stdout, text.stdout
    # A summary written before the fix held the sampling note among its problems: still ok.
    legacy = {**doc, "telemetry": {**telemetry, "problems": ["800,000 step rows: read every 16th step "
                                                               "(memory peaks from every step)"]}}
    assert perf_facts(legacy)["telemetry"] == "ok"
    (run_dir / "aggregator" / "final_summary.json").write_text(json.dumps(legacy))
    old = read_final_summary(run_dir)
    assert old is not None and old.problems == ()
    # Something actually lost still makes it partial.
    lost = {**doc, "telemetry": {**telemetry, "problems": ["3 step_time row(s) without an integer step left out"]}}
    assert perf_facts(lost)["telemetry"] == "partial"


def test_step_time_is_the_steps_wall_time_in_the_column_summary_and_compare(tmp_path: Path) -> None:
    """Issue 13 review: perf.step_ms.p50 was the median pooled over every rank's rows (10.2 ms) while
    `traceml compare` and the Performance view's card used the step's time, the slowest rank per
    step (10.9 ms), and steps/s was 1000 / 10.9. One definition now: the slowest rank per step."""
    from tests.conftest import run_traceml
    from traceml_ai.diagnose import compare

    spec = RunSpec(ranks=2, steps=120, noise=0.02,
                   phases=lambda r, s: {**HEALTHY_CPU, "other": 9.0 if s % 5 in ((0, 1), (2, 3))[r] else 0.5})
    doc = captured(tmp_path / "a", spec)
    captured(tmp_path / "b", spec)
    facts, _ = read_perf_facts(tmp_path / "a")
    st = doc["step_time"]
    assert isinstance(st, dict)
    # Each rank is slow on 2 steps in 5, never both at once: every rank's median, and the median of
    # all rows pooled, is a fast step's; the job waits for a slow rank on 4 steps in 5.
    per_rank = [r["median_ms"] for r in st["per_rank"]]
    assert facts["step_ms.p50"] == st["iteration_median_ms"]
    assert facts["step_ms.p50"] > max(per_rank) + 2  # type: ignore[operator]
    assert facts["steps_per_s"] == pytest.approx(1000 / facts["step_ms.p50"], rel=1e-5)  # type: ignore[operator]
    step_time = next(m for m in compare(tmp_path / "a", tmp_path / "b").metrics if m.metric == "step_time_ms")
    assert step_time.median_a == pytest.approx(facts["step_ms.p50"], rel=1e-5)
    throughput = next(m for m in compare(tmp_path / "a", tmp_path / "b").metrics
                      if m.metric == "throughput_steps_per_s")
    assert throughput.median_a == pytest.approx(facts["steps_per_s"], rel=1e-5)
    out = run_traceml("summary", str(tmp_path / "a"), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["step_time"]["iteration_median_ms"] == facts["step_ms.p50"]
    assert facts["step_ms.p95"] >= facts["step_ms.p50"]  # type: ignore[operator]


def test_runs_ls_shows_a_dash_where_a_run_has_no_perf_fact_as_the_page_does(tmp_path: Path) -> None:
    """Issue 13 review: `traceml runs ls --columns perf.…` left the cell blank where the page shows
    `–` (a run without telemetry, a phase a CPU run did not time); --json keeps null, --csv empty."""
    import csv
    import io

    from tests.conftest import run_traceml

    root = tmp_path / "runs"
    for name in ("cpu", "plain"):
        (root / name).mkdir(parents=True)
        (root / name / "run.json").write_text(json.dumps({"schema_version": 1, "id": name, "name": name,
                                                           "status": "completed"}))
    no_copy = {k: v for k, v in HEALTHY_CPU.items() if k != schema.H2D}
    captured(root / "cpu", RunSpec(steps=40, phases=lambda r, s: no_copy))
    columns = "name,perf.verdict,perf.share.h2d,perf.share.forward"
    text = run_traceml("runs", "ls", str(root), "--columns", columns, "--sort", "name")
    assert text.returncode == 0, text.stderr
    rows = {line.split()[0]: line.split()[1:] for line in text.stdout.splitlines()[1:3]}
    assert rows["plain"] == ["–", "–", "–"], text.stdout
    assert rows["cpu"][0] == "healthy" and rows["cpu"][1] == "–" and float(rows["cpu"][2]) > 0, text.stdout
    js = run_traceml("runs", "ls", str(root), "--columns", columns, "--json", "--sort", "name")
    assert js.returncode == 0, js.stderr
    values = {json.loads(line)["name"]: json.loads(line)["values"] for line in js.stdout.splitlines()}
    assert values["plain"]["perf.verdict"] is None and values["cpu"]["perf.share.h2d"] is None
    out = run_traceml("runs", "ls", str(root), "--columns", columns, "--csv", "--sort", "name")
    assert out.returncode == 0, out.stderr
    by_name = {r["name"]: r for r in csv.DictReader(io.StringIO(out.stdout))}
    assert by_name["plain"]["perf.verdict"] == "" and by_name["cpu"]["perf.share.h2d"] == ""
