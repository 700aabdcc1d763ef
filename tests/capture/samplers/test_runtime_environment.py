"""The runtime_environment sampler: topology, torch.distributed state, training strategy (DESIGN §3.1)."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.capture.frame_server import TEST_SECRET, FrameServer
from traceml_ai.capture.identity import detect_identity
from traceml_ai.capture.samplers.runtime_environment import RuntimeEnvironmentSampler, detect, topology

ROW_KEYS = {"seq", "timestamp_unix_ns", "topology", "distributed_initialized", "distributed_backend",
            "training_strategy", "strategy_source", "strategy_confidence"}


def test_topology_wording() -> None:
    assert topology(1, 1) == "1 node x 1 process"
    assert topology(8, 4) == "2 nodes x 4 processes"
    assert topology(6, 4) == "6 processes"
    assert topology(3, None) == "3 processes"
    assert topology(None, 2) is None


def test_single_process_says_single_once() -> None:
    sampler = RuntimeEnvironmentSampler(detect_identity({}))
    rows = [row for seq in range(1, 40) for row in sampler.collect(seq, seq)]
    rows += sampler.collect_final(40, 40)
    assert len(rows) == 1  # nothing changed after the first look
    row = rows[0]
    assert set(row) == ROW_KEYS and row["seq"] == 1
    assert row["topology"] == "1 node x 1 process"
    assert row["distributed_initialized"] == 0 and row["distributed_backend"] is None
    assert (row["training_strategy"], row["strategy_source"], row["strategy_confidence"]) == (
        "single", "world_size=1", "high")


def test_a_process_group_destroyed_at_the_end_stays_in_the_row(tmp_path: Path) -> None:
    """Scripts end with dist.destroy_process_group(); the close-time look must not report the run as
    never distributed (it once made the last row of a DDP run say distributed_initialized 0)."""
    import pytest

    torch = pytest.importorskip("torch")
    dist = torch.distributed
    sampler = RuntimeEnvironmentSampler(detect_identity({}))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        (row,) = sampler.collect(1, 1)
    finally:
        dist.destroy_process_group()
    assert (row["distributed_initialized"], row["distributed_backend"]) == (1, "gloo")
    assert sampler.collect(2, 2) == [] and sampler.collect_final(3, 3) == []


def test_an_unsettled_environment_is_sent_once_at_close_or_after_the_deadline() -> None:
    """Several ranks but no wrapper model seen (traceml watch): nothing is sent while the run may
    still wrap its model, then exactly one row: at close, or after SEND_BY_TICKS for a long run."""
    from traceml_ai.capture.samplers.runtime_environment import SEND_BY_TICKS

    ident = detect_identity({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    short = RuntimeEnvironmentSampler(ident)
    assert [row for seq in range(1, 30) for row in short.collect(seq, seq)] == []
    (row,) = short.collect_final(30, 30)
    assert row["training_strategy"] == "unknown" and row["seq"] == 30
    assert short.collect_final(31, 31) == []
    long = RuntimeEnvironmentSampler(ident)
    rows = [row for seq in range(1, SEND_BY_TICKS + 50) for row in long.collect(seq, seq)]
    assert [r["seq"] for r in rows] == [SEND_BY_TICKS]
    assert long.collect_final(SEND_BY_TICKS + 50, 0) == []


LATE_WRAP_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from traceml_ai.capture.identity import detect_identity
    from traceml_ai.capture.samplers.runtime_environment import SEND_BY_TICKS, RuntimeEnvironmentSampler, note_model
    ident = detect_identity({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    sampler = RuntimeEnvironmentSampler(ident)
    rows = [row for seq in range(1, SEND_BY_TICKS + 5) for row in sampler.collect(seq, seq)]
    # the model finished loading after the deadline: the process group and the DDP wrapper come now
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
    note_model(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2)))
    for seq in range(SEND_BY_TICKS + 5, SEND_BY_TICKS + 20):
        rows.extend(sampler.collect(seq, seq))
    rows.extend(sampler.collect_final(SEND_BY_TICKS + 20, 0))
    print([(r["seq"], r["training_strategy"], r["strategy_confidence"], r["distributed_initialized"]) for r in rows])
    dist.destroy_process_group()
""")


@pytest.mark.timeout(120)
def test_a_model_wrapped_after_the_deadline_sends_a_corrected_row() -> None:
    from traceml_ai.capture.samplers.runtime_environment import SEND_BY_TICKS

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
    proc = subprocess.run([sys.executable, "-c", LATE_WRAP_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert rows == [(SEND_BY_TICKS, "unknown", "low", 0), (SEND_BY_TICKS + 5, "DDP", "high", 1)]


def test_multi_rank_without_a_wrapper_is_unknown_not_guessed() -> None:
    ident = detect_identity({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    fields = detect(ident)
    assert fields["training_strategy"] == "unknown" and fields["strategy_confidence"] == "low"
    assert fields["strategy_source"].startswith("world_size=4")
    assert fields["topology"] == "1 node x 4 processes"


DDP_SCRIPT = textwrap.dedent("""
    import time
    import torch
    import torch.distributed as dist
    import traceml_ai
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(40):  # the same step count on every rank: each backward is a collective
        with traceml_ai.trace_step(model):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        time.sleep(0.02)  # ~1 s of training: several sampler ticks see the wrapped model
    dist.barrier()
    print(f"rank {dist.get_rank()} done", flush=True)
    dist.destroy_process_group()
""")


def test_two_rank_gloo_ddp_run_is_detected_as_ddp(tmp_path: Path) -> None:
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master_port = s.getsockname()[1]
    server = FrameServer()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEML_", "RANK", "WORLD_SIZE"))}
        # The default 1 s interval: the sampler sends an unsettled environment after SEND_BY_TICKS (120)
        # ticks, and at 0.05 s those 6 s ran out on a busy machine before the ranks had imported torch.
        env.update(TRACEML_SESSION_ID="sess-test", TRACEML_JOB_SECRET=TEST_SECRET,
                   TRACEML_AGGREGATOR=f"127.0.0.1:{server.port}",
                   TRACEML_INTERVAL="1.0", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(master_port),
               "-m", "traceml_ai.capture.bootstrap", "ddp.py"]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        # the strategy check has no side effects (isinstance on torch's deprecated reduce_op would warn)
        assert "FutureWarning" not in proc.stderr
        assert server.wait_for(lambda: len(server.finished) == 2)
        by_rank: dict[int, list[dict[str, object]]] = {0: [], 1: []}
        system_ranks = set()
        for env_ in server.envelopes:
            meta = env_["meta"]
            assert (meta["world_size"], meta["local_world_size"], meta["node_rank"]) == (2, 2, 0)
            by_rank[meta["global_rank"]].extend(env_["tables"].get("runtime_environment", []))
            if env_["tables"].get("system"):
                system_ranks.add(meta["global_rank"])
        for rows in by_rank.values():
            # One row per rank, or an unsettled one and its correction: the latest per rank wins
            # (000 seed key global_rank). Never more than the two.
            assert 1 <= len(rows) <= 2, rows
            last = rows[-1]
            assert last["training_strategy"] == "DDP", rows
            assert last["strategy_source"] == "DistributedDataParallel model"
            assert last["strategy_confidence"] == "high"
            assert last["distributed_initialized"] == 1 and last["distributed_backend"] == "gloo"
            assert last["topology"] == "1 node x 2 processes"
        assert system_ranks == {0}  # one host snapshot per node
        lines = {r["line"] for r in server.rows("stdout_stderr")}
        assert {"rank 0 done", "rank 1 done"} <= lines
    finally:
        server.stop()
