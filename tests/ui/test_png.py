"""Chart PNGs (issue 15): the wall-time axis in one unit, same-name runs told apart in the legend,
and the image still a 300-DPI PNG. matplotlib draws for real; nothing is mocked."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from traceml_ai.runs.analysis import LineSpec
from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.png import png_dpi, render_chart_png, run_labels


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    root = tmp_path_factory.mktemp("png") / "traceml" / "runs"
    generate(root, runs=4, seed=0)
    original = next(root.glob("*_baseline_*"))
    twin = root / "20261201-090000_baseline_beef"
    shutil.copytree(original, twin)
    run = json.loads((twin / "run.json").read_text(encoding="utf-8"))
    run["id"] = twin.name
    (twin / "run.json").write_text(json.dumps(run), encoding="utf-8")
    s = RunStore([root])
    s.poll()
    return s


def test_runs_sharing_a_name_get_their_short_id_in_the_legend(store: RunStore) -> None:
    runs = store.runs()
    labels = run_labels(runs)
    baselines = sorted(labels[r.key] for r in runs if r.name == "baseline")
    assert len(baselines) == 2 and baselines[1] == "baseline · beef"
    assert baselines[0].startswith("baseline · ") and baselines[0] != baselines[1]
    assert all(labels[r.key] == r.name for r in runs if r.name != "baseline")  # unique names unchanged


def test_a_wall_time_line_chart_renders_as_a_300_dpi_png(store: RunStore) -> None:
    pytest.importorskip("matplotlib")
    runs = store.runs()
    spec = LineSpec(tuple(r.key for r in runs), ("val/auc",), x="time")
    data = render_chart_png(spec, runs, [(r, store.history(r.key)) for r in runs], max_points=200)
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and round(png_dpi(data) or 0) == 300
    Path(store.roots[0]).parent.joinpath("chart.png").write_bytes(data)  # for a human look, next to the runs


def test_a_scatter_plotted_by_groups_draws_each_group_mean_with_its_std_as_the_csv_gives_it(store: RunStore) -> None:
    """Plot by groups in the scatter PNG: one mean ± std mark per table group, at the numbers the
    chart CSV exports, named with its n in the legend (as the page draws it)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from traceml_ai.runs.analysis import ScatterSpec, scatter_group_csv_rows
    from traceml_ai.ui.png import _THEMES, _draw_scatter

    runs = store.runs()
    spec = ScatterSpec(tuple(r.key for r in runs), "config.model.hidden", "summary.test/auc",
                       group_by="config.model.dropout")
    _, rows = scatter_group_csv_rows(runs, spec.x_field, spec.y_field, "config.model.dropout")
    assert len(rows) == 2  # dropout 0.1 and 0.2 among the runs with both values
    ax = Figure().subplots()
    _draw_scatter(ax, spec, runs, _THEMES["dark"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    drawn = {}
    for container in ax.containers:  # one errorbar per group: (mark, caps, (x whisker, y whisker))
        mark, _caps, (x_bar, y_bar) = container
        (x0, _), (x1, _) = x_bar.get_segments()[0]
        (_, y0), (_, y1) = y_bar.get_segments()[0]
        drawn[container.get_label()] = (mark.get_xdata()[0], mark.get_ydata()[0], (x1 - x0) / 2, (y1 - y0) / 2)
    assert len(drawn) == len(rows)
    for label, n, mean_x, std_x, mean_y, std_y in rows:
        assert f"mean ± std: {label} (n={n})" in legend
        assert drawn[f"mean ± std: {label} (n={n})"] == pytest.approx((mean_x, mean_y, std_x, std_y))
    ungrouped = Figure().subplots()
    _draw_scatter(ungrouped, ScatterSpec(spec.keys, spec.x_field, spec.y_field), runs, _THEMES["dark"])
    assert ungrouped.get_legend() is None and not ungrouped.get_lines()  # points only
    data = render_chart_png(spec, runs)
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and round(png_dpi(data) or 0) == 300


@pytest.mark.parametrize("band", ["minmax", "std"])
def test_a_line_chart_plotted_by_groups_draws_the_band_the_page_shows_at_the_csv_numbers(
    store: RunStore, band: str,
) -> None:
    """Plot by groups in the line PNG: each group's mean inside the band chosen on the page (min–max
    or ± std), the band's edges at the chart CSV's min/max or mean ± std of each step."""
    pytest.importorskip("matplotlib")
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure

    from traceml_ai.runs.analysis import line_group_csv_rows
    from traceml_ai.ui.png import _THEMES, _draw_lines

    runs = store.runs()
    histories = [(r, store.history(r.key)) for r in runs]
    spec = LineSpec(tuple(r.key for r in runs), ("val/auc",), group_by="config.model.dropout", band=band)  # type: ignore[arg-type]
    header, rows = line_group_csv_rows(histories, spec.metrics, "config.model.dropout")
    assert header[2:] == ["mean val/auc", "min val/auc", "max val/auc", "std val/auc", "n_runs"]
    groups = list(dict.fromkeys(row[0] for row in rows))
    assert len(groups) == 2
    ax = Figure().subplots()
    _draw_lines([ax], spec, histories, 200, _THEMES["dark"])
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == len(groups)  # one shaded band per group, under its mean line
    text = "min–max band" if band == "minmax" else "± population std band"  # std over n, not n - 1
    n_runs = {g: sum(1 for r in runs if str(r.params.get("model.dropout")) == g) for g in groups}
    # (a bare figure leaves the legend little room: its labels are wrapped to fit)
    def words(t: str) -> str:
        return "".join(t.split())

    assert [words(t.get_text()) for t in ax.get_legend().get_texts()] == [
        words(f"{g} ({n_runs[g]} runs)") for g in groups]
    assert words(ax.get_legend().get_title().get_text()) == words(f"mean by config.model.dropout, {text}")
    widths = []
    for group, poly in zip(groups, bands, strict=True):
        mine = [r for r in rows if r[0] == group]
        want_low = [r[3] if band == "minmax" else r[2] - r[5] for r in mine]
        want_high = [r[4] if band == "minmax" else r[2] + r[5] for r in mine]
        verts = poly.get_paths()[0].vertices
        by_step: dict[float, list[float]] = {}
        for x, y in verts:
            by_step.setdefault(float(x), []).append(float(y))
        for r, lo, hi in zip(mine, want_low, want_high, strict=True):
            ys = by_step[float(r[1])]
            assert min(ys) == pytest.approx(lo) and max(ys) == pytest.approx(hi)
        widths += [hi - lo for lo, hi in zip(want_low, want_high, strict=True)]
    assert max(widths) > 0  # a band, not a line
    data = render_chart_png(spec, runs, histories, max_points=200)
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and round(png_dpi(data) or 0) == 300


def test_the_group_legend_of_a_line_png_fits_the_image_and_gives_each_groups_run_count(tmp_path: Path) -> None:
    """The review's case: runs grouped by a param some lack ("(none)"), ± std band: the legend's
    last entry was cut at the image's right edge, and no entry said how many runs it averages."""
    pytest.importorskip("matplotlib")
    from tests.cli.test_runs_cli_readers import write_run
    from traceml_ai.ui.png import chart_figure

    root = tmp_path / "runs"
    run = {"status": "completed", "started_at": "2026-11-30T10:00:00Z"}
    for i in range(7):
        params = "group_name: a\n" if i < 4 else "group_name: a-much-longer-group-name-than-usual\n" if i < 6 else None
        write_run(root, f"r{i}", {"name": f"r{i}", **run}, params=params,
                  rows=[{"step": s, "val/auc": 0.5 + 0.01 * s + 0.001 * i} for s in range(20)])
    store = RunStore([root])
    store.poll()
    runs = store.runs()
    histories = [(r, store.history(r.key)) for r in runs]
    spec = LineSpec(tuple(r.key for r in runs), ("val/auc",), group_by="config.group_name", band="std")
    fig = chart_figure(spec, runs, histories, max_points=200)
    fig.canvas.draw()
    legend = fig.axes[0].get_legend()
    texts = [t.get_text() for t in legend.get_texts()]
    want = ["a (4 runs)", "a-much-longer-group-name-than-usual (2 runs)", "(none) (1 run)"]
    assert ["".join(t.split()) for t in texts] == ["".join(t.split()) for t in want]  # wrapped, not cut
    assert texts[0] == want[0] and "\n" in texts[1]
    title = legend.get_title().get_text()
    assert "".join(title.split()) == "".join("mean by config.group_name, ± population std band".split())
    renderer = fig.canvas.get_renderer()
    width, height = fig.canvas.get_width_height()
    for artist in [legend.get_title(), *legend.get_texts()]:
        box = artist.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= width, f"{artist.get_text()!r} runs off the image: {box.x1} > {width}"
        assert 0 <= box.y0 and box.y1 <= height
