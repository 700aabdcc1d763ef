"""The stdout/stderr tee: exact pass-through, complete lines with their stream, bounded (DESIGN §3.1)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from traceml_ai.capture.samplers.stdout_stderr import MAX_LINE_CHARS, OutputCapture, TeeStream, _LineBuffer


def tee_pair(max_lines: int = 100) -> tuple[TeeStream, io.StringIO, _LineBuffer]:
    original = io.StringIO()
    sink = _LineBuffer(max_lines)
    return TeeStream(original, "stdout", sink), original, sink


def lines(sink: _LineBuffer) -> list[str]:
    return [line for _, line, _ in sink.lines]


def test_passes_everything_through_unchanged_and_keeps_complete_lines() -> None:
    tee, original, sink = tee_pair()
    text = "epoch 1\nloss=0.5 " + "acc=0.9\n\nünï ✓\r\nhalf"
    for chunk in ("epoch 1\nloss=0.5 ", "acc=0.9\n\nünï ✓\r\n", "half"):
        assert tee.write(chunk) == len(chunk)
    assert original.getvalue() == text
    assert lines(sink) == ["epoch 1", "loss=0.5 acc=0.9", "ünï ✓"]  # empty lines are not recorded (000 seed)
    tee.finish()
    assert lines(sink)[-1] == "half"


def test_progress_bar_keeps_the_last_redraw_and_stays_bounded() -> None:
    tee, original, sink = tee_pair()
    for i in range(10_000):
        tee.write(f"\r{i:5d}/10000 [{'#' * (i // 500)}]")
    assert len(tee._partial) < 100
    tee.write("\n")
    assert lines(sink) == [" 9999/10000 [###################]"]
    assert original.getvalue().count("\r") == 10_000


def test_long_line_is_cut_into_rows() -> None:
    tee, _, sink = tee_pair()
    tee.write("x" * (MAX_LINE_CHARS * 2 + 5))
    tee.write("\n")
    assert [len(ln) for ln in lines(sink)] == [MAX_LINE_CHARS, MAX_LINE_CHARS, 5]


def test_full_buffer_drops_oldest_and_counts() -> None:
    tee, _, sink = tee_pair(max_lines=3)
    tee.write("".join(f"l{i}\n" for i in range(5)))
    assert lines(sink) == ["l2", "l3", "l4"] and sink.dropped == 2


def test_attributes_pass_through_to_the_real_stream(tmp_path: Path) -> None:
    with open(tmp_path / "out.txt", "w", encoding="latin-1", errors="replace") as real:
        tee = TeeStream(real, "stdout", _LineBuffer(10))  # type: ignore[arg-type]
        assert tee.fileno() == real.fileno() and tee.isatty() is False
        assert tee.encoding == "latin-1" and tee.errors == "replace" and tee.buffer is real.buffer
        tee.write("line\n")
        tee.flush()
    assert (tmp_path / "out.txt").read_text(encoding="latin-1") == "line\n"


def test_install_collect_uninstall_on_the_real_sys_streams() -> None:
    before_out, before_err = sys.stdout, sys.stderr
    capture = OutputCapture()
    capture.install()
    try:
        assert isinstance(sys.stdout, TeeStream) and isinstance(sys.stderr, TeeStream)
        print("to out")
        print("to err", file=sys.stderr)
        print("", file=sys.stderr)
        sys.stdout.write("tail")
        rows = capture.collect(1, 0)
    finally:
        capture.uninstall()
    assert sys.stdout is before_out and sys.stderr is before_err
    assert [(r["stream"], r["line"]) for r in rows] == [("stdout", "to out"), ("stderr", "to err")]
    assert set(rows[0]) == {"timestamp_unix_ns", "line", "stream"}
    # uninstall turned the held partial line into a line of its own
    assert [r["line"] for r in capture.collect(2, 0)] == ["tail"]


def test_uninstall_leaves_a_stream_the_user_replaced_after_us() -> None:
    before = sys.stdout
    capture = OutputCapture()
    capture.install()
    mine = io.StringIO()
    sys.stdout = mine
    try:
        capture.uninstall()
        assert sys.stdout is mine
    finally:
        sys.stdout = before
