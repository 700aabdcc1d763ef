"""The aggregator started on a socket the launcher bound (``listen_early``): the training starts at
once, and a rank that connects before the aggregator process has even imported its modules is
served like any other (issue 14, item 1)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.aggregator.test_main import count
from tests.aggregator.wire import SECRET, SESSION, RankClient, identity, step_memory_rows, step_time_rows
from traceml_ai.capture.client import TransportClient
from traceml_ai.launcher.aggregator_process import AggregatorProcess
from traceml_ai.telemetry.envelope import make_envelope


def test_a_rank_connecting_before_the_aggregator_listens_loses_nothing(tmp_path: Path) -> None:
    agg = AggregatorProcess(tmp_path, SESSION, secret=SECRET, world_size=1, listen_early=True)
    try:
        client = RankClient(agg.port, 0, world_size=1)  # at once: the process is still starting
        assert client.hello() is not None
        for batch in range(3):
            client.send({"step_time": step_time_rows(batch * 10, 10), "step_memory": step_memory_rows(batch * 10, 10)})
        client.finish()
        client.close()
    finally:
        code = agg.stop()
    assert code == 0 and agg.start_failure is None
    db = tmp_path / "aggregator" / "telemetry.sqlite"
    assert count(db, "step_time_samples") == 30 and count(db, "step_memory_samples") == 30


def test_an_early_aggregator_that_never_listens_is_reported_and_frees_the_port(tmp_path: Path) -> None:
    told: list[str] = []
    done = threading.Event()

    def on_start_failure(why: str) -> None:
        told.append(why)
        done.set()

    agg = AggregatorProcess(tmp_path / "no-such-run", SESSION, secret=SECRET, listen_early=True,
                            on_start_failure=on_start_failure)  # returns at once, no exception
    try:
        assert done.wait(120)
    finally:
        agg.stop(timeout=10)
    assert told == [agg.start_failure] and "exited with code 1 before listening" in told[0]
    with socket.socket() as probe:  # nobody holds the socket any more: the ranks are refused, not left waiting
        assert probe.connect_ex(("127.0.0.1", agg.port)) != 0


def _late_aggregator(run_dir: Path, listener: socket.socket) -> subprocess.Popen[str]:
    """``python -m traceml_ai.aggregator`` on a socket bound long before, as the launcher starts it."""
    env = {**os.environ, "TRACEML_JOB_SECRET": SECRET}
    cmd = [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir), "--session-id", SESSION,
           "--world-size", "1", "--listen-fd", str(listener.fileno())]
    return subprocess.Popen(cmd, env=env, pass_fds=(listener.fileno(),), stdout=subprocess.DEVNULL, text=True)


@pytest.mark.parametrize("wait_s", [60.0, 0.0], ids=["told-it-is-starting", "not-told"])
def test_a_training_that_ends_before_the_aggregator_listens_keeps_its_rows_when_told(
        tmp_path: Path, wait_s: float) -> None:
    """The rank's close deadline (0.2 s here) passes while its connection still waits in the queue of
    a socket nobody accepts on yet. Told the aggregator is starting (TRACEML_AGGREGATOR_STARTING, as
    ``traceml run`` says when it starts the training first), the rank waits for the welcome and
    delivers everything; without that, its rows are dropped and counted, as before."""
    listener = socket.create_server(("127.0.0.1", 0))
    meta = {**identity(0, world_size=1)}
    client = TransportClient(listener.getsockname()[:2], SESSION, meta, secret=SECRET, first_welcome_wait_s=wait_s)
    client.start()
    for batch in range(3):
        client.submit(make_envelope(meta, {"step_time": step_time_rows(batch * 10, 10)}))
    closer = threading.Thread(target=client.close, kwargs={"timeout_s": 0.2})
    closer.start()
    time.sleep(1.5)  # the training is over and its deadline passed; now the aggregator comes up
    proc = _late_aggregator(tmp_path, listener)
    listener.close()
    try:
        closer.join(120)
        assert not closer.is_alive()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    db = tmp_path / "aggregator" / "telemetry.sqlite"
    if wait_s:
        assert (client.sent_batches, client.dropped_batches) == (3, 0)
        assert count(db, "step_time_samples") == 30
    else:
        assert client.sent_batches == 0 and client.dropped_batches == 3
        assert client.submitted_batches == client.sent_batches + client.dropped_batches


def test_traceml_run_tells_its_ranks_the_aggregator_may_still_be_starting(tmp_path: Path) -> None:
    """The environment a one-node ``traceml run`` training sees (no exporter: started early)."""
    script = tmp_path / "train.py"
    script.write_text("import os\nprint('STARTING=' + os.environ.get('TRACEML_AGGREGATOR_STARTING', '-'))\n")
    cmd = [sys.executable, "-m", "traceml_ai", "run", "--logs-dir", str(tmp_path / "runs"), str(script)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "STARTING=1" in done.stdout
