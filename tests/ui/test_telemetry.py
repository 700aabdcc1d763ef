"""``GET /api/runs/{key}/telemetry`` through a real Starlette app over real telemetry databases
(DESIGN §4; docs/viewer-api.md). The databases are written with the aggregator's schema by
``tests/diagnose/telemetry_db.py``; the browser test (test_browser.py) uses a run captured by the real
``traceml run``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
import urllib.parse
from pathlib import Path

import orjson
import pytest
from starlette.testclient import TestClient

from tests.conftest import run_traceml
from tests.diagnose.telemetry_db import GIB, HEALTHY_CPU, T0_NS, RunSpec, TelemetryDB, cpu_events, write_run
from traceml_ai.diagnose import write_final_summary
from traceml_ai.runs.fake import generate
from traceml_ai.runs.model import RunSummary
from traceml_ai.runs.store import RunStore
from traceml_ai.telemetry import schema
from traceml_ai.telemetry.sqlite import read_only_uri
from traceml_ai.ui.app import create_app
from traceml_ai.ui.service import Viewer
from traceml_ai.ui.telemetry import LOG_TAIL_LINES, MAX_POINTS, TelemetryViews

TOKEN = "test-token-0123456789"
HOST = "127.0.0.1:8765"
XSS_LINE = "<img src=x onerror=alert(1)>"


def _log(run_dir: Path, rank: int | str, lines: list[str]) -> Path:
    path = run_dir / "aggregator" / f"rank_{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    return path


def _run_dir(root: Path, name: str) -> Path:
    return next(root.glob(f"*_{name}_*"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four fake runs: ``baseline`` captured on 2 GPU ranks (final summary, logs, a loss report),
    ``high-lr`` with a corrupt database, ``small-model`` with telemetry but no final summary yet,
    ``failed-run`` never captured."""
    root = tmp_path_factory.mktemp("telemetry") / "traceml" / "runs"
    generate(root, runs=4, seed=0)

    baseline = _run_dir(root, "baseline")
    write_run(baseline, RunSpec(ranks=2, steps=80, gpu=True,
                                peak_alloc=lambda rank, step: (10 + 0.01 * step) * GIB,
                                gpu_util=lambda t: 40.0, gpu_temp=lambda t: 50.0 + t,
                                gpu_power=lambda t: 150.0 + 10 * t, gpu_power_limit=300.0))
    write_final_summary(baseline)
    _log(baseline, 0, ["stdout | epoch 0: loss 2.31", f"stderr | {XSS_LINE}", "stdout | epoch 1: loss 1.02"])
    _log(baseline, 1, ["stderr | rank 1 warning: slow disk", "a line without a stream"])
    (baseline / "aggregator" / "finalization_warning.json").write_text(json.dumps({
        "schema_version": 1, "session_id": "s", "summary": ["rank 1 dropped 3 batches (its send queue was full)"],
    }))

    corrupt = _run_dir(root, "high-lr")
    (corrupt / "aggregator").mkdir()
    (corrupt / "aggregator" / "telemetry.sqlite").write_bytes(b"this is not a database\n" * 200)
    _log(corrupt, 0, ["stdout | still readable"])

    write_run(_run_dir(root, "small-model"), RunSpec(ranks=1, steps=30))
    return root


def _client(root: Path) -> tuple[TestClient, Viewer]:
    viewer = Viewer(RunStore([root]), None, refresh_interval_seconds=0.2)
    viewer.poll()
    client = TestClient(create_app(viewer, TOKEN, lambda: {HOST}), base_url=f"http://{HOST}")
    client.headers["x-traceml-token"] = TOKEN
    return client, viewer


def _get(client: TestClient, key: str) -> dict:  # type: ignore[type-arg]
    response = client.get(f"/api/runs/{urllib.parse.quote(key, safe='')}/telemetry")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()  # type: ignore[no-any-return]


def _key(viewer: Viewer, name: str) -> str:
    return next(r.key for r in viewer.store.runs() if r.name == name)


def _series(chart: dict, name: str) -> list[float | None]:  # type: ignore[type-arg]
    return next(s["y"] for s in chart["series"] if s["name"] == name)


def test_a_captured_run_answers_phases_ranks_memory_system_diagnoses_and_logs(root: Path) -> None:
    client, viewer = _client(root)
    body = _get(client, _key(viewer, "baseline"))
    assert body["state"] == "ok" and body["warnings"] == [] and body["live"] is False

    steps = body["steps"]
    names = [s["name"] for s in steps["series"]]
    assert names[0] == "iteration" and {"traceml:forward", "traceml:backward", "other"} <= set(names)
    assert steps["x"] == list(range(80)) and steps["warmup_steps"] == 5 and steps["ranks"] == 2
    # The job's forward time of a step is its slowest rank's, read here straight from events_json.
    db = sqlite3.connect(read_only_uri(_run_dir(root, 'baseline') / 'aggregator' / 'telemetry.sqlite'), uri=True)
    rows = db.execute("SELECT events_json FROM step_time_samples WHERE step = 40").fetchall()
    db.close()
    expected = max(json.loads(r[0])[schema.FORWARD]["cuda:0"]["gpu_ms"] for r in rows)
    assert _series(steps, "traceml:forward")[40] == pytest.approx(expected)

    final = json.loads((_run_dir(root, "baseline") / "aggregator" / "final_summary.json").read_text())
    ranks = body["ranks"]
    assert [r["rank"] for r in ranks["per_rank"]] == [0, 1]
    assert ranks["per_rank"][0]["median_ms"] == final["step_time"]["per_rank"][0]["median_ms"]
    assert ranks["per_rank"][1]["outside_backward_median_ms"] == \
        final["step_time"]["per_rank"][1]["outside_backward_median_ms"]
    assert ranks["worst_rank"] == final["step_time"]["worst_rank"]

    diag = body["diagnoses"]
    assert diag["source"] == "final_summary" and diag["status"] == "ok"
    assert diag["findings"] == final["findings"] and diag["abstained"] == final["abstained"]
    assert body["finalization"] == {"summary": ["rank 1 dropped 3 batches (its send queue was full)"]}

    memory = body["memory"]
    alloc = _series(memory, "rank 1 cuda:1 alloc")
    assert alloc[0] == pytest.approx(10 * GIB) and alloc[-1] == pytest.approx((10 + 0.79) * GIB)
    assert "rank 0 cuda:0 reserved" in [s["name"] for s in memory["series"]]
    assert [s["name"] for s in body["rss"]["series"]] == ["rank 0", "rank 1"]
    assert body["rss"]["x"][0] == 0.0 and max(v for v in _series(body["rss"], "rank 0") if v) == 900 * 1024**2
    assert set(_series(body["host"], "CPU")) == {55.0}
    assert _series(body["host"], "RAM")[0] == pytest.approx(20 / 64 * 100)
    assert set(_series(body["gpu"], "GPU 0 util")) == {40.0}
    assert _series(body["gpu"], "GPU 1 memory")[0] == pytest.approx(12 / 80 * 100)
    # Power and temperature each on their own chart and unit, never on the percent axis.
    power, temp = body["gpu_power"], body["gpu_temperature"]
    assert power["unit"] == "watts" and temp["unit"] == "celsius"
    assert [s["name"] for s in power["series"]] == ["GPU 0 power", "GPU 0 power limit", "GPU 1 power",
                                                    "GPU 1 power limit"]
    assert set(_series(power, "GPU 1 power limit")) == {300.0}
    draw = [v for v in _series(power, "GPU 0 power") if v is not None]
    assert draw[0] == pytest.approx(150.0) and draw[-1] > draw[0]
    assert [s["name"] for s in temp["series"]] == ["GPU 0", "GPU 1"]
    assert _series(temp, "GPU 0")[0] == pytest.approx(50.0) and temp["x"][0] == 0.0

    logs = {log["rank"]: log for log in body["logs"]}
    assert logs["0"]["lines"] == [
        ["stdout", "epoch 0: loss 2.31"], ["stderr", XSS_LINE], ["stdout", "epoch 1: loss 1.02"],
    ]
    assert logs["1"]["lines"] == [["stderr", "rank 1 warning: slow disk"], [None, "a line without a stream"]]


def test_html_in_a_log_line_comes_back_as_json_data(root: Path) -> None:
    client, viewer = _client(root)
    response = client.get(f"/api/runs/{urllib.parse.quote(_key(viewer, 'baseline'), safe='')}/telemetry")
    assert response.headers["content-type"] == "application/json"
    assert "content-security-policy" in response.headers
    raw = orjson.loads(response.content)
    assert ["stderr", XSS_LINE] in raw["logs"][0]["lines"]


def test_a_run_without_telemetry_answers_an_empty_state(root: Path) -> None:
    client, viewer = _client(root)
    body = _get(client, _key(viewer, "failed-run"))
    assert body["state"] == "none" and "not captured" in body["detail"]
    assert body["warnings"] == [] and body["logs"] == [] and body["steps"] is None and body["diagnoses"] is None


def test_a_corrupt_database_is_a_warning_and_the_rest_still_answers(root: Path) -> None:
    client, viewer = _client(root)
    key = _key(viewer, "high-lr")
    body = _get(client, key)
    assert body["state"] == "corrupt"
    assert any("telemetry.sqlite" in w and "telemetry database is damaged" in w for w in body["warnings"])
    assert body["steps"] is None and body["diagnoses"] is None
    assert body["logs"][0]["lines"] == [["stdout", "still readable"]]
    assert client.get("/api/run", params={"key": key}).status_code == 200  # the inspector still opens


def test_telemetry_without_a_final_summary_is_diagnosed_live(root: Path) -> None:
    client, viewer = _client(root)
    body = _get(client, _key(viewer, "small-model"))
    assert body["state"] == "ok" and body["diagnoses"]["source"] == "live"
    assert [r["rank"] for r in body["ranks"]["per_rank"]] == [0]
    assert body["gpu"] is None  # a CPU run: no GPU samples
    assert body["gpu_power"] is None and body["gpu_temperature"] is None
    # Issue 13 review: its per-step memory rows (device cpu, no peak measured) were answered as none at
    # all, and the Performance view said "no per-step memory rows" while the summary counted them.
    memory = body["memory"]
    rows = body["diagnoses"]["steps"]  # the live summary's view of the same rows
    assert rows["seen"] == 30
    assert memory["rows"] == 30 and memory["devices"] == ["cpu"] and memory["series"] == []
    assert {a["rule"] for a in body["diagnoses"]["abstained"]} >= {"low_gpu_util", "straggler"}


def test_unknown_runs_and_paths_are_not_found(root: Path, tmp_path: Path) -> None:
    client, viewer = _client(root)
    outside = tmp_path / "secret"
    write_run(outside, RunSpec(steps=10))
    for key in (str(outside), str(root / ".." / "secret"), _key(viewer, "baseline") + "/../../..", "nope"):
        response = client.get(f"/api/runs/{urllib.parse.quote(key, safe='')}/telemetry")
        assert response.status_code == 404 and "no run" in response.json()["error"]
    assert client.get(f"/api/runs/{urllib.parse.quote(_key(viewer, 'baseline'), safe='')}/telemetry",
                      headers={"x-traceml-token": "wrong"}).status_code == 403


def test_a_long_run_is_downsampled_keeping_its_spike(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    generate(root, runs=1, seed=1)
    run_dir = next(root.iterdir())

    def phases(rank: int, step: int) -> dict[str, float]:
        return {**HEALTHY_CPU, schema.DATALOADER_NEXT: 400.0} if step == 3333 else HEALTHY_CPU

    write_run(run_dir, RunSpec(steps=6000, phases=phases, rss=None, host_cpu=None, interval_s=5.0))
    store = RunStore([root])
    store.poll()
    body = TelemetryViews().payload(store.runs()[0])
    steps = body["steps"]
    assert steps["downsampled"] and steps["raw_points"] == 6000 and len(steps["x"]) <= MAX_POINTS
    iteration = _series(steps, "iteration")
    assert max(v for v in iteration if v is not None) > 400 and 3333 in steps["x"]
    assert steps["x"][0] == 0 and steps["x"][-1] == 5999


@pytest.mark.parametrize(("text", "says"), [("garbage{", "not valid JSON"), ("[1]", "not a JSON object"),
                                           ('{"summary": "3 batches"}', "'summary' is not a list of text lines")])
def test_a_record_of_losses_that_cannot_be_read_says_what_was_lost_is_unknown(tmp_path: Path, text: str,
                                                                           says: str) -> None:
    """Review 13e: with a garbage finalization_warning.json the page listed the problem, then said
    "Nothing was lost during capture"; a wrong-typed one was taken as no loss at all."""
    root = tmp_path / "runs"
    generate(root, runs=1, seed=1)
    run_dir = next(root.iterdir())
    write_run(run_dir, RunSpec(steps=30))
    write_final_summary(run_dir)
    (run_dir / "aggregator" / "finalization_warning.json").write_text(text)
    store = RunStore([root])
    store.poll()
    body = TelemetryViews().payload(store.runs()[0])
    assert body["finalization"]["summary"] == []
    assert says in body["finalization"]["unreadable"] and body["finalization"]["unreadable"] in body["warnings"]


def test_a_gpu_without_power_or_temperature_readings_has_no_such_chart(tmp_path: Path) -> None:
    """Some GPUs (NVML on a virtual GPU) report utilisation but no power or temperature: the page
    gets no empty chart for those, and one reading alone keeps its chart (a limit without a draw)."""
    root = tmp_path / "runs"
    generate(root, runs=1, seed=1)
    run_dir = next(root.iterdir())
    write_run(run_dir, RunSpec(steps=20, gpu=True, gpu_temp=lambda t: None, gpu_power=lambda t: None))
    store = RunStore([root])
    store.poll()
    body = TelemetryViews().payload(store.runs()[0])
    assert body["gpu"] is not None and body["gpu_temperature"] is None
    assert [s["name"] for s in body["gpu_power"]["series"]] == ["GPU 0 power limit"]


def test_log_tail_and_cache_follow_the_files(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    generate(root, runs=1, seed=2)
    run_dir = next(root.iterdir())
    write_run(run_dir, RunSpec(steps=20))
    _log(run_dir, 0, [f"stdout | line {i}" for i in range(1200)])
    store = RunStore([root])
    store.poll()
    run = store.runs()[0]
    views = TelemetryViews()
    first = views.payload(run)
    log = first["logs"][0]
    assert len(log["lines"]) == LOG_TAIL_LINES and log["truncated"]
    assert log["lines"][0] == ["stdout", "line 700"] and log["lines"][-1] == ["stdout", "line 1199"]
    assert views.payload(run) == first and views.reads == 1  # unchanged files: the cached answer
    _log(run_dir, 0, ["stderr | Traceback (most recent call last):"])
    again = views.payload(run)
    assert views.reads == 2 and again["logs"][0]["lines"][-1] == ["stderr", "Traceback (most recent call last):"]
    # colour codes a script printed are shown as text without them (the file keeps them)
    _log(run_dir, 0, ["stdout | \x1b[31mred\x1b[0m and \x1b[1;32mgreen\x1b[m"])
    assert views.payload(run)["logs"][0]["lines"][-1] == ["stdout", "red and green"]
    assert "\x1b[31m" in (run_dir / "aggregator" / "rank_0.log").read_text()


def test_reading_leaves_the_run_folder_byte_for_byte_unchanged(root: Path) -> None:
    client, viewer = _client(root)

    def snapshot() -> dict[str, str]:
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}

    before = snapshot()
    for run in viewer.store.runs():
        _get(client, run.key)
    assert snapshot() == before  # no -wal/-shm created beside a database, nothing touched


def test_a_live_run_is_read_again_as_its_database_grows(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    generate(root, runs=1, seed=3)
    run_dir = next(root.iterdir())
    db = TelemetryDB(run_dir / "aggregator" / "telemetry.sqlite")  # the writer stays open, as a live aggregator's
    try:
        for step in range(10):
            db.step(0, step, cpu_events({**HEALTHY_CPU, schema.STEP: 15.0}), ts_ns=T0_NS + step * 10**8, seq=step)
        db.commit()
        store = RunStore([root])
        store.poll()
        run = dataclasses.replace(store.runs()[0], display_status="running")
        views = TelemetryViews(live_min_interval_s=0.0, live_cost_factor=0.0)
        files = sorted(p.name for p in (run_dir / "aggregator").iterdir())
        first = views.payload(run)
        assert first["live"] and first["steps"]["x"] == list(range(10)) and first["diagnoses"]["source"] == "live"
        for step in range(10, 25):
            db.step(0, step, cpu_events({**HEALTHY_CPU, schema.STEP: 15.0}), ts_ns=T0_NS + step * 10**8, seq=step)
        db.commit()
        later = views.payload(run)
        assert later["steps"]["x"] == list(range(25)) and views.reads == 2
        assert sorted(p.name for p in (run_dir / "aggregator").iterdir()) == files  # the reader made no file
    finally:
        db.close()


def test_an_aggregator_folder_of_fifos_is_missing_telemetry_with_warnings_not_uncaptured(tmp_path: Path) -> None:
    """A reviewer's FIFOs named like the aggregator's files answered ``state: "none"`` (as if the
    run was never captured) with no warning; the folder is there, so the telemetry is missing."""
    import os

    root = tmp_path / "runs"
    generate(root, runs=1, seed=0)
    agg = next(root.iterdir()) / "aggregator"
    agg.mkdir()
    for name in ("telemetry.sqlite", "final_summary.json", "manifest.json", "rank_0.log"):
        os.mkfifo(agg / name)
    store = RunStore([root])
    store.poll()
    body = TelemetryViews().payload(store.runs()[0])
    assert body["state"] == "missing" and "no readable telemetry" in body["detail"]
    assert any("telemetry.sqlite" in w and "not read" in w for w in body["warnings"]), body["warnings"]


def test_a_captured_run_without_steps_is_not_judged_in_the_page_never_no_problem(tmp_path: Path) -> None:
    # Issue 14 item 4 in the viewer: the Diagnoses block said "No problem found" for a 0-step run.
    (tmp_path / "train.py").write_text("print('no trace_step here')\n")
    root = tmp_path / "runs"
    proc = run_traceml("run", "--logs-dir", str(root), "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    client, viewer = _client(root)
    (run,) = viewer.store.runs()
    diag = _get(client, run.key)["diagnoses"]
    assert diag["source"] == "final_summary" and diag["findings"] == []
    assert diag["verdict"]["kind"] == "not_judged" and diag["healthy"] is False  # never "healthy" beside it
    assert diag["verdict"]["text"].startswith("not judged: no training step was timed")


def test_a_script_that_failed_before_its_first_step_is_said_to_have_failed_in_the_page(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("raise RuntimeError('no data')\n")
    root = tmp_path / "runs"
    proc = run_traceml("run", "--logs-dir", str(root), "train.py", cwd=tmp_path)
    assert proc.returncode == 1
    client, viewer = _client(root)
    (run,) = viewer.store.runs()
    diag = _get(client, run.key)["diagnoses"]
    assert diag["verdict"] == {"kind": "not_judged",
                               "text": "not judged: the script failed (exit code 1) before its first step"}


TRACED_SCRIPT = """
import torch, traceml_ai
model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(30):
    with traceml_ai.trace_step(model):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
"""


def test_a_watch_run_of_a_script_with_trace_step_is_not_judged_in_the_page(tmp_path: Path) -> None:
    # Issue 14 review: watch timed the script's trace_step and the page said healthy.
    (tmp_path / "train.py").write_text(TRACED_SCRIPT)
    root = tmp_path / "runs"
    proc = run_traceml("watch", "--logs-dir", str(root), "--interval", "0.2", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    client, viewer = _client(root)
    (run,) = viewer.store.runs()
    diag = _get(client, run.key)["diagnoses"]
    assert diag["verdict"]["kind"] == "not_judged" and diag["healthy"] is False
    assert diag["verdict"]["text"].startswith("not judged: a watch run times no steps")


def test_a_cpu_runs_memory_rows_are_counted_as_the_summary_counts_them(tmp_path: Path) -> None:
    """Issue 13 review: the memory panel said "no per-step memory rows" of a CPU run whose summary
    counts 92 of them: the rows are there, none measured a device peak."""
    root = tmp_path / "runs"
    generate(root, runs=1, seed=3)
    run_dir = next(root.iterdir())
    write_run(run_dir, RunSpec(steps=92))
    write_final_summary(run_dir)
    final = json.loads((run_dir / "aggregator" / "final_summary.json").read_text())
    counted = final["telemetry"]["rows"][schema.STEP_MEMORY_SAMPLES.name]
    assert counted == 92
    store = RunStore([root])
    store.poll()
    body = TelemetryViews().payload(store.runs()[0])
    assert body["memory"] is not None, "a run with per-step memory rows answered none"
    assert body["memory"]["rows"] == counted and body["memory"]["devices"] == ["cpu"]
    assert not any("alloc" in s["name"] or "reserved" in s["name"] for s in body["memory"]["series"])


def test_a_live_run_before_its_first_step_is_told_so_not_blamed_for_a_missing_trace_step(tmp_path: Path) -> None:
    """Review 13i: while a live run had sent no step yet, its provisional verdict said the script has
    no trace_step or ended before its first step. The same answer, once the run is no longer live,
    says what an ended run's does (the cached answer is not reused across that change)."""
    run_dir = tmp_path / "runs" / "starting"
    write_run(run_dir, RunSpec(steps=0))  # host and process samples, no step yet
    views = TelemetryViews()
    running = RunSummary(key=str(run_dir), id="starting", root=str(run_dir.parent), name="starting",
                         status="running", display_status="running")
    diag = views.payload(running)["diagnoses"]
    assert diag["source"] == "live" and diag["verdict"]["kind"] == "not_judged"
    assert diag["verdict"]["text"] == ("not judged: no training step timed yet (the run has not reached its first "
                                       "`trace_step`, or the script has none)")
    ended = RunSummary(key=str(run_dir), id="starting", root=str(run_dir.parent), name="starting",
                       status="completed", display_status="completed")
    text = views.payload(ended)["diagnoses"]["verdict"]["text"]
    assert text.startswith("not judged: no training step was timed (0 steps: the script has no")
