"""The viewer's API on the reader and table-model cases of issue 15, through the real Starlette app:
natural sort, numeric filters, list tracebacks, text keys, a deleted history, the started_at time
axis, derived durations, differing params by default and the run's log."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from tests.cli.test_runs_cli_readers import write_run
from traceml_ai.runs.store import RunStore
from traceml_ai.runs.writer import iso_utc
from traceml_ai.ui.app import create_app
from traceml_ai.ui.service import MAX_FILE_BYTES, Viewer

TOKEN = "test-token-0123456789"
HOST = "127.0.0.1:8765"
START = "2026-11-30T10:00:00Z"
START_S = 1796032800.0  # START as Unix seconds


def _client(root: Path) -> tuple[TestClient, Viewer]:
    viewer = Viewer(RunStore([root]), None, refresh_interval_seconds=0.2)
    viewer.poll()
    client = TestClient(create_app(viewer, TOKEN, lambda: {HOST}), base_url=f"http://{HOST}")
    client.headers["x-traceml-token"] = TOKEN
    return client, viewer


def _done(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "status": "completed", "started_at": START, "ended_at": "2026-11-30T10:30:00Z",
            "duration_s": 1800.0, **extra}


def _names(client: TestClient, body: dict[str, Any]) -> list[str]:
    runs = {r["key"]: r["name"] for r in client.get("/api/runs").json()["runs"]}
    return [runs[k] for k in body["keys"]]


def test_table_sorts_text_naturally(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for i, name in enumerate(["run-10", "run-2", "run-1", "Run-3"]):
        write_run(root, f"r{i}", _done(name))
    client, _ = _client(root)
    body = client.get("/api/table", params={"sort": "name"}).json()
    assert _names(client, body) == ["run-1", "run-2", "Run-3", "run-10"]
    body = client.get("/api/table", params={"sort": "name", "group": "name"}).json()
    assert [g["label"] for g in body["groups"]] == ["run-1", "run-2", "Run-3", "run-10"]


def test_table_rejects_a_text_operand_on_a_number_column_and_numbers_never_match_text(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "a", _done("a"), params="width: 5\n", metrics={"best": {"auc": {"value": 0.9}}})
    write_run(root, "b", _done("b"), params="width: abc\n", metrics={"best": {"auc": {"value": 0.7}}})
    write_run(root, "c", _done("c"), params="width: null\n")
    client, _ = _client(root)
    bad = client.get("/api/table", params={"filter": "run.best.auc:>abc"}).json()
    assert bad["error"] == ("filter 'run.best.auc>abc': 'abc' is not a number, and run.best.auc holds numbers; "
                            "write e.g. run.best.auc>0.8")
    assert bad["shown"] == 3  # reported, not an empty table
    body = client.get("/api/table", params={"filter": "config.width:> 0"}).json()
    assert body["error"] is None and _names(client, body) == ["a"]


def test_inspector_joins_a_traceback_written_as_lines(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    lines = ["Traceback (most recent call last):", '  File "train.py", line 3, in <module>', "KeyError: 'x'"]
    write_run(root, "a", {"name": "broken", "status": "failed", "started_at": START,
                          "exit": {"code": 1, "error": {"type": "KeyError", "message": "'x'", "traceback": lines}}})
    client, viewer = _client(root)
    key = viewer.store.runs()[0].key
    body = client.get("/api/run", params={"key": key}).json()
    assert body["traceback"] == "\n".join(lines)


def test_text_keys_are_not_metrics_and_are_named_once(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    rows = [{"step": i, "loss": 1.0 / (i + 1), "phase": "val", "flag": True} for i in range(5)]
    write_run(root, "a", _done("phases"), rows=rows)
    client, _ = _client(root)
    (run,) = client.get("/api/runs").json()["runs"]
    assert run["metric_names"] == ["loss"]
    assert [w for w in run["warnings"] if "not numbers" in w] == [
        "metrics.jsonl: 2 key(s) hold only text or true/false values, not numbers, and are not plotted (flag, phase)"
    ]
    columns = client.get("/api/table").json()["columns"]["available"]
    assert "run.start.loss" in columns and not [c for c in columns if "phase" in c or "flag" in c]
    series = client.post("/api/series", json={"keys": [run["key"]], "metrics": ["loss"], "x": "step"}).json()
    assert [w for w in series["warnings"][run["key"]] if "not numbers" in w]  # once, with the chart too
    assert len([w for w in series["warnings"][run["key"]] if "not numbers" in w]) == 1


def test_a_deleted_history_resets_the_chart_with_a_warning(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    path = write_run(root, "a", {"name": "live", "status": "running", "started_at": START,
                                 "heartbeat_at": iso_utc(time.time())},
                     rows=[{"step": i, "loss": float(i)} for i in range(10)])
    client, viewer = _client(root)
    key = viewer.store.runs()[0].key
    ask = {"keys": [key], "metrics": ["loss"], "x": "step"}
    assert client.post("/api/series", json=ask).json()["series"][0]["raw_points"] == 10
    (path / "metrics.jsonl").unlink()
    viewer.poll()
    after = client.post("/api/series", json=ask).json()
    assert after["series"][0]["raw_points"] == 0 and after["series"][0]["y"] == []
    assert any("deleted after it was read" in w for w in after["warnings"][key])
    run = client.get("/api/runs").json()["runs"][0]
    assert any("deleted after it was read" in w for w in run["warnings"])
    (path / "metrics.jsonl").write_text(json.dumps({"step": 0, "loss": 7.0}) + "\n")
    back = client.post("/api/series", json=ask).json()
    assert back["series"][0]["y"] == [7.0] and not back["warnings"]


def test_wall_time_axis_starts_at_started_at_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    rows = [{"step": i, "loss": 1.0, "time": START_S + 60 + 10 * i} for i in range(3)]
    write_run(root, "a", _done("timed"), rows=rows)
    legacy = write_run(root, "b", None, rows=rows)  # no run.json: no started_at
    client, viewer = _client(root)
    keys = {r.name: r.key for r in viewer.store.runs()}
    one = client.post("/api/series", json={"keys": [keys["timed"]], "metrics": ["loss"], "x": "time"}).json()
    assert one["series"][0]["x"] == [60.0, 70.0, 80.0] and one["series"][0]["time_origin"] == "started_at"
    assert one["time_label"] == "time since start (s)"
    other = client.post("/api/series", json={"keys": [str(legacy)], "metrics": ["loss"], "x": "time"}).json()
    assert other["series"][0]["x"] == [0.0, 10.0, 20.0] and other["series"][0]["time_origin"] == "first_row"
    assert other["time_label"] == "time since first logged row (s)"
    both = client.post("/api/series", json={"keys": [keys["timed"], str(legacy)], "metrics": ["loss"],
                                            "x": "time"}).json()
    assert both["time_label"] == "time since start or first logged row (s)"
    assert client.post("/api/series", json={"keys": [keys["timed"]], "metrics": ["loss"]}).json()["time_label"] is None


def test_durations_are_derived_and_marked(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    now = time.time()
    write_run(root, "a", {"name": "live", "status": "running", "started_at": iso_utc(now - 600),
                          "heartbeat_at": iso_utc(now)})
    write_run(root, "b", {"name": "stuck", "status": "running", "started_at": iso_utc(now - 7200),
                          "heartbeat_at": iso_utc(now - 5400)})
    write_run(root, "c", {"name": "done", "status": "killed", "started_at": START, "ended_at": "2026-11-30T10:00:30Z"})
    write_run(root, "d", _done("written"))
    client, _ = _client(root)
    runs = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert 590 <= runs["live"]["duration_s"] <= 900 and runs["live"]["duration_derived"] is True
    assert runs["stuck"]["duration_s"] == 1800.0 and runs["stuck"]["duration_derived"] is True
    assert runs["done"]["duration_s"] == 30.0 and runs["done"]["duration_derived"] is True
    assert runs["written"]["duration_s"] == 1800.0 and runs["written"]["duration_derived"] is False
    body = client.get("/api/table", params={"sort": "duration_s"}).json()
    assert _names(client, body) == ["done", "live", "stuck", "written"]
    assert "duration_s" in body["columns"]["numeric"]


def test_default_columns_include_up_to_six_differing_params(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    write_run(root, "a", _done("a"), params="same: 1\nlr: 0.1\nopt: adam\n", metrics={"summary": {"acc": 0.9}})
    write_run(root, "b", _done("b"), params="same: 1\nlr: 0.01\nopt: sgd\n")
    client, _ = _client(root)
    default = client.get("/api/table").json()["columns"]["default"]
    assert default[6:] == ["config.lr", "config.opt", "summary.acc"]


def test_default_params_are_those_that_differ_in_the_order_params_yaml_lists_them(tmp_path: Path) -> None:
    """A sweep over optim.lr and model.width with eight more differing params: the defaults are the
    first six differing params as the training script wrote them, not the six first by name (which
    would be the data.* and a.* keys and leave out the swept lr)."""
    root = tmp_path / "runs"
    head = "same: 1\noptim.lr: {lr}\nmodel.width: {w}\n"
    tail = "".join(f"data.k{j}: {{v}}\n" for j in range(4)) + "".join(f"a.extra{j}: {{v}}\n" for j in range(4))
    write_run(root, "a", _done("a"), params=(head + tail).format(lr=0.1, w=64, v=1))
    write_run(root, "b", _done("b"), params=(head + tail).format(lr=0.01, w=128, v=2))
    client, _ = _client(root)
    body = client.get("/api/table").json()
    params = [c for c in body["columns"]["default"] if c.startswith("config.")]
    assert params == ["config.optim.lr", "config.model.width", "config.data.k0", "config.data.k1",
                      "config.data.k2", "config.data.k3"]
    assert [c for c in body["columns"]["shown"] if c.startswith("config.")] == params
    # "Differing params only" lists them all, in the same order.
    differing = client.get("/api/table", params={"differing": "1"}).json()["differing"]
    assert differing == [*params, *(f"config.a.extra{j}" for j in range(4))]


def test_the_run_log_is_viewable_tail_first(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    path = write_run(root, "a", _done("logged"))
    (path / "logs").mkdir()
    lines = [f"line {i:07d} " + "x" * 40 + "\n" for i in range(MAX_FILE_BYTES // 40)]
    (path / "logs" / "run.log").write_text("".join(lines))
    client, viewer = _client(root)
    key = viewer.store.runs()[0].key
    details = client.get("/api/run", params={"key": key}).json()
    assert details["files"]["logs/run.log"] == sum(map(len, lines))
    text = client.get("/api/file", params={"key": key, "name": "logs/run.log"}).text
    assert text.startswith("[TraceML: showing the last ")
    assert text.endswith(lines[-1]) and lines[0] not in text
    assert text.split("\n")[2].startswith("line ")  # starts at a whole line
    (path / "logs" / "run.log").write_text("small\n")
    assert client.get("/api/file", params={"key": key, "name": "logs/run.log"}).text == "small\n"
    assert client.get("/api/file", params={"key": key, "name": "logs/other.log"}).status_code == 404
