"""The readers of manifest.json, finalization_warning.json and rank logs in a run's aggregator/
folder: typed answers, and a warning line (never an exception, never a hang) for a bad file."""

from __future__ import annotations

import json
import os
from pathlib import Path

from traceml_ai.runs.aggregator_files import (
    LOG_TAIL_MAX_BYTES,
    MAX_LINE_CHARS,
    rank_log_order,
    read_finalization_warning,
    read_manifest,
    read_rank_log_tail,
)


def test_a_manifest_keeps_its_scalars_and_drops_what_is_not_one(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({
        "session_id": "abc", "status": "completed", "world_size": 2, "hostname": ["not", "a", "name"],
        "secret_note": "not shown"}))
    warnings: list[str] = []
    manifest = read_manifest(str(tmp_path), warnings)
    assert manifest is not None and warnings == []
    doc = manifest.to_dict()
    assert doc["session_id"] == "abc" and doc["world_size"] == 2 and doc["hostname"] is None
    assert "secret_note" not in doc


def test_bad_files_are_one_warning_each(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("[1, 2]")
    (tmp_path / "finalization_warning.json").write_text("{not json")
    os.mkfifo(tmp_path / "rank_0.log")  # would block a plain open() forever
    warnings: list[str] = []
    assert read_manifest(str(tmp_path), warnings) is None
    assert read_finalization_warning(str(tmp_path), warnings) is None
    tail = read_rank_log_tail(str(tmp_path), "rank_0.log", 10, warnings)
    assert tail.lines == () and tail.size is None
    assert [w.split(":")[0] for w in warnings] == ["aggregator/manifest.json", "aggregator/finalization_warning.json",
                                                   "aggregator/rank_0.log"]
    assert "not a JSON object" in warnings[0] and "not valid JSON" in warnings[1]


def test_the_finalization_summary_keeps_its_text_lines(tmp_path: Path) -> None:
    (tmp_path / "finalization_warning.json").write_text(json.dumps({"summary": ["rank 1 dropped 3 batches", 7]}))
    warnings: list[str] = []
    found = read_finalization_warning(str(tmp_path), warnings)
    assert found is not None and found.summary == ("rank 1 dropped 3 batches",)
    assert warnings == ["aggregator/finalization_warning.json: 1 entries of 'summary' are not text; left out"]


def test_a_long_log_gives_its_last_lines_by_stream_without_colours(tmp_path: Path) -> None:
    lines = [f"stdout | line {i}" for i in range(30)] + ["stderr | \x1b[31mboom\x1b[0m", "plain", "x" * 5000]
    (tmp_path / "rank_3.log").write_text("\n".join(lines) + "\n")
    tail = read_rank_log_tail(str(tmp_path), "rank_3.log", 4, [])
    assert tail.rank == "3" and tail.truncated and tail.size == (tmp_path / "rank_3.log").stat().st_size
    assert tail.lines[:3] == (("stdout", "line 29"), ("stderr", "boom"), (None, "plain"))
    assert tail.lines[3][1].startswith("x" * MAX_LINE_CHARS + " … [1,000 more characters]")


def test_a_huge_log_is_read_from_its_end_only(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.log"
    with path.open("w") as f:
        f.write("stdout | " + "y" * (2 * LOG_TAIL_MAX_BYTES) + "\n")  # one line longer than what is read
        f.write("stdout | the end\n")
    tail = read_rank_log_tail(str(tmp_path), "rank_0.log", 10, [])
    assert tail.lines == (("stdout", "the end"),) and tail.truncated  # the cut first line is dropped


def test_rank_logs_sort_by_rank_with_unknown_last() -> None:
    names = ["rank_unknown.log", "rank_10.log", "rank_2.log"]
    assert sorted(names, key=rank_log_order) == ["rank_2.log", "rank_10.log", "rank_unknown.log"]
