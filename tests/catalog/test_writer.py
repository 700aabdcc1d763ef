"""write_envelope() and add_attachment(): validated before writing, written atomically (DESIGN §2.2)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import traceml_ai.catalog as catalog
from tests.catalog.fixtures import telemetry_jsonl
from traceml_ai.catalog import EnvelopeError, add_attachment, write_envelope


def test_a_written_envelope_is_read_back_as_an_explicit_run(tmp_path: Path) -> None:
    telemetry_jsonl(tmp_path / "run" / "rank0.jsonl", "s0", job_id="j", rank=0, world_size=2)
    path = write_envelope(tmp_path / "run", "my-run", title="Baseline", job_id="j", tags=["a"],
                          sessions=[{"session_id": "s0", "rank": 0, "world_size": 2, "role": "rank"}],
                          attachments=[{"attachment_id": "wandb", "kind": "experiment", "storage": "reference",
                                        "url": "https://wandb.example/e/p/r"}])
    assert path == tmp_path / "run" / "stormlog_run.json"
    doc = json.loads(path.read_text())
    assert (doc["schema_version"], doc["format"], doc["metadata"]) == (1, "stormlog.run_envelope", {})
    assert doc["created_at_utc"].endswith("Z")
    store = catalog.open([tmp_path])
    (run,) = store.list_runs()
    assert (run.run_id, run.explicit, run.title, run.tags, run.sessions) == ("my-run", True, "Baseline", ("a",),
                                                                            ("s0",))
    assert store.warnings == []
    assert [p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_an_invalid_envelope_is_not_written_and_the_old_one_stays(tmp_path: Path) -> None:
    path = write_envelope(tmp_path, "good")
    before = path.read_bytes()
    with pytest.raises(EnvelopeError) as info:
        write_envelope(tmp_path, "good", started_at_ns=10, ended_at_ns=5,
                       sessions=[{"session_id": "s", "world_size": 0}])
    assert {p.field for p in info.value.problems} == {"sessions[0].world_size", "ended_at_ns"}
    with pytest.raises(EnvelopeError, match="ended_at_ns"):
        write_envelope(tmp_path, "good", started_at_ns=10, ended_at_ns=5)
    with pytest.raises(EnvelopeError, match="run_id"):
        write_envelope(tmp_path, "")
    assert path.read_bytes() == before


def test_rewriting_keeps_created_at(tmp_path: Path) -> None:
    path = write_envelope(tmp_path, "r")
    doc = json.loads(path.read_text())
    doc["created_at_utc"] = "2020-01-01T00:00:00Z"
    path.write_text(json.dumps(doc))
    write_envelope(tmp_path, "r", title="again")
    again = json.loads(path.read_text())
    assert again["created_at_utc"] == "2020-01-01T00:00:00Z" and again["title"] == "again"


def test_add_attachment_to_an_envelope(tmp_path: Path) -> None:
    write_envelope(tmp_path, "r")
    add_attachment(tmp_path, "trace", kind="profiler_trace", path="traces/rank0.trace", session_id="s", rank=0,
                   source_namespace="nsys", source_ref="rank0", metadata={"tool": "nsys"})
    (a,) = catalog.open([tmp_path]).list_run_attachments()
    assert (a.run_id, a.path, a.storage, a.source_namespace, a.metadata) == (
        "r", str(tmp_path / "traces" / "rank0.trace"), "reference", "nsys", {"tool": "nsys"})
    with pytest.raises(EnvelopeError, match="already in this file"):
        add_attachment(tmp_path / "stormlog_run.json", "trace", kind="profiler_trace", path="x")
    with pytest.raises(EnvelopeError, match="only for sidecar"):
        add_attachment(tmp_path, "other", kind="note", path="n", run_id="r")


def test_add_attachment_creates_a_sidecar_where_there_is_no_envelope(tmp_path: Path) -> None:
    write_envelope(tmp_path / "run", "r")
    path = add_attachment(tmp_path / "notes", "n1", kind="note", storage="copy", path="n1.md", run_id="r")
    (tmp_path / "notes" / "n1.md").write_text("hello", encoding="utf-8")
    assert path == tmp_path / "notes" / "stormlog_attachments.json"
    assert json.loads(path.read_text())["format"] == "stormlog.attachments"
    store = catalog.open([tmp_path])
    assert [(a.attachment_id, a.run_id) for a in store.list_run_attachments()] == [("n1", "r")]
    assert store.warnings == []


def test_a_bad_attachment_is_not_written(tmp_path: Path) -> None:
    with pytest.raises(EnvelopeError, match="storage"):
        add_attachment(tmp_path, "x", kind="note", storage="moved", path="p")
    with pytest.raises(EnvelopeError, match="path: is required when url is not given"):
        add_attachment(tmp_path, "x", kind="note")
    assert list(tmp_path.iterdir()) == []


def test_readers_never_see_half_a_file(tmp_path: Path) -> None:
    big = {f"key{i}": "x" * 200 for i in range(500)}  # ~100 KB: many write() calls if it were not atomic
    path = write_envelope(tmp_path, "r", metadata=big)
    stop = threading.Event()
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            try:
                json.loads(path.read_bytes())
            except ValueError as exc:
                bad.append(str(exc))

    t = threading.Thread(target=read)
    t.start()
    for i in range(30):
        write_envelope(tmp_path, "r", title=str(i), metadata=big)
    stop.set()
    t.join()
    assert bad == []
