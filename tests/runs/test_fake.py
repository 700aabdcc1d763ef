"""The fake-run generator writes the run format with every special case (003 seed, "Fake run generator")."""

from __future__ import annotations

import json
import math
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from traceml_ai.cli.fake_runs import fake_runs
from traceml_ai.runs.fake import SPECIAL_RUNS, FakeRunsError, generate, live_run
from traceml_ai.runs.layout import RUN_ID_RE

NOW = 1_790_000_000.0  # 2026-09-21T14:13:20Z


def _runs(root: Path) -> dict[str, Path]:
    """name -> run folder."""
    out = {}
    for d in root.iterdir():
        m = RUN_ID_RE.match(d.name)
        assert m, d.name
        out[m["name"]] = d
    return out


def _run_json(run: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((run / "run.json").read_text())
    return meta


def _rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs24(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    written = generate(root, runs=24, now=NOW)
    assert len(written) == 24
    return _runs(root)


def test_specials_come_first_and_every_run_has_the_folders(tmp_path: Path) -> None:
    written = generate(tmp_path, runs=24, now=NOW)
    names = [RUN_ID_RE.match(p.name)["name"] for p in written]  # type: ignore[index]
    assert names[: len(SPECIAL_RUNS)] == list(SPECIAL_RUNS)
    assert len(set(names)) == 24
    for run in written:
        assert all((run / sub).is_dir() for sub in ("logs", "checkpoints", "artifacts"))
        assert (run / "metrics.json").is_file() and (run / "params.yaml").is_file()


def test_fewer_runs_than_specials_writes_the_first_ones(tmp_path: Path) -> None:
    generate(tmp_path / "a", runs=3, now=NOW)
    assert sorted(_runs(tmp_path / "a")) == sorted(SPECIAL_RUNS[:3])
    assert generate(tmp_path / "b", runs=0, now=NOW) == []
    assert (tmp_path / "b").is_dir()


def test_completed_specials(runs24: dict[str, Path]) -> None:
    for name in ("baseline", "high-lr", "small-model", "malformed-lines", "future-schema"):
        meta = _run_json(runs24[name])
        assert meta["status"] == "completed"
        assert meta["exit"] == {"code": 0, "signal": None}
        assert meta["ended_at"] and meta["duration_s"] > 0
        assert meta["id"] == runs24[name].name


def test_failed_run_is_a_cuda_oom_with_traceback(runs24: dict[str, Path]) -> None:
    meta = _run_json(runs24["failed-run"])
    assert meta["status"] == "failed"
    assert meta["exit"]["code"] == 1
    assert meta["exit"]["error_type"] in ("OutOfMemoryError", "torch.OutOfMemoryError")
    assert meta["exit"]["error_message"].startswith("CUDA out of memory. Tried to allocate")
    tb = meta["exit"]["traceback"]
    assert tb.startswith("Traceback (most recent call last):\n") and tb.count("\n") > 5


def test_nan_loss_fails_and_writes_null_not_nan(runs24: dict[str, Path]) -> None:
    run = runs24["nan-loss"]
    meta = _run_json(run)
    assert meta["status"] == "failed"
    assert meta["exit"]["error_type"] == "FloatingPointError"
    assert _rows(run)[-1]["train/loss"] is None
    text = (run / "metrics.jsonl").read_text() + (run / "metrics.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads((run / "metrics.json").read_text())["last"]["train/loss"] is None


def test_killed_run(runs24: dict[str, Path]) -> None:
    meta = _run_json(runs24["killed-run"])
    assert meta["status"] == "killed"
    assert meta["exit"]["signal"] == "SIGINT" and meta["exit"]["code"] in (1, 130)


def test_stale_run_is_running_with_an_old_heartbeat(runs24: dict[str, Path]) -> None:
    meta = _run_json(runs24["stale-run"])
    assert meta["status"] == "running"
    assert meta["ended_at"] is None and meta["exit"] is None and meta["duration_s"] is None
    heartbeat = datetime.strptime(meta["heartbeat_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    assert NOW - heartbeat > 3600  # hours old


def test_legacy_run_has_no_run_json_and_nested_params(runs24: dict[str, Path]) -> None:
    run = runs24["legacy-run"]
    assert not (run / "run.json").exists()
    params = yaml.safe_load((run / "params.yaml").read_text())
    assert isinstance(params["optim"], dict) and "lr" in params["optim"]
    assert (run / "metrics.jsonl").is_file() and (run / "metrics.json").is_file()


def test_future_schema(runs24: dict[str, Path]) -> None:
    assert _run_json(runs24["future-schema"])["schema_version"] == 2


def test_malformed_lines_has_a_corrupt_middle_line_and_a_partial_last_line(runs24: dict[str, Path]) -> None:
    text = (runs24["malformed-lines"] / "metrics.jsonl").read_text()
    assert not text.endswith("\n")
    complete = text.split("\n")[:-1]
    bad = []
    for i, line in enumerate(complete):
        try:
            json.loads(line)
        except ValueError:
            bad.append(i)
    assert bad and 0 < bad[0] and bad[-1] < len(complete) - 1  # in the middle, good lines after
    with pytest.raises(ValueError):
        json.loads(text.split("\n")[-1])


def test_other_runs_write_only_valid_rows(runs24: dict[str, Path]) -> None:
    for name, run in runs24.items():
        if name == "malformed-lines":
            continue
        text = (run / "metrics.jsonl").read_text()
        assert text.endswith("\n"), name
        assert "NaN" not in text and "Infinity" not in text, name
        for line in text.splitlines():
            row = json.loads(line)
            assert isinstance(row, dict) and isinstance(row["step"], int) and isinstance(row["epoch"], int)
            assert all(v is None or (isinstance(v, (int, float)) and math.isfinite(v)) for v in row.values())
        assert "NaN" not in (run / "metrics.json").read_text()


def test_rows_are_sparse_train_and_val_with_the_same_step(runs24: dict[str, Path]) -> None:
    rows = _rows(runs24["baseline"])
    assert {"train/loss", "lr"} <= rows[0].keys() and "val/auc" not in rows[0]
    assert {"val/loss", "val/auc", "val/acc"} <= rows[1].keys() and "train/loss" not in rows[1]
    assert rows[0]["step"] == rows[1]["step"]


def test_metrics_json_has_last_best_and_summary(runs24: dict[str, Path]) -> None:
    m = json.loads((runs24["baseline"] / "metrics.json").read_text())
    assert m["best"]["val/auc"]["mode"] == "max" and m["best"]["val/loss"]["mode"] == "min"
    assert m["best"]["val/auc"]["value"] == max(r["val/auc"] for r in _rows(runs24["baseline"]) if "val/auc" in r)
    assert isinstance(m["summary"]["best_checkpoint"], str)
    assert set(m["last"]) >= {"train/loss", "val/auc"}


def test_patch_size_only_on_vit_tiny(tmp_path: Path) -> None:
    models = set()
    for run in generate(tmp_path, runs=60, now=NOW):
        params = yaml.safe_load((run / "params.yaml").read_text())
        if "data" in params:  # legacy-run: nested
            continue
        models.add(params["model.name"])
        assert ("model.patch_size" in params) == (params["model.name"] == "vit-tiny")
    assert "vit-tiny" in models and len(models) > 1


def test_dataset_shifts_accuracy(tmp_path: Path) -> None:
    accs: dict[str, list[float]] = {}
    for run in generate(tmp_path, runs=80, now=NOW):
        params = yaml.safe_load((run / "params.yaml").read_text())
        best = json.loads((run / "metrics.json").read_text())["best"]
        if "data.dataset" in params and (run / "run.json").exists() and _run_json(run)["status"] == "completed":
            accs.setdefault(params["data.dataset"], []).append(best["val/acc"]["value"])
    median = {d: sorted(v)[len(v) // 2] for d, v in accs.items()}
    assert median["cifar10"] > median["cifar100"] > median["tiny-imagenet"]


def test_same_seed_and_now_give_identical_output(tmp_path: Path) -> None:
    generate(tmp_path / "a", runs=14, seed=3, now=NOW)
    generate(tmp_path / "b", runs=14, seed=3, now=NOW)
    generate(tmp_path / "c", runs=14, seed=4, now=NOW)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    assert _tree(tmp_path / "a") != _tree(tmp_path / "c")


def test_clean_refuses_a_folder_with_a_stray_file(tmp_path: Path) -> None:
    generate(tmp_path, runs=2, now=NOW)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FakeRunsError, match=r"notes\.txt"):
        generate(tmp_path, runs=2, clean=True, now=NOW)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert len(list(tmp_path.iterdir())) == 3


def test_clean_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    with pytest.raises(FakeRunsError, match="src"):
        generate(tmp_path, runs=1, clean=True, now=NOW)
    assert (tmp_path / "src").is_dir()


def test_clean_replaces_a_folder_of_runs(tmp_path: Path) -> None:
    generate(tmp_path, runs=5, seed=1, now=NOW)
    (tmp_path / "old-style-run").mkdir()
    (tmp_path / "old-style-run" / "params.yaml").write_text("a: 1\n")
    written = generate(tmp_path, runs=3, seed=2, clean=True, now=NOW)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)
    generate(tmp_path / "missing", runs=1, clean=True, now=NOW)  # a missing folder is fine


def test_big_run_has_about_n_lines(tmp_path: Path) -> None:
    written = generate(tmp_path, runs=0, big_run_lines=1001, now=NOW)
    assert [RUN_ID_RE.match(p.name)["name"] for p in written] == ["big-run"]  # type: ignore[index]
    assert len(_rows(written[0])) == 1001
    assert _run_json(written[0])["status"] == "completed"


def test_live_run_completes_after_its_epochs(tmp_path: Path) -> None:
    seen: list[int] = []
    run = live_run(tmp_path, interval=0.05, epochs=3, partial_writes=True, on_epoch=seen.append)
    assert seen == [0, 1, 2]
    meta = _run_json(run)
    assert meta["status"] == "completed" and meta["exit"] == {"code": 0, "signal": None}
    assert (run / "metrics.jsonl").read_text().endswith("\n")
    rows = _rows(run)
    assert sorted({r["epoch"] for r in rows}) == [0, 1, 2] and len(rows) == 6
    assert json.loads((run / "metrics.json").read_text())["step"] == 2


def test_live_run_stopped_stays_running(tmp_path: Path) -> None:
    stop = threading.Event()

    def after_two_epochs(epoch: int) -> None:
        if epoch == 1:
            stop.set()

    run = live_run(tmp_path, interval=0.01, on_epoch=after_two_epochs, stop=stop)
    meta = _run_json(run)
    assert meta["status"] == "running" and meta["exit"] is None and meta["ended_at"] is None
    assert (run / "metrics.jsonl").read_text().endswith("\n")
    assert len(_rows(run)) == 4


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(fake_runs)
    return app


def test_cli_writes_runs(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = CliRunner().invoke(_app(), ["--runs", "12", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 12 runs" in result.output
    assert len(list(out.iterdir())) == 12


def test_cli_clean_refusal_is_one_line_and_exit_1(tmp_path: Path) -> None:
    (tmp_path / "keep.me").write_text("x")
    result = CliRunner().invoke(_app(), ["--clean", "--output", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert "keep.me" in result.stderr
    assert (tmp_path / "keep.me").exists()


def test_cli_live_run_with_epochs(tmp_path: Path) -> None:
    args = ["--runs", "0", "--live", "--live-interval", "0.01", "--live-epochs", "2", "--no-partial-writes"]
    result = CliRunner().invoke(_app(), [*args, "--output", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "completed" in result.output
    (run,) = tmp_path.iterdir()
    assert _run_json(run)["status"] == "completed"


def test_clean_on_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(FakeRunsError):
        generate(f, runs=1, clean=True, now=NOW)
