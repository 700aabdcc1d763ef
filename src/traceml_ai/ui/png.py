"""Charts as PNG files at 300 DPI (DESIGN §4: PNGs are rendered server-side with matplotlib from the
data the chart shows; 003 seed, "Exporting chart data").

Drawn with matplotlib's Agg canvas (no pyplot, no global state) in the viewer's dark theme, from the
same data as the page (:mod:`traceml_ai.runs.analysis`); ``savefig(dpi=300)`` writes the ``pHYs``
chunk and :func:`png_dpi` reads it back. matplotlib is imported only when a PNG is drawn. Writing the
file is :mod:`traceml_ai.ui.cache`'s job, never this module's.
"""

from __future__ import annotations

import io
import math
import re
import struct
import textwrap
import threading
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, Literal

from traceml_ai.runs.analysis import (
    BarSpec,
    BoxSpec,
    ChartSpec,
    LineSpec,
    ScatterSpec,
    bar_data,
    box_data,
    group_labels,
    line_groups,
    line_points,
    scatter_data,
    scatter_groups,
    time_axis_label,
    time_origin,
)
from traceml_ai.runs.metrics_tail import MetricsTail
from traceml_ai.runs.model import RunSummary, short_id
from traceml_ai.runs.series import DEFAULT_MAX_POINTS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

PNG_DPI: Final = 300
PNG_MAX_POINTS: Final = 1500
"""Points per line in a PNG at most: min/max buckets keep every peak, and a 2,400-pixel-wide plot
shows no more (fewer points to transform and rasterize: the worst case draws about a third faster)."""
Theme = Literal["dark", "light"]
_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"


def is_png(data: bytes) -> bool:
    """True when ``data`` is a well-formed PNG: the signature, then chunks with valid CRCs starting
    with ``IHDR`` and ending with ``IEND``."""
    chunks = _png_chunks(data)
    return chunks is not None and bool(chunks) and chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"


def png_dpi(data: bytes) -> float | None:
    """The resolution in a PNG's ``pHYs`` chunk, in dots per inch (None without one, or when its
    unit is not the metre or x and y differ). 300 DPI is stored as 11811 pixels per metre."""
    for kind, body in _png_chunks(data) or []:
        if kind == b"pHYs" and len(body) == 9:
            x, y, unit = struct.unpack(">IIB", body)
            return x * 0.0254 if unit == 1 and x == y else None
    return None


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]] | None:
    if not data.startswith(_PNG_SIGNATURE):
        return None
    chunks: list[tuple[bytes, bytes]] = []
    pos = len(_PNG_SIGNATURE)
    while pos < len(data):
        if pos + 12 > len(data):
            return None
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        end = pos + 8 + length
        if end + 4 > len(data):
            return None
        body = data[pos + 8 : end]
        (crc,) = struct.unpack(">I", data[end : end + 4])
        if crc != zlib.crc32(kind + body):
            return None
        chunks.append((kind, body))
        pos = end + 4
        if kind == b"IEND":
            break
    return chunks


# -- the folder ------------------------------------------------------------------------------------


_THEMES: Final[dict[str, dict[str, str]]] = {
    "dark": {"bg": "#16181d", "fg": "#d7dae0", "muted": "#8b919c", "grid": "#2c313a"},
    "light": {"bg": "#ffffff", "fg": "#1f2328", "muted": "#59636e", "grid": "#d8dee4"},
}
PALETTE: Final = (
    "#4e9cf5", "#f5a524", "#3ecf8e", "#ef5a6f", "#a78bfa", "#22c1c3", "#f07c3e", "#c3d64a", "#ec6cb9", "#8fa1b3",
)
_FIG_INCHES: Final = (8.0, 4.5)
BAND_TEXT: Final[dict[str, str]] = {"minmax": "min–max band", "std": "± population std band"}
"""How the legend names the band around a group's mean (the page's band picker says the same)."""


_MISSING_GLYPH: Final = re.compile(r"Glyph (\d+) \(.*?\) missing from (?:current )?font")


@contextmanager
def missing_glyphs(notes: list[str] | None = None) -> Iterator[None]:
    """Gather matplotlib's ``Glyph N (X) missing from font(s) ...`` warnings of the block (one per
    character and draw: a run named ``ddp-日本語`` printed three, review 13f) into one line appended
    to ``notes`` (``the font has no glyph for 日, 本, 語: drawn as boxes``); other warnings are
    shown as usual. Without ``notes`` they are dropped (the viewer's PNGs)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    missing: list[str] = []
    for w in caught:
        m = _MISSING_GLYPH.search(str(w.message))
        if m is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        elif (char := chr(int(m.group(1)))) not in missing:  # (the warning spells it \N{...})
            missing.append(char)
    if missing and notes is not None:
        notes.append(f"the font has no glyph for {', '.join(missing)}: drawn as boxes")


def render_chart_png(
    spec: ChartSpec,
    runs: Sequence[RunSummary],
    histories: Sequence[tuple[RunSummary, MetricsTail]] = (),
    *,
    max_points: int = DEFAULT_MAX_POINTS,
    theme: Theme = "dark",
    notes: list[str] | None = None,
) -> bytes:
    """Draw a chart as PNG bytes at 300 DPI (``pHYs`` written by matplotlib's ``savefig``; DESIGN §4:
    the PNG is rendered server-side from the data the chart shows).

    - line: one panel per metric; per run the downsampled series (:func:`~traceml_ai.runs.analysis.
      line_points`), faded with the EMA drawn over it when ``ema`` > 0; with ``group_by`` one mean
      line per group over steps inside its band (``band``: min–max or ± std, as on the page);
      ``log_y`` masks values ≤ 0;
    - bar: :func:`~traceml_ai.runs.analysis.bar_data` (60 bars at most; group means with min–max
      error bars);
    - scatter: :func:`~traceml_ai.runs.analysis.scatter_data`, sized by ``size_field`` (missing: the
      default size), coloured by ``color_field`` groups; with ``group_by`` (Plot by groups) each
      group's mean ± std in x and y over the points (:func:`~traceml_ai.runs.analysis.scatter_groups`);
    - box: :func:`~traceml_ai.runs.analysis.box_data`, whiskers and outliers exactly as computed.

    ``notes``: a line for characters the font cannot draw is appended (:func:`missing_glyphs`).

    Raises:
        ImportError: matplotlib is not installed.
    """
    with missing_glyphs(notes):
        return _encode(chart_figure(spec, runs, histories, max_points=max_points, theme=theme))


def chart_figure(
    spec: ChartSpec,
    runs: Sequence[RunSummary],
    histories: Sequence[tuple[RunSummary, MetricsTail]] = (),
    *,
    max_points: int = DEFAULT_MAX_POINTS,
    theme: Theme = "dark",
) -> Any:
    """The matplotlib figure :func:`render_chart_png` encodes (laid out, not drawn yet)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colors = _THEMES[theme]
    n_panels = len(spec.metrics) if isinstance(spec, LineSpec) else 1
    width, height = _FIG_INCHES
    fig = Figure(figsize=(width + (2.0 if isinstance(spec, LineSpec) else 0.0), height * (1 + 0.6 * (n_panels - 1))),
                 dpi=PNG_DPI, facecolor=colors["bg"])
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_panels, 1, squeeze=False, sharex=True)[:, 0]
    for ax in axes:
        style_axes(ax, colors)
    # The margins first: the line legend measures its room right of the plot.
    _fixed_layout(fig, line=isinstance(spec, LineSpec), panels=n_panels, labels_below=not isinstance(spec, LineSpec))
    if isinstance(spec, LineSpec):
        _draw_lines(list(axes), spec, histories, max_points, colors)
    elif isinstance(spec, BarSpec):
        _draw_bars(axes[0], spec, runs, colors)
    elif isinstance(spec, ScatterSpec):
        _draw_scatter(axes[0], spec, runs, colors)
    else:
        _draw_box(axes[0], spec, runs, colors)
    return fig


def _fixed_layout(fig: Any, *, line: bool, panels: int, labels_below: bool) -> None:
    """Margins in inches, set once: ``tight_layout`` draws the whole figure an extra time to
    measure it (a quarter of the time of a 4-panel chart of 30 runs)."""
    width, height = fig.get_size_inches()
    right = (width - 2.0 + 0.15) / width if line else 1 - 0.2 / width  # the line legend sits in the 2 in on the right
    bottom = (1.1 if labels_below else 0.45) / height  # rotated bar/box labels need room
    fig.subplots_adjust(left=0.75 / width, right=right, top=1 - 0.3 / height, bottom=bottom,
                        hspace=0.3 if panels > 1 else 0.2)


def _encode(fig: Any) -> bytes:
    """One Agg draw, then a fast PNG encode (zlib level 1: the file is a few per cent larger and
    the encode several times faster than the default level); ``pHYs`` says 300 DPI."""
    from PIL import Image

    canvas = fig.canvas
    canvas.draw()
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="png", compress_level=1, dpi=(PNG_DPI, PNG_DPI))  # opaque background
    return buffer.getvalue()


_warmed = threading.Event()


def warm_up_in_background() -> None:
    """Import matplotlib (about half a second) and draw one tiny figure in a daemon thread, once
    per process, so that the first PNG export a user asks for does not wait for it. The page's
    first chart request calls this; nothing else is loaded."""
    if _warmed.is_set():
        return
    _warmed.set()

    def work() -> None:
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg
            from matplotlib.figure import Figure

            fig = Figure(figsize=(1, 1), dpi=50)
            FigureCanvasAgg(fig)
            fig.subplots().set_title("x")
            fig.canvas.draw()
        except Exception:  # matplotlib missing or broken: the export says so when asked
            return

    threading.Thread(target=work, name="traceml-png-warm-up", daemon=True).start()


def style_axes(ax: Axes, colors: Mapping[str, str]) -> None:
    """The viewer's look for one matplotlib axes (``colors`` from :data:`PALETTE`'s theme): its background,
    no top/right spines, muted 7 pt ticks, a light grid behind the data. Shared by the Performance
    exports (:mod:`traceml_ai.ui.perf_export`)."""
    ax.set_facecolor(colors["bg"])
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    for side in ("left", "bottom"):
        ax.spines[side].set_color(colors["grid"])
    ax.tick_params(which="both", colors=colors["muted"], labelsize=7)
    ax.grid(True, color=colors["grid"], linewidth=0.5)
    ax.set_axisbelow(True)


BINARY_UNITS: Final = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def binary_unit(largest: float) -> tuple[str, float]:
    """The binary unit (``B``, ``KiB``, ``MiB``, ``GiB``, ...) in which ``largest`` bytes read as a
    number under 1024 (the page's ``fmtBytes``), and its size in bytes."""
    value, i = abs(largest), 0
    while value >= 1024 and i < len(BINARY_UNITS) - 1:
        value /= 1024
        i += 1
    return BINARY_UNITS[i], float(1024**i)


def bytes_axis(axis: Any, largest: float) -> str:
    """Label a matplotlib axis (``ax.yaxis`` / ``ax.xaxis``) of byte counts in one binary unit chosen
    from ``largest`` (bytes): round ticks in that unit (0.5 GiB, 1 GiB, ...), never raw bytes
    (``1e9``). Returns the unit, for the axis title. Leave a log-scaled axis alone."""
    import numpy as np
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    unit, size = binary_unit(largest)

    class _Scaled(MaxNLocator):  # round ticks in the unit, not in bytes
        def tick_values(self, vmin: float, vmax: float) -> Any:
            return np.asarray(super().tick_values(vmin / size, vmax / size), dtype=np.float64) * size

    axis.set_major_locator(_Scaled(nbins="auto", steps=[1, 2, 2.5, 5, 10]))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / size:.4g}"))
    return unit


def is_bytes_column(column: str) -> bool:
    """Whether a run-table column holds byte counts (``perf.peak_mem.*``; the page shows them in
    KiB/MiB/GiB, and so does a chart's axis)."""
    return column.startswith("perf.peak_mem.")


def _field_label(ax: Axes, axis: Any, field: str, values: Sequence[float], log: bool = False) -> str:
    """``field`` as an axis title, with the binary unit of its ticks when it holds bytes."""
    finite = [abs(v) for v in values if v is not None and math.isfinite(v)]
    if not is_bytes_column(field) or log or not finite:
        return field
    return f"{field} ({bytes_axis(axis, max(finite))})"


def _note(ax: Axes, text: str, colors: Mapping[str, str]) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color=colors["muted"], fontsize=9)


def _legend(ax: Axes, colors: Mapping[str, str], *, outside: bool = False, title: str | None = None) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    kwargs: dict[str, Any] = {"fontsize": 6, "frameon": False, "labelcolor": colors["fg"]}
    wrap: Callable[[str], str] = lambda text: text  # noqa: E731
    if outside:
        kwargs.update(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        wrap = _wrapper(ax)
        labels = [wrap(label) for label in labels]
    if title is not None:
        kwargs.update(title=wrap(title), title_fontsize=6, alignment="left")
    legend = ax.legend(handles, labels, **kwargs)
    if title is not None:
        legend.get_title().set_color(colors["muted"])
    for handle in legend.legend_handles:
        set_sizes = getattr(handle, "set_sizes", None)
        if set_sizes is not None:
            set_sizes([24.0])  # scatter legends: one marker size, not the first point's


def _wrapper(ax: Axes) -> Callable[[str], str]:
    """How a label of the legend right of ``ax`` (6 pt) is written so that it fits between the
    legend's start and the image's right edge: on as many lines as it needs, measured in the
    font drawn (a long group name or the band's name is wrapped, never cut off)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    fig = ax.get_figure(root=True)
    assert fig is not None
    measure = TextToPath()
    prop = FontProperties(size=6)
    px_per_pt = fig.dpi / 72
    right = ax.get_position().x1 + 0.01 * ax.get_position().width  # bbox_to_anchor x = 1.01
    # The marker and the paddings before the text (handle 2 em, pad 0.8 em, border 0.5 + 0.4 em),
    # and 1 pt to spare at the edge.
    room = fig.get_figwidth() * fig.dpi * (1 - right) - (3.7 * 6 + 1) * px_per_pt

    def width(line: str) -> float:
        return float(measure.get_text_width_height_descent(line, prop, ismath=False)[0]) * px_per_pt

    def wrap(text: str) -> str:
        full = width(text)
        if full <= room:
            return text
        chars = max(1, int(len(text) * room / full))
        while chars > 1:
            lines = textwrap.wrap(text, chars, break_on_hyphens=False)
            if all(width(line) <= room for line in lines):
                return "\n".join(lines)
            chars -= 1
        return "\n".join(text)

    return wrap


def _draw_lines(
    axes: list[Axes],
    spec: LineSpec,
    histories: Sequence[tuple[RunSummary, MetricsTail]],
    max_points: int,
    colors: Mapping[str, str],
) -> None:
    x_label = "step" if spec.group_by else {
        "step": "step", "epoch": "epoch", "time": time_axis_label(time_origin(run, tail)[1] for run, tail in histories)
    }[spec.x]
    names = run_labels([run for run, _tail in histories])
    x_max = 0.0
    for i, (ax, metric) in enumerate(zip(axes, spec.metrics, strict=True)):
        ax.set_title(metric, color=colors["fg"], fontsize=9, loc="left")
        drawn = False
        if spec.group_by is not None:
            for j, mean in enumerate(line_groups(histories, metric, spec.group_by)):
                color = PALETTE[j % len(PALETTE)]
                # The band the page draws around each mean (its band setting), as light as there.
                low, high = mean.band(spec.band)
                ax.fill_between(mean.step, low, high, color=color, alpha=0.16, linewidth=0)
                n = len(mean.keys)  # as the page's legend: the runs of the group
                ax.plot(mean.step, mean.mean, color=color, linewidth=1.2,
                        label=f"{mean.label} ({n} run{'' if n == 1 else 's'})")
                drawn = True
        else:
            for j, (run, tail) in enumerate(histories):
                series = tail.series(metric)
                if not len(series):
                    continue
                pts = line_points(series, spec.x, spec.ema, min(max_points, PNG_MAX_POINTS),
                                  t0=time_origin(run, tail)[0])
                color = PALETTE[j % len(PALETTE)]
                label = names.get(run.key, run.name)
                x_max = max([x_max, *(x for x in pts.x if x is not None)])
                if pts.smoothed is not None:
                    ax.plot(pts.x, pts.y, color=color, linewidth=0.8, alpha=0.3)
                    ax.plot(pts.x, pts.smoothed, color=color, linewidth=1.2, label=label)
                else:
                    ax.plot(pts.x, pts.y, color=color, linewidth=1.2, label=label)
                drawn = True
        if not drawn:
            _note(ax, f"no values of {metric}", colors)
        elif spec.log_y:
            ax.set_yscale("log", nonpositive="mask")
            style_axes(ax, colors)  # a new scale brings new tick labels
        if i == 0:
            title = f"mean by {spec.group_by}, {BAND_TEXT[spec.band]}" if spec.group_by is not None else None
            _legend(ax, colors, outside=True, title=title)
    if spec.x == "time" and not spec.group_by:  # "time since start (s)" → "... (min)" as the ticks are
        x_label = x_label.removesuffix(" (s)") + f" ({_time_axis(axes[-1], x_max)})"
    axes[-1].set_xlabel(x_label, color=colors["muted"], fontsize=8)


def _time_axis(ax: Axes, x_max: float) -> str:
    """Wall-time ticks in one unit as the page draws them (s under 3 min, min under 3 h, else h),
    at a clean step of that unit; returns the unit (``s``, ``min`` or ``h``)."""
    from matplotlib.ticker import FuncFormatter, MultipleLocator

    unit, div = ("s", 1.0) if x_max < 180 else ("min", 60.0) if x_max < 3 * 3600 else ("h", 3600.0)
    raw = x_max / div / 6
    steps = sorted([*([0.25, 3, 6, 12, 24, 48] if unit == "h" else [15, 30]),
                    *(m * 10.0**k for k in range(-3, 7) for m in (1, 2, 5))])
    step = next((st for st in steps if st >= raw), raw) if raw > 0 else 1.0
    ax.xaxis.set_major_locator(MultipleLocator(step * div))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / div:g}"))
    return unit


def run_labels(runs: Sequence[RunSummary]) -> dict[str, str]:
    """Legend labels by run key: the name, with `` · <short id>`` where two runs share a name (the
    page's rule, ``web/src/columns.ts`` ``runLabels``)."""
    count: dict[str, int] = {}
    for run in runs:
        count[run.name or run.id] = count.get(run.name or run.id, 0) + 1
    out: dict[str, str] = {}
    taken: set[str] = set()
    for run in runs:
        name = run.name or run.id
        if count[name] < 2:
            out[run.key] = name
            continue
        label = f"{name} · {short_id(run.id)}"
        if label in taken:
            label = f"{name} · {run.id}"
        taken.add(label)
        out[run.key] = label
    return out


def _draw_bars(ax: Axes, spec: BarSpec, runs: Sequence[RunSummary], colors: Mapping[str, str]) -> None:
    data = bar_data(runs, spec.field, spec.group_by)
    bars = data["bars"]
    title = spec.field + (f" by {spec.group_by}" if spec.group_by else "")
    if data["total"] > len(bars):
        title += f"  (first {len(bars)} of {data['total']})"
    ax.set_title(title, color=colors["fg"], fontsize=9, loc="left")
    if not bars:
        _note(ax, f"no run has a number in {spec.field}", colors)
        return
    xs = list(range(len(bars)))
    values = [b["value"] for b in bars]
    bar_colors = [PALETTE[i % len(PALETTE)] if spec.group_by else PALETTE[0] for i in range(len(bars))]
    ax.bar(xs, values, color=bar_colors, width=0.7)
    if spec.group_by:
        low = [b["value"] - (b["min"] if b["min"] is not None else b["value"]) for b in bars]
        high = [(b["max"] if b["max"] is not None else b["value"]) - b["value"] for b in bars]
        ax.errorbar(xs, values, yerr=[low, high], fmt="none", ecolor=colors["fg"], elinewidth=0.8, capsize=2)
    labels = [f"{b['label']} (n={b['n']})" if spec.group_by else b["label"] for b in bars]
    ax.set_xticks(xs, labels, rotation=60, ha="right", fontsize=max(4, 7 - len(bars) // 20))
    tops = [b["max"] if b["max"] is not None else b["value"] for b in bars] if spec.group_by else values
    ax.set_ylabel(_field_label(ax, ax.yaxis, spec.field, tops), color=colors["muted"], fontsize=8)


def _draw_scatter(ax: Axes, spec: ScatterSpec, runs: Sequence[RunSummary], colors: Mapping[str, str]) -> None:
    data = scatter_data(runs, spec.x_field, spec.y_field, spec.size_field, spec.color_field)
    points = data["points"]
    title = f"{spec.y_field} vs {spec.x_field}"
    if data["dropped"]:
        title += f"  ({data['dropped']} run(s) without both values left out)"
    ax.set_title(title, color=colors["fg"], fontsize=9, loc="left")
    ax.set_xlabel(spec.x_field, color=colors["muted"], fontsize=8)
    ax.set_ylabel(spec.y_field, color=colors["muted"], fontsize=8)
    if not points:
        _note(ax, "no run has numbers in both fields", colors)
        return
    ax.set_xlabel(_field_label(ax, ax.xaxis, spec.x_field, [p["x"] for p in points], spec.log_x),
                  color=colors["muted"], fontsize=8)
    ax.set_ylabel(_field_label(ax, ax.yaxis, spec.y_field, [p["y"] for p in points], spec.log_y),
                  color=colors["muted"], fontsize=8)
    sizes = [p["size"] for p in points if p["size"] is not None]
    lo, hi = (min(sizes), max(sizes)) if sizes else (0.0, 0.0)

    def area(size: float | None) -> float:
        if size is None:
            return 24.0
        return 12.0 + 140.0 * ((size - lo) / (hi - lo) if hi > lo else 0.5)

    # Colours follow the order of the groups (as on the page), not the order of the points.
    groups = group_labels(runs, spec.color_field)[0] if spec.color_field else [None]
    for j, group in enumerate(groups):
        members = [p for p in points if p["group"] == group]
        if not members:
            continue
        ax.scatter(
            [p["x"] for p in members], [p["y"] for p in members], s=[area(p["size"]) for p in members],
            color=PALETTE[j % len(PALETTE)], alpha=0.85, linewidths=0, label=group,
        )
    if spec.group_by is not None:
        # Plot by groups, as the page draws it: each table group's mean as a diamond with ± std
        # whiskers in x and y, over the points (the same numbers as the chart CSV).
        for j, g in enumerate(scatter_groups(runs, spec.x_field, spec.y_field, spec.group_by)):
            ax.errorbar(
                [g["mean_x"]], [g["mean_y"]], xerr=[g["std_x"]], yerr=[g["std_y"]], fmt="D", markersize=7,
                color=PALETTE[j % len(PALETTE)],
                markeredgecolor=colors["fg"], markeredgewidth=0.6, elinewidth=1.0, capsize=3,
                label=f"mean ± std: {g['label']} (n={g['n']})",
            )
    if spec.log_x:
        ax.set_xscale("log", nonpositive="mask")
    if spec.log_y:
        ax.set_yscale("log", nonpositive="mask")
    style_axes(ax, colors)  # a new scale brings new tick labels
    if spec.color_field or spec.group_by is not None:
        _legend(ax, colors)


def _draw_box(ax: Axes, spec: BoxSpec, runs: Sequence[RunSummary], colors: Mapping[str, str]) -> None:
    data = box_data(runs, spec.field, spec.group_by)
    ax.set_title(spec.field + (f" by {spec.group_by}" if spec.group_by else ""), color=colors["fg"], fontsize=9,
                 loc="left")
    if not data["groups"]:
        _note(ax, f"no run has a number in {spec.field}", colors)
        return
    stats = [
        {"label": f"{g['label']} (n={g['n']})", "q1": g["q1"], "med": g["median"], "q3": g["q3"],
         "whislo": g["low"], "whishi": g["high"], "fliers": [p["value"] for p in g["points"] if p["outlier"]]}
        for g in data["groups"]
    ]
    ax.bxp(
        stats,
        showfliers=True,
        patch_artist=True,
        boxprops={"facecolor": PALETTE[0] + "55", "edgecolor": PALETTE[0]},
        medianprops={"color": colors["fg"]},
        whiskerprops={"color": colors["muted"]},
        capprops={"color": colors["muted"]},
        flierprops={"marker": "o", "markersize": 3, "markerfacecolor": PALETTE[3], "markeredgewidth": 0},
    )
    for i, g in enumerate(data["groups"], start=1):
        inner = [p["value"] for p in g["points"] if not p["outlier"]]
        jitter = [i + 0.18 * math.sin(k * 2.399) for k in range(len(inner))]  # golden-angle spread
        ax.scatter(jitter, inner, s=6, color=colors["fg"], alpha=0.6, linewidths=0)
    ax.tick_params(axis="x", labelrotation=30)
    values = [p["value"] for g in data["groups"] for p in g["points"]]
    ax.set_ylabel(_field_label(ax, ax.yaxis, spec.field, values), color=colors["muted"], fontsize=8)


__all__ = ["PNG_DPI", "Theme", "binary_unit", "bytes_axis", "is_bytes_column", "is_png", "png_dpi",
           "render_chart_png", "style_axes", "warm_up_in_background"]
