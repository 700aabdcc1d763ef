"""Plot by groups (issue 15 item 1): ``POST /api/series`` with ``group_by`` answers each group's mean
and band computed over the runs' full histories (the function the PNG/CSV export uses), then
downsampled for drawing, through the real app on run files written by hand."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.cli.test_runs_cli_readers import write_run
from traceml_ai.runs.analysis import line_groups
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.app import create_app
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer

TOKEN = "test-token-0123456789"
HOST = "127.0.0.1:8765"
STEPS = 2000
SPIKE_STEP = 1235
SPIKE = 50.0
GROUP = "config.data.dataset"


def _b(step: int) -> float:
    return 0.5 + 0.0001 * step  # rising: each bucket of its downsampling keeps its first and last step only


def write_spike_runs(root: Path) -> None:
    """Runs a and b (dataset cifar, 2,000 steps; a flat at 1 but for one spike, b rising) and c
    (dataset mnist, 100 steps)."""
    run = {"status": "completed", "started_at": "2026-11-30T10:00:00Z"}
    write_run(root, "a", {"name": "a", **run}, params="data:\n  dataset: cifar\n",
              rows=[{"step": s, "loss": SPIKE if s == SPIKE_STEP else 1.0} for s in range(STEPS)])
    write_run(root, "b", {"name": "b", **run}, params="data:\n  dataset: cifar\n",
              rows=[{"step": s, "loss": _b(s)} for s in range(STEPS)])
    write_run(root, "c", {"name": "c", **run}, params="data:\n  dataset: mnist\n",
              rows=[{"step": s, "loss": 2.0} for s in range(0, 100)])


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, Viewer, dict[str, str]]:
    root = tmp_path_factory.mktemp("groups") / "runs"
    write_spike_runs(root)
    viewer = Viewer(RunStore([root]), None, max_points_per_series=200)
    viewer.poll()
    client = TestClient(create_app(viewer, TOKEN, lambda: {HOST}), base_url=f"http://{HOST}")
    client.headers["x-traceml-token"] = TOKEN
    keys = {r.name: r.key for r in viewer.store.runs()}
    return client, viewer, keys


def _series(client: TestClient, keys: list[str], **extra: Any) -> dict[str, Any]:
    res = client.post("/api/series", json={"keys": keys, "metrics": ["loss"], "x": "step", **extra})
    assert res.status_code == 200, res.text
    return res.json()  # type: ignore[no-any-return]


def test_a_spike_the_per_run_downsampling_drops_at_its_step_is_in_the_groups_band(
    app: tuple[TestClient, Viewer, dict[str, str]],
) -> None:
    client, _, keys = app
    body = _series(client, [keys["a"], keys["b"], keys["c"]], group_by=GROUP)
    per_run = {s["key"]: s for s in body["series"]}
    # The downsampled series of b has no point at the spike's step: a band averaged from the drawn
    # points had only a there (n = 1, the band shrunk to the spike, the mean the spike itself).
    assert per_run[keys["b"]]["downsampled"] and SPIKE_STEP not in per_run[keys["b"]]["x"]
    groups = {g["label"]: g for g in body["groups"]}
    assert list(groups) == ["cifar", "mnist"]
    cifar = groups["cifar"]
    assert sorted(cifar["keys"]) == sorted([keys["a"], keys["b"]]) and cifar["metric"] == "loss"
    assert cifar["downsampled"] and cifar["raw_points"] == STEPS and len(cifar["step"]) <= 200
    i = cifar["step"].index(SPIKE_STEP)  # the spike survives the band's own downsampling
    assert cifar["max"][i] == SPIKE and cifar["min"][i] == pytest.approx(_b(SPIKE_STEP))
    assert cifar["n_runs"][i] == 2 and cifar["mean"][i] == pytest.approx((SPIKE + _b(SPIKE_STEP)) / 2)
    assert cifar["std"][i] == pytest.approx((SPIKE - _b(SPIKE_STEP)) / 2)
    assert max(cifar["max"]) == SPIKE and cifar["step"][0] == 0 and cifar["step"][-1] == STEPS - 1
    # A group of fewer steps than a chart draws is every step, not downsampled.
    assert not groups["mnist"]["downsampled"] and groups["mnist"]["step"] == list(range(100))
    assert set(groups["mnist"]["mean"]) == {2.0} and set(groups["mnist"]["n_runs"]) == {1}


def test_the_drawn_band_is_the_exports_band_at_the_steps_drawn(app: tuple[TestClient, Viewer, dict[str, str]]) -> None:
    client, viewer, keys = app
    chosen = [keys["a"], keys["b"]]
    body = _series(client, chosen, group_by=GROUP)
    histories = [(viewer.store.get(k), viewer.store.history(k)) for k in chosen]
    (full,) = line_groups(histories, "loss", GROUP)  # type: ignore[arg-type]
    (drawn,) = body["groups"]
    at = {int(s): j for j, s in enumerate(full.step.tolist())}
    for j, step in enumerate(drawn["step"]):
        k = at[step]
        assert [drawn[f][j] for f in ("mean", "min", "max", "std", "n_runs")] == [
            full.mean[k], full.min[k], full.max[k], full.std[k], full.n_runs[k]]
    # Each bucket's extremes of both band kinds are kept: the drawn band spans the full one.
    assert min(drawn["min"]) == full.min.min() and max(drawn["max"]) == full.max.max()
    hi = [m + s for m, s in zip(drawn["mean"], drawn["std"], strict=True)]
    assert max(hi) == pytest.approx(float((full.mean + full.std).max()))


def test_a_zoom_buckets_the_band_over_its_range_only(app: tuple[TestClient, Viewer, dict[str, str]]) -> None:
    client, _, keys = app
    body = _series(client, [keys["a"], keys["b"]], group_by=GROUP, x_range=[1200, 1300])
    (g,) = body["groups"]
    assert not g["downsampled"] and g["step"] == list(range(1199, 1302))  # one step beyond each edge
    assert g["max"][g["step"].index(SPIKE_STEP)] == SPIKE


def test_without_group_by_there_are_no_groups(app: tuple[TestClient, Viewer, dict[str, str]]) -> None:
    client, _, keys = app
    assert "groups" not in _series(client, [keys["a"]])


@pytest.mark.parametrize(("extra", "message"), [
    ({"group_by": "config.", "x": "step"}, "group_by"),
    ({"group_by": GROUP, "x": "time"}, "step by step"),
])
def test_a_bad_group_request_is_a_one_line_400(app: tuple[TestClient, Viewer, dict[str, str]],
                                               extra: dict[str, Any], message: str) -> None:
    client, _, keys = app
    res = client.post("/api/series", json={"keys": [keys["a"]], "metrics": ["loss"], **extra})
    assert res.status_code == 400 and message in res.json()["error"] and "\n" not in res.json()["error"]


def test_the_group_means_cover_every_run_asked_for_past_the_30_lines_a_chart_draws(tmp_path: Path) -> None:
    # 45 runs of one group, run i logging loss = i at every step: the mean over all of them is 22,
    # over the first 30 only it was 14.5 (issue 15 review: "silently use only the first 30").
    root = tmp_path / "runs"
    for i in range(45):
        write_run(root, f"r{i:02d}", {"name": f"r{i:02d}", "status": "completed",
                                      "started_at": "2026-11-30T10:00:00Z"},
                  params="data:\n  dataset: cifar\n", rows=[{"step": s, "loss": float(i)} for s in range(5)])
    viewer = Viewer(RunStore([root]), CacheFolder(tmp_path / ".cache", roots=[root]))
    viewer.poll()
    client = TestClient(create_app(viewer, TOKEN, lambda: {HOST}), base_url=f"http://{HOST}")
    client.headers["x-traceml-token"] = TOKEN
    keys = sorted((r.key for r in viewer.store.runs()), key=lambda k: viewer.store.get(k).name)  # type: ignore[union-attr]
    body = _series(client, keys, group_by=GROUP)
    (g,) = body["groups"]
    assert len(g["keys"]) == 45 and set(g["n_runs"]) == {45}
    assert g["mean"] == [pytest.approx(22.0)] * 5 and set(g["min"]) == {0.0} and set(g["max"]) == {44.0}
    assert len(body["series"]) == 30  # the lines of the first 30 only: the page draws the groups
    # The chart CSV the export button writes holds the same means, of all 45.
    res = client.post("/api/export/chart", json={"chart": "line", "keys": keys, "metrics": ["loss"], "x": "step",
                                                 "group_by": GROUP, "band": "minmax", "format": "csv"})
    assert res.status_code == 200, res.text
    table = list(csv.reader(Path(res.json()["path"]).read_text(encoding="utf-8").splitlines()))
    assert table[0][:3] == ["group", "step", "mean loss"] and len(table) == 6
    assert {float(r[2]) for r in table[1:]} == {22.0} and {r[-1] for r in table[1:]} == {"45"}
    # Without group_by the 30-line limit stands.
    res = client.post("/api/series", json={"keys": keys, "metrics": ["loss"], "x": "step"})
    assert res.status_code == 400 and "at most 30" in res.json()["error"]
    res = client.post("/api/export/chart", json={"chart": "line", "keys": keys, "metrics": ["loss"], "format": "csv"})
    assert res.status_code == 400 and "at most 30" in res.json()["error"]
