"""``traceml bench``: the run-folder figures of issue 2, measured on this machine.

1. cold scan: a new :class:`RunStore` polls a root of N fake runs (plus one big run);
2. no-change poll with 10 running runs;
3. first load of a metrics.jsonl of L lines (:class:`MetricsTail`);
4. an unchanged re-poll of it.

Each figure is the median of several repeats; the page cache is warm (what "cold" means here is a
store with an empty parse cache, as when the viewer starts without its run database).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.table import Table

from traceml_ai.cli.common import one_line_errors, out
from traceml_ai.runs.fake import generate
from traceml_ai.runs.layout import METRICS_JSONL, RUN_JSON
from traceml_ai.runs.metrics_tail import MetricsTail
from traceml_ai.runs.store import RunStore
from traceml_ai.runs.writer import atomic_write, dump_json, iso_utc


def _median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
        del result  # freeing what was built is not part of the figure
    return statistics.median(times)


def _make_running(run_dirs: list[Path], count: int) -> None:
    """Turn ``count`` finished runs into running ones with a fresh heartbeat."""
    done = 0
    for d in run_dirs:
        path = d / RUN_JSON
        if done == count or not path.exists():
            continue
        meta = orjson.loads(path.read_bytes())
        if meta.get("status") != "completed":
            continue
        meta.update(status="running", ended_at=None, duration_s=None, exit=None, heartbeat_at=iso_utc(time.time()))
        atomic_write(path, dump_json(meta))
        done += 1


@one_line_errors
def bench(
    runs: Annotated[int, typer.Option(min=1, help="Fake runs in the scanned root.")] = 1000,
    lines: Annotated[int, typer.Option(min=1, help="Lines of the big metrics.jsonl.")] = 200_000,
    repeat: Annotated[int | None, typer.Option(
        min=1, help="Repeats per figure (median reported); default 5, with --scale 3 (the warm figures).")] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Where to write the fake runs (default: a temporary folder).")
    ] = None,
    scale: Annotated[
        bool, typer.Option("--scale", help="The scale figures instead (issue 16): 1k / 10k / 100k runs.")
    ] = False,
    sizes: Annotated[
        str, typer.Option(metavar="N,...", help="With --scale: the run counts to measure.")
    ] = "1000,10000,100000",
    cache: Annotated[
        Path | None, typer.Option(help="With --scale: where the generated runs are kept between runs "
                                       "(default: $XDG_CACHE_HOME/traceml-bench-scale).")
    ] = None,
) -> None:
    """Measure the run store: cold scan, no-change poll, first history load, unchanged re-poll.

    Example: traceml bench --runs 1000 --lines 200000

    Example: traceml bench --scale --sizes 1000,10000
    """
    if scale:
        _bench_scale(sizes, cache, 3 if repeat is None else repeat)
        return
    repeat = 5 if repeat is None else repeat
    with tempfile.TemporaryDirectory(prefix="traceml-bench-", dir=workdir) as tmp:
        root = Path(tmp) / "runs"
        t = time.perf_counter()
        written = generate(root, runs=runs, seed=0, big_run_lines=lines)
        _make_running(written, 10)
        out.print(f"wrote {len(written)} runs ({runs} + big-run) in {time.perf_counter() - t:.1f} s to {root}")
        big = next(p for p in written if p.name.split("_")[1:2] == ["big-run"])
        big_file = big / METRICS_JSONL
        size_mb = os.path.getsize(big_file) / 1e6

        cold = _median_time(lambda: RunStore([root]).poll(), repeat)
        store = RunStore([root])
        first = store.poll()
        running = sum(1 for r in store.runs() if r.status == "running")
        poll = _median_time(store.poll, max(repeat, 20))
        assert not store.poll().changed, "a no-change poll reported changes"

        def first_load() -> MetricsTail:
            tail = MetricsTail(big_file)
            tail.advance()
            return tail

        load = _median_time(first_load, repeat)
        tail = first_load()
        repoll = _median_time(tail.advance, max(repeat, 50))

    table = Table(title=f"run store on {os.cpu_count()} cores", title_justify="left", header_style="bold")
    for col in ("figure", "measured", "target", ""):
        table.add_column(col, justify="right" if col in ("measured", "target") else "left")
    rows = [
        (f"cold scan of {len(first.changed)} run folders ({runs} fake + big-run)", cold, 0.5),
        (f"no-change poll ({running} running: 10 made running + stale-run)", poll, 0.010),
        (f"first load of {len(tail.rows):,}-line metrics.jsonl ({size_mb:.1f} MB)", load, 0.35),
        ("unchanged re-poll of it", repoll, 0.001),
    ]
    for label, value, target in rows:
        ok = "[green]ok[/]" if value <= target else "[red]over[/]"
        table.add_row(label, _fmt(value), _fmt(target), ok)
    out.print(table)


def _bench_scale(sizes: str, cache: Path | None, repeat: int) -> None:
    from traceml_ai.cli import bench_scale
    from traceml_ai.cli.common import UsageError

    try:
        counts = [int(n) for n in sizes.split(",") if n.strip()]
    except ValueError:
        raise UsageError(f"--sizes takes run counts separated by commas, e.g. 1000,10000; got {sizes!r}") from None
    if not counts or min(counts) < 1:
        raise UsageError("--sizes needs at least one run count of 1 or more")
    folder = cache or bench_scale.default_cache()
    shown, rows = bench_scale.run(counts, folder, lambda line: out.print(line, style="dim"), repeat=repeat)
    table = Table(title=f"scale on {os.cpu_count()} cores (CPU time)", title_justify="left", header_style="bold")
    table.add_column("figure")
    for n in shown:
        table.add_column(f"{n:,} runs", justify="right")
    if len(shown) >= 2:
        table.add_column(f"{shown[-1] // 1000}k/{shown[-2] // 1000}k" if shown[-2] >= 1000 else "ratio",
                         justify="right")
    for row in rows:
        table.add_row(*row)
    out.print(table)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 0.1 else f"{seconds:.3f} s"
