"""The capture session: sampler thread, envelopes per tick, faulty sources, close, config (DESIGN §3)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.capture.frame_server import TEST_SECRET, FrameServer
from traceml_ai.capture.identity import detect_identity
from traceml_ai.capture.session import CaptureConfig, CaptureSession, current_session, start_session

SINGLE = detect_identity({})


class Counter:
    """A row source of the step_time stream that counts its calls."""

    stream = "step_time"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        self.calls.append(seq)
        return [{"seq": seq, "timestamp_unix_ns": now_ns, "step": len(self.calls), "events": {}}]


class Broken:
    stream = "step_memory"

    def __init__(self) -> None:
        self.calls = 0

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        self.calls += 1
        raise RuntimeError("boom")


@pytest.fixture
def server() -> Iterator[FrameServer]:
    srv = FrameServer()
    yield srv
    srv.stop()


def config(server: FrameServer, **kw: Any) -> CaptureConfig:
    values: dict[str, Any] = {"interval": 0.05, "capture_output": False, **kw}
    return CaptureConfig(session_id="sess-test", aggregator=server.address, secret=TEST_SECRET, **values)


def test_one_envelope_per_tick_with_identity_meta_and_every_sources_rows(server: FrameServer) -> None:
    session = CaptureSession(config(server), identity=SINGLE)
    counter = Counter()
    session.add_source(counter)
    session.start()
    assert server.wait_for(lambda: len(server.envelopes) >= 3)
    session.close()
    assert server.wait_for(lambda: len(server.finished) == 1)
    envelopes = server.envelopes
    meta = envelopes[0]["meta"]
    assert meta == {"session_id": "sess-test", "global_rank": 0, "local_rank": 0, "world_size": 1,
                    "local_world_size": 1, "node_rank": 0, "hostname": SINGLE.hostname, "pid": os.getpid(),
                    "sampler": "capture"}
    for env in envelopes:
        tables = env["tables"]
        # rows of one tick share the tick's seq across sources
        seqs = {row["seq"] for name in ("step_time", "process", "system") for row in tables.get(name, [])}
        assert len(seqs) == 1
        assert {"step_time", "process", "system"} <= set(tables)
    # the close-time collect is the last tick and its rows arrived
    assert server.rows("step_time")[-1]["seq"] == counter.calls[-1] == session.seq
    assert server.finished[0]["sent_batches"] == len(envelopes) == session.envelopes
    assert session.stats()["dropped_batches"] == 0
    assert current_session() is None


class Lossy:
    """A step_time source whose bounded queue overflowed: it says how many rows it lost."""

    stream = "step_time"

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        return []

    def lost_rows(self) -> int:
        return 7


def test_rows_a_source_lost_reach_rank_finished_and_stderr(server: FrameServer, capfd: Any) -> None:
    session = CaptureSession(config(server), identity=SINGLE)
    session.add_source(Lossy())
    session.start()
    session.close()
    assert server.wait_for(lambda: len(server.finished) == 1)
    assert server.finished[0]["lost_rows"] == {"step_time": 7}
    assert session.stats()["lost_rows"] == {"step_time": 7}
    assert "7 step_time rows were dropped before sending" in capfd.readouterr().err


def test_a_source_that_raises_is_disabled_and_the_others_go_on(
        server: FrameServer, capfd: pytest.CaptureFixture[str]) -> None:
    session = CaptureSession(config(server), identity=SINGLE)
    broken, counter = Broken(), Counter()
    session.add_source(broken)
    session.add_source(counter)
    session.start()
    assert server.wait_for(lambda: len(counter.calls) >= 5)
    session.close()
    assert server.wait_for(lambda: len(server.finished) == 1)
    assert broken.calls == 1
    assert "Broken(step_memory)" in session.stats()["source_errors"]
    assert server.rows("step_memory") == []
    assert len(server.rows("step_time")) == len(counter.calls)
    warnings = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[TraceML]")]
    assert len(warnings) == 1 and "boom" in warnings[0]


def test_sources_added_after_start_are_collected(server: FrameServer) -> None:
    session = CaptureSession(config(server), identity=SINGLE)
    session.start()
    assert server.wait_for(lambda: len(server.envelopes) >= 1)
    counter = Counter()
    session.add_source(counter)
    assert server.wait_for(lambda: len(server.rows("step_time")) >= 2)
    session.close()


def test_system_rows_only_from_node_local_rank_zero(server: FrameServer) -> None:
    rank1 = detect_identity({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    session = CaptureSession(config(server), identity=rank1)
    session.start()
    assert server.wait_for(lambda: len(server.envelopes) >= 3)
    session.close()
    assert server.wait_for(lambda: len(server.finished) == 1)
    assert server.rows("system") == []
    assert server.rows("process")
    assert {e["meta"]["global_rank"] for e in server.envelopes} == {3}


def test_start_session_is_idempotent_and_current_session_follows(server: FrameServer) -> None:
    first = start_session(config(server))
    try:
        assert current_session() is first
        assert start_session(config(server, interval=5.0)) is first
        assert first.running
    finally:
        first.close()
    assert current_session() is None and not first.running
    first.close()  # closing twice is harmless


def test_session_without_aggregator_collects_and_counts_unsent() -> None:
    session = CaptureSession(CaptureConfig("s", None, interval=0.05, capture_output=False), identity=SINGLE)
    session.start()
    session.close()
    assert session.client is None
    assert session.stats()["unsent_envelopes"] == session.envelopes >= 1


def test_config_from_env() -> None:
    env = {"TRACEML_SESSION_ID": "abc", "TRACEML_AGGREGATOR": "127.0.0.1:7071", "TRACEML_RUN_DIR": "/tmp/r",
           "TRACEML_INTERVAL": "0.5", "TRACEML_CAPTURE": "watch"}
    assert CaptureConfig.from_env(env) == CaptureConfig(
        session_id="abc", aggregator=("127.0.0.1", 7071), run_dir="/tmp/r", interval=0.5, mode="watch")
    assert CaptureConfig.from_env({**env, "TRACEML_AGGREGATOR": "[::1]:9"}).aggregator == ("::1", 9)  # type: ignore[union-attr]
    assert CaptureConfig.from_env({**env, "TRACEML_CAPTURE_OUTPUT": "0"}).capture_output is False  # type: ignore[union-attr]
    assert CaptureConfig.from_env({**env, "TRACEML_JOB_SECRET": " s" * 10}).secret == "s s s s s s s s s s"  # type: ignore[union-attr]
    assert "secret" not in repr(CaptureConfig.from_env({**env, "TRACEML_JOB_SECRET": "x" * 20}))
    assert CaptureConfig.from_env({"TRACEML_SESSION_ID": "abc"}) is None
    assert CaptureConfig.from_env({**env, "TRACEML_DISABLE": "1"}) is None
    assert CaptureConfig.from_env({}) is None
    for name, bad in (("TRACEML_AGGREGATOR", "localhost"), ("TRACEML_AGGREGATOR", "h:99999"),
                      ("TRACEML_INTERVAL", "0"), ("TRACEML_INTERVAL", "fast"), ("TRACEML_CAPTURE", "train"),
                      ("TRACEML_JOB_SECRET", "short")):
        with pytest.raises(ValueError, match=name):
            CaptureConfig.from_env({**env, name: bad})


FORK_SCRIPT = textwrap.dedent("""
    import os, sys, time, warnings
    warnings.simplefilter("ignore", DeprecationWarning)  # python 3.12 warns on fork() with threads running
    from traceml_ai.capture.session import CaptureConfig, current_session, start_session
    host, port = sys.argv[1], int(sys.argv[2])
    session = start_session(CaptureConfig("sess-test", (host, port), interval=0.05, secret=sys.argv[3]))
    print("parent before fork", flush=True)
    pid = os.fork()
    if pid == 0:
        print("child line", flush=True)
        print("child sees session:", current_session() is not None, flush=True)
        time.sleep(0.3)
        sys.exit(0)  # a normal exit: atexit hooks run in the child too
    os.waitpid(pid, 0)
    print("parent after fork", flush=True)
""")


def test_forked_child_does_not_inherit_the_session(server: FrameServer, tmp_path: Path) -> None:
    script = tmp_path / "forks.py"
    script.write_text(FORK_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), server.host, str(server.port), TEST_SECRET],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "child sees session: False" in proc.stdout
    assert server.wait_for(lambda: len(server.finished) >= 1)
    lines = [r["line"] for r in server.rows("stdout_stderr")]
    assert lines == ["parent before fork", "parent after fork"]
    assert len(server.hellos) == 1 and len(server.finished) == 1
    assert {e["meta"]["pid"] for e in server.envelopes} == {server.finished[0]["pid"]}


def test_steps_that_raised_reach_rank_finished_and_only_they_are_discarded(server: FrameServer) -> None:
    import torch

    from traceml_ai.capture import steps

    session = CaptureSession(config(server), identity=SINGLE)
    session.start()
    tracer = steps.tracer_for(session)
    model = torch.nn.Linear(4, 2)
    for i in range(5):
        try:
            with tracer.step(model):
                model(torch.randn(3, 4)).sum().backward()
                if i in (1, 3):
                    raise RuntimeError("planted")
        except RuntimeError:
            pass
    session.close()
    assert server.wait_for(lambda: len(server.finished) == 1)
    assert server.finished[0]["step_counts"] == {"discarded_steps": 2, "dropped_updates": 0,
                                                 "dropped_micro_batches": 0, "failed_steps": 0}
    # No optimizer here, so the steps were held as possible micro-batches until the end: only the
    # two that raised are discarded (their numbers not reused), the others are steps of their own.
    assert sorted(r["step"] for r in server.rows("step_time")) == [0, 2, 4]
