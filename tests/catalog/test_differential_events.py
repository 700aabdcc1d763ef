"""``traceml query events|ooms|issues|summary|correlate`` and the store's ``query_events``,
``list_oom_bundles``, ``list_attachments``, ``list_issues``, ``summarize``, ``correlate`` against
real Stormlog 0.4.3 (docs/catalog.md, "Events, OOM bundles, issues, summaries, correlation").

The root is written by Stormlog's own writers (``AppendOnlyTelemetrySink`` sessions holding
lifecycle, sample, alert, OOM, collector-health and phase events; ``OOMFlightRecorder.dump``;
``gpumemprof track`` and ``gpumemprof diagnose``), plus legacy tracker records, a JSONL file with
a half-written last line, a CSV with a bad row and a sidecar with timed attachments. Every row
must be the same, field by field, except where docs/catalog.md lists a difference, each tested
here under its own name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.catalog.stormlog_real import (
    event,
    gpumemprof,
    oom_bundle,
    require_stormlog,
    same_rows,
    sink_events,
    stormlog_query,
    traceml_query,
)

require_stormlog()

T = 1_797_000_000_000_000_000
S = 1_000_000_000  # one second in ns


def _phase(sid: str, ts: int, action: str, path: list[str], scope_id: str, seq: int, **ident: Any) -> dict[str, Any]:
    scope = {"action": action, "name": path[-1], "path": path, "depth": len(path), "scope_id": scope_id,
             "parent_scope_id": None, "thread_id": 1, "thread_name": "MainThread", "sequence": seq}
    return event(sid, ts, "phase_enter" if action == "enter" else "phase_exit", metadata={"phase_scope": scope},
                 **ident)


def _session_events(sid: str, rank: int) -> list[dict[str, Any]]:
    ident = {"job_id": "train-3", "rank": rank, "local_rank": rank, "world_size": 2}
    evs = [event(sid, T + 1, "start", **ident)]
    evs += [event(sid, T + 10 + i * S, device_used_bytes=(1 << 20) + i * 4096, **ident) for i in range(6)]
    evs += [
        event(sid, T + 2 * S + 5, "warning", context="High fragmentation 42% on device 0x1f", **ident),
        event(sid, T + 3 * S, metadata={"severity": "Critical", "backend": "cuda"}, **ident),
        event(sid, T + 4 * S, "error", context="CUDA out of memory",
              metadata={"oom_reason": "CUDA out of memory", "oom_dump_path": "/x/oom_dump_1", "backend": "cuda"},
              **ident),
        event(sid, T + 4 * S + 500, "collector_degraded",
              metadata={"collector_health_status": "degraded", "collector_partial_fields": ["device_used_bytes"],
                        "collector_last_error": "timeout after 5s: nvml", "collector_consecutive_failures": 3},
              **ident),
        event(sid, T + 4 * S + 600, metadata={"collector_health_status": "unhealthy"}, **ident),
        event(sid, T + 5 * S, "collector_recovered", metadata={"collector_health_status": "healthy"}, **ident),
        event(sid, T + 5 * S + 1, "critical", context="rank stalled", **ident),
        _phase(sid, T + 1 * S + 1, "enter", ["train"], f"{sid}-p1", 1, **ident),
        _phase(sid, T + 1 * S + 2, "enter", ["train", "forward"], f"{sid}-p2", 2, **ident),
        _phase(sid, T + 2 * S + 2, "exit", ["train", "forward"], f"{sid}-p2", 3, **ident),
        _phase(sid, T + 3 * S + 2, "exit", ["train"], f"{sid}-p1", 4, **ident),
        _phase(sid, T + 5 * S + 2, "enter", ["eval"], f"{sid}-p3", 5, **ident),  # never closed
        event(sid, T + 7 * S, "stop", **ident),
    ]
    return evs


def _json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stormlog-events").resolve()
    sink_events(root / "sinks" / "ev1", "ev-1", T, _session_events("ev-1", 0), job_id="train-3", world_size=2)
    sink_events(root / "sinks" / "ev2", "ev-2", T + 100, _session_events("ev-2", 1), job_id="train-3", rank=1,
                world_size=2, status="interrupted")
    oom_bundle(root / "oom_dumps", "ev-2", T + 100, job_id="train-3")
    oom_bundle(root / "oom_dumps", "ev-1", T)
    gpumemprof("track", "--duration", "0.6", "--interval", "0.2", "--format", "csv", "--output",
               str(root / "solo" / "track.csv"))
    gpumemprof("diagnose", "--output", str(root / "diag"), "--duration", "1", "--interval", "0.5")
    # legacy tracker records (seconds, memory_allocated, memory_mb, type, message, metadata_*)
    _json(root / "legacy" / "legacy_events.json", [
        {"timestamp": (T + 2 * S) / 1e9, "memory_allocated": 100, "memory_reserved": 200, "type": "warning",
         "message": "fragmentation high", "metadata_backend": "cuda", "device": "cuda:1", "total_memory": 1000,
         "session_id": "legacy-1"},
        {"timestamp": (T + 3 * S) / 1e9, "memory_mb": 1.5, "type": "sample", "session_id": "legacy-1"},
        {"timestamp_ns": T + 4 * S, "allocator_allocated_bytes": 5, "event_type": "stop", "session_id": "legacy-1",
         "metadata": {"rank": 1, "world_size": 2, "job_id": "train-3", "host": "h2", "pid": 9}},
    ])
    # JSONL events with a half-written last line; a CSV with a bad row
    lines = [json.dumps(event("jl-1", T + i * S, "warning" if i == 2 else "sample", context="OOM soon" if i == 2
                              else None)) for i in range(4)]
    (root / "events").mkdir()
    (root / "events" / "more.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:40], encoding="utf-8")
    (root / "events" / "hand_events.csv").write_text(
        f"timestamp,memory_allocated,type,session_id\n{(T + S) / 1e9},10,sample,csv-1\nnot-a-time,x,sample,csv-1\n"
        f"{(T + 2 * S) / 1e9},20,stop,csv-1\n", encoding="utf-8")
    # a sidecar of timed attachments
    _json(root / "side" / "stormlog_attachments.json", {"schema_version": 1, "format": "stormlog.attachments",
                                                        "attachments": [
        {"title": "profile", "kind": "profiler_trace", "path": "r0.trace", "session_id": "ev-1", "rank": 0,
         "start_ns": T + 2 * S, "end_ns": T + 3 * S, "metadata": {}},
        {"title": "dashboard", "kind": "experiment", "url": "https://wandb.ai/e/p/r", "job_id": "train-3",
         "created_at_utc": "2026-12-11T10:00:00Z", "metadata": {}},
        {"title": "notes", "kind": "note", "path": "notes.txt", "session_id": "ev-2", "rank": 1, "metadata": {}},
    ]})
    return root


def _cli_same(root: Path, what: str, *flags: str) -> list[dict[str, Any]]:
    theirs = stormlog_query(what, root, extra=flags)
    ours, _ = traceml_query(what, root, extra=flags)
    same_rows(ours, theirs)
    return theirs


def test_the_root_holds_each_case(root: Path) -> None:
    """The comparisons below are only as good as the root: as Stormlog sees it, it holds alerts,
    OOM and collector events, phases, legacy records, two OOM bundles and timed attachments."""
    import stormlog.query

    store = stormlog.query.open([root])
    types = {r.event.event_type for r in store.query_events()}
    assert {"start", "stop", "sample", "warning", "critical", "error", "collector_degraded", "collector_recovered",
            "phase_enter", "phase_exit"} <= types
    assert {i.kind for i in store.list_issues()} == {"oom", "alert", "collector_degradation"}
    assert len(store.list_oom_bundles()) == 2 and len(store.list_attachments()) == 3
    kinds = {s.source_kind for s in store.list_sessions()}
    assert {"sink", "telemetry_json", "telemetry_jsonl", "telemetry_csv", "diagnose_bundle"} <= kinds


@pytest.mark.parametrize("flags", [(), ("--session", "ev-1"), ("--event-type", "warning"), ("--rank", "1"),
                                   ("--status", "interrupted"), ("--has-alert",), ("--no-has-alert", "--limit", "7"),
                                   ("--collector-health-status", "degraded"), ("--backend", "cuda"),
                                   ("--time-start-ns", str(T + 2 * S), "--time-end-ns", str(T + 4 * S)),
                                   ("--collector", "legacy.csv")])
def test_events_are_stormlogs(root: Path, flags: tuple[str, ...]) -> None:
    rows = _cli_same(root, "events", *flags)
    assert rows or flags == ("--collector", "legacy.csv")


def test_ooms_are_stormlogs(root: Path) -> None:
    assert len(_cli_same(root, "ooms")) == 2
    for flags in (("--session", "ev-2"), ("--backend", "cpu"), ("--reason", "torch.cuda.OutOfMemoryError"),
                  ("--created-after", "2000-01-01T00:00:00Z"), ("--created-before", "2000-01-01")):
        _cli_same(root, "ooms", *flags)


def test_issues_are_stormlogs(root: Path) -> None:
    rows = _cli_same(root, "issues")
    assert len(rows) >= 5 and all(r["fingerprint_id"].startswith("issue:") for r in rows)
    for flags in (("--kind", "alert"), ("--severity", "warning"), ("--session", "ev-2"),
                  ("--fingerprint-id", rows[0]["fingerprint_id"]), ("--state", "open"), ("--state", "resolved")):
        _cli_same(root, "issues", *flags)


def test_issue_state_overrides_are_stormlogs(root: Path) -> None:
    import stormlog.query

    import traceml_ai.catalog as catalog

    theirs, ours = stormlog.query.open([root]), catalog.open([root])
    fid = theirs.list_issues()[1].fingerprint_id
    same_rows([i.as_dict() for i in ours.list_issues(state_overrides={fid: " Ignored "})],
              [i.as_dict() for i in theirs.list_issues(state_overrides={fid: " Ignored "})])
    with pytest.raises(ValueError, match="unsupported issue state"):
        ours.list_issues(state_overrides={fid: "closed"})


METRICS = ("session_count_by_status", "peak_allocator_allocated_bytes", "peak_allocator_reserved_bytes",
           "peak_device_used_bytes", "alert_count", "collector_degradation_transitions",
           "interrupted_sessions_with_oom_bundles", "hidden_memory_gap_growth")


@pytest.mark.parametrize("group_by", [None, "session", "session-rank", "rank", "status"])
def test_every_summary_is_stormlogs(root: Path, group_by: str | None) -> None:
    import stormlog.query

    import traceml_ai.catalog as catalog

    theirs, ours = stormlog.query.open([root]), catalog.open([root])
    for metric in METRICS:
        same_rows([r.as_dict() for r in ours.summarize(metric, group_by=group_by)],
                  [r.as_dict() for r in theirs.summarize(metric, group_by=group_by)])


def test_summaries_from_a_root_of_sinks_only_are_stormlogs(root: Path, tmp_path: Path) -> None:
    """With only sinks (fresh ``rollups.json`` beside them), Stormlog answers most summaries from
    the rollups; TraceML from the events: the same rows, also for a sink whose oldest segments
    its retention pruned (the rollups are remade from the segments kept)."""
    from stormlog.session import create_session_summary
    from stormlog.telemetry_sink import AppendOnlyTelemetrySink, TelemetrySinkConfig

    for name in ("ev1", "ev2"):
        shutil.copytree(root / "sinks" / name, tmp_path / name)
    sink = AppendOnlyTelemetrySink(TelemetrySinkConfig(root_dir=tmp_path / "pruned", rollover_max_events=3,
                                                       retention_max_files=2, flush_every_events=1))
    sink.start_session(create_session_summary(source="x", session_id="p-1", started_at_ns=T, host="h", pid=1))
    for i in range(12):
        sink.append(event("p-1", T + i * S, "warning" if i in (1, 2, 9) else "sample",
                          device_used_bytes=(100 - i) << 20))
    sink.close()
    assert not (tmp_path / "pruned" / "segment-000001.jsonl").exists()
    import stormlog.query

    import traceml_ai.catalog as catalog

    theirs, ours = stormlog.query.open([tmp_path]), catalog.open([tmp_path])
    assert theirs._fresh_sink_rollups() is not None  # the rollup path is the one taken
    for metric in METRICS:
        for group_by in (None, "session", "session-rank", "rank", "status"):
            same_rows([r.as_dict() for r in ours.summarize(metric, group_by=group_by)],
                      [r.as_dict() for r in theirs.summarize(metric, group_by=group_by)])


def test_summary_cli_is_stormlogs(root: Path) -> None:
    for flags in (("--metric", "alert_count"), ("--metric", "peak_device_used_bytes", "--group-by", "rank"),
                  ("--metric", "session_count_by_status")):
        assert _cli_same(root, "summary", *flags)


def test_sidecar_items_and_their_filters_are_stormlogs(root: Path) -> None:
    import stormlog.query
    from stormlog.correlation import AttachmentFilter

    import traceml_ai.catalog as catalog

    theirs, ours = stormlog.query.open([root]), catalog.open([root])
    for kw in ({}, {"session_id": "ev-1"}, {"job_id": "train-3"}, {"rank": 1}, {"kind": "note"}):
        same_rows([a.as_dict() for a in ours.list_attachments(catalog.AttachmentFilter(**kw))],
                  [a.as_dict() for a in theirs.list_attachments(AttachmentFilter(**kw))])


def _anchors(root: Path) -> list[dict[str, Any]]:
    import stormlog.query
    from stormlog.telemetry import project_telemetry_event

    store = stormlog.query.open([root])
    rows = store.query_events()
    picks = [r for r in rows if r.event.event_type in ("error", "warning", "phase_exit", "collector_degraded")]
    anchors: list[dict[str, Any]] = []
    for r in picks[:6]:
        rid = project_telemetry_event(r.event).record_id
        anchors += [{"record_id": rid}, {"record_id": rid, "scope": "distributed", "window_ns": S},
                    {"at_ns": r.event.timestamp_ns, "window_ns": 2 * S},
                    {"at_ns": r.event.timestamp_ns, "session_id": r.event.session_id, "rank": 1},
                    {"record_id": rid, "scope": "distributed", "kinds": ("timeline_marker", "attachment", "oom_bundle",
                                                                         "diagnose_bundle", "rollup_window")}]
    anchors += [{"at_ns": T + 2 * S, "job_id": "train-3", "scope": "distributed", "limit": 9},
                {"at_ns": T, "window_ns": 10 ** 18, "kinds": ("oom_bundle", "attachment")}]
    # the diagnose bundle's and the tracker's sessions ran now, not at T
    for s in store.list_sessions():
        if s.source_kind in ("diagnose_bundle", "telemetry_csv") and s.started_at_ns > 0:
            anchors += [{"at_ns": s.started_at_ns + 1}, {"at_ns": s.started_at_ns, "session_id": s.session_id}]
    return anchors


def test_correlation_is_stormlogs(root: Path) -> None:
    """Anchor and evidence, field by field (incl. evidence ids, confidence and reasons), for
    record and time anchors, both scopes, kinds and limits. The ``warnings`` differ on purpose:
    they are TraceML's warnings (see the deliberate-difference test below)."""
    import stormlog.query
    from stormlog.correlation import CorrelationFilter

    import traceml_ai.catalog as catalog

    theirs, ours = stormlog.query.open([root]), catalog.open([root])
    kinds_seen: set[str] = set()
    for a in _anchors(root):
        t = theirs.correlate(CorrelationFilter(**a)).as_dict()
        o = ours.correlate(catalog.CorrelationFilter(**a)).as_dict()
        assert o["anchor"] == t["anchor"], a
        same_rows(o["evidence"], t["evidence"])
        kinds_seen |= {e["kind"] for e in t["evidence"]}
    assert kinds_seen == {"telemetry_event", "timeline_marker", "alert", "oom_bundle", "diagnose_bundle",
                          "rollup_window", "attachment"}


def test_correlate_cli_is_stormlogs(root: Path) -> None:
    import subprocess

    from tests.catalog.stormlog_real import BIN

    for flags in (("--at-ns", str(T + 4 * S)), ("--at-ns", str(T + 2 * S), "--scope", "distributed", "--job-id",
                                                  "train-3", "--kind", "timeline_marker", "--kind", "alert")):
        theirs = json.loads(subprocess.run([str(BIN / "stormlog"), "query", "correlate", str(root), "--json", *flags],
                                           capture_output=True, text=True, timeout=300, check=True).stdout)
        ours = json.loads(subprocess.run([str(BIN / "traceml"), "query", "correlate", str(root), "--json",
                                          "--no-cache", *flags], capture_output=True, text=True, timeout=300,
                                         check=True).stdout)
        assert set(ours) == set(theirs) == {"anchor", "evidence", "warnings"}
        assert ours["anchor"] == theirs["anchor"]
        same_rows(ours["evidence"], theirs["evidence"])
    bad = subprocess.run([str(BIN / "traceml"), "query", "correlate", str(root), "--record-id", "telemetry-nope",
                          "--no-cache"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and "record_id not found: telemetry-nope" in bad.stderr
    both = subprocess.run([str(BIN / "traceml"), "query", "correlate", str(root)], capture_output=True, text=True,
                          timeout=300)
    assert both.returncode == 2 and "--at-ns" in both.stderr


def test_deliberate_difference_correlation_warnings_are_traceml_warnings(root: Path) -> None:
    """Stormlog's ``warnings`` hold the few messages its catalog records; TraceML's hold every
    catalog warning, worded as ``traceml query`` prints them (file: field: message). Each
    Stormlog warning's file is named in one of TraceML's."""
    import stormlog.query
    from stormlog.correlation import CorrelationFilter

    import traceml_ai.catalog as catalog

    theirs = stormlog.query.open([root]).correlate(CorrelationFilter(at_ns=T))
    ours = catalog.open([root]).correlate(catalog.CorrelationFilter(at_ns=T))
    ours_text = "\n".join(ours.warnings)
    assert "events/hand_events.csv: line 3" in ours_text  # the bad CSV row, which Stormlog's warnings omit
    for w in stormlog.query.open([root]).catalog.warnings:
        assert w.path in ours_text or w.path == "<run-catalog>"
    assert len(ours.warnings) >= len(theirs.warnings)


def test_deliberate_difference_events_of_a_session_are_listed_once(tmp_path: Path) -> None:
    """A tracker run with ``--telemetry-sink-dir`` leaves one session in its sink and its JSON
    output: Stormlog lists each of its events twice (once per artifact) and counts them twice in
    summaries and issues; TraceML lists them once, from the sink (as it lists the session once)."""
    root = tmp_path.resolve()
    gpumemprof("track", "--duration", "0.6", "--interval", "0.2", "--format", "json", "--output",
               str(root / "track.json"), "--telemetry-sink-dir", str(root / "sink"))
    theirs = stormlog_query("events", root)
    ours, _ = traceml_query("events", root)
    from_sink = [r for r in theirs if r["source_kind"] == "sink"]
    assert len(theirs) == 2 * len(from_sink) > 0
    same_rows(ours, from_sink)


def _gap_sessions(tmp_path: Path) -> None:
    """Sessions whose device-vs-allocator gap drifts up, spikes once, or sits in inactive split
    blocks, inside phases (one thread, two threads at once, an event naming its thread)."""
    ident = {"job_id": "j", "rank": 0, "local_rank": 0, "world_size": 1}
    total = 1 << 30

    def sample(sid: str, i: int, used: int, **more: Any) -> dict[str, Any]:
        return event(sid, T + i * S, device_total_bytes=total, device_used_bytes=used, **ident, **more)

    def phase(sid: str, i: int, action: str, path: list[str], scope: str, seq: int, thread: int) -> dict[str, Any]:
        e = _phase(sid, T + i * S + 1, action, path, scope, seq, **ident)
        e["metadata"]["phase_scope"].update(thread_id=thread, thread_name=f"t{thread}")
        return e

    drift = [sample("gap-drift", i, (1 << 20) + i * (16 << 20) + (i % 3) * (1 << 20)) for i in range(8)]
    drift += [phase("gap-drift", 0, "enter", ["train"], "d1", 1, 1),
              phase("gap-drift", 7, "exit", ["train"], "d1", 2, 1),
              event("gap-drift", T + 9 * S, "warning", context="gap growing", **ident)]
    spike = [sample("gap-spike", i, (1 << 20) + (200 << 20 if i == 6 else i * 1024)) for i in range(10)]
    spike += [phase("gap-spike", 5, "enter", ["train", "fwd"], "s1", 1, 1),
              phase("gap-spike", 5, "enter", ["eval"], "s2", 2, 2),
              phase("gap-spike", 8, "exit", ["eval"], "s2", 3, 2)]
    frag = [sample("gap-frag", i, (120 << 20), allocator_inactive_bytes=(700 << 10) if i % 2 else (400 << 10),
                   metadata={"origin_thread_id": 3}) for i in range(6)]
    frag += [phase("gap-frag", 0, "enter", ["step"], "f1", 1, 3), phase("gap-frag", 0, "enter", ["data"], "f2", 2, 4)]
    for sid, evs in (("gap-drift", drift), ("gap-spike", spike), ("gap-frag", frag)):
        sink_events(tmp_path / sid, sid, T, evs, job_id="j")


def test_hidden_memory_anomaly_issues_are_stormlogs(tmp_path: Path) -> None:
    """Stormlog's hidden-memory analysis (z-score spikes, a least-squares drift with its p-value,
    inactive-split fragmentation, each with the workload phase active at its evidence event):
    the same issues, fingerprints and details, field by field."""
    _gap_sessions(tmp_path)
    import stormlog.query

    import traceml_ai.catalog as catalog

    theirs = [i.as_dict() for i in stormlog.query.open([tmp_path]).list_issues()]
    ours = [i.as_dict() for i in catalog.open([tmp_path]).list_issues()]
    found = {i["details"]["classification"] for i in theirs if i["kind"] == "hidden_memory_anomaly"}
    assert found == {"persistent_drift", "transient_spike", "fragmentation_like"}
    phases = {i["details"]["phase"] for i in theirs if i["kind"] == "hidden_memory_anomaly"}
    assert len(phases - {None}) >= 2
    same_rows(ours, theirs)
    same_rows(traceml_query("issues", tmp_path, extra=("--kind", "hidden_memory_anomaly"))[0],
              stormlog_query("issues", tmp_path, extra=("--kind", "hidden_memory_anomaly")))


def test_deliberate_difference_a_peak_skips_events_that_did_not_measure_it(tmp_path: Path) -> None:
    """A schema-v4 event may leave a counter null (not measured): Stormlog's peak summary fails on
    it (when it reads events, not rollups); TraceML's leaves that event out."""
    lines = [event("n-1", T + 1, allocator_allocated_bytes=5, device_used_bytes=5),
             event("n-1", T + 2, allocator_allocated_bytes=None, allocator_change_bytes=None, device_used_bytes=7)]
    (tmp_path / "nulls.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    import stormlog.query

    import traceml_ai.catalog as catalog

    with pytest.raises(TypeError):
        stormlog.query.open([tmp_path]).summarize("peak_allocator_allocated_bytes")
    (row,) = catalog.open([tmp_path]).summarize("peak_allocator_allocated_bytes")
    assert (row.session_id, row.value, row.details) == ("n-1", 5, {"timestamp_ns": T + 1})
    same_rows([r.as_dict() for r in catalog.open([tmp_path]).summarize("peak_device_used_bytes")],
              [r.as_dict() for r in stormlog.query.open([tmp_path]).summarize("peak_device_used_bytes")])


def test_traceml_query_has_every_subcommand_and_flag_of_stormlog_query() -> None:
    """Read from real Stormlog's own argument parser: each subcommand of ``stormlog query`` and
    each of its option strings (``--session``, ``--no-has-alert``, ...) exists in ``traceml query``."""
    import argparse

    import typer
    from stormlog.query_cli import _build_parser

    from traceml_ai.cli.query import app

    group = typer.main.get_command(app)
    ours = {name: {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
            for name, cmd in group.commands.items()}  # type: ignore[attr-defined]
    (sub,) = [a for a in _build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) <= set(ours)
    for name, parser in sub.choices.items():
        theirs = {o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")}
        assert theirs <= ours[name], (name, theirs - ours[name])
