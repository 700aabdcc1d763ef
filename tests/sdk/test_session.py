"""``traceml_ai.init()``: arguments over environment, the bootstrap's session, capture off in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import traceml_ai
from tests.capture.frame_server import TEST_SECRET, FrameServer
from traceml_ai.capture.session import current_session

ENV = ("TRACEML_SESSION_ID", "TRACEML_AGGREGATOR", "TRACEML_INTERVAL", "TRACEML_CAPTURE", "TRACEML_DISABLE",
       "TRACEML_CAPTURE_OUTPUT", "TRACEML_JOB_SECRET")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    yield
    session = current_session()
    if session is not None:
        session.close()


@pytest.fixture
def server() -> Iterator[FrameServer]:
    srv = FrameServer()
    yield srv
    srv.stop()


def traceml_lines(capfd: pytest.CaptureFixture[str]) -> list[str]:
    return [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[TraceML]")]


def test_nothing_configured_means_capture_off_in_one_line(capfd: pytest.CaptureFixture[str]) -> None:
    assert traceml_ai.init() is None
    lines = traceml_lines(capfd)
    assert len(lines) == 1 and "no aggregator address" in lines[0] and "TRACEML_AGGREGATOR" in lines[0]
    assert current_session() is None


def test_aggregator_without_session_id_is_off(capfd: pytest.CaptureFixture[str]) -> None:
    assert traceml_ai.init(aggregator="127.0.0.1:9") is None
    assert "no session id" in traceml_lines(capfd)[0]


def test_explicit_arguments_start_a_session_and_a_second_init_returns_it(
        server: FrameServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEML_JOB_SECRET", TEST_SECRET)
    session = traceml_ai.init(aggregator=f"127.0.0.1:{server.port}", session_id="sess-test", interval=0.05,
                              run_dir="/tmp/some-run")
    assert session is not None and session is current_session()
    assert session.config.interval == 0.05 and session.config.run_dir == "/tmp/some-run"
    assert traceml_ai.init(aggregator="127.0.0.1:1", session_id="other") is session
    assert server.wait_for(lambda: len(server.envelopes) >= 2)
    session.close()
    assert server.wait_for(lambda: len(server.finished) == 1)
    assert server.hellos[0]["session_id"] == "sess-test"


def test_environment_fills_in_and_arguments_win(server: FrameServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEML_AGGREGATOR", f"127.0.0.1:{server.port}")
    monkeypatch.setenv("TRACEML_SESSION_ID", "sess-test")
    monkeypatch.setenv("TRACEML_JOB_SECRET", TEST_SECRET)
    monkeypatch.setenv("TRACEML_INTERVAL", "30")
    session = traceml_ai.init(interval=0.05)
    assert session is not None
    assert session.config.interval == 0.05 and session.config.aggregator == ("127.0.0.1", server.port)
    assert server.wait_for(lambda: len(server.envelopes) >= 2)


@pytest.mark.parametrize(("env", "kwargs", "says"), [
    ({"TRACEML_DISABLE": "1", "TRACEML_AGGREGATOR": "127.0.0.1:9", "TRACEML_SESSION_ID": "s"}, {}, "TRACEML_DISABLE"),
    ({}, {"aggregator": "no-port-here", "session_id": "s"}, "not host:port"),
    ({"TRACEML_INTERVAL": "-1"}, {"aggregator": "127.0.0.1:9", "session_id": "s"}, "TRACEML_INTERVAL"),
    ({}, {"aggregator": "127.0.0.1:9", "session_id": "s"}, "no job secret"),
    ({"TRACEML_JOB_SECRET": "short"}, {"aggregator": "127.0.0.1:9", "session_id": "s"}, "TRACEML_JOB_SECRET"),
])
def test_bad_or_disabled_configuration_is_off_not_an_error(
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        env: dict[str, str], kwargs: dict[str, str], says: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert traceml_ai.init(**kwargs) is None
    lines = traceml_lines(capfd)
    assert len(lines) == 1 and says in lines[0]


def test_under_the_bootstrap_init_returns_the_running_session(server: FrameServer, tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(textwrap.dedent("""
        import traceml_ai
        from traceml_ai.capture.session import current_session
        running = current_session()
        print(running is not None and traceml_ai.init(aggregator="127.0.0.1:1") is running)
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    env.update(TRACEML_SESSION_ID="sess-test", TRACEML_JOB_SECRET=TEST_SECRET,
               TRACEML_AGGREGATOR=f"127.0.0.1:{server.port}")
    proc = subprocess.run([sys.executable, "-m", "traceml_ai.capture.bootstrap", "job.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and proc.stdout == "True\n" and proc.stderr == ""
    assert server.wait_for(lambda: len(server.finished) == 1)
    assert len(server.hellos) == 1
