"""The Performance view's panels as files: CSV data and 300-DPI PNG pictures (issue 13 item 4;
DESIGN §4: PNGs are drawn server-side with matplotlib from the data the panel shows).

Four panels, named as ``traceml plot RUN --telemetry PANEL`` names them (:data:`PANELS`):

``step``
    The step broken down by phase over the steps, on one rank: the slowest by the straggler rule's
    measure over the run (:func:`traceml_ai.ui.performance.breakdown`'s math, the page's). CSV: one
    row per step, ``step, rank, iteration_ms, <phase>_ms...`` (every step, never bucketed; with
    ``share`` ``<phase>_share...``, each phase's share of the step's phases). PNG: the
    page's stacked area of rolling medians, the warm-up shaded.
``ranks``
    Each rank's iteration time per step and its work outside backward (the iteration minus backward:
    under DDP the fast ranks wait for a straggler inside backward, so that is what tells it). CSV:
    ``step, rank_<r>_ms..., rank_<r>_outside_backward_ms...`` (every step). PNG: the ranks x steps
    heatmap (median per bucket of steps, as the page draws it) of the iteration, or of the work
    outside backward when the diagnosis names a straggler (the page's default too), with each rank's
    median after warm-up, the straggler marked.
``memory``
    PyTorch's per-step peak allocated/reserved bytes per rank and device, and each rank's process
    RSS over wall time. CSV: ``series, unit, step, time_s, value`` (``step`` for the per-step
    peaks, ``time_s`` (seconds since the run's first sample) for RSS). PNG: two panels.
``gpu``
    Host CPU and RAM (percent), each GPU's utilisation and memory used (percent of its total), its
    power draw and power limit (watts) and its temperature (degrees Celsius) over wall time. CSV:
    ``series, unit, time_s, value`` (units ``percent``, ``watts``, ``celsius``; series ``GPU 0
    power``, ``GPU 0 power limit``, ``GPU 0 temperature``). PNG: the percentages in two panels, and
    with power or temperature readings two more, one per unit; a host without GPU samples says so
    on the picture (and in the CSV's absence of GPU rows).

Everything comes from ``aggregator/telemetry.sqlite`` through :func:`traceml_ai.diagnose.read_telemetry`
(read-only) and the findings of ``aggregator/final_summary.json`` (or the rules run over the rows
written so far, for a live run), so the numbers are the page's. matplotlib is imported only when a
PNG is drawn; writing the file is :class:`~traceml_ai.ui.cache.CacheFolder`'s job.
"""

from __future__ import annotations

import io
import math
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np

from traceml_ai.diagnose.readers import Telemetry, rank_key, read_telemetry
from traceml_ai.diagnose.rules import local_work
from traceml_ai.diagnose.summary import (
    AGGREGATOR_DIR,
    FINAL_SUMMARY,
    TELEMETRY_DB,
    SummaryFileError,
    load_final_summary,
    summarise,
)
from traceml_ai.diagnose.thresholds import WARMUP_STEPS
from traceml_ai.diagnose.timeline import INNER_PHASES, OTHER, build_step_table
from traceml_ai.runs.analysis import Table
from traceml_ai.runs.model import RunSummary, short_id
from traceml_ai.ui.performance import MAX_BREAKDOWN_POINTS, MAX_BUCKETS, breakdown_of, heatmap_of, rank_medians
from traceml_ai.ui.png import PALETTE, PNG_DPI, Theme, bytes_axis, style_axes

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from traceml_ai.ui.cache import CacheFolder

Panel = Literal["step", "ranks", "memory", "gpu"]
HeatMode = Literal["iteration", "local"]
PANELS: Final[tuple[Panel, ...]] = ("step", "ranks", "memory", "gpu")
PANEL_TITLES: Final[dict[str, str]] = {
    "step": "Step time by phase",
    "ranks": "Step time per rank",
    "memory": "Memory",
    "gpu": "Host and GPU",
}
PHASE_LABELS: Final[dict[str, str]] = {name: name.removeprefix("traceml:") for name in (*INNER_PHASES, OTHER)}
"""Phase name in the telemetry → the label the page shows (``dataloader_next``, ..., ``other``)."""
# The page's legend words for the phases (web/src/views/performance.ts, PHASES): the PNG says the same.
_LEGEND: Final[dict[str, str]] = {"dataloader_next": "dataloader", "optimizer_step": "optimizer"}
# The page's fixed phase colours (web/src/views/performance.ts, PHASE_COLOR): palette indices.
_PHASE_COLOR: Final[dict[str, int]] = {"dataloader_next": 1, "h2d": 5, "forward": 0, "backward": 4,
                                       "optimizer_step": 2, "other": 7}


class PanelError(ValueError):
    """An unknown panel name, or a run without telemetry to draw."""


def check_panel(name: str) -> Panel:
    """``name`` as a :data:`Panel`.

    Raises:
        PanelError: not one of :data:`PANELS`.
    """
    for panel in PANELS:
        if panel == name:
            return panel
    raise PanelError(f"unknown telemetry panel {name!r}; choose one of {', '.join(PANELS)}")


NOTHING_TO_DRAW: Final = frozenset({"missing", "empty", "corrupt", "unreadable"})
"""Telemetry statuses without a row to draw: exporting a panel of such a run is an error."""


def telemetry_of(run: RunSummary, warnings: list[str] | None = None) -> Telemetry:
    """The run's telemetry database, read (read-only). ``warnings``: when given, a database that
    reads but is visibly damaged (:func:`~traceml_ai.diagnose.perf.telemetry_damage`, e.g. truncated
    since its summary was written) adds a line to it: the panel is drawn from the rows still there.

    Raises:
        PanelError: the run was not captured (no ``aggregator/`` folder), or its database has no row
            to draw (missing, empty, damaged or unreadable: the viewer's words, e.g. ``telemetry
            database is damaged: database disk image is malformed``).
    """
    from traceml_ai.diagnose.perf import telemetry_damage

    agg = os.path.join(run.key, AGGREGATOR_DIR)
    name = run.name or run.id
    if not os.path.isdir(agg):
        raise PanelError(f"{name} was not captured by TraceML (no {AGGREGATOR_DIR}/ folder)")
    tel = read_telemetry(os.path.join(agg, TELEMETRY_DB))
    if tel.status in NOTHING_TO_DRAW:
        detail = tel.detail or f"telemetry {tel.status}"
        if tel.status == "missing":
            # the run table's words when a final summary says the capture wrote one (review 13h)
            detail = (telemetry_damage(run.key, summarised=True) if os.path.isfile(os.path.join(agg, FINAL_SUMMARY))
                      else None) or f"no {TELEMETRY_DB} in this run"
        elif tel.status == "empty":
            detail = "the telemetry database has no rows yet"
        raise PanelError(f"{name}: {AGGREGATOR_DIR}/{TELEMETRY_DB}: {detail}; nothing to draw")
    if warnings is not None:
        damage = telemetry_damage(run.key, summarised=os.path.isfile(os.path.join(agg, FINAL_SUMMARY)))
        if damage is not None:
            warnings.append(f"{name}: {AGGREGATOR_DIR}/{TELEMETRY_DB}: {damage}; drawn from the rows still readable")
    return tel


def straggler_ranks(run: RunSummary, tel: Telemetry) -> list[int | None]:
    """The ranks the straggler finding names: from ``final_summary.json``, else (a live run) from the
    rules run over the rows written so far. Empty when there is none or nothing can be judged."""
    try:
        final = load_final_summary(run.key)
    except SummaryFileError:
        final = None
    if final is not None:
        findings = final.get("findings") if isinstance(final, dict) else None
    elif tel.status == "ok":
        findings = summarise(tel, source=f"{AGGREGATOR_DIR}/{TELEMETRY_DB}").to_dict().get("findings")
    else:
        findings = None
    out: list[int | None] = []
    for f in findings if isinstance(findings, list) else []:
        if isinstance(f, dict) and f.get("kind") == "straggler":
            ranks = (f.get("evidence") or {}).get("ranks") if isinstance(f.get("evidence"), dict) else None
            out += [r for r in ranks or [] if r is None or isinstance(r, int)]
    return out


# -- the data (CSV) ------------------------------------------------------------------------------


def _t0(tel: Telemetry) -> int | None:
    starts = [s.timestamp_ns for s in tel.steps if s.timestamp_ns is not None]
    starts += [p.timestamp_ns for p in tel.process if p.timestamp_ns is not None]
    starts += [s.timestamp_ns for s in tel.system if s.timestamp_ns is not None]
    return min(starts) if starts else None


def _secs(ts: int, t0: int) -> float:
    return round((ts - t0) / 1e9, 6)


def _rank_text(rank: int | None) -> str:
    return "?" if rank is None else str(rank)


def _basis_text(basis: str) -> str:
    """Why the step panel shows its rank, in words (see :func:`traceml_ai.ui.performance.shown_rank`)."""
    return {"straggler measure": "the slowest rank by the straggler measure",
            "only rank": "the only rank"}.get(basis, basis)


def panel_table(tel: Telemetry, panel: Panel, *, share: bool = False) -> Table:
    """The CSV table of one panel (header, rows; see the module docs), never downsampled. A panel
    without data is its header alone. ``share`` (the ``step`` panel only): each phase as its share
    of the step's phases (``<phase>_share``, 0–1, as the page's share toggle and the PNG draw it)
    instead of milliseconds."""
    if panel == "step":
        return _step_table(tel, share)
    if panel == "ranks":
        return _ranks_table(tel)
    if panel == "memory":
        return _memory_table(tel)
    return _gpu_table(tel)


def _step_table(tel: Telemetry, share: bool = False) -> Table:
    b = breakdown_of(tel, max_points=None) if tel.status == "ok" else None
    if b is None:
        return (["step", "rank", "iteration_ms"], [])
    names = [s["name"] for s in b["series"]]
    unit = "share" if share else "ms"
    header = ["step", "rank", "iteration_ms", *(f"{PHASE_LABELS.get(n, n)}_{unit}" for n in names)]
    columns = [s["y"] for s in b["series"]]
    if share:
        totals = [sum(v for v in values if v is not None) for values in zip(*columns, strict=True)]
        columns = [[None if v is None or not t else round(v / t, 4) for v, t in zip(col, totals, strict=True)]
                   for col in columns]
    rows = [[step, b["rank"], b["iteration"][i], *(col[i] for col in columns)] for i, step in enumerate(b["x"])]
    return header, rows


def _ranks_table(tel: Telemetry) -> Table:
    if tel.status != "ok":
        return (["step"], [])
    table = build_step_table(tel.steps, warmup_steps=0)
    ranks = [tl for tl in table.ranks if tl.steps.size]
    header = ["step", *(f"rank_{_rank_text(tl.rank)}_ms" for tl in ranks),
              *(f"rank_{_rank_text(tl.rank)}_outside_backward_ms" for tl in ranks)]
    if not ranks:
        return header, []
    steps = np.unique(np.concatenate([tl.steps for tl in ranks]))
    cols = []
    for pick in (lambda tl: tl.iteration_ms, local_work):
        for tl in ranks:
            col = np.full(steps.size, np.nan)
            col[np.searchsorted(steps, tl.steps)] = pick(tl)
            cols.append(col)
    mat = np.vstack(cols).T
    # Rounded as the step panel's CSV is (4 decimals of a millisecond): no float noise (12.300000000000001).
    rows: list[list[Any]] = [
        [int(step), *(None if not math.isfinite(v) else round(float(v), CSV_MS_DECIMALS) for v in vals)]
        for step, vals in zip(steps.tolist(), mat.tolist(), strict=True)]
    return header, rows


def _memory_series(tel: Telemetry) -> tuple[list[tuple[str, list[tuple[float, float]]]],
                                            list[tuple[str, list[tuple[float, float]]]]]:
    """(per-step peaks: ``(label, [(step, bytes)])``, RSS: ``(label, [(seconds, bytes)])``)."""
    by: dict[tuple[int | None, str | None], list[tuple[int, float | None, float | None]]] = defaultdict(list)
    for m in tel.memory:
        by[(m.rank, m.device)].append((m.step, m.peak_alloc_bytes, m.peak_reserved_bytes))
    peaks = []
    for (rank, device), got in sorted(by.items(), key=lambda kv: (rank_key(kv[0][0]), kv[0][1] or "")):
        for i, kind in ((1, "alloc"), (2, "reserved")):
            pts = [(float(r[0]), float(v)) for r in got if (v := r[i]) is not None]
            if pts:
                peaks.append((f"rank {_rank_text(rank)} {device or '?'} {kind}", pts))
    rss = []
    t0 = _t0(tel)
    if t0 is not None:
        per: dict[int | None, list[tuple[float, float]]] = defaultdict(list)
        for p in tel.process:
            if p.timestamp_ns is not None and p.rss_bytes is not None:
                per[p.rank].append((_secs(p.timestamp_ns, t0), float(p.rss_bytes)))
        rss = [(f"rank {_rank_text(r)} RSS", pts) for r, pts in sorted(per.items(), key=lambda kv: rank_key(kv[0]))]
    return peaks, rss


def _memory_table(tel: Telemetry) -> Table:
    peaks, rss = _memory_series(tel)
    rows: list[list[Any]] = [[label, "bytes", int(x), None, v] for label, pts in peaks for x, v in pts]
    rows += [[label, "bytes", None, x, v] for label, pts in rss for x, v in pts]
    return ["series", "unit", "step", "time_s", "value"], rows


CSV_MS_DECIMALS: Final = 4
"""Decimals of the milliseconds in the step and ranks CSVs (the page's breakdown rounds so too)."""
CSV_PCT_DECIMALS: Final = 4
"""Decimals of a percentage computed from two byte counts (RAM, GPU memory used of its total)."""


def _pct(fraction: float) -> float:
    return round(fraction * 100.0, CSV_PCT_DECIMALS)


_Series = list[tuple[str, list[tuple[float, float]]]]


def _gpu_series(tel: Telemetry) -> tuple[_Series, _Series, _Series, _Series]:
    """(host CPU/RAM percent, GPU util/memory percent, GPU power and power limit in watts, GPU
    temperature in degrees Celsius): ``(label, [(seconds, value)])`` each, the page's series."""
    t0 = _t0(tel)
    if t0 is None:
        return [], [], [], []
    hosts = {s.hostname for s in tel.system}
    host: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in tel.system:
        if s.timestamp_ns is None:
            continue
        prefix = f"{s.hostname or 'host'} " if len(hosts) > 1 else ""
        t = _secs(s.timestamp_ns, t0)
        if s.cpu_percent is not None:
            host[f"{prefix}CPU"].append((t, float(s.cpu_percent)))
        if s.ram_used_bytes is not None and s.ram_total_bytes:
            host[f"{prefix}RAM"].append((t, _pct(s.ram_used_bytes / s.ram_total_bytes)))
    gpu_hosts = {g.hostname for g in tel.gpus}
    gpu: dict[str, list[tuple[float, float]]] = defaultdict(list)
    power: dict[str, list[tuple[float, float]]] = defaultdict(list)
    temp: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for g in sorted(tel.gpus, key=lambda g: (g.hostname or "", g.gpu_idx)):
        if g.timestamp_ns is None:
            continue
        name = f"{g.hostname} GPU {g.gpu_idx}" if len(gpu_hosts) > 1 else f"GPU {g.gpu_idx}"
        t = _secs(g.timestamp_ns, t0)
        if g.util is not None:
            gpu[f"{name} util"].append((t, float(g.util)))
        if g.mem_used_bytes is not None and g.mem_total_bytes:
            gpu[f"{name} memory"].append((t, _pct(g.mem_used_bytes / g.mem_total_bytes)))
        if g.power_usage_w is not None:
            power[f"{name} power"].append((t, float(g.power_usage_w)))
        if g.power_limit_w is not None:
            power[f"{name} power limit"].append((t, float(g.power_limit_w)))
        if g.temperature_c is not None:
            temp[name].append((t, float(g.temperature_c)))
    return sorted(host.items()), list(gpu.items()), list(power.items()), list(temp.items())


def _gpu_table(tel: Telemetry) -> Table:
    host, gpu, power, temp = _gpu_series(tel)
    rows: list[list[Any]] = [[label, "percent", t, v] for label, pts in (*host, *gpu) for t, v in pts]
    rows += [[label, "watts", t, v] for label, pts in power for t, v in pts]
    rows += [[f"{label} temperature", "celsius", t, v] for label, pts in temp for t, v in pts]
    return ["series", "unit", "time_s", "value"], rows


# -- the picture (PNG) ---------------------------------------------------------------------------


_THEMES: Final[dict[str, dict[str, str]]] = {
    "dark": {"bg": "#16181d", "fg": "#d7dae0", "muted": "#8b919c", "grid": "#2c313a", "warm": "#d9a32e"},
    "light": {"bg": "#ffffff", "fg": "#1f2328", "muted": "#59636e", "grid": "#d8dee4", "warm": "#b07f12"},
}


def rolling_median(values: Sequence[float | None], window: int) -> list[float | None]:
    """The page's rolling median (performance.ts, ``rollingMedian``): over ``window`` points centred
    on each, None skipped; None where the window holds no number."""
    half = window // 2
    out: list[float | None] = []
    for i in range(len(values)):
        part = [v for v in values[max(0, i - half): i + half + 1] if v is not None and math.isfinite(v)]
        out.append(float(np.median(part)) if part else None)
    return out


def smoothing_window(points: int) -> int:
    """The page's rolling-median window for a breakdown of ``points`` points (odd, 1..25)."""
    return max(1, min(25, round(points / 40))) | 1


def render_panel_png(tel: Telemetry, panel: Panel, *, title: str, stragglers: Sequence[int | None] = (),
                     share: bool = False, heat: HeatMode | None = None, theme: Theme = "dark",
                     notes: list[str] | None = None) -> bytes:
    """One panel as PNG bytes at 300 DPI (``pHYs`` set): :func:`panel_figure`'s picture, its
    heading kept as the PNG's ``Title`` text. ``notes``: a line for characters the font cannot
    draw is appended (:func:`traceml_ai.ui.png.missing_glyphs`).

    Raises:
        ImportError: matplotlib is not installed.
    """
    from traceml_ai.ui.png import missing_glyphs

    with missing_glyphs(notes):
        fig = panel_figure(tel, panel, title=title, stragglers=stragglers, share=share, heat=heat, theme=theme)
        colors = _THEMES[theme]
        buffer = io.BytesIO()
        # The heading is also the PNG's Title (a tEXt chunk image viewers show).
        fig.savefig(buffer, format="png", dpi=PNG_DPI, facecolor=colors["bg"],
                    metadata={"Title": f"{title} · {PANEL_TITLES[panel]}"})
    return buffer.getvalue()  # savefig writes the pHYs (DPI) chunk itself


def panel_figure(tel: Telemetry, panel: Panel, *, title: str, stragglers: Sequence[int | None] = (),
                 share: bool = False, heat: HeatMode | None = None, theme: Theme = "dark") -> Figure:
    """One panel drawn on a matplotlib figure (laid out, not yet encoded). ``title``: the run's label
    (``name · short id``), put above the panel's; ``stragglers``: the ranks the diagnosis named (the
    ``ranks`` panel marks them); ``share``: the ``step`` panel as shares of the step instead of
    milliseconds (the page's toggle); ``heat``: what the ``ranks`` heatmap colours, ``iteration``
    or ``local`` (the work outside backward); None: ``local`` when a straggler is named and
    backward was measured on several ranks. A part without data says why in words, without axes.

    Raises:
        ImportError: matplotlib is not installed.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colors = _THEMES[theme]
    # The gpu panel adds power (W) and temperature (degrees C) below the percentages when a GPU
    # measured them: each unit on its own axis.
    rows = 1 if panel in ("step", "ranks") else 2
    if panel == "gpu" and tel.status == "ok" and any(
            g.power_usage_w is not None or g.power_limit_w is not None or g.temperature_c is not None
            for g in tel.gpus):
        rows = 4
    fig = Figure(figsize=(9.0, {1: 4.5, 2: 6.0, 4: 10.0}[rows]), dpi=PNG_DPI, facecolor=colors["bg"])
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(rows, 1, squeeze=False)[:, 0])
    for ax in axes:
        style_axes(ax, colors)
    heading = f"{title} · {PANEL_TITLES[panel]}"
    fig.suptitle(heading, color=colors["fg"], fontsize=10, x=0.01, ha="left")
    if tel.status != "ok":
        _note(axes[0], tel.detail or f"telemetry {tel.status}", colors)
    elif panel == "step":
        _draw_step(axes[0], tel, share, colors)
    elif panel == "ranks":
        _draw_ranks(fig, axes[0], tel, stragglers, heat, colors)
    elif panel == "memory":
        _draw_memory(axes, tel, colors)
    else:
        _draw_gpu(axes, tel, colors)
    fig.tight_layout()
    return fig


def _note(ax: Axes, text: str, colors: Mapping[str, str]) -> None:
    """``text`` (why the panel is empty) in the middle of ``ax``, without its axes: no 0-1 ticks
    around nothing; the panel's title stays."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color=colors["muted"], fontsize=9,
            wrap=True)


def _legend(ax: Axes, colors: Mapping[str, str]) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, frameon=False, labelcolor=colors["fg"], loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _draw_step(ax: Axes, tel: Telemetry, share: bool, colors: Mapping[str, str]) -> None:
    b = breakdown_of(tel, max_points=MAX_BREAKDOWN_POINTS)
    if b is None or not b["series"]:
        _note(ax, "No step times: this run was not traced with trace_step (or sent no step yet).", colors)
        return
    x = np.asarray(b["x"], dtype=np.float64)
    window = smoothing_window(x.size)
    smooth = [np.asarray([math.nan if v is None else v for v in rolling_median(s["y"], window)]) for s in b["series"]]
    stack = np.nan_to_num(np.vstack(smooth))
    if share:
        totals = stack.sum(axis=0)
        stack = np.divide(stack, totals, out=np.zeros_like(stack), where=totals > 0)
    labels = [PHASE_LABELS.get(s["name"], s["name"]) for s in b["series"]]
    ax.stackplot(x, stack, labels=[_LEGEND.get(label, label) for label in labels], alpha=0.85,
                 colors=[PALETTE[_PHASE_COLOR.get(label, 7) % len(PALETTE)] for label in labels])
    if share:  # in percent, as the page shows it (review 13i: a 0-1 axis)
        from matplotlib.ticker import PercentFormatter

        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0, decimals=0))
    first = x[0]
    if WARMUP_STEPS > 0:
        ax.axvspan(first, min(first + WARMUP_STEPS, x[-1]), color=colors["warm"], alpha=0.12, linewidth=0,
                   label="warm-up")
    ax.set_xlim(x[0], x[-1] if x[-1] > x[0] else x[0] + 1)
    ax.set_xlabel("step", color=colors["muted"], fontsize=8)
    ax.set_ylabel("share of the step" if share else "ms", color=colors["muted"], fontsize=8)
    ax.set_title(f"phases of rank {_rank_text(b['rank'])} ({_basis_text(b['rank_basis'])}), "
                 + ("each step as measured" if window == 1 else f"rolling median over {window} points")
                 + (f" (buckets of {b['bucket_steps']} steps)" if b["bucket_steps"] > 1 else ""),
                 color=colors["muted"], fontsize=7, loc="left")
    _legend(ax, colors)


def _draw_ranks(fig: Figure, ax: Axes, tel: Telemetry, stragglers: Sequence[int | None], heat: HeatMode | None,
                colors: Mapping[str, str]) -> None:
    hm = heatmap_of(tel, MAX_BUCKETS)
    if not hm["ranks"]:
        _note(ax, "No step times: this run was not traced with trace_step (or sent no step yet).", colors)
        return
    has_local = len(hm["ranks"]) > 1 and hm["z_local"] != hm["z"]
    local = has_local and (heat == "local" or (heat is None and bool(stragglers)))
    z = np.asarray([[math.nan if v is None else v for v in row] for row in hm["z_local" if local else "z"]],
                   dtype=np.float64)
    first, width = hm["first_step"] or 0, hm["bucket_steps"]
    extent = (first, first + z.shape[1] * width, len(hm["ranks"]) - 0.5, -0.5)
    image = ax.imshow(z, aspect="auto", interpolation="nearest", cmap="turbo", extent=extent)
    last = hm.get("last_step")
    if last is not None:  # the last bucket may be narrower: the axis ends at the run's last step
        ax.set_xlim(first, last + 1)
    bar = fig.colorbar(image, ax=ax, pad=0.12)
    bar.set_label("outside backward (ms)" if local else "iteration (ms)", color=colors["muted"], fontsize=7)
    bar.ax.tick_params(colors=colors["muted"], labelsize=6)
    ax.grid(False)
    medians = rank_medians(tel)
    which = "outside_backward_ms" if local else "median_ms"
    named = {_rank_text(r) for r in stragglers}
    labels = []
    for i, rank in enumerate(hm["ranks"]):
        text = _rank_text(rank)
        labels.append(f"rank {text}" + (" · straggler" if text in named else ""))
        m = medians.get(rank, {}).get(which)
        ax.text(1.01, 1 - (i + 0.5) / len(hm["ranks"]), "–" if m is None else f"{m:.3g} ms",
                transform=ax.transAxes, va="center", fontsize=6,
                color=PALETTE[3] if text in named else colors["fg"])
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    for tick, label in zip(ax.get_yticklabels(), labels, strict=True):
        if label.endswith("straggler"):
            tick.set_color(PALETTE[3])
    ax.set_xlabel("step", color=colors["muted"], fontsize=8)
    what = ("work outside backward per rank (the iteration minus backward, where DDP ranks wait for a straggler)"
            if local else "iteration time per rank")
    ax.set_title(what + (f" (median of {width} steps per column)" if width > 1 else "")
                 + "; medians after warm-up on the right", color=colors["muted"], fontsize=7, loc="left")


def _lines(ax: Axes, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], colors: Mapping[str, str],
           *, limits: bool = False) -> None:
    """One line per series, coloured in turn. ``limits``: a ``<name> power limit`` series is drawn
    dashed in its ``<name> power`` line's colour, as the page draws it."""
    groups: list[str] = []
    for label, pts in series:
        limit = limits and label.endswith(" power limit")
        group = label.removesuffix(" power limit" if limit else " power") if limits else label
        if group not in groups:
            groups.append(group)
        xs, ys = zip(*pts, strict=True)
        ax.plot(xs, ys, color=PALETTE[groups.index(group) % len(PALETTE)], linewidth=1.0, label=label,
                linestyle="--" if limit else "-", marker="o" if len(pts) <= 60 and not limit else None,
                markersize=2)
    _legend(ax, colors)


def _draw_memory(axes: Sequence[Axes], tel: Telemetry, colors: Mapping[str, str]) -> None:
    peaks, rss = _memory_series(tel)
    top, bottom = axes
    top.set_title("peak device memory per step", color=colors["muted"], fontsize=7, loc="left")
    if peaks:
        _lines(top, peaks, colors)
        top.set_xlabel("step", color=colors["muted"], fontsize=8)
        top.set_ylabel(_bytes_of(top, peaks), color=colors["muted"], fontsize=8)
        _top_on_tick(top)
    elif tel.memory:  # rows that measured no peak: a CPU run's
        _note(top, f"No device memory: {len(tel.memory):,} per-step memory rows, none with a measured peak "
                   "(a CPU run measures host RSS only).", colors)
    else:
        _note(top, "No per-step memory rows (a CPU run measures host RSS only).", colors)
    bottom.set_title("process RSS per rank", color=colors["muted"], fontsize=7, loc="left")
    if rss:
        _lines(bottom, rss, colors)
        bottom.set_xlabel("wall time (s)", color=colors["muted"], fontsize=8)
        bottom.set_ylabel(_bytes_of(bottom, rss), color=colors["muted"], fontsize=8)
        _top_on_tick(bottom)
    else:
        _note(bottom, "No process samples.", colors)


def _top_on_tick(ax: Axes) -> None:
    """End ``ax``'s y axis on a major tick at or above its largest value (as the page's charts do),
    so a plateau at the top of the data reads off a tick: RSS at 480 MiB shows a 512 MiB tick."""
    ys = [np.asarray(line.get_ydata(), dtype=np.float64) for line in ax.get_lines()]
    finite = [float(np.nanmax(y)) for y in ys if y.size and np.isfinite(y).any()]
    if not finite:
        return
    top = max(finite)
    lo, hi = ax.get_ylim()
    above = [float(t) for t in ax.yaxis.get_major_locator().tick_values(lo, hi) if t >= top - abs(top) * 1e-9]
    if above and min(above) > hi:
        ax.set_ylim(lo, min(above))


def _bytes_of(ax: Axes, series: Sequence[tuple[str, Sequence[tuple[float, float]]]]) -> str:
    """Ticks of ``ax``'s y axis in the binary unit of its largest byte count; returns its title."""
    return bytes_axis(ax.yaxis, max(abs(v) for _, pts in series for _, v in pts))


def _draw_gpu(axes: Sequence[Axes], tel: Telemetry, colors: Mapping[str, str]) -> None:
    host, gpu, power, temp = _gpu_series(tel)
    top, bottom = axes[0], axes[1]
    top.set_title("host CPU and RAM (%)", color=colors["muted"], fontsize=7, loc="left")
    if host:
        _lines(top, host, colors)
    else:
        _note(top, "No system samples.", colors)
    bottom.set_title("GPU utilisation and memory (%)", color=colors["muted"], fontsize=7, loc="left")
    if gpu:
        _lines(bottom, gpu, colors)
    else:
        _note(bottom, "No GPU on this host (no GPU utilisation samples; NVML unavailable or a CPU-only run).", colors)
    if len(axes) == 4:
        watts, celsius = axes[2], axes[3]
        watts.set_title("GPU power draw and limit (W)", color=colors["muted"], fontsize=7, loc="left")
        if power:
            _lines(watts, power, colors, limits=True)
            watts.set_ylabel("W", color=colors["muted"], fontsize=8)
        else:
            _note(watts, "No GPU power readings (NVML did not report them).", colors)
        celsius.set_title("GPU temperature (°C)", color=colors["muted"], fontsize=7, loc="left")
        if temp:
            _lines(celsius, temp, colors)
            celsius.set_ylabel("°C", color=colors["muted"], fontsize=8)
        else:
            _note(celsius, "No GPU temperature readings (NVML did not report them).", colors)
    # Every chart with lines says its x unit (the four are stacked, each with its own axis), as the
    # memory panel's RSS chart does.
    for ax in axes:
        if ax.get_lines():
            ax.set_xlabel("wall time (s)", color=colors["muted"], fontsize=8)
            _top_on_tick(ax)


# -- saving ----------------------------------------------------------------------------------------


_EMPTY_WHY: Final[dict[str, str]] = {
    "step": "no step times: the run was not traced with trace_step, or sent no step yet",
    "ranks": "no step times: the run was not traced with trace_step, or sent no step yet",
    "memory": "no memory rows or process samples",
    "gpu": "no system samples",
}


def export_panel(cache: CacheFolder, run: RunSummary, panel: str, fmt: str, *, share: bool = False,
                 heat: HeatMode | None = None, warnings: list[str] | None = None) -> str:
    """Save one Performance panel of ``run`` into the cache folder's ``plots/`` as
    ``plot-<run name>-telemetry-<panel>-YYYYMMDD-HHMMSS.<csv|png>`` and return its absolute path
    (``share``, ``heat``: as :func:`render_panel_png` takes them; ``warnings``: as
    :func:`telemetry_of` takes it).

    Raises:
        PanelError: an unknown panel, the run was not captured, or its telemetry has no row to draw
            (see :func:`telemetry_of`), or this panel has none (``nothing to export: the step
            panel has no data (...)``, e.g. a ``watch`` run's step panel); nothing is written.
        CacheError: ``fmt`` is not png or csv.
        OSError: the file could not be written.
    """
    from traceml_ai.runs.analysis import table_csv

    which = check_panel(panel)
    tel = telemetry_of(run, warnings)
    # One run's picture: its name and short id (two runs may share a name), as Compare labels them.
    label = f"{run.name} · {short_id(run.id)}" if run.name and run.name != run.id else run.id
    name = f"{run.name or run.id} telemetry {which}"
    table = panel_table(tel, which, share=share)
    if not table[1] and fmt in ("csv", "png"):  # a header alone or empty axes: say so, write nothing
        raise PanelError(f"nothing to export: the {which} panel has no data ({_EMPTY_WHY[which]})")
    if fmt == "csv":
        data = table_csv(table).encode("utf-8")
    elif fmt == "png":
        cache.prepare_png()
        data = render_panel_png(tel, which, title=label, share=share, heat=heat,
                                stragglers=straggler_ranks(run, tel) if which == "ranks" else (), notes=warnings)
    else:
        from traceml_ai.ui.cache import CacheError

        raise CacheError(f"format must be png or csv, got {fmt!r}")
    return cache.save_plot(name, data, "csv" if fmt == "csv" else "png")


__all__ = ["PANELS", "Panel", "PanelError", "check_panel", "export_panel", "panel_figure", "panel_table",
           "render_panel_png", "straggler_ranks", "telemetry_of"]
