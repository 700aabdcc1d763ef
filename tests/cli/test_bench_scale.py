"""`traceml bench --scale` prints every figure of issue 16 for each size, with the ratio of the two
largest, and generates each size only once."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_traceml


def test_bench_scale_prints_every_figure_and_reuses_the_generated_runs(tmp_path: Path) -> None:
    cache = tmp_path / "bench-cache"
    proc = run_traceml("bench", "--scale", "--sizes", "30,60", "--repeat", "2", "--cache", str(cache),
                       env={"COLUMNS": "220"})
    assert proc.returncode == 0, proc.stderr
    assert "measuring 60 runs (warm figures: median of 2)" in proc.stdout
    for figure in ("cold scan", "writing runs.sqlite", "warm start to first table answer", "runs ls --json warm",
                   "no-change poll (10 running)", "re-lists the root", "table sort", "table filter",
                   "table group", "table search", "viewer RSS", "runs.sqlite size", "load average", "cold scan, wall s",
                   "runs ls --json warm, wall s"):
        assert figure in proc.stdout, figure
    assert "30 runs" in proc.stdout and "60 runs" in proc.stdout and "ratio" in proc.stdout
    assert proc.stdout.count("generating") == 2
    assert (cache / "60" / "complete").read_text().strip() == "60"
    again = run_traceml("bench", "--scale", "--sizes", "30", "--repeat", "1", "--cache", str(cache),
                        env={"COLUMNS": "220"})
    assert again.returncode == 0, again.stderr
    assert "generating" not in again.stdout


def test_bench_scale_refuses_sizes_that_are_not_counts(tmp_path: Path) -> None:
    proc = run_traceml("bench", "--scale", "--sizes", "10k", "--cache", str(tmp_path))
    assert proc.returncode == 2 and "--sizes" in proc.stderr


def test_median_figures_takes_each_figure_s_median_across_children() -> None:
    from traceml_ai.cli.bench_scale import median_figures

    children = [{"warm_start": 3.2, "table": {"sort": 0.4}, "runs": 10},
                {"warm_start": 2.3, "table": {"sort": 0.6}, "runs": 10},
                {"warm_start": 2.6, "table": {"sort": 0.5}, "runs": 10}]
    assert median_figures(children) == {"warm_start": 2.6, "table": {"sort": 0.5}, "runs": 10}
