"""Tolerant parsers for the four small files of a run folder (003 seed, "Writing runs" §3-5, §7).

Each parser takes the file's bytes and returns ``(value, warnings)``. Problems that make the whole file
unusable raise :class:`RunFileError` with a one-line message; the run store then keeps the last good
parse and shows the message as a warning on that run. Parsing never executes anything from the file.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from functools import cache
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import yaml

from traceml_ai.runs.layout import MAX_SMALL_FILE_BYTES, SCHEMA_VERSION, STATUSES
from traceml_ai.runs.model import BestValue, MetricValue, Scalar

MAX_YAML_NODES = 100_000
"""params.yaml may expand to at most this many nodes after aliases (billion-laughs guard)."""

MAX_JSON_DEPTH = 200
"""Values of a run file nested deeper than this are shown as a short text instead, with a warning:
JSON encoders refuse deeper nesting (orjson stops at 255 levels, and an answer wraps the value in a
few levels of its own), so one such file would otherwise fail every answer it is part of."""

MAX_PARAMS_DEPTH = 64
"""params.yaml mappings nested deeper than this are kept as one text value (a dotted key of 64 parts
is already far from a parameter name)."""

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
"""Integers outside this range (what SQLite and every JSON encoder here store as integers) are kept
exactly as text."""

_BIG_INT = re.compile(rb"(?<![\d.eE])-?(?:\d{20,}|9[2-9]\d{17})(?![\d.eE])")
"""A JSON token that may be an integer outside 64 bits: 20 digits or more, or 19 from 92... on (2**63
is 9223372036854775808). orjson reads one above 2**64 as an inexact float; the slower exact reader
takes any file with such a token (a 19-digit nanosecond timestamp does not match)."""

_DEEP_MARK = "(nested deeper than {0} levels; not shown)"


class RunFileError(ValueError):
    """A run file could not be used at all. ``str(err)`` is one line: ``"<file>: <what is wrong>"``."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(f"{file}: {message}")
        self.file = file
        self.message = message


def check_size(file: str, size: int) -> None:
    """Raise :class:`RunFileError` when a small file is above the 16 MB parse limit."""
    if size > MAX_SMALL_FILE_BYTES:
        raise RunFileError(file, f"{size / 1e6:.1f} MB is above the 16 MB limit; not parsed")


def load_json(data: bytes, file: str = "config.json") -> tuple[Any, list[str]]:
    """Parse JSON bytes. Bare ``NaN``/``Infinity`` tokens are accepted (Python writes them); bytes that
    are not UTF-8 are replaced by U+FFFD with a warning, so one bad byte does not hide the whole file.

    Raises:
        RunFileError: the text is not JSON.
    """
    warnings: list[str] = []
    if _RUN_OF_19_DIGITS not in data.translate(_DIGITS) or not _BIG_INT.search(data):
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
        else:
            # Too few brackets to nest deeper than the cap, or orjson says it does not.
            if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH or _fits(value):
                return value, warnings
            return tame_json(value, file, warnings), warnings
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        warnings.append(f"{file}: byte 0x{data[err.start]:02x} at offset {err.start} is not UTF-8; shown as \ufffd")
        text = data.decode("utf-8", errors="replace")
    try:
        return tame_json(json.loads(text), file, warnings), warnings
    except json.JSONDecodeError as err:
        raise RunFileError(file, f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except RecursionError:
        raise RunFileError(file, "nested too deeply to parse") from None
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        raise RunFileError(file, f"not readable JSON ({_first_line(err)})") from None


_DIGITS = bytes(ord("0") if 0x30 <= b <= 0x39 else ord(" ") for b in range(256))
_RUN_OF_19_DIGITS = b"0" * 19  # in ``data.translate(_DIGITS)``: a C-speed test before the regex


def _fits(value: Any) -> bool:
    """True when ``value`` nests at most :data:`MAX_JSON_DEPTH` levels (C speed: orjson refuses
    nesting above 255 levels, so a wrapper of the levels above the cap makes it refuse exactly the
    values nested deeper than the cap)."""
    wrapped: Any = value
    for _ in range(255 - MAX_JSON_DEPTH):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except (orjson.JSONEncodeError, TypeError):
        return False
    return True


def tame_json(value: Any, file: str, warnings: list[str], max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``value`` (parsed JSON or YAML) made safe to encode again: integers outside 64 bits become
    their exact decimal text, and containers nested deeper than ``max_depth`` become a short text;
    one warning per kind names ``file``. Iterative: no nesting reaches the recursion limit.

    Returns a new value where something changed (the original objects are not modified).
    """
    found = {"int": False, "deep": False}

    def scalar(v: Any) -> Any:
        if type(v) is int and not INT64_MIN <= v <= INT64_MAX:
            found["int"] = True
            return str(v)
        return v

    if not isinstance(value, (dict, list)):
        return scalar(value)
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any, int]] = [(value, root, 1)]
    while stack:
        source, target, depth = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, child in items:
            if isinstance(child, (dict, list)):
                if depth >= max_depth:
                    found["deep"] = True
                    new: Any = _DEEP_MARK.format(max_depth)
                else:
                    new = {} if isinstance(child, dict) else []
                    stack.append((child, new, depth + 1))
            else:
                new = scalar(child)
            if isinstance(target, dict):
                target[key] = new
            else:
                target.append(new)
    if found["int"]:
        warnings.append(f"{file}: an integer outside the 64-bit range is kept exactly as text")
    if found["deep"]:
        warnings.append(f"{file}: values nested deeper than {max_depth} levels are not shown")
    return root


_INTERN_MAX = 64
"""Text values up to this many characters that repeat across runs (statuses, groups, tags, params
such as ``adam``) are stored once (``sys.intern``): a viewer keeps 10,000 runs."""


def _shared(value: Any) -> Any:
    """``value`` itself, or for a short string the one copy all runs share."""
    return sys.intern(value) if type(value) is str and len(value) <= _INTERN_MAX else value


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def parse_iso(value: Any) -> float | None:
    """ISO-8601 text → Unix seconds; a naive time is taken as UTC. None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


# -- run.json ----------------------------------------------------------------------------------


@dataclass(slots=True)
class RunJson:
    """run.json as read: the typed fields the table needs plus the raw object for the inspector
    (``{}`` when parsed with ``keep_raw=False``, as the run store does: it re-reads the file for
    the inspector)."""

    raw: dict[str, Any]
    schema_version: int | None
    name: str | None
    group: str | None
    tags: list[str]
    notes: str
    status: str | None
    started_at: str | None
    ended_at: str | None
    heartbeat_at: str | None
    heartbeat_s: float | None
    duration_s: float | None
    exit: dict[str, Any] | None


def _opt_str(obj: dict[str, Any], key: str, file: str, warnings: list[str]) -> str | None:
    v = obj.get(key)
    if v is None or isinstance(v, str):
        return v
    warnings.append(f"{file}: {key} should be a string, got {type(v).__name__}; ignored")
    return None


def _opt_number(obj: dict[str, Any], key: str, file: str, warnings: list[str]) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    warnings.append(f"{file}: {key} should be a number, got {type(v).__name__}; ignored")
    return None


def _opt_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _schema_version(obj: dict[str, Any], file: str, warnings: list[str]) -> int | None:
    """``obj["schema_version"]`` as an integer (None when absent or not one, with a warning), and a
    warning when it is newer than this TraceML reads (the file is then read as far as it matches)."""
    version = _opt_int(obj.get("schema_version"))
    if version is None and obj.get("schema_version") is not None:
        warnings.append(f"{file}: schema_version should be an integer, got {obj['schema_version']!r}; ignored")
    if version is not None and version > SCHEMA_VERSION:
        warnings.append(
            f"{file}: schema_version {version} is newer than this TraceML reads ({SCHEMA_VERSION}); "
            "some fields may not be shown"
        )
    return version


def parse_run_json(data: bytes, file: str = "run.json", *, keep_raw: bool = True) -> tuple[RunJson, list[str]]:
    """Parse run.json (003 seed §3). Fields of the wrong type are dropped with a warning; a
    ``schema_version`` above 1 is read as far as it matches version 1, with a warning.
    ``keep_raw=False`` leaves :attr:`RunJson.raw` empty (the optional fields, such as ``command``
    and ``host``, are then not kept in memory).

    Raises:
        RunFileError: not JSON, or not a JSON object.
    """
    obj, warnings = load_json(data, file)
    if not isinstance(obj, dict):
        raise RunFileError(file, f"expected a JSON object, got {type(obj).__name__}")
    version = _schema_version(obj, file, warnings)
    tags_raw = obj.get("tags")
    tags: list[str] = []
    if isinstance(tags_raw, list):
        tags = [_shared(t) if isinstance(t, str) else json.dumps(t) for t in tags_raw]
    elif tags_raw is not None:
        warnings.append(f"{file}: tags should be a list of strings; ignored")
    exit_raw = obj.get("exit")
    if exit_raw is not None and not isinstance(exit_raw, dict):
        warnings.append(f"{file}: exit should be an object or null; ignored")
        exit_raw = None
    heartbeat_at = _opt_str(obj, "heartbeat_at", file, warnings)
    heartbeat_s = parse_iso(heartbeat_at)
    if heartbeat_at and heartbeat_s is None:
        warnings.append(f"{file}: heartbeat_at {heartbeat_at!r} is not an ISO-8601 time; ignored")
    status = _shared(_opt_str(obj, "status", file, warnings))
    if status is not None and status not in STATUSES:
        warnings.append(f"{file}: status {status!r} is not one of {', '.join(STATUSES)}; shown as unknown")
    times = {}
    for key in ("started_at", "ended_at"):
        value = _opt_str(obj, key, file, warnings)
        if value is not None and parse_iso(value) is None:
            warnings.append(f"{file}: {key} {value!r} is not an ISO-8601 time; ignored")
            value = None
        times[key] = value
    run = RunJson(
        raw=obj if keep_raw else {},
        schema_version=version,
        name=_opt_str(obj, "name", file, warnings),
        group=_shared(_opt_str(obj, "group", file, warnings)),
        tags=tags,
        notes=_shared(_opt_str(obj, "notes", file, warnings) or ""),
        status=status,
        started_at=times["started_at"],
        ended_at=times["ended_at"],
        heartbeat_at=heartbeat_at if heartbeat_s is not None else None,
        heartbeat_s=heartbeat_s,
        duration_s=_opt_number(obj, "duration_s", file, warnings),
        exit=exit_raw,
    )
    return run, warnings


# -- params.yaml -------------------------------------------------------------------------------

@cache
def _params_loader() -> type[yaml.SafeLoader]:
    """A safe loader that also reads YAML 1.2 floats without a dot (``1e-05``) as floats, as every
    other YAML reader the user might compare with does. Built on first use: the flat files loggers
    write take the fast path below, and PyYAML costs 20 ms to import (issue 14, item 1)."""
    import yaml

    base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class ParamsLoader(base):  # type: ignore[valid-type,misc]
        pass

    ParamsLoader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."),
    )
    return ParamsLoader


# The fast path reads the flat ``key: scalar`` files loggers write without building a YAML parser;
# anything it does not recognise exactly sends the whole file through PyYAML, so both give the same
# result (tests/runs/test_readers.py checks the two agree).
# A quoted string takes only characters YAML reads as themselves: no escapes, no control or C1
# characters (PyYAML rejects most of them), no line breaks YAML folds (U+0085, U+2028, U+2029).
_FAST_QUOTED = r'"[^"\\\x00-\x1f\x7f-\x9f\u2028\u2029\ufffe\uffff]*"'
# Values may also hold the escapes that mean the same in JSON and in YAML (writers use json.dumps).
_FAST_ESCAPED = r'"(?:[^"\\\x00-\x1f\x7f-\x9f\u2028\u2029\ufffe\uffff]|\\["\\/bfnrt])*"'
# One line of a flat file; groups: plain key, quoted key, true/false/null, int, float, quoted, word.
_FAST_LINE = re.compile(
    rf"^(?:([A-Za-z_][A-Za-z0-9_./-]*)|({_FAST_QUOTED})): "
    rf"(?:(true|false|null)|(-?(?:0|[1-9][0-9]*))|(-?[0-9]+\.[0-9]+(?:e[-+][0-9]+)?)|({_FAST_ESCAPED})"
    r"|([A-Za-z][A-Za-z0-9_-]*))\r?$",
    re.MULTILINE,
)
_YAML_WORDS: dict[str, Any] = {"true": True, "false": False, "null": None}
_YAML_SPECIAL_WORDS = frozenset(
    ["yes", "no", "on", "off", "y", "n", "true", "false", "null", "nan", "inf", "empty"]
)


def _fast_params(text: str) -> dict[str, Any] | None:
    """Flat ``key: scalar`` lines → dict, or None when any line needs the full YAML reader (the
    nested form :func:`_fast_nested_params` reads is tried next)."""
    if not text:
        return {}
    matches = _FAST_LINE.findall(text)
    if len(matches) != text.count("\n") + (not text.endswith("\n")):
        return _fast_nested_params(text)  # a line the pattern does not cover (nesting, comments, ...)
    out: dict[str, Any] = {}
    for plain, quoted_key, word, integer, number, quoted, bare in matches:
        if plain:
            if plain.lower() in _YAML_SPECIAL_WORDS:
                return None
            key = sys.intern(plain)  # the same keys repeat in every run: store each once
        else:
            key = sys.intern(quoted_key[1:-1])
        if key in out:
            return None  # let PyYAML decide what a duplicate key means
        value = _fast_value(word, integer, number, quoted, bare)
        if value is _NOT_FAST:
            return None
        out[key] = value
    return out


_NOT_FAST: Any = object()


def _fast_value(word: str, integer: str, number: str, quoted: str, bare: str) -> Any:
    """The value of one matched scalar (one of the groups is set), or _NOT_FAST for a word YAML
    reads as something else (``yes``, ``nan``, ...)."""
    if word:
        return _YAML_WORDS[word]
    if integer:
        return _param_scalar(int(integer))
    if number:
        return float(number)
    if quoted:
        return _shared(json.loads(quoted) if "\\" in quoted else quoted[1:-1])
    if bare.lower() in _YAML_SPECIAL_WORDS:
        return _NOT_FAST
    return _shared(bare)


_FAST_SCALAR = rf"(?:true|false|null|-?(?:0|[1-9][0-9]*)|-?[0-9]+\.[0-9]+(?:e[-+][0-9]+)?|{_FAST_ESCAPED})"



@cache
def _fast_nested_line() -> re.Pattern[str]:
    """One line of a nested file: indent, key, then a scalar (groups as in _FAST_LINE), a one-line
    list of JSON scalars, or nothing (a mapping follows, indented two more spaces). Compiled on
    first use: most files are flat."""
    return re.compile(
        rf"^( *)(?:([A-Za-z_][A-Za-z0-9_./-]*)|({_FAST_QUOTED})):(?: "
        rf"(?:(true|false|null)|(-?(?:0|[1-9][0-9]*))|(-?[0-9]+\.[0-9]+(?:e[-+][0-9]+)?)|({_FAST_ESCAPED})"
        rf"|([A-Za-z][A-Za-z0-9_-]*)|(\[(?:{_FAST_SCALAR}(?:, {_FAST_SCALAR})*)?\])))?\r?$",
        re.MULTILINE,
    )


_FAST_MAX_DEPTH = 8


def _fast_nested_params(text: str) -> dict[str, Any] | None:
    """Mappings nested by two spaces a level, of ``key: scalar`` and ``key: [scalar, ...]`` lines
    (as hand-written and older params files are) → the flattened dict, or None for anything else."""
    matches = _fast_nested_line().findall(text)
    if len(matches) != text.count("\n") + (not text.endswith("\n")):
        return None
    root: dict[str, Any] = {}
    stack: list[dict[str, Any]] = [root]  # the mapping at each depth that takes keys now
    for indent, plain, quoted_key, word, integer, number, quoted, bare, flow in matches:
        depth, odd = divmod(len(indent), 2)
        if odd or depth >= len(stack):
            return None  # not two spaces deeper than the mapping's opener
        if any(not m for m in stack[depth + 1:]):
            return None  # 'key:' with nothing under it (YAML's null)
        del stack[depth + 1:]
        if plain and plain.lower() in _YAML_SPECIAL_WORDS:
            return None
        key = plain or quoted_key[1:-1]
        mapping = stack[depth]
        if key in mapping:
            return None
        if flow:
            mapping[key] = json.loads(flow)
        elif word or integer or number or quoted or bare:
            value = _fast_value(word, integer, number, quoted, bare)
            if value is _NOT_FAST:
                return None
            mapping[key] = value
        elif depth + 1 >= _FAST_MAX_DEPTH:
            return None
        else:
            mapping[key] = {}
            stack.append(mapping[key])
    if any(not m for m in stack[1:]):
        return None
    out: dict[str, Any] = {}
    _flatten(root, "", out)
    return out


def _check_expansion(root: Any) -> None:
    """Raise ValueError when the loaded document expands to more than MAX_YAML_NODES nodes
    (aliases are shared objects after loading, so this counts the tree a reader would walk)."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in active:
            raise ValueError("a recursive alias")
        active.add(id(node))
        children = node.values() if isinstance(node, dict) else node
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_YAML_NODES:
                raise ValueError(f"aliases expand to more than {MAX_YAML_NODES:,} values")
        active.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root)


def _param_scalar(v: Any) -> Scalar:
    if isinstance(v, str):
        return _shared(v)  # type: ignore[no-any-return]
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if INT64_MIN <= v <= INT64_MAX else str(v)  # exact, and encodable by every JSON writer
    if isinstance(v, float):
        return v
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, (list, tuple)):
        try:
            return json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)
        except RecursionError:
            return _DEEP_MARK.format(MAX_PARAMS_DEPTH)
    return str(v)


def _flatten(obj: dict[Any, Any], prefix: str, out: dict[str, Scalar], depth: int = 1) -> bool:
    """Flatten ``obj`` into ``out``; False when a mapping deeper than :data:`MAX_PARAMS_DEPTH` was
    cut (kept as one text value)."""
    whole = True
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            if depth >= MAX_PARAMS_DEPTH:
                out[key] = _DEEP_MARK.format(MAX_PARAMS_DEPTH)
                whole = False
            else:
                whole = _flatten(v, key + ".", out, depth + 1) and whole
        else:
            out[key] = _param_scalar(v) if not isinstance(v, dict) else "{}"
    return whole


def parse_params_yaml(data: bytes, file: str = "params.yaml") -> tuple[dict[str, Scalar], list[str]]:
    """Parse params.yaml into a flat ``{key: scalar}`` mapping (003 seed §4): nested mappings
    flattened with dots, lists as compact JSON strings, booleans and null kept, dates as ISO text.

    Raises:
        RunFileError: not YAML, not a mapping, or aliases that expand too far.
    """
    warnings: list[str] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        warnings.append(f"{file}: byte 0x{data[err.start]:02x} at offset {err.start} is not UTF-8; shown as \ufffd")
        text = data.decode("utf-8", errors="replace")
    try:
        fast = _fast_params(text)
    except ValueError:  # an integer too long for int(): let PyYAML report it
        fast = None
    if fast is not None:
        return fast, warnings
    import yaml

    try:
        doc = yaml.load(text, Loader=_params_loader())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise RunFileError(file, f"not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise RunFileError(file, "nested too deeply to parse") from None
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        raise RunFileError(file, f"not readable YAML ({_first_line(err)})") from None
    if doc is None:
        return {}, warnings
    if not isinstance(doc, dict):
        raise RunFileError(file, f"expected a mapping of params, got {type(doc).__name__}")
    try:
        _check_expansion(doc)
    except ValueError as err:
        raise RunFileError(file, f"{err}; not parsed") from None
    out: dict[str, Scalar] = {}
    try:
        whole = _flatten(doc, "", out)
    except RecursionError:
        raise RunFileError(file, "nested too deeply to parse") from None
    if not whole:
        warnings.append(f"{file}: mappings nested deeper than {MAX_PARAMS_DEPTH} levels are kept as one text value")
    return out, warnings


# -- metrics.json ------------------------------------------------------------------------------


@dataclass(slots=True)
class MetricsJson:
    """metrics.json as read (003 seed §7)."""

    step: int | None = None
    epoch: int | None = None
    updated_at: str | None = None
    last: dict[str, MetricValue] = field(default_factory=dict)
    best: dict[str, BestValue] = field(default_factory=dict)
    summary: dict[str, Scalar] = field(default_factory=dict)


_NUMBER = (float, int)


def metric_number(v: Any) -> MetricValue | bool:
    """A metric value as read: float for a number (NaN/inf kept), None for null, False when the
    value is not a number at all (strings, lists, objects, booleans are not metrics)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    return float(v)


def parse_metrics_json(data: bytes, file: str = "metrics.json") -> tuple[MetricsJson, list[str]]:
    """Parse metrics.json. Non-numeric ``last``/``best`` values are skipped with one warning; a
    ``schema_version`` above 1 is read as far as it matches version 1, with a warning (as run.json's).

    Raises:
        RunFileError: not JSON or not an object.
    """
    obj, warnings = load_json(data, file)
    if not isinstance(obj, dict):
        raise RunFileError(file, f"expected a JSON object, got {type(obj).__name__}")
    _schema_version(obj, file, warnings)
    out = MetricsJson(step=_opt_int(obj.get("step")), epoch=_opt_int(obj.get("epoch")))
    if isinstance(obj.get("updated_at"), str):
        out.updated_at = obj["updated_at"]
    skipped: list[str] = []
    last = obj.get("last")
    if isinstance(last, dict):
        # type() rather than isinstance(): bool is an int subclass but not a metric.
        out.last = {k: float(v) if type(v) is int else v for k, v in last.items() if v is None or type(v) in _NUMBER}
        skipped += [f"last.{k}" for k in last if k not in out.last]
    best = obj.get("best")
    if isinstance(best, dict):
        for k, b in best.items():
            n = metric_number(b.get("value")) if isinstance(b, dict) else False
            if n is False or not isinstance(b, dict):
                skipped.append(f"best.{k}")
                continue
            mode = b.get("mode")
            out.best[str(k)] = BestValue(
                value=n,
                step=_opt_int(b.get("step")),
                epoch=_opt_int(b.get("epoch")),
                mode=mode if mode in ("max", "min") else None,
            )
    summary = obj.get("summary")
    if isinstance(summary, dict):
        for k, v in summary.items():
            if v is None or isinstance(v, (str, bool, int, float)):
                out.summary[str(k)] = _shared(v)
            else:
                out.summary[str(k)] = json.dumps(v, separators=(",", ":"), default=str)
    if skipped:
        shown = ", ".join(skipped[:3]) + (", ..." if len(skipped) > 3 else "")
        warnings.append(f"{file}: {len(skipped)} non-numeric metric value(s) ignored ({shown})")
    return out, warnings
