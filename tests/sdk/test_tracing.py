"""``trace_step`` / ``trace_region`` with and without a capture session (DESIGN §3.1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from tests.capture.frame_server import TEST_SECRET, FrameServer
from traceml_ai.capture.identity import detect_identity
from traceml_ai.capture.session import CaptureConfig, CaptureSession
from traceml_ai.capture.steps import tracer_for
from traceml_ai.sdk import tracing
from traceml_ai.telemetry import schema


def test_without_a_session_nothing_is_patched_timed_or_imported() -> None:
    code = textwrap.dedent(
        """
        import sys
        import traceml_ai
        with traceml_ai.trace_step(None):
            with traceml_ai.trace_region("r"):
                pass
        assert "torch" not in sys.modules, "trace_step imported torch"
        import torch
        from torch.utils.data import dataloader
        model = torch.nn.Linear(2, 1)
        with traceml_ai.trace_step(model):
            model(torch.randn(1, 2)).sum().backward()
        assert not hasattr(torch.Tensor.backward, "__traceml_patch__")
        assert not hasattr(dataloader._BaseDataLoaderIter.__next__, "__traceml_patch__")
        assert not model._forward_pre_hooks
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_without_a_session_the_context_managers_are_shared_no_ops() -> None:
    assert tracing.trace_step(None) is tracing.trace_step(object())
    assert tracing.trace_region("a") is tracing.trace_region("b")
    with pytest.raises(ZeroDivisionError), tracing.trace_step(None):
        _ = 1 / 0


@pytest.mark.parametrize(
    ("name", "error"), [(3, TypeError), ("", ValueError), ("traceml:forward", ValueError)]
)
def test_region_names_are_checked(name: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        tracing.trace_region(name)


@pytest.fixture
def server() -> Iterator[FrameServer]:
    srv = FrameServer()
    yield srv
    srv.stop()


def test_steps_reach_the_aggregator_through_the_session(server: FrameServer, monkeypatch: Any) -> None:
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    session = CaptureSession(
        CaptureConfig("sess-test", server.address, interval=0.05, capture_output=False, secret=TEST_SECRET),
        identity=detect_identity({}),
    )
    from traceml_ai.capture import session as session_module

    monkeypatch.setattr(session_module, "_current", session)
    session.start()
    try:
        # Built while the sampler thread runs, as in a real script: the runtime_environment sampler once
        # walked gc.get_objects() and made torch.optim.SGD(...) fail here with a SystemError.
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(TensorDataset(torch.randn(40, 4), torch.randn(40, 1)), batch_size=4)
        for epoch in range(2):
            for x, y in data:
                with tracing.trace_step(model):
                    loss = nn.functional.mse_loss(model(x), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    with tracing.trace_region("log"):
                        loss.item()
            if epoch == 0:  # the first epoch's rows arrive before the second epoch starts
                assert server.wait_for(lambda: len(server.rows(schema.STEP_TIME)) == 10)
        tracer = tracer_for(session)
        assert tracer is tracer_for(session)
    finally:
        session.close()
    assert server.wait_for(lambda: len(server.finished) == 1)
    rows = server.rows(schema.STEP_TIME)
    assert [r["step"] for r in rows] == list(range(20))
    assert len({r["seq"] for r in rows}) >= 2
    for row in rows[1:]:
        assert {schema.DATALOADER_NEXT, schema.FORWARD, schema.BACKWARD, schema.OPTIMIZER_STEP, schema.STEP,
                "log"} <= set(row["events"])
        assert row["events"][schema.FORWARD]["cpu"]["n_calls"] == 1
    memory = server.rows(schema.STEP_MEMORY)
    assert [(m["step"], m["device"], m["peak_alloc_bytes"]) for m in memory] == [(i, "cpu", None) for i in range(20)]
    sources = [s for s in session.sources if s.stream in (schema.STEP_TIME, schema.STEP_MEMORY)]
    assert len(sources) == 2  # registered once, however many steps
