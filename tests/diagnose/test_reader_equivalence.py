"""The fast paths of ``read_telemetry`` (memory map, the collector paused, the first step guessed,
``totals=False``) give exactly what the plain path gives (issue 13 item 5), on a run captured by the
real ``traceml run`` and on databases written with the aggregator's schema that have the awkward
shapes: gaps in the steps, a first row that is not the first step, a rank without step rows, odd
step values, a live writer, damaged files."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import capture_digits
from tests.diagnose.telemetry_db import HEALTHY_CPU, T0_NS, RunSpec, TelemetryDB, cpu_events, write_run
from traceml_ai.diagnose import thresholds as th
from traceml_ai.diagnose.readers import Telemetry, event_ms, read_telemetry, step_sample
from traceml_ai.diagnose.timeline import build_step_table, iteration_ms

ONLY_WITH_TOTALS = ("memory_peaks", "step_span")


def fields(tel: Telemetry, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(tel).items() if k not in skip}


def assert_paths_agree(db: Path) -> Telemetry:
    """Every way of reading ``db`` against the plain full read; returns that read."""
    plain = read_telemetry(db, fast=False)
    assert fields(read_telemetry(db)) == fields(plain)
    for fast in (True, False):
        light = read_telemetry(db, totals=False, fast=fast)
        assert light.memory_peaks == () and light.step_span is None
        assert fields(light, skip=ONLY_WITH_TOTALS) == fields(plain, skip=ONLY_WITH_TOTALS)
    return plain


@pytest.fixture(scope="module")
def captured_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The telemetry database of the digits example captured by ``traceml run`` on 2 ranks with the
    planted straggler."""
    run_dir = capture_digits(tmp_path_factory.mktemp("captured"), "lagging", ranks=2, plant="straggler")
    return run_dir / "aggregator" / "telemetry.sqlite"


@pytest.mark.timeout(600)  # the module fixture runs a real 2-rank training first
def test_a_captured_run_reads_the_same_every_way_also_when_its_steps_are_sampled(
    captured_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = assert_paths_agree(captured_db)
    assert whole.status == "ok" and {s.rank for s in whole.steps} == {0, 1} and whole.sampled_every == 1
    # The step table the charts draw equals iteration_ms() of each step.
    table = build_step_table(whole.steps, warmup_steps=0)
    for tl in table.ranks:
        expected = [iteration_ms(s.phases)[0] for s in whole.steps if s.rank == tl.rank]
        assert [None if v != v else v for v in tl.iteration_ms.tolist()] == expected
    monkeypatch.setattr(th, "MAX_STEP_ROWS", len(whole.steps) // 3)
    sampled = assert_paths_agree(captured_db)
    assert sampled.sampled_every > 2 and len(sampled.steps) < len(whole.steps)


def _steps(db: TelemetryDB, rank: int, steps: list[int], *, world_size: int = 2) -> None:
    for step in steps:
        db.step(rank, step, cpu_events({**HEALTHY_CPU, "traceml:step": 15.0 + rank}), ts_ns=T0_NS + step * 10**7,
                world_size=world_size, seq=step)
        db.memory(rank, step, "cpu", None, None, ts_ns=T0_NS + step * 10**7, world_size=world_size)


@pytest.mark.parametrize("shape", ["gaps", "first_row_not_first_step", "float_step_below", "rank_without_steps",
                                   "bad_rows"])
def test_awkward_databases_read_the_same_every_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   shape: str) -> None:
    monkeypatch.setattr(th, "MAX_STEP_ROWS", 20)  # every shape is long enough to be sampled
    db = TelemetryDB(tmp_path / "telemetry.sqlite")
    if shape == "gaps":
        _steps(db, 0, [*range(7, 30), *range(100, 140)])
        _steps(db, 1, [*range(9, 30), *range(120, 160)])
    elif shape == "first_row_not_first_step":
        _steps(db, 0, list(range(10, 60)))  # the first row says 10; rank 1 started at 3
        _steps(db, 1, list(range(3, 60)))
    elif shape == "float_step_below":
        _steps(db, 0, list(range(5, 60)))
        db.conn.execute("UPDATE step_time_samples SET step = 2.5 WHERE id = (SELECT MAX(id) FROM step_time_samples)")
    elif shape == "rank_without_steps":
        _steps(db, 0, list(range(0, 50)), world_size=3)
        _steps(db, 1, list(range(0, 50)), world_size=3)
        db.process(2, 0, ts_ns=T0_NS, rss=1e9, world_size=3)  # rank 2 sent snapshots, never a step
    else:
        _steps(db, 0, list(range(4, 60)))
        db.step(0, None, cpu_events(HEALTHY_CPU), ts_ns=T0_NS)
        db.step(1, 30, "{not json", ts_ns=T0_NS)
        db.step(1, 31, {"traceml:step": {"cpu": {"cpu_ms": "fast", "duration_ms": 3}}, "odd": [1]}, ts_ns=None)
        _steps(db, 0, [40, 41])  # duplicates: the last one written counts
    db.close()
    tel = assert_paths_agree(tmp_path / "telemetry.sqlite")
    assert tel.status == "ok" and (tel.sampled_every > 1) == (shape != "float_step_below")
    assert min(s.step for s in tel.steps) == min(s.step for s in read_telemetry(db.path, fast=False).steps)
    if shape == "first_row_not_first_step":
        # Sampled from the real first step (3), not the first row's (10): the warm-up of rank 1 is in.
        assert {3, 4, 5, 6, 7} <= {s.step for s in tel.steps if s.rank == 1}
    if shape == "float_step_below":
        assert tel.sampled_every == 1  # MIN(step) is 2.5, not an integer: every row is read, as before


def test_a_live_database_reads_the_same_every_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(th, "MAX_STEP_ROWS", 50)
    path = write_run(tmp_path / "run", RunSpec(ranks=2, steps=60))
    writer = sqlite3.connect(path)  # the aggregator still holds it: WAL with a -wal file
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO step_time_samples (global_rank, rank, step, events_json, world_size) "
                   "SELECT global_rank, rank, step + 1000, events_json, world_size FROM step_time_samples")
    writer.commit()
    try:
        assert Path(str(path) + "-wal").exists()
        tel = assert_paths_agree(path)
        assert tel.sampled_every == 5 and max(s.step for s in tel.steps) >= 1000
    finally:
        writer.close()


@pytest.mark.parametrize("damage", ["truncated", "garbage_inside", "garbage_header", "zero_bytes", "missing"])
def test_damaged_or_missing_databases_read_the_same_every_way(tmp_path: Path, damage: str) -> None:
    path = write_run(tmp_path / "run", RunSpec(ranks=2, steps=400))
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2 + 100])
    elif damage == "garbage_inside":
        mid = len(data) // 2
        path.write_bytes(data[:mid] + b"\xde\xad\xbe\xef" * 4096 + data[mid + 16384:])
    elif damage == "garbage_header":
        path.write_bytes(b"garbage!" * 16 + data[128:])
    elif damage == "zero_bytes":
        path.write_bytes(b"")
    else:
        path.unlink()
    tel = assert_paths_agree(path)
    if damage == "missing":
        assert tel.status == "missing"
    elif damage == "zero_bytes":
        assert tel.status == "empty"
    else:
        assert tel.status == "corrupt" and tel.steps == ()
        assert (tel.detail or "").startswith("telemetry database is damaged: ")
        if damage == "truncated":  # in the run table's and traceml summary's words (review 13h)
            from traceml_ai.diagnose.perf import telemetry_damage

            assert tel.detail == telemetry_damage(tmp_path / "run", summarised=True)
            assert "truncated: " in tel.detail and "malformed" not in tel.detail


def test_the_inline_phase_times_are_event_ms() -> None:
    odd: list[Any] = [
        {"cuda:0": {"gpu_ms": 2.0, "cpu_ms": 0.1}, "cpu": {"cpu_ms": 3.0}},
        {"cpu": {"gpu_ms": None, "cpu_ms": None, "duration_ms": 4}},
        {"cpu": {"gpu_ms": float("nan"), "cpu_ms": 1.5}},
        {"cpu": {"gpu_ms": -1.0, "cpu_ms": 2.0}},
        {"cpu": {"gpu_ms": True, "cpu_ms": 2.0}},
        {"cpu": "fast", "cuda:0": {"gpu_ms": 1.0}},
        {}, None, "garbage", [1, 2],
    ]
    import orjson

    events = {f"e{i}": v for i, v in enumerate(odd)}
    sample = step_sample((0, 0, 1, 5, orjson.dumps(events).decode(), 1))
    assert not isinstance(sample, str)
    assert dict(sample.phases) == {name: event_ms(by_device) for name, by_device in events.items()}


@pytest.mark.parametrize("seed", range(4))
def test_the_typed_decoding_of_events_gives_what_the_generic_path_gives(seed: int) -> None:
    # step_sample decodes the SDK's events_json shape straight into typed fields (issue 13 item 5)
    # and hands anything else to orjson + event_ms: whatever the values, the sample is the same.
    import json
    import random

    import orjson

    from traceml_ai.diagnose.readers import _calls
    from traceml_ai.telemetry import schema

    rng = random.Random(seed)
    values: list[Any] = [1.5, 0.0, -2.0, 3, 10**30, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 1e308, None, True,
                         False, "7", [1.0], {"x": 1.0}]

    def stats() -> Any:
        if rng.random() < 0.05:
            return rng.choice([None, "fast", [], 2.0])
        fields = ["gpu_ms", "cpu_ms", "duration_ms", "n_calls", "is_gpu"]
        return {f: rng.choice(values) for f in rng.sample(fields, rng.randrange(len(fields) + 1))}

    for _ in range(300):
        events = {
            rng.choice(["traceml:forward", "traceml:h2d", schema.STEP, "user"]): (
                {rng.choice(["cpu", "cuda:0", "cuda:1"]): stats() for _ in range(rng.randrange(3))}
                if rng.random() < 0.95 else rng.choice([None, 1, "x"])
            )
            for _ in range(rng.randrange(5))
        }
        text = json.dumps(events)
        sample = step_sample((0, 0, 1, 5, text, 1))
        assert not isinstance(sample, str), text
        decoded = orjson.loads(text)
        assert dict(sample.phases) == {name: event_ms(by_device) for name, by_device in decoded.items()}, text
        assert sample.micro_batches == _calls(decoded.get(schema.STEP)), text
    for bad in ("[1, 2]", "{", '"text"', "1e999999"):
        assert step_sample((0, 0, 1, 5, bad, 1)) == "events", bad
