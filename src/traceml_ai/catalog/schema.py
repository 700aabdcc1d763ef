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
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import cache
from importlib import resources
from typing import Any, Final, NamedTuple

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

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


def _same(a: Any, b: Any) -> bool:
    """JSON equality as Python's ``==`` of parsed JSON, but ``1.0`` is not ``1`` (nor ``true``)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _strict_const(_v: Validator, const: Any, instance: Any, _s: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not _same(instance, const):
        yield ValidationError(f"{instance!r} was expected to be {const!r}")


def _strict_enum(_v: Validator, enums: Any, instance: Any, _s: Mapping[str, Any]) -> Iterator[ValidationError]:
    if not any(_same(instance, e) for e in enums):
        yield ValidationError(f"{instance!r} is not one of {enums!r}")


_StrictValidator: Final = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={"const": _strict_const, "enum": _strict_enum},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, v: isinstance(v, int) and not isinstance(v, bool)),
)
"""JSON Schema 2020-12 as Stormlog's reader applies it: an integer field takes only an integer
(``1.0`` or ``1e3`` is a number, which Stormlog's ``isinstance(value, int)`` refuses, where plain
JSON Schema would take it), and ``const`` / ``enum`` compare types too (``schema_version: 1.0`` is
not ``1``)."""


@cache
def _validator(name: str) -> Validator:
    # Each schema stands alone (no reference into another file), as ``jsonschema`` loads it.
    out: Validator = _StrictValidator(load_schema(name))
    return out


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
    themselves. It answers only "valid?", exactly as the (strict) jsonschema validator does; it is
    ~50x faster than jsonschema on an envelope, and jsonschema still produces every message.
    A keyword outside the subset raises here, so the schemas cannot grow a rule that this check would silently skip."""
    checks = [_keyword(key, value, root, registry, schema) for key, value in schema.items() if key not in _ANNOTATIONS]
    if len(checks) == 1:
        return checks[0]

    def check(v: Any) -> bool:
        for c in checks:  # a plain loop: all() over a generator costs twice as much here
            if not c(v):
                return False
        return True

    return check


def _unique(items: list[Any]) -> bool:
    seen: list[Any] = []
    for x in items:
        if any(type(x) is type(y) and x == y for y in seen):
            return False
        seen.append(x)
    return True


def _keyword(key: str, value: Any, root: Mapping[str, Any], registry: Mapping[str, Mapping[str, Any]],
             schema: Mapping[str, Any]) -> Check:
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
    if key == "uniqueItems":
        return lambda v: not value or not isinstance(v, list) or _unique(v)
    if key == "additionalProperties":
        if value is not False:
            raise ValueError("the fast schema check knows only additionalProperties: false")
        allowed = frozenset(schema.get("properties", {}))
        return lambda v: not isinstance(v, dict) or allowed.issuperset(v)
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
    schema = load_schema(name)
    return _compile(schema, schema, {name: schema})


@cache
def _attachment_validator() -> Validator:
    envelope = _validator(ENVELOPE_SCHEMA)
    defs = load_schema(ENVELOPE_SCHEMA)["$defs"]
    return envelope.evolve(schema={**defs["attachment"], "$defs": defs})


def field_name(path: Iterable[str | int]) -> str:
    """``["attachments", 0, "storage"]`` → ``"attachments[0].storage"``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


_ARTICLE: Final = {"object": "an object", "array": "a list", "string": "a string", "integer": "an integer",
                   "number": "a number", "boolean": "true or false", "null": "null"}


def _problems(errors: Iterable[ValidationError], prefix: Iterable[str | int] = ()) -> list[Problem]:
    """One :class:`Problem` per field, in order, without repeats (see :func:`_with_errors`)."""
    return [problem for problem, _ in _with_errors(errors, prefix)]


def _problem(error: ValidationError, prefix: Iterable[str | int] = ()) -> list[Problem]:
    # Messages show values as JSON (null, "a,b"), never as Python reprs (None, 'a,b').
    expected: Any = error.validator_value
    path: list[str | int] = [*prefix, *error.absolute_path]
    if error.validator == "required" and isinstance(error.instance, Mapping):
        return [Problem(field_name([*path, str(k)]), "is required") for k in expected if k not in error.instance]
    if error.validator == "anyOf" and isinstance(error.instance, Mapping):
        branches = [b.get("required", []) for b in expected if isinstance(b, Mapping)]
        names = [str(n) for b in branches for n in b]
        if names and len(names) == len(branches):
            # e.g. an attachment with neither path nor url: name the first field, mention the others
            others = " or ".join(names[1:])
            return [Problem(field_name([*path, names[0]]), f"is required when {others} is not given "
                                                           f"(one of {', '.join(names)})")]
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        known = error.schema.get("properties", {}) if isinstance(error.schema, Mapping) else {}
        return [Problem(field_name([*path, str(k)]), "is not a field of the v1 schema (Stormlog rejects unknown "
                                                      "fields; put integration-specific facts in metadata)")
                for k in error.instance if k not in known]
    if error.validator == "uniqueItems":
        return [Problem(field_name(path), f"holds the same item twice ({_short(error.instance)})")]
    if error.validator == "const":
        return [Problem(field_name(path), f"must be {json.dumps(expected)}, not {_short(error.instance)}")]
    if error.validator == "enum":
        allowed = ", ".join(json.dumps(v) for v in expected)
        return [Problem(field_name(path), f"must be one of {allowed}, not {_short(error.instance)}")]
    if error.validator == "anyOf":
        # optional typed fields are anyOf[typed, null]: say what the typed branch wanted
        return [Problem(field_name(path), f"has a bad value {_short(error.instance)} ({_expected(error)})")]
    if error.validator == "type":
        types = [expected] if isinstance(expected, str) else list(expected)
        wanted = " or ".join(_ARTICLE.get(t, t) for t in types)
        return [Problem(field_name(path), f"must be {wanted}, not {_short(error.instance)}")]
    if error.validator == "minLength":
        wanted = "a non-empty string" if expected == 1 else f"a string of at least {expected} characters"
        return [Problem(field_name(path), f"must be {wanted}, not {_short(error.instance)}")]
    if error.validator == "minimum":
        return [Problem(field_name(path), f"must be at least {expected}, not {_short(error.instance)}")]
    if error.validator == "pattern":
        return [Problem(field_name(path), f"must match {json.dumps(expected)}, not {_short(error.instance)}")]
    return [Problem(field_name(path), error.message)]


def _expected(error: ValidationError) -> str:
    branches: Any = error.validator_value
    for branch in branches:
        if isinstance(branch, Mapping) and branch.get("type") != "null":
            parts = [f"{k} {v if isinstance(v, str) else json.dumps(v)}" for k, v in branch.items()]
            return ", ".join(parts) + ", or null"
    return "see the schema"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _ordered(errors: Iterable[ValidationError]) -> list[ValidationError]:
    return sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])


def _time_order(doc: Mapping[str, Any], prefix: list[str | int], start_key: str = "started_at_ns",
                end_key: str = "ended_at_ns") -> list[Problem]:
    start, end = doc.get(start_key), doc.get(end_key)
    if isinstance(start, int) and isinstance(end, int) and _is_int(start) and _is_int(end) and end < start:
        return [Problem(field_name([*prefix, end_key]), f"{end} is before {start_key} {start} (Stormlog's reader "
                                                        "refuses it)")]
    return []


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def envelope_problems(doc: Any) -> list[Problem]:
    """Everything wrong with a parsed ``stormlog_run.json``; empty when it is a valid v1 envelope,
    exactly when Stormlog 0.4.3 accepts it (its schema and its reader).

    Beyond the schema, as Stormlog's reader: ``ended_at_ns`` may not be before ``started_at_ns``,
    nor an attachment's ``end_ns`` before its ``start_ns``. These are checked even when the schema
    finds problems too, so that fixing the reported ones does not reveal new ones.
    """
    problems = [] if _fast(ENVELOPE_SCHEMA)(doc) else _problems(_validator(ENVELOPE_SCHEMA).iter_errors(doc))
    if not isinstance(doc, Mapping):
        return problems
    problems += _time_order(doc, [])
    attachments = doc.get("attachments")
    for i, item in enumerate(attachments if isinstance(attachments, list) else []):
        if isinstance(item, Mapping):
            problems += _time_order(item, ["attachments", i], "start_ns", "end_ns")
    return problems


def sidecar_problems(doc: Any) -> tuple[list[Problem], dict[int, list[Problem]]]:
    """Check a parsed ``stormlog_attachments.json``.

    Returns:
        ``(file_problems, item_problems)``: problems that reject the whole file, and problems per
        ``attachments`` index that reject only that item (the other items are kept).
    """
    file_level: list[Problem] = []
    items: dict[int, list[Problem]] = {}
    if not _fast(SIDECAR_SCHEMA)(doc):
        checked = list(_with_errors(_validator(SIDECAR_SCHEMA).iter_errors(doc)))
    else:
        checked = []
    for problem, error in checked:
        path = list(error.absolute_path)
        if len(path) >= 2 and path[0] == "attachments" and isinstance(path[1], int):
            items.setdefault(path[1], []).append(problem)
        else:
            file_level.append(problem)
    attachments = doc.get("attachments") if isinstance(doc, Mapping) else None
    for i, item in enumerate(attachments if isinstance(attachments, list) else []):
        if isinstance(item, Mapping):
            for problem in _time_order(item, ["attachments", i], "start_ns", "end_ns"):
                items.setdefault(i, []).append(problem)
    return file_level, items


def _with_errors(errors: Iterable[ValidationError],
                 prefix: Iterable[str | int] = ()) -> list[tuple[Problem, ValidationError]]:
    """Each problem with the error it came from, in field order, without repeats. jsonschema
    reports ``required`` once per missing name, each time with the whole object: each of those
    errors names every missing field, and the repeats are dropped, so each is named exactly once."""
    seen: set[Problem] = set()
    out: list[tuple[Problem, ValidationError]] = []
    pre = list(prefix)
    for error in _ordered(errors):
        for problem in _problem(error, pre):
            if problem not in seen:
                seen.add(problem)
                out.append((problem, error))
    return out


def attachment_problems(item: Any, prefix: Iterable[str | int] = ()) -> list[Problem]:
    """Everything wrong with one attachment object of an envelope (the envelope schema's
    ``$defs/attachment``, and ``end_ns`` not before ``start_ns``)."""
    problems = _problems(_attachment_validator().iter_errors(item), prefix)
    if isinstance(item, Mapping):
        problems += _time_order(item, list(prefix), "start_ns", "end_ns")
    return problems


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _loose_int(v: Any) -> int | None:
    """An int as Stormlog's sidecar reader takes one: ints, floats and numeric strings."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return None


def sidecar_item_read(item: Any) -> dict[str, Any] | None:
    """One sidecar item as Stormlog 0.4.3's reader takes it, or None when it drops it: ``title`` and
    ``kind`` must be non-empty strings, ``url`` or ``path`` a non-empty string, and ``end_ns`` not
    before ``start_ns``. Fields of the wrong type are read as null, ``storage`` defaults to
    ``reference``, ``metadata`` to ``{}``. (The v1 schema is stricter; :func:`sidecar_problems`
    names every field it rejects, and the reader warns about each item it keeps anyway.)"""
    if not isinstance(item, Mapping):
        return None
    title, kind = _text(item.get("title")), _text(item.get("kind"))
    url, path = _text(item.get("url")), _text(item.get("path"))
    if title is None or kind is None or (url is None and path is None):
        return None
    start, end = _loose_int(item.get("start_ns")), _loose_int(item.get("end_ns"))
    if start is not None and end is not None and end < start:
        return None
    storage = item.get("storage")
    meta = item.get("metadata")
    out: dict[str, Any] = {
        "title": title, "kind": kind, "url": url, "path": path,
        "storage": storage if storage in STORAGES else "reference",
        "start_ns": start, "end_ns": end, "rank": _loose_int(item.get("rank")),
        "metadata": dict(meta) if isinstance(meta, Mapping) else {},
    }
    for key in ("attachment_id", "run_id", "session_id", "job_id", "created_at_utc", "updated_at_utc",
                "source_namespace", "source_ref"):
        out[key] = _text(item.get(key))
    return out


def sidecar_file_read(doc: Any) -> bool:
    """Whether Stormlog 0.4.3 reads the sidecar's items at all: an object with ``schema_version`` 1,
    ``format`` ``stormlog.attachments`` and an ``attachments`` list."""
    return (isinstance(doc, Mapping) and doc.get("schema_version") == 1 and doc.get("format") == SIDECAR_FORMAT
            and isinstance(doc.get("attachments"), list))
