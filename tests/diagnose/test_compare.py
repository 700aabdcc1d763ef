"""compare(): verdicts per metric from per-step samples, and the CI-failing threshold."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.diagnose.telemetry_db import HEALTHY_CPU, MIB, RunSpec, write_run
from traceml_ai.diagnose import compare
from traceml_ai.diagnose.compare import MetricComparison, compare_metric
from traceml_ai.telemetry import schema


def verdicts(result: object) -> dict[str, MetricComparison]:
    return {m.metric: m for m in result.metrics}  # type: ignore[attr-defined]


def scaled(factor: float) -> dict[str, float]:
    return {**{k: v * factor for k, v in HEALTHY_CPU.items()}, "other": 0.5 * factor}


def test_a_run_20_percent_slower_is_a_regression(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", RunSpec(steps=120, seed=1)).parents[1]
    b = write_run(tmp_path / "b", RunSpec(steps=120, seed=2, phases=lambda r, s: scaled(1.2))).parents[1]
    by = verdicts(compare(a, b))
    step = by["step_time_ms"]
    assert step.verdict == "regression"
    assert step.worse_pct == pytest.approx(20.0, abs=3.0)
    assert step.ci_low is not None and step.ci_low > 1.0
    assert by["throughput_steps_per_s"].verdict == "regression"
    assert by["throughput_steps_per_s"].worse_pct == pytest.approx(100 * (1 - 1 / 1.2), abs=3.0)
    assert by["backward_ms"].verdict == "regression"
    # The reverse comparison is an improvement.
    back = verdicts(compare(b, a))
    assert back["step_time_ms"].verdict == "improvement"
    assert back["throughput_steps_per_s"].verdict == "improvement"


def test_the_same_distribution_is_equivalent(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", RunSpec(steps=400, seed=1)).parents[1]
    b = write_run(tmp_path / "b", RunSpec(steps=400, seed=7)).parents[1]
    result = compare(a, b)
    by = verdicts(result)
    for name in ("step_time_ms", "throughput_steps_per_s", "forward_ms", "backward_ms", "optimizer_step_ms"):
        assert by[name].verdict == "equivalent", (name, by[name].reason)
    assert by["rss_bytes"].verdict == "equivalent"
    assert result.regressions(0.0) == []


def test_five_samples_are_inconclusive(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", RunSpec(steps=10, seed=1)).parents[1]  # 5 steps after warm-up
    b = write_run(tmp_path / "b", RunSpec(steps=10, seed=2, phases=lambda r, s: scaled(2.0))).parents[1]
    step = verdicts(compare(a, b))["step_time_ms"]
    assert step.verdict == "inconclusive"
    assert "too few samples (A: 5, B: 5" in step.reason


def test_unmeasured_metrics_are_inconclusive_and_missing_runs_are_reported(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", RunSpec(steps=40)).parents[1]
    result = compare(a, tmp_path / "nowhere")
    by = verdicts(result)
    # The reason is the missing database, not "too few samples (B: 0)" (issue 13 review).
    assert all(m.verdict == "inconclusive" for m in result.metrics)
    assert by["step_time_ms"].reason.startswith("nothing to compare: B: no telemetry database")
    assert any(p.startswith("B: no telemetry database") for p in result.problems)
    assert [u.split(":")[0] for u in result.unusable] == ["B"]
    both = compare(a, write_run(tmp_path / "b", RunSpec(steps=40)).parents[1])
    assert verdicts(both)["gpu_util_percent"].reason == "not measured in either run" and both.unusable == ()


def test_tiny_phase_changes_stay_equivalent(tmp_path: Path) -> None:
    # A no-op copy doubling from 0.05 ms to 0.1 ms is noise against a 15 ms step, not a regression.
    a = write_run(tmp_path / "a", RunSpec(steps=100, seed=1)).parents[1]
    b = write_run(tmp_path / "b", RunSpec(steps=100, seed=2, phases=lambda r, s: {**HEALTHY_CPU, schema.H2D: 0.1}))
    h2d = verdicts(compare(a, b.parents[1]))["h2d_ms"]
    assert h2d.verdict == "equivalent" and "within the floor" in h2d.reason


def test_rss_growth_is_a_memory_regression(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", RunSpec(steps=300, rss=lambda r, t: 900 * MIB)).parents[1]
    b = write_run(tmp_path / "b", RunSpec(steps=300, rss=lambda r, t: 1200 * MIB)).parents[1]
    rss = verdicts(compare(a, b))["rss_bytes"]
    assert rss.verdict == "regression" and rss.worse_pct == pytest.approx(100 / 3, abs=0.5)


def test_verdict_rules_on_samples() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(100, 5, 200)
    assert compare_metric("m", "ms", "lower", base, base * 1.02).verdict == "equivalent"
    assert compare_metric("m", "ms", "lower", base, base * 1.3).verdict == "regression"
    assert compare_metric("m", "ms", "higher", base, base * 1.3).verdict == "improvement"
    # Very noisy samples and a 6 % shift: the interval straddles the margin, so no claim is made.
    noisy = rng.normal(100, 60, 30).clip(1)
    assert compare_metric("m", "ms", "lower", noisy, noisy[::-1] * 1.06).verdict == "inconclusive"
    # The bootstrap is seeded: the same inputs give the same interval.
    one = compare_metric("m", "ms", "lower", base, base * 1.3)
    two = compare_metric("m", "ms", "lower", base, base * 1.3)
    assert (one.ci_low, one.ci_high) == (two.ci_low, two.ci_high)


def test_regressions_filter_by_percent(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", RunSpec(steps=120, seed=1)).parents[1]
    b = write_run(tmp_path / "b", RunSpec(steps=120, seed=2, phases=lambda r, s: scaled(1.2))).parents[1]
    result = compare(a, b)
    assert "step_time_ms" in {m.metric for m in result.regressions(10.0)}
    assert result.regressions(50.0) == []


def test_a_busier_host_makes_time_verdicts_inconclusive(tmp_path: Path) -> None:
    # Only the loader changed, but B ran on a busier host: every phase slowed; none may be called a regression.
    a = write_run(tmp_path / "a", RunSpec(steps=120, seed=1, host_cpu=lambda t: 20.0)).parents[1]
    b = write_run(tmp_path / "b", RunSpec(steps=120, seed=2, phases=lambda r, s: scaled(1.5),
                                          host_cpu=lambda t: 90.0)).parents[1]
    result = compare(a, b)
    by = verdicts(result)
    for name in ("step_time_ms", "throughput_steps_per_s", "backward_ms"):
        assert by[name].verdict == "inconclusive"
        assert by[name].reason.startswith("inconclusive: host load differed (host CPU 20% in A vs 90% in B")
    assert any("host load differed" in p for p in result.problems)
    assert result.regressions() == []
    same_load = verdicts(compare(a, write_run(tmp_path / "c", RunSpec(steps=120, seed=2, phases=lambda r, s: scaled(
        1.5), host_cpu=lambda t: 35.0)).parents[1]))
    assert same_load["step_time_ms"].verdict == "regression"  # 15 points apart: still judged


def test_a_change_far_beyond_what_host_load_explains_stands(tmp_path: Path) -> None:
    """Issue 14 review: a loader 900x slower, compared while the host was busier, was called
    inconclusive on every time metric, so no regression was named at all. A change whose interval
    lies beyond HOST_LOAD_MAX_FACTOR (3x) stands, with a note; a 1.5x one stays inconclusive."""
    a = write_run(tmp_path / "a", RunSpec(steps=120, seed=1, host_cpu=lambda t: 20.0)).parents[1]
    b = write_run(tmp_path / "b", _stalled({schema.DATALOADER_NEXT: 400.0}, host_cpu=lambda t: 90.0)).parents[1]
    by = verdicts(compare(a, b))
    for name in ("dataloader_next_ms", "step_time_ms", "throughput_steps_per_s"):
        assert by[name].verdict == "regression", (name, by[name].reason)
        assert "; the host load differed (host CPU 20% in A vs 90% in B" in by[name].reason
        assert "more than host load explains (up to 3x): the verdict stands" in by[name].reason
    # backward moved 1.7x: within what a busier host explains, so not judged
    assert by["backward_ms"].verdict == "inconclusive"
    assert by["backward_ms"].reason.startswith("inconclusive: ")


def _stalled(extra: dict[str, float] | None = None, **spec: Any) -> RunSpec:
    """B of an input-pipeline change: the loader waits 40 ms a step, and the phases after it take
    1.7x as long (what a real CPU run measured after each wait: cold caches, lower clocks)."""
    phases = {**{k: v * 1.7 for k, v in HEALTHY_CPU.items()}, schema.DATALOADER_NEXT: 40.0, "other": 0.85,
              **(extra or {})}
    return RunSpec(steps=120, seed=2, phases=lambda r, s: phases, **spec)


def test_phases_that_moved_with_the_input_pipeline_are_not_regressions(tmp_path: Path) -> None:
    """Issue 14: only the loader changed, yet forward, backward and optimizer were called regressions."""
    a = write_run(tmp_path / "a", RunSpec(steps=120, seed=1)).parents[1]
    b = write_run(tmp_path / "b", _stalled()).parents[1]
    result = compare(a, b)
    by = verdicts(result)
    for name in ("step_time_ms", "throughput_steps_per_s", "dataloader_next_ms"):
        assert by[name].verdict == "regression", (name, by[name].reason)
    for name in ("forward_ms", "backward_ms", "optimizer_step_ms", "other_ms"):
        assert by[name].verdict == "inconclusive", (name, by[name].reason)
        assert re.match(r"inconclusive: moved with the input pipeline \(dataloader_next_ms \+3\d\.\d ms of the "
                        r"step's \+4\d\.\d ms; this phase \+\d", by[name].reason), by[name].reason
        assert "at most 20% of that" in by[name].reason and "lies above 1" in by[name].reason
    assert {m.metric for m in result.regressions()} == {"step_time_ms", "throughput_steps_per_s",
                                                        "dataloader_next_ms"}


def test_a_phase_that_changed_beside_the_input_pipeline_is_still_judged(tmp_path: Path) -> None:
    # forward +16 ms next to the loader's +39 ms: more than 20 % of it, a change of its own.
    a = write_run(tmp_path / "a", RunSpec(steps=120, seed=1)).parents[1]
    by = verdicts(compare(a, write_run(tmp_path / "b", _stalled({schema.FORWARD: 20.0})).parents[1]))
    assert by["forward_ms"].verdict == "regression"
    assert by["backward_ms"].verdict == "inconclusive"
    # When the loader is not most of the step's change, every phase is judged on its own.
    by = verdicts(compare(a, write_run(tmp_path / "c", _stalled({schema.BACKWARD: 60.0})).parents[1]))
    assert by["dataloader_next_ms"].verdict == by["forward_ms"].verdict == "regression"


def test_reason_amounts_have_three_significant_digits_never_an_exponent() -> None:
    """Issue 13 review: the compare reasons wrote 1234 ms as "1.23e+03 ms" next to "12.3 ms"."""
    from traceml_ai.diagnose.compare import sig3

    assert [sig3(v) for v in (1234.5, 123.45, 12.345, 1.2345, 0.012345, 0.0)] == [
        "1,234", "123", "12.3", "1.23", "0.0123", "0"]


def test_a_training_that_fills_the_host_itself_is_still_judged(tmp_path: Path) -> None:
    # B's training uses 6 of the 8 cores itself (more loader workers): the host is busier, the other
    # processes are not, so B's slowdown is its own and is called a regression.
    a = write_run(tmp_path / "a", RunSpec(steps=120, seed=1, host_cpu=lambda t: 20.0)).parents[1]
    b = write_run(tmp_path / "b", RunSpec(steps=120, seed=2, phases=lambda r, s: scaled(1.5),
                                          host_cpu=lambda t: 90.0, proc_cpu=lambda r, t: 600.0)).parents[1]
    result = compare(a, b)
    assert verdicts(result)["step_time_ms"].verdict == "regression"
    assert not any("host load" in p for p in result.problems)


def test_a_short_run_on_a_quiet_host_against_a_busy_one_is_inconclusive(tmp_path: Path) -> None:
    # The walk of issue 14: run A lasted a few seconds (4 host snapshots, 2 after warm-up), run B ran
    # beside two busy processes. `traceml compare` must not call every phase a regression.
    a = write_run(tmp_path / "a", RunSpec(steps=120, seed=1, interval_s=1.0, host_cpu=lambda t: 30.0)).parents[1]
    b = write_run(tmp_path / "b", RunSpec(steps=120, seed=2, phases=lambda r, s: scaled(1.5),
                                          host_cpu=lambda t: 100.0, proc_cpu=lambda r, t: 20.0)).parents[1]
    out = subprocess.run([sys.executable, "-m", "traceml_ai", "compare", str(a), str(b), "--json"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    step = next(m for m in doc["metrics"] if m["metric"] == "step_time_ms")
    assert step["verdict"] == "inconclusive"
    assert "other processes" in step["reason"]
    assert not [m for m in doc["metrics"] if m["verdict"] == "regression"]
