"""The viewer's JSON API through a real Starlette app (docs/viewer-api.md; DESIGN §4)."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.runs.writer import iso_utc
from traceml_ai.ui.app import create_app
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer

TOKEN = "test-token-0123456789"
HOST = "127.0.0.1:8765"


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    generate(tmp_path / "traceml" / "runs", runs=24, seed=0)
    return tmp_path


def _client(workspace: Path, *, cache: bool = True) -> tuple[TestClient, Viewer]:
    root = workspace / "traceml" / "runs"
    store = RunStore([root])
    folder = CacheFolder(workspace / "traceml" / ".cache", roots=[root]) if cache else None
    viewer = Viewer(store, folder, refresh_interval_seconds=0.2)
    viewer.poll()
    app = create_app(viewer, TOKEN, lambda: {HOST, "localhost:8765"})
    client = TestClient(app, base_url=f"http://{HOST}")
    return client, viewer


def _auth(client: TestClient) -> TestClient:
    client.headers["x-traceml-token"] = TOKEN
    return client


def _key(viewer: Viewer, name: str) -> str:
    return next(r.key for r in viewer.store.runs() if r.name == name)


def test_every_request_needs_the_token(workspace: Path) -> None:
    client, _ = _client(workspace)
    for path in ("/", "/api/runs", "/api/table", "/static/app.js", "/api/file?key=x&name=run.json"):
        response = client.get(path)
        assert response.status_code == 403, path
        assert "content-security-policy" in response.headers
    assert client.get("/api/runs", headers={"x-traceml-token": "wrong"}).status_code == 403
    client.cookies.set("traceml_token", "wrong")
    assert client.get("/api/runs").status_code == 403


def test_first_visit_sets_a_cookie_and_drops_the_token_from_the_url(workspace: Path) -> None:
    client, _ = _client(workspace)
    response = client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    # The client now holds the cookie: the API answers without the token in the URL.
    assert client.get("/api/runs").status_code == 200


def test_a_foreign_host_header_is_refused_even_with_the_token(workspace: Path) -> None:
    client, _ = _client(workspace)
    response = client.get("/api/runs", headers={"x-traceml-token": TOKEN, "host": "evil.example:8765"})
    assert response.status_code == 403


def test_strict_content_security_policy_on_every_response(workspace: Path) -> None:
    client = _auth(_client(workspace)[0])
    for path in ("/", "/api/runs"):
        csp = client.get(path).headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "http" not in csp.replace("https", "")


def test_runs_then_only_changed_runs(workspace: Path) -> None:
    client, viewer = _client(workspace)
    _auth(client)
    first = client.get("/api/runs").json()
    assert first["full"] and len(first["runs"]) == 24
    stale = next(r for r in first["runs"] if r["name"] == "stale-run")
    assert stale["display_status"] == "stale"
    assert client.get(f"/api/runs?since={first['version']}").json()["runs"] == []
    # The stale run writes a new heartbeat: the next poll sends that run only.
    run_json = Path(stale["path"]) / "run.json"
    meta = json.loads(run_json.read_text())
    meta["heartbeat_at"] = iso_utc(time.time())
    run_json.write_text(json.dumps(meta))
    viewer.poll()
    later = client.get(f"/api/runs?since={first['version']}").json()
    assert [r["name"] for r in later["runs"]] == ["stale-run"]
    assert later["runs"][0]["display_status"] == "running"


def _lines(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    return [json.loads(line) for line in response.content.splitlines()]


def test_the_streamed_listing_is_the_listing_a_chunk_of_rows_a_line(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("traceml_ai.ui.service.RUNS_CHUNK", 5)
    client = _client(workspace)[0]
    _auth(client)
    plain = client.get("/api/runs?since=0").json()
    lines = _lines(client.get("/api/runs?since=0&stream=1"))
    header, chunks, end = lines[0], lines[1:-1], lines[-1]
    assert header == {**{k: v for k, v in plain.items() if k != "runs"}, "count": 24}
    assert [len(c["runs"]) for c in chunks] == [5, 5, 5, 5, 4]
    assert [r for c in chunks for r in c["runs"]] == plain["runs"]
    assert end == {"end": True, "count": 24}
    # A delta streams the same way: a header and the changed runs.
    assert _lines(client.get(f"/api/runs?since={plain['version']}&stream=1")) == [
        {**{k: v for k, v in client.get(f"/api/runs?since={plain['version']}").json().items() if k != "runs"},
         "count": 0},
        {"end": True, "count": 0},
    ]


def test_a_run_that_changes_while_the_listing_streams_comes_with_the_next_delta(workspace: Path) -> None:
    client, viewer = _client(workspace)
    chunks = viewer.runs_chunks(0, size=4)
    header = next(chunks)
    first = next(chunks)["runs"]
    changed = first[0]
    run_json = Path(changed.path) / "run.json"
    meta = json.loads(run_json.read_text())
    meta["notes"] = "changed while the page's listing streamed"
    run_json.write_text(json.dumps(meta))
    viewer.poll(refresh=True)  # (a Refresh: finished runs are re-read too)
    rest = [r for c in chunks if "runs" in c for r in c["runs"]]
    assert len(first) + len(rest) == header["count"] == 24
    later = _auth(client).get(f"/api/runs?since={header['version']}").json()
    notes = [r["notes"] for r in later["runs"] if r["key"] == changed.key]
    assert notes == ["changed while the page's listing streamed"]


def test_a_table_answer_brings_the_rows_of_its_first_runs(workspace: Path) -> None:
    client = _auth(_client(workspace)[0])
    by_key = {r["key"]: r for r in client.get("/api/runs").json()["runs"]}
    answer = client.get("/api/table", params={"sort": "-run.best.val/auc", "rows": 7}).json()
    assert [r["key"] for r in answer["rows"]] == answer["keys"][:7]
    assert answer["rows"] == [by_key[k] for k in answer["keys"][:7]]
    grouped = client.get("/api/table", params={"group": "config.data.dataset", "rows": 500}).json()
    assert [r["key"] for r in grouped["rows"]] == [k for g in grouped["groups"] for k in g["keys"]]
    assert "rows" not in client.get("/api/table").json()
    remembered = client.get("/api/table?remembered=1&rows=3").json()
    assert [r["key"] for r in remembered["rows"]] == remembered["keys"][:3] and "query" in remembered
    for bad in ("501", "-1", "many"):
        response = client.get(f"/api/table?rows={bad}")
        assert response.status_code == 400 and "rows" in response.json()["error"]


def test_table_applies_the_python_table_model(workspace: Path) -> None:
    client = _auth(_client(workspace)[0])
    body = client.get("/api/table", params=[("filter", "run.best.val/auc>=0.9"), ("sort", "-run.best.val/auc")]).json()
    assert body["error"] is None and 0 < body["shown"] < body["total"] == 24
    grouped = client.get("/api/table", params={"group": "config.data.dataset"}).json()
    assert [g["label"] for g in grouped["groups"]][-1] != "(none)" or len(grouped["groups"]) == 1
    assert sum(len(g["keys"]) for g in grouped["groups"]) == 24
    bad = client.get("/api/table", params={"filter": "name:/([/"}).json()
    assert bad["error"] and bad["shown"] == 24  # a bad filter is reported, the table still shows
    assert "run.best.val/auc" in body["columns"]["default"]
    not_number = client.get("/api/table", params={"filter": "run.best.val/auc>=abc"}).json()
    assert "'abc' is not a number" in not_number["error"] and not_number["shown"] == 24  # same error as the CLI
    # Issue 14 review: equality with a word on a number column, and a time column given no date.
    equal_word = client.get("/api/table", params={"filter": "run.best.val/auc=abc"}).json()
    assert equal_word["error"].endswith("holds numbers, so it would match no run; write e.g. run.best.val/auc=0.8")
    assert equal_word["shown"] == 24
    no_date = client.get("/api/table", params={"filter": "started>abc"}).json()
    assert "'abc' is not a date or time, and started holds times (ISO-8601 UTC)" in no_date["error"]
    # Issue 14: a status no run can have, with the CLI's message; the table still shows every run.
    no_status = client.get("/api/table", params={"filter": "status=faild"}).json()
    assert no_status["error"] == ("filter 'status=faild': 'faild' is not a run status; did you mean 'failed'? "
                                  "the statuses are running, running?, stale, completed, failed, killed, "
                                  "legacy, unknown")
    assert no_status["shown"] == 24
    # Issue 13 review: a verdict no run can have (a typo) is reported the same way, never 0 runs.
    no_verdict = client.get("/api/table", params={"filter": "perf.verdict=inputbound"}).json()
    assert no_verdict["error"].startswith("filter 'perf.verdict=inputbound': 'inputbound' is not a verdict; "
                                          "did you mean 'input_bound'? the verdicts are ")
    assert no_verdict["shown"] == 24
    year = client.get("/api/table", params={"filter": "started>=2000"}).json()
    assert year["error"] is None and year["shown"] == 24
    # Issue 15 review: beside a search, another filter and a grouping, such a filter is left out alone;
    # the table never falls back to every run.
    view = [("search", "base"), ("filter", "run.best.val/auc>=0.5"), ("group", "config.data.dataset")]
    good = client.get("/api/table", params=view).json()
    mixed = client.get("/api/table", params=[*view, ("filter", "run.best.val/auc>=abc")]).json()
    assert good["error"] is None and 0 < good["shown"] < 24
    assert "'abc' is not a number" in mixed["error"]
    assert (mixed["shown"], mixed["keys"], mixed["groups"]) == (good["shown"], good["keys"], good["groups"])


def test_the_remembered_view_table_answers_the_question_the_page_will_ask(workspace: Path) -> None:
    client = _auth(_client(workspace)[0])
    # No remembered view yet: the default question.
    first = client.get("/api/table", params={"remembered": "1"}).json()
    assert first["query"] == {"filters": [], "sort": [], "group": None, "search": "", "status": [],
                              "columns": None, "show_hidden": False}
    assert first["keys"] == client.get("/api/table").json()["keys"]
    view = {"view": "runs", "filters": [{"column": "run.best.val/auc", "expr": ">=0.5"}, {"column": 3}],
            "sort": ["-run.best.val/auc"], "group": "config.data.dataset", "search": "  resnet ",
            "status": "completed", "columns": ["name", "run.best.val/auc"], "showHidden": "yes"}
    assert client.put("/api/ui-state", json=view).json() == {"ok": True}
    body = client.get("/api/table", params={"remembered": "1"}).json()
    assert body["query"] == {"filters": ["run.best.val/auc:>=0.5"], "sort": ["-run.best.val/auc"],
                             "group": "config.data.dataset", "search": "resnet", "status": ["completed"],
                             "columns": ["name", "run.best.val/auc"], "show_hidden": False}
    asked = client.get("/api/table", params=[("filter", "run.best.val/auc:>=0.5"), ("sort", "-run.best.val/auc"),
                                             ("group", "config.data.dataset"), ("search", "resnet"),
                                             ("status", "completed"), ("columns", "name,run.best.val/auc")]).json()
    assert 0 < body["shown"] < 24
    assert {k: v for k, v in body.items() if k != "query"} == asked
    running = client.put("/api/ui-state", json={"status": "running", "columns": []})
    assert running.status_code == 200
    assert client.get("/api/table", params={"remembered": "1"}).json()["query"]["status"] == ["running", "running?"]


def test_series_downsampled_with_gaps_and_a_30_run_limit(workspace: Path) -> None:
    client, viewer = _client(workspace)
    _auth(client)
    key = _key(viewer, "nan-loss")
    body = client.post("/api/series", json={"keys": [key], "metrics": ["train/loss"], "x": "step", "ema": 0.5}).json()
    (series,) = body["series"]
    assert series["y"][-1] is None  # the loss that went NaN is a gap
    assert len(series["smoothed"]) == len(series["y"])
    too_many = client.post("/api/series", json={"keys": [key] * 31, "metrics": ["train/loss"]})
    assert too_many.status_code == 400 and "at most 30" in too_many.json()["error"]
    assert client.post("/api/series", json={"keys": [key], "metrics": [], "x": "nope"}).status_code == 400


def test_a_live_runs_newest_spike_and_dip_survive_downsampling(tmp_path: Path) -> None:
    """A running run logs its newest steps into the last, partial min/max bucket; the chart must show
    a spike (and a dip) there as soon as they are logged, not only once the bucket fills up."""
    from traceml_ai.sdk.logger import Run

    root = tmp_path / "traceml" / "runs"
    run = Run(root, name="live", heartbeat_s=3600)
    for step in range(96):
        run.log(step, {"train/loss": 1.0})
    viewer = Viewer(RunStore([root]), None, refresh_interval_seconds=0.2, max_points_per_series=11)
    viewer.poll()
    client = _auth(TestClient(create_app(viewer, TOKEN, lambda: {HOST}), base_url=f"http://{HOST}"))
    key = _key(viewer, "live")

    def shown() -> dict[str, Any]:
        body = client.post("/api/series", json={"keys": [key], "metrics": ["train/loss"], "x": "step"}).json()
        (series,) = body["series"]
        return dict(series)

    first = shown()
    assert first["downsampled"] and first["raw_points"] == 96 and len(first["x"]) <= 11
    # 20 more steps: 11 points allow 3 buckets, now 64 steps wide, so steps 64..115 are a partial bucket
    for step in range(96, 116):
        run.log(step, {"train/loss": 50.0 if step == 101 else -20.0 if step == 108 else 1.0})
    viewer.poll()
    series = shown()
    assert series["raw_points"] == 116 and len(series["x"]) <= 11
    points = dict(zip(series["x"], series["y"], strict=True))
    assert points[101] == 50.0 and points[108] == -20.0  # the spike and the dip, at their steps
    assert points[115] == 1.0  # and the newest point
    run.finish()


def test_smoothing_weight_is_how_much_of_the_past_a_point_keeps(tmp_path: Path) -> None:
    """The chart's EMA slider at 0.9 smooths hard: after the loss jumps from 0 to 1 the smoothed line
    rises slowly (TensorBoard's debiased EMA), at 0.1 it follows the jump almost at once."""
    from traceml_ai.sdk.logger import Run

    root = tmp_path / "traceml" / "runs"
    run = Run(root, name="jump", heartbeat_s=3600)
    for step in range(20):
        run.log(step, {"train/loss": 0.0 if step < 10 else 1.0})
    run.finish()
    viewer = Viewer(RunStore([root]), None, refresh_interval_seconds=0.2)
    viewer.poll()
    client = _auth(TestClient(create_app(viewer, TOKEN, lambda: {HOST}), base_url=f"http://{HOST}"))
    key = _key(viewer, "jump")

    def smoothed(weight: float) -> list[float]:
        body = client.post("/api/series", json={"keys": [key], "metrics": ["train/loss"], "x": "step",
                                                 "ema": weight}).json()
        return list(body["series"][0]["smoothed"])

    def expected(weight: float, k: int) -> float:  # the debiased EMA written out, over steps 0..k
        num = sum((1 - weight) * weight ** (k - i) * (0.0 if i < 10 else 1.0) for i in range(k + 1))
        return num / (1 - weight ** (k + 1))

    hard, light = smoothed(0.9), smoothed(0.1)
    assert hard[:10] == [0.0] * 10 and light[:10] == [0.0] * 10
    assert hard[10] == pytest.approx(expected(0.9, 10)) and hard[10] < 0.2  # barely moved at the jump
    assert light[10] == pytest.approx(expected(0.1, 10)) and light[10] > 0.85  # nearly followed it
    assert hard == pytest.approx([expected(0.9, k) for k in range(20)])
    assert all(a < b for a, b in itertools.pairwise(hard[10:])) and hard[-1] < 1.0  # still catching up


def test_unknown_runs_are_404_but_a_fault_of_the_viewer_is_a_logged_500(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug must not look like a plausible answer: a KeyError from a lookup in our own code once
    became "404 not found", and any error while building a series a "could not be plotted" warning.
    (The faults are injected: no real input reaches a bug the suite knows of.)"""
    client, viewer = _client(workspace)
    _auth(client)
    key = _key(viewer, "baseline")
    for path, params in (("/api/run", {"key": "/nope"}), ("/api/file", {"key": "/nope", "name": "run.json"}),
                         ("/api/file", {"key": key, "name": "secret.txt"})):
        response = client.get(path, params=params)
        assert response.status_code == 404 and response.json()["error"], path
    assert client.get("/api/runs/%2Fnope/telemetry").status_code == 404
    assert client.get("/api/runs/%2Fnope/performance").status_code == 404  # was a 500 after a merge

    def lookup_bug(*args: object, **kwargs: object) -> object:
        return {}["best"]  # a KeyError raised by our own code, not "no such run"

    monkeypatch.setattr(viewer.store, "details", lookup_bug)
    with caplog.at_level("ERROR", logger="traceml.ui"):
        response = client.get("/api/run", params={"key": key})
    assert response.status_code == 500 and "internal error" in response.json()["error"]
    assert any("/api/run" in r.getMessage() and r.exc_info for r in caplog.records)

    monkeypatch.setattr("traceml_ai.runs.analysis.line_points", lookup_bug)  # (imported where a series is built)
    response = client.post("/api/series", json={"keys": [key], "metrics": ["train/loss"]})
    assert response.status_code == 500 and "internal error" in response.json()["error"]
    assert client.get("/api/runs").status_code == 200  # the viewer goes on


def test_file_view_only_serves_the_six_files_of_known_runs(workspace: Path) -> None:
    client, viewer = _client(workspace)
    _auth(client)
    key = _key(viewer, "baseline")
    ok = client.get("/api/file", params={"key": key, "name": "run.json"})
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
    assert json.loads(ok.text)["name"] == "baseline"
    secret = workspace / "secret.txt"
    secret.write_text("top secret")
    for name in ("../../secret.txt", "../../../secret.txt", "/etc/passwd", "logs", "checkpoints/x.pt"):
        response = client.get("/api/file", params={"key": key, "name": name})
        assert response.status_code == 404, name
        assert "top secret" not in response.text
    assert client.get("/api/file", params={"key": str(workspace), "name": "run.json"}).status_code == 404
    # A viewable name that is a symlink leaving the root is refused too.
    link_run = Path(key)
    (link_run / "config.json").unlink()
    os.symlink(secret, link_run / "config.json")
    assert client.get("/api/file", params={"key": key, "name": "config.json"}).status_code == 404
    # So is one into a sibling folder whose name starts with the root's ("runs-private" beside "runs").
    private = workspace / "traceml" / "runs-private"
    private.mkdir()
    (private / "params.yaml").write_text("top secret: 1\n")
    (link_run / "params.yaml").unlink()
    os.symlink(private / "params.yaml", link_run / "params.yaml")
    response = client.get("/api/file", params={"key": key, "name": "params.yaml"})
    assert response.status_code == 404 and "top secret" not in response.text


def test_values_from_run_files_come_back_as_data_not_markup(workspace: Path) -> None:
    root = workspace / "traceml" / "runs"
    evil = root / "20261130-101500_evil_abcd"
    evil.mkdir()
    (evil / "run.json").write_text(json.dumps({"name": "<img src=x onerror=alert(1)>", "status": "completed"}))
    client = _auth(_client(workspace)[0])
    response = client.get("/api/runs")
    assert response.headers["content-type"] == "application/json"
    names = [r["name"] for r in response.json()["runs"]]
    assert "<img src=x onerror=alert(1)>" in names


def test_hide_writes_only_into_the_cache_folder(workspace: Path) -> None:
    client, viewer = _client(workspace)
    _auth(client)
    key = _key(viewer, "killed-run")
    assert client.post("/api/hide", json={"keys": [key], "hidden": True}).json()["hidden"] == [key]
    assert key not in client.get("/api/table").json()["keys"]
    assert key in client.get("/api/table", params={"show_hidden": "1"}).json()["keys"]
    stored = json.loads((workspace / "traceml" / ".cache" / "hidden-runs.json").read_text())
    assert key in json.dumps(stored)
    assert client.post("/api/hide", json={"keys": [key], "hidden": False}).json()["hidden"] == []


def test_ui_state_round_trip_and_limits(workspace: Path) -> None:
    client = _auth(_client(workspace)[0])
    assert client.get("/api/ui-state").json() == {}
    state = {"view": "runs", "sort": ["-run.best.val/auc"], "ema": 0.6}
    assert client.put("/api/ui-state", json=state).json() == {"ok": True}
    assert client.get("/api/ui-state").json() == state
    assert client.put("/api/ui-state", json=[1, 2]).status_code == 400
    assert client.put("/api/ui-state", content=b"{not json",
                      headers={"content-type": "application/json"}).status_code == 400
    # Not declared as JSON: refused before the handler (a form or a text/plain fetch of another page).
    assert client.put("/api/ui-state", content=b"{}").status_code == 415


def test_details_for_the_inspector(workspace: Path) -> None:
    client, viewer = _client(workspace)
    _auth(client)
    body = client.get("/api/run", params={"key": _key(viewer, "failed-run")}).json()
    assert body["run"]["error"]["type"] == "OutOfMemoryError"
    assert "Traceback (most recent call last)" in body["traceback"]
    assert body["files"]["run.json"] > 0 and body["files"]["aggregator/final_summary.json"] is None
    assert client.get("/api/run", params={"key": "/nope"}).status_code == 404


def test_one_unplottable_run_never_breaks_the_others_charts(workspace: Path) -> None:
    root = workspace / "traceml" / "runs"
    odd = root / "20261130-101500_bigstep_abcd"
    odd.mkdir()
    (odd / "metrics.jsonl").write_text('{"step": 99999999999999999999999, "m": 1}\n{"step": 1, "m": 2}\n')
    client, viewer = _client(workspace)
    _auth(client)
    keys = [_key(viewer, "bigstep"), _key(viewer, "baseline")]
    body = client.post("/api/series", json={"keys": keys, "metrics": ["m", "val/auc"]}).json()
    by_key = {(s["key"], s["metric"]): s for s in body["series"]}
    assert by_key[(keys[0], "m")]["y"] == [2.0]  # the out-of-range step is a corrupt line, not a crash
    assert any("corrupt" in w for w in body["warnings"][keys[0]])
    assert by_key[(keys[1], "val/auc")]["raw_points"] > 0


def test_a_bad_filter_is_reported_and_the_others_still_apply(workspace: Path) -> None:
    client = _auth(_client(workspace)[0])
    good = client.get("/api/table", params={"filter": "run.best.val/auc>=0.9"}).json()
    both = client.get("/api/table", params=[("filter", "run.best.val/auc>=0.9"), ("filter", "name:/[/")]).json()
    assert both["error"] and "name:/[/" in both["error"]
    assert both["keys"] == good["keys"] and both["shown"] < 24


def test_host_names_are_case_insensitive_and_scripts_may_pass_the_token_in_the_url(workspace: Path) -> None:
    client, _ = _client(workspace)
    assert client.get("/api/runs", headers={"x-traceml-token": TOKEN, "host": "LOCALHOST:8765"}).status_code == 200
    response = client.get(f"/api/runs?token={TOKEN}", follow_redirects=False)
    assert response.status_code == 200 and len(response.json()["runs"]) == 24
