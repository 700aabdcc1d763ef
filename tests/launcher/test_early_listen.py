"""The aggregator started on a socket the launcher bound (``listen_early``): the training starts at
once, and a rank that connects before the aggregator process has even imported its modules is
served like any other (issue 14, item 1)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from tests.aggregator.test_main import count
from tests.aggregator.wire import SECRET, SESSION, RankClient, step_memory_rows, step_time_rows
from traceml_ai.launcher.aggregator_process import AggregatorProcess


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
