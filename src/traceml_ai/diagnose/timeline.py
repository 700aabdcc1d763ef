"""Step samples → per-rank arrays of iteration and phase times after warm-up (docs/diagnoses.md).

The *iteration* of a step is the time one training-loop turn took: ``traceml:step``, plus the
dataloader wait when the script timed ``next(dataloader)`` outside its step region (detected per step:
the step is shorter than the built-in phases it should contain, within
:data:`~traceml_ai.diagnose.thresholds.CONTAINMENT_TOLERANCE`). *other* is the part of the iteration
no built-in phase covers (Python overhead, logging, waits outside the phases), never below 0.
Every array uses NaN for "not measured".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from traceml_ai.diagnose import thresholds as th
from traceml_ai.diagnose.readers import StepSample, rank_key
from traceml_ai.diagnose.stats import FloatArray
from traceml_ai.telemetry import schema

IntArray = npt.NDArray[np.int64]

INNER_PHASES: tuple[str, ...] = (
    schema.DATALOADER_NEXT,
    schema.H2D,
    schema.FORWARD,
    schema.BACKWARD,
    schema.OPTIMIZER_STEP,
)
"""The built-in phases inside one training-loop turn, in loop order."""

COMPUTE_PHASES: tuple[str, ...] = (schema.FORWARD, schema.BACKWARD, schema.OPTIMIZER_STEP)
OTHER = "other"
"""Pseudo-phase: iteration time no built-in phase covers."""
ITERATION = "iteration"
"""Pseudo-phase: the whole training-loop turn (see module docs)."""


@dataclass(frozen=True)
class RankTimeline:
    """One rank's post-warm-up steps.

    ``steps`` are step numbers in order; ``timestamps_ns`` when each was measured (NaN if unknown);
    ``iteration_ms`` and each ``phases[name]`` (ms, NaN = not measured) are aligned with ``steps``.
    ``skipped`` warm-up steps were left out; they ended at ``warmup_end_ns`` (None if no timestamp).
    ``dataloader_outside`` counts steps whose dataloader wait was outside ``traceml:step``.
    """

    rank: int | None
    steps: IntArray
    timestamps_ns: FloatArray
    iteration_ms: FloatArray
    phases: dict[str, FloatArray] = field(default_factory=dict)
    skipped: int = 0
    warmup_end_ns: int | None = None
    dataloader_outside: int = 0

    @property
    def step_range(self) -> tuple[int, int] | None:
        return (int(self.steps[0]), int(self.steps[-1])) if self.steps.size else None

    def phase(self, name: str) -> FloatArray:
        """The phase's times (ms) aligned with ``steps``; all NaN when the rank never timed it."""
        if name == ITERATION:
            return self.iteration_ms
        found = self.phases.get(name)
        return found if found is not None else np.full(self.steps.size, np.nan)


@dataclass(frozen=True)
class StepTable:
    """Every rank's :class:`RankTimeline`, ranks in order (unknown rank last).

    ``phase_names``: built-in inner phases seen in any row (loop order), then ``other`` when
    anything was attributed, then user regions (sorted). ``first_step``/``last_step`` and
    ``steps_seen`` describe all steps including warm-up.
    """

    ranks: tuple[RankTimeline, ...]
    phase_names: tuple[str, ...]
    warmup_steps: int
    steps_seen: int
    first_step: int | None
    last_step: int | None

    def rank(self, rank: int | None) -> RankTimeline | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def job_series(self, name: str) -> tuple[IntArray, FloatArray]:
        """Per step, the slowest rank's time for ``name`` (a phase, ``other`` or ``iteration``).

        A synchronous job waits for its slowest rank, so the job's step is the max over ranks.
        Returns ``(steps, ms)`` in step order; NaN where no rank measured that step.
        """
        if not self.ranks:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
        all_steps = np.concatenate([tl.steps for tl in self.ranks])
        values = np.concatenate([tl.phase(name) for tl in self.ranks])
        steps, where = np.unique(all_steps, return_inverse=True)
        out = np.full(steps.size, np.nan)
        np.fmax.at(out, where, values)  # fmax skips NaN: a rank that did not measure does not count
        return steps, out


def iteration_ms(phases: Mapping[str, float | None]) -> tuple[float | None, bool]:
    """The iteration time of one step (ms) and whether its dataloader wait was outside the step.

    None when ``traceml:step`` was not measured (the step total is never guessed from its parts).
    """
    step = phases.get(schema.STEP)
    if step is None:
        return None, False
    dataloader = phases.get(schema.DATALOADER_NEXT)
    inner = sum(v for name in INNER_PHASES if (v := phases.get(name)) is not None)
    if dataloader is not None and dataloader > 0 and step < (1 - th.CONTAINMENT_TOLERANCE) * inner:
        return step + dataloader, True
    return step, False


def build_step_table(samples: Sequence[StepSample], warmup_steps: int = th.WARMUP_STEPS) -> StepTable:
    """Group step samples by rank, drop each rank's first ``warmup_steps`` steps, derive the
    iteration and ``other`` times (see module docs)."""
    by_rank: dict[int | None, list[StepSample]] = defaultdict(list)
    names: set[str] = set()
    all_steps: set[int] = set()
    for s in samples:
        by_rank[s.rank].append(s)
        names.update(s.phases)
        all_steps.add(s.step)
    builtin = [p for p in INNER_PHASES if p in names]
    user = sorted(n for n in names if not n.startswith(schema.PHASE_PREFIX))
    timelines = []
    any_other = False
    for rank in sorted(by_rank, key=rank_key):
        rows = sorted(by_rank[rank], key=lambda s: s.step)
        warm, kept = rows[:warmup_steps], rows[warmup_steps:]
        warm_ts = [s.timestamp_ns for s in warm if s.timestamp_ns is not None]
        n = len(kept)
        # iteration_ms() and the "other" rule, written out per step with plain lists (this runs
        # for every step of every rank; numpy item assignment would cost more than the math).
        nan = np.nan
        tol = 1 - th.CONTAINMENT_TOLERANCE
        dl_name, *rest = INNER_PHASES
        it_list: list[float] = []
        other_list: list[float] = []
        outside = 0
        for s in kept:
            get = s.phases.get
            dl = get(dl_name)
            attributed = [v for v in (dl, *map(get, rest)) if v is not None]
            step = get(schema.STEP)
            if step is None:
                it_list.append(nan)
                other_list.append(nan)
                continue
            it = step
            if dl is not None and dl > 0 and step < tol * sum(attributed):
                it = step + dl
                outside += 1
            it_list.append(it)
            if attributed:
                other_list.append(max(0.0, it - sum(attributed)))
                any_other = True
            else:
                other_list.append(nan)
        iters = np.asarray(it_list, dtype=np.float64) if n else np.full(0, np.nan)
        other = np.asarray(other_list, dtype=np.float64) if n else np.full(0, np.nan)
        columns = {
            name: np.asarray([nan if (v := s.phases.get(name)) is None else v for s in kept], dtype=np.float64)
            if n else np.full(0, np.nan)
            for name in (*builtin, *user)
        }
        if builtin:
            columns[OTHER] = other
        timelines.append(
            RankTimeline(
                rank=rank,
                steps=np.asarray([s.step for s in kept], dtype=np.int64),
                timestamps_ns=np.asarray(
                    [float(s.timestamp_ns) if s.timestamp_ns is not None else np.nan for s in kept], dtype=np.float64
                ),
                iteration_ms=iters,
                phases=columns,
                skipped=len(warm),
                warmup_end_ns=max(warm_ts) if warm_ts else None,
                dataloader_outside=outside,
            )
        )
    phase_names = (*builtin, *((OTHER,) if any_other else ()), *user)
    return StepTable(
        ranks=tuple(timelines),
        phase_names=phase_names,
        warmup_steps=warmup_steps,
        steps_seen=len(all_steps),
        first_step=min(all_steps) if all_steps else None,
        last_step=max(all_steps) if all_steps else None,
    )


def share(phase: FloatArray, iteration: FloatArray) -> float | None:
    """Time-weighted share of ``phase`` in the iteration over the steps where both were measured:
    ``sum(phase) / sum(iteration)``. Long stalls weigh as much as the time they cost (a median of
    per-step shares would hide a stall every tenth step). None when no step has both."""
    both = np.isfinite(phase) & np.isfinite(iteration)
    total = float(iteration[both].sum())
    if not both.any() or total <= 0:
        return None
    return float(phase[both].sum()) / total
