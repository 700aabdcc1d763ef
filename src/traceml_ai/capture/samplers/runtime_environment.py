"""The ``runtime_environment`` stream: topology, torch.distributed state, training strategy (DESIGN §3.1).

Row keys: ``seq, timestamp_unix_ns, topology, distributed_initialized, distributed_backend,
training_strategy, strategy_source, strategy_confidence``.

One row per rank process, corrected when it changes (000 seed: the record's key is
``global_rank``, so the latest row per rank wins). Training scripts call ``dist.init_process_group``
and wrap their model after capture started, so the source looks on ticks 1, 2, 4, 8, … and sends its
row as soon as the environment is *settled*: one process (``single``), or a DDP/FSDP/DeepSpeed model
seen by ``trace_step`` with the process group initialized. Otherwise it sends what it knows after
:data:`SEND_BY_TICKS` ticks if the run is still going (so that a run killed later still has its
row), or at close. A row sent unsettled is watched from then on (torch.distributed's state and the
models ``trace_step`` saw, both cheap to read, on every tick and at close): when what it says
changes (a large model that took minutes to load is wrapped in DDP after the deadline), a corrected
row is sent, until the environment is settled.

``training_strategy`` is ``single``, ``DDP``, ``FSDP``, ``DeepSpeed`` or ``unknown``:

==========================================================  ===============  ==========
what told us (``strategy_source``)                          strategy         confidence
==========================================================  ===============  ==========
a ``DeepSpeedEngine`` model given to ``trace_step``         DeepSpeed        high
a ``FullyShardedDataParallel`` / ``FSDPModule`` model       FSDP             high
a ``DistributedDataParallel`` model                         DDP              high
``accelerate distributed_type`` (the HF Trainer's             DDP / FSDP /     medium
``MULTI_*`` / ``FSDP`` / ``DEEPSPEED``)                       DeepSpeed
``env`` (``ACCELERATE_USE_DEEPSPEED`` / ``_FSDP``)            DeepSpeed / FSDP medium
``deepspeed imported`` (no engine yet)                      DeepSpeed        medium
``world_size=1``                                            single           high
``world_size=N, no DDP/FSDP/DeepSpeed wrapper found``       unknown          low
``world_size unknown``                                      unknown          low
==========================================================  ===============  ==========

The wrapper is known from the models the training passes to ``trace_step`` (:func:`note_model`,
called by the step tracer when a model is first seen; the Lightning callback also hands over
``trainer.strategy.model``, the DDP/FSDP/DeepSpeed wrapper of its module, and the Hugging Face
Trainer's set-up is read from ``accelerate``'s state, :func:`accelerate_strategy`). An earlier version walked
``gc.get_objects()`` from the sampler thread; that hands a tuple the training thread is still
building to another thread, and CPython then fails the training with ``SystemError: bad argument
to internal function``: telemetry must never change a training's result, so it never looks at
objects the training did not hand over. ``traceml watch`` (no ``trace_step``) reports several
processes as ``unknown`` unless the environment says more. torch is never imported by this source.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from traceml_ai.capture.identity import RankIdentity
from traceml_ai.telemetry.schema import RUNTIME_ENVIRONMENT

CHECK_TICKS = frozenset({1, 2, 4, 8, 16, 32, 64})
SEND_BY_TICKS = 120
"""Ticks (two minutes at the default 1 s interval) after which an unsettled environment is sent as
it looks then: the first steps of any training have run by then."""
"""After the early looks, one look every this many ticks (5 minutes at 1 s) until a wrapper is found."""
_CHEAP_KEYS = ("topology", "distributed_initialized", "distributed_backend")

_TRUE = {"1", "true", "yes"}


def _plural(n: int, word: str, plural: str) -> str:
    return f"{n} {word if n == 1 else plural}"


def topology(world_size: int | None, local_world_size: int | None) -> str | None:
    """``"1 node x 2 processes"``; ``"4 processes"`` when processes per node are unknown; None when nothing is."""
    if world_size is None or world_size < 1:
        return None
    if local_world_size and local_world_size > 0 and world_size % local_world_size == 0:
        nodes = world_size // local_world_size
        return f"{_plural(nodes, 'node', 'nodes')} x {_plural(local_world_size, 'process', 'processes')}"
    return _plural(world_size, "process", "processes")


def _wrapper_types() -> list[tuple[str, str, type]]:
    """(strategy, source, class) for the wrappers whose modules the training already imported."""
    found: list[tuple[str, str, type]] = []

    def add(strategy: str, source: str, module: str, *attrs: str) -> None:
        obj: Any = sys.modules.get(module)
        for attr in attrs:
            obj = getattr(obj, attr, None)
        if isinstance(obj, type):
            found.append((strategy, source, obj))

    add("DeepSpeed", "DeepSpeedEngine model", "deepspeed.runtime.engine", "DeepSpeedEngine")
    add("FSDP", "FullyShardedDataParallel model", "torch.distributed.fsdp", "FullyShardedDataParallel")
    add("FSDP", "fully_shard (FSDPModule) model", "torch.distributed.fsdp", "FSDPModule")
    add("DDP", "DistributedDataParallel model", "torch.nn.parallel.distributed", "DistributedDataParallel")
    return found


_SEEN_LOCK = threading.Lock()
_SEEN_TYPES: set[type] = set()


def note_model(model: Any) -> None:
    """Remember the class of a model the training handed to ``trace_step`` (its wrapper tells the
    strategy). Keeps the class only, never the model. Cheap: one set lookup per call."""
    kind = type(model)
    if kind in _SEEN_TYPES:
        return
    with _SEEN_LOCK:
        _SEEN_TYPES.add(kind)


def find_wrapper() -> tuple[str, str] | None:
    """(strategy, source) of the DeepSpeed/FSDP/DDP wrapper among the models seen by ``trace_step``."""
    kinds = _wrapper_types()
    if not kinds:
        return None
    with _SEEN_LOCK:
        seen = list(_SEEN_TYPES)
    # issubclass on the type, never isinstance: isinstance reads obj.__class__, which some objects
    # answer with a side effect (torch's deprecated reduce_op prints a FutureWarning).
    for strategy, source, cls in kinds:  # in priority order: an engine may hold a DDP inside
        if any(issubclass(kind, cls) for kind in seen):
            return strategy, source
    return None


_ACCELERATE_KINDS = {"DEEPSPEED": "DeepSpeed", "FSDP": "FSDP"}


def accelerate_strategy() -> str | None:
    """The strategy Hugging Face ``accelerate`` set up in this process (the Trainer's DDP, FSDP or
    DeepSpeed: its callbacks are handed the unwrapped model, so the wrapper is never seen), from its
    process-wide state (``PartialState._shared_state["distributed_type"]``, a dict read, no object
    walk); None when accelerate is not imported, not set up, or runs one process."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None)
    if not isinstance(shared, dict):
        return None
    kind = shared.get("distributed_type")
    value = getattr(kind, "value", kind)
    if not isinstance(value, str):
        return None
    if value in _ACCELERATE_KINDS:
        return _ACCELERATE_KINDS[value]
    return "DDP" if value.startswith("MULTI_") else None


def detect(identity: RankIdentity, *, scan: bool = True) -> dict[str, Any]:
    """The row fields (without seq/timestamp) as this process looks now.

    Args:
        identity: the rank's identity (world size from the launcher's environment).
        scan: look at the models seen by ``trace_step`` (skipped when False).
    """
    torch = sys.modules.get("torch")
    initialized = 0
    backend: str | None = None
    world_size = identity.world_size
    local_world_size = identity.local_world_size
    if torch is not None:
        try:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                initialized = 1
                backend = str(dist.get_backend())
                world_size = int(dist.get_world_size())
        except Exception:
            initialized, backend = 0, None
    wrapper = find_wrapper() if scan and torch is not None else None
    accelerated = accelerate_strategy() if torch is not None and (world_size or 0) != 1 else None
    env = os.environ
    if wrapper is not None:
        strategy, source, confidence = wrapper[0], wrapper[1], "high"
    elif accelerated is not None:
        strategy, source, confidence = accelerated, "accelerate distributed_type", "medium"
    elif env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in _TRUE:
        strategy, source, confidence = "DeepSpeed", "env", "medium"
    elif env.get("ACCELERATE_USE_FSDP", "").lower() in _TRUE:
        strategy, source, confidence = "FSDP", "env", "medium"
    elif "deepspeed" in sys.modules:
        strategy, source, confidence = "DeepSpeed", "deepspeed imported", "medium"
    elif world_size == 1:
        strategy, source, confidence = "single", "world_size=1", "high"
    elif world_size is None:
        strategy, source, confidence = "unknown", "world_size unknown", "low"
    else:
        strategy, source = "unknown", f"world_size={world_size}, no DDP/FSDP/DeepSpeed model seen by trace_step"
        confidence = "low"
    return {
        "topology": topology(world_size, local_world_size),
        "distributed_initialized": initialized,
        "distributed_backend": backend,
        "training_strategy": strategy,
        "strategy_source": source,
        "strategy_confidence": confidence,
    }


class RuntimeEnvironmentSampler:
    """Row source of the ``runtime_environment`` stream (see the module docstring for the schedule).

    Args:
        identity: the rank's identity.
    """

    stream = RUNTIME_ENVIRONMENT

    def __init__(self, identity: RankIdentity) -> None:
        self._identity = identity
        self._ticks = 0
        self._last: dict[str, Any] | None = None
        self._sent = False  # a row went out
        self._done = False  # a settled row went out: nothing left to correct

    @staticmethod
    def _settled(fields: dict[str, Any]) -> bool:
        """Nothing left to learn: one process, or a wrapper model with its process group up."""
        if fields["training_strategy"] == "single":
            return True
        return bool(fields["strategy_confidence"] == "high" and fields["distributed_initialized"] == 1)

    def _look(self, seq: int, now_ns: int, *, send: bool) -> list[dict[str, Any]]:
        fields = self._sticky(detect(self._identity))
        self._last = fields
        settled = self._settled(fields)
        if not (send or settled):
            return []
        self._sent = True
        self._done = settled
        return [{"seq": seq, "timestamp_unix_ns": now_ns, **fields}]

    def _sticky(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Scripts end with ``dist.destroy_process_group()``: the row describes the run's environment,
        so a process group once seen stays in it instead of turning into a teardown row."""
        last = self._last
        if last is not None and last["distributed_initialized"] == 1 and fields["distributed_initialized"] == 0:
            fields = {**fields, **{k: last[k] for k in _CHEAP_KEYS}}
        return fields

    def _correct(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        """After an unsettled row: a corrected row when what it says changed, else nothing."""
        last = self._last
        fields = self._sticky(detect(self._identity))
        if last is not None and fields == last:
            return []
        self._last = fields
        if self._settled(fields):
            self._done = True
        return [{"seq": seq, "timestamp_unix_ns": now_ns, **fields}]

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        self._ticks += 1
        if self._done:
            return []
        if self._sent:
            return self._correct(seq, now_ns)
        if self._ticks >= SEND_BY_TICKS:
            return self._look(seq, now_ns, send=True)
        if self._ticks not in CHECK_TICKS and self._last is not None:
            # Between scheduled looks only the cheap part is checked, so init_process_group shows at once;
            # the models trace_step saw are looked at again too, as that is one set read.
            cheap = self._sticky(detect(self._identity, scan=False))
            if all(cheap[k] == self._last[k] for k in _CHEAP_KEYS) and find_wrapper() is None:
                return []
        return self._look(seq, now_ns, send=False)

    def collect_final(self, seq: int, now_ns: int) -> list[dict[str, Any]]:
        """The close-time look: sends the row if it was not sent yet (the environment as it was), or
        a corrected one if an unsettled row went out and the environment changed since."""
        if self._done:
            return []
        if self._sent:
            return self._correct(seq, now_ns)
        return self._look(seq, now_ns, send=True)
