"""``GET /api/runs/{key}/performance-page``: the Performance view's one answer per run (the
telemetry and per-rank answers from one read; ``?from=&to=`` for a zoomed phase chart), through a real
Starlette app over real telemetry databases (docs/viewer-api.md; issue 13 items 2, 3 and 5)."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.conftest import capture_digits, run_traceml
from tests.diagnose.telemetry_db import RunSpec, write_run
from traceml_ai.diagnose import write_final_summary
from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.app import create_app
from traceml_ai.ui.service import Viewer

TOKEN = "test-token-0123456789"
HOST = "127.0.0.1:8765"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``baseline`` captured on 2 ranks x 300 steps (final summary), ``high-lr`` with a corrupt
    database, the others never captured."""
    root = tmp_path_factory.mktemp("perf_page") / "traceml" / "runs"
    generate(root, runs=4, seed=0)
    baseline = next(root.glob("*_baseline_*"))
    write_run(baseline, RunSpec(ranks=2, steps=300))
    write_final_summary(baseline)
    corrupt = next(root.glob("*_high-lr_*")) / "aggregator"
    corrupt.mkdir()
    (corrupt / "telemetry.sqlite").write_bytes(b"this is not a database\n" * 200)
    return root


def _client(root: Path) -> tuple[TestClient, Viewer]:
    viewer = Viewer(RunStore([root]), None, refresh_interval_seconds=0.2)
    viewer.poll()
    client = TestClient(create_app(viewer, TOKEN, lambda: {HOST}), base_url=f"http://{HOST}")
    client.headers["x-traceml-token"] = TOKEN
    return client, viewer


def _url(key: str, what: str) -> str:
    return f"/api/runs/{urllib.parse.quote(key, safe='')}/{what}"


def _key(viewer: Viewer, name: str) -> str:
    return next(r.key for r in viewer.store.runs() if r.name == name)


def _get(client: TestClient, url: str, **params: Any) -> Any:
    response = client.get(url, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_page_answer_holds_the_telemetry_and_per_rank_answers_of_one_read(root: Path) -> None:
    client, viewer = _client(root)
    key = _key(viewer, "baseline")
    page = _get(client, _url(key, "performance-page"))
    assert set(page) == {"telemetry", "performance", "stamp", "live"}
    assert page["live"] is False and isinstance(page["stamp"], str) and page["stamp"]
    # the same numbers as the two answers asked one by one
    assert page["telemetry"] == _get(client, _url(key, "telemetry"))
    assert page["performance"] == _get(client, _url(key, "performance"))
    assert page["performance"]["heatmap"]["ranks"] == [0, 1]
    # asked again with nothing changed: the same stamp, the same answer
    assert _get(client, _url(key, "performance-page")) == page


def test_a_zoomed_range_answers_the_breakdown_of_those_steps_at_the_same_points(root: Path) -> None:
    client, viewer = _client(root)
    key = _key(viewer, "baseline")
    whole = _get(client, _url(key, "performance"))["breakdown"]
    zoomed = _get(client, _url(key, "performance-page"), **{"from": 100, "to": 160})
    assert set(zoomed) == {"breakdown"}
    part = zoomed["breakdown"]
    assert part["range"] == [100, 160] and part["rank"] == whole["rank"]
    assert part["x"][0] >= 100 and part["x"][-1] <= 160
    assert part["bucket_steps"] <= whole["bucket_steps"]  # finer (or as fine) inside the range
    # the range may be given backwards; a word is refused with one line
    assert _get(client, _url(key, "performance-page"), **{"from": 160, "to": 100})["breakdown"]["x"] == part["x"]
    bad = client.get(_url(key, "performance-page"), params={"from": "abc", "to": "9"})
    assert bad.status_code == 400 and "from must be a number" in bad.text
    bad = client.get(_url(key, "performance-page"), params={"from": "nan", "to": "9"})
    assert bad.status_code == 400 and "finite" in bad.text


def test_unknown_uncaptured_and_corrupt_runs_are_answered_without_failing(root: Path) -> None:
    client, viewer = _client(root)
    assert client.get(_url("/nope", "performance-page")).status_code == 404
    plain = _get(client, _url(_key(viewer, "small-model"), "performance-page"))
    assert plain["telemetry"]["state"] == "none" and plain["performance"]["heatmap"]["state"] == "none"
    # the reason is said, not only the state: the page writes it where the panels would be
    assert "not captured" in plain["performance"]["heatmap"]["detail"]
    assert plain["performance"]["breakdown"] is None
    corrupt = _get(client, _url(_key(viewer, "high-lr"), "performance-page"))
    assert corrupt["telemetry"]["state"] == "corrupt"
    assert corrupt["performance"]["heatmap"]["state"] == "corrupt" and corrupt["performance"]["heatmap"]["detail"]
    assert _get(client, _url(_key(viewer, "high-lr"), "performance-page"), **{"from": 0, "to": 9}) == {
        "breakdown": None}


def test_the_answer_is_built_again_when_the_database_changes(tmp_path: Path) -> None:
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=2, seed=0)
    run = next(root.glob("*_baseline_*"))
    write_run(run, RunSpec(steps=40))
    write_final_summary(run)
    client, viewer = _client(root)
    key = _key(viewer, "baseline")
    first = _get(client, _url(key, "performance-page"))
    write_run(run, RunSpec(steps=40, seed=1))  # more rows: the database's stamp moves
    second = _get(client, _url(key, "performance-page"))
    assert second["stamp"] != first["stamp"]
    assert second["telemetry"] == _get(client, _url(key, "telemetry"))


@pytest.mark.timeout(600)  # a real 2-rank training first
def test_a_real_captured_run_answers_the_numbers_of_the_separate_answers_and_traceml_summary(
        tmp_path: Path) -> None:
    """On a run captured by ``traceml run`` (the digits example, 2 ranks, the planted straggler):
    the page answer equals ``/telemetry`` and ``/performance`` asked one by one, and its numbers
    are those ``traceml summary --json`` prints."""
    run = capture_digits(tmp_path, "ddp", ranks=2, plant="straggler")
    client, viewer = _client(run.parent)
    key = _key(viewer, "ddp")
    page = _get(client, _url(key, "performance-page"))
    assert page["live"] is False
    assert page["telemetry"] == _get(client, _url(key, "telemetry"))
    assert page["performance"] == _get(client, _url(key, "performance"))
    done = run_traceml("summary", str(run), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    heat = page["performance"]["heatmap"]
    assert heat["ranks"] == [0, 1]
    assert page["telemetry"]["diagnoses"]["findings"][0]["kind"] == summary["findings"][0]["kind"]
    assert page["telemetry"]["steps"]["warmup_steps"] == heat["warmup_steps"]
    # the breakdown is the rank the summary names the slowest, at every step it traced
    breakdown = page["performance"]["breakdown"]
    assert breakdown["rank"] == summary["step_time"]["worst_rank"]
    assert breakdown["x"] and breakdown["series"]
    # each rank's medians (after warm-up) are the summary's per-rank numbers
    per_rank = {r["rank"]: r for r in summary["step_time"]["per_rank"]}
    for rank, medians in zip(heat["ranks"], heat["medians"], strict=True):
        assert medians["outside_backward_ms"] == pytest.approx(per_rank[rank]["outside_backward_median_ms"], rel=1e-3)
