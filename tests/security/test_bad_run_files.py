"""Run files that blanked or hung a view (issue 12 points 5-7): an integer above 64 bits, nesting
of hundreds of levels, FIFOs named like run and catalog files. Each is a warning, never a 500, a
crash or a hang; real commands and a real viewer process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.conftest import run_traceml
from traceml_ai.runs.fake import generate
from traceml_ai.runs.readers import load_json, parse_params_yaml
from traceml_ai.runs.safeio import NotRegularFile, read_regular, read_stated
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.app import create_app
from traceml_ai.ui.service import Viewer

BIG = 18446744073709551616  # 2**64
TOKEN = "bad-files-token-0123456789abcdef"


def make_root(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "runs"
    generate(root, runs=3, seed=5)
    run = sorted(p for p in root.iterdir() if p.is_dir())[0]
    return root, run


def api(root: Path) -> TestClient:
    viewer = Viewer(RunStore([root]), None)
    viewer.poll()
    client = TestClient(create_app(viewer, TOKEN, lambda: {"127.0.0.1:8765"}), base_url="http://127.0.0.1:8765")
    client.headers["x-traceml-token"] = TOKEN
    return client


# -- point 5: an integer above 64 bits --------------------------------------------------------------


def test_an_integer_above_64_bits_is_kept_exactly_as_text_everywhere(tmp_path: Path) -> None:
    root, run = make_root(tmp_path)
    (run / "params.yaml").write_text(f"seed: {BIG}\nlr: 0.1\nnested:\n  big: -{BIG}\n")
    config = json.loads((run / "config.json").read_text())
    config["seed"] = BIG
    (run / "config.json").write_text(json.dumps(config))
    client = api(root)
    runs = client.get("/api/runs")
    assert runs.status_code == 200  # was 500: "could not load the runs"
    assert str(BIG) in runs.text
    one = client.get("/api/run", params={"key": str(run)})
    assert one.status_code == 200 and str(BIG) in one.text and "1.8446744073709552e+19" not in one.text

    listed = run_traceml("runs", "ls", str(root), "--json", "--columns", "config.seed,config.nested.big")
    assert listed.returncode == 0, listed.stderr  # was a crash
    assert str(BIG) in listed.stdout and f"-{BIG}" in listed.stdout
    shown = run_traceml("runs", "show", run.name, "--root", str(root), "--json")
    assert shown.returncode == 0, shown.stderr
    assert str(BIG) in shown.stdout


def test_the_readers_keep_big_integers_exact_and_small_ones_as_numbers() -> None:
    value, warnings = load_json(f'{{"a": {BIG}, "b": 12, "c": {2**63}, "d": "{BIG}"}}'.encode())
    assert value == {"a": str(BIG), "b": 12, "c": str(2**63), "d": str(BIG)} and len(warnings) == 1
    params, _ = parse_params_yaml(f"seed: {BIG}\nsmall: {2**63 - 1}\n".encode())
    assert params == {"seed": str(BIG), "small": 2**63 - 1}


# -- point 6: nesting of hundreds of levels ------------------------------------------------------------


@pytest.mark.parametrize("depth", [300, 1023])
def test_deeply_nested_config_and_run_json_are_a_warning(tmp_path: Path, depth: int) -> None:
    root, run = make_root(tmp_path)
    (run / "config.json").write_text('{"a":' * depth + "1" + "}" * depth)
    run_json = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(run_json)[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}")
    client = api(root)
    assert client.get("/api/runs").status_code == 200
    one = client.get("/api/run", params={"key": str(run)})
    assert one.status_code == 200  # was 500
    assert "nested deeper than" in one.text
    shown = run_traceml("runs", "show", run.name, "--root", str(root), "--json")
    assert shown.returncode == 0, shown.stderr
    assert "nested deeper than" in shown.stdout + shown.stderr


def test_deeply_nested_params_yaml_is_a_warning(tmp_path: Path) -> None:
    text = "".join("  " * i + f"k{i}:\n" for i in range(300)) + "  " * 300 + "leaf: 1\n"
    params, warnings = parse_params_yaml(text.encode())
    assert len(params) == 1 and "nested deeper than 64 levels" in warnings[0]


# -- point 7: FIFOs named like run and catalog files ---------------------------------------------------


def test_the_one_reader_refuses_fifos_devices_and_folders_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "run.json"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "FIFO"), (Path("/dev/null"), "device"), (tmp_path, "folder")):
        with pytest.raises(NotRegularFile, match=kind):
            read_regular(path)
    regular = tmp_path / "ok.json"
    regular.write_bytes(b"{}")
    (tmp_path / "link.json").symlink_to(regular)
    assert read_regular(tmp_path / "link.json") == b"{}"


def test_reading_a_stated_file_refuses_a_fifo_swapped_in_after_the_stat(tmp_path: Path) -> None:
    # The run store stats a run file, then reads it without a second stat (issue 16): a FIFO put in
    # its place between the two is refused at once, never waited on.
    path = tmp_path / "run.json"
    path.write_bytes(b'{"status": "running"}')
    before = os.stat(path)
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(NotRegularFile, match="FIFO"):
        read_stated(path, before)
    with pytest.raises(NotRegularFile, match="folder"):
        read_stated(tmp_path, os.stat(tmp_path))


def test_reading_a_stated_file_reads_what_was_appended_since_the_stat(tmp_path: Path) -> None:
    path = tmp_path / "metrics.json"
    path.write_bytes(b"x" * 10)
    before = os.stat(path)
    path.write_bytes(b"y" * 200_000)  # rewritten larger between the stat and the read
    assert read_stated(path, before) == b"y" * 200_000
    empty = tmp_path / "params.yaml"
    empty.write_bytes(b"")
    assert read_stated(empty, os.stat(empty)) == b""


def plant_fifos(root: Path, run: Path) -> None:
    os.mkfifo(root / "stormlog_run.json")
    (root / "telemetry").mkdir()
    os.mkfifo(root / "telemetry" / "telemetry.jsonl")
    (run / "aggregator").mkdir(exist_ok=True)
    os.mkfifo(run / "aggregator" / "manifest.json")
    os.mkfifo(run / "aggregator" / "final_summary.json")


def test_traceml_query_over_fifos_answers_with_warnings(tmp_path: Path) -> None:
    root, run = make_root(tmp_path)
    plant_fifos(root, run)
    for kind in ("runs", "sessions", "attachments"):
        proc = run_traceml("query", kind, str(root), "--json", "--cache-dir", str(tmp_path / "cache"), timeout=120)
        assert proc.returncode == 0, proc.stderr  # was: never returned


def test_traceml_ui_serves_a_root_with_fifos(tmp_path: Path) -> None:
    root, run = make_root(tmp_path)
    plant_fifos(root, run)
    os.unlink(run / "run.json")
    os.mkfifo(run / "run.json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "ui", str(root), "--port", "0", "--no-browser",
         "--cache-dir", str(tmp_path / "cache")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # was: never printed, the viewer never started serving
        match = re.search(r"http://(127\.0\.0\.1:\d+)/\?token=([\w-]+)", line)
        assert match, line
        request = urllib.request.Request(f"http://{match.group(1)}/api/runs",
                                         headers={"x-traceml-token": match.group(2)})
        with urllib.request.urlopen(request, timeout=60) as answer:
            assert answer.status == 200
            assert len(json.loads(answer.read())["runs"]) >= 2
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_a_run_logged_with_a_seed_above_64_bits_is_written_and_shown_exactly(tmp_path: Path) -> None:
    import traceml_ai

    root = tmp_path / "runs"
    with traceml_ai.Run(root, "big-seed", params={"seed": BIG, "nested": {"n": -BIG}}) as run:  # was a crash
        run.log(1, {"loss": 0.5})
    (folder,) = list(root.iterdir())
    assert json.loads((folder / "config.json").read_text())["seed"] == BIG  # exact, still a JSON number
    runs = api(root).get("/api/runs")
    assert runs.status_code == 200 and str(BIG) in runs.text and f"-{BIG}" in runs.text


def test_a_step_above_64_bits_is_a_clear_error_and_the_run_goes_on(tmp_path: Path) -> None:
    import traceml_ai

    root = tmp_path / "runs"
    with traceml_ai.Run(root, "big-step") as run:
        with pytest.raises(ValueError, match="step must fit in 64 bits"):  # was orjson's bare TypeError
            run.log(BIG, {"loss": 0.5})
        run.log(1, {"loss": 0.25})
    (folder,) = list(root.iterdir())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and json.loads((folder / "run.json").read_text())["status"] == "completed"


def test_params_nested_past_the_readers_cap_are_written_not_a_recursion_error(tmp_path: Path) -> None:
    import traceml_ai

    deep: dict[str, object] = {"lr": 0.1}
    for _ in range(1100):
        deep = {"d": deep}
    root = tmp_path / "runs"
    with traceml_ai.Run(root, "deep-params", params={"seed": 1, "deep": deep}) as run:  # was RecursionError
        run.log(1, {"loss": 0.5})
    (folder,) = list(root.iterdir())
    params = (folder / "params.yaml").read_text()
    assert "seed: 1" in params and "nested too deep" in params
    assert json.loads((folder / "run.json").read_text())["status"] == "completed"
