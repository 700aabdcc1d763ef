"""The shipped JSON Schemas and the problems they report (004 seed, stormlog_run.json; DESIGN §2.2,
§5): the same constraints as real Stormlog 0.4.3's v1 schemas, compared with its own reader."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.catalog.fixtures import SEED_MINIMAL_ENVELOPE
from traceml_ai.catalog.schema import (
    ENVELOPE_SCHEMA,
    SIDECAR_SCHEMA,
    Problem,
    attachment_problems,
    envelope_problems,
    load_schema,
    sidecar_problems,
)


def seed_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SEED_MINIMAL_ENVELOPE)
    return doc


def test_the_seed_minimal_example_is_valid() -> None:
    assert envelope_problems(seed_doc()) == []


def test_the_schemas_ship_with_the_package_and_each_loads_alone_with_jsonschema() -> None:
    from jsonschema import Draft202012Validator

    envelope = load_schema(ENVELOPE_SCHEMA)
    assert envelope["required"] == ["schema_version", "format", "run_id", "metadata"]
    assert envelope["additionalProperties"] is False
    assert envelope["$defs"]["session"]["required"] == ["session_id", "metadata"]
    assert envelope["$defs"]["attachment"]["required"] == ["title", "kind", "storage", "metadata"]
    sidecar = load_schema(SIDECAR_SCHEMA)
    assert sidecar["$defs"]["attachment"]["required"] == ["title", "kind", "metadata"]
    for schema, doc in ((envelope, seed_doc()), (sidecar, {"schema_version": 1, "format": "stormlog.attachments",
                                                           "attachments": [{"title": "t", "kind": "k", "url": "u",
                                                                            "metadata": {}}]})):
        Draft202012Validator.check_schema(schema)
        assert "$ref" not in json.dumps(schema).replace('"$ref": "#/', "")  # no reference into another file
        Draft202012Validator(schema).validate(doc)  # alone: no registry


@pytest.mark.parametrize(("change", "field", "words"), [
    (lambda d: d.pop("run_id"), "run_id", "is required"),
    (lambda d: d.pop("metadata"), "metadata", "is required"),
    (lambda d: d.update(run_id=""), "run_id", "non-empty"),
    (lambda d: d.update(schema_version=2), "schema_version", "must be 1, not 2"),
    (lambda d: d.update(format="stormlog.run"), "format", '"stormlog.run_envelope"'),
    (lambda d: d.update(started_at_ns=-5), "started_at_ns", "-5"),
    (lambda d: d.update(started_at_ns=10, ended_at_ns=9), "ended_at_ns", "before started_at_ns"),
    (lambda d: d["sessions"][0].update(world_size=0), "sessions[0].world_size", "at least 1"),
    (lambda d: d["sessions"][0].update(status="completed"), "sessions[0].status", "not a field of the v1 schema"),
    (lambda d: d["sessions"][0].pop("metadata"), "sessions[0].metadata", "is required"),
    (lambda d: d.update(written_by="x"), "written_by", "put integration-specific facts in metadata"),
    (lambda d: d["attachments"][0].pop("title"), "attachments[0].title", "is required"),
    (lambda d: d.update(tags=["a", "a"]), "tags", "the same item twice"),
    (lambda d: d["attachments"][0].update(start_ns=5, end_ns=4), "attachments[0].end_ns", "before start_ns"),
    (lambda d: d["sessions"][0].pop("session_id"), "sessions[0].session_id", "is required"),
    (lambda d: d["attachments"][0].update(storage="link"), "attachments[0].storage", '"reference", "copy"'),
    (lambda d: d["attachments"][0].pop("path"), "attachments[0].url", "is required when path is not given"),
    (lambda d: d.update(tags="a,b"), "tags", 'must be a list, not "a,b"'),
    (lambda d: d.update(metadata=None), "metadata", "must be an object, not null"),
])
def test_each_problem_names_its_field(change: Any, field: str, words: str) -> None:
    doc = seed_doc()
    change(doc)
    problems = envelope_problems(doc)
    assert any(p.field == field and words in p.message for p in problems), problems


def test_a_document_that_is_not_an_object_is_one_problem() -> None:
    assert envelope_problems([1, 2]) == [Problem("", "must be an object, not [1, 2]")]


@pytest.mark.parametrize(("doc", "fields"), [
    ({}, ["schema_version", "format", "run_id", "metadata"]),
    ({"format": "stormlog.run_envelope", "run_id": "r1"}, ["schema_version", "metadata"]),
    ({"schema_version": 1}, ["format", "run_id", "metadata"]),
])
def test_each_missing_required_field_is_named_once(doc: Any, fields: list[str]) -> None:
    assert envelope_problems(doc) == [Problem(f, "is required") for f in fields]


def test_missing_fields_of_a_sidecar_and_its_items_are_each_named_once() -> None:
    file_level, items = sidecar_problems({"attachments": [{"kind": "x"}]})
    assert file_level == [Problem("schema_version", "is required"), Problem("format", "is required")]
    assert items == {0: [Problem("attachments[0].title", "is required"),
                         Problem("attachments[0].metadata", "is required"),
                         Problem("attachments[0].url", "is required when path is not given (one of url, path)")]}
    assert [p.field for p in attachment_problems({})] == ["title", "kind", "storage", "metadata", "url"]


def test_attachment_id_is_optional_and_a_repeated_one_is_not_a_schema_problem() -> None:
    doc = seed_doc()
    doc["attachments"].append(dict(doc["attachments"][0]))
    doc["attachments"][0].pop("attachment_id")
    assert envelope_problems(doc) == []


def test_the_documented_minimal_sidecar_item_is_read_and_named_where_the_schema_wants_more() -> None:
    from traceml_ai.catalog.schema import sidecar_item_read

    item = {"title": "W&B run", "kind": "experiment", "url": "https://wandb.ai/e/p/r1", "session_id": "s0"}
    _, items = sidecar_problems({"schema_version": 1, "format": "stormlog.attachments", "attachments": [item]})
    assert items == {0: [Problem("attachments[0].metadata", "is required")]}
    read = sidecar_item_read(item)
    assert read is not None and read["storage"] == "reference" and read["attachment_id"] is None


def test_a_sidecar_with_the_wrong_format_is_rejected_whole() -> None:
    from traceml_ai.catalog.schema import sidecar_file_read

    doc = {"schema_version": 1, "format": "stormlog.attachment", "attachments": []}
    file_level, items = sidecar_problems(doc)
    assert [p.field for p in file_level] == ["format"] and items == {} and not sidecar_file_read(doc)


def test_a_single_attachment_is_checked_like_an_envelope_item() -> None:
    ok = {"title": "t", "kind": "k", "storage": "copy", "path": "x", "metadata": {}}
    assert attachment_problems(ok) == []
    assert attachment_problems({**ok, "path": ""}, ["attachments", 3])[0].field == "attachments[3].path"


def _mutations(doc: Any) -> list[Any]:
    """Copies of ``doc`` with one value replaced by a likely-wrong one, or one key removed."""
    odd: list[Any] = [None, -1, 0, 1, 1.5, True, "", "x", "copy", [], {}, [1], {"a": 1}, "https://x"]
    found: list[Any] = []

    def walk(node: Any, rebuild: Any) -> None:
        if isinstance(node, dict):
            for key in node:
                found.append(rebuild({k: v for k, v in node.items() if k != key}))
                for value in odd:
                    found.append(rebuild({**node, key: value}))
                walk(node[key], lambda new, key=key: rebuild({**node, key: new}))
        elif isinstance(node, list):
            for i in range(len(node)):
                walk(node[i], lambda new, i=i: rebuild([*node[:i], new, *node[i + 1:]]))

    walk(doc, lambda new: new)
    return found


def test_the_fast_check_never_accepts_what_jsonschema_rejects() -> None:
    from traceml_ai.catalog.schema import _fast, _validator

    sidecar = {"schema_version": 1, "format": "stormlog.attachments", "attachments": seed_doc()["attachments"]}
    for name, doc in ((ENVELOPE_SCHEMA, seed_doc()), (SIDECAR_SCHEMA, sidecar)):
        mutations = _mutations(doc)
        assert len(mutations) > 150
        disagree = [m for m in mutations if _fast(name)(m) and list(_validator(name).iter_errors(m))]
        assert disagree == []
        assert any(not _fast(name)(m) for m in mutations) and any(_fast(name)(m) for m in mutations)


def test_the_fast_check_refuses_a_keyword_it_does_not_know() -> None:
    from traceml_ai.catalog.schema import _compile

    with pytest.raises(ValueError, match="maxLength"):
        _compile({"type": "string", "maxLength": 3}, {}, {})


def test_the_envelope_schema_accepts_exactly_what_real_stormlog_accepts() -> None:
    """Differential: for the seed envelope and hundreds of one-field mutations of it, our verdict is
    Stormlog 0.4.3's own reader's (``run_envelope_from_payload``)."""
    from pathlib import Path

    from tests.catalog.stormlog_real import require_stormlog

    require_stormlog()
    from stormlog.run_catalog import run_envelope_from_payload

    docs = [seed_doc(), *_mutations(seed_doc())]
    docs += [{**seed_doc(), "tags": ["a", "a"]}, {**seed_doc(), "tags": ["a", ""]}, {**seed_doc(), "title": ""},
             {**seed_doc(), "description": ""}, {**seed_doc(), "started_at_ns": 5, "ended_at_ns": 4}]
    disagree = [d for d in docs if isinstance(d, dict)
                and (run_envelope_from_payload(d, Path("/x/stormlog_run.json")) is None) != bool(envelope_problems(d))]
    assert len(docs) > 300
    assert disagree == []


def test_the_sidecar_reader_keeps_exactly_the_items_real_stormlog_keeps() -> None:
    from pathlib import Path

    from tests.catalog.stormlog_real import require_stormlog

    require_stormlog()
    from stormlog.query import _attachment_from_payload

    from traceml_ai.catalog.schema import sidecar_item_read

    base = {"attachment_id": "a", "title": "t", "kind": "k", "storage": "copy", "path": "p", "url": "https://u",
            "start_ns": 1, "end_ns": 2, "session_id": "s", "rank": 0, "metadata": {"m": 1}}
    items = [base, *_mutations(base)]
    disagree = [i for i in items if isinstance(i, dict)
                and (_attachment_from_payload(i, Path("/x/stormlog_attachments.json")) is None)
                != (sidecar_item_read(i) is None)]
    assert len(items) > 150
    assert disagree == []
