"""Phase statistics, the GPU-event read-out on the sampler side, and pre-step attribution (DESIGN §3.1).

CUDA events cannot run on a machine without a GPU, so the read-out logic (wait until every event
has completed, keep step order, give up after ``gpu_wait_s``, sum ``elapsed_time``) is exercised
here with :class:`Clock` events whose completion the test controls; the same code on real CUDA
events runs in ``test_cuda_step_*`` below when a GPU is present.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from traceml_ai.capture import timing
from traceml_ai.capture.steps import StepTimeSource
from traceml_ai.capture.timing import Step, add_call
from traceml_ai.telemetry import schema


class Clock:
    """A stand-in for ``torch.cuda.Event`` with the two methods the read-out uses."""

    def __init__(self, at_ms: float, done: bool = True) -> None:
        self.at_ms = at_ms
        self.done = done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Clock) -> float:
        if not (self.done and end.done):
            raise RuntimeError("cudaErrorNotReady")
        return end.at_ms - self.at_ms


class Pool:
    def __init__(self) -> None:
        self.returned: list[Any] = []

    def put(self, event: Any) -> None:
        self.returned.append(event)


def finished(step: int, phases: dict[str, list[Any]], pool: Any = None, closed_perf_ns: int | None = None
             ) -> Step:
    """A closed step as the tracer hands it over (``closed_perf_ns`` is on the perf_counter clock)."""
    st = Step(step, "cuda:0" if pool is not None else "cpu", pool, None)
    st.phases.update(phases)
    st.end_unix_ns = 1_000 + step
    st.closed_perf_ns = time.perf_counter_ns() if closed_perf_ns is None else closed_perf_ns
    return st


def gpu_phase(*spans: tuple[float, float, bool], cpu_ns: int = 2_000_000) -> list[Any]:
    """A phase entry of one call per span, each with its (start, end) event pair."""
    phases: dict[str, list[Any]] = {}
    for start, end, done in spans:
        add_call(phases, "p", cpu_ns, (Clock(start), Clock(end, done)))
    return phases["p"]


def test_cpu_phase_has_null_gpu_and_cpu_duration() -> None:
    phases: dict[str, list[Any]] = {}
    add_call(phases, schema.FORWARD, 1_500_000, None)
    add_call(phases, schema.FORWARD, 500_000, None)
    events = finished(0, phases).events()
    assert events == {schema.FORWARD: {"cpu": {"is_gpu": False, "duration_ms": 2.0, "cpu_ms": 2.0,
                                               "gpu_ms": None, "n_calls": 2}}}


def test_gpu_time_is_summed_over_calls_and_backs_the_duration() -> None:
    pool = Pool()
    step = finished(0, {schema.BACKWARD: gpu_phase((0.0, 1.5, True), (2.0, 2.25, True))}, pool)
    (stats,) = step.events()[schema.BACKWARD].values()
    assert stats == {"is_gpu": True, "duration_ms": 1.75, "cpu_ms": 4.0, "gpu_ms": 1.75, "n_calls": 2}
    assert len(pool.returned) == 4  # every event goes back to the pool once read


def test_a_measured_zero_stays_zero() -> None:
    step = finished(0, {schema.H2D: gpu_phase((1.0, 1.0, True))}, Pool())
    (stats,) = step.events()[schema.H2D].values()
    assert stats["gpu_ms"] == 0.0 and stats["is_gpu"] is True


def test_gpu_is_null_unless_every_call_measured_it() -> None:
    phases = {schema.FORWARD: gpu_phase((0.0, 1.0, True))}
    add_call(phases, schema.FORWARD, 3_000_000, None)  # one call without events
    (out,) = finished(0, phases, Pool()).events()[schema.FORWARD].values()
    assert out["gpu_ms"] is None and out["is_gpu"] is False and out["duration_ms"] == out["cpu_ms"] == 5.0


def test_source_waits_for_gpu_events_and_keeps_step_order() -> None:
    source = StepTimeSource(gpu_wait_s=60)
    slow = gpu_phase((0.0, 4.0, False))
    source.put(finished(0, {schema.STEP: slow}, Pool()))
    source.put(finished(1, {schema.STEP: gpu_phase((5.0, 6.0, True))}, Pool()))
    assert source.collect(1, 0) == []  # step 0 is not done, and step 1 must not overtake it
    slow[2][0][1].done = True
    rows = source.collect(2, 0)
    assert [(r["seq"], r["step"]) for r in rows] == [(2, 0), (2, 1)]
    assert [phase["cuda:0"]["gpu_ms"] for r in rows for phase in r["events"].values()] == [4.0, 1.0]


def test_source_gives_up_after_the_bounded_wait_with_null_gpu() -> None:
    source = StepTimeSource(gpu_wait_s=0.5)
    long_ago = time.perf_counter_ns() - 1_000_000_000
    pool = Pool()
    source.put(finished(0, {schema.STEP: gpu_phase((0.0, 4.0, False)),
                            schema.FORWARD: gpu_phase((0.0, 1.0, True))}, pool, closed_perf_ns=long_ago))
    (row,) = source.collect(1, 0)
    assert row["events"][schema.STEP]["cuda:0"]["gpu_ms"] is None
    assert row["events"][schema.STEP]["cuda:0"]["duration_ms"] == 2.0  # falls back to the CPU clock
    assert row["events"][schema.FORWARD]["cuda:0"]["gpu_ms"] == 1.0  # its own events had completed
    assert len(pool.returned) == 4


def test_collect_final_waits_for_pending_events_then_gives_up() -> None:
    source = StepTimeSource(gpu_wait_s=60)
    late = gpu_phase((0.0, 3.0, False))
    never = gpu_phase((0.0, 9.0, False))
    source.put(finished(0, {schema.STEP: late}, Pool()))
    source.put(finished(1, {schema.STEP: never}, Pool()))
    threading.Timer(0.05, lambda: setattr(late[2][0][1], "done", True)).start()
    rows = source.collect_final(5, 0, timeout_s=0.3)
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0]["events"][schema.STEP]["cuda:0"]["gpu_ms"] == 3.0
    assert rows[1]["events"][schema.STEP]["cuda:0"]["gpu_ms"] is None
    assert source.collect(6, 0) == []


def test_dropped_steps_give_their_events_back() -> None:
    source = StepTimeSource(max_steps=1)
    pool = Pool()
    source.put(finished(0, {schema.STEP: gpu_phase((0.0, 1.0, True))}, pool))
    source.put(finished(1, {schema.STEP: gpu_phase((0.0, 1.0, True))}, pool))
    assert source.dropped_steps == 1 and len(pool.returned) == 2
    assert [r["step"] for r in source.collect(1, 0)] == [1]


def test_pending_fetch_keeps_only_the_last_one_and_a_new_generation_forgets_it() -> None:
    pool = Pool()
    first, second = Clock(0.0), Clock(1.0)
    timing.GENERATION += 1
    timing.set_pending_fetch(10, 5, first, pool)  # type: ignore[arg-type]
    timing.set_pending_fetch(20, 7, second, pool)  # type: ignore[arg-type]
    assert timing.pending().fetch == (20, 7, second, pool, 0, 1)
    assert pool.returned == [first]
    timing.GENERATION += 1
    assert timing.pending().fetch is None
    assert pool.returned == [first, second]


def test_pending_work_is_per_thread() -> None:
    timing.GENERATION += 1
    timing.set_pending_fetch(1, 2, None, None)
    seen: list[Any] = []
    thread = threading.Thread(target=lambda: seen.append(timing.pending().fetch))
    thread.start()
    thread.join()
    assert seen == [None]
    assert timing.pending().fetch == (1, 2, None, None, 0, 1)


@pytest.mark.skipif(not (pytest.importorskip("torch").cuda.is_available()), reason="needs a CUDA device")
def test_cuda_event_pool_reuses_events() -> None:
    import torch

    pool = timing.EventPool(torch.cuda.current_device())
    a = pool.record()
    b = pool.record()
    torch.cuda.synchronize()
    assert a.query() and b.query() and a.elapsed_time(b) >= 0.0
    pool.put(a)
    pool.put(b)
    pool.record()
    pool.record()
    assert pool.created == 2
