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


def test_runs_of_one_shape_that_differ_in_values_show_their_differing_params(tmp_path: Path) -> None:
    """A sweep: every run has the same params keys and types (one shape), only the values differ.
    The default columns still show the params that differ, as column_facts over all runs does."""
    generate(tmp_path / "runs", runs=6, seed=1)
    store = RunStore([tmp_path / "runs"])
    store.poll()
    base = store.runs()[0]
    sweep = [
        dataclasses.replace(base, key=f"/sweep/{i}", params={"same": 1, "optim.lr": 0.1 * (i + 1), "seed": 7,
                                                               "data.n": None, "w": float("nan"), "on": True})
        for i in range(4)
    ]
    index = ColumnIndex()
    _same(index, sweep)  # NaN equals NaN, true equals true: only lr differs
    assert [c for c in index.facts(sweep).default if c.startswith("config.")] == ["config.optim.lr"]
    # The runs come to agree on lr but one gets another seed, one loses data.n (null = missing).
    agreed = [dataclasses.replace(r, params={**r.params, "optim.lr": 0.1}) for r in sweep]
    agreed[2] = dataclasses.replace(agreed[2], params={**agreed[2].params, "seed": 8})
    agreed[3] = dataclasses.replace(agreed[3], params={k: v for k, v in agreed[3].params.items() if k != "data.n"})
    _same(index, agreed)
    assert [c for c in index.facts(agreed).default if c.startswith("config.")] == ["config.seed"]
    # A key only some runs have differs (missing is not a value), and one run is left: nothing does.
    agreed[1] = dataclasses.replace(agreed[1], params={**agreed[1].params, "extra": "x"})
    _same(index, agreed)
    assert [c for c in index.facts(agreed).default if c.startswith("config.")] == ["config.seed", "config.extra"]
    _same(index, agreed[:1])
    assert not [c for c in index.facts(agreed[:1]).default if c.startswith("config.")]
