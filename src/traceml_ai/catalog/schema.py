"""The two JSON Schemas of the catalog and the checks run against them (004 seed; DESIGN §2.2).

``stormlog_run.json`` (run envelope, v1) and ``stormlog_attachments.json`` (attachment sidecar) are
described by the JSON Schema files in ``traceml_ai/catalog/schemas/`` (shipped in the wheel) and
validated with ``jsonschema``. Every problem is returned as a :class:`Problem` naming the field in
dotted form (``attachments[0].storage``), so that a rejected envelope or sidecar item becomes a
warning that names the file and the field, never a silent drop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Any, Final, NamedTuple

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from referencing import Registry, Resource

ENVELOPE_FILE: Final = "stormlog_run.json"
SIDECAR_FILE: Final = "stormlog_attachments.json"
ENVELOPE_FORMAT: Final = "stormlog.run_envelope"
SIDECAR_FORMAT: Final = "stormlog.attachments"
ENVELOPE_SCHEMA: Final = "stormlog_run_envelope_v1.schema.json"
SIDECAR_SCHEMA: Final = "stormlog_attachments_v1.schema.json"
STORAGES: Final = ("reference", "copy")
SESSION_STATUSES: Final = ("running", "completed", "interrupted", "incomplete")


class Problem(NamedTuple):
    """One reason a document (or one of its items) was rejected: ``field`` in dotted form
    (``run_id``, ``sessions[2].world_size``; ``""`` for the document itself) and a one-line message."""

    field: str
    message: str


def load_schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``name`` (:data:`ENVELOPE_SCHEMA` or :data:`SIDECAR_SCHEMA`) as a dict.

    Raises:
        FileNotFoundError: no schema of that name ships with the package.
    """
    text = resources.files("traceml_ai.catalog").joinpath("schemas").joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator(name: str) -> Validator:
    # Both schemas in one registry: the sidecar's items refer to the envelope's attachment definition.
    registry: Registry[Any] = Registry().with_resources(
        (n, Resource.from_contents(load_schema(n))) for n in (ENVELOPE_SCHEMA, SIDECAR_SCHEMA)
    )
    return Draft202012Validator(load_schema(name), registry=registry)


Check = Callable[[Any], bool]

_TYPES: Final[dict[str, Callable[[Any], bool]]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
_ANNOTATIONS: Final = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description"})


def _compile(schema: Mapping[str, Any], root: Mapping[str, Any], registry: Mapping[str, Mapping[str, Any]]) -> Check:
    """A yes/no check for the subset of JSON Schema our two schemas use, built from the schema files
    themselves. It answers only "valid?" and may say no where jsonschema says yes (e.g. ``1.0`` as an
    integer: the caller then asks jsonschema), never the reverse; it is ~50x faster than jsonschema
    on an envelope, and jsonschema still produces every message. A keyword outside the subset
    raises here, so the schemas cannot grow a rule that this check would silently skip."""
    checks = [_keyword(key, value, root, registry) for key, value in schema.items() if key not in _ANNOTATIONS]
    if len(checks) == 1:
        return checks[0]

    def check(v: Any) -> bool:
        for c in checks:  # a plain loop: all() over a generator costs twice as much here
            if not c(v):
                return False
        return True

    return check


def _keyword(key: str, value: Any, root: Mapping[str, Any], registry: Mapping[str, Mapping[str, Any]]) -> Check:
    if key == "$ref":
        target, _, pointer = value.partition("#")
        doc = registry[target] if target else root
        node: Any = doc
        for part in filter(None, pointer.split("/")):
            node = node[part]
        return _lazy(node, doc, registry)
    if key == "type":
        types = [_TYPES[t] for t in ([value] if isinstance(value, str) else value)]
        return lambda v: any(t(v) for t in types)
    if key == "const":
        return lambda v: type(v) is type(value) and v == value
    if key == "enum":
        return lambda v: any(type(v) is type(x) and v == x for x in value)
    if key == "minLength":
        return lambda v: not isinstance(v, str) or len(v) >= value
    if key == "minimum":
        return lambda v: not _TYPES["number"](v) or v >= value
    if key == "pattern":
        rx = re.compile(value)
        return lambda v: not isinstance(v, str) or rx.search(v) is not None
    if key == "required":
        return lambda v: not isinstance(v, dict) or all(n in v for n in value)
    if key == "properties":
        props = [(name, _compile(sub, root, registry)) for name, sub in value.items()]

        def properties(v: Any) -> bool:
            if isinstance(v, dict):
                for name, c in props:
                    if name in v and not c(v[name]):
                        return False
            return True

        return properties
    if key == "items":
        item = _compile(value, root, registry)
        return lambda v: not isinstance(v, list) or all(item(x) for x in v)
    if key == "anyOf":
        branches = [_compile(b, root, registry) for b in value]
        return lambda v: any(b(v) for b in branches)
    raise ValueError(f"the fast schema check does not know the keyword {key!r}; add it to _keyword")


def _lazy(schema: Mapping[str, Any], root: Mapping[str, Any], registry: Mapping[str, Mapping[str, Any]]) -> Check:
    compiled: list[Check] = []

    def check(v: Any) -> bool:
        if not compiled:
            compiled.append(_compile(schema, root, registry))
        return compiled[0](v)

    return check


@cache
def _fast(name: str) -> Check:
    registry = {n: load_schema(n) for n in (ENVELOPE_SCHEMA, SIDECAR_SCHEMA)}
    return _compile(registry[name], registry[name], registry)


@cache
def _attachment_validator() -> Validator:
    envelope = _validator(ENVELOPE_SCHEMA)
    return envelope.evolve(schema={"$ref": f"{ENVELOPE_SCHEMA}#/$defs/attachment"})


def field_name(path: Iterable[str | int]) -> str:
    """``["attachments", 0, "storage"]`` → ``"attachments[0].storage"``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def _problem(error: ValidationError, prefix: Iterable[str | int] = ()) -> Problem:
    expected: Any = error.validator_value
    path: list[str | int] = [*prefix, *error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, Mapping):
        missing = [str(k) for k in expected if k not in error.instance]
        return Problem(field_name([*path, *missing[:1]]), "is required")
    if error.validator == "anyOf" and isinstance(error.instance, Mapping):
        branches = [b.get("required", []) for b in expected if isinstance(b, Mapping)]
        names = [n for b in branches for n in b]
        if names and len(names) == len(branches):
            return Problem(field_name(path), "needs one of: " + ", ".join(names))
    if error.validator == "const":
        return Problem(field_name(path), f"must be {json.dumps(expected)}, not {_short(error.instance)}")
    if error.validator == "enum":
        allowed = ", ".join(json.dumps(v) for v in expected)
        return Problem(field_name(path), f"must be one of {allowed}, not {_short(error.instance)}")
    if error.validator == "anyOf":
        # optional typed fields are anyOf[typed, null]: say what the typed branch wanted
        return Problem(field_name(path), f"has a bad value {_short(error.instance)} ({_expected(error)})")
    return Problem(field_name(path), error.message)


def _expected(error: ValidationError) -> str:
    branches: Any = error.validator_value
    for branch in branches:
        if isinstance(branch, Mapping) and branch.get("type") != "null":
            parts = [f"{k} {v}" for k, v in branch.items()]
            return ", ".join(parts) + ", or null"
    return "see the schema"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _ordered(errors: Iterable[ValidationError]) -> list[ValidationError]:
    return sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])


def _time_order(doc: Mapping[str, Any], prefix: list[str | int]) -> list[Problem]:
    start, end = doc.get("started_at_ns"), doc.get("ended_at_ns")
    if isinstance(start, int) and isinstance(end, int) and end < start:
        return [Problem(field_name([*prefix, "ended_at_ns"]), f"{end} is before started_at_ns {start}")]
    return []


def envelope_problems(doc: Any) -> list[Problem]:
    """Everything wrong with a parsed ``stormlog_run.json``; empty when it is a valid v1 envelope.

    Beyond the schema: ``ended_at_ns`` may not be before ``started_at_ns`` (top level and each
    session), and ``attachment_id`` is unique within the envelope.
    """
    problems = [] if _fast(ENVELOPE_SCHEMA)(doc) else [
        _problem(e) for e in _ordered(_validator(ENVELOPE_SCHEMA).iter_errors(doc))]
    if problems or not isinstance(doc, Mapping):
        return problems
    problems += _time_order(doc, [])
    for i, session in enumerate(doc.get("sessions") or []):
        problems += _time_order(session, ["sessions", i])
    seen: set[str] = set()
    for i, item in enumerate(doc.get("attachments") or []):
        if item["attachment_id"] in seen:
            problems.append(Problem(f"attachments[{i}].attachment_id",
                                    f"{item['attachment_id']!r} is used twice in this envelope"))
        seen.add(item["attachment_id"])
    return problems


def sidecar_problems(doc: Any) -> tuple[list[Problem], dict[int, list[Problem]]]:
    """Check a parsed ``stormlog_attachments.json``.

    Returns:
        ``(file_problems, item_problems)``: problems that reject the whole file, and problems per
        ``attachments`` index that reject only that item (the other items are kept).
    """
    file_level: list[Problem] = []
    items: dict[int, list[Problem]] = {}
    if _fast(SIDECAR_SCHEMA)(doc):
        return file_level, items
    for error in _ordered(_validator(SIDECAR_SCHEMA).iter_errors(doc)):
        path = list(error.absolute_path)
        if len(path) >= 2 and path[0] == "attachments" and isinstance(path[1], int):
            items.setdefault(path[1], []).append(_problem(error))
        else:
            file_level.append(_problem(error))
    return file_level, items


def attachment_problems(item: Any, prefix: Iterable[str | int] = ()) -> list[Problem]:
    """Everything wrong with one attachment object (the envelope schema's ``$defs/attachment``)."""
    return [_problem(e, prefix) for e in _ordered(_attachment_validator().iter_errors(item))]
