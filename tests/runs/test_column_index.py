"""Column facts kept per run shape (issue 16): the same answer as column_facts over all runs, after
runs change, appear, go and get perf facts, at the cost of the changed runs only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from traceml_ai.runs.column_index import ColumnIndex
from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.runs.table import column_facts


def _same(index: ColumnIndex, runs: list) -> None:
    got, want = index.facts(runs), column_facts(runs)
    assert got.available == want.available
    assert got.default == want.default
    assert got.numeric == want.numeric


def test_the_index_answers_as_column_facts_through_changes(tmp_path: Path) -> None:
    generate(tmp_path / "runs", runs=40, seed=5)
    store = RunStore([tmp_path / "runs"])
    store.poll()
    runs = store.runs()
    index = ColumnIndex()
    _same(index, runs)
    assert index.shapes_computed == len(runs)

    # One run gets a new config key and a text value where others hold numbers; one goes; one new.
    changed = dataclasses.replace(runs[3], params={**runs[3].params, "optim.lr": "auto", "new.key": 1})
    newcomer = dataclasses.replace(runs[0], key="/elsewhere/new", params={"only.here": True}, duration_s=None)
    later = [changed if r is runs[3] else r for r in runs if r is not runs[5]] + [newcomer]
    before = index.shapes_computed
    _same(index, later)
    assert index.shapes_computed - before == 2
    facts = index.facts(later)
    assert "config.new.key" in facts.available and "config.only.here" in facts.available
    assert "config.optim.lr" not in facts.numeric  # one text value makes the column text

    # perf facts replaced on a kept summary (as RunStore.set_perf does) count as a change.
    later[1].perf = {"verdict": "input_bound", "share.dataloader": 0.4}
    _same(index, later)
    assert "perf.share.dataloader" in index.facts(later).numeric

    # The changed run goes back: its text value no longer makes the column text.
    back = [r for r in later if r is not changed and r is not newcomer]
    _same(index, back)
    assert "config.optim.lr" in index.facts(back).numeric
    assert "config.new.key" not in index.facts(back).available
