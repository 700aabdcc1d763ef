"""Parameter values that need no conversion skip Typer's pydantic step (issue 14, item 1).

Typer (0.2x) converts every parameter value through a pydantic ``TypeAdapter`` that it builds on the
parameter's first value, also for a default of ``None`` and for a string given to a ``str``
parameter. The first adapter imports pydantic's schema machinery: 100-150 ms, more than the rest of
``traceml runs ls``. :func:`skip_plain_conversions` gives each parameter of a command a converter
that returns such values as they are, exactly as the adapter would (``None``, a ``str`` for ``str``,
strings for ``list[str]``, an ``int``/``float`` default for an unbounded ``int``/``float``), and
hands every other value to Typer's own converter, built then: a number typed on the command line,
a bounded number, a choice, a path or file, a custom parser. Errors and messages are Typer's.

With a Typer that has no such step (no ``typer._coercion``) this does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args, get_origin

try:
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # pragma: no cover - a Typer that converts without pydantic
    RuntimeParam = None  # type: ignore[assignment,misc]


def _plain(param: Any, value: Any) -> tuple[bool, Any]:
    """(True, converted) when the value needs no conversion for the parameter's type, else (False, None)."""
    descriptor = param.type_descriptor
    info = descriptor.parameter_info
    if info.parser is not None or descriptor.file_annotation is not None:
        return False, None
    annotation = descriptor.annotation
    if annotation is bool:
        return (True, value) if type(value) is bool else (False, None)
    if annotation is str:
        return (True, value) if type(value) is str else (False, None)
    if annotation in (int, float):
        if info.min is None and info.max is None and type(value) is annotation:
            return True, value
        return False, None
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        if isinstance(value, (list, tuple)) and all(type(v) is str for v in value):
            return True, list(value)
    return False, None


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _PlainFirst(RuntimeParam):
        """Returns plain values as they are; on the first other value puts Typer's converter in its place."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            done, converted = _plain(param, value)
            if done:
                return converted
            typer_own = build_runtime_param(param.type_descriptor)
            param._runtime_param = typer_own
            return typer_own._coerce_value(value, param=param, ctx=ctx)


def skip_plain_conversions(command: Any) -> None:
    """Give every parameter of ``command`` (a Click command or group, with its subcommands, and the
    ``--help`` option Click adds to each when it parses) the plain-value converter, where Typer has
    not built its own yet."""
    if RuntimeParam is None or getattr(command, "_traceml_plain", False):  # pragma: no cover
        return
    command._traceml_plain = True
    for param in getattr(command, "params", []):
        _give(param)
    own_get_params = command.get_params

    def get_params(ctx: Any) -> list[Any]:
        params: list[Any] = own_get_params(ctx)
        for param in params:
            _give(param)
        return params

    command.get_params = get_params
    for sub in getattr(command, "commands", {}).values():
        skip_plain_conversions(sub)


def _give(param: Any) -> None:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None and getattr(param, "_runtime_param", "absent") is None:
        param._runtime_param = _PlainFirst(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation)
