"""Fresh-user review of the catalog against real Stormlog 0.4.3 (issue 10): what a user sees on
stderr for a bad ledger entry, a sidecar item, Stormlog's own minimal sidecar, an empty JSON
file, and what ``open()`` does with a str. The rows are compared with real ``stormlog query``;
where TraceML deliberately differs, the test says so and docs/catalog.md lists it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import traceml_ai.catalog as catalog
from tests.catalog.stormlog_real import (
    T0,
    gpumemprof,
    record,
    require_stormlog,
    same_rows,
    sink_session,
    stormlog_query,
    stormlog_warnings,
    traceml_query,
    write_json,
)

require_stormlog()


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("warning:")]


def test_a_bad_ledger_entry_names_its_field_and_says_nan(tmp_path: Path) -> None:
    """A sink ledger entry whose ``started_at_ns`` is NaN: Stormlog skips the entry (and reads the
    session from its events), as TraceML does; TraceML's warning names ``sessions[0].started_at_ns``
    and shows the value as NaN, the way the file holds it, not as null."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s-nan", T0)
    manifest = root / "sink" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["sessions"][0]["started_at_ns"] = float("nan")
    manifest.write_text(json.dumps(doc), encoding="utf-8")
    for what in ("runs", "sessions", "attachments"):
        same_rows(traceml_query(what, root)[0], stormlog_query(what, root))
    _, stderr = traceml_query("sessions", root)
    (line,) = [w for w in _warnings(stderr) if "manifest.json" in w]
    assert "sessions[0].started_at_ns: is NaN, not a whole number" in line and "null" not in line
    assert "ledger entry is skipped" in line


def test_a_ledger_entry_with_a_bad_status_names_status(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    sink_session(root / "sink", "s-st", T0)
    manifest = root / "sink" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["sessions"][0]["status"] = "zombie"
    manifest.write_text(json.dumps(doc), encoding="utf-8")
    same_rows(traceml_query("sessions", root)[0], stormlog_query("sessions", root))
    _, stderr = traceml_query("sessions", root)
    assert 'sessions[0].status: is "zombie", not one of' in stderr


def test_stormlogs_minimal_sidecar_gives_no_warning_and_a_bad_item_says_v1_schema_once(tmp_path: Path) -> None:
    """Sidecar items without ``metadata`` (Stormlog's own minimal shape): real Stormlog reads them
    (metadata ``{}``) without a warning, and so does TraceML; an item with an unknown field gets one
    line naming the field, saying "v1 schema" once."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    items = [{"title": f"link {i}", "kind": "link", "url": f"https://example.org/{i}", "session_id": "s1"}
             for i in range(7)]
    write_json(root / "side" / "stormlog_attachments.json",
               {"schema_version": 1, "format": "stormlog.attachments", "attachments": items})
    assert stormlog_warnings(root) == []
    rows, stderr = traceml_query("attachments", root)
    same_rows(rows, stormlog_query("attachments", root))
    assert _warnings(stderr) == []
    write_json(root / "side" / "stormlog_attachments.json",
               {"schema_version": 1, "format": "stormlog.attachments",
                "attachments": [*items, {**items[0], "title": "colored", "color": "red"}]})
    rows, stderr = traceml_query("attachments", root)
    same_rows(rows, stormlog_query("attachments", root))
    (line,) = _warnings(stderr)
    assert "attachments[7].color" in line and line.count("v1 schema") == 1 and "kept" in line


def test_deliberate_difference_an_empty_json_file_is_named(tmp_path: Path) -> None:
    """Telemetry-named JSON files holding ``{}`` or ``[]``: Stormlog records a load failure for
    ``{}`` and skips ``[]`` without a word; TraceML lists the same (no) rows and names each file
    (docs/catalog.md, "Differences")."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    write_json(root / "t" / "telemetry_obj.json", {})
    write_json(root / "t" / "telemetry_list.json", [])
    theirs = {Path(p).name for p, _ in stormlog_warnings(root)}
    assert theirs == {"telemetry_obj.json"}
    for what in ("runs", "sessions", "attachments"):
        same_rows(traceml_query(what, root)[0], stormlog_query(what, root))
    _, stderr = traceml_query("sessions", root)
    named = [w for w in _warnings(stderr) if "/t/" in w]
    assert len(named) == 2
    assert any("telemetry_list.json" in w and "empty list" in w for w in named)
    assert any("telemetry_obj.json" in w for w in named)
    store = catalog.open([root])
    assert {Path(w.path).name for w in store.warnings} >= {"telemetry_obj.json", "telemetry_list.json"}


def test_deliberate_difference_open_takes_a_str_or_path_as_one_path(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``open("ab")`` and ``open(Path("ab"))`` search the one folder ``ab`` in TraceML, as
    ``open(["ab"])`` does. Stormlog iterates a str character by character (``open("ab")`` searches
    the folders ``a`` and ``b``, and ``"/..."`` the whole disk) and refuses a Path with TypeError."""
    import stormlog.query

    root = tmp_path.resolve()
    sink_session(root / "ab", "in-ab", T0)
    sink_session(root / "a", "in-a", T0 + 1)
    sink_session(root / "b", "in-b", T0 + 2)
    monkeypatch.chdir(root)
    as_list = [s.session_id for s in catalog.open(["ab"]).list_sessions()]
    assert as_list == ["in-ab"]
    assert [s.session_id for s in catalog.open("ab").list_sessions()] == as_list
    assert [s.session_id for s in catalog.open(Path("ab")).list_sessions()] == as_list
    assert [s.session_id for s in stormlog.query.open(["ab"]).list_sessions()] == as_list
    assert sorted(s.session_id for s in stormlog.query.open("ab").list_sessions()) == ["in-a", "in-b"]
    with pytest.raises(TypeError):
        stormlog.query.open(Path("ab"))  # type: ignore[arg-type]
    assert os.getcwd() == str(root)


# -- the second review: segments alone, stray manifests, bundles, envelope warnings, add_attachment ---

def test_a_segment_given_alone_takes_its_lifecycle_from_the_ledger_beside_it(tmp_path: Path) -> None:
    """``traceml query sessions sink/segment-000001.jsonl``: the session's status, start, end and
    source come from the sink's ``manifest.json`` beside it, as in Stormlog (not ``incomplete`` and
    the first event's time, as for a loose JSONL file)."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    segment = root / "sink" / "segment-000001.jsonl"
    for what in ("runs", "sessions", "attachments"):
        same_rows(traceml_query(what, segment)[0], stormlog_query(what, segment))
    (row,), stderr = traceml_query("sessions", segment)
    assert (row["status"], row["started_at_ns"], row["source"]) == ("completed", T0, "stormlog.cpu_profiler")
    assert row["ended_at_ns"] is not None and _warnings(stderr) == []


def test_deliberate_difference_a_segment_alone_lists_only_the_sessions_it_holds(tmp_path: Path) -> None:
    """A reused sink's first segment given alone: Stormlog lists both ledger sessions from it (the
    second with 0 events, though its events are in the second segment); TraceML lists only the one
    the segment holds, with Stormlog's row for it (docs/catalog.md, "Differences")."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    sink_session(root / "sink", "s2", T0 + 100, events=2)
    segment = root / "sink" / "segment-000001.jsonl"
    theirs = stormlog_query("sessions", segment)
    assert sorted((r["session_id"], r["event_count"]) for r in theirs) == [("s1", 3), ("s2", 0)]
    same_rows(traceml_query("sessions", segment)[0], [r for r in theirs if r["session_id"] == "s1"])
    for what in ("runs", "attachments"):
        same_rows(traceml_query(what, segment)[0],
                  [r for r in stormlog_query(what, segment) if r["run_id"] == "session:s1"])


def test_manifests_of_no_stormlog_shape_are_named_and_another_programs_is_not(tmp_path: Path) -> None:
    """``{}``, ``[]``, an unknown ``stormlog.`` format and half an OOM manifest inside a root are
    read by neither tool; Stormlog says nothing, TraceML names each file and why. A web app's
    ``manifest.json`` is passed over by both, without a word."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    write_json(root / "a" / "manifest.json", {})
    write_json(root / "b" / "manifest.json", [])
    write_json(root / "c" / "manifest.json", {"format": "stormlog.something_else"})
    write_json(root / "d" / "manifest.json", {"bundle_name": "oom_dump_x", "reason": "oom"})
    write_json(root / "web" / "manifest.json", {"name": "My App", "icons": [], "start_url": "/"})
    for what in ("runs", "sessions", "attachments"):
        same_rows(traceml_query(what, root)[0], stormlog_query(what, root))
    assert stormlog_warnings(root) == []
    _, stderr = traceml_query("sessions", root)
    named = {Path(w.removeprefix("warning: ").split(": ")[0]).parent.name: w for w in _warnings(stderr)}
    assert sorted(named) == ["a", "b", "c", "d"]
    assert "empty JSON object" in named["a"] and "empty list, not a JSON object" in named["b"]
    assert "'stormlog.something_else'" in named["c"] and "lacks backend, event_count of an OOM bundle" in named["d"]


def test_deliberate_difference_a_diagnose_bundles_timeline_is_part_of_the_bundle(tmp_path: Path) -> None:
    """``gpumemprof diagnose`` writes ``telemetry_timeline.json`` (a timeline, not events) and lists
    it in its manifest: Stormlog records ``load failed`` for it; TraceML reads it as part of the
    bundle, with no warning. The rows are the same."""
    root = tmp_path.resolve()
    gpumemprof("diagnose", "--output", str(root / "diag"), "--duration", "1", "--interval", "0.5")
    assert [Path(p).name for p, _ in stormlog_warnings(root)] == ["telemetry_timeline.json"]
    for what in ("runs", "sessions", "attachments", "events"):
        rows, stderr = traceml_query(what, root)
        same_rows(rows, stormlog_query(what, root))
        assert _warnings(stderr) == [], what


def test_a_bundle_without_a_session_is_listed_as_an_oom_and_reported(tmp_path: Path) -> None:
    """An OOM bundle dumped without a session summary names no session: both tools list it under
    ``query ooms`` and in no run; TraceML says so (``unattached_bundle``)."""
    from stormlog.oom_flight_recorder import OOMFlightRecorder, OOMFlightRecorderConfig

    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    recorder = OOMFlightRecorder(OOMFlightRecorderConfig(enabled=True, dump_dir=str(root / "ooms")),
                                 system_info_provider=lambda: {"platform": "test"})
    recorder.record_event(record("s-x", T0 + 5))
    assert recorder.dump(reason="oom", exception=MemoryError("out of memory"), context="step 3", backend="cpu")
    for what in ("runs", "sessions", "attachments", "ooms"):
        same_rows(traceml_query(what, root)[0], stormlog_query(what, root))
    assert len(stormlog_query("ooms", root)) == 1
    _, stderr = traceml_query("runs", root)
    (line,) = _warnings(stderr)
    assert "oom_dump_" in line and "names no session" in line and "no run" in line
    store = catalog.open([root])
    store.list_runs()
    assert [w.code for w in store.warnings] == ["unattached_bundle"]


def test_envelope_warnings_say_v1_schema_once(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    write_json(root / "env" / "stormlog_run.json", {"schema_version": 1, "format": "stormlog.run_envelope",
                                                   "run_id": "r1", "sessions": [{"session_id": "s1"}], "color": 1})
    rows, stderr = traceml_query("runs", root)
    same_rows(rows, stormlog_query("runs", root))
    lines = _warnings(stderr)
    assert len(lines) == 3  # metadata, sessions[0].metadata, color
    assert all(line.count("v1 schema") == 1 and "envelope rejected" in line for line in lines)


def test_add_attachment_writes_every_v1_field_stormlog_reads(tmp_path: Path) -> None:
    """``add_attachment`` takes the v1 fields beyond identity: ``start_ns``/``end_ns``,
    ``created_at_utc``/``updated_at_utc``, and in an envelope ``local_rank``/``world_size``; real
    ``stormlog query attachments`` lists them as TraceML does. A sidecar refuses ``local_rank``
    (its schema has none) and an end before the start is refused, each naming the field."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    catalog.write_envelope(root / "env", "r1", sessions=[{"session_id": "s1"}])
    catalog.add_attachment(root / "env", "a1", kind="log", path="notes.txt", rank=0, local_rank=0, world_size=2,
                           start_ns=T0, end_ns=T0 + 5, created_at_utc="2026-12-03T00:00:00Z",
                           updated_at_utc="2026-12-03T00:00:01Z")
    catalog.add_attachment(root / "side", "b1", kind="log", url="https://example.org/b1", run_id="r1",
                           start_ns=T0, end_ns=T0 + 9, created_at_utc="2026-12-03T00:00:00Z")
    with pytest.raises(catalog.EnvelopeError, match="local_rank"):
        catalog.add_attachment(root / "side", "b2", kind="log", url="https://example.org/b2", local_rank=1)
    with pytest.raises(catalog.EnvelopeError, match="end_ns"):
        catalog.add_attachment(root / "env", "a2", kind="log", url="https://example.org/a2", start_ns=T0 + 5,
                               end_ns=T0)
    theirs = stormlog_query("attachments", root, extra=("--run-id", "r1"))
    rows, _ = traceml_query("attachments", root, extra=("--run-id", "r1"))
    same_rows(rows, theirs)
    by_title = {r["title"]: r for r in theirs}
    assert (by_title["a1"]["local_rank"], by_title["a1"]["world_size"], by_title["a1"]["end_ns"]) == (0, 2, T0 + 5)
    assert (by_title["b1"]["start_ns"], by_title["b1"]["end_ns"]) == (T0, T0 + 9)


def test_deliberate_difference_an_envelope_run_takes_its_times_from_the_session_listed(tmp_path: Path) -> None:
    """A tracker session in its sink and in its ``--output`` file, named by an envelope: Stormlog's
    run takes its start and end from the output file's copy of the session; TraceML lists the
    session once, from the sink's ledger, and the run's times are the ledger's."""
    root = tmp_path.resolve()
    gpumemprof("track", "--duration", "0.6", "--interval", "0.2", "--format", "json", "--output",
               str(root / "track.json"), "--telemetry-sink-dir", str(root / "sink"))
    (sid,) = {r["session_id"] for r in stormlog_query("sessions", root)}
    write_json(root / "env" / "stormlog_run.json", {"schema_version": 1, "format": "stormlog.run_envelope",
                                                   "run_id": "r1", "sessions": [{"session_id": sid, "metadata": {}}],
                                                   "metadata": {}})
    sessions = {r["source_kind"]: r for r in stormlog_query("sessions", root)}
    (their_run,) = stormlog_query("runs", root)
    (our_run,), _ = traceml_query("runs", root)
    ledger, copy = sessions["sink"], sessions["telemetry_json"]
    assert (their_run["started_at_ns"], their_run["ended_at_ns"]) == (copy["started_at_ns"], copy["ended_at_ns"])
    assert (our_run["started_at_ns"], our_run["ended_at_ns"]) == (ledger["started_at_ns"], ledger["ended_at_ns"])
    ignore = ("started_at_ns", "ended_at_ns", "session_count", "sessions")
    assert {k: v for k, v in our_run.items() if k not in ignore} == {
        **{k: v for k, v in their_run.items() if k not in ignore}, "status": "completed"}


def test_stormlog_folders_in_a_runs_root_are_not_runs(tmp_path: Path) -> None:
    """A runs root that also holds a real Stormlog sink, diagnose bundle and OOM bundles (one
    folder each): ``traceml runs ls`` (the viewer's run store) lists the TraceML run only, not the
    Stormlog folders as legacy runs; ``traceml query`` still reads them."""
    import subprocess
    import sys

    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    gpumemprof("diagnose", "--output", str(root / "diag"), "--duration", "1", "--interval", "0.5")
    from tests.catalog.stormlog_real import oom_bundle
    bundle = oom_bundle(root, "s1", T0)
    run = root / "run-1"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n', encoding="utf-8")
    out = subprocess.run([str(Path(sys.executable).parent / "traceml"), "runs", "ls", str(root), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ids = [json.loads(line)["id"] for line in out.stdout.splitlines() if line.strip()]
    assert ids == ["run-1"], (ids, bundle.name)
    assert {r["kind"] for r in traceml_query("attachments", root)[0]} >= {"telemetry_sink", "diagnose_bundle",
                                                                         "oom_bundle"}


def _deep(levels: int) -> str:
    """JSON text of ``levels`` nested lists (written by hand: ``json.dumps`` itself would recurse)."""
    return "[" * levels + "]" * levels


def test_json_nested_too_deeply_is_a_warning_on_its_file_never_a_crash(tmp_path: Path) -> None:
    """An envelope, a sidecar and a manifest nested 1,100 levels deep: real Stormlog skips each
    file and lists the rest; TraceML lists the same rows (it once failed whole with a
    RecursionError) and names each file. A telemetry line nested 100,000 levels deep is read by both."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s-ok", T0)
    deep = _deep(1100)
    files = {
        "env/stormlog_run.json": '{"schema_version": 1, "format": "stormlog.run_envelope", "run_id": "r", '
                                 f'"metadata": {{"x": {deep}}}}}',
        "side/stormlog_attachments.json": '{"schema_version": 1, "format": "stormlog.attachments", '
                                          f'"attachments": [{{"title": "t", "kind": "k", "url": "u", "x": {deep}}}]}}',
        "bundle/manifest.json": f'{{"bundle_name": {deep}}}',
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True)
        (root / name).write_text(text, encoding="utf-8")
    # a telemetry line far deeper still
    line = json.dumps(record("s-deep", T0)).replace('"metadata": {}', f'"metadata": {{"x": {_deep(100_000)}}}')
    (root / "tel").mkdir()
    (root / "tel" / "events.jsonl").write_text(line + "\n", encoding="utf-8")
    for what in ("runs", "sessions", "attachments"):
        rows, stderr = traceml_query(what, root)
        same_rows(rows, stormlog_query(what, root))
    for name in files:
        assert any(name in w and "nested too deeply" in w for w in _warnings(stderr)), name
    # Python's reader takes the deep telemetry line (orjson refuses it), in both: its session is listed
    assert "s-deep" in {r["session_id"] for r in traceml_query("sessions", root)[0]}
    assert catalog.open([root]).list_runs()  # the Python API answers too


def test_a_v2_record_carrying_session_id_is_refused_as_stormlog_refuses_it(tmp_path: Path) -> None:
    """``session_id`` came with schema v3: Stormlog's reader refuses a v2 record holding it
    ("Unknown telemetry fields: session_id"), although its sink writes such records without a
    check. TraceML took the record (and its session) silently; now both list no session and
    TraceML says why."""
    root = tmp_path.resolve()
    rows = [{**record("s-v2", T0 + i), "schema_version": 2} for i in range(3)]
    for r in rows:
        r.pop("metadata", None)
        r["metadata"] = {}
    (root / "tel").mkdir(parents=True)
    (root / "tel" / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    theirs = stormlog_query("sessions", root)
    ours, stderr = traceml_query("sessions", root)
    assert theirs == [] and ours == []
    assert any("tel/events.jsonl" in w and "unknown telemetry fields: session_id" in w for w in _warnings(stderr))
    # the same records without session_id are v2 records both read
    for r in rows:
        r.pop("session_id")
    (root / "tel" / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    same_rows(traceml_query("sessions", root)[0], stormlog_query("sessions", root))
    assert len(stormlog_query("sessions", root)) == 1


def test_add_attachment_to_stormlogs_minimal_sidecar_and_reasons_that_are_true(tmp_path: Path) -> None:
    """Adding to a sidecar of Stormlog's minimal shape (items without metadata) works, and real
    Stormlog lists every item after it; an item dropped for its times or an empty title is not
    also said to lack metadata (which Stormlog reads as {})."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s1", T0)
    side = root / "side"
    write_json(side / "stormlog_attachments.json", {"schema_version": 1, "format": "stormlog.attachments",
                                                    "attachments": [{"title": "a", "kind": "link",
                                                                     "url": "https://example.org/a",
                                                                     "session_id": "s1"}]})
    catalog.add_attachment(side, kind="link", url="https://example.org/b", session_id="s1")
    theirs = stormlog_query("attachments", root)
    assert sorted(r["url"] for r in theirs if r["kind"] == "link") == ["https://example.org/a", "https://example.org/b"]
    rows, stderr = traceml_query("attachments", root)
    same_rows(rows, theirs)
    assert _warnings(stderr) == []
    write_json(side / "stormlog_attachments.json", {"schema_version": 1, "format": "stormlog.attachments",
                                                    "attachments": [
                                                        {"title": "late", "kind": "link", "url": "u",
                                                         "session_id": "s1", "start_ns": T0 + 10, "end_ns": T0},
                                                        {"title": "", "kind": "link", "url": "u", "session_id": "s1"}]})
    _, stderr = traceml_query("attachments", root)
    lines = [w for w in _warnings(stderr) if "stormlog_attachments.json" in w]
    assert any("attachments[0].end_ns" in w for w in lines) and any("attachments[1].title" in w for w in lines)
    assert not any(".metadata" in w for w in lines), lines


def test_write_envelope_does_not_replace_an_envelope_of_a_newer_schema(tmp_path: Path) -> None:
    folder = tmp_path / "env"
    write_json(folder / "stormlog_run.json", {"schema_version": 2, "format": "stormlog.run_envelope",
                                              "run_id": "future", "metadata": {}})
    before = (folder / "stormlog_run.json").read_bytes()
    with pytest.raises(catalog.EnvelopeError, match="schema_version: the existing envelope's is 2, not 1"):
        catalog.write_envelope(folder, "fa2")
    assert (folder / "stormlog_run.json").read_bytes() == before
