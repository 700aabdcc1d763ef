"""write_envelope() and add_attachment(): validated before writing, written atomically (DESIGN §2.2)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

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
    with pytest.raises(EnvelopeError, match="url: is required when path is not given"):
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


@pytest.mark.parametrize(("arguments", "field", "words"), [
    ({"tags": "a,b"}, "tags", 'must be a list of strings, not "a,b"'),
    ({"tags": ["a", 1]}, "tags[1]", "must be a string, not 1"),
    ({"metadata": {"x": float("nan")}}, "metadata.x", "is nan, which JSON cannot hold"),
    ({"metadata": {"x": float("inf")}}, "metadata.x", "is inf, which JSON cannot hold"),
    ({"metadata": {"x": object()}}, "metadata.x", "is a Python object object, not a JSON value"),
    ({"metadata": {"x": {"y": b"ab"}}}, "metadata.x.y", "is a Python bytes object, not a JSON value"),
    ({"metadata": {1: "one"}}, "metadata", "has the key 1 (int); JSON keys are strings"),
    ({"metadata": [1]}, "metadata", "must be an object (a dict), not [1]"),
    ({"sessions": "s-0"}, "sessions", 'must be a list of objects (dicts), not "s-0"'),
    ({"sessions": [{"session_id": "s"}, "s-1"]}, "sessions[1]", 'must be an object (a dict), not "s-1"'),
    ({"attachments": {"attachment_id": "a"}}, "attachments", "must be a list of objects"),
    ({"sessions": [{"session_id": "s", "metadata": {"when": b"x"}}]}, "sessions[0].metadata.when", "bytes"),
    ({"title": 3}, "title", "must be a string or null, not 3"),
])
def test_an_argument_json_cannot_hold_is_refused_naming_its_field(tmp_path: Path, arguments: dict[str, Any],
                                                                  field: str, words: str) -> None:
    with pytest.raises(EnvelopeError) as info:
        write_envelope(tmp_path / "run", "r", **arguments)
    assert any(p.field == field and words in p.message for p in info.value.problems), info.value.problems
    assert not (tmp_path / "run").exists()


def test_tuples_are_written_as_lists(tmp_path: Path) -> None:
    path = write_envelope(tmp_path, "r", tags=("a", "b"), metadata={"shape": (2, 3)})
    doc = json.loads(path.read_text())
    assert (doc["tags"], doc["metadata"]) == (["a", "b"], {"shape": [2, 3]})


@pytest.mark.parametrize(("arguments", "field"), [
    ({"metadata": {"x": float("nan")}}, "metadata.x"),
    ({"metadata": "notes"}, "metadata"),
    ({"rank": "0"}, "rank"),
    ({"path": b"p"}, "path"),
])
def test_a_bad_attachment_argument_is_refused_naming_its_field(tmp_path: Path, arguments: dict[str, Any],
                                                               field: str) -> None:
    arguments = {"path": "p", **arguments}
    with pytest.raises(EnvelopeError) as info:
        add_attachment(tmp_path, "a1", kind="note", **arguments)
    assert [p.field for p in info.value.problems] == [field]
    assert list(tmp_path.iterdir()) == []


def test_a_file_in_the_way_is_a_clear_os_error(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"not written: .*taken is a file, not a folder"):
        write_envelope(tmp_path / "taken", "r")
    with pytest.raises(NotADirectoryError, match="taken is a file"):
        add_attachment(tmp_path / "taken" / "deeper", "a", kind="note", path="p")
    (tmp_path / "notes" / "stormlog_attachments.json").mkdir(parents=True)
    with pytest.raises(IsADirectoryError, match=r"stormlog_attachments\.json is a folder"):
        add_attachment(tmp_path / "notes", "a", kind="note", path="p")


def test_only_the_catalog_file_names_are_written(tmp_path: Path) -> None:
    with pytest.raises(EnvelopeError, match=r"discovery reads only files named stormlog_run\.json"):
        write_envelope(tmp_path / "run.json", "r")
    with pytest.raises(EnvelopeError, match=r"stormlog_run\.json or stormlog_attachments\.json"):
        add_attachment(tmp_path / "notes.json", "a", kind="note", path="p")
    assert list(tmp_path.iterdir()) == []


def test_adding_to_a_file_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "stormlog_attachments.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(EnvelopeError, match="the existing file is not valid JSON"):
        add_attachment(tmp_path, "a", kind="note", path="p")
    assert (tmp_path / "stormlog_attachments.json").read_text(encoding="utf-8") == "{not json"


def test_real_stormlog_reads_what_write_envelope_and_add_attachment_write(tmp_path: Path) -> None:
    from tests.catalog.stormlog_real import require_stormlog, same_rows, stormlog_query, stormlog_warnings
    from tests.catalog.stormlog_real import traceml_query as ours

    require_stormlog()
    root = tmp_path.resolve()
    write_envelope(root / "train-42", "run-train-42", job_id="train-42", title="Train 42", tags=["a", "b"],
                   source_namespace="wandb", source_ref="e/p/42", started_at_ns=10, ended_at_ns=20,
                   sessions=[{"session_id": "session-rank-0", "job_id": "train-42", "rank": 0, "local_rank": 0,
                              "world_size": 8, "role": "rank", "metadata": {"status": "completed"}}],
                   attachments=[{"attachment_id": "rank0-profiler", "title": "Rank 0 profiler trace",
                                 "kind": "profiler_trace", "storage": "reference", "path": "traces/rank0.trace",
                                 "session_id": "session-rank-0", "rank": 0, "metadata": {"tool": "nsys"}}],
                   metadata={"written_by": "traceml"})
    add_attachment(root / "train-42", "wandb", kind="experiment", url="https://wandb.ai/e/p/42")
    add_attachment(root / "notes", kind="note", path="n.md", run_id="run-train-42")
    add_attachment(root / "notes", kind="link", url="https://example.org/x", storage=None,
                   source_namespace="wandb", source_ref="e/p/42")
    assert stormlog_warnings(root) == []
    for what in ("runs", "attachments"):
        theirs = stormlog_query(what, root)
        assert theirs
        same_rows(ours(what, root)[0], theirs)
    kinds = [a["kind"] for a in stormlog_query("attachments", root)]
    assert sorted(kinds) == ["experiment", "link", "note", "profiler_trace"]


def test_a_repeated_attachment_id_adds_a_second_attachment_as_stormlog_lists_both(tmp_path: Path) -> None:
    """Attachment ids need not be unique (the 004 seed, docs/catalog.md): ``add_attachment`` with an
    id already in the file adds a second item, and real ``stormlog query`` lists both, as TraceML does."""
    from tests.catalog.stormlog_real import require_stormlog, same_rows, stormlog_query
    from tests.catalog.stormlog_real import traceml_query as ours

    require_stormlog()
    root = tmp_path.resolve()
    write_envelope(root / "run", "r")
    add_attachment(root / "run", "trace", kind="profiler_trace", path="rank0.trace")
    add_attachment(root / "run", "trace", kind="profiler_trace", path="rank1.trace")
    add_attachment(root / "notes", "n", kind="note", url="https://example.org/1", run_id="r")
    add_attachment(root / "notes", "n", kind="note", url="https://example.org/2", run_id="r")
    theirs = stormlog_query("attachments", root)
    assert sorted(a["path"] or a["url"] for a in theirs if a["attachment_id"] in ("trace", "n")) == sorted([
        "https://example.org/1", "https://example.org/2", str(root / "run" / "rank0.trace"),
        str(root / "run" / "rank1.trace")])
    rows, stderr = ours("attachments", root)
    same_rows(rows, theirs)
    assert "warning" not in stderr
