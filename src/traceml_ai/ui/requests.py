"""The JSON bodies the page sends to the viewer's API, as pydantic models (docs/viewer-api.md).

Each model is the one definition of its request: :func:`parse` checks a decoded body against it
(unknown fields ignored, no coercion: ``"1"`` is not a number, ``1`` is not a boolean), and
:func:`typescript` writes the page's types from the same models' JSON Schema into
``web/src/requests.ts`` (``python -m traceml_ai.ui.requests > web/src/requests.ts``; ``tests/ui/test_requests.py`` fails
when that file is stale), so the server and the page cannot drift apart.

Chart specs (``POST /api/chart``, ``/api/export/chart``) are checked by
:func:`traceml_ai.runs.analysis.parse_chart_spec`; ``PUT /api/ui-state`` takes any JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from traceml_ai.ui.service import RequestError

XAxis = Literal["step", "epoch", "time"]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class SeriesRequest(_Body):
    """``POST /api/series``: the runs (keys) and metrics to draw, the x axis, the EMA weight
    (0 = no smoothing; in [0, 1)) and, for a zoomed chart, the visible x range."""

    keys: list[str] = Field(default_factory=list)
    metrics: list[str] = Field(default_factory=list)
    x: XAxis = "step"
    ema: float = 0.0
    x_range: list[float] | None = Field(default=None, min_length=2, max_length=2)
    """A zoomed chart's visible x range ``[low, high]``: the min/max buckets cover only it."""
    group_by: str | None = None
    """Plot by groups: also answer each group's mean and band by step over this column's groups."""


class RefreshRequest(_Body):
    """``POST /api/refresh``: re-check every run now; ``since`` is the last change counter the page
    has (anything but an integer counts as 0: the whole table)."""

    since: int = 0

    @field_validator("since", mode="before")
    @classmethod
    def _counter(cls, value: Any) -> Any:
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


class HideRequest(_Body):
    """``POST /api/hide``: hide (or, with ``hidden: false``, show again) the runs ``keys``."""

    keys: list[str] = Field(default_factory=list)
    hidden: bool = True


class ExportTableRequest(_Body):
    """``POST /api/export/table``: write the runs ``keys`` with ``columns`` as CSV into the cache."""

    keys: list[str] = Field(default_factory=list)
    columns: list[str] = Field(default_factory=list)


class ExportPerformanceRequest(_Body):
    """``POST /api/export/performance``: write one Performance panel of the run ``key`` into the
    cache, as a 300-DPI PNG or CSV; ``share`` draws phases as shares of the step, ``heat`` picks the
    ranks heatmap's measure (``None``: the view's default)."""

    key: str = ""
    panel: Literal["step", "ranks", "memory", "gpu"] = "step"
    format: Literal["png", "csv"] = "png"
    share: bool = False
    heat: Literal["iteration", "local"] | None = None


REQUESTS: tuple[type[BaseModel], ...] = (
    SeriesRequest,
    RefreshRequest,
    HideRequest,
    ExportTableRequest,
    ExportPerformanceRequest,
)
"""Every request model, in the order :func:`typescript` writes them."""

M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: dict[str, Any]) -> M:
    """``body`` (a decoded JSON object) as ``model``.

    Raises:
        RequestError: a field has the wrong type or value; the message names each field
            (``keys.0: Input should be a valid string``).
    """
    try:
        return model.model_validate(body)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in err.errors())
        raise RequestError(problems) from None


# -- TypeScript from the JSON Schema -------------------------------------------------------------


def _ts_type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v).lower() for v in schema["enum"])
    if "const" in schema:
        return f'"{schema["const"]}"' if isinstance(schema["const"], str) else str(schema["const"])
    if "anyOf" in schema:
        return " | ".join(_ts_type(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "array":
        inner = _ts_type(schema.get("items", {}))
        return f"({inner})[]" if "|" in inner else f"{inner}[]"
    return {"string": "string", "integer": "number", "number": "number", "boolean": "boolean",
            "null": "null"}.get(str(kind), "unknown")


def typescript() -> str:
    """The TypeScript interfaces of :data:`REQUESTS` (the content of ``web/src/requests.ts``).

    Every field is optional on the page's side when the model gives it a default. Raises
    ValueError for a JSON Schema construct this small writer does not know (a nested model).
    """
    lines = [
        "// Generated from the pydantic models in src/traceml_ai/ui/requests.py by",
        "// `python -m traceml_ai.ui.requests > web/src/requests.ts`; do not edit",
        "// (tests/ui/test_requests.py checks it).",
        "",
    ]
    for model in REQUESTS:
        schema = model.model_json_schema()
        if "$defs" in schema:
            raise ValueError(f"{model.__name__}: nested models are not supported")
        required = set(schema.get("required", []))
        doc = " ".join((model.__doc__ or "").split()).replace("``", "`")
        lines.append(f"/** {doc} */")
        lines.append(f"export interface {model.__name__} {{")
        for name, prop in schema["properties"].items():
            lines.append(f"  {name}{'' if name in required else '?'}: {_ts_type(prop)};")
        lines.append("}")
        lines.append("")
    return "\n".join(lines)


TYPES_FILE = Path("web") / "src" / "requests.ts"
"""Where the output of :func:`typescript` goes, relative to the repository root."""


if __name__ == "__main__":  # python -m traceml_ai.ui.requests > web/src/requests.ts (the viewer writes no file)
    sys.stdout.write(typescript())
