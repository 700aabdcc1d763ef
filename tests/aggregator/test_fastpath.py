"""The typed hot path gives exactly the generic projection's rows, counts and log lines."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from traceml_ai.aggregator import fastpath
from traceml_ai.aggregator.fastpath import project_frame
from traceml_ai.aggregator.projection import project_payload, rank_log_lines
from traceml_ai.telemetry import frames, schema
from traceml_ai.telemetry.envelope import EnvelopeError, normalise, payload_items

OBSERVED = 1_764_500_000_000_000_000
MISSING = object()

# Values of every msgpack type, weighted towards the well-typed ones so both paths are exercised.
INTS = [0, 1, 7, -3, 2**40, 1_764_500_000_123_456_789]
FLOATS = [0.0, 1.5, 99.25, 1e9, math.nan, math.inf]
ODD = [True, False, "text", "", [1, 2], {"a": 1}, b"raw", 2.0, 3]

ROW_KEYS: dict[str, dict[str, str]] = {
    "step_time": {"seq": "int", "timestamp_unix_ns": "int", "step": "int", "events": "events"},
    "step_memory": {"seq": "int", "timestamp_unix_ns": "int", "device": "str", "step": "int",
                    "peak_alloc_bytes": "real", "peak_reserved_bytes": "real"},
    "system": {"seq": "int", "timestamp_unix_ns": "int", "cpu_percent": "real", "ram_used_bytes": "real",
               "ram_total_bytes": "real", "gpu_available": "flag", "gpu_count": "int", "gpus": "gpus"},
    "process": {"seq": "int", "timestamp_unix_ns": "int", "cpu_percent": "real", "cpu_logical_core_count": "int",
                "ram_used_bytes": "real", "ram_total_bytes": "real", "gpu_available": "flag", "gpu_count": "int",
                "gpu_device_index": "int", "gpu_mem_used_bytes": "real", "gpu_mem_reserved_bytes": "real",
                "gpu_mem_total_bytes": "real"},
    "runtime_environment": {"seq": "int", "timestamp_unix_ns": "int", "topology": "str",
                            "distributed_initialized": "flag", "distributed_backend": "str",
                            "training_strategy": "str", "strategy_source": "str", "strategy_confidence": "str"},
    "stdout_stderr": {"timestamp_unix_ns": "int", "line": "line", "stream": "stream"},
}


def value(rng: random.Random, kind: str, odd_rate: float) -> Any:
    if rng.random() < 0.15:
        return MISSING
    if rng.random() < 0.1:
        return None
    if rng.random() < odd_rate:
        return rng.choice(ODD)
    if kind == "int":
        return rng.choice(INTS)
    if kind == "real":
        return rng.choice(FLOATS + INTS)
    if kind == "flag":
        return rng.choice([0, 1, True, False])
    if kind == "str":
        return rng.choice(["cuda:0", "cpu", "ddp", ""])
    if kind == "line":
        return rng.choice(["loss 0.5", "", "Traceback:\n", "a | b"])
    if kind == "stream":
        return rng.choice(["stdout", "stderr", "other", 1])
    if kind == "gpus":
        keys = ["util", "mem_used_bytes", "mem_total_bytes", "temperature_c", "power_usage_w", "power_limit_w"]
        return [row_of(rng, dict.fromkeys(keys, "real"), odd_rate) for _ in range(rng.randint(0, 3))]
    assert kind == "events"
    stats = {"is_gpu": "bool", "duration_ms": "real", "cpu_ms": "real", "gpu_ms": "real", "n_calls": "int"}
    out = {}
    for name in rng.sample([*schema.BUILTIN_PHASES, "my_region"], rng.randint(0, 4)):
        out[name] = {dev: {k: (rng.choice([True, False]) if t == "bool" and rng.random() > odd_rate
                               else value(rng, "real" if t == "bool" else t, odd_rate))
                           for k, t in stats.items()}
                     for dev in rng.sample(["cpu", "cuda:0"], rng.randint(1, 2))}
        for dev in out[name]:
            out[name][dev] = {k: v for k, v in out[name][dev].items() if v is not MISSING}
    return out


def row_of(rng: random.Random, keys: dict[str, str], odd_rate: float) -> Any:
    if rng.random() < odd_rate / 4:
        return rng.choice(["not a row", 5, None])
    row = {k: value(rng, t, odd_rate) for k, t in keys.items()}
    return {k: v for k, v in row.items() if v is not MISSING}


def envelope(rng: random.Random, odd_rate: float) -> Any:
    meta = {"session_id": "s", "global_rank": 1, "local_rank": 1, "world_size": 2, "local_world_size": 2,
            "node_rank": 0, "hostname": "h", "pid": 77}
    # Identity of the wrong type (a bool, a float, a string rank) loses its envelope (counted): only
    # odd payloads carry it; a well-typed one has its fields present, missing or null.
    for key in list(meta):
        if rng.random() < 0.2:
            meta[key] = rng.choice([MISSING, None, True, 1.0, "x", 3] if odd_rate else [MISSING, None])
    if rng.random() < 0.2:
        meta.pop("global_rank", None)
        meta["rank"] = rng.choice([4, None, "4"] if odd_rate else [4, None])
    meta = {k: v for k, v in meta.items() if v is not MISSING}
    streams = rng.sample(list(ROW_KEYS), rng.randint(1, 4))
    tables: dict[str, Any] = {s: [row_of(rng, ROW_KEYS[s], odd_rate) for _ in range(rng.randint(0, 4))]
                              for s in streams}
    if rng.random() < 0.1:
        tables["future_stream"] = [{"x": 1}] * rng.randint(0, 3)
    return {"meta": meta, "tables": tables}


def comparable(tables: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """NaN → a marker, so equal rows compare equal."""
    return {name: [tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in rows]
            for name, rows in tables.items()}


def generic_log_lines(payload: Any) -> list[tuple[int | None, str]]:
    out: list[tuple[int | None, str]] = []
    for item in payload_items(payload):
        try:
            out.extend(rank_log_lines(normalise(item)))
        except EnvelopeError:
            pass
    return out


@pytest.mark.parametrize("odd_rate", [0.0, 0.02, 0.3])
def test_both_paths_agree_on_random_payloads(odd_rate: float) -> None:
    rng = random.Random(1000 + int(odd_rate * 100))
    typed = 0
    for _ in range(400):
        payload = envelope(rng, odd_rate) if rng.random() < 0.5 else [envelope(rng, odd_rate) for _ in range(3)]
        data = frames.encode_frame(payload)[frames.HEADER.size:]
        fast = project_frame(data, observed_ns=OBSERVED)
        if fast is None:
            continue
        typed += 1
        slow = project_payload(frames.decode_body(data), observed_ns=OBSERVED)
        assert comparable(fast.table_rows()) == comparable(slow.tables)
        assert list(fast.tables) == list(slow.tables)
        assert (fast.rows, fast.envelopes, fast.skipped) == (slow.rows, slow.envelopes, slow.skipped)
        assert fast.unknown_streams == slow.unknown_streams
        assert fast.log_lines == generic_log_lines(frames.decode_body(data))
    if odd_rate == 0.0:
        assert typed == 400  # well-typed payloads never need the generic path
    else:
        assert typed > 0


@pytest.mark.parametrize("body", [
    frames.hello("s", {"global_rank": 0}, "a-test-job-secret-0123", frames.challenge()["challenge"]),
    frames.rank_finished({"global_rank": 0}, 3, 0),
    {"control": "hello", "tables": {}},
    {"meta": {}, "tables": {"step_time": [{"step": 1.0}]}},        # a float step: generic rules apply
    {"meta": {}, "tables": {"step_memory": "not a list"}},
    [{"meta": {}, "tables": {}}, "not an envelope"],
])
def test_frames_the_generic_path_must_handle(body: Any) -> None:
    assert project_frame(frames.encode_frame(body)[frames.HEADER.size:]) is None


def test_bytes_that_are_not_msgpack_are_left_to_the_generic_path() -> None:
    assert project_frame(b"\xc1\xc1\xc1") is None


def gpu_events(rng: random.Random, device: str) -> dict[str, Any]:
    """A step's events as a GPU rank times them: every phase on the step's one device."""
    out: dict[str, Any] = {}
    for phase in schema.BUILTIN_PHASES:
        cpu_ms = rng.randrange(1, 9_000_000) / 1e6
        gpu_ms = None if phase == "traceml:dataloader_next" else rng.uniform(0.01, 50.0)
        out[phase] = {device: {"is_gpu": gpu_ms is not None, "duration_ms": cpu_ms if gpu_ms is None else gpu_ms,
                               "cpu_ms": cpu_ms, "gpu_ms": gpu_ms, "n_calls": rng.randint(1, 3)}}
    return out


@pytest.mark.parametrize("device", ["cuda:0", "cuda:3", "cpu", "mps", "ü-gpu", "", 'dev "quoted"', "tab\tdev"])
def test_step_time_rows_of_one_device_agree_with_the_generic_path(device: str) -> None:
    # A rank on cuda:3 whose local rank is 5 (CUDA_VISIBLE_DEVICES), devices no guess names, and
    # names whose JSON needs escapes: however they are decoded, the rows are the generic ones.
    rng = random.Random(device)
    meta = {"session_id": "s", "global_rank": 5, "local_rank": 5, "world_size": 8, "local_world_size": 8,
            "node_rank": 0, "hostname": "h", "pid": 7}
    for frame in range(3):
        rows = [{"seq": frame, "timestamp_unix_ns": 1_764_500_000_000_000_000 + s, "step": s,
                 "events": gpu_events(rng, device)} for s in range(40)]
        rows[5]["events"] = {}
        rows[6]["events"] = None
        rows[7]["events"] = {"traceml:step": gpu_events(rng, device)["traceml:step"]}
        rows[8]["events"] = {"my_region": {device: {"n_calls": 2}}}  # stats keys missing: null
        data = frames.encode_frame({"meta": meta, "tables": {"step_time": rows}})[frames.HEADER.size:]
        fast = project_frame(data, observed_ns=OBSERVED)
        assert fast is not None
        slow = project_payload(frames.decode_body(data), observed_ns=OBSERVED)
        assert comparable(fast.table_rows()) == comparable(slow.tables)
        assert fast.rows == slow.rows == 40
    # After one frame the hot path has learnt the device (unless its name needs JSON escapes).
    assert (fastpath._recent_devices[0] == device) == (fastpath._device_decoder(device) is not None)


def test_step_time_rows_of_several_devices_agree_with_the_generic_path() -> None:
    rng = random.Random(7)
    meta = {"session_id": "s", "global_rank": 0, "local_rank": 0}
    rows = [{"seq": 1, "step": s, "events": gpu_events(rng, "cuda:0")} for s in range(20)]
    rows[10]["events"]["traceml:forward"]["cuda:1"] = rows[10]["events"]["traceml:forward"]["cuda:0"]
    rows[12]["events"] = gpu_events(rng, "cuda:1")
    rows[14]["events"]["traceml:backward"] = {}
    payload = [{"meta": meta, "tables": {"step_time": rows}},
               {"meta": {**meta, "local_rank": 1}, "tables": {"step_time": rows[::-1]}}]
    data = frames.encode_frame(payload)[frames.HEADER.size:]
    fast = project_frame(data, observed_ns=OBSERVED)
    assert fast is not None
    slow = project_payload(frames.decode_body(data), observed_ns=OBSERVED)
    assert comparable(fast.table_rows()) == comparable(slow.tables)


def test_rows_come_as_one_block_per_envelope_and_table() -> None:
    meta = {"session_id": "s", "global_rank": 2, "local_rank": 0, "world_size": 4, "local_world_size": 4,
            "node_rank": 0, "hostname": "h", "pid": 7}
    tables = {"step_memory": [{"seq": 1, "step": s, "device": "cpu", "peak_alloc_bytes": 5} for s in range(3)],
              "stdout_stderr": [{"line": "a", "stream": "stdout"}, {"line": ""}, {"line": "b"}]}
    data = frames.encode_frame([{"meta": meta, "tables": tables}, {"meta": meta, "tables": tables}])
    fast = project_frame(data[frames.HEADER.size:], observed_ns=OBSERVED)
    assert fast is not None
    memory = fast.tables[schema.STEP_MEMORY_SAMPLES.name]
    assert [(b.head, b.width, len(b)) for b in memory] == [((OBSERVED, 2, 2, 0, 4, 4, 0, "h"), 6, 3)] * 2
    logs = fast.tables[schema.STDOUT_STDERR_SAMPLES.name]
    assert [(b.head, b.values) for b in logs] == [((OBSERVED, 2), [None, "a", None, "b"])] * 2
    assert fast.rows == 10


@pytest.mark.parametrize("odd_rate", [0.0, 0.3])
def test_a_device_hint_never_changes_the_rows(odd_rate: float) -> None:
    # The server gives each frame the device of its rank's last one; a frame of another shape
    # (other devices, an unknown stream, a table that is not a list, odd values) must come out
    # exactly as without the hint.
    rng = random.Random(77 + int(odd_rate * 10))
    for _ in range(200):
        payload = envelope(rng, odd_rate) if rng.random() < 0.5 else [envelope(rng, odd_rate) for _ in range(2)]
        data = frames.encode_frame(payload)[frames.HEADER.size:]
        plain = project_frame(data, observed_ns=OBSERVED)
        for device in ("cpu", "cuda:0", "cuda:7"):
            hinted = project_frame(data, observed_ns=OBSERVED, device=device)
            if plain is None:
                assert hinted is None
                continue
            assert hinted is not None
            assert comparable(hinted.table_rows()) == comparable(plain.table_rows())
            assert list(hinted.tables) == list(plain.tables)
            assert (hinted.rows, hinted.envelopes, hinted.skipped) == (plain.rows, plain.envelopes, plain.skipped)
            assert (hinted.unknown_streams, hinted.log_lines) == (plain.unknown_streams, plain.log_lines)


def test_a_frame_reports_the_device_that_reads_its_next_frame_in_one_pass() -> None:
    rng = random.Random(3)
    meta = {"session_id": "s", "global_rank": 3, "local_rank": 3}
    rows = [{"seq": 1, "timestamp_unix_ns": 5, "step": s, "events": gpu_events(rng, "cuda:3")} for s in range(10)]
    body = {"meta": meta, "tables": {"step_time": rows, "step_memory": [{"seq": 1, "device": "cuda:3", "step": 1}]}}
    data = frames.encode_frame(body)[frames.HEADER.size:]
    first = project_frame(data, observed_ns=OBSERVED)
    assert first is not None and first.device == "cuda:3"
    again = project_frame(data, observed_ns=OBSERVED, device=first.device)
    assert again is not None and again.device == "cuda:3"
    assert comparable(again.table_rows()) == comparable(first.table_rows())
    rows[4]["events"] = gpu_events(rng, "cuda:1")  # two devices in one frame: no single device
    mixed = project_frame(frames.encode_frame(body)[frames.HEADER.size:], observed_ns=OBSERVED, device="cuda:3")
    assert mixed is not None and mixed.device is None and mixed.rows == 11
