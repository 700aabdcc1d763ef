"""Atomic writes (003 seed, write rules; issue 17 item 6, issue 14 item 9): two writers of one file
never share a temp file, a reader never sees half a file, and every run file gets the umask's mode."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceml_ai.runs.writer import atomic_write

WRITER = textwrap.dedent("""
    import sys
    from traceml_ai.runs.writer import atomic_write
    path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    errors = 0
    for i in range(n):
        try:
            atomic_write(path, (tag * 2000 + f" {i}\\n").encode())
        except OSError as e:
            errors += 1
    print(errors)
""")


def test_two_writers_of_one_file_never_collide_and_readers_see_whole_files(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    atomic_write(path, "A" * 2000 + " start\n")
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    writers = [subprocess.Popen([sys.executable, str(script), str(path), tag, "3000"], stdout=subprocess.PIPE,
                                text=True) for tag in ("A", "B")]
    torn = reads = 0
    while any(w.poll() is None for w in writers):
        data = path.read_bytes()
        reads += 1
        body, _, _ = data.partition(b" ")
        if len(body) != 2000 or len(set(body)) != 1 or not data.endswith(b"\n"):
            torn += 1
    errors = [int(w.communicate(timeout=120)[0]) for w in writers]
    assert [w.returncode for w in writers] == [0, 0]
    assert errors == [0, 0]
    assert torn == 0 and reads > 0
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temp file left


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    atomic_write(path, b"old\n")
    with pytest.raises(TypeError):
        atomic_write(path, 42)  # type: ignore[arg-type]
    assert path.read_bytes() == b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_run_file_gets_the_umask_mode(tmp_path: Path) -> None:
    from traceml_ai.aggregator.finalize import write_json_atomic
    from traceml_ai.diagnose.summary import write_final_summary

    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "run.json", "{}\n")
        atomic_write(tmp_path / "metrics.json", "{}\n", durable=False)
        summary = write_final_summary(tmp_path)  # no telemetry: still a summary saying so
        write_json_atomic(tmp_path / "aggregator" / "finalization_warning.json", {"a": 1})
        os.umask(0o077)
        atomic_write(tmp_path / "private.json", "{}\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "run.json") == 0o644
    assert _mode(tmp_path / "metrics.json") == 0o644
    assert _mode(summary) == 0o644 and summary.name == "final_summary.json"
    assert _mode(tmp_path / "aggregator" / "finalization_warning.json") == 0o644
    assert _mode(tmp_path / "private.json") == 0o600
