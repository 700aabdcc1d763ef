"""``traceml bench --scale`` and ``benchmarks/bench_scale.py``: the figures of issue 16 at 1k / 10k /
100k runs, printed (never asserted).

The fake runs of each size are generated once into a cache folder (``<cache>/<N>/runs``, with 10 of
them made running; 100,000 runs take several minutes and ~4 GB) and reused. Every size is measured
in fresh child processes, in CPU seconds (``time.process_time`` / ``getrusage``: the machine this
was written on is a loaded 2-core one, so wall time says little):

- **cold scan**: a store without ``runs.sqlite`` polls every run (parse + ``perf.*`` join);
- **writing runs.sqlite** after that scan (the first ``traceml runs ls`` or viewer poll does it);
- **warm start**: a fresh process (imports included) with ``runs.sqlite`` present and nothing
  changed, up to the viewer's first table answer; then the first poll after it (the check by
  folder stamps, which the viewer runs in the background). The telemetry side's modules (the
  diagnosis, numpy) and the POST routes' request models (pydantic), which ``traceml ui`` imports
  on a background thread once it serves (``traceml_ai.ui.api.TelemetrySide``), are not counted
  there; they are imported before the table figures below;
- **runs ls --json warm**: the command as a user runs it, CPU of the child;
- **no-change poll** (10 running): median of 20 viewer polls, and a poll that re-lists the root
  (every :data:`~traceml_ai.runs.watch.RELIST_EVERY_POLLS`-th);
- **table**: sort by a metric, filter on a config value, group, search (server-side answers);
- **RSS**: the viewer process's peak resident set after the above.

The warm figures (start, polls, table, RSS) and ``runs ls`` are the median of ``--repeat`` children
(default 3): on a virtual machine that reclaims page cache in the background, one warm start at
100,000 runs measured from 2.3 to 3.2 CPU-s (the 1.1 GB runs.sqlite read from disk or from cache).

Before measuring, the bytecode of TraceML's own modules is written (``compileall``), as ``pip
install`` writes it: on a machine with ``PYTHONDONTWRITEBYTECODE`` set and an editable install,
every child would otherwise compile ~140 modules (0.2 CPU-s) and the warm figures would measure a
compile, not a start. The children run without that variable.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_SIZES = (1_000, 10_000, 100_000)
RUNNING = 10


def loaded_above(cores: int) -> float:
    """The 1-minute load average above which a size's figures are reported as measured on a shared
    machine: the benchmark keeps about one core busy, so 1 + a quarter of the cores (1.5 on 2)."""
    return 1 + cores / 4


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/traceml-bench-scale`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "traceml-bench-scale"


def ensure_runs(cache: Path, size: int, log: Callable[[str], None]) -> Path:
    """The root of ``size`` fake runs under ``cache``, generated once (seed 0), 10 made running."""
    from traceml_ai.cli.bench import _make_running
    from traceml_ai.runs.fake import generate

    folder = cache / str(size)
    root = folder / "runs"
    done = folder / "complete"  # beside the root, never inside it
    if done.exists():
        return root
    log(f"generating {size:,} runs into {root} (once; reused by later runs of the benchmark)")
    t = time.perf_counter()
    written = generate(root, runs=size, seed=0, clean=root.exists())
    _make_running(written, RUNNING)
    done.write_text(f"{len(written)}\n")
    log(f"  {len(written):,} runs in {time.perf_counter() - t:.0f} s")
    return root


def _cpu() -> float:
    return time.process_time()


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _cpu_of(fn: Callable[[], object]) -> float:
    t = _cpu()
    fn()
    return _cpu() - t


def child_cold(root: str, cache_dir: str) -> dict[str, Any]:
    """Cold scan without runs.sqlite (as ``open_warm`` does it), then writing runs.sqlite."""
    from traceml_ai.diagnose.perf import PerfIndex
    from traceml_ai.runs.store import RunStore
    from traceml_ai.ui.cache import CacheFolder
    from traceml_ai.ui.perf import join_perf
    from traceml_ai.ui.warm import bulk_load

    db = Path(cache_dir) / "runs.sqlite"
    if db.exists():
        db.unlink()
    store = RunStore([root])
    t, w = _cpu(), time.perf_counter()
    with bulk_load():
        store.poll()
        join_perf(store, PerfIndex())
    scan, scan_wall = _cpu() - t, time.perf_counter() - w
    t, w = _cpu(), time.perf_counter()
    saved = CacheFolder(cache_dir, roots=[root]).save_run_db(store.runs(), store.stamps(), force=True)
    write, write_wall = _cpu() - t, time.perf_counter() - w
    return {"cold_scan": scan, "cold_scan_wall": scan_wall, "cold_ls": scan + write,
            "cold_ls_wall": scan_wall + write_wall, "db_write": write, "runs": len(store.runs()),
            "db_written": saved is not None, "db_mb": os.path.getsize(db) / 1e6 if db.exists() else 0.0}


def child_warm(root: str, cache_dir: str, started: float) -> dict[str, Any]:
    """A viewer started from runs.sqlite: first table answer, first poll, no-change polls, table."""
    import traceml_ai.ui.api  # noqa: F401  (what `traceml ui` imports: the same start)
    from traceml_ai.runs.store import RunStore
    from traceml_ai.ui.cache import CacheFolder
    from traceml_ai.ui.service import Viewer

    store = RunStore([root])
    viewer = Viewer(store, CacheFolder(cache_dir, roots=[root]))
    viewer.start()
    first = viewer.table_payload()
    start_cpu, start_wall = _self_cpu(), time.time() - started
    seeded = len(store.runs())
    first_poll = _cpu_of(viewer.poll)
    # What `traceml ui` does in the background once it serves (TelemetrySide.prepare): the table
    # answers below then find numpy imported, as a user's first sort does.
    from traceml_ai.ui.api import TelemetrySide

    TelemetrySide().prepare_now()
    polls = [_cpu_of(viewer.poll) for _ in range(20)]
    store._watch.relist_every = 1  # every poll lists the root again: the every-12th-poll cost
    relists = [_cpu_of(viewer.poll) for _ in range(5)]
    store._watch.relist_every = 12
    metric = "run.last.val/auc"
    table = {
        "sort": _cpu_of(lambda: viewer.table_payload(sorts=[f"-{metric}", "name"])),
        "filter": _cpu_of(lambda: viewer.table_payload(filters=["config.optim.lr>0.001"])),
        "group": _cpu_of(lambda: viewer.table_payload(group="config.model.name")),
        "search": _cpu_of(lambda: viewer.table_payload(search="base")),
    }
    # A save after 10 runs changed (the viewer saves at most every 10 s while runs change): only
    # those are rewritten, in the file. Undone by a second save, so the cached runs stay as generated.
    runs = store.runs()
    changed = runs[:10]
    before = [r.notes for r in changed]
    for r in changed:
        r.notes += " (bench)"
    keys = [r.key for r in changed]
    folder = viewer.cache
    assert folder is not None
    index = viewer._columns  # the viewer's own column index, as its saves pass it
    save = _cpu_of(lambda: folder.save_run_db(runs, store.stamps(), force=True, changed=keys, columns=index))
    for r, notes in zip(changed, before, strict=True):
        r.notes = notes
    folder.save_run_db(runs, store.stamps(), force=True, changed=keys, columns=index)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "warm_start": start_cpu, "warm_start_wall": start_wall, "seeded": seeded,
        "first_rows": len(first["keys"]),
        "warm_first_poll": first_poll,
        "poll_median": statistics.median(polls), "poll_max": max(polls),
        "poll_relist": statistics.median(relists),
        "unfinished": len(store.unfinished()),
        "table": table, "rss_mb": rss, "save_10": save,
    }


def _ls_warm(root: str, cache_dir: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    w = time.perf_counter()
    env = _child_env(TRACEML_CACHE_DIR=cache_dir)
    subprocess.run([sys.executable, "-m", "traceml_ai", "runs", "ls", root, "--json"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), time.perf_counter() - w


def _child(kind: str, root: str, cache_dir: str) -> dict[str, Any]:
    code = (
        "import json, sys, time; started = time.time()\n"
        "from traceml_ai.cli import bench_scale as b\n"
        f"r = b.child_{kind}(sys.argv[1], sys.argv[2]{', started' if kind == 'warm' else ''})\n"
        "print('BENCH ' + json.dumps(r))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, root, cache_dir], capture_output=True, text=True,
                          check=False, env=_child_env())
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH "):
            result: dict[str, Any] = json.loads(line[6:])
            return result
    raise RuntimeError(f"benchmark child {kind} failed: {proc.stderr.strip()[-500:]}")


def _child_env(**extra: str) -> dict[str, str]:
    """The children's environment: this one without ``PYTHONDONTWRITEBYTECODE`` (module doc)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


def compile_bytecode() -> None:
    """Write the bytecode of the ``traceml_ai`` package where it is missing or stale (module doc)."""
    import compileall

    import traceml_ai

    compileall.compile_dir(os.path.dirname(traceml_ai.__file__), quiet=2)


def measure(size: int, cache: Path, log: Callable[[str], None], *, repeat: int = 1) -> dict[str, Any]:
    """Every figure for one size (fresh child processes). The warm figures and ``runs ls`` are the
    median of ``repeat`` children each; the cold scan runs once (it deletes and rewrites
    runs.sqlite: most of a minute at 100,000 runs)."""
    root = str(ensure_runs(cache, size, log))
    cache_dir = str(cache / str(size) / "cache")
    log(f"measuring {size:,} runs" + (f" (warm figures: median of {repeat})" if repeat > 1 else ""))
    loads = [os.getloadavg()[0]]
    figures = _child("cold", root, cache_dir)
    loads.append(os.getloadavg()[0])
    figures.update(median_figures([_child("warm", root, cache_dir) for _ in range(repeat)]))
    loads.append(os.getloadavg()[0])
    ls = [_ls_warm(root, cache_dir) for _ in range(repeat)]
    loads.append(os.getloadavg()[0])
    figures["ls_warm"] = statistics.median(cpu for cpu, _ in ls)
    figures["ls_warm_wall"] = statistics.median(wall for _, wall in ls)
    # The benchmark itself keeps about one core busy: a higher load means other work shared the
    # machine (its caches, its memory bandwidth) and the figures above are not this one's alone.
    figures["load_max"] = max(loads)
    if max(loads) > loaded_above(os.cpu_count() or 1):
        log(f"  note: load average reached {max(loads):.1f} while measuring {size:,} runs: other work "
            "shared the machine; measure again on a quiet one")
    return figures


def median_figures(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number across ``results`` (dicts of the same shape; nested dicts figure
    by figure); a value that is not a number is the first result's.

    >>> median_figures([{"a": 1, "t": {"s": 5}}, {"a": 9, "t": {"s": 1}}, {"a": 2, "t": {"s": 3}}])
    {'a': 2, 't': {'s': 3}}
    """
    first = results[0]
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, dict):
            out[key] = median_figures([r[key] for r in results])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in results)
        else:
            out[key] = value
    return out


ROWS: tuple[tuple[str, Callable[[dict[str, Any]], float], str], ...] = (
    ("cold scan (no runs.sqlite), CPU s", lambda f: f["cold_scan"], "s"),
    ("cold scan, wall s (file reads from disk show here)", lambda f: f["cold_scan_wall"], "s"),
    ("writing runs.sqlite after it, CPU s", lambda f: f["db_write"], "s"),
    ("warm start to first table answer, CPU s", lambda f: f["warm_start"], "s"),
    ("first poll after a warm start, CPU s", lambda f: f["warm_first_poll"], "s"),
    ("runs ls --json warm, CPU s", lambda f: f["ls_warm"], "s"),
    ("runs ls --json warm, wall s", lambda f: f["ls_warm_wall"], "s"),
    ("no-change poll (10 running), CPU ms", lambda f: f["poll_median"] * 1e3, "ms"),
    ("runs.sqlite save, 10 runs changed, CPU ms", lambda f: f["save_10"] * 1e3, "ms"),
    ("poll that re-lists the root (1 in 12), CPU ms", lambda f: f["poll_relist"] * 1e3, "ms"),
    ("table sort (metric desc, name), CPU ms", lambda f: f["table"]["sort"] * 1e3, "ms"),
    ("table filter (config range), CPU ms", lambda f: f["table"]["filter"] * 1e3, "ms"),
    ("table group (config value), CPU ms", lambda f: f["table"]["group"] * 1e3, "ms"),
    ("table search (text), CPU ms", lambda f: f["table"]["search"] * 1e3, "ms"),
    ("viewer RSS, MB", lambda f: f["rss_mb"], "MB"),
    ("load average (1 min), highest while measured", lambda f: f["load_max"], ""),
    ("runs.sqlite size, MB", lambda f: f["db_mb"], "MB"),
)


def report(results: dict[int, dict[str, Any]]) -> list[list[str]]:
    """The table: one row per figure, one column per size, then the ratio of the two largest."""
    sizes = sorted(results)
    out = []
    for label, get, unit in ROWS:
        values = [get(results[n]) for n in sizes]
        row = [label, *(f"{v:.3g}" if v < 100 else f"{v:.0f}" for v in values)]
        if len(values) >= 2:  # (a figure without a unit, the load, has no meaningful ratio)
            row.append(f"{values[-1] / values[-2]:.1f}×" if values[-2] > 0 and unit else "")
        out.append(row)
    return out


def run(sizes: Sequence[int], cache: Path, log: Callable[[str], None], *, repeat: int = 1
        ) -> tuple[list[int], list[list[str]]]:
    """Measure ``sizes`` (warm figures: the median of ``repeat`` children) and return ``(sizes, table
    rows)``."""
    compile_bytecode()
    results = {n: measure(n, cache, log, repeat=repeat) for n in sizes}
    return sorted(results), report(results)


__all__ = ["DEFAULT_SIZES", "default_cache", "ensure_runs", "measure", "median_figures", "report", "run"]
