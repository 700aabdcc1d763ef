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
