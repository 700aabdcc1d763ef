"""The phase patches: installed once, transparent, fork-safe; compile detection; CUDA peak bookkeeping."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import dataloader  # noqa: E402

from traceml_ai.capture import instrument, timing  # noqa: E402
from traceml_ai.capture.instrument import CudaPeaks, compiled_reason  # noqa: E402
from traceml_ai.capture.steps import StepTracer  # noqa: E402
from traceml_ai.telemetry import schema  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def test_install_is_idempotent_and_keeps_the_originals_reachable() -> None:
    instrument.install()
    backward = torch.autograd.backward
    next_fn = dataloader._BaseDataLoaderIter.__next__
    instrument.install()
    assert torch.autograd.backward is backward
    assert dataloader._BaseDataLoaderIter.__next__ is next_fn
    for patched in (backward, next_fn):
        assert getattr(patched, "__traceml_patch__", False)
        assert not getattr(patched.__wrapped__, "__traceml_patch__", False)
    assert backward.__name__ == "backward" and backward.__doc__ == backward.__wrapped__.__doc__
    assert not hasattr(torch.Tensor.backward, "__traceml_patch__")  # it calls torch.autograd.backward


def test_uninstall_puts_the_originals_back_and_a_later_step_reinstalls() -> None:
    instrument.install()
    patched_backward = torch.autograd.backward
    instrument.uninstall()
    assert torch.autograd.backward is patched_backward.__wrapped__
    assert not hasattr(dataloader._BaseDataLoaderIter.__next__, "__traceml_patch__")
    tracer = StepTracer(echo_notes=False)
    model = nn.Linear(2, 1)
    with tracer.step(model):
        model(torch.randn(1, 2)).sum().backward()
    assert getattr(torch.autograd.backward, "__traceml_patch__", False)
    tracer.finish()  # a step with backward and no optimizer step waits for an update until the end
    (row,) = tracer.time_source.collect(1, 0)
    assert row["events"][schema.BACKWARD]["cpu"]["n_calls"] == 1


def test_patched_backward_outside_a_step_gives_the_same_gradients() -> None:
    instrument.install()
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    a = x.grad.clone()
    x.grad = None
    torch.autograd.backward([(x * x).sum()])
    assert torch.equal(a, torch.tensor([2.0, 4.0])) and torch.equal(x.grad, a)
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.tensor([1.0]).sum().backward()


def test_stop_iteration_at_the_end_of_an_epoch_passes_through() -> None:
    tracer = StepTracer(echo_notes=False)
    model = nn.Linear(2, 1)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)
    with tracer.step(model):
        pass
    batches = [b for (b,) in data]  # the third next() raises StopIteration: the loop ends as usual
    assert len(batches) == 2
    it = iter(data)
    next(it)
    next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_compiled_models_are_detected() -> None:
    model = nn.Linear(2, 2)
    assert compiled_reason(model) is None
    assert compiled_reason(torch.compile(model, backend="eager")) == "torch.compile(model)"
    other = nn.Linear(2, 2)
    other.compile(backend="eager")
    assert compiled_reason(other) == "model.compile()"


def test_the_compiling_check_is_asked_once_dynamo_is_imported() -> None:
    """Before ``torch._dynamo`` is imported nothing can be compiling, so the patches skip the check;
    from the first step after it is imported they ask ``torch.compiler.is_compiling()`` again, so
    that Dynamo tracing through a patch folds it away."""
    code = textwrap.dedent(
        """
        import sys
        import torch
        from traceml_ai.capture import instrument
        from traceml_ai.capture.steps import StepTracer
        assert "torch._dynamo" not in sys.modules
        tracer = StepTracer(echo_notes=False)
        model = torch.nn.Linear(2, 1)
        with tracer.step(model):
            model(torch.randn(1, 2)).sum().backward()
        assert not instrument.DYNAMO
        compiled = torch.compile(torch.nn.Linear(2, 1), backend="eager")  # imports torch._dynamo
        with tracer.step(model):
            model(torch.randn(1, 2)).sum().backward()
            compiled(torch.randn(1, 2))
        assert instrument.DYNAMO and instrument._is_compiling is torch.compiler.is_compiling
        tracer.finish()
        rows = tracer.time_source.collect(1, 0)
        assert [r["events"]["traceml:backward"]["cpu"]["n_calls"] for r in rows] == [1, 1]
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_a_model_pickles_between_steps_without_tracemls_hooks() -> None:
    tracer = StepTracer(echo_notes=False)
    model = nn.Linear(3, 1)
    with tracer.step(model):
        model(torch.randn(1, 3))
    clone = pickle.loads(pickle.dumps(model))
    assert not clone._forward_pre_hooks and not clone._forward_hooks and "forward" not in vars(clone)
    assert torch.equal(clone.weight, model.weight)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_times_nothing() -> None:
    tracer = StepTracer(echo_notes=False)
    with tracer.step(nn.Linear(1, 1)):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: reports what it inherited, then leaves at once
            os.write(write, b"%d%d" % (timing.OPEN is None, not timing.TRACING))
            os._exit(0)
        os.close(write)
        report = os.read(read, 2)
        os.waitpid(pid, 0)
    assert report == b"11"


# -- CUDA peak memory: the shadow logic on allocator statistics in PyTorch's nested format ----------


def nested(alloc_peak: int, reserved_peak: int, current: int = 10) -> dict[str, Any]:
    def stat(peak: int) -> dict[str, int]:
        return {"current": current, "peak": peak, "allocated": 100, "freed": 90}

    return {
        "allocated_bytes": {"all": stat(alloc_peak), "large_pool": stat(alloc_peak), "small_pool": stat(1)},
        "reserved_bytes": {"all": stat(reserved_peak), "large_pool": stat(reserved_peak), "small_pool": stat(2)},
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }


def test_peak_shadow_restores_what_a_reset_wiped() -> None:
    peaks = CudaPeaks()
    shadow: dict[tuple[str, ...], int] = {}
    instrument._fold(shadow, nested(alloc_peak=500, reserved_peak=800), ())
    assert shadow[("allocated_bytes", "all")] == 500 and shadow[("reserved_bytes", "small_pool")] == 2
    peaks._shadow[0] = shadow
    after_reset = nested(alloc_peak=40, reserved_peak=900)  # TraceML reset, then a new reserved high
    peaks._merge(0, after_reset)
    assert after_reset["allocated_bytes"]["all"]["peak"] == 500  # the user's peak, as if never reset
    assert after_reset["reserved_bytes"]["all"]["peak"] == 900  # a higher new peak wins
    assert after_reset["allocated_bytes"]["all"]["current"] == 10  # other fields untouched
    untouched = nested(alloc_peak=40, reserved_peak=40)
    peaks._merge(1, untouched)  # another device has no shadow
    assert untouched["allocated_bytes"]["all"]["peak"] == 40


# -- on a real GPU -----------------------------------------------------------------------------------


def _cuda_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()


@needs_cuda
def test_cuda_step_has_gpu_times_h2d_and_exact_peaks() -> None:
    tracer = StepTracer(echo_notes=False)
    model = _cuda_model()
    opt = torch.optim.Adam(model.parameters())
    for _ in range(3):
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        with tracer.step(model):
            x, y = x.to("cuda", non_blocking=True), y.cuda()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    rows = tracer.time_source.collect_final(1, time.time_ns())
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        for name in (schema.H2D, schema.FORWARD, schema.BACKWARD, schema.OPTIMIZER_STEP, schema.STEP):
            stats = row["events"][name]["cuda:0"]
            assert stats["is_gpu"] is True and stats["gpu_ms"] is not None and stats["gpu_ms"] >= 0.0
            assert stats["duration_ms"] == stats["gpu_ms"]
        assert row["events"][schema.H2D]["cuda:0"]["n_calls"] == 2
    memory = tracer.memory_source.collect(1, time.time_ns())
    assert [m["device"] for m in memory] == ["cuda:0"] * 3
    assert all(m["peak_alloc_bytes"] > 0 and m["peak_reserved_bytes"] >= m["peak_alloc_bytes"] for m in memory)


@needs_cuda
def test_cuda_peaks_are_per_step_and_unknown_after_a_user_reset() -> None:
    tracer = StepTracer(echo_notes=False)
    model = _cuda_model()
    big_bytes = 256 << 20
    for i in range(3):
        with tracer.step(model):
            model(torch.randn(8, 256, device="cuda"))
            if i == 0:
                big = torch.empty(big_bytes, dtype=torch.uint8, device="cuda")
                del big
            if i == 2:
                torch.cuda.reset_peak_memory_stats()
    memory = tracer.memory_source.collect(1, time.time_ns())
    assert memory[0]["peak_alloc_bytes"] >= big_bytes
    assert 0 < memory[1]["peak_alloc_bytes"] < big_bytes  # step 1 did not hold the big tensor
    assert memory[2]["peak_alloc_bytes"] is None and memory[2]["peak_reserved_bytes"] is None


@needs_cuda
def test_cuda_peak_counters_the_user_reads_are_unchanged() -> None:
    def run(traced: bool) -> tuple[int, int, int]:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        tracer = StepTracer(echo_notes=False) if traced else None
        model = _cuda_model()
        big = None
        for i in range(3):
            scope = tracer.step(model) if tracer is not None else nullcontext()
            with scope:
                h = model(torch.randn(512, 256, device="cuda"))
                if i == 0:
                    big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # 64 MiB, step 0 only
                    del big
                h.sum().backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(), torch.cuda.memory_stats()["allocated_bytes.all.peak"], \
            torch.cuda.max_memory_reserved()

    plain = run(False)
    traced = run(True)
    assert traced == plain
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()


def nullcontext() -> Any:
    import contextlib

    return contextlib.nullcontext()
