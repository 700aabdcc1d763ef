"""Step tracer and the step_time / step_memory sources, on real torch training on the CPU (DESIGN §3.1)."""

from __future__ import annotations

import copy
import inspect
import io
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset, TensorDataset  # noqa: E402

from traceml_ai.capture import timing  # noqa: E402
from traceml_ai.capture.steps import StepMemorySource, StepTimeSource, StepTracer  # noqa: E402
from traceml_ai.telemetry import schema  # noqa: E402

SLEEP_S = 0.02


class SlowDataset(Dataset[tuple[Any, Any]]):
    """A TensorDataset whose every item takes at least ``SLEEP_S`` to fetch."""

    def __init__(self, n: int = 6) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        time.sleep(SLEEP_S)
        return self.x[i], self.y[i]


class SlowForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: Any) -> Any:
        time.sleep(SLEEP_S)
        return self.net(x)


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))


def loader(n: int = 32, batch_size: int = 8, **kw: Any) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(1)
    return DataLoader(TensorDataset(torch.randn(n, 8, generator=g), torch.randn(n, 1, generator=g)),
                      batch_size=batch_size, **kw)


def train(tracer: StepTracer | None, model: nn.Module, data: DataLoader[Any], opt: Any) -> list[float]:
    losses = []
    for x, y in data:
        scope = tracer.step(model) if tracer is not None else _Null()
        with scope:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def rows_of(tracer: StepTracer) -> list[dict[str, Any]]:
    # finish(): steps that ran backward without an optimizer step wait for an update that may
    # group them (gradient accumulation); at the end of a run they are steps of their own.
    tracer.finish()
    return tracer.time_source.collect(1, time.time_ns())


def phase(row: dict[str, Any], name: str) -> dict[str, Any]:
    (stats,) = row["events"][name].values()
    return stats


@pytest.fixture
def tracer() -> Iterator[StepTracer]:
    t = StepTracer(echo_notes=False)
    yield t
    assert timing.OPEN is None, "a step was left open"


def test_every_phase_is_measured_with_the_planted_sleeps(tracer: StepTracer) -> None:
    model = SlowForward()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = DataLoader(SlowDataset(), batch_size=1)
    train(tracer, model, data, opt)
    rows = rows_of(tracer)
    assert [r["step"] for r in rows] == list(range(6))
    # The first fetch came before the tracer's first step: it is measured only if the DataLoader patch
    # was already installed (an earlier step in this process); never a made-up 0.
    first = rows[0]["events"].get(schema.DATALOADER_NEXT)
    assert first is None or first["cpu"]["cpu_ms"] >= SLEEP_S * 1000
    for row in rows[1:]:
        dl = phase(row, schema.DATALOADER_NEXT)
        fwd = phase(row, schema.FORWARD)
        bwd = phase(row, schema.BACKWARD)
        opt_stats = phase(row, schema.OPTIMIZER_STEP)
        step = phase(row, schema.STEP)
        assert dl["cpu_ms"] >= SLEEP_S * 1000 and dl["n_calls"] == 1
        assert fwd["cpu_ms"] >= SLEEP_S * 1000 and fwd["n_calls"] == 1
        assert opt_stats["n_calls"] == 1 and opt_stats["cpu_ms"] > 0
        # traceml:step spans the fetch of its batch and every phase inside the block, each counted once:
        # a backward that also counted the forward's sleep would push the sum past the step. (No
        # wall-time bound on any phase: on a loaded machine any of them may be preempted.)
        assert step["cpu_ms"] >= dl["cpu_ms"] + fwd["cpu_ms"] + bwd["cpu_ms"] + opt_stats["cpu_ms"]
        for stats in row["events"].values():
            (device,) = stats
            assert device == "cpu"
            assert stats["cpu"]["is_gpu"] is False and stats["cpu"]["gpu_ms"] is None
            assert stats["cpu"]["duration_ms"] == stats["cpu"]["cpu_ms"]
        assert set(row) == {"seq", "timestamp_unix_ns", "step", "events"}


def test_no_h2d_phase_on_cpu_even_with_to_calls(tracer: StepTracer) -> None:
    model = mlp()
    for x, _ in loader():
        with tracer.step(model):
            model(x.to("cpu").to(torch.float32))
    assert all(schema.H2D not in r["events"] for r in rows_of(tracer))


def test_forward_counts_outermost_model_calls_only(tracer: StepTracer) -> None:
    model = mlp()  # three submodules, each called inside model(x)
    loss_fn = nn.MSELoss()  # a module too, but not the model's
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    with tracer.step(model):
        a = model(x)
        b = model(x * 2)
        model[0](x)  # a submodule called directly is not the model's forward
        loss_fn(a + b, y).backward()
    (row,) = rows_of(tracer)
    assert phase(row, schema.FORWARD)["n_calls"] == 2
    assert phase(row, schema.BACKWARD)["n_calls"] == 1
    assert schema.OPTIMIZER_STEP not in row["events"]


def test_steps_are_numbered_in_order_and_step_argument_sets_the_number(tracer: StepTracer) -> None:
    model = mlp()
    x = torch.randn(2, 8)
    for _ in range(3):
        with tracer.step(model):
            model(x)
    with tracer.step(model, step=100):
        model(x)
    with tracer.step(model):
        model(x)
    rows = rows_of(tracer)
    assert [r["step"] for r in rows] == [0, 1, 2, 100, 101]
    stamps = [r["timestamp_unix_ns"] for r in rows]
    assert stamps == sorted(stamps) and all(isinstance(s, int) for s in stamps)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_training_is_bit_identical_with_and_without_tracing(optimizer: str) -> None:
    def run(traced: bool) -> tuple[list[float], list[Any], list[Any]]:
        model = mlp(seed=3)
        params = list(model.parameters())
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9) if optimizer == "sgd" else torch.optim.Adam(params)
        tracer = StepTracer(echo_notes=False) if traced else None
        losses = train(tracer, model, loader(), opt)
        # One more step whose gradients are kept, to compare them too.
        x, y = next(iter(loader()))
        with tracer.step(model) if tracer is not None else _Null():
            nn.functional.mse_loss(model(x), y).backward()
        return losses, [p.detach().clone() for p in params], [p.grad.clone() for p in params]

    plain = run(False)
    traced = run(True)
    assert traced[0] == plain[0]
    assert all(torch.equal(a, b) for a, b in zip(traced[1], plain[1], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(traced[2], plain[2], strict=True))


def test_exception_in_a_step_propagates_unchanged_and_the_step_is_closed(tracer: StepTracer) -> None:
    model = mlp()
    boom = ValueError("bad batch")
    with pytest.raises(ValueError) as caught, tracer.step(model):
        model(torch.randn(2, 8))
        raise boom
    assert caught.value is boom
    assert timing.OPEN is None

    class Exploding(nn.Module):
        def forward(self, x: Any) -> Any:
            raise KeyError("in forward")

    bad = Exploding()
    with pytest.raises(KeyError, match="in forward"), tracer.step(bad):
        bad(torch.randn(2))
    # The model carries nothing of TraceML once its step is closed, even after an exception.
    assert not bad._forward_pre_hooks and not bad._forward_hooks and "forward" not in vars(bad)
    with tracer.step(model):
        model(torch.randn(2, 8))
    rows = rows_of(tracer)
    # The two steps that raised are discarded whole: no row, and their numbers are not reused.
    assert [r["step"] for r in rows] == [2]
    assert phase(rows[0], schema.FORWARD)["n_calls"] == 1
    assert tracer.discarded_steps == 2
    assert any("2 step(s) raised and were discarded" in n for n in tracer.notes)


def test_exception_in_backward_and_optimizer_propagates_unchanged(tracer: StepTracer) -> None:
    model = mlp()
    out = model(torch.randn(2, 8))
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"), \
            tracer.step(model):
        out.backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure_that_fails() -> Any:
        raise ArithmeticError("closure")

    with pytest.raises(ArithmeticError, match="closure"), tracer.step(model):
        opt.step(closure_that_fails)
    with tracer.step(model):
        opt.step()  # the optimizer timer left open by the failed step does not leak into this one
    (row,) = rows_of(tracer)
    assert row["step"] == 2
    assert phase(row, schema.OPTIMIZER_STEP)["n_calls"] == 1


def test_the_forward_timer_lives_only_while_the_step_is_open(tracer: StepTracer) -> None:
    model = mlp()
    seen: list[bool] = []
    with tracer.step(model):
        seen.append("forward" in vars(model))  # the timing wrapper, on torch's plain call path
        model(torch.randn(1, 8))
    assert seen == [True]
    assert "forward" not in vars(model)
    assert not model._forward_pre_hooks and not model._forward_hooks and not model._forward_hooks_always_called
    assert phase(rows_of(tracer)[0], schema.FORWARD)["n_calls"] == 1


def test_copies_made_inside_a_step_run_their_own_forward_and_carry_nothing_of_traceml(tracer: StepTracer) -> None:
    model = mlp()
    x = torch.randn(3, 8)
    with tracer.step(model):
        deep = copy.deepcopy(model)  # an EMA model, say
        shallow = copy.copy(model)
        pickled = pickle.loads(pickle.dumps(model))
        buffer = io.BytesIO()
        torch.save(model, buffer)
        replica = model._replicate_for_data_parallel()  # what nn.DataParallel makes per device
        with torch.no_grad():
            for p in deep.parameters():
                p.add_(1.0)
        out_model = model(x)
        out_deep = deep(x)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    for clone in (deep, shallow, pickled, saved, replica):
        assert "forward" not in vars(clone)
        assert not clone._forward_pre_hooks and not clone._forward_hooks
    assert not torch.equal(out_deep, out_model)  # the deep copy ran with its own weights
    assert torch.equal(saved(x), model(x)) and torch.equal(pickled(x), model(x))
    assert phase(rows_of(tracer)[0], schema.FORWARD)["n_calls"] == 1  # copies are not the traced model


def test_a_module_with_hooks_of_its_own_is_timed_with_hooks_that_include_them(tracer: StepTracer) -> None:
    model = mlp()
    x = torch.randn(2, 8)
    ran: list[str] = []

    def slow_pre_hook(module: Any, args: Any) -> None:  # FSDP2's unshard is such a hook
        time.sleep(SLEEP_S)
        ran.append("pre")

    handle = model.register_forward_pre_hook(slow_pre_hook)
    with tracer.step(model):
        assert "forward" not in vars(model) and len(model._forward_pre_hooks) == 2
        clone = copy.deepcopy(model)
        model(x)
    assert ran == ["pre"]
    assert list(model._forward_pre_hooks.values()) == [slow_pre_hook] and not model._forward_hooks
    assert list(clone._forward_pre_hooks.values()) == [slow_pre_hook] and not clone._forward_hooks
    handle.remove()
    with tracer.step(model):  # without hooks of its own, the next step takes the plain call path
        assert "forward" in vars(model) and not model._forward_pre_hooks
        model(x)
    first, second = rows_of(tracer)
    assert phase(first, schema.FORWARD)["cpu_ms"] >= SLEEP_S * 1000  # its own hook counts in its forward
    assert phase(second, schema.FORWARD)["n_calls"] == 1


def test_an_instance_forward_set_by_other_code_is_timed_and_kept(tracer: StepTracer) -> None:
    model = mlp()
    x = torch.randn(2, 8)
    original = model.forward
    calls: list[int] = []

    def patched(inputs: Any) -> Any:  # what accelerate's autocast wrapper does to model.forward
        calls.append(1)
        return original(inputs)

    model.forward = patched  # type: ignore[method-assign]
    with tracer.step(model):
        model(x)
    assert vars(model)["forward"] is patched and calls == [1]

    def replaced(inputs: Any) -> Any:
        return original(inputs)

    with tracer.step(model):
        model.forward = replaced  # type: ignore[method-assign]  # set during the step: it stays
        model(x)
    assert vars(model)["forward"] is replaced
    with tracer.step(model):
        model(x)
    assert vars(model)["forward"] is replaced
    rows = rows_of(tracer)
    assert [schema.FORWARD in r["events"] for r in rows] == [True, False, True]


def test_the_forward_keeps_its_signature_inside_a_step(tracer: StepTracer) -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x: Any, *, scale: float = 1.0) -> Any:
            return self.lin(x) * scale

    model = Scaled()
    outside = inspect.signature(model.forward)
    with tracer.step(model):
        inside = inspect.signature(model.forward)
        out = model(torch.ones(1, 2), scale=2.0)
    assert inside == outside
    assert torch.equal(out, model(torch.ones(1, 2), scale=2.0))


def test_a_module_class_with_its_own_copying_is_timed_with_hooks(tracer: StepTracer) -> None:
    class OwnState(nn.Linear):
        def __getstate__(self) -> Any:
            return dict(self.__dict__)  # a copy TraceML cannot clean: no wrapper goes in

    model = OwnState(2, 1)
    with tracer.step(model):
        assert "forward" not in vars(model) and len(model._forward_pre_hooks) == 1
        model(torch.randn(1, 2))
    assert not model._forward_pre_hooks and not model._forward_hooks
    assert phase(rows_of(tracer)[0], schema.FORWARD)["n_calls"] == 1


def test_no_grad_inside_a_step_behaves_as_without_tracing(tracer: StepTracer) -> None:
    model = mlp()
    x = torch.randn(3, 8)
    with torch.no_grad():
        expected = model(x)
    with tracer.step(model), torch.no_grad():
        got = model(x)
    assert torch.equal(got, expected) and not got.requires_grad
    assert all(p.grad is None for p in model.parameters())
    assert phase(rows_of(tracer)[0], schema.FORWARD)["n_calls"] == 1


def test_regions_nest_and_a_region_outside_a_step_goes_to_the_next_step(tracer: StepTracer) -> None:
    model = mlp()
    with tracer.region("setup"):
        time.sleep(SLEEP_S)
    with tracer.step(model):
        with tracer.region("outer"):
            with tracer.region("inner"):
                model(torch.randn(1, 8))
            with tracer.region("inner"):
                pass
            with tracer.region("outer"):  # same name nested: counted once, by the outer block
                time.sleep(SLEEP_S)
    with tracer.step(model):
        pass
    first, second = rows_of(tracer)
    assert phase(first, "setup")["cpu_ms"] >= SLEEP_S * 1000 and phase(first, "setup")["n_calls"] == 1
    assert phase(first, "outer")["n_calls"] == 1 and phase(first, "outer")["cpu_ms"] >= SLEEP_S * 1000
    assert phase(first, "inner")["n_calls"] == 2
    assert phase(first, "outer")["cpu_ms"] >= phase(first, "inner")["cpu_ms"]
    assert set(second["events"]) == {schema.STEP}


def test_a_full_hand_off_queue_counts_its_lost_steps_and_rows() -> None:
    tracer = StepTracer(max_steps=2, echo_notes=False)
    model = mlp()
    for _ in range(5):  # nobody collects: the oldest three are dropped, and counted
        with tracer.step(model):
            model(torch.randn(1, 8))
    assert tracer.time_source.lost_rows() == 3 and tracer.memory_source.lost_rows() == 3
    assert [row["step"] for row in rows_of(tracer)] == [3, 4]


def test_a_region_after_the_last_step_is_reported_not_dropped_silently(tracer: StepTracer, capfd: Any) -> None:
    model = mlp()
    with tracer.step(model):
        pass
    with tracer.region("final_eval"):
        pass
    rows = tracer.time_source.collect_final(1, time.time_ns())
    assert [row["step"] for row in rows] == [0]
    assert any("1 trace_region block(s) (final_eval) ended after the last traced step" in n for n in tracer.notes)
    assert "final_eval" in capfd.readouterr().err


def test_a_region_that_raises_propagates_and_still_counts(tracer: StepTracer) -> None:
    with tracer.step(None):
        with pytest.raises(ZeroDivisionError), tracer.region("risky"):
            _ = 1 / 0
    assert phase(rows_of(tracer)[0], "risky")["n_calls"] == 1


def test_nested_step_is_ignored_with_a_note(tracer: StepTracer) -> None:
    model = mlp()
    with tracer.step(model):
        with tracer.step(model):
            model(torch.randn(1, 8))
    rows = rows_of(tracer)
    assert [r["step"] for r in rows] == [0]
    assert phase(rows[0], schema.FORWARD)["n_calls"] == 1
    assert any("nested" in note for note in tracer.notes)


def test_only_the_step_thread_is_timed(tracer: StepTracer) -> None:
    model = mlp()
    done = threading.Event()
    other_step: list[Any] = []

    def elsewhere() -> None:
        model(torch.randn(1, 8))  # same model, other thread: not this step's forward
        with tracer.step(model) as nothing:  # a second step while one is open: ignored
            other_step.append(nothing)
        done.set()

    with tracer.step(model):
        model(torch.randn(1, 8))
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert done.is_set()
    (row,) = rows_of(tracer)
    assert phase(row, schema.FORWARD)["n_calls"] == 1
    assert any("another thread" in note for note in tracer.notes)


def test_compiled_model_falls_back_to_step_level_with_a_note(tracer: StepTracer, capfd: Any) -> None:
    model = mlp()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(4, 8)
    expected = model(x)
    noisy = StepTracer()  # echoes its notes on stderr
    for t in (tracer, noisy):
        with t.step(compiled):
            out = compiled(x)
            out.sum().backward()
        assert torch.equal(out, expected)
        assert not compiled._forward_pre_hooks and not model._forward_pre_hooks
    row = rows_of(tracer)[0]
    assert schema.FORWARD not in row["events"]
    assert phase(row, schema.BACKWARD)["n_calls"] == 1 and phase(row, schema.STEP)["n_calls"] == 1
    assert any("torch.compile" in note for note in tracer.notes)
    assert "[TraceML] model is torch.compile'd" in capfd.readouterr().err

    inplace = mlp()
    inplace.compile(backend="eager")
    with tracer.step(inplace):
        inplace(x)
    assert schema.FORWARD not in rows_of(tracer)[0]["events"]


def test_a_fetch_between_steps_counts_once_in_the_next_step(tracer: StepTracer) -> None:
    model = mlp()
    train_it = iter(loader())
    val = loader(n=24)
    for _ in range(2):
        x, _y = next(train_it)
        with tracer.step(model):
            model(x)
        for vx, _vy in val:  # a validation loop between two steps: its fetches are not the step's
            with torch.no_grad():
                model(vx)
    rows = rows_of(tracer)
    assert phase(rows[1], schema.DATALOADER_NEXT)["n_calls"] == 1


def test_fetches_inside_a_step_count_there(tracer: StepTracer) -> None:
    model = mlp()
    it = iter(loader())
    with tracer.step(model):
        next(it)
        next(it)
    assert phase(rows_of(tracer)[0], schema.DATALOADER_NEXT)["n_calls"] == 2


def test_multiprocess_dataloader_is_timed_in_the_training_process(tracer: StepTracer) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(SlowDataset(n=4), batch_size=1, num_workers=2)
    for _ in range(2):  # the second epoch's first fetch follows a step: it is measured
        train(tracer, model, data, opt)
    rows = rows_of(tracer)
    assert [r["step"] for r in rows] == list(range(8))
    assert all(phase(r, schema.DATALOADER_NEXT)["n_calls"] == 1 for r in rows[1:])


def test_memory_rows_on_cpu_have_null_peaks(tracer: StepTracer) -> None:
    model = mlp()
    train(tracer, model, loader(n=16), torch.optim.SGD(model.parameters(), lr=0.1))
    rows = tracer.memory_source.collect(7, time.time_ns())
    assert [r["step"] for r in rows] == [0, 1]
    for row in rows:
        assert row == {"seq": 7, "timestamp_unix_ns": row["timestamp_unix_ns"], "device": "cpu",
                       "step": row["step"], "peak_alloc_bytes": None, "peak_reserved_bytes": None}
    assert tracer.memory_source.collect(8, time.time_ns()) == []


def test_full_queues_drop_the_oldest_steps_and_count_them() -> None:
    tracer = StepTracer(max_steps=3, echo_notes=False)
    for _ in range(5):
        with tracer.step(None):
            pass
    assert [r["step"] for r in rows_of(tracer)] == [2, 3, 4]
    assert tracer.time_source.dropped_steps == 2
    assert [r["step"] for r in tracer.memory_source.collect(1, 0)] == [2, 3, 4]
    assert tracer.memory_source.dropped_rows == 2


def test_sources_collected_on_a_background_thread_get_every_step_once_in_order() -> None:
    tracer = StepTracer(echo_notes=False)
    got: list[dict[str, Any]] = []
    stop = threading.Event()

    def sampler() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            got.extend(tracer.time_source.collect(seq, time.time_ns()))
            time.sleep(0.001)
        got.extend(tracer.time_source.collect_final(seq + 1, time.time_ns()))

    thread = threading.Thread(target=sampler)
    thread.start()
    model = mlp()
    opt = torch.optim.Adam(model.parameters())
    for _ in range(3):
        train(tracer, model, loader(n=64, batch_size=4), opt)
    stop.set()
    thread.join()
    assert [r["step"] for r in got] == list(range(48))
    assert tracer.time_source.dropped_steps == 0


def test_sources_validate_their_bounds() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        StepTimeSource(max_steps=0)
    with pytest.raises(ValueError, match="max_rows"):
        StepMemorySource(max_rows=0)
    assert StepTimeSource.stream == "step_time" and StepMemorySource.stream == "step_memory"


def test_forward_is_found_in_submodules_when_the_model_itself_is_not_called(tracer: StepTracer) -> None:
    class Lit(nn.Module):  # a LightningModule-like wrapper whose training code calls its children
        def __init__(self) -> None:
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
            self.head = nn.Linear(16, 1)

        def training_step(self, x: Any) -> Any:
            return self.head(self.encoder(x)).sum()

    lit = Lit()
    for _ in range(3):
        with tracer.step(lit):
            lit.training_step(torch.randn(2, 8)).backward()
    with tracer.step(lit):
        lit.head(lit.encoder(torch.randn(2, 8)))  # no backward: the targets stay as found
    rows = rows_of(tracer)
    assert schema.FORWARD not in rows[0]["events"]  # the step that found out
    assert [phase(r, schema.FORWARD)["n_calls"] for r in rows[1:]] == [2, 2, 2]  # encoder, then head
    assert not lit.encoder._forward_pre_hooks and not lit.head._forward_hooks


def test_a_scripted_model_trains_the_same_without_forward_timing(tracer: StepTracer) -> None:
    scripted = torch.jit.script(mlp())
    x = torch.randn(3, 8)
    expected = scripted(x)
    with tracer.step(scripted):
        out = scripted(x)
        out.sum().backward()
    assert torch.equal(out, expected)
    (row,) = rows_of(tracer)
    assert schema.FORWARD not in row["events"] and phase(row, schema.BACKWARD)["n_calls"] == 1
    assert any("forward is not timed" in note for note in tracer.notes)


def test_forward_and_backward_inside_an_optimizer_closure_are_not_counted_twice(tracer: StepTracer) -> None:
    """Lightning and LBFGS run forward and backward inside ``optimizer.step(closure)``: the optimizer
    step's own time must exclude them, or every such run would look optimizer-bound."""
    model = SlowForward()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader(n=12, batch_size=4):
        with tracer.step(model):

            def closure(x: Any = x, y: Any = y) -> Any:
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            opt.step(closure)
    for row in rows_of(tracer):
        fwd = phase(row, schema.FORWARD)
        opt_stats = phase(row, schema.OPTIMIZER_STEP)
        step = phase(row, schema.STEP)
        assert fwd["cpu_ms"] >= SLEEP_S * 1000
        # The phases add up to no more than the step: an optimizer step that also counted the closure's
        # forward (and its sleep) would make the sum exceed the step by that forward. This holds at any
        # machine load, unlike a wall-time bound on the optimizer step.
        parts = fwd["cpu_ms"] + phase(row, schema.BACKWARD)["cpu_ms"] + opt_stats["cpu_ms"]
        assert parts <= step["cpu_ms"], (opt_stats, fwd, step)


def test_steps_without_any_optimizer_step_are_each_a_step_after_a_bound(tracer: StepTracer) -> None:
    """A loop that updates its parameters by hand (no torch.optim) has no update to group micro-batches
    by: after MAX_UNCONFIRMED_MICRO_BATCHES steps every traced block is a step, with a note."""
    from traceml_ai.capture.steps import MAX_UNCONFIRMED_MICRO_BATCHES

    model = mlp()
    x = torch.randn(2, 8)
    for _ in range(MAX_UNCONFIRMED_MICRO_BATCHES + 3):
        with tracer.step(model):
            model(x).sum().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
    rows = tracer.time_source.collect(1, time.time_ns())
    assert [r["step"] for r in rows] == list(range(MAX_UNCONFIRMED_MICRO_BATCHES + 3))
    assert all(phase(r, schema.STEP)["n_calls"] == 1 for r in rows)
    assert any("no optimizer step was seen" in n for n in tracer.notes)


def test_a_grad_scaler_step_that_skips_the_update_still_ends_the_step(tracer: StepTracer) -> None:
    """Mixed precision: GradScaler.step skips optimizer.step when the gradients are not finite (often
    in the first steps of a run); that is still an optimizer update, so the step is not held."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x = torch.randn(2, 8)
    for poison in (True, False, False):
        with tracer.step(model):
            loss = model(x).sum() * (float("inf") if poison else 1.0)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    rows = tracer.time_source.collect(1, time.time_ns())  # no finish(): the rows are out at once
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert schema.OPTIMIZER_STEP not in rows[0]["events"]  # skipped: no optimizer time, still a step
    assert phase(rows[1], schema.OPTIMIZER_STEP)["n_calls"] == 1


def test_an_optimizer_step_that_raised_and_was_retried_inside_the_step_still_ends_the_update(
    tracer: StepTracer,
) -> None:
    # The raise skipped its post hook: its depth must not make the retry look nested (no update seen,
    # every later step held as a micro-batch of an update that never comes).
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    armed = {"fail": True}

    def fail_once(optimizer: Any, args: Any, kwargs: Any) -> None:
        if armed["fail"]:
            armed["fail"] = False
            raise RuntimeError("CUDA out of memory (planted, in the optimizer step)")

    opt.register_step_pre_hook(fail_once)
    for _ in range(3):
        with tracer.step(model):
            model(torch.randn(4, 8)).sum().backward()
            try:
                opt.step()
            except RuntimeError:
                opt.step()  # the user's retry
            opt.zero_grad()
    rows = rows_of(tracer)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(phase(r, schema.OPTIMIZER_STEP)["n_calls"] == 1 for r in rows)
    assert all(phase(r, schema.STEP)["n_calls"] == 1 for r in rows)  # one micro-batch each, no grouping
