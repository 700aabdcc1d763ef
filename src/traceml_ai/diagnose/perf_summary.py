"""The typed parts of a ``final_summary.json`` that the ``perf.*`` columns come from (msgspec
structs), kept apart from :mod:`traceml_ai.diagnose.perf` so that msgspec loads only when a
summary is read.

Only the fields the columns need are decoded, by msgspec straight from the file's bytes into typed
structs (unknown fields skipped in C, wrong types refused): a tenth of the cost of parsing the whole
document and walking it. A document msgspec refuses (a hand edit) is read section by section
instead (:func:`summary_facts`), and a section of the wrong shape is left out (its cells stay empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

# The values a summary TraceML wrote can hold; a hand edit outside them (a share of 7.5, a negative
# time) is refused like a wrong type, so its section is left out and said (review 13d).
Share = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
NonNegative = Annotated[float, msgspec.Meta(ge=0.0)]
Percent = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]


class _Telemetry(msgspec.Struct):
    # The statuses a summary is written with (readers.TelemetryStatus); another word is a hand edit.
    status: Literal["ok", "degraded", "missing", "empty", "corrupt", "unreadable"] | None = None
    problems: list[Any] = msgspec.field(default_factory=list)


class _Steps(msgspec.Struct):
    seen: int | None = None


class _Ranks(msgspec.Struct):
    seen: list[int | None] = msgspec.field(default_factory=list)
    missing: list[Any] = msgspec.field(default_factory=list)


class _Phase(msgspec.Struct):
    name: str | None = None
    share: Share | None = None


class _StepTime(msgspec.Struct):
    iteration_median_ms: NonNegative | None = None
    iteration_p95_ms: NonNegative | None = None
    throughput_steps_per_s: NonNegative | None = None
    phases: list[_Phase] = msgspec.field(default_factory=list)
    worst_rank: int | None = None
    skew: NonNegative | None = None


class _Memory(msgspec.Struct):
    device: str | None = None
    peak_alloc_bytes: NonNegative | None = None
    rss_peak_bytes: dict[str, NonNegative | None] = msgspec.field(default_factory=dict)


class _System(msgspec.Struct):
    gpu_util_median: Percent | None = None
    gpu_util_mean: Percent | None = None


class _Evidence(msgspec.Struct):
    ranks: list[int | None] = msgspec.field(default_factory=list)


class _Finding(msgspec.Struct):
    kind: str | None = None
    severity: str | None = None
    evidence: _Evidence | None = None


class SummaryFacts(msgspec.Struct):
    """The parts of a ``final_summary.json`` document (shape: :meth:`Summary.to_dict
    <traceml_ai.diagnose.summary.Summary.to_dict>`) that the ``perf.*`` columns come from, typed."""

    schema_version: int | None = None
    telemetry: _Telemetry = msgspec.field(default_factory=_Telemetry)
    steps: _Steps = msgspec.field(default_factory=_Steps)
    ranks: _Ranks = msgspec.field(default_factory=_Ranks)
    step_time: _StepTime | None = None
    memory: _Memory = msgspec.field(default_factory=_Memory)
    system: _System = msgspec.field(default_factory=_System)
    findings: list[_Finding] = msgspec.field(default_factory=list)
    rules_checked: list[str] = msgspec.field(default_factory=list)


DECODER: Final = msgspec.json.Decoder(SummaryFacts)
_SECTIONS: Final = {f: t for f, t in zip(SummaryFacts.__struct_fields__, (
    int, _Telemetry, _Steps, _Ranks, _StepTime, _Memory, _System, list[_Finding], list[str]), strict=True)}


def summary_facts(doc: Mapping[str, Any]) -> SummaryFacts:
    """The typed parts of a final summary document already parsed (a dict), section by section: a
    section of the wrong shape is left out, never an error (:func:`checked_summary_facts` also says
    which)."""
    return checked_summary_facts(doc)[0]


def checked_summary_facts(doc: Mapping[str, Any]) -> tuple[SummaryFacts, list[str]]:
    """:func:`summary_facts`, and one line per section left out: its name and what msgspec found
    wrong in it (``step_time: Expected `float` <= 1.0 - at `$.phases[0].share```)."""
    kept: dict[str, Any] = {}
    problems: list[str] = []
    for name, kind in _SECTIONS.items():
        value = doc.get(name)
        if value is None:
            continue
        try:
            kept[name] = msgspec.convert(value, kind)
        except msgspec.ValidationError as err:
            problems.append(f"{name}: {err}")
    return SummaryFacts(**kept), problems


