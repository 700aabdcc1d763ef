"""Iteration time: traceml:step, plus the dataloader wait when it was timed outside the step."""

from __future__ import annotations

import numpy as np

from traceml_ai.diagnose.readers import StepSample
from traceml_ai.diagnose.timeline import OTHER, build_step_table, iteration_ms
from traceml_ai.telemetry import schema

DL, FWD, BWD, OPT, STEP = schema.DATALOADER_NEXT, schema.FORWARD, schema.BACKWARD, schema.OPTIMIZER_STEP, schema.STEP


def test_dataloader_inside_the_step_is_not_counted_twice() -> None:
    assert iteration_ms({DL: 5.0, FWD: 3.0, BWD: 4.0, OPT: 1.0, STEP: 13.5}) == (13.5, False)


def test_dataloader_outside_the_step_is_added() -> None:
    assert iteration_ms({DL: 5.0, FWD: 3.0, BWD: 4.0, OPT: 1.0, STEP: 8.5}) == (13.5, True)


def test_no_step_event_means_no_iteration_time() -> None:
    assert iteration_ms({DL: 5.0, FWD: 3.0}) == (None, False)
    assert iteration_ms({STEP: None, FWD: 3.0}) == (None, False)


def test_step_table_skips_warmup_and_derives_other() -> None:
    samples = [StepSample(0, s, 1000 + s, {FWD: 3.0, BWD: 4.0, STEP: 10.0, "my_region": 1.0}) for s in range(8)]
    samples.append(StepSample(0, 8, 2000, {FWD: None, BWD: 4.0, STEP: 10.0}))
    table = build_step_table(samples, warmup_steps=5)
    (tl,) = table.ranks
    assert tl.steps.tolist() == [5, 6, 7, 8] and tl.skipped == 5 and tl.warmup_end_ns == 1004
    assert table.phase_names == (FWD, BWD, OTHER, "my_region")
    assert tl.phase(OTHER).tolist() == [3.0, 3.0, 3.0, 6.0]
    assert np.isnan(tl.phase(FWD)[-1])  # null forward stays not measured
    assert table.steps_seen == 9 and (table.first_step, table.last_step) == (0, 8)
