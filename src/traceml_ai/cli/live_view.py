"""The live terminal view of ``traceml run`` / ``traceml watch`` (``--mode cli``).

Every second it reads the run's ``aggregator/telemetry.sqlite`` read-only (the aggregator is its
only writer) and draws, with Rich: the step-time breakdown over the last steps (per phase: the
median rank's and the worst rank's median, and the skew between ranks), memory, CPU/GPU, and the
last lines of the training's output. The training's output itself is printed above the view, line
by line, unchanged.

Everything shown is read and computed by :mod:`traceml_ai.diagnose.live` (the one reader of the
telemetry tables besides :func:`traceml_ai.diagnose.read_telemetry`, with the same phase arithmetic:
GPU time when measured, else CPU wall time, else the legacy ``duration_ms``). The bold last row is the
*iteration* and *other* the part of it no built-in phase covers, both as the diagnoses define them
(docs/diagnoses.md, :mod:`traceml_ai.diagnose.timeline`). The *worst rank* is the one with the longest
work outside backward (iteration − backward, the straggler rule's measure): under DDP every rank waits
for the slowest in backward's all-reduce, so their iterations are equal and only this shows the
straggler; without a backward phase it is the rank with the longest iteration.
"""

from __future__ import annotations

import time

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from traceml_ai.cli.common import fmt_bytes, fmt_duration, printable
from traceml_ai.diagnose.live import OTHER, RECENT_STEPS, TelemetryTail
from traceml_ai.diagnose.summary import telemetry_path
from traceml_ai.diagnose.timeline import ITERATION
from traceml_ai.launcher.launch import Tick
from traceml_ai.telemetry.schema import PHASE_PREFIX

TelemetrySnapshot = TelemetryTail
"""The view's reader of the telemetry tables (:class:`traceml_ai.diagnose.live.TelemetryTail`)."""


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.1f} ms" if v < 1000 else f"{v / 1000:.2f} s"


def _fmt_bytes(v: float | None) -> str:
    return fmt_bytes(v, missing="—")


def breakdown_table(snap: TelemetryTail) -> Table | Text:
    """Per phase: median over the last steps for the median rank and the worst rank, and the skew
    (:func:`traceml_ai.diagnose.live.recent_breakdown`)."""
    bd = snap.breakdown()
    if bd is None:
        return Text("step time: no steps yet (wrap your step in traceml_ai.trace_step(model))", style="dim")
    table = Table(title=f"step time · last {RECENT_STEPS} steps · {bd.ranks} rank(s)", title_justify="left",
                  expand=False, pad_edge=False)
    table.add_column("phase")
    table.add_column(f"median rank ({_rank_text(bd.median_rank)})", justify="right")
    table.add_column(f"worst rank ({_rank_text(bd.worst_rank)})", justify="right")
    table.add_column("share", justify="right")
    table.add_column("skew", justify="right")
    for row in bd.rows:
        share = "" if row.share is None else f"{100 * row.share:.0f}%"
        skew = "" if row.skew is None else f"{row.skew:.2f}x"
        label = row.name[len(PHASE_PREFIX):] if row.name.startswith(PHASE_PREFIX) else row.name
        table.add_row(escape(printable(label)), _fmt_ms(row.median_rank_ms), _fmt_ms(row.worst_rank_ms), share,
                      skew, style="bold" if row.name == ITERATION else "dim" if row.name == OTHER else None)
    return table


def _rank_text(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


def resources_table(snap: TelemetryTail) -> Table:
    """Each rank's newest RSS and CPU, the newest step's peak allocated memory, host CPU/RAM, GPUs."""
    table = Table(title="memory and CPU/GPU", title_justify="left", expand=False, pad_edge=False, show_header=False)
    table.add_column("what")
    table.add_column("value")
    if snap.process:
        rss = [p.rss_bytes for p in snap.process.values() if p.rss_bytes is not None]
        cpu = [p.cpu_percent for p in snap.process.values() if p.cpu_percent is not None]
        if rss:
            table.add_row("process RSS", f"{_fmt_bytes(min(rss))} – {_fmt_bytes(max(rss))}" if len(rss) > 1
                          else _fmt_bytes(rss[0]))
        if cpu:
            table.add_row("process CPU", " ".join(f"{c:.0f}%" for c in cpu))
    peaks = [p for p in snap.peaks.values() if p is not None]
    if peaks:
        table.add_row("peak allocated (step)", _fmt_bytes(max(peaks)))
    s = snap.system
    if s is not None:
        table.add_row("host CPU", "—" if s.cpu_percent is None else f"{s.cpu_percent:.0f}%")
        table.add_row("host RAM", f"{_fmt_bytes(s.ram_used_bytes)} / {_fmt_bytes(s.ram_total_bytes)}")
    for g in snap.gpus:
        util = "—" if g.util is None else f"{g.util:.0f}%"
        table.add_row(f"GPU {g.gpu_idx}", f"{util} · {_fmt_bytes(g.mem_used_bytes)} / {_fmt_bytes(g.mem_total_bytes)}")
    if s is None and not snap.process:
        table.add_row("", Text("no samples yet", style="dim"))
    return table


class LiveView:
    """Draws the live view while a launched training runs; prints its output above the view.

    Use ``on_output`` and ``on_tick`` as the callbacks of :func:`traceml_ai.launcher.launch.launch`.
    """

    def __init__(self, console: Console, title: str) -> None:
        self.console = console
        self.title = title
        self.snapshot: TelemetryTail | None = None
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
                self.snapshot = TelemetryTail(telemetry_path(tick.run_dir))
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
