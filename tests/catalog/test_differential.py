"""The catalog against real Stormlog 0.4.3 (DESIGN §5; docs/catalog.md): roots made by Stormlog's
own writers and CLI, queried by real ``stormlog query`` and by ``traceml query``; every run,
session and attachment must be the same, field by field. The only differences are the deliberate
ones docs/catalog.md lists, each tested here under its own name:

- TraceML warns where Stormlog is silent (it only records a few warnings, its CLI prints none);
- TraceML lists one session once, where Stormlog lists it once per artifact naming it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.catalog.stormlog_real import (
    T0,
    gpumemprof,
    hand_envelope,
    killed_sink_session,
    oom_bundle,
    require_stormlog,
    same_rows,
    sink_session,
    stormlog_query,
    stormlog_warnings,
    traceml_query,
    write_json,
)

require_stormlog()

@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One root holding every kind of artifact Stormlog writes, and envelopes and sidecars of
    every shape (valid, duplicate, malformed, future; minimal to full sidecar items)."""
    root = tmp_path_factory.mktemp("stormlog-root").resolve()
    # a sink reused by two chronological sessions, and one whose process was killed
    sink_session(root / "sinks" / "reused", "reuse-a", T0 + 1_000)
    sink_session(root / "sinks" / "reused", "reuse-b", T0 + 2_000, status="interrupted")
    killed_sink_session(root / "sinks" / "killed", "killed-1", T0 + 3_000)
    # rank-local sessions of one job written by sinks (grouped by a job-level envelope below)
    for rank in (0, 1):
        sink_session(root / "job9" / f"rank{rank}", f"train9-r{rank}", T0 + 4_000 + rank, job_id="train-9",
                     rank=rank, world_size=2)
    # tracker outputs: two ranks of a torchrun job (identity from RANK/WORLD_SIZE/TORCHELASTIC_RUN_ID), json
    # and csv
    for rank in (0, 1):
        gpumemprof("track", "--duration", "0.6", "--interval", "0.2", "--format", "json", "--output",
                   str(root / "torchrun" / f"track_rank{rank}.json"),
                   env={"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "tr-7"})
    gpumemprof("track", "--duration", "0.6", "--interval", "0.2", "--format", "csv", "--output",
               str(root / "solo" / "track.csv"))
    # a diagnose bundle and an OOM bundle of a sink session
    gpumemprof("diagnose", "--output", str(root / "diag"), "--duration", "1", "--interval", "0.5")
    oom_bundle(root / "oom_dumps", "reuse-b", T0 + 2_000)
    # a vLLM watcher's records file (Stormlog's own record builder): not telemetry, no session
    from stormlog.infer.watch.records import WATCH_SESSION
    from stormlog.infer.watch.records import envelope as watch_record

    (root / "watch").mkdir()
    (root / "watch" / "records.jsonl").write_text("".join(
        json.dumps({**watch_record(WATCH_SESSION, session_id="watch-1", run_id="w-run", timestamp_ns=T0 + i),
                    "phase": phase}) + "\n" for i, phase in enumerate(("started", "ended"))), encoding="utf-8")
    # envelopes: valid (with relative path, URL, source ref), duplicate pair, malformed, not JSON, future
    # version, a job-level one, and one written for a session that is not on disk
    hand_envelope(root / "env" / "valid", "exp-1", ["reuse-a", "killed-1"], title="Experiment 1",
              source_namespace="wandb", source_ref="ent/proj/exp1", tags=["a", "b"],
              attachments=[{"title": "Rank 0 trace", "kind": "profiler_trace", "storage": "reference",
                            "path": "traces/rank0.trace", "session_id": "reuse-a", "rank": 0, "metadata": {}},
                           {"attachment_id": "wb", "title": "W&B", "kind": "experiment", "storage": "reference",
                            "url": "https://wandb.ai/ent/proj/runs/exp1", "metadata": {"entity": "ent"}}])
    hand_envelope(root / "env" / "dup1", "dup", ["reuse-b"])
    hand_envelope(root / "env" / "dup2", "dup", ["reuse-b"])
    write_json(root / "env" / "bad" / "stormlog_run.json",
          {"schema_version": 1, "format": "stormlog.run_envelope", "run_id": "bad", "metadata": {},
           "sessions": [{"session_id": "train9-r0", "status": "completed", "metadata": {}}]})
    (root / "env" / "notjson").mkdir(parents=True)
    (root / "env" / "notjson" / "stormlog_run.json").write_text("{", encoding="utf-8")
    write_json(root / "env" / "future" / "stormlog_run.json",
          {"schema_version": 2, "format": "stormlog.run_envelope", "run_id": "future", "metadata": {}})
    hand_envelope(root / "job9", "job9-run", job_id="train-9", title="Train 9")
    hand_envelope(root / "env" / "absent", "absent-run", ["not-on-disk"], job_id="absent-job")
    # sidecars: every shape Stormlog reads, and the ones it drops
    write_json(root / "side" / "stormlog_attachments.json", {"schema_version": 1, "format": "stormlog.attachments",
                                                        "attachments": [
        {"title": "W&B run", "kind": "experiment", "url": "https://wandb.ai/e/p/r1", "session_id": "reuse-a"},
        {"title": "nsys", "kind": "profiler_trace", "path": "traces/r0.nsys-rep", "job_id": "train-9",
         "storage": "copy", "metadata": {}},
        {"attachment_id": "n1", "title": "notes", "kind": "note", "path": "notes.txt", "run_id": "exp-1",
         "start_ns": T0, "end_ns": T0 + 10, "metadata": {"by": "me"}},
        {"title": "by source ref", "kind": "link", "url": "https://x.example/exp1", "source_namespace": "wandb",
         "source_ref": "ent/proj/exp1", "metadata": {}},
        {"kind": "no-title", "path": "p"},
        {"title": "backwards", "kind": "x", "path": "p", "start_ns": 10, "end_ns": 5},
        {"title": "orphan", "kind": "x", "url": "https://o.example", "session_id": "nowhere", "metadata": {}},
        {"title": "extra field", "kind": "x", "url": "https://e.example", "session_id": "reuse-b", "color": "red",
         "metadata": {}},
        {"title": "oom session", "kind": "x", "url": "https://t.example", "session_id": "tr-none", "rank": "1"},
    ]})
    write_json(root / "side" / "wrong" / "stormlog_attachments.json",
          {"schema_version": 1, "format": "stormlog.something_else", "attachments": []})
    return root


@pytest.mark.parametrize("what", ["runs", "attachments", "sessions"])
def test_traceml_query_gives_what_stormlog_query_gives(root: Path, what: str) -> None:
    theirs = stormlog_query(what, root)
    ours, _ = traceml_query(what, root)
    assert theirs, "the root must give rows"
    same_rows(ours, theirs)


def test_the_root_covers_what_the_issue_names(root: Path) -> None:
    """The comparison above is only as good as the root: it holds each case, as Stormlog sees it."""
    runs = {r["run_id"]: r for r in stormlog_query("runs", root)}
    sessions = {s["session_id"]: s for s in stormlog_query("sessions", root)}
    kinds = {a["kind"] for a in stormlog_query("attachments", root)}
    # a reused sink does not merge its sessions; a killed one stays running; ledger lifecycle
    assert sessions["reuse-a"]["status"] == "completed" and sessions["reuse-b"]["status"] == "interrupted"
    assert sessions["killed-1"]["status"] == "running" and sessions["killed-1"]["ended_at_ns"] is None
    assert "session:reuse-b" in runs and runs["exp-1"]["sessions"] == ["reuse-a", "killed-1"]
    # the job-level envelope groups its job's sessions; torchrun ranks make one implicit run
    assert runs["job9-run"]["sessions"] == ["train9-r0", "train9-r1"] and "job:train-9" not in runs
    assert runs["job:tr-7"]["ranks"] == [0, 1] and runs["job:tr-7"]["session_count"] == 2
    # duplicate, malformed, unreadable and future envelopes are not runs
    assert not {"dup", "bad", "future"} & set(runs)
    assert runs["absent-run"]["session_count"] == 0
    assert {"telemetry_sink", "telemetry_sink_segment", "telemetry_rollup", "diagnose_bundle", "oom_bundle",
            "telemetry_file", "profiler_trace", "experiment", "note", "link", "x"} <= kinds
    assert {s["source_kind"] for s in sessions.values()} == {"sink", "telemetry_json", "telemetry_csv",
                                                             "diagnose_bundle"}
    assert "watch-1" not in sessions  # the watcher's records are not a session


def test_filters_give_what_stormlog_gives(root: Path) -> None:
    for what, flags in (("runs", ("--job-id", "train-9")), ("runs", ("--session", "reuse-a")),
                        ("runs", ("--rank", "1")), ("runs", ("--source-namespace", "wandb")),
                        ("attachments", ("--run-id", "exp-1")), ("attachments", ("--kind", "telemetry_sink")),
                        ("attachments", ("--session-id", "reuse-b", "--rank", "0")),
                        ("sessions", ("--status", "running")), ("sessions", ("--world-size", "2")),
                        ("sessions", ("--source-kind", "sink")), ("sessions", ("--has-oom-bundle",)),
                        ("sessions", ("--no-has-oom-bundle", "--job-id", "tr-7"))):
        theirs = stormlog_query(what, root, extra=flags)
        ours, _ = traceml_query(what, root, extra=flags)
        same_rows(ours, theirs)


def test_deliberate_difference_traceml_warns_where_stormlog_is_silent(root: Path) -> None:
    """Every warning Stormlog records, TraceML gives too (on stderr; Stormlog's CLI prints none);
    and TraceML also names what Stormlog drops silently: the rejected envelopes and sidecar items
    with their field, the session an envelope names that is not on disk, the unresolved item."""
    _, stderr = traceml_query("runs", root)
    for path, _message in stormlog_warnings(root):
        # A diagnose bundle's telemetry_timeline.json with no events is an empty timeline, not a
        # fault: Stormlog warns that it failed to load; TraceML deliberately stays silent
        # (docs/catalog.md, Differences: "diagnose timeline").
        if path != "<run-catalog>" and not path.endswith("telemetry_timeline.json"):
            assert path in stderr
    for needle in ("env/bad/stormlog_run.json: sessions[0].status", "env/future/stormlog_run.json: schema_version",
                   "env/notjson/stormlog_run.json", "env/dup1/stormlog_run.json: run_id",
                   "env/dup2/stormlog_run.json: run_id", "not-on-disk", "attachments[4].title",
                   "attachments[5].end_ns", "attachments[6]: attachment 'orphan' resolves to no run",
                   "attachments[7].color", "side/wrong/stormlog_attachments.json: format",
                   "watch/records.jsonl: not loaded as telemetry"):
        assert needle in stderr, needle


def test_deliberate_difference_one_session_is_listed_once(tmp_path: Path) -> None:
    """A tracker run with ``--telemetry-sink-dir`` leaves the same session in its sink and in its
    JSON output: Stormlog lists that session twice and counts it twice in its run; TraceML lists
    it once (from the sink, which holds its lifecycle) and says where else it was found."""
    root = tmp_path.resolve()
    gpumemprof("track", "--duration", "0.6", "--interval", "0.2", "--format", "json", "--output",
               str(root / "track.json"), "--telemetry-sink-dir", str(root / "sink"))
    theirs = stormlog_query("sessions", root)
    ours, stderr = traceml_query("sessions", root)
    assert len(theirs) == 2 and theirs[0]["session_id"] == theirs[1]["session_id"]
    (sink_row,) = [r for r in theirs if r["source_kind"] == "sink"]
    same_rows(ours, [sink_row])
    assert "duplicate_session" not in stderr and "listed once" in stderr
    (their_run,) = stormlog_query("runs", root)
    (our_run,), _ = traceml_query("runs", root)
    assert their_run["session_count"] == 2 and our_run["session_count"] == 1
    assert {k: v for k, v in our_run.items() if k not in ("session_count", "sessions")} == {
        **{k: v for k, v in their_run.items() if k not in ("session_count", "sessions")}, "status": "completed"}
    assert our_run["sessions"] == their_run["sessions"][:1]
    # the attachments are the same: both artifacts are listed
    same_rows(traceml_query("attachments", root)[0], stormlog_query("attachments", root))


def test_a_sink_folder_given_alone_and_a_file_given_alone(root: Path, tmp_path: Path) -> None:
    for path in (root / "sinks" / "reused", root / "torchrun" / "track_rank0.json", root / "solo" / "track.csv",
                 root / "env" / "valid" / "stormlog_run.json", root / "diag", root / "oom_dumps"):
        for what in ("runs", "attachments", "sessions"):
            same_rows(traceml_query(what, path)[0], stormlog_query(what, path))
    # a copy of a bundle folder under another root gives the same rows there too
    shutil.copytree(root / "diag", tmp_path / "copy" / "diag")
    same_rows(traceml_query("runs", tmp_path / "copy")[0], stormlog_query("runs", tmp_path / "copy"))


def test_the_python_store_has_stormlogs_other_catalog_methods(root: Path) -> None:
    """``traceml_ai.catalog.open()`` answers ``list_oom_bundles()`` and ``list_attachments()`` (the
    sidecar items before their run is resolved) with Stormlog's rows, field by field."""
    import stormlog.query

    import traceml_ai.catalog as catalog

    theirs, ours = stormlog.query.open([root]), catalog.open([root])
    same_rows([b.as_dict() for b in ours.list_oom_bundles()], [b.as_dict() for b in theirs.list_oom_bundles()])
    same_rows([a.as_dict() for a in ours.list_attachments()], [a.as_dict() for a in theirs.list_attachments()])
    assert len(ours.list_attachments()) == 7 and len(ours.list_oom_bundles()) == 1


def _query_in(cwd: Path, what: str, given: str, tool: str) -> list[dict[str, Any]]:
    import subprocess

    from tests.catalog.stormlog_real import BIN

    extra = ["--no-cache"] if tool == "traceml" else []
    out = subprocess.run([str(BIN / tool), "query", what, given, "--json", *extra], capture_output=True, text=True,
                         cwd=cwd, timeout=300)
    assert out.returncode == 0, out.stderr
    rows: list[dict[str, Any]] = json.loads(out.stdout)
    return rows


def test_deliberate_difference_paths_are_absolute_and_real_whatever_root_is_typed(root: Path) -> None:
    """docs/catalog.md, "Paths": TraceML names every file by its real absolute path, so a relative
    PATH or one through a symlink gives the rows an absolute PATH gives, which are Stormlog's rows.
    Stormlog prints the paths it discovered as typed (``root/sinks/...``, ``alias/...``) and, under a
    relative PATH only, also lists each OOM bundle's ``events.json`` as a session of its own."""
    alias = root.parent / f"{root.name}-alias"
    alias.symlink_to(root, target_is_directory=True)
    for what in ("runs", "attachments", "sessions"):
        absolute = stormlog_query(what, root)
        for given in (root.name, alias.name, f"./{root.name}"):
            ours = _query_in(root.parent, what, given, "traceml")
            same_rows(ours, absolute)
            files = [row["source_path"] for row in ours if row["source_path"] and "://" not in row["source_path"]]
            assert files and all(os.path.isabs(p) for p in files), files  # (URLs of external attachments aside)
    relative = _query_in(root.parent, "sessions", root.name, "stormlog")
    assert any(str(row["source_path"]).startswith(f"{root.name}/") for row in relative)  # as typed
    extra = [row for row in relative if "oom_dump_" in str(row["source_path"])
             and str(row["source_path"]).endswith("events.json")]
    assert len(relative) == len(stormlog_query("sessions", root)) + len(extra) and extra


def test_telemetry_records_are_refused_exactly_where_stormlog_refuses_them() -> None:
    """A telemetry file Stormlog cannot load gives it no session (and TraceML a warning): for a v4
    record made by Stormlog and two legacy records, and every one-field mutation of them (~850),
    TraceML's reader accepts a record exactly when Stormlog's ``telemetry_event_from_record`` does."""
    from stormlog.telemetry import telemetry_event_from_record

    from tests.catalog.stormlog_real import record
    from tests.catalog.test_schema import _mutations
    from traceml_ai.catalog.sources import _Bad, _event

    legacy = {"timestamp": 1.5, "memory_allocated": 10, "host": "h", "pid": 3, "session_id": "s", "rank": 0,
              "world_size": 1, "type": "sample"}
    legacy_ns = {"timestamp_ns": 15, "allocator_allocated_bytes": 10, "device_total_bytes": 100, "event_type": "stop",
                 "metadata": {"host": "h", "pid": 3, "job_id": "j", "rank": 1, "world_size": 2}}
    disagree, n = [], 0
    for base in (record("s", 100, job_id="j", rank=1, local_rank=1, world_size=2), legacy, legacy_ns):
        for m in (base, *_mutations(base)):
            if not isinstance(m, dict):
                continue
            n += 1
            try:
                telemetry_event_from_record(m, default_session_id="d")
                theirs = True
            except Exception:
                theirs = False
            try:
                _event(m, "d")
                ours = True
            except _Bad:
                ours = False
            if theirs != ours:
                disagree.append(m)
    assert n > 800
    assert disagree == []


@pytest.mark.parametrize("good", ["sa", "sz"])
def test_a_session_in_two_sinks_is_listed_from_the_ledger_entry_that_was_read(tmp_path: Path, good: str) -> None:
    """Fresh-user review: one killed session copied into two sinks, the ledger entry of one (``sb``)
    made unreadable (NaN end). TraceML listed the copy it had rebuilt from events (incomplete,
    ``artifact:sb``) whichever folder held the good entry; the ledger's copy (running, its writer)
    must win, as Stormlog lists it (once per artifact)."""
    root = tmp_path.resolve()
    killed_sink_session(root / "sb", "k-1", T0)
    shutil.copytree(root / "sb", root / good)
    manifest = root / "sb" / "manifest.json"
    text = manifest.read_text()
    doc = json.loads(text)
    doc["sessions"][0]["ended_at_ns"] = float("nan")
    manifest.write_text(json.dumps(doc, indent=2))
    theirs = [r for r in stormlog_query("sessions", root) if r["source_path"] == str(root / good)]
    ours, stderr = traceml_query("sessions", root)
    (row,) = ours
    same_rows(ours, theirs)
    assert row["status"] == "running" and row["source"] == "stormlog.cpu_profiler"
    assert "sessions[0]" in stderr and f"listed once, from there [{root / good}]" not in stderr
