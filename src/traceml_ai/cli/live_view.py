"""The live terminal view of ``traceml run`` / ``traceml watch`` (``--mode cli``).

Every second it reads the run's ``aggregator/telemetry.sqlite`` read-only (the aggregator is its
only writer) and draws, with Rich: the step-time breakdown over the last steps (per phase: the
median rank's and the worst rank's median, and the skew between ranks), memory, CPU/GPU, and the
last lines of the training's output. The training's output itself is printed above the view, line
by line, unchanged.

A phase's time in one step is its GPU time when measured, else its CPU wall time (DESIGN §3.1).
The bold last row is the *iteration* and *other* the part of it no built-in phase covers, both as the
diagnoses define them (docs/diagnoses.md, :mod:`traceml_ai.diagnose.timeline`). The *worst rank* is
the one with the longest work outside backward (iteration − backward): under DDP every rank waits for
the slowest in backward's all-reduce, so their iterations are equal and only this shows the
straggler; without a backward phase it is the rank with the longest iteration.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from traceml_ai.cli.common import fmt_duration, printable
from traceml_ai.diagnose.timeline import INNER_PHASES, OTHER, iteration_ms
from traceml_ai.launcher.launch import Tick
from traceml_ai.telemetry.schema import BACKWARD, BUILTIN_PHASES, PHASE_PREFIX, STEP
from traceml_ai.telemetry.sqlite import read_only_uri

RECENT_STEPS = 50
"""Steps per rank the breakdown is computed over."""
PHASE_ORDER = [p for p in BUILTIN_PHASES if p != STEP]
ITERATION = "iteration"
# Derived per-step values sit in the same map as the events under keys starting with NUL, which no
# phase or trace_region name from a real script carries.
_ITERATION_KEY = "\x00iteration"
_OTHER_KEY = "\x00other"
_OUTSIDE_BACKWARD_KEY = "\x00outside_backward"


def phase_ms(stats_by_device: Any) -> float | None:
    """One phase's time in one step, in ms: the sum over devices of GPU time when measured, else CPU time."""
    if not isinstance(stats_by_device, dict):
        return None
    total = 0.0
    seen = False
    for stats in stats_by_device.values():
        if not isinstance(stats, dict):
            continue
        value = stats.get("gpu_ms") if stats.get("gpu_ms") is not None else stats.get("cpu_ms")
        if isinstance(value, (int, float)):
            total += float(value)
            seen = True
    return total if seen else None


class TelemetrySnapshot:
    """Incremental read-only reader of the tables the live view shows."""

    def __init__(self, db_path: Path) -> None:
        self.db_path = db_path
        self._conn: sqlite3.Connection | None = None
        self._last_step_id = 0
        self.steps: dict[int, deque[tuple[int, dict[str, float]]]] = defaultdict(lambda: deque(maxlen=RECENT_STEPS))
        self.last_step: dict[int, int] = {}
        self.process: dict[int, tuple[float | None, float | None]] = {}
        self.system: dict[str, Any] = {}
        self.gpus: list[dict[str, Any]] = []
        self.peaks: dict[tuple[int, str], float | None] = {}
        self.error: str | None = None

    def _connect(self) -> sqlite3.Connection | None:
        if self._conn is None:
            if not self.db_path.exists():
                return None
            self._conn = sqlite3.connect(read_only_uri(self.db_path), uri=True, timeout=0.2)
        return self._conn

    def refresh(self) -> None:
        try:
            conn = self._connect()
            if conn is None:
                return
            self._read(conn)
            self.error = None
        except sqlite3.Error as exc:
            # Tables appear when the first rows arrive; a busy moment is retried next second.
            self.error = str(exc)
            if self._conn is not None and "no such table" not in str(exc):
                self._conn.close()
                self._conn = None

    def _read(self, conn: sqlite3.Connection) -> None:
        rows = conn.execute(
            "SELECT id, global_rank, step, events_json FROM step_time_samples WHERE id > ? ORDER BY id LIMIT 20000",
            (self._last_step_id,),
        ).fetchall()
        for row_id, rank, step, events_json in rows:
            self._last_step_id = row_id
            if rank is None or step is None:
                continue
            try:
                events = orjson.loads(events_json or "{}")
            except orjson.JSONDecodeError:
                continue
            phases = {name: ms for name, stats in events.items() if (ms := phase_ms(stats)) is not None}
            iteration, _ = iteration_ms(phases)
            if iteration is not None:
                phases[_ITERATION_KEY] = iteration
                attributed = [v for p in INNER_PHASES if (v := phases.get(p)) is not None]
                if attributed:
                    phases[_OTHER_KEY] = max(0.0, iteration - sum(attributed))
                    if BACKWARD in phases:
                        phases[_OUTSIDE_BACKWARD_KEY] = iteration - phases[BACKWARD]
            self.steps[rank].append((step, phases))
            self.last_step[rank] = max(step, self.last_step.get(rank, step))
        for rank, rss, cpu in conn.execute(
            "SELECT global_rank, ram_used_bytes, cpu_percent FROM process_samples "
            "WHERE id IN (SELECT MAX(id) FROM process_samples GROUP BY global_rank)"
        ):
            self.process[rank] = (rss, cpu)
        sys_row = conn.execute(
            "SELECT seq, global_rank, cpu_percent, ram_used_bytes, ram_total_bytes FROM system_samples "
            "ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if sys_row:
            seq, rank, cpu, used, total = sys_row
            self.system = {"cpu_percent": cpu, "ram_used_bytes": used, "ram_total_bytes": total}
            self.gpus = [
                {"gpu_idx": g, "util": u, "mem_used_bytes": mu, "mem_total_bytes": mt}
                for g, u, mu, mt in conn.execute(
                    "SELECT gpu_idx, util, mem_used_bytes, mem_total_bytes FROM system_gpu_samples "
                    "WHERE seq = ? AND global_rank IS ? ORDER BY gpu_idx", (seq, rank)
                )
            ]
        for rank, device, peak in conn.execute(
            "SELECT global_rank, device, peak_alloc_bytes FROM step_memory_samples "
            "WHERE id IN (SELECT MAX(id) FROM step_memory_samples GROUP BY global_rank, device)"
        ):
            self.peaks[(rank, device)] = peak

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.1f} ms" if v < 1000 else f"{v / 1000:.2f} s"


def _fmt_bytes(v: float | None) -> str:
    if v is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(v) < 1024 or unit == "TB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} TB"


def breakdown_table(snap: TelemetrySnapshot) -> Table | Text:
    """Per phase: median over the last steps for the median rank and the worst rank, and the skew."""
    per_rank: dict[int, dict[str, float]] = {}
    for rank, steps in snap.steps.items():
        by_phase: dict[str, list[float]] = defaultdict(list)
        for _, phases in steps:
            for name, ms in phases.items():
                by_phase[name].append(ms)
        per_rank[rank] = {name: statistics.median(vals) for name, vals in by_phase.items()}
    if not per_rank:
        return Text("step time: no steps yet (wrap your step in traceml_ai.trace_step(model))", style="dim")
    ranks_by_step = sorted(per_rank, key=lambda r: per_rank[r].get(_ITERATION_KEY, 0.0))
    median_rank = ranks_by_step[(len(ranks_by_step) - 1) // 2]
    # The straggler: the most work outside backward when every rank measured backward (see module docs).
    if all(_OUTSIDE_BACKWARD_KEY in phases for phases in per_rank.values()):
        worst_rank = max(per_rank, key=lambda r: per_rank[r][_OUTSIDE_BACKWARD_KEY])
    else:
        worst_rank = ranks_by_step[-1]
    table = Table(title=f"step time · last {RECENT_STEPS} steps · {len(per_rank)} rank(s)", title_justify="left",
                  expand=False, pad_edge=False)
    table.add_column("phase")
    table.add_column(f"median rank ({median_rank})", justify="right")
    table.add_column(f"worst rank ({worst_rank})", justify="right")
    table.add_column("share", justify="right")
    table.add_column("skew", justify="right")
    user = sorted({n for phases in per_rank.values() for n in phases
                   if not n.startswith(PHASE_PREFIX) and not n.startswith("\x00")})
    step_median = per_rank[median_rank].get(_ITERATION_KEY)
    for name in [*PHASE_ORDER, _OTHER_KEY, *user, _ITERATION_KEY]:
        values = [per_rank[r][name] for r in per_rank if name in per_rank[r]]
        if not values:
            continue
        mid = per_rank[median_rank].get(name)
        worst = per_rank[worst_rank].get(name)
        is_total = name == _ITERATION_KEY
        share = f"{100 * mid / step_median:.0f}%" if mid is not None and step_median and not is_total else ""
        med_all = statistics.median(values)
        skew = f"{max(values) / med_all:.2f}x" if len(values) > 1 and med_all > 0 else ""
        label = {_ITERATION_KEY: ITERATION, _OTHER_KEY: OTHER}.get(name, name)
        label = label[len(PHASE_PREFIX):] if label.startswith(PHASE_PREFIX) else label
        table.add_row(escape(printable(label)), _fmt_ms(mid), _fmt_ms(worst), share, skew,
                      style="bold" if is_total else "dim" if name == _OTHER_KEY else None)
    return table


def resources_table(snap: TelemetrySnapshot) -> Table:
    table = Table(title="memory and CPU/GPU", title_justify="left", expand=False, pad_edge=False, show_header=False)
    table.add_column("what")
    table.add_column("value")
    if snap.process:
        rss = [v[0] for v in snap.process.values() if v[0] is not None]
        cpu = [v[1] for v in snap.process.values() if v[1] is not None]
        if rss:
            table.add_row("process RSS", f"{_fmt_bytes(min(rss))} – {_fmt_bytes(max(rss))}" if len(rss) > 1
                          else _fmt_bytes(rss[0]))
        if cpu:
            table.add_row("process CPU", " ".join(f"{c:.0f}%" for c in cpu))
    peaks = [p for p in snap.peaks.values() if p is not None]
    if peaks:
        table.add_row("peak allocated (step)", _fmt_bytes(max(peaks)))
    if snap.system:
        s = snap.system
        cpu_text = "—" if s.get("cpu_percent") is None else f"{s['cpu_percent']:.0f}%"
        table.add_row("host CPU", cpu_text)
        table.add_row("host RAM", f"{_fmt_bytes(s.get('ram_used_bytes'))} / {_fmt_bytes(s.get('ram_total_bytes'))}")
    for g in snap.gpus:
        util = "—" if g["util"] is None else f"{g['util']:.0f}%"
        table.add_row(f"GPU {g['gpu_idx']}", f"{util} · {_fmt_bytes(g['mem_used_bytes'])} / "
                                             f"{_fmt_bytes(g['mem_total_bytes'])}")
    if not snap.system and not snap.process:
        table.add_row("", Text("no samples yet", style="dim"))
    return table


class LiveView:
    """Draws the live view while a launched training runs; prints its output above the view.

    Use ``on_output`` and ``on_tick`` as the callbacks of :func:`traceml_ai.launcher.launch.launch`.
    """

    def __init__(self, console: Console, title: str) -> None:
        self.console = console
        self.title = title
        self.snapshot: TelemetrySnapshot | None = None
        self._live = Live(console=console, refresh_per_second=2, transient=False, auto_refresh=False)
        self._started = False
        self._last_read = 0.0
        self._tick: Tick | None = None

    def on_output(self, stream: str, line: str) -> None:
        self.console.print(Text(line, style="red" if stream == "stderr" else ""), soft_wrap=True)

    def on_tick(self, tick: Tick) -> None:
        self._tick = tick
        if not self._started:
            self._live.start()
            self._started = True
        now = time.monotonic()
        if tick.run_dir is not None and now - self._last_read >= 1.0:
            if self.snapshot is None:
                self.snapshot = TelemetrySnapshot(tick.run_dir / "aggregator" / "telemetry.sqlite")
            self.snapshot.refresh()
            self._last_read = now
        self._live.update(self.render(), refresh=True)

    def render(self) -> RenderableType:
        parts: list[RenderableType] = []
        tick = self._tick
        elapsed = fmt_duration(time.time() - tick.started) if tick else ""
        state = "" if tick is None or tick.aggregator_alive else " · [yellow]telemetry degraded[/]"
        steps = ""
        if self.snapshot and self.snapshot.last_step:
            steps = f" · step {max(self.snapshot.last_step.values())}"
        parts.append(Text.from_markup(f"[bold]TraceML[/] {escape(self.title)} · {elapsed}{steps}{state}"))
        if self.snapshot is not None:
            parts.append(breakdown_table(self.snapshot))
            parts.append(resources_table(self.snapshot))
        return Group(*parts)

    def stop(self) -> None:
        if self._started:
            self._live.stop()
        if self.snapshot is not None:
            self.snapshot.close()
