"""Column facts kept per run shape (issue 16): the same answer as column_facts over all runs, after
runs change, appear, go and get perf facts, at the cost of the changed runs only."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from traceml_ai.runs.column_index import ColumnIndex
from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.runs.table import column_facts, differing_config_keys


def _same(index: ColumnIndex, runs: list) -> None:
    got, want = index.facts(runs), column_facts(runs)
    assert got.available == want.available
    assert got.default == want.default
    assert got.numeric == want.numeric
    # the viewer's "differing params only" columns of the whole table come from the index
    assert got.differing == want.differing == differing_config_keys(runs)


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


def test_the_same_runs_with_a_few_replaced_are_renewed_alone_and_answer_as_column_facts(tmp_path: Path) -> None:
    # A poll that re-parsed a few of the runs hands the index the same list with those summaries
    # replaced (issue 16): only they are looked at, and the answer is that of all the runs.
    generate(tmp_path / "runs", runs=30, seed=2)
    store = RunStore([tmp_path / "runs"])
    store.poll()
    runs = list(store.runs())
    index = ColumnIndex()
    _same(index, runs)
    before = index.shapes_computed
    _same(index, runs)
    assert index.shapes_computed == before  # nothing new: no run looked at again
    kept = index.facts(runs)
    runs[2].display_status = "stale"  # (a poll changes a status in place: no column changes)
    assert index.facts(runs) is kept  # the same answer, not made again
    runs[4] = dataclasses.replace(runs[4], params={**runs[4].params, "optim.lr": "auto", "extra.key": 2})
    runs[9] = dataclasses.replace(runs[9], params={k: v for k, v in runs[9].params.items() if k != "optim.lr"})
    runs[12].perf = {"verdict": "input_bound", "share.dataloader": 0.4}
    _same(index, runs)
    assert index.shapes_computed == before + 3
    assert index.facts(runs) is not kept
    facts = index.facts(runs)
    assert "config.extra.key" in facts.available and "config.optim.lr" not in facts.numeric
    # and back: the replaced runs' values no longer count
    runs[4] = dataclasses.replace(runs[4], params={k: v for k, v in runs[4].params.items() if k != "extra.key"}
                                  | {"optim.lr": 0.01})
    _same(index, runs)
    assert "config.extra.key" not in index.facts(runs).available


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


def _odd_runs(tmp_path: Path) -> list:
    """Generated runs plus the value kinds a saved state must carry: NaN, null, bool, text among
    numbers, a best value of null, perf facts, a run with no duration."""
    generate(tmp_path / "runs", runs=30, seed=9)
    store = RunStore([tmp_path / "runs"])
    store.poll()
    runs = store.runs()
    runs[2] = dataclasses.replace(runs[2], params={**runs[2].params, "optim.lr": float("nan"), "flag": True})
    runs[4] = dataclasses.replace(runs[4], params={**runs[4].params, "flag": None, "optim.lr": "auto"},
                                  duration_s=None, step=None)
    runs[7] = dataclasses.replace(runs[7], perf={"verdict": "input_bound", "share.dataloader": 0.4})
    runs[-1] = dataclasses.replace(runs[-1], params={"only.last": 1})  # a shape first met at the end
    return runs


def test_an_index_primed_from_its_saved_state_answers_as_one_built_from_the_runs(tmp_path: Path) -> None:
    # The warm start (issue 16): the state saved with the runs gives the same column facts, without
    # computing a run's shape, and stays right as runs change, go and come afterwards.
    runs = _odd_runs(tmp_path)
    state = ColumnIndex().export_state(runs)
    assert state is not None
    primed = ColumnIndex.primed(runs, state)
    _same(primed, runs)
    assert primed.facts(runs).default == ColumnIndex().facts(runs).default  # the params order too
    assert primed.shapes_computed == 0
    assert "config.only.last" in primed.facts(runs).available

    changed = dataclasses.replace(runs[3], params={**runs[3].params, "new.key": "x"})
    later = [changed if r is runs[3] else r for r in runs if r is not runs[2]]
    later.append(dataclasses.replace(runs[0], key="/elsewhere/new", params={"late": 2}))
    _same(primed, later)
    assert primed.facts(later).default == ColumnIndex().facts(later).default
    assert "config.flag" in primed.facts(later).available  # runs[4] still holds the key (null)
    later = [r for r in later if r is not runs[-1]]  # the only run of its shape, and its first, goes
    _same(primed, later)
    assert "config.only.last" not in primed.facts(later).available
    # A state exported again from the primed index primes the same answer.
    again = ColumnIndex.primed(later, primed.export_state(later))
    _same(again, later)


def test_a_state_that_is_missing_damaged_or_of_other_runs_is_not_used(tmp_path: Path) -> None:
    runs = _odd_runs(tmp_path)
    state = ColumnIndex().export_state(runs)
    assert state is not None
    for bad in (None, b"", b"\x93garbage", state[:-5], ColumnIndex().export_state(runs[:10])):
        index = ColumnIndex.primed(runs, bad)
        _same(index, runs)
        assert index.shapes_computed == len(runs)  # built from the runs instead
    # A value msgpack cannot hold: no state is saved, and nothing fails.
    huge = [dataclasses.replace(runs[0], params={"seed": 2**70}), *runs[1:]]
    assert ColumnIndex().export_state(huge) is None
