"""What a diagnosis says: findings, abstentions and their JSON form (DESIGN §3.5)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
_SEVERITY_RANK = {name: i for i, name in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Evidence:
    """What a finding rests on.

    ``metric`` names the measured quantity (e.g. ``dataloader_share``), ``value`` its measured value
    and ``threshold`` the constant it crossed (same unit as ``value``; see docs/diagnoses.md),
    ``ranks`` the global ranks concerned (None = a rank that sent no identity) and ``steps`` the
    ``(first, last)`` step window the value comes from (None when the metric is not step-based).
    """

    metric: str
    value: float | None
    threshold: float | None
    ranks: tuple[int | None, ...] = ()
    steps: tuple[int, int] | None = None

    @classmethod
    def from_dict(cls, doc: Any) -> Evidence:
        """The evidence of a finding as :meth:`to_dict` wrote it; a wrong-typed field is "not
        given" (empty metric, None, no ranks), never an error."""
        d = doc if isinstance(doc, dict) else {}
        found = d.get("ranks")
        ranks: list[Any] = found if isinstance(found, list) else []
        steps = d.get("steps")
        window = ((steps[0], steps[-1]) if isinstance(steps, list) and len(steps) == 2
                  and all(isinstance(x, int) and not isinstance(x, bool) for x in steps) else None)
        return cls(
            metric=d["metric"] if isinstance(d.get("metric"), str) else "",
            value=number(d.get("value")),
            threshold=number(d.get("threshold")),
            ranks=tuple(r for r in ranks if r is None or (isinstance(r, int) and not isinstance(r, bool))),
            steps=window,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "value": round_sig(self.value),
            "threshold": round_sig(self.threshold),
            "ranks": list(self.ranks),
            "steps": list(self.steps) if self.steps is not None else None,
        }


@dataclass(frozen=True)
class Finding:
    """One diagnosis: ``kind`` (a rule family, e.g. ``input_bound``), ``severity``, a one-sentence
    ``summary`` with the numbers, the ``action`` to take, and its ``evidence``.

    ``strength`` (how far past its threshold the value is, ≥ 1 when it fired) orders findings of the
    same severity; it is not written to JSON.
    """

    kind: str
    severity: Severity
    summary: str
    action: str
    evidence: Evidence
    strength: float = 1.0

    @classmethod
    def from_dict(cls, doc: Any) -> Finding | None:
        """A finding as :meth:`to_dict` wrote it; None when it has no text ``kind`` or no known
        ``severity`` (the caller counts it as unreadable)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
            return None
        severity = doc.get("severity")
        if severity not in SEVERITIES:
            return None
        return cls(
            kind=doc["kind"],
            severity=severity,
            summary=doc["summary"] if isinstance(doc.get("summary"), str) else "",
            action=doc["action"] if isinstance(doc.get("action"), str) else "",
            evidence=Evidence.from_dict(doc.get("evidence")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "summary": self.summary,
            "action": self.action,
            "evidence": self.evidence.to_dict(),
        }


@dataclass(frozen=True)
class Abstention:
    """A rule that did not judge, and why (e.g. "no GPU utilisation samples: CPU-only run")."""

    rule: str
    reason: str

    @classmethod
    def from_dict(cls, doc: Any) -> Abstention | None:
        """An abstention as :meth:`to_dict` wrote it; None unless ``rule`` and ``reason`` are text."""
        if isinstance(doc, dict) and isinstance(doc.get("rule"), str) and isinstance(doc.get("reason"), str):
            return cls(doc["rule"], doc["reason"])
        return None

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "reason": self.reason}


def order_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity, the strongest (furthest past its threshold) first."""
    return sorted(findings, key=lambda f: (-_SEVERITY_RANK[f.severity], -f.strength, f.kind))


def round_sig(value: float | None) -> float | None:
    """Round to 6 significant digits for JSON: enough for any threshold, no float noise.
    NaN and infinities (no JSON number exists) become None."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


def number(value: Any) -> float | None:
    """A finite JSON number as float; anything else (text, bool, null, NaN) is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None
