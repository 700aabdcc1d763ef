"""The shipped JSON Schemas and the problems they report (004 seed, stormlog_run.json; DESIGN §2.2)."""

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


def test_the_schemas_ship_with_the_package_and_say_what_is_required() -> None:
    envelope = load_schema(ENVELOPE_SCHEMA)
    assert envelope["required"] == ["schema_version", "format", "run_id", "metadata"]
    assert envelope["properties"]["format"] == {"const": "stormlog.run_envelope"}
    assert load_schema(SIDECAR_SCHEMA)["properties"]["format"] == {"const": "stormlog.attachments"}


@pytest.mark.parametrize(("change", "field", "words"), [
    (lambda d: d.pop("run_id"), "run_id", "is required"),
    (lambda d: d.pop("metadata"), "metadata", "is required"),
    (lambda d: d.update(run_id=""), "run_id", "non-empty"),
    (lambda d: d.update(schema_version=2), "schema_version", "must be 1, not 2"),
    (lambda d: d.update(format="stormlog.run"), "format", '"stormlog.run_envelope"'),
    (lambda d: d.update(started_at_ns=-5), "started_at_ns", "-5"),
    (lambda d: d.update(started_at_ns=10, ended_at_ns=9), "ended_at_ns", "before started_at_ns"),
    (lambda d: d["sessions"][0].update(world_size=0), "sessions[0].world_size", "minimum 1"),
    (lambda d: d["sessions"][0].pop("session_id"), "sessions[0].session_id", "is required"),
    (lambda d: d["attachments"][0].update(storage="link"), "attachments[0].storage", '"reference", "copy"'),
    (lambda d: d["attachments"][0].pop("path"), "attachments[0].path", "is required when url is not given"),
    (lambda d: d["attachments"].append(dict(d["attachments"][0])), "attachments[1].attachment_id", "used twice"),
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
    assert file_level == [Problem("format", "is required")]
    assert items == {0: [Problem("attachments[0].attachment_id", "is required"),
                         Problem("attachments[0].storage", "is required"),
                         Problem("attachments[0].path", "is required when url is not given (one of path, url)")]}
    assert [p.field for p in attachment_problems({})] == ["attachment_id", "kind", "storage", "path"]


def test_a_duplicate_attachment_id_is_named_beside_other_problems() -> None:
    doc = seed_doc()
    doc["attachments"].append(dict(doc["attachments"][0]))
    doc["run_id"] = ""
    assert envelope_problems(doc) == [
        Problem("run_id", 'must be a non-empty string, not ""'),
        Problem("attachments[1].attachment_id", '"rank0-profiler" is used twice in this envelope'),
    ]


def test_unknown_top_level_fields_are_allowed_for_newer_writers() -> None:
    doc = seed_doc()
    doc["written_by"] = "stormlog 2.0"
    assert envelope_problems(doc) == []


def test_a_bad_sidecar_item_rejects_only_that_item() -> None:
    doc = {"format": "stormlog.attachments", "attachments": [
        {"attachment_id": "ok", "kind": "experiment", "storage": "reference", "url": "https://example.org/run/1"},
        {"attachment_id": "bad", "kind": "experiment", "storage": "reference"},
    ]}
    file_level, items = sidecar_problems(doc)
    assert file_level == []
    assert list(items) == [1]
    assert items[1] == [Problem("attachments[1].path", "is required when url is not given (one of path, url)")]


def test_a_sidecar_with_the_wrong_format_is_rejected_whole() -> None:
    file_level, items = sidecar_problems({"format": "stormlog.attachment", "attachments": []})
    assert [p.field for p in file_level] == ["format"] and items == {}


def test_a_single_attachment_is_checked_like_an_envelope_item() -> None:
    assert attachment_problems({"attachment_id": "a", "kind": "k", "storage": "copy", "path": "x"}) == []
    assert attachment_problems({"attachment_id": "a", "kind": "k", "storage": "copy", "url": "not a url"},
                               ["attachments", 3])[0].field == "attachments[3].url"


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

    sidecar = {"format": "stormlog.attachments", "run_id": "r", "attachments": seed_doc()["attachments"]}
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
