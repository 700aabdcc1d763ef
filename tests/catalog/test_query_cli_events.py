"""``traceml query events|ooms|issues|summary|correlate`` as a user runs them (DESIGN §7 exit codes:
0 ok, 1 failure, 2 bad usage): every output format, empty results, bad flag values, and a
telemetry file Stormlog cannot load (a warning naming it, the other files still answer)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tests.catalog.fixtures import telemetry_jsonl
from tests.conftest import run_traceml


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "artifacts"
    telemetry_jsonl(root / "a" / "rank0.jsonl", "s-0", job_id="job-1", rank=0, world_size=2)
    telemetry_jsonl(root / "b" / "rank1.jsonl", "s-1", job_id="job-1", rank=1, world_size=2, ended=False)
    with (root / "b" / "rank1.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"session_id": "s-1", "timestamp_ns": 25, "event_type": "warning", "rank": 1,
                            "world_size": 2, "job_id": "job-1", "message": "High fragmentation 40%"}) + "\n")
    return root


def test_events_in_every_format(root: Path) -> None:
    out = run_traceml("query", "events", str(root), "--json", "--no-cache")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert [(r["session_id"], r["timestamp_ns"], r["event_type"]) for r in rows] == [
        ("s-0", 10, "start"), ("s-1", 10, "start"), ("s-0", 20, "sample"), ("s-1", 20, "sample"),
        ("s-1", 25, "warning"), ("s-0", 30, "stop")]
    assert rows[4]["context"] == "High fragmentation 40%" and rows[4]["session_status"] == "incomplete"
    assert rows[0]["schema_version"] == 4 and rows[0]["allocator_allocated_bytes"] == 1024
    jsonl = run_traceml("query", "events", str(root), "--jsonl", "--no-cache", "--has-alert")
    assert [json.loads(line)["event_type"] for line in jsonl.stdout.splitlines()] == ["warning"]
    table = run_traceml("query", "events", str(root), "--no-cache", "--session", "s-0")
    assert table.returncode == 0 and "3 events" in table.stdout and "s-1" not in table.stdout
    got = list(csv.DictReader(io.StringIO(run_traceml("query", "events", str(root), "--csv", "--no-cache",
                                                      "--limit", "2").stdout)))
    assert [r["timestamp_ns"] for r in got] == ["10", "10"] and list(got[0])[:3] == ["session_id", "timestamp_ns",
                                                                                     "event_type"]
    assert got[0]["collector"] == "stormlog.cpu_tracker"  # a legacy record with memory_allocated, on no device
    assert json.loads(got[0]["metadata"])["memory_capabilities"]["backend"] == "cpu"


def test_empty_results_are_an_empty_array(root: Path, tmp_path: Path) -> None:
    for args in (("events", "--session", "nope"), ("ooms",), ("issues", "--kind", "oom"),
                 ("summary", "--metric", "collector_degradation_transitions")):
        out = run_traceml("query", args[0], str(root), "--json", "--no-cache", *args[1:])
        assert out.returncode == 0 and json.loads(out.stdout) == [], (args, out.stderr)
    out = run_traceml("query", "correlate", str(root), "--at-ns", "10", "--window-ns", "0", "--json", "--no-cache",
                      "--kind", "oom_bundle")
    assert json.loads(out.stdout)["evidence"] == []


def test_issues_summary_and_correlate(root: Path) -> None:
    issues = json.loads(run_traceml("query", "issues", str(root), "--json", "--no-cache").stdout)
    assert [(i["kind"], i["title"], i["hit_count"], i["affected_sessions"]) for i in issues] == [
        ("alert", "Alert: high fragmentation", 1, ["s-1"])]
    peaks = json.loads(run_traceml("query", "summary", str(root), "--metric", "peak_allocator_allocated_bytes",
                                   "--group-by", "rank", "--json", "--no-cache").stdout)
    assert [(p["rank"], p["value"], p["timestamp_ns"]) for p in peaks] == [(0, 2048, 20), (1, 2048, 20)]
    result = json.loads(run_traceml("query", "correlate", str(root), "--at-ns", "25", "--window-ns", "0",
                                    "--session", "s-1", "--json", "--no-cache").stdout)
    assert result["anchor"]["at_ns"] == 25 and result["anchor"]["session_id"] == "s-1"
    assert {(e["kind"], e["confidence"]) for e in result["evidence"]} == {
        ("telemetry_event", "high"), ("alert", "high"), ("timeline_marker", "high")}
    rid = next(e["metadata"]["record_id"] for e in result["evidence"] if e["kind"] == "telemetry_event")
    again = json.loads(run_traceml("query", "correlate", str(root), "--record-id", rid, "--json", "--no-cache").stdout)
    assert again["anchor"]["record_id"] == rid and again["anchor"]["event_type"] == "warning"


@pytest.mark.parametrize("args", [("issues", "--kind", "oops"), ("issues", "--state", "closed"),
                                  ("summary", "--metric", "nope"), ("summary", "--metric", "alert_count",
                                                                    "--group-by", "host"),
                                  ("summary",), ("correlate",), ("correlate", "--at-ns", "1", "--record-id", "x"),
                                  ("correlate", "--at-ns", "1", "--scope", "global"),
                                  ("correlate", "--at-ns", "1", "--kind", "photo"),
                                  ("ooms", "--created-after", "yesterday"), ("events", "--json", "--csv")])
def test_bad_flag_values_are_usage_errors(root: Path, args: tuple[str, ...]) -> None:
    out = run_traceml("query", args[0], str(root), *args[1:])
    assert out.returncode == 2, (args, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr


def test_a_file_stormlog_cannot_load_is_a_warning_and_the_rest_answers(root: Path) -> None:
    (root / "c").mkdir()
    (root / "c" / "bad.jsonl").write_text('{"timestamp_ns": "soon", "event_type": "sample"}\n{"x": 1}\n',
                                          encoding="utf-8")
    out = run_traceml("query", "events", str(root), "--json", "--no-cache")
    assert out.returncode == 0
    assert len(json.loads(out.stdout)) == 6
    assert "c/bad.jsonl" in out.stderr and "timestamp_ns must be an integer" in out.stderr
    strict = run_traceml("query", "events", str(root), "--json", "--no-cache", "--strict")
    assert strict.returncode == 1


def test_the_python_api_takes_filters_and_keywords_and_refuses_bad_ones(root: Path) -> None:
    import traceml_ai.catalog as catalog

    store = catalog.open([root])
    assert [r.event["event_type"] for r in store.query_events(has_alert=True)] == ["warning"]
    assert store.query_events(catalog.EventFilter(rank=1), limit=1)[0].event["session_id"] == "s-1"
    assert store.query_events(time_start_ns=21, time_end_ns=29)[0].event["timestamp_ns"] == 25
    with pytest.raises(TypeError):
        store.query_events(sessions="s-1")
    with pytest.raises(ValueError, match="unsupported summary metric"):
        store.summarize("peak_host_bytes")
    with pytest.raises(ValueError, match="unsupported grouping"):
        store.summarize("alert_count", group_by="host")
    for bad in ({"scope": "global"}, {"window_ns": -1}, {"limit": -1}):
        with pytest.raises(ValueError):
            catalog.CorrelationFilter(at_ns=1, **bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="requires --at-ns or --record-id"):
        store.correlate()
    result = store.correlate(at_ns=25, window_ns=0, kinds=("alert",))
    assert [(e.kind, e.title, e.session_id) for e in result.evidence] == [("alert", "Alert: warning", "s-1")]
    (issue,) = store.list_issues(kind="alert", session_id="s-1")
    assert store.list_issues(fingerprint_id=issue.fingerprint_id, state_overrides={issue.fingerprint_id: "resolved"}
                             )[0].state == "resolved"


def test_fifos_and_links_out_of_the_roots_are_not_read_for_events(root: Path, tmp_path: Path) -> None:
    """A FIFO named like a telemetry file or a sink segment never blocks the query (a warning
    says so); a segment that links out of the roots, or a manifest naming a file out of its
    folder, is not read."""
    import os

    outside = tmp_path / "outside.jsonl"
    outside.write_text(json.dumps({"session_id": "secret", "timestamp_ns": 5, "event_type": "sample"}) + "\n",
                       encoding="utf-8")
    sink = root / "sink"
    sink.mkdir()
    (sink / "manifest.json").write_text(json.dumps({
        "format": "stormlog.append_only_telemetry_sink", "schema_version": 2, "sessions": [],
        "segments": [{"filename": "../../outside.jsonl", "event_count": 1, "size_bytes": 1, "closed": True,
                      "session_id": "secret"}]}), encoding="utf-8")
    (sink / "segment-000001.jsonl").symlink_to(outside)
    os.mkfifo(sink / "segment-000002.jsonl")
    os.mkfifo(root / "a" / "fifo_events.jsonl")
    for what in ("events", "issues", "summary --metric alert_count", "correlate --at-ns 10"):
        words = what.split()
        out = run_traceml("query", words[0], str(root), "--json", "--no-cache", *words[1:], timeout=120)
        assert out.returncode == 0, out.stderr
        assert "secret" not in out.stdout
    assert "fifo_events.jsonl" in out.stderr and "FIFO" in out.stderr
