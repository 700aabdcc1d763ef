"""Values and output formats against real Stormlog 0.4.3 (issue 10, the fresh-user review): CSV
byte for byte, ``~`` in declared paths, floats in integer fields, integers beyond 64 bits, NaN.
Each root is made with Stormlog's own writers or by hand where Stormlog has no writer for the case."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.catalog.stormlog_real import (
    BIN,
    T0,
    event,
    hand_envelope,
    oom_bundle,
    require_stormlog,
    same_rows,
    sink_events,
    sink_session,
    stormlog_query,
    traceml_query,
    write_json,
)

require_stormlog()

def _stdout(tool: str, *args: str | Path) -> bytes:
    extra = ["--no-cache"] if tool == "traceml" else []
    out = subprocess.run([str(BIN / tool), "query", *map(str, args), *extra], capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stormlog-values").resolve()
    sink_session(root / "sinks" / "reused", "reuse-a", T0 + 1_000)
    sink_session(root / "sinks" / "reused", "reuse-b", T0 + 2_000, status="interrupted")
    sink_session(root / "job" / "r1", "job-r1", T0 + 3_000, job_id="j-1", rank=1, world_size=2)
    oom_bundle(root / "oom_dumps", "reuse-b", T0 + 2_000)
    hand_envelope(root / "env", "exp-1", title="Exp, \"quoted\"\nline", tags=["a", "b"],
              sessions=[{"session_id": "reuse-a", "metadata": {"lr": 0.1, "nested": {"z": 1, "a": [1.5, None]}}}],
              attachments=[{"title": "trace", "kind": "profiler_trace", "storage": "reference",
                            "path": "traces/r0.trace", "metadata": {"ratio": 1e-7}},
                           {"title": "W&B", "kind": "experiment", "storage": "reference",
                            "url": "https://wandb.ai/e/p/r", "metadata": {}}],
              metadata={"float": 2.5, "big": 10**30, "text": "é, ü"})
    return root


@pytest.mark.parametrize("args", [("runs",), ("attachments",), ("sessions",), ("events",), ("ooms",),
                                  ("runs", "--run-id", "nothing"), ("sessions", "--status", "nothing"),
                                  ("attachments", "--kind", "profiler_trace")])
def test_csv_is_stormlogs_byte_for_byte(root: Path, args: tuple[str, ...]) -> None:
    """Quoting, ``\\r\\n`` line ends, float formatting, empty cells, JSON cells, the column order and
    the header of an empty result are Stormlog's (TraceML's own extra fields are in ``--json``)."""
    what, *flags = args
    theirs = _stdout("stormlog", what, root, "--csv", *flags)
    ours = _stdout("traceml", what, root, "--csv", *flags)
    assert theirs.count(b"\r\n") >= 1
    assert ours == theirs


def test_a_tilde_in_a_declared_path_is_a_folder_name_as_in_stormlog(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    sink_session(root / "sink", "s-1", T0)
    hand_envelope(root / "env", "run-t", sessions=[{"session_id": "s-1", "metadata": {}}],
              attachments=[{"title": "notes", "kind": "note", "storage": "reference", "path": "~/notes.txt",
                            "metadata": {}}])
    write_json(root / "side" / "stormlog_attachments.json", {"schema_version": 1, "format": "stormlog.attachments",
                                                        "attachments": [{"title": "t", "kind": "x", "path": "~/x.bin",
                                                                         "run_id": "run-t", "metadata": {}}]})
    theirs = stormlog_query("attachments", root, extra=("--kind", "note"))
    same_rows(traceml_query("attachments", root, extra=("--kind", "note"))[0], theirs)
    assert theirs[0]["path"] == str(root / "env" / "~" / "notes.txt")
    theirs = stormlog_query("attachments", root, extra=("--kind", "x"))
    same_rows(traceml_query("attachments", root, extra=("--kind", "x"))[0], theirs)
    assert theirs[0]["path"] == str(root / "side" / "~" / "x.bin")


def test_floats_in_integer_fields_are_refused_as_stormlog_refuses_them(tmp_path: Path) -> None:
    """``schema_version: 1.0``, ``rank: 1.0``, ``world_size: 2.0``, ``started_at_ns: 1e18``: Stormlog
    rejects each envelope (``isinstance(value, int)``); so does TraceML, naming the field."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s-1", T0)
    ref = [{"session_id": "s-1", "metadata": {}}]
    write_json(root / "a" / "stormlog_run.json", {"schema_version": 1.0, "format": "stormlog.run_envelope",
                                             "run_id": "float-version", "metadata": {}})
    hand_envelope(root / "b", "float-rank", sessions=[{"session_id": "s-1", "rank": 1.0, "metadata": {}}])
    hand_envelope(root / "c", "float-world", sessions=[{"session_id": "s-1", "world_size": 2.0, "metadata": {}}])
    hand_envelope(root / "d", "float-start", sessions=ref, started_at_ns=1e18)
    hand_envelope(root / "e", "int-ok", sessions=ref, started_at_ns=10**18)
    for what in ("runs", "sessions", "attachments"):
        same_rows(traceml_query(what, root)[0], stormlog_query(what, root))
    runs = {r["run_id"] for r in stormlog_query("runs", root)}
    assert "int-ok" in runs and not runs & {"float-version", "float-rank", "float-world", "float-start"}
    _, stderr = traceml_query("runs", root)
    for needle in ("a/stormlog_run.json: schema_version: must be an integer, not 1.0",
                   "b/stormlog_run.json: sessions[0].rank", "c/stormlog_run.json: sessions[0].world_size",
                   "d/stormlog_run.json: started_at_ns"):
        assert needle in stderr, needle


def test_write_envelope_refuses_a_float_in_an_integer_field(tmp_path: Path) -> None:
    import traceml_ai.catalog as catalog

    for sessions, fld in (([{"session_id": "s", "rank": 1.0}], "sessions[0].rank"),
                          ([{"session_id": "s", "world_size": 2.0}], "sessions[0].world_size")):
        with pytest.raises(catalog.EnvelopeError) as info:
            catalog.write_envelope(tmp_path, "r", sessions=sessions)
        assert fld in str(info.value)
    with pytest.raises(catalog.EnvelopeError, match="started_at_ns"):
        catalog.write_envelope(tmp_path, "r", started_at_ns=1e18)  # type: ignore[arg-type]
    assert not (tmp_path / "stormlog_run.json").exists()
    catalog.write_envelope(tmp_path, "r", started_at_ns=2**70, metadata={"seed": 2**80})
    (run,) = stormlog_query("runs", tmp_path)
    assert run["started_at_ns"] == 2**70 and run["metadata"] == {"seed": 2**80}


def test_add_attachment_keeps_what_the_catalog_reads_in_the_file_it_adds_to(tmp_path: Path) -> None:
    """Fresh-user review: ``write_envelope(started_at_ns=2**64)`` (which both tools list exactly),
    then ``add_attachment`` on it, failed ("not an integer: 1.8446744073709552e+19"), and a
    hand-written envelope with ``NaN`` in its metadata was "not valid JSON". The file is read as the
    catalog reads it, and what it held is written back unchanged."""
    import traceml_ai.catalog as catalog

    path = catalog.write_envelope(tmp_path / "big", "big", started_at_ns=2**64, metadata={"seed": 2**80})
    catalog.add_attachment(path, "a1", kind="log", path="train.log", title="log")
    (run,) = stormlog_query("runs", tmp_path / "big")
    assert run["started_at_ns"] == 2**64 and run["metadata"] == {"seed": 2**80} and run["attachment_count"] == 1
    hand_envelope(tmp_path / "nan", "nan", metadata={"x": float("nan"), "big": 2**70})
    catalog.add_attachment(tmp_path / "nan" / "stormlog_run.json", "a1", kind="log", path="train.log", title="log")
    (run,) = stormlog_query("runs", tmp_path / "nan")
    assert math.isnan(run["metadata"]["x"]) and run["metadata"]["big"] == 2**70 and run["attachment_count"] == 1
    ours, _ = traceml_query("runs", tmp_path / "nan")
    same_rows(ours, _no_nan([run]))


def test_big_integers_stay_exact_and_nan_is_read_where_stormlog_reads_it(tmp_path: Path) -> None:
    """An integer beyond 64 bits is the same integer (never a rounded float), in the envelope and in
    the JSON printed; ``NaN`` in metadata is accepted as Stormlog's ``json.loads`` accepts it, and
    printed as ``null`` (Stormlog prints ``NaN``, which is not JSON)."""
    root = tmp_path.resolve()
    sink_session(root / "sink", "s-1", T0)
    big = 2**70 + 1
    hand_envelope(root / "env", "big", sessions=[{"session_id": "s-1", "metadata": {"x": float("nan")}}],
              started_at_ns=big, ended_at_ns=big + 1, metadata={"big": big, "nan": float("nan")})
    theirs = stormlog_query("runs", root)
    ours, stderr = traceml_query("runs", root)
    assert ours[0]["started_at_ns"] == big and ours[0]["metadata"] == {"big": big, "nan": None}
    assert math.isnan(theirs[0]["metadata"]["nan"])
    same_rows(ours, _no_nan(theirs))
    assert "big" not in stderr
    raw = _stdout("traceml", "runs", root, "--json")
    assert b"NaN" not in raw and str(big).encode() in raw
    json.loads(raw.decode(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    # with the parse cache too (msgpack holds no integer beyond 64 bits: that file is read each time)
    cache = tmp_path.parent / f"{tmp_path.name}-cache"
    for _ in range(2):
        out = subprocess.run([str(BIN / "traceml"), "query", "runs", str(root), "--json", "--cache-dir", str(cache)],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)[0]["started_at_ns"] == big


def test_nan_in_events_and_oom_manifests_is_read_and_printed_as_null(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    sink_events(root / "sink", "s-nan", T0, [event("s-nan", T0 + 1, metadata={"ratio": float("nan")})])
    bundle = oom_bundle(root / "oom_dumps", "s-nan", T0)
    manifest = json.loads((bundle / "manifest.json").read_text(encoding="utf-8"))
    manifest["event_count"] = float("nan")
    write_json(bundle / "manifest.json", manifest)
    for what in ("events", "ooms"):
        theirs = stormlog_query(what, root)
        ours, _ = traceml_query(what, root)
        assert theirs
        same_rows(ours, _no_nan(theirs))
        raw = _stdout("traceml", what, root, "--json")
        json.loads(raw.decode(), parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    (ev,) = traceml_query("events", root)[0]
    assert ev["metadata"]["ratio"] is None
    assert traceml_query("ooms", root)[0][0]["event_count"] is None


def test_a_sink_without_a_usable_ledger_is_read_from_its_segments_as_stormlog_reads_it(tmp_path: Path) -> None:
    """No ``sessions`` ledger: the session comes from the segments' events, its ``source``
    ``artifact:<sink folder>`` as in Stormlog. A v1 ledger (not read) and a ``segments`` that is not
    a list are warnings naming the field (Stormlog is silent)."""
    root = tmp_path.resolve()
    for name, change in (("no-ledger", lambda m: m.pop("sessions")),
                         ("v1-ledger", lambda m: m.update(schema_version=1)),
                         ("bad-segments", lambda m: m.update(segments={"not": "a list"}))):
        sink = root / name
        sink_session(sink, f"s-{name}", T0 + len(name))
        manifest = json.loads((sink / "manifest.json").read_text(encoding="utf-8"))
        change(manifest)
        write_json(sink / "manifest.json", manifest)
    theirs = stormlog_query("sessions", root)
    ours, stderr = traceml_query("sessions", root)
    same_rows(ours, theirs)
    assert {r["source"] for r in theirs if r["session_id"] == "s-no-ledger"} == {"artifact:no-ledger"}
    assert "v1-ledger/manifest.json: schema_version" in stderr
    assert "bad-segments/manifest.json: segments: must be a list" in stderr


def test_stormlog_query_public_names_are_exported_where_traceml_has_them() -> None:
    """Each of ``stormlog.query.__all__`` TraceML has an equivalent of is exported under Stormlog's
    name, with every dataclass field (rows, filters) or public method (the store) of Stormlog's. The
    three TraceML has no equivalent of are listed here (and in docs/catalog.md)."""
    import dataclasses
    import typing

    import stormlog.query

    import traceml_ai.catalog as catalog

    missing = {"ArtifactCatalog", "CatalogRunEnvelope", "CatalogSource"}
    for name in stormlog.query.__all__:
        if name in missing:
            assert not hasattr(catalog, name)
            continue
        theirs, ours = getattr(stormlog.query, name), getattr(catalog, name)
        assert name in catalog.__all__, name
        if dataclasses.is_dataclass(theirs):
            have = {f.name for f in dataclasses.fields(ours)}  # type: ignore[arg-type]
            assert {f.name for f in dataclasses.fields(theirs)} <= have, name
        elif isinstance(theirs, type):
            public = {m for m in vars(theirs) if not m.startswith("_")}
            assert public <= set(dir(ours)), (name, public - set(dir(ours)))
        elif name == "AttachmentStorage":
            assert typing.get_args(theirs) == typing.get_args(ours)
        else:
            assert callable(ours), name
