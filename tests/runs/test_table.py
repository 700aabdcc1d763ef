"""The run table model (traceml_ai.runs.table; 003 seed, runs table and "Exporting the table for an
agent")."""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import random
import re
from typing import Any

import pytest

from traceml_ai.runs.model import BestValue, RunSummary
from traceml_ai.runs.table import (
    PERF_COLUMNS,
    ColumnError,
    SortKey,
    available_columns,
    cell,
    column_is_numeric,
    default_columns,
    differing_config_keys,
    format_cell,
    group_runs,
    json_lines,
    natural_key,
    parse_sort_arg,
    row_json,
    rows_json,
    sort_runs,
    to_csv,
    validate_column,
)

NAN = math.nan


def make_run(name: str, **fields: Any) -> RunSummary:
    """A run named ``name`` in /runs; ``best`` may be given as plain numbers."""
    run_id = f"20261130-101500_{name}_a3f9"
    best = {k: BestValue(v, 1, 1, "max") for k, v in fields.pop("best", {}).items()}
    fields.setdefault("display_status", "completed")
    return RunSummary(key=f"/runs/{run_id}", id=run_id, root="/runs", name=name, best=best, **fields)


def names(runs: list[RunSummary]) -> list[str]:
    return [r.name for r in runs]


# -- columns ---------------------------------------------------------------------------------------


def test_cells_of_fixed_columns() -> None:
    run = make_run(
        "baseline",
        status="running",
        display_status="stale",
        group="sweep-a",
        tags=["cv", "sweep"],
        started_at="2026-11-30T10:15:00Z",
        duration_s=12.5,
        step=7,
        legacy=False,
        warnings=["metrics.jsonl: 2 corrupt lines skipped"],
    )
    assert cell(run, "status") == "stale"
    assert cell(run, "tags") == "cv;sweep"
    assert cell(run, "path") == "/runs/20261130-101500_baseline_a3f9"
    assert cell(run, "started") == "2026-11-30T10:15:00Z"
    assert cell(run, "ended") is None
    assert cell(run, "duration_s") == 12.5
    assert cell(run, "step") == 7
    assert cell(run, "legacy") is False
    assert cell(run, "warnings") == 1
    assert cell(run, "notes") is None


def test_logged_value_columns_take_the_rest_of_the_name_verbatim() -> None:
    run = make_run(
        "r",
        params={"optim.lr": 0.001},
        start={"my metric": 2.0},
        last={"val/auc": 0.7},
        best={"val/auc": 0.9},
        summary={"genauigkeit/über": 0.5, "test.acc": "n/a"},
    )
    assert cell(run, "config.optim.lr") == 0.001
    assert cell(run, "run.start.my metric") == 2.0
    assert cell(run, "run.last.val/auc") == 0.7
    assert cell(run, "run.best.val/auc") == 0.9
    assert cell(run, "summary.genauigkeit/über") == 0.5
    assert cell(run, "summary.test.acc") == "n/a"
    assert cell(run, "config.missing") is None


def test_unknown_column_is_a_one_line_error_with_a_hint() -> None:
    with pytest.raises(ColumnError, match="did you mean 'started'"):
        cell(make_run("r"), "startd")
    with pytest.raises(ColumnError, match="names no key"):
        cell(make_run("r"), "run.best.")


@pytest.mark.parametrize(("asked", "meant"), [
    ("perf.peak_mem.cpu", "perf.peak_mem.host"),  # not the spelling-nearest .gpu (review 13e)
    ("perf.peak_mem.RAM", "perf.peak_mem.host"),
    ("perf.peak_mem.cuda", "perf.peak_mem.gpu"),
    ("perf.peak_mem.gpus", "perf.peak_mem.gpu"),
    ("perf.step_ms.p90", "perf.step_ms.p95"),
])
def test_a_mistyped_perf_column_suggests_the_column_meant(asked: str, meant: str) -> None:
    with pytest.raises(ColumnError, match=re.escape(f"did you mean '{meant}'?")):
        validate_column(asked)


def test_available_and_default_columns() -> None:
    runs = [
        make_run(
            "a", params={"b": 1, "a": 2}, best={"val/auc": 0.9}, last={"loss": 1.0}, summary={"test/auc": 0.8}
        ),
        make_run("b", start={"loss": 3.0}, best={"val/loss": 0.1}),
    ]
    columns = available_columns(runs)
    assert columns[:3] == ["id", "name", "status"]
    assert columns[15:] == [
        "config.a",
        "config.b",
        "run.best.val/auc",
        "run.best.val/loss",
        "run.last.loss",
        "run.start.loss",
        "summary.test/auc",
    ]
    assert default_columns(runs) == [
        "name",
        "status",
        "group",
        "tags",
        "started",
        "duration_s",
        "config.b",  # params that differ between the runs (b has none), in params order, before best and summary
        "config.a",
        "run.best.val/auc",
        "run.best.val/loss",
        "summary.test/auc",
    ]


def test_column_is_numeric_ignores_missing_and_rejects_bool_and_text() -> None:
    runs = [
        make_run("a", params={"lr": 0.1, "flag": True, "mixed": 1}, best={"auc": NAN}),
        make_run("b", params={"mixed": "auto"}),
    ]
    assert column_is_numeric(runs, "config.lr")
    assert column_is_numeric(runs, "run.best.auc")  # NaN is a number
    assert not column_is_numeric(runs, "config.flag")
    assert not column_is_numeric(runs, "config.mixed")
    assert not column_is_numeric(runs, "config.absent")
    assert not column_is_numeric(runs, "name")


# -- sort ------------------------------------------------------------------------------------------


SORT_RUNS = [
    make_run("missing"),
    make_run("nan", best={"auc": NAN}),
    make_run("low", best={"auc": 0.5}),
    make_run("text", best={"auc": None}, summary={"auc": "n/a"}),
    make_run("high", best={"auc": 0.9}),
    make_run("mid", best={"auc": 0.7}),
]


def test_sort_ascending_puts_nan_then_missing_last() -> None:
    assert names(sort_runs(SORT_RUNS, [SortKey("run.best.auc")])) == [
        "low",
        "mid",
        "high",
        "nan",
        "missing",
        "text",
    ]


def test_sort_descending_still_puts_nan_then_missing_last() -> None:
    got = sort_runs(SORT_RUNS, [SortKey("run.best.auc", descending=True)])
    assert names(got) == ["high", "mid", "low", "nan", "missing", "text"]


def test_sort_numbers_before_text_case_insensitive_both_directions() -> None:
    runs = [
        make_run("a", params={"x": "beta"}),
        make_run("b", params={"x": 10}),
        make_run("c", params={"x": "Alpha"}),
        make_run("d"),
        make_run("e", params={"x": 9}),
    ]
    assert names(sort_runs(runs, [SortKey("config.x")])) == ["e", "b", "c", "a", "d"]
    assert names(sort_runs(runs, [SortKey("config.x", descending=True)])) == ["b", "e", "a", "c", "d"]


def test_later_sort_keys_break_ties_and_the_sort_is_stable() -> None:
    runs = [
        make_run("a", group="g2", best={"auc": 0.5}),
        make_run("b", group="g1", best={"auc": 0.5}),
        make_run("c", group="g1", best={"auc": 0.9}),
        make_run("d", group="g1", best={"auc": 0.9}),
        make_run("e", best={"auc": NAN}),
        make_run("f", group="g1"),
    ]
    keys = [SortKey("group"), SortKey("run.best.auc", descending=True)]
    assert names(sort_runs(runs, keys)) == ["c", "d", "b", "f", "a", "e"]
    keys = [SortKey("group", descending=True), SortKey("run.best.auc")]
    assert names(sort_runs(runs, keys)) == ["a", "b", "c", "d", "f", "e"]


def _sort_one_pass_per_key(runs: list[RunSummary], keys: list[SortKey]) -> list[RunSummary]:
    """The definition of a multi-key sort: one stable single-key sort per key, the last key first."""
    for key in reversed(keys):
        runs = sort_runs(runs, [key])
    return runs


@pytest.mark.parametrize("seed", range(6))
def test_a_multi_key_sort_orders_as_one_stable_pass_per_key_would(seed: int) -> None:
    # sort_runs reads a later key only for the runs that tie on the keys before it (issue 16):
    # whatever the mix of ties, numbers, text, NaN and missing values, the order is the definition's.
    import random

    rng = random.Random(seed)
    pool: list[Any] = [0.5, 0.5, 1, 1.0, 2, -3, NAN, None, "b", "B", "a10", "a9", True]
    runs = [
        make_run(f"r{rng.randrange(8)}", group=rng.choice(["g1", "g2", "", None]),
                 params={"x": rng.choice(pool), "y": rng.choice(pool)}, best={"auc": rng.choice([0.1, 0.2, NAN])})
        for _ in range(200)
    ]
    columns = ["config.x", "config.y", "group", "run.best.auc", "name"]
    for _ in range(10):
        keys = [SortKey(c, rng.random() < 0.5) for c in rng.sample(columns, rng.randrange(1, 5))]
        assert [r.key for r in sort_runs(runs, keys)] == [r.key for r in _sort_one_pass_per_key(runs, keys)], keys


def test_the_inline_classification_of_sort_values_is_the_sort_entry_of_each() -> None:
    # sort_runs classifies the first key's values inline for speed (issue 16); it must put every
    # kind of value where the one definition, _sort_entry, puts it.
    from traceml_ai.runs.table import _classify, _sort_entry

    values: list[Any] = [0.5, -0.0, 1, 0, -3, 10**30, NAN, math.inf, -math.inf, None, "", "b", "B", "a10",
                         "a9", " ", "0", True, False, "NaN"]
    runs = [make_run(f"r{i}", params={"x": v}) for i, v in enumerate(values)]
    buckets: tuple[list[Any], ...] = ([], [], [], [])
    _classify(runs, values, buckets)
    expected: tuple[list[Any], ...] = ([], [], [], [])
    for run, v in zip(runs, values, strict=True):
        kind, entry = _sort_entry(v)
        expected[kind].append((entry, run))
    assert [[(e, r.name) for e, r in b] for b in buckets] == [[(e, r.name) for e, r in b] for b in expected]


def test_time_columns_sort_by_time_including_fractional_seconds() -> None:
    # Natural order would read ".25" as 25 and put it after ".5"; a time column sorts by time.
    runs = [make_run("late", started_at="2026-11-30T10:15:00.5Z"),
            make_run("early", started_at="2026-11-30T10:15:00.25Z"),
            make_run("none"),
            make_run("first", started_at="2026-11-30T09:59:59Z")]
    assert names(sort_runs(runs, [SortKey("started")])) == ["first", "early", "late", "none"]
    assert names(sort_runs(runs, [SortKey("started", descending=True)])) == ["late", "early", "first", "none"]


def test_parse_sort_arg() -> None:
    assert parse_sort_arg("-run.best.val/auc") == SortKey("run.best.val/auc", True)
    assert parse_sort_arg("run.best.val/auc:desc") == SortKey("run.best.val/auc", True)
    assert parse_sort_arg("run.last.my metric:ASC") == SortKey("run.last.my metric", False)
    assert parse_sort_arg("+name") == SortKey("name", False)
    assert parse_sort_arg("started") == SortKey("started", False)
    with pytest.raises(ColumnError, match="unknown column 'score'"):
        parse_sort_arg("-score")


# -- group -----------------------------------------------------------------------------------------


def test_group_by_tags_joins_them_in_written_order_with_none_last() -> None:
    runs = [
        make_run("a", tags=["sweep", "cv"]),
        make_run("b"),
        make_run("c", tags=["cv", "sweep"]),
        make_run("d", tags=["cv"]),
        make_run("e", tags=["cv", "sweep"]),
    ]
    groups = group_runs(runs, "tags")
    assert [(g.label, names(g.runs)) for g in groups] == [
        ("cv", ["d"]),
        ("cv, sweep", ["c", "e"]),
        ("sweep, cv", ["a"]),
        ("(none)", ["b"]),
    ]
    assert groups[-1].value is None


def test_group_by_config_key_numbers_numerically_then_text_then_none() -> None:
    runs = [
        make_run("a", params={"batch": 64}),
        make_run("b", params={"batch": "auto"}),
        make_run("c", params={"batch": 8}),
        make_run("d"),
        make_run("e", params={"batch": 64.0}),
        make_run("f", params={"batch": None}),
        make_run("g", params={"batch": 128}),
        make_run("h", params={"batch": ""}),
    ]
    groups = group_runs(runs, "config.batch")
    assert [(g.label, names(g.runs)) for g in groups] == [
        ("8", ["c"]),
        ("64", ["a", "e"]),
        ("128", ["g"]),
        ("auto", ["b"]),
        ("(none)", ["d", "f", "h"]),
    ]
    assert groups[1].value == 64


def test_group_by_group_column() -> None:
    runs = [make_run("a", group="lr-sweep"), make_run("b", group=""), make_run("c", group="Base")]
    assert [g.label for g in group_runs(runs, "group")] == ["Base", "lr-sweep", "(none)"]


def test_differing_config_keys() -> None:
    runs = [
        make_run("a", params={"lr": 0.1, "seed": 1, "opt": "adam", "extra": 1, "n": None, "x": 1}),
        make_run("b", params={"lr": 0.1, "seed": 2, "opt": "adam", "x": 1.0}),
        make_run("c", params={"lr": 0.1, "seed": 3, "opt": "adam", "x": 1}),
    ]
    # extra: missing in b and c counts as a different value; n: null equals missing; 1 == 1.0.
    # In the order the params list them (seed before extra in a's params.yaml), not by name.
    assert differing_config_keys(runs) == ["seed", "extra"]
    assert differing_config_keys(runs[:1]) == []
    flags = [make_run("a", params={"f": True}), make_run("b", params={"f": 1})]
    assert differing_config_keys(flags) == ["f"]
    # A key only a later run has comes after the keys of the earlier runs.
    later = [make_run("a", params={"z": 1, "b": 1}), make_run("b", params={"z": 2, "a": 5, "b": 2})]
    assert differing_config_keys(later) == ["z", "b", "a"]


# -- export ----------------------------------------------------------------------------------------


def test_csv_always_starts_with_the_six_identity_columns() -> None:
    run = make_run(
        "baseline",
        group="sweep-a",
        tags=["cv", "sweep"],
        started_at="2026-09-29T23:01:16.000Z",
        duration_s=3600,
        params={"optim.lr": 0.0003},
        best={"val/auc": 0.894},
        summary={"test/auc": 0.881},
    )
    text = to_csv(
        [run], ["name", "started", "duration_s", "config.optim.lr", "run.best.val/auc", "summary.test/auc"]
    )
    lines = text.splitlines()
    header = (
        "id,name,status,group,tags,path,started,duration_s,config.optim.lr,run.best.val/auc,summary.test/auc"
    )
    assert lines[0] == header
    assert lines[1] == (
        "20261130-101500_baseline_a3f9,baseline,completed,sweep-a,cv;sweep,/runs/20261130-101500_baseline_a3f9,"
        "2026-09-29T23:01:16.000Z,3600,0.0003,0.894,0.881"
    )
    assert len(lines) == 2


def test_csv_quotes_a_name_with_comma_quote_and_newline() -> None:
    run = make_run("x")
    run.name = 'lr=1e-3, "warm"\nrestart'
    text = to_csv([run], [])
    assert '"lr=1e-3, ""warm""\nrestart"' in text
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[1][1] == run.name
    assert len(rows) == 2


def test_csv_cell_formats() -> None:
    run = make_run(
        "r",
        legacy=True,
        params={"flag": False, "tiny": 1e-05, "third": 1 / 3, "none": None},
        last={"loss": NAN},
        summary={"genauigkeit/über": "gut"},
    )
    columns = ["legacy", "config.flag", "config.tiny", "config.third", "config.none", "config.absent"]
    columns += ["run.last.loss", "summary.genauigkeit/über", "tags", "group"]
    rows = list(csv.reader(io.StringIO(to_csv([run], columns))))
    row = dict(zip(rows[0], rows[1], strict=True))
    assert row["legacy"] == "true"
    assert row["config.flag"] == "false"
    assert row["config.tiny"] == "1e-05"
    assert row["config.third"] == "0.3333333333333333"  # repr, no rounding
    assert row["config.none"] == "" and row["config.absent"] == ""
    assert row["run.last.loss"] == "NaN"
    assert row["summary.genauigkeit/über"] == "gut"
    assert row["tags"] == "" and row["group"] == ""
    assert rows[0].count("tags") == 1  # the six lead columns are not repeated


def test_csv_rows_follow_the_given_order() -> None:
    runs = [make_run("b"), make_run("a")]
    rows = list(csv.reader(io.StringIO(to_csv(runs, ["name"]))))
    assert [r[1] for r in rows[1:]] == ["b", "a"]


def test_row_json_is_json_safe() -> None:
    run = make_run(
        "r",
        status="running",
        display_status="stale",
        tags=["cv"],
        warnings=["metrics.jsonl: 1 corrupt line skipped"],
        best={"auc": NAN},
        last={"loss": 0.25},
    )
    row = row_json(run, ["name", "tags", "run.best.auc", "run.last.loss", "config.lr"])
    assert row == {
        "id": "20261130-101500_r_a3f9",
        "name": "r",
        "status": "running",
        "display_status": "stale",
        "warnings": ["metrics.jsonl: 1 corrupt line skipped"],
        "values": {
            "name": "r",
            "tags": ["cv"],
            "run.best.auc": None,
            "run.last.loss": 0.25,
            "config.lr": None,
        },
    }
    json.dumps(row, allow_nan=False)


def test_numeric_columns_agrees_with_column_is_numeric() -> None:
    import tempfile

    from traceml_ai.runs.fake import generate
    from traceml_ai.runs.store import RunStore
    from traceml_ai.runs.table import available_columns, column_is_numeric, numeric_columns

    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, runs=24, seed=0)
        store = RunStore([tmp])
        store.poll()
        runs = store.runs()
        fast = numeric_columns(runs)
        for column in available_columns(runs):
            assert (column in fast) == column_is_numeric(runs, column), column


def test_cell_getter_reads_what_cell_reads_in_every_column() -> None:
    import tempfile

    from traceml_ai.runs.fake import generate
    from traceml_ai.runs.store import RunStore
    from traceml_ai.runs.table import cell_getter

    with tempfile.TemporaryDirectory() as tmp:
        generate(tmp, runs=24, seed=0)
        store = RunStore([tmp])
        store.poll()
        runs = store.runs()
        for column in available_columns(runs):
            get = cell_getter(column)
            for run in runs:
                expected, got = cell(run, column), get(run)
                assert got == expected or (got != got and expected != expected), (column, run.name)  # NaN
    with pytest.raises(ColumnError):
        cell_getter("nope")


# -- perf.* columns (issue 13 item 1) ----------------------------------------------------------------


def perf_runs() -> list[RunSummary]:
    return [
        make_run("fast", perf={"telemetry": "ok", "verdict": "healthy", "step_ms.p50": 12.0, "share.dataloader": 0.05}),
        make_run("stall", perf={"telemetry": "ok", "verdict": "input_bound", "severity": "critical",
                                "step_ms.p50": 40.0, "share.dataloader": 0.71}),
        make_run("lag", perf={"telemetry": "partial", "verdict": "straggler", "step_ms.p50": 25.0,
                              "share.dataloader": 0.1, "straggler": "1"}),
        make_run("plain"),  # not captured: every perf.* cell is empty
    ]


def test_perf_columns_sort_filter_group_and_export_like_the_others() -> None:
    from traceml_ai.runs.filters import filter_runs, parse_filter_arg

    runs = perf_runs()
    assert cell(runs[1], "perf.share.dataloader") == 0.71 and cell(runs[3], "perf.verdict") is None
    assert names(sort_runs(runs, [parse_sort_arg("-perf.share.dataloader")])) == ["stall", "lag", "fast", "plain"]
    column, parsed = parse_filter_arg("perf.share.dataloader>0.3")
    assert names(filter_runs(runs, [(column, parsed)])) == ["stall"]
    column, parsed = parse_filter_arg("perf.verdict=straggler")
    assert names(filter_runs(runs, [(column, parsed)])) == ["lag"]
    groups = group_runs(runs, "perf.telemetry")
    assert [(g.label, names(g.runs)) for g in groups] == [("ok", ["fast", "stall"]), ("partial", ["lag"]),
                                                          ("(none)", ["plain"])]
    rows = list(csv.DictReader(io.StringIO(to_csv(runs, ["perf.verdict", "perf.step_ms.p50"]))))
    assert [(r["name"], r["perf.verdict"], r["perf.step_ms.p50"]) for r in rows] == [
        ("fast", "healthy", "12.0"), ("stall", "input_bound", "40.0"), ("lag", "straggler", "25.0"), ("plain", "", "")]
    assert row_json(runs[1], ["perf.severity"])["values"] == {"perf.severity": "critical"}


def test_perf_columns_are_listed_numeric_and_shown_by_default_only_when_a_run_was_captured() -> None:
    from traceml_ai.runs.table import numeric_columns

    runs = perf_runs()
    available = available_columns(runs)
    # Every perf.* column is listed (empty where no run has it) once a run was captured.
    assert [c for c in available if c.startswith("perf.")] == sorted(f"perf.{k}" for k in PERF_COLUMNS)
    assert column_is_numeric(runs, "perf.step_ms.p50") and not column_is_numeric(runs, "perf.verdict")
    assert "perf.share.h2d" in numeric_columns(runs)  # no run has it: a numeric column all the same
    assert default_columns(runs)[6:9] == ["perf.verdict", "perf.step_ms.p50", "perf.share.dataloader"]
    assert not any(c.startswith("perf.") for c in default_columns([make_run("plain")]))
    with pytest.raises(ColumnError, match=r"perf\.<key>"):
        cell(runs[0], "perf")


def test_the_default_params_are_the_six_that_vary_most_so_a_swept_lr_listed_late_is_among_them() -> None:
    # As the fake sweep writes params.yaml: seven data/model keys of two or three values each,
    # then the optim.lr the sweep draws for every run, then an output folder of each run's own.
    runs = [
        make_run(f"r{i}", params={
            "data.dataset": ["cifar", "mnist", "svhn"][i % 3], "data.batch_size": [64, 128][i % 2],
            "model.name": ["resnet", "vit"][i % 2], "model.hidden": [128, 256, 512][i % 3],
            "model.dropout": [0.0, 0.1][i % 2], "model.depth": [18, 34][i % 2], "optim.name": ["adam", "sgd"][i % 2],
            "optim.lr": 1e-4 * (i + 1), "train.out_dir": f"/out/r{i}", "train.workers": 8,
        })
        for i in range(6)
    ]
    shown = [c.removeprefix("config.") for c in default_columns(runs) if c.startswith("config.")]
    # lr (6 values) first picked, then the 3-valued keys, then the 2-valued ones in params.yaml
    # order; the output folder names each run (last of the differing keys); shown in params order.
    assert shown == ["data.dataset", "data.batch_size", "model.name", "model.hidden", "model.dropout", "optim.lr"]
    # The column index (one stand-in run per shape) picks the same.
    from traceml_ai.runs.column_index import ColumnIndex

    assert ColumnIndex().facts(runs).default == default_columns(runs)
    # With few differing keys a run-naming text key is still shown.
    two = [make_run(f"s{i}", params={"optim.lr": 0.1 * (i + 1), "out": f"/o/{i}"}) for i in range(3)]
    assert [c for c in default_columns(two) if c.startswith("config.")] == ["config.optim.lr", "config.out"]


def test_param_spreads_count_values_as_differing_config_keys_tells_them_apart() -> None:
    from traceml_ai.runs.table import param_spreads

    nan = float("nan")
    runs = [
        make_run("a", params={"n": 1, "f": True, "x": nan, "z": None, "t": "p", "m": 1, "o": "/o/a"}),
        make_run("b", params={"n": 1.0, "f": 1, "x": nan, "t": "q", "m": "1", "o": "/o/b"}),
        make_run("c", params={"n": 1, "f": True, "x": nan, "z": None, "o": "/o/c"}),
    ]
    # n: 1 == 1.0; f: true and 1 differ; x: NaN equals NaN; z: null equals missing; t: p, q and
    # missing; m: a number and a text; o: a text of each run's own (names the runs): lowest.
    assert param_spreads(runs) == {"f": 2, "t": 3, "m": 3, "o": 1}
    assert set(param_spreads(runs)) == set(differing_config_keys(runs))


def _reference_order(runs: list[RunSummary], keys: list[SortKey]) -> list[str]:
    """sort_runs' documented order, written the slow obvious way: compare two runs key by key
    (numbers, then text in natural order, then NaN, then missing; NaN and missing last in both
    directions), the input order breaking full ties."""
    def entry(run: RunSummary, key: SortKey) -> tuple[int, Any]:
        value = cell(run, key.column)
        if value is None or value == "":
            return 3, None
        if isinstance(value, float) and math.isnan(value):
            return 2, None
        if key.column in ("started", "ended", "heartbeat"):
            return 1, format_cell(value)  # a time sorts as its ISO-8601 text (time order)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return 0, value
        return 1, natural_key(format_cell(value))

    def compare(a: tuple[int, RunSummary], b: tuple[int, RunSummary]) -> int:
        for key in keys:
            (ka, va), (kb, vb) = entry(a[1], key), entry(b[1], key)
            if ka != kb:
                return -1 if ka < kb else 1
            if ka in (0, 1) and va != vb:
                less = va < vb
                return (1 if less else -1) if key.descending else (-1 if less else 1)
        return -1 if a[0] < b[0] else 1

    return [r.key for _, r in sorted(enumerate(runs), key=functools.cmp_to_key(compare))]


@pytest.mark.parametrize("numpy_from", [2, 2_000])
@pytest.mark.parametrize("seed", range(4))
def test_multi_key_sort_with_many_ties_matches_the_documented_order(
        seed: int, numpy_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many ties on the first key (a rounded metric of a sweep), later keys mixing numbers, text,
    bools, NaN and missing, ascending and descending: the fast tie handling gives the plain order,
    with numpy (as from 2,000 runs) and without."""
    from traceml_ai.runs import table

    monkeypatch.setattr(table, "_NUMPY_MIN_RUNS", numpy_from)
    rng = random.Random(seed)

    def value() -> Any:
        r = rng.random()
        if r < 0.1:
            return None
        if r < 0.15:
            return float("nan")
        if r < 0.3:
            return rng.choice(["a", "B", "run-10", "run-2", ""])
        if r < 0.4:
            return rng.choice([True, False])
        return rng.choice([1, 2, 3, 2.5, 0.1])

    for _ in range(100):
        runs = [RunSummary(key=f"k{i}", id=f"id{i}", root="r", name=rng.choice(["x", "y", "run-1", "Run-3"]),
                           params={"a": value(), "b": value(), "c": value()}) for i in range(rng.randint(0, 60))]
        keys = [SortKey(column=rng.choice(["config.a", "config.b", "config.c", "name"]),
                        descending=rng.random() < 0.5) for _ in range(rng.randint(1, 4))]
        assert [r.key for r in sort_runs(runs, keys)] == _reference_order(runs, keys), keys


@pytest.mark.parametrize("seed", range(4))
def test_a_key_of_plain_numbers_sorted_with_numpy_gives_the_documented_order(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """From _NUMPY_MIN_RUNS runs a first key whose values are all numbers is sorted with numpy
    (issue 16): ties (0.0 and -0.0, 1 and 1.0), NaN, infinities, ints among floats, both directions,
    ties broken by mixed later keys: the plain order. Numbers with missing values are sorted with
    numpy too, the runs without a value last; a huge int keeps the plain path; either way the order
    is the same."""
    from traceml_ai.runs import table

    monkeypatch.setattr(table, "_NUMPY_MIN_RUNS", 2)
    rng = random.Random(seed)
    firsts: list[list[Any]] = [[0.5, 0.5, 1, 1.0, -0.0, 0.0, NAN, math.inf, -math.inf, 3, 2.25],
                               [0.1, 0.2, 0.3], [NAN], [2**60, 1, 0.5], [1.0, None, 2.0],
                               [None, 0.5, 0.5, NAN, 1, None, -0.0, 0.0], [None, 2**60, 1.0], [None]]
    for _ in range(60):
        pool = rng.choice(firsts)
        runs = [RunSummary(key=f"k{i}", id=f"id{i}", root="r", name=rng.choice(["x", "y", "run-1", "Run-3", "run-10"]),
                           params={"a": rng.choice(pool), "b": rng.choice([1, "b", None, NAN, True, 0.5])})
                for i in range(rng.randint(0, 80))]
        keys = [SortKey("config.a", rng.random() < 0.5)] + [
            SortKey(rng.choice(["config.b", "name"]), rng.random() < 0.5) for _ in range(rng.randint(0, 2))]
        assert [r.key for r in sort_runs(runs, keys)] == _reference_order(runs, keys), keys


@pytest.mark.parametrize("numpy_from", [2, 2_000])
@pytest.mark.parametrize("seed", range(4))
def test_a_time_column_every_run_has_sorts_in_one_pass_with_the_documented_order(
        seed: int, numpy_from: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-started`` (the viewer's first table, issue 16): when every run has the time it is sorted
    in one pass; with equal times, later keys and a run without the time, the order is the plain one."""
    from traceml_ai.runs import table

    monkeypatch.setattr(table, "_NUMPY_MIN_RUNS", numpy_from)
    rng = random.Random(seed)
    stamps = ["2026-11-30T10:15:00Z", "2026-11-30T10:15:00.5Z", "2026-11-30T10:15:00.25Z", "2026-12-01T00:00:00Z"]
    for _ in range(60):
        runs = [make_run(rng.choice(["x", "y", "run-1", "Run-3", "run-10"]) + f"-{i}",
                         started_at=rng.choice(stamps), ended_at=rng.choice([*stamps, None]),
                         params={"b": rng.choice([1, "b", None, NAN, 0.5])})
                for i in range(rng.randint(0, 40))]
        keys = [SortKey(rng.choice(["started", "ended"]), rng.random() < 0.5)] + [
            SortKey(rng.choice(["config.b", "name", "started"]), rng.random() < 0.5) for _ in range(rng.randint(0, 2))]
        assert [r.key for r in sort_runs(runs, keys)] == _reference_order(runs, keys), keys


@pytest.mark.parametrize("seed", range(4))
def test_a_key_of_texts_only_sorts_in_one_pass_with_the_documented_order(seed: int) -> None:
    """A first key whose values are all non-empty texts (the name, a config value every run has as
    text) is sorted as one class in one pass (issue 16): case, digit runs, leading zeros, ties broken
    by later keys, both directions: the plain order."""
    rng = random.Random(seed)
    texts = ["run-1", "Run-1", "run-01", "run-10", "run-2", "b", "B", "a9", "a10", "0", "00", "x 1", "é", "É"]
    for _ in range(60):
        runs = [RunSummary(key=f"k{i}", id=f"id{i}", root="r", name=rng.choice(texts),
                           params={"t": rng.choice(texts), "b": rng.choice([1, "b", None, NAN, True, 0.5])})
                for i in range(rng.randint(0, 60))]
        keys = [SortKey(rng.choice(["name", "config.t"]), rng.random() < 0.5)] + [
            SortKey(rng.choice(["config.b", "name", "config.t"]), rng.random() < 0.5)
            for _ in range(rng.randint(0, 2))]
        assert [r.key for r in sort_runs(runs, keys)] == _reference_order(runs, keys), keys


def test_warming_the_name_keys_changes_no_order() -> None:
    from traceml_ai.runs.table import natural_key, warm_name_keys

    runs = [make_run(name) for name in ["run-10", "Run-3", "run-2", "run-1", "b", "A"]]
    natural_key.cache_clear()
    assert warm_name_keys(runs) == 6
    assert natural_key.cache_info().currsize == 6
    assert names(sort_runs(runs, [SortKey("name")])) == ["A", "b", "run-1", "run-2", "Run-3", "run-10"]
    assert natural_key.cache_info().misses == 6  # (the sort found every key built)


def test_json_lines_are_the_bytes_of_each_row_json_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """``runs ls --json`` writes :func:`json_lines` (issue 16): byte for byte what orjson writes for
    each row_json (NaN and infinity null, tags a list, unicode, quotes and % in column names and
    values, bools, None, warnings), with the group label last, across several chunks."""
    import orjson

    from traceml_ai.runs import table

    monkeypatch.setattr(table, "JSON_LINES_CHUNK", 3)
    runs = [make_run("a", tags=["x", "y"], params={"lr": NAN, "n%d": "50%", "q\"": True}, summary={"acc": math.inf},
                     warnings=["run.json: bad"]),
            make_run("b\u00e9\u2603", params={"lr": 0.1, "opt": "adam"}, best={"val/auc": 0.9}, status="failed"),
            make_run("c", summary={"acc": 1}, params={"lr": -math.inf}),
            make_run("d", params={"n%d": None, "big": 2**62}),
            make_run("e\nline")]
    columns = ["name", "tags", "config.lr", "config.opt", "config.n%d", 'config.q"', "config.big", "summary.acc",
               "run.best.val/auc", "status", "started"]
    for cols in (columns, [], ["tags"]):
        expected = b"".join(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE) for row in rows_json(runs, cols))
        assert b"".join(json_lines(runs, cols)) == expected
        labels = {r.key: f"g{i % 2}" for i, r in enumerate(runs)}
        grouped = []
        for run, row in zip(runs, rows_json(runs, cols), strict=True):
            row["group_by"] = {"column": "config.lr", "label": labels[run.key]}
            grouped.append(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))
        assert b"".join(json_lines(runs, cols, group_by="config.lr", labels=labels)) == b"".join(grouped)
    assert list(json_lines([], ["name"])) == []
    with pytest.raises(ColumnError):
        json_lines(runs, ["bogus"])  # at the call, before any line


def test_rows_json_of_many_runs_is_row_json_of_each() -> None:
    """``runs ls --json`` builds its rows column by column: the same rows as one at a time, NaN and
    infinity as null, tags as a list, a missing value as None, no columns at all too."""
    runs = [make_run("a", tags=["x", "y"], params={"lr": NAN}, summary={"acc": math.inf}),
            make_run("b", params={"lr": 0.1, "opt": "adam"}, best={"val/auc": 0.9}),
            make_run("c", summary={"acc": 1})]
    for cols in (["name", "tags", "config.lr", "config.opt", "summary.acc", "run.best.val/auc", "status"], []):
        assert list(rows_json(runs, cols)) == [row_json(r, cols) for r in runs]
    assert list(rows_json([], ["name"])) == []
    assert next(rows_json(runs, ["config.lr"]))["values"] == {"config.lr": None}
    with pytest.raises(ColumnError):
        rows_json(runs, ["bogus"])  # at the call, before any row
