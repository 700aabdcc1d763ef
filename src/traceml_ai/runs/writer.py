"""Writer-side rules of the run format (003 seed, "Writing runs" §2): atomic writes, ISO-8601 UTC
times, params flattening, metric values. Used by the logger (``traceml_ai.sdk``) and the fake-run
generator so that both write exactly the same format.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import orjson

from traceml_ai.runs.layout import RUN_ID_RE

Scalar = str | int | float | bool | None


def iso_utc(t: float) -> str:
    """Format Unix seconds ``t`` as ISO-8601 UTC with a ``Z`` suffix, second precision."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_run_name(name: str) -> None:
    """Refuse a run name the run format cannot hold (the rule :func:`make_run_id` applies).

    Raises:
        ValueError: ``name`` is empty or only whitespace, longer than 100 characters, ``.`` or
            ``..``, or holds a path separator or a control character (newline, tab, ...).
    """
    if not name.strip() or len(name) > 100 or name in (".", "..") or _BAD_NAME_CHARS.search(name):
        raise ValueError(
            f"run name {name!r} must be 1-100 characters, not blank, '.' or '..', without path separators or "
            "control characters"
        )


def make_run_id(name: str, t: float, hex4: str | None = None) -> str:
    """Return ``<YYYYMMDD-HHMMSS>_<slug>_<hex4>`` for Unix seconds ``t`` (UTC).

    The slug is :func:`folder_slug` of ``name`` (``"lr sweep 1"`` → ``lr-sweep-1``): folder names
    never hold spaces or shell characters; the name itself is kept unchanged in run.json.

    Raises:
        ValueError: ``name`` is refused by :func:`check_run_name`.
    """
    check_run_name(name)
    stamp = datetime.fromtimestamp(t, timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_id = f"{stamp}_{folder_slug(name)}_{hex4 or secrets.token_hex(2)}"
    if not RUN_ID_RE.match(run_id):
        raise ValueError(f"run id {run_id!r} does not have the form <YYYYMMDD-HHMMSS>_<name>_<hex4>")
    return run_id


_BAD_NAME_CHARS = re.compile("[/\\\x00-\x1f\x7f-\x9f]")
_NOT_SLUG = re.compile(r"[^\w.-]+")


def folder_slug(name: str) -> str:
    """``name`` as the middle part of a run folder name: every run of characters other than
    letters, digits, ``_``, ``.`` and ``-`` (spaces, quotes, ``$``, ...) becomes one ``-``;
    ``run`` when nothing is left. ``"lr sweep (2)"`` → ``lr-sweep-2``."""
    return _NOT_SLUG.sub("-", name).strip("-.") or "run"


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a dot-prefixed temp file in the same folder and a rename,
    so a reader sees either the old file or the new one, never half of one (003 seed, write rules).

    The temp file ``.<name>.<pid>.<random>.tmp`` is unique to this call, so two writers of one file
    (two threads, two processes) never write into each other's temp file: the last rename wins
    whole. The new file's mode follows the umask (0644 under the usual 022), like any file the user
    writes. ``durable`` fsyncs the data before the rename (the file survives a power loss); without
    it the rename alone still guarantees a whole file to readers, at a fraction of the cost.

    Raises:
        OSError: the folder is missing or not writable, or the disk is full (the temp file is
            removed, ``path`` keeps its old content).
    """
    path = os.fspath(path)
    folder, base = os.path.split(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _temp_file(folder, base)
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _temp_file(folder: str, base: str) -> tuple[int, str]:
    """A new, empty, exclusively created temp file next to ``base`` in ``folder`` (mode 0666 less
    the umask, unlike ``tempfile.mkstemp``'s 0600)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = os.path.join(folder or ".", f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"cannot create a temp file for {base} in {folder or '.'}")


def dump_json(value: Any) -> bytes:
    """Serialize ``value`` as indented JSON with a trailing newline. Non-JSON values become strings.

    An integer above 64 bits (``params={"seed": 2**64}``), which orjson refuses, is written exactly by
    the standard library instead; nesting too deep even for that is cut to a short text (issue 12
    point 5): a run's config never fails to be written.
    """
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE, default=str)
    except orjson.JSONEncodeError:
        pass
    try:
        return (json.dumps(value, indent=2, default=str, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except (RecursionError, ValueError):
        from traceml_ai.runs.readers import tame_json  # the reader's one walk; imported only here

        tamed = tame_json(value, "config.json", [])
        return orjson.dumps(tamed, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE, default=str)


def metric_value(v: Any) -> float | None:
    """A metric as written to disk: a finite float, or None for None / NaN / ±inf (a gap). A bool
    is 1.0 or 0.0, as numpy's ``np.bool_`` and a 0-d tensor of bools already were (W&B and MLflow
    take ``True`` as a metric too).

    Raises:
        TypeError, ValueError: ``v`` is not a number (strings, lists...) -- metrics must be numbers.
    """
    if v is None:
        return None
    if v is True or v is False:
        return float(v)
    if isinstance(v, (str, bytes)):
        raise TypeError(f"a metric value must be a number or None, not {type(v).__name__}")
    f = float(v)  # ints, floats, numpy scalars, 0-d tensors
    return f if math.isfinite(f) else None


MAX_PARAMS_DEPTH = 64
"""Mappings nested deeper than this in ``params`` are written as one text value (the readers cap
params.yaml at the same depth), so a run's params never fail to be written."""


def flatten_params(params: Mapping[str, Any], prefix: str = "", _depth: int = 0) -> dict[str, Scalar]:
    """Flatten nested mappings with dots; lists and tuples become compact JSON strings.

    ``{"optim": {"lr": 3e-4}, "layers": [1, 2]}`` → ``{"optim.lr": 0.0003, "layers": "[1,2]"}``.
    Non-finite floats become None; other non-scalar values become their ``str``; a mapping below
    :data:`MAX_PARAMS_DEPTH` levels becomes the text ``"{…nested too deep}"``.
    """
    out: dict[str, Scalar] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            if _depth + 1 >= MAX_PARAMS_DEPTH:
                out[key] = "{…nested too deep}"
            else:
                out.update(flatten_params(v, key + ".", _depth + 1))
        elif isinstance(v, (list, tuple)):
            try:
                out[key] = json.dumps(list(v), separators=(",", ":"), default=str)
            except (RecursionError, ValueError):
                out[key] = "[…nested too deep]"
        elif v is None or isinstance(v, (bool, int, str)):
            out[key] = v
        elif isinstance(v, float):
            out[key] = v if math.isfinite(v) else None
        elif _is_numpy_scalar(v):
            out.update(flatten_params({k: v.item()}, prefix))
        else:
            out[key] = str(v)
    return out


def _is_numpy_scalar(v: Any) -> bool:
    # numpy (and torch 0-d) scalars know their Python value; duck-typed so numpy stays optional.
    return type(v).__module__ in ("numpy", "torch") and callable(getattr(v, "item", None))


def yaml_scalar(v: Scalar) -> str:
    """One flat params value as YAML text that any YAML 1.1 or 1.2 reader reads back unchanged."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)
        # YAML 1.1 (PyYAML) needs a dot in a float: 1e-05 would read back as a string.
        if "e" in text and "." not in text:
            mant, exp = text.split("e")
            text = f"{mant}.0e{exp}"
        return text
    return _yaml_quoted(v)


def params_yaml(params: Mapping[str, Any]) -> str:
    """The params.yaml text for ``params``: one ``key: scalar`` line per flattened key."""
    return "".join(f"{_yaml_key(k)}: {yaml_scalar(v)}\n" for k, v in flatten_params(params).items())


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")


def _yaml_key(key: str) -> str:
    # Plain keys read best; anything else (spaces, colons, non-ASCII, "true"...) is JSON-quoted.
    if _PLAIN_KEY.match(key) and key.lower() not in ("true", "false", "null", "yes", "no", "on", "off", "y", "n"):
        return key
    return _yaml_quoted(key)


# Characters YAML readers reject or fold inside a quoted scalar (DEL, C1 controls, line and
# paragraph separators, non-characters): written as \uXXXX escapes, which JSON and YAML both read.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufffe\uffff]")


def _yaml_quoted(text: str) -> str:
    """``text`` as a double-quoted scalar that YAML reads back unchanged."""
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(text, ensure_ascii=False))
