"""Incremental metrics.jsonl reading (003 seed, "Writing runs" §6 and "Live refresh")."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from traceml_ai.runs import metrics_tail
from traceml_ai.runs.metrics_tail import MetricsTail, parse_joined


def _append(path: Path, data: str | bytes) -> None:
    with open(path, "ab") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def _bump_mtime(path: Path) -> None:
    """Move mtime forward so an in-place rewrite of the same size is seen on coarse clocks."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _row(step: int, **metrics: Any) -> str:
    return json.dumps({"step": step, "epoch": step, **metrics}) + "\n"


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    return tmp_path / "metrics.jsonl"


def test_missing_file_has_no_rows(jsonl: Path) -> None:
    tail = MetricsTail(jsonl)
    assert tail.advance() == 0
    assert tail.rows == [] and tail.warnings == []
    jsonl.write_text(_row(0, a=1.0))
    assert tail.advance() == 1


def test_reads_only_the_appended_bytes(jsonl: Path) -> None:
    tail = MetricsTail(jsonl)
    jsonl.write_text(_row(0, **{"train/loss": 1.0}) + _row(1, **{"train/loss": 0.8}))
    assert tail.advance() == 2
    first_offset = tail.offset
    assert first_offset == jsonl.stat().st_size
    _append(jsonl, _row(2, **{"train/loss": 0.6}))
    assert tail.advance() == 1
    assert tail.offset > first_offset
    _append(jsonl, _row(3, **{"train/loss": 0.5}) + _row(4, **{"train/loss": 0.45}))
    assert tail.advance() == 2
    assert tail.advance() == 0  # nothing new
    assert tail.steps == [0, 1, 2, 3, 4]
    s = tail.series("train/loss")
    assert s.step.tolist() == [0, 1, 2, 3, 4]
    assert s.value.tolist() == [1.0, 0.8, 0.6, 0.5, 0.45]
    assert tail.warnings == []


def test_bytes_after_the_last_newline_wait_until_the_line_is_complete(jsonl: Path) -> None:
    tail = MetricsTail(jsonl)
    line = _row(5, **{"val/auc": 0.9})
    jsonl.write_text(_row(4, **{"val/auc": 0.8}) + line[:10])
    assert tail.advance() == 1
    assert tail.steps == [4]
    _append(jsonl, line[10:-1])  # still no newline
    assert tail.advance() == 0
    _append(jsonl, "\n")
    assert tail.advance() == 1
    assert tail.steps == [4, 5]
    assert tail.series("val/auc").value.tolist() == [0.8, 0.9]
    assert tail.corrupt_lines == 0


def test_a_file_that_shrank_is_read_again_from_the_start(jsonl: Path) -> None:
    tail = MetricsTail(jsonl)
    jsonl.write_text("".join(_row(i, a=float(i)) for i in range(5)))
    assert tail.advance() == 5
    jsonl.write_text(_row(0, a=10.0))  # truncated and rewritten in place by a restarted run
    assert tail.advance() == 1
    assert tail.steps == [0]
    assert tail.series("a").value.tolist() == [10.0]
    assert tail.resets == 1


def test_a_replaced_file_is_read_again_from_the_start(jsonl: Path, tmp_path: Path) -> None:
    tail = MetricsTail(jsonl)
    jsonl.write_text(_row(0, a=1.0))
    assert tail.advance() == 1
    new = tmp_path / "new.jsonl"
    new.write_text(_row(7, b=2.0) + _row(8, b=3.0) + _row(9, b=4.0))
    os.replace(new, jsonl)  # a new inode, larger than what was read
    assert tail.advance() == 3
    assert tail.steps == [7, 8, 9]
    assert tail.metric_names() == ["b"]


def test_corrupt_lines_are_counted_and_skipped_with_line_numbers(jsonl: Path) -> None:
    jsonl.write_text(
        _row(0, a=1.0)
        + "{not json\n"
        + "[1, 2]\n"
        + "3.5\n"
        + '{"a": 1.0}\n'
        + '{"step": "3", "a": 1.0}\n'
        + _row(1, a=2.0)
    )
    tail = MetricsTail(jsonl)
    assert tail.advance() == 2
    assert tail.steps == [0, 1]
    assert tail.corrupt_lines == 5
    (warning,) = tail.warnings
    assert warning.startswith("metrics.jsonl: 5 corrupt line(s) skipped (")
    for expected in (
        "line 2: not JSON",
        "line 3: a JSON list, not an object",
        "line 4: a JSON float, not an object",
        "line 5: neither an integer step nor an epoch",
        "line 6: neither an integer step nor an epoch",
    ):
        assert expected in warning


def test_line_numbers_continue_across_appends(jsonl: Path) -> None:
    tail = MetricsTail(jsonl)
    jsonl.write_text(_row(0) + _row(1))
    tail.advance()
    _append(jsonl, "garbage\n")
    tail.advance()
    assert tail.warnings == ["metrics.jsonl: 1 corrupt line(s) skipped (line 3: not JSON)"]


def test_bare_nan_and_infinity_tokens_are_read(jsonl: Path) -> None:
    jsonl.write_text(
        '{"step": 0, "loss": NaN}\n{"step": 1, "loss": Infinity}\n{"step": 2, "loss": -Infinity}\n'
        '{"step": 3, "loss": 0.5}\n'
    )
    tail = MetricsTail(jsonl)
    assert tail.advance() == 4
    assert tail.corrupt_lines == 0
    v = tail.series("loss").value
    assert math.isnan(v[0]) and v[1] == math.inf and v[2] == -math.inf and v[3] == 0.5


def test_non_numeric_metric_values_are_left_out_of_the_series(jsonl: Path) -> None:
    jsonl.write_text(
        _row(0, acc=0.1) + _row(1, acc="high") + _row(2, acc=[1, 2]) + _row(3, acc=True)
        + _row(4, acc={"x": 1}) + _row(5, acc=None) + _row(6, acc=7)
    )
    tail = MetricsTail(jsonl)
    assert tail.advance() == 7  # the rows themselves are fine
    s = tail.series("acc")
    assert s.step.tolist() == [0, 5, 6]
    assert s.value[0] == 0.1 and math.isnan(s.value[1]) and s.value[2] == 7.0
    assert tail.corrupt_lines == 0


def test_epoch_is_the_step_when_step_is_missing(jsonl: Path) -> None:
    jsonl.write_text('{"epoch": 3, "a": 1}\n{"epoch": 4.0, "a": 2}\n{"step": "x", "epoch": 5, "a": 3}\n')
    tail = MetricsTail(jsonl)
    assert tail.advance() == 3
    assert tail.series("a").step.tolist() == [3, 4, 5]


def test_crlf_endings_and_blank_lines_are_fine(jsonl: Path) -> None:
    jsonl.write_bytes(b'{"step": 0, "a": 1}\r\n\r\n\n   \n{"step": 1, "a": 2}\r\n')
    tail = MetricsTail(jsonl)
    assert tail.advance() == 2
    assert tail.corrupt_lines == 0 and tail.warnings == []
    assert tail.series("a").value.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("metric", ["genauigkeit/über", "val/精度"])
def test_a_multibyte_character_split_across_appends(jsonl: Path, metric: str) -> None:
    line = (json.dumps({"step": 1, metric: 0.75}, ensure_ascii=False) + "\n").encode()
    cut = next(i for i, b in enumerate(line) if b >= 0x80) + 1  # inside the first multi-byte character
    with pytest.raises(UnicodeDecodeError):
        line[:cut].decode("utf-8")
    jsonl.write_bytes(line[:cut])
    tail = MetricsTail(jsonl)
    assert tail.advance() == 0
    _append(jsonl, line[cut:])
    assert tail.advance() == 1
    assert tail.metric_names() == [metric]
    assert tail.series(metric).value.tolist() == [0.75]


def test_a_finite_value_between_gaps_is_kept(jsonl: Path) -> None:
    jsonl.write_text('{"step": 0, "a": NaN}\n{"step": 1, "a": 0.3}\n{"step": 2, "a": null}\n')
    tail = MetricsTail(jsonl)
    tail.advance()
    s = tail.series("a")
    finite = np.isfinite(s.value)
    assert s.step[finite].tolist() == [1]
    assert s.value[finite].tolist() == [0.3]
    assert len(s) == 3


def test_steps_going_backwards_keep_both_segments(jsonl: Path) -> None:
    jsonl.write_text("".join(_row(i, a=float(i)) for i in range(5)) + "".join(_row(i, a=10.0 + i) for i in (3, 4, 5)))
    tail = MetricsTail(jsonl)
    assert tail.advance() == 8
    assert tail.series("a").step.tolist() == [0, 1, 2, 3, 4, 3, 4, 5]
    (warning,) = tail.warnings
    assert "steps go backwards" in warning and "line 6: step 4 → 3" in warning


def test_the_same_step_twice_keeps_both_rows(jsonl: Path) -> None:
    jsonl.write_text(_row(2, **{"train/loss": 0.5}) + _row(2, **{"val/loss": 0.6}) + _row(2, **{"val/loss": 0.7}))
    tail = MetricsTail(jsonl)
    assert tail.advance() == 3
    assert tail.series("val/loss").step.tolist() == [2, 2]
    assert tail.series("val/loss").value.tolist() == [0.6, 0.7]
    assert tail.series("train/loss").step.tolist() == [2]
    assert tail.warnings == []


def test_metric_names_with_spaces_and_non_ascii(jsonl: Path) -> None:
    jsonl.write_text(json.dumps({"step": 0, "time": 1.5, "val/top 1 acc": 0.5, "loss·é": 1.0}) + "\n")
    tail = MetricsTail(jsonl)
    tail.advance()
    assert tail.metric_names() == ["loss·é", "val/top 1 acc"]
    s = tail.series("val/top 1 acc")
    assert s.value.tolist() == [0.5] and s.time.tolist() == [1.5]
    assert math.isnan(s.epoch[0])  # the row had no epoch


def test_a_nul_tail_is_waited_for_and_read_once_filled_in(jsonl: Path) -> None:
    good = _row(0, a=1.0)
    later = _row(1, a=2.0) + _row(2, a=3.0)
    jsonl.write_bytes(good.encode() + b"\x00" * len(later))  # a network file system showing a hole
    tail = MetricsTail(jsonl)
    assert tail.advance() == 1
    assert tail.corrupt_lines == 0
    assert tail.advance() == 0
    with open(jsonl, "r+b") as f:  # the data arrives in place
        f.seek(len(good))
        f.write(later.encode())
    _bump_mtime(jsonl)
    assert tail.advance() == 2
    assert tail.steps == [0, 1, 2]
    assert tail.corrupt_lines == 0 and tail.warnings == []


def test_nul_lines_with_newlines_at_the_end_are_not_corrupt(jsonl: Path) -> None:
    good = _row(0, a=1.0)
    later = _row(1, a=2.0)
    hole = b"\x00" * (len(later) - 1) + b"\n"
    jsonl.write_bytes(good.encode() + hole + hole)
    tail = MetricsTail(jsonl)
    assert tail.advance() == 1
    assert tail.advance() == 0
    assert tail.corrupt_lines == 0
    with open(jsonl, "r+b") as f:
        f.seek(len(good))
        f.write(later.encode())  # the first hole filled, the second still waiting
    _bump_mtime(jsonl)
    assert tail.advance() == 1
    assert tail.corrupt_lines == 0
    with open(jsonl, "r+b") as f:
        f.seek(len(good) + len(later))
        f.write(_row(2, a=3.0).encode())
    _bump_mtime(jsonl)
    assert tail.advance() == 1
    assert tail.steps == [0, 1, 2]
    assert tail.corrupt_lines == 0


def test_a_nul_line_followed_by_good_lines_is_corrupt(jsonl: Path) -> None:
    jsonl.write_bytes(_row(0).encode() + b"\x00\x00\x00\n" + _row(1).encode())
    tail = MetricsTail(jsonl)
    assert tail.advance() == 2
    assert tail.corrupt_lines == 1
    assert "line 2: not JSON" in tail.warnings[0]


def test_max_bytes_caps_the_read_with_a_warning(jsonl: Path) -> None:
    rows = [_row(i, a=float(i)) for i in range(10)]
    jsonl.write_text("".join(rows))
    cap = len(rows[0]) * 3 + 5  # three whole rows and a part of the fourth
    tail = MetricsTail(jsonl, max_bytes=cap)
    assert tail.advance() == 3
    assert tail.steps == [0, 1, 2]
    assert any("only the first" in w and "max_metrics_file_mb" in w for w in tail.warnings)
    _append(jsonl, _row(10))
    assert tail.advance() == 0  # still capped
    assert tail.corrupt_lines == 0


# -- the fast path equals line-by-line parsing -------------------------------------------------


@pytest.mark.parametrize("lines", [
    [b'{"step":1,"a":[{}', b'{}]}'],
    [b'{"step":3},{"step":4}'],
    [b'{"step":1,"a":[{}', b'{}]},{"step":2}'],
    [b'{"step":1,"a":[{}', b'{}]}\r\r,{"step":2}'],
    [b'{"step":1,"a":[{}', b'{}]}\r ,{"step":2}'],
    [b'{"step":1,"a":[{}', b'{}]}\r\t,{"step":2}'],
    [b'{"step":1,"a":[{}', b'{}]} ,{"step":2}'],
    [b'{"step":1}', b''],
])
def test_parse_joined_refuses_blocks_that_are_not_one_value_per_line(lines: list[bytes]) -> None:
    assert parse_joined(lines) is None


def test_parse_joined_accepts_plain_and_crlf_blocks() -> None:
    assert parse_joined([b'{"step":1} ', b' {"step":2}']) is None  # a line not starting with "{"
    assert parse_joined([b'{"step":1} ', b'{"step":2}\t']) == [{"step": 1}, {"step": 2}]
    # Nested objects cannot be vouched for by the byte counts: the caller parses them line by line.
    assert parse_joined([b'{"step":1,"a":{"b":[1,{}]}}', b'{"step":2}']) is None
    assert parse_joined([b'{"step":1}\r', b'{"step":2}\r']) == [{"step": 1}, {"step": 2}]


def _reference(data: bytes) -> tuple[list[dict[str, Any]], int]:
    """The rows and corrupt-line count of ``data``, one line at a time with the standard library."""
    rows: list[dict[str, Any]] = []
    corrupt = 0
    for line in data.split(b"\n")[:-1]:
        if not line.strip():
            continue
        try:
            value = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            corrupt += 1
            continue
        if not isinstance(value, dict):
            corrupt += 1
            continue
        step = value.get("step")
        if not (type(step) is int or (type(step) is float and step.is_integer())):
            step = value.get("epoch")
            if not (type(step) is int or (type(step) is float and step.is_integer())):
                corrupt += 1
                continue
        rows.append(value)
    return rows, corrupt


def _canon(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows)  # NaN != NaN, but its text is the same


ADVERSARIAL = [
    b'{"step":1,"a":[{}', b"{}]}", b'{"step":3},{"step":4}', b'{}]},{"step":5}', b'{}]}\r\r,{"step":6}',
    b'{}]}\r ,{"step":7}', b'{"step":8} ', b'{"step":9}\r', b"", b"\r", b"[1]", b"7", b'"s"', b"{",
    b'{"a":1}', b'{"step":"2"}', b'{"epoch":4,"a":NaN}', b'{"step":2,"a":Infinity}', b"{}", b"null",
    b'{"step":1,"a":{"b":[{}', b'{"x":1}}]}}', b'{"step":10,"a":[1,', b'2]}', b'{"step":11}\t,{"step":12}',
    '{"step":13,"ü":1}'.encode(), b'{"step":14,"a":"\xff"}',
]


@pytest.mark.parametrize("block_bytes", [30, 80, 200, 128 * 1024])
def test_rows_equal_line_by_line_parsing_on_random_mixed_lines(
    jsonl: Path, block_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small blocks (a few lines each) make blocks made only of lines that join into valid JSON
    # common, which is where a fast path that trusts the join would go wrong.
    monkeypatch.setattr(metrics_tail, "_BLOCK_BYTES", block_bytes)
    rng = random.Random(3)
    good = [
        json.dumps({"step": i, "epoch": i, "train/loss": rng.random(), "lr": 0.001}).encode()
        for i in range(400)
    ]
    for trial in range(20):
        lines = [rng.choice(ADVERSARIAL) if rng.random() < 0.3 else rng.choice(good) for _ in range(300)]
        data = b"\n".join(lines) + b"\n"
        path = jsonl.with_name(f"trial{trial}.jsonl")  # a new file: inode reuse cannot hide a rewrite
        path.write_bytes(data)
        tail = MetricsTail(path)
        tail.advance()
        expected_rows, expected_corrupt = _reference(data)
        assert _canon(tail.rows) == _canon(expected_rows), trial
        assert tail.corrupt_lines == expected_corrupt, trial


def test_rows_equal_line_by_line_parsing_when_appended_in_random_pieces(jsonl: Path) -> None:
    rng = random.Random(11)
    lines = [rng.choice(ADVERSARIAL) if rng.random() < 0.3 else _row(i, a=i / 7).encode()[:-1] for i in range(300)]
    data = b"\n".join(lines) + b"\n"
    tail = MetricsTail(jsonl)
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 200)
        _append(jsonl, data[pos : pos + step])
        pos += step
        tail.advance()
    expected_rows, expected_corrupt = _reference(data)
    assert _canon(tail.rows) == _canon(expected_rows)
    assert tail.corrupt_lines == expected_corrupt
