"""Hidden-memory gap analysis of one session's events, with real Stormlog 0.4.3's semantics, for
its ``hidden_memory_anomaly`` issues (docs/catalog.md, "Events, OOM bundles, issues, summaries,
correlation").

The gap is device-used minus allocator-reserved bytes of each ``sample`` event that measures both
and the device total. With at least three such samples and one gap of at least 5 % of the device
total, three classifiers run: ``transient_spike`` (a gap more than 2 standard deviations above
the mean), ``persistent_drift`` (at least five samples; a least-squares line over time rising
with R² ≥ 0.6) and ``fragmentation_like`` (inactive split blocks averaging ≥ 30 % of reserved
memory). Each finding names the event it points at and the workload phase active then (phases
replayed from ``phase_enter``/``phase_exit`` events, as in correlation).

numpy is imported only when a session is analysed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from traceml_ai.catalog.correlate import phase_spans

_THRESHOLDS: Final = {"ratio": 0.05, "zscore": 2.0, "r_squared": 0.6, "fragmentation": 0.3}
_ORDER: Final = {"critical": 0, "warning": 1, "info": 2}


def format_bytes(n: int, precision: int = 2) -> str:
    """``1.25 GB`` style (binary units named B, KB, MB, GB, TB, PB), as Stormlog prints them."""
    if n == 0:
        return "0 B"
    units = ("B", "KB", "MB", "GB", "TB", "PB")
    size, i = float(abs(n)), 0
    while size >= 1024.0 and i < len(units) - 1:
        size /= 1024.0
        i += 1
    return f"{'-' if n < 0 else ''}{size:.{precision}f} {units[i]}"


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        even = m * (b - m) * x / ((a + m2 - 1) * (a + m2))
        odd = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: int) -> float:
    """The two-sided p-value of Student's t with ``df`` degrees of freedom."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return min(1.0, _betainc(df / 2.0, 0.5, df / (df + t * t)))


def linregress(x: Any, y: Any) -> tuple[float, float, float]:
    """Least-squares ``(slope, r, two-sided p-value of slope 0)`` as SciPy's ``linregress``."""
    import numpy as np

    n = len(x)
    cov = np.cov(np.asarray(x, dtype=float), np.asarray(y, dtype=float), bias=True)
    ssxm, ssxym, _, ssym = (float(v) for v in cov.flat)
    if ssxm == 0.0 or ssym == 0.0:
        r = math.nan if ssxym == 0 else 0.0
    else:
        r = min(1.0, max(-1.0, ssxym / math.sqrt(ssxm * ssym)))
    slope = ssxym / ssxm if ssxm != 0.0 else (math.nan if ssxym == 0 else math.copysign(math.inf, ssxym))
    if n == 2:
        return slope, r, 1.0 if y[0] == y[1] else 0.0
    df = n - 2
    tiny = 1.0e-20
    t = r * math.sqrt(df / ((1.0 - r + tiny) * (1.0 + r + tiny))) if not math.isnan(r) else math.nan
    return slope, r, t_two_sided_p(abs(t), df)


def _feature(e: Mapping[str, Any], name: str) -> bool:
    caps = e["metadata"].get("memory_capabilities", {}) if isinstance(e.get("metadata"), Mapping) else {}
    return not (isinstance(caps, Mapping) and caps.get(name) is False)


def _attribution(spans: Sequence[dict[str, Any]], e: Mapping[str, Any]) -> dict[str, Any] | None:
    """The phase active at ``e`` (Stormlog's deepest-per-thread policy), as its payload dict plus
    ``"label"``; None when no phase was active."""
    ts, sid, rank = e["timestamp_ns"], e["session_id"], e["rank"]
    active = [s for s in spans if s["session_id"] == sid and s["rank"] == rank and s["start_ns"] <= ts <= s["end_ns"]]
    if not active:
        return None

    def label(s: Mapping[str, Any]) -> str:
        return " / ".join(p for p in s["path"] if p)

    def unique(s: Mapping[str, Any], source: str) -> dict[str, Any]:
        return {"phase_resolution": "unique", "phase_paths": [label(s)] if label(s) else [], "phase_source": source,
                "phase_path": label(s), "scope_id": s["scope_id"], "thread_id": s["thread_id"],
                "thread_name": s["thread_name"], "label": label(s) or None}

    def recent(some: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
        return max(some, key=lambda s: (s["sequence"], s["scope_id"]))

    meta = e["metadata"] if isinstance(e.get("metadata"), dict) else {}
    scope_id, thread_id = meta.get("origin_phase_scope_id"), meta.get("origin_thread_id")
    if isinstance(scope_id, str) and scope_id:
        exact = [s for s in active if s["scope_id"] == scope_id]
        if len(exact) == 1:
            return unique(exact[0], "exact")
    if isinstance(thread_id, int):
        mine = [s for s in active if s["thread_id"] == thread_id]
        if mine:
            return unique(recent(mine), "thread_local")
    by_thread: dict[int, list[dict[str, Any]]] = {}
    for s in active:
        by_thread.setdefault(s["thread_id"], []).append(s)
    matches, ambiguous = [], set()
    for some in by_thread.values():
        depth = max(len(s["path"]) for s in some)
        deepest = [s for s in some if len(s["path"]) == depth]
        labels = {label(s) for s in deepest}
        if len(labels) != 1:
            ambiguous |= labels
            continue
        matches.append(recent(deepest))
    if not matches and not ambiguous:
        return None
    if ambiguous or len(matches) != 1:
        paths = sorted(ambiguous | {label(s) for s in matches})
        out: dict[str, Any] = {"phase_resolution": "ambiguous", "phase_paths": [p for p in paths if p]}
        summary = None
        if len({p for p in paths if p}) > 1 and label(recent(active)):
            summary = label(recent(active))
            out["phase_summary"] = {"phase_path": summary, "source": "heuristic"}
        labels_ = [p for p in paths if p]
        out["label"] = f"(likely) {summary}" if summary else (f"(ambiguous) {' | '.join(labels_)}" if labels_ else None)
        return out
    return unique(matches[0], "heuristic")


def findings(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The hidden-memory findings of one session's events (oldest first), worst first: dicts with
    ``classification``, ``severity``, ``confidence``, ``evidence``, ``description``,
    ``evidence_timestamp_ns`` and ``phase`` (the attribution payload with its ``label``, or None)."""
    usable, gaps, ratios, times = [], [], [], []
    for e in events:
        if str(e["event_type"]).strip().lower() != "sample":
            continue
        total, used, reserved = e["device_total_bytes"], e["device_used_bytes"], e["allocator_reserved_bytes"]
        if total is None or total <= 0 or used is None or reserved is None:
            continue
        usable.append(e)
        gaps.append(float(used - reserved))
        ratios.append((used - reserved) / total)
        times.append(e["timestamp_ns"])
    if len(gaps) < 3 or max(abs(v) for v in ratios) < _THRESHOLDS["ratio"]:
        return []
    import numpy as np

    spans = phase_spans(events)
    out: list[dict[str, Any]] = []

    def add(classification: str, sev: str, confidence: float, evidence: dict[str, Any], description: str,
            at: Mapping[str, Any]) -> None:
        out.append({"classification": classification, "severity": sev, "confidence": confidence,
                    "evidence": evidence, "description": description, "evidence_timestamp_ns": at["timestamp_ns"],
                    "phase": _attribution(spans, at)})

    arr = np.asarray(gaps, dtype=float)
    mean, std = float(np.mean(arr)), float(np.std(arr, ddof=1))
    if std != 0 and not math.isnan(std):
        z = _THRESHOLDS["zscore"]
        spikes = [i for i, g in enumerate(arr) if (g - mean) / std > z]
        if spikes:
            top = int(np.argmax(arr))
            max_gap = float(arr[top])
            max_z = (max_gap - mean) / std
            add("transient_spike", "critical" if max_z > 2 * z else "warning", round(min(1.0, max_z / (3 * z)), 3),
                {"spike_count": len(spikes), "max_gap_bytes": max_gap, "max_zscore": round(max_z, 3),
                 "mean_gap_bytes": round(mean, 1), "std_gap_bytes": round(std, 1)},
                f"Detected {len(spikes)} transient spike(s) in the device-vs-allocator gap (max z-score {max_z:.1f}).",
                usable[top])
    if len(gaps) >= 5:
        x = np.asarray(times, dtype=float)
        x = x - x[0]
        slope, r, p = linregress(x, arr)
        r2 = r ** 2
        if not (slope <= 0 or r2 < _THRESHOLDS["r_squared"]):
            per_s = slope * 1e9
            add("persistent_drift", "critical" if r2 > 0.85 else "warning", round(min(1.0, r2), 3),
                {"slope_bytes_per_sec": round(per_s, 1), "r_squared": round(r2, 4), "p_value": round(p, 6),
                 "gap_start_bytes": round(float(arr[0]), 1), "gap_end_bytes": round(float(arr[-1]), 1)},
                f"Device-vs-allocator gap is drifting upward at {format_bytes(int(abs(per_s)))}/s (R²={r2:.2f}).",
                usable[-1])
    frag, frag_events = [], []
    for e in usable:
        inactive, reserved = e["allocator_inactive_bytes"], e["allocator_reserved_bytes"]
        if inactive is None or not _feature(e, "supports_allocator_inactive"):
            continue
        if not _feature(e, "supports_fragmentation_analysis") or not reserved:
            continue
        frag.append(inactive / reserved)
        frag_events.append(e)
    if frag:
        avg, top_frag = float(np.mean(frag)), float(np.max(frag))
        if avg >= _THRESHOLDS["fragmentation"]:
            add("fragmentation_like", "critical" if avg > 0.5 else "warning", round(min(1.0, avg / 0.6), 3),
                {"avg_fragmentation_ratio": round(avg, 4), "max_fragmentation_ratio": round(top_frag, 4),
                 "avg_gap_bytes": round(float(np.mean(gaps)), 1), "sample_count": len(frag)},
                f"Inactive split blocks average {avg:.0%} of reserved memory: freed space inside segments still in "
                "use, which can neither return to the device nor serve a larger request.",
                frag_events[int(np.argmax(frag))])
    out.sort(key=lambda f: (_ORDER.get(f["severity"], 9), -f["confidence"]))
    return out
