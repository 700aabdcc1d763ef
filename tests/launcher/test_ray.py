"""Ray Train under capture (``traceml_ai.launcher.ray``, export issue item 7) on a local Ray cluster.

One real ``TorchTrainer`` job (2 CPU workers, gloo, a tiny model, ``trace_step``) is shared by the
assertions through a module fixture. Ray is kept on loopback: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
makes a local Ray node use 127.0.0.1 (not the host's interface) for itself and for
``MASTER_ADDR``. Skipped where ``ray[train]`` is not installed (``pip install 'traceml-ai[ray]'``).
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from traceml_ai.aggregator.export.records import RECORD_TYPES
from traceml_ai.launcher.launch import LaunchResult, LaunchUsageError
from traceml_ai.launcher.ray import TraceMLRayConfig, TraceMLRayRun
from traceml_ai.telemetry.sqlite import read_only_uri

# On the tests that start a Ray cluster; the settings tests run without Ray.
requires_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None or importlib.util.find_spec("torch") is None,
    reason="ray[train] and torch are not installed (pip install 'traceml-ai[ray]')",
)

# The module fixtures start a Ray cluster and run a real TorchTrainer job inside the first test that
# needs them: past the suite default of 300 s on a busy machine.
pytestmark = pytest.mark.timeout(900)

STEPS_PER_RANK = 6
BATCH = 8


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local 2-CPU Ray cluster on 127.0.0.1, no dashboard, shut down after the module."""
    with pytest.MonkeyPatch.context() as mp:
        # Read by ray at import and inherited by every Ray process: loopback only, no usage report.
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            assert ray.util.get_node_ip_address() == "127.0.0.1"
            yield ray
        finally:
            ray.shutdown()


def train_loop(config: dict[str, Any]) -> None:
    """The user's loop: DDP over gloo, every step in ``trace_step``; rank 0 logs with ``traceml_ai.Run``."""
    import os

    import ray.train
    import ray.train.torch
    import torch

    import traceml_ai

    session = traceml_ai.init()  # what a user adds; under the wrapper it returns the running session
    assert session is not None and session.config.session_id == os.environ["TRACEML_SESSION_ID"]
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(config["samples"], 8), torch.randn(config["samples"], 1))
    loader = ray.train.torch.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=BATCH))
    rank = ray.train.get_context().get_world_rank()
    losses = []
    for x, y in loader:
        with traceml_ai.trace_step(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        losses.append(float(loss.detach()))
    print(f"rank {rank} finished {len(losses)} steps")
    if rank == 0:
        with traceml_ai.Run() as run:  # attaches to the run folder of the job (TRACEML_RUN_DIR)
            for step, value in enumerate(losses):
                run.log(step, {"loss": value})


@dataclass
class Job:
    run: TraceMLRayRun
    result: LaunchResult

    @property
    def run_dir(self) -> Path:
        return self.run.run_dir


@pytest.fixture(scope="module")
def job(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Job:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    tmp = tmp_path_factory.mktemp("ray_job")
    scaling = ScalingConfig(num_workers=2, use_gpu=False)
    config = TraceMLRayConfig(logs_dir=str(tmp / "runs"), name="ray-tiny", tags=("ray",), interval=0.2,
                              exporter="jsonl", export_streams="all")
    with TraceMLRayRun(config, scaling_config=scaling) as run:
        trainer = TorchTrainer(
            run.wrap(train_loop), train_loop_config={"samples": 2 * BATCH * STEPS_PER_RANK},
            scaling_config=scaling, torch_config=TorchConfig(backend="gloo"),
            run_config=RunConfig(storage_path=str(tmp / "ray_results"), name="tiny"),
        )
        trainer.fit()
    assert run.result is not None
    return Job(run, run.result)


def query(run_dir: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(read_only_uri(run_dir / 'aggregator' / 'telemetry.sqlite'), uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


@requires_ray
def test_the_job_gets_a_run_folder_like_traceml_run(job: Job) -> None:
    run_dir = job.run_dir
    assert run_dir.parent.name == "runs" and "_ray-tiny_" in run_dir.name
    meta = read_json(run_dir / "run.json")
    assert meta["status"] == "completed" and meta["tags"] == ["ray"], meta
    manifest = read_json(run_dir / "aggregator" / "manifest.json")
    assert manifest["status"] == "completed" and manifest["mode"] == "run"
    assert manifest["session_id"] == job.run.session_id and manifest["world_size"] == 2
    assert job.result.status == "completed" and job.result.telemetry == {}
    assert not (run_dir / "aggregator" / "finalization_warning.json").exists()


@requires_ray
def test_every_worker_rank_sends_its_steps_with_its_ray_identity(job: Job) -> None:
    rows = query(job.run_dir, "SELECT global_rank, local_rank, world_size, local_world_size, node_rank, step, "
                              "events_json FROM step_time_samples")
    steps = {rank: sorted(r[5] for r in rows if r[0] == rank) for rank in (0, 1)}
    assert steps == {0: list(range(STEPS_PER_RANK)), 1: list(range(STEPS_PER_RANK))}
    assert {r[:5] for r in rows} == {(0, 0, 2, 2, 0), (1, 1, 2, 2, 0)}
    for row in rows:
        events = json.loads(row[6])
        assert {"traceml:forward", "traceml:backward", "traceml:optimizer_step", "traceml:step"} <= set(events)


@requires_ray
def test_the_aggregator_stopped_and_wrote_the_final_summary(job: Job) -> None:
    doc = read_json(job.run_dir / "aggregator" / "final_summary.json")
    assert doc["ranks"]["seen"] == [0, 1]
    assert doc["steps"], doc["steps"]


@requires_ray
def test_the_workers_output_and_the_rank_0_logger_reach_the_run(job: Job) -> None:
    lines = {r[0] for r in query(job.run_dir, "SELECT line FROM stdout_stderr_samples")}
    assert {f"rank {rank} finished {STEPS_PER_RANK} steps" for rank in (0, 1)} <= lines
    logged = [json.loads(line) for line in (job.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in logged] == list(range(STEPS_PER_RANK))


@requires_ray
def test_the_jsonl_exporter_of_the_ray_config_writes_every_stream(job: Job) -> None:
    export_dir = job.run_dir / "aggregator" / "export"
    sqlite_rows = {"step_time": "step_time_samples", "process": "process_samples",
                   "runtime_environment": "runtime_environment", "stdout_stderr": "stdout_stderr_samples"}
    for record_type in RECORD_TYPES:
        lines = [json.loads(line) for line in (export_dir / f"{record_type.STREAM}.jsonl").read_text().splitlines()]
        closing = lines.pop()
        assert closing == {"closing": True, "stream": record_type.STREAM, "written_records": len(lines),
                           "dropped_batches": 0}
        table = sqlite_rows.get(record_type.STREAM)
        if table is not None:
            assert len(lines) == query(job.run_dir, f"SELECT COUNT(*) FROM {table}")[0][0] > 0
            assert {line["rank"] for line in lines} == {0, 1}  # the one rank field every rank record has
            assert all("hostname" not in line for line in lines)


@requires_ray
def test_an_exception_in_the_block_fails_the_run_and_still_finalizes(ray_cluster: Any, tmp_path: Path) -> None:
    config = TraceMLRayConfig(logs_dir=str(tmp_path / "runs"), name="broken")
    with pytest.raises(ValueError, match="bad batch"), TraceMLRayRun(config) as run:
        raise ValueError("bad batch")
    meta = read_json(run.run_dir / "run.json")
    assert meta["status"] == "failed"
    assert meta["exit"]["error_type"] == "ValueError" and meta["exit"]["error_message"] == "bad batch"
    assert (run.run_dir / "aggregator" / "final_summary.json").exists()
    assert read_json(run.run_dir / "aggregator" / "manifest.json")["status"] == "completed"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (TraceMLRayConfig(export_streams="steps"), "step_time"),
        (TraceMLRayConfig(exporter="not a module"), "module:factory"),
        (TraceMLRayConfig(interval=0.0), "interval"),
        (TraceMLRayConfig(name="a/b"), "run name"),
    ],
)
def test_a_bad_setting_stops_before_anything_starts(tmp_path: Path, config: TraceMLRayConfig, message: str) -> None:
    logs = tmp_path / "runs"
    config = TraceMLRayConfig(**{**config.__dict__, "logs_dir": str(logs)})
    run = TraceMLRayRun(config)
    with pytest.raises(LaunchUsageError, match=message):
        run.start()
    assert not logs.exists()
    with pytest.raises(RuntimeError, match="not started"):
        run.wrap(train_loop)


def test_fields_left_none_come_from_the_environment_like_flags_not_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no traceml.yaml above
    monkeypatch.setenv("TRACEML_EXPORTER", "jsonl")
    monkeypatch.setenv("TRACEML_EXPORT_STREAMS", "nope")
    with pytest.raises(LaunchUsageError, match="'nope'"):
        TraceMLRayConfig().resolve()
    resolved = TraceMLRayConfig(logs_dir="runs", name="job", export_streams="system").resolve()
    assert (resolved.exporter, resolved.export_streams) == ("jsonl", "system")
    assert resolved.logs_dir == str(tmp_path.resolve() / "runs")
