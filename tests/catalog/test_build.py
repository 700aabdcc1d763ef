"""Explicit and implicit runs, and where attachments go (004 seed, "Discovery Rules", "Attachments";
DESIGN §5). Each test builds a small artifact root in tmp_path and reads it as a user would."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import traceml_ai.catalog as catalog
from tests.catalog.fixtures import (
    SEED_MINIMAL_ENVELOPE,
    envelope,
    sidecar,
    sink,
    telemetry_jsonl,
    traceml_session,
    write_json,
)


def codes(store: catalog.CatalogStore) -> list[str]:
    return [w.code for w in store.warnings]


def test_the_seed_minimal_example(tmp_path: Path) -> None:
    (tmp_path / "stormlog_run.json").write_text(SEED_MINIMAL_ENVELOPE, encoding="utf-8")
    telemetry_jsonl(tmp_path / "telemetry" / "rank0.jsonl", "session-rank-0", job_id="train-42", rank=0,
                    world_size=8)
    store = catalog.open([tmp_path])
    (run,) = store.list_runs()
    assert (run.run_id, run.explicit, run.job_id, run.sessions, run.ranks) == (
        "run-train-42", True, "train-42", ("session-rank-0",), (0,))
    (session,) = store.list_sessions()
    assert (session.role, session.world_size, session.kind, session.status) == ("rank", 8, "telemetry_jsonl",
                                                                               "completed")
    trace = store.list_run_attachments(run_id="run-train-42", kind="profiler_trace")[0]
    assert trace.path == str(tmp_path / "traces" / "rank0.trace")  # relative to the envelope's folder
    assert (trace.storage, trace.title, trace.metadata, trace.url) == (
        "reference", "Rank 0 profiler trace", {"tool": "nsys"}, None)
    assert store.warnings == []


def test_mixed_explicit_and_implicit_runs_in_one_root(tmp_path: Path) -> None:
    traceml_session(tmp_path / "grouped" / "a", "a")
    traceml_session(tmp_path / "grouped" / "b", "b")
    envelope(tmp_path / "grouped", "pair", ["a", "b"])
    traceml_session(tmp_path / "alone", "c")
    telemetry_jsonl(tmp_path / "ranks" / "r0.jsonl", "d0", job_id="job-7", rank=0, world_size=2)
    telemetry_jsonl(tmp_path / "ranks" / "r1.jsonl", "d1", job_id="job-7", rank=1, world_size=2)
    store = catalog.open([tmp_path])
    runs = {r.run_id: r for r in store.list_runs()}
    assert set(runs) == {"pair", "session:c", "job:job-7"}
    assert runs["pair"].explicit and runs["pair"].sessions == ("a", "b")
    assert not runs["session:c"].explicit and runs["session:c"].title == "alone"
    assert runs["job:job-7"].sessions == ("d0", "d1") and runs["job:job-7"].ranks == (0, 1)
    assert store.warnings == []


def test_duplicate_run_ids_reject_every_envelope_and_sessions_fall_back(tmp_path: Path) -> None:
    traceml_session(tmp_path / "one" / "s", "s1")
    traceml_session(tmp_path / "two" / "s", "s2")
    attachment = {"attachment_id": "trace", "kind": "profiler_trace", "storage": "reference", "path": "t.trace"}
    first = envelope(tmp_path / "one", "same-id", ["s1"], [attachment])
    second = envelope(tmp_path / "two", "same-id", ["s2"], [attachment])
    store = catalog.open([tmp_path])
    assert [r.run_id for r in store.list_runs()] == ["session:s1", "session:s2"]
    assert codes(store) == ["duplicate_run_id", "duplicate_run_id"]
    assert [w.path for w in store.warnings] == [str(first), str(second)]
    assert all(w.field == "run_id" and "not indexed" in w.message for w in store.warnings)
    assert store.list_run_attachments(kind="profiler_trace") == []  # the rejected envelopes' attachments


def test_an_invalid_envelope_is_rejected_with_a_warning_per_field(tmp_path: Path) -> None:
    traceml_session(tmp_path / "s", "s")
    path = write_json(tmp_path / "stormlog_run.json", {
        "schema_version": 1, "format": "stormlog.run_envelope", "run_id": "r", "sessions": [{"session_id": "s"}],
        "attachments": [{"attachment_id": "x", "kind": "k", "storage": "copied", "path": "p"}]})
    store = catalog.open([tmp_path])
    assert [r.run_id for r in store.list_runs()] == ["session:s"]
    assert {(w.code, w.field) for w in store.warnings} == {("invalid_envelope", "metadata"),
                                                          ("invalid_envelope", "attachments[0].storage")}
    assert all(w.path == str(path) for w in store.warnings)


def test_an_envelope_that_is_not_json_is_reported(tmp_path: Path) -> None:
    (tmp_path / "stormlog_run.json").write_text("{ not json", encoding="utf-8")
    store = catalog.open([tmp_path])
    assert codes(store) == ["unreadable"] and "not valid JSON" in store.warnings[0].message


def test_an_envelope_naming_sessions_not_on_disk_still_lists_them(tmp_path: Path) -> None:
    traceml_session(tmp_path / "r0", "rank-0", job_id="train-9", rank=0)
    path = envelope(tmp_path, "train-9-run", [{"session_id": "rank-0"},
                                             {"session_id": "rank-1", "rank": 1, "job_id": "train-9"}])
    store = catalog.open([tmp_path])
    (run,) = store.list_runs()
    assert run.sessions == ("rank-0", "rank-1") and run.ranks == (0, 1)
    missing = store.list_sessions(session_id="rank-1")[0]
    assert (missing.on_disk, missing.kind, missing.status, missing.source_path) == (
        False, "envelope_only", None, str(path))
    (w,) = store.warnings
    assert (w.code, w.field) == ("session_not_found", "sessions[1].session_id")


def test_a_session_claimed_by_two_envelopes_is_in_both_runs_and_reported(tmp_path: Path) -> None:
    traceml_session(tmp_path / "s", "shared")
    envelope(tmp_path / "a", "run-a", ["shared"])
    second = envelope(tmp_path / "b", "run-b", ["shared"])
    store = catalog.open([tmp_path])
    assert [(r.run_id, r.sessions) for r in store.list_runs()] == [("run-a", ("shared",)), ("run-b", ("shared",))]
    assert [s.run_id for s in store.list_sessions(session_id="shared")] == ["run-a", "run-b"]
    (w,) = store.warnings
    assert (w.code, w.path, w.field) == ("session_claimed_twice", str(second), "sessions[0].session_id")
    assert "run-a" in w.message


def test_sessions_without_job_id_are_one_run_each_even_in_one_sink_folder(tmp_path: Path) -> None:
    sink(tmp_path / "sink", [{"session_id": "morning", "rank": 0, "segments": ["m.jsonl"]},
                             {"session_id": "evening", "rank": 0, "segments": ["e.jsonl"]}])
    store = catalog.open([tmp_path])
    assert [r.run_id for r in store.list_runs()] == ["session:morning", "session:evening"]
    assert store.warnings == []


def test_rank_local_sessions_with_one_job_id_form_one_distributed_run(tmp_path: Path) -> None:
    sink(tmp_path / "node0", [{"session_id": f"r{i}", "job_id": "big", "rank": i, "local_rank": i, "world_size": 4,
                               "started_at_ns": 100 + i, "ended_at_ns": 200 + i, "status": "completed"}
                              for i in range(2)])
    sink(tmp_path / "node1", [{"session_id": f"r{i}", "job_id": "big", "rank": i, "local_rank": i - 2,
                               "world_size": 4, "started_at_ns": 100 + i, "status": "running"}
                              for i in range(2, 4)])
    store = catalog.open([tmp_path])
    (run,) = store.list_runs()
    assert (run.run_id, run.ranks, run.session_count) == ("job:big", (0, 1, 2, 3), 4)
    assert (run.started_at_ns, run.ended_at_ns, run.status) == (100, None, "running")  # two ranks still run


def test_two_sessions_of_one_job_with_the_same_rank_are_reported(tmp_path: Path) -> None:
    telemetry_jsonl(tmp_path / "a.jsonl", "first-try", job_id="j", rank=0)
    telemetry_jsonl(tmp_path / "b.jsonl", "second-try", job_id="j", rank=0)
    store = catalog.open([tmp_path])
    assert store.list_runs()[0].sessions == ("first-try", "second-try")
    assert codes(store) == ["ambiguous_rank"]


def test_one_session_id_from_two_sources_is_reported_and_both_are_kept(tmp_path: Path) -> None:
    traceml_session(tmp_path / "copy-1", "same")
    traceml_session(tmp_path / "copy-2", "same")
    store = catalog.open([tmp_path])
    assert [r.run_id for r in store.list_runs()] == ["session:same", "session:same#2"]
    assert codes(store) == ["duplicate_session"]
    # each run lists its own folder's artifacts, not the copy's (seen in the viewer after copying a run)
    for run_id, folder in (("session:same", "copy-1"), ("session:same#2", "copy-2")):
        paths = [a.path for a in store.list_run_attachments(run_id=run_id)]
        assert paths and all(f"{os.sep}{folder}{os.sep}" in str(p) for p in paths), paths


def test_rotated_jsonl_files_of_one_session_are_one_session(tmp_path: Path) -> None:
    telemetry_jsonl(tmp_path / "s.0.jsonl", "s", rank=0, ended=None)
    telemetry_jsonl(tmp_path / "s.1.jsonl", "s", rank=0, ended="completed")
    store = catalog.open([tmp_path])
    (s,) = store.list_sessions()
    assert s.status == "completed" and len(store.list_run_attachments(session_id="s")) == 2
    assert store.warnings == []


def test_sidecar_items_resolve_by_run_session_job_or_folder(tmp_path: Path) -> None:
    traceml_session(tmp_path / "job" / "r0", "s0", job_id="j", rank=0)
    traceml_session(tmp_path / "solo", "solo")
    envelope(tmp_path / "job", "explicit-j", ["s0"], job_id="j")
    item = {"kind": "note", "storage": "reference"}
    sidecar(tmp_path / "notes", [
        {**item, "attachment_id": "by-run", "run_id": "explicit-j", "path": "a.txt"},
        {**item, "attachment_id": "by-session", "session_id": "solo", "path": "b.txt"},
        {**item, "attachment_id": "by-job", "job_id": "j", "url": "https://wandb.example/e/p/r"},
    ])
    sidecar(tmp_path / "solo" / "logs", [{**item, "attachment_id": "by-folder", "path": "c.txt"}])
    store = catalog.open([tmp_path])
    got = {a.attachment_id: a.run_id for a in store.list_run_attachments(kind="note")}
    assert got == {"by-run": "explicit-j", "by-session": "session:solo", "by-job": "explicit-j",
                   "by-folder": "session:solo"}
    assert store.list_run_attachments(kind="note", session_id="solo")[0].path == str(tmp_path / "notes" / "b.txt")
    assert store.warnings == []


def test_an_attachment_that_resolves_to_no_run_is_listed_and_reported(tmp_path: Path) -> None:
    path = sidecar(tmp_path / "loose", [
        {"attachment_id": "orphan", "kind": "note", "storage": "reference", "path": "n.txt"},
        {"attachment_id": "ghost", "kind": "note", "storage": "reference", "path": "g.txt", "run_id": "no-such-run"},
    ])
    store = catalog.open([tmp_path])
    assert [(a.attachment_id, a.run_id) for a in store.list_run_attachments()] == [("orphan", None),
                                                                                   ("ghost", None)]
    assert [(w.code, w.path, w.field) for w in store.warnings] == [
        ("unresolved_attachment", str(path), "attachments[0]"), ("unresolved_attachment", str(path), "attachments[1]")]
    assert "no run 'no-such-run'" in store.warnings[1].message


def test_a_bad_sidecar_item_is_reported_and_the_rest_is_kept(tmp_path: Path) -> None:
    traceml_session(tmp_path, "s")
    path = sidecar(tmp_path, [{"attachment_id": "good", "kind": "note", "storage": "copy", "path": "run.json"},
                              {"attachment_id": "bad", "kind": "note", "storage": "moved", "path": "x"}])
    store = catalog.open([tmp_path])
    assert [a.attachment_id for a in store.list_run_attachments(kind="note")] == ["good"]
    (w,) = store.warnings
    assert (w.code, w.path, w.field) == ("invalid_sidecar_item", str(path), "attachments[1].storage")


def test_a_copy_attachment_whose_file_is_missing_is_reported(tmp_path: Path) -> None:
    path = envelope(tmp_path, "r", [], [{"attachment_id": "gone", "kind": "k", "storage": "copy", "path": "gone.bin"}])
    store = catalog.open([tmp_path])
    (w,) = store.warnings
    assert (w.code, w.path, w.field) == ("missing_attachment_file", str(path), "attachments[0].path")


def test_a_local_artifact_the_envelope_lists_is_listed_once_in_its_words(tmp_path: Path) -> None:
    traceml_session(tmp_path / "run", "s")
    envelope(tmp_path, "r", ["s"], [{"attachment_id": "db", "title": "The database", "kind": "telemetry_database",
                                     "storage": "copy", "path": "run/aggregator/telemetry.sqlite"}])
    store = catalog.open([tmp_path])
    dbs = store.list_run_attachments(kind="telemetry_database")
    assert [(a.attachment_id, a.title) for a in dbs] == [("db", "The database")]


def test_remote_urls_are_recorded_and_never_fetched(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.3)
        url = f"http://127.0.0.1:{server.getsockname()[1]}/profile/rank0.json"
        envelope(tmp_path, "r", [], [{"attachment_id": "remote", "kind": "profiler_trace", "storage": "reference",
                                      "url": url}])
        sidecar(tmp_path, [{"attachment_id": "remote-2", "kind": "experiment", "storage": "reference", "url": url}])
        store = catalog.open([tmp_path])
        connections: list[object] = []

        def accept() -> None:
            try:
                connections.append(server.accept())
            except TimeoutError:
                pass

        t = threading.Thread(target=accept)
        t.start()
        t.join()
    assert [(a.attachment_id, a.url, a.path) for a in store.list_run_attachments()] == [
        ("remote", url, None), ("remote-2", url, None)]
    assert connections == []


def test_two_sessions_with_one_rank_in_one_ledger_name_the_ledger_once(tmp_path: Path) -> None:
    sink(tmp_path / "sink", [{"session_id": "s-a", "job_id": "j", "rank": 0},
                             {"session_id": "s-b", "job_id": "j", "rank": 0}])
    (w,) = catalog.open([tmp_path]).warnings
    ledger = str(tmp_path / "sink" / "manifest.json")
    assert w.message == (f"job 'j' has 2 sessions with rank 0 ('s-a', 's-b'; in {ledger}); "
                         "all are listed in run 'job:j'")


def test_a_ledger_segment_that_is_missing_or_outside_the_root_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "root"
    sink(root / "a" / "sink", [{"session_id": "s-0", "segments": ["seg-1.jsonl"]}])
    write_json(root / "a" / "sink" / "manifest.json", {"format": "stormlog.sink_manifest", "sessions": [
        {"session_id": "s-0", "segments": ["seg-1.jsonl", "seg-2.jsonl", "../../../etc/passwd"]}]})
    store = catalog.open([root])
    assert sorted((w.code, w.message.split(" of ")[0]) for w in store.warnings) == [
        ("attachment_outside_root", f"sink segment {tmp_path / 'etc' / 'passwd'}"),
        ("missing_attachment_file", f"sink segment {root / 'a' / 'sink' / 'seg-2.jsonl'}"),
    ]
    assert len(store.list_run_attachments(kind="sink_segment")) == 3  # still listed


def test_an_envelope_path_leaving_the_roots_or_looking_like_a_url_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "root"
    envelope(root, "r", attachments=[
        {"attachment_id": "up", "kind": "k", "storage": "reference", "path": "../secret.txt"},
        {"attachment_id": "abs", "kind": "k", "storage": "reference", "path": "/etc/passwd"},
        {"attachment_id": "web", "kind": "k", "storage": "reference", "path": "https://example.com/a"},
        {"attachment_id": "in", "kind": "k", "storage": "reference", "path": "notes.md"},
    ])
    store = catalog.open([root])
    assert [(w.field, w.code) for w in store.warnings] == [
        ("attachments[0].path", "attachment_outside_root"),
        ("attachments[1].path", "attachment_outside_root"),
        ("attachments[2].path", "path_is_url"),
    ]
    assert '"https://example.com/a" looks like a URL; put it in url' in store.warnings[2].message


def test_a_sidecar_reusing_an_attachment_id_of_its_run_is_reported(tmp_path: Path) -> None:
    envelope(tmp_path, "r", attachments=[{"attachment_id": "notes", "kind": "k", "storage": "reference",
                                          "url": "https://example.com/n"}])
    sidecar(tmp_path / "more", [
        {"attachment_id": "trace", "kind": "k", "storage": "reference", "url": "https://example.com/t1"},
        {"attachment_id": "trace", "kind": "k", "storage": "reference", "url": "https://example.com/t2"},
        {"attachment_id": "notes", "kind": "k", "storage": "reference", "url": "https://example.com/n2"},
    ], run_id="r")
    store = catalog.open([tmp_path])
    assert [(a.attachment_id, a.url) for a in store.list_run_attachments()] == [
        ("notes", "https://example.com/n"), ("trace", "https://example.com/t1")]
    assert [(w.field, w.code) for w in store.warnings] == [
        ("attachments[1].attachment_id", "duplicate_attachment_id"),
        ("attachments[2].attachment_id", "duplicate_attachment_id"),
    ]
    assert "is already an attachment of run 'r' (from " in store.warnings[0].message
