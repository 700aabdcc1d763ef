"""The fake-run generator (003 seed, "Fake run generator"): realistic run folders without training.

:func:`generate` writes historical runs, always starting with the fixed special cases (completed,
failed, killed, stale, legacy, future-schema, malformed lines), then random parameter variants;
:func:`live_run` writes one run that keeps logging like a training script. Both write the exact run
format with :mod:`traceml_ai.runs.writer`: atomic dot-file-and-rename writes for the small files and
``metrics.jsonl`` appended line by line, so readers meet the same situations as with a real logger.

Historical output is deterministic: the same ``seed`` and ``now`` give byte-identical folders.
Development and tests use this data first (003 seed, architecture decisions).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from traceml_ai.runs.layout import (
    CONFIG_JSON,
    METRICS_JSON,
    METRICS_JSONL,
    PARAMS_YAML,
    RUN_ID_RE,
    RUN_JSON,
    SCHEMA_VERSION,
    SUBFOLDERS,
)
from traceml_ai.runs.writer import atomic_write, dump_json, iso_utc, make_run_id, params_yaml, yaml_scalar

__all__ = ["SPECIAL_RUNS", "FakeRunsError", "generate", "live_run"]

SPECIAL_RUNS = (
    "baseline",
    "high-lr",
    "small-model",
    "failed-run",
    "nan-loss",
    "killed-run",
    "stale-run",
    "legacy-run",
    "future-schema",
    "malformed-lines",
)
"""Names of the fixed special cases that every historical set starts with, in order."""

BEST_MODES = {"val/auc": "max", "val/acc": "max", "val/loss": "min", "train/loss": "min"}

_DAY_S = 86400.0
_HISTORY_DAYS = 14.0
_HEARTBEAT_S = 15.0  # the 003 seed asks for a heartbeat at least every 30 s
_LIVE_HORIZON = 50  # epochs the live run's curves are shaped for when it runs until stopped

# classes, accuracy and AUC a perfect setup reaches: the dataset clearly shifts every metric.
_DATASETS = {
    "cifar10": (10, 0.935, 0.993),
    "cifar100": (100, 0.71, 0.955),
    "tiny-imagenet": (200, 0.53, 0.90),
}
_DATASET_SHORT = {"cifar10": "c10", "cifar100": "c100", "tiny-imagenet": "tin"}
_MODELS = {"resnet18": (0.95, 3.1), "resnet50": (1.0, 9.8), "vit-tiny": (0.9, 5.4)}  # quality, GB at bs 128
_BEST_LR = {"adamw": 1e-3, "adam": 1e-3, "sgd": 0.1}

_PROJECT = "/home/alice/projects/vision"
_SITE = "/home/alice/.venv/lib/python3.11/site-packages"


class FakeRunsError(ValueError):
    """A fake-run request that cannot be honoured, e.g. ``clean`` on a folder that holds non-runs."""


# -- public API ----------------------------------------------------------------------------------


def generate(
    output: str | os.PathLike[str],
    *,
    runs: int = 24,
    seed: int = 0,
    clean: bool = False,
    big_run_lines: int = 0,
    now: float | None = None,
) -> list[Path]:
    """Write ``runs`` historical runs (plus an optional big run) into the runs folder ``output``.

    The first runs are the special cases of :data:`SPECIAL_RUNS` in order (``runs`` below their
    count writes only the first ``runs`` of them); the rest are random variants of dataset, model,
    optimizer, learning rate, batch size, hidden size and epochs. Start times lie in the 14 days
    before ``now`` (Unix seconds, default the current time); each folder is
    ``<YYYYMMDD-HHMMSS>_<name>_<hex4>`` with the hex drawn from ``seed``, so a fixed ``seed`` and
    ``now`` give byte-identical output.

    Args:
        output: the runs folder; created when missing.
        runs: how many historical runs to write (0: none).
        seed: random seed.
        clean: delete ``output`` first; refused when it holds anything that is not a run.
        big_run_lines: also write a completed run ``big-run`` with this many metrics.jsonl lines (0: none).
        now: the reference time in Unix seconds.

    Returns:
        The run folders written, in the order written.

    Raises:
        FakeRunsError: ``runs`` or ``big_run_lines`` is negative, ``output`` is not a folder, or
            ``clean`` found an entry that is not a run (the message names it).
        OSError: a file could not be written.

    Specified by the 003 seed, "Fake run generator" (format: "Writing runs").
    """
    if runs < 0 or big_run_lines < 0:
        raise FakeRunsError("--runs and --big-run-lines must be 0 or more")
    root = Path(output)
    if root.exists() and not root.is_dir():
        raise FakeRunsError(f"{root} is not a folder")
    if clean:
        _clean(root)
    root.mkdir(parents=True, exist_ok=True)
    t_now = time.time() if now is None else now

    written: list[Path] = []
    for index in range(runs):
        rng = random.Random(f"traceml-fake:{seed}:{index}")
        name = SPECIAL_RUNS[index] if index < len(SPECIAL_RUNS) else None
        plan = _special_plan(name, rng, t_now) if name else _variant_plan(index, rng, t_now)
        written.append(_write_history(root, plan, rng))
    if big_run_lines:
        rng = random.Random(f"traceml-fake:{seed}:big-run")
        written.append(_write_big_run(root, big_run_lines, rng, t_now))
    return written


def live_run(
    output: str | os.PathLike[str],
    *,
    interval: float = 2.0,
    epochs: int = 0,
    partial_writes: bool = True,
    seed: int = 0,
    stop: threading.Event | None = None,
    on_epoch: Callable[[int], None] | None = None,
) -> Path:
    """Write a run named ``live-run`` into ``output`` that logs one epoch every ``interval`` seconds.

    Each epoch appends a train row and a val row to metrics.jsonl, rewrites metrics.json atomically
    and refreshes ``heartbeat_at`` in run.json (also every 15 s while waiting, so a long interval
    does not look stale). With ``partial_writes`` some lines are written in two halves with a pause
    of ``interval / 3`` seconds in between, so readers see a half-written final line. ``on_epoch(e)``
    is called after epoch ``e`` (0-based) is on disk.

    With ``epochs`` > 0 the run is marked ``completed`` after that many epochs. With 0 it runs until
    ``stop`` is set or a KeyboardInterrupt (Ctrl+C) arrives; then it returns and leaves run.json
    ``running``, so readers show it as stale once the heartbeat is old. A line left half-written by
    a partial-write pause is completed before returning.

    Returns:
        The run folder.

    Raises:
        FakeRunsError: ``interval`` or ``epochs`` is negative, or ``output`` is not a folder.
        OSError: a file could not be written.

    Specified by the 003 seed, "Fake run generator" (live run) and "Writing runs" §2, §8.
    """
    if interval < 0 or epochs < 0:
        raise FakeRunsError("--live-interval and --live-epochs must be 0 or more")
    root = Path(output)
    if root.exists() and not root.is_dir():
        raise FakeRunsError(f"{root} is not a folder")
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"traceml-fake:{seed}:live-run")
    t0 = time.time()
    config = _config("cifar10", "resnet18", "adamw", 1e-3, 128, 256, epochs or _LIVE_HORIZON, rng)
    plan = _Plan(
        name="live-run",
        started_at=t0,
        config=config,
        group=None,
        tags=["live", "cv"],
        notes="Written by traceml fake-runs --live.",
        curve=_Curve.from_config(config, rng, gpu_mem=True),
    )
    writer = _RunWriter(root, plan, rng)
    writer.start(t0)
    sleep = _Sleeper(stop, writer)
    try:
        with writer.open_jsonl() as f:
            epoch = 0
            while epochs == 0 or epoch < epochs:
                if sleep(interval):
                    return writer.run_dir
                train, val = plan.curve.rows(epoch, rng)
                for metrics in (train, val):
                    line = _line(_row(epoch, time.time(), metrics))
                    writer.track(epoch, metrics)
                    if partial_writes and rng.random() < 0.35:
                        cut = len(line) // 2
                        f.write(line[:cut])
                        f.flush()
                        try:
                            sleep(interval / 3, heartbeat=False)
                        finally:
                            f.write(line[cut:])
                            f.flush()
                    else:
                        f.write(line)
                        f.flush()
                t = time.time()
                writer.write_metrics_json(t)
                writer.heartbeat(t)
                if on_epoch is not None:
                    on_epoch(epoch)
                epoch += 1
    except KeyboardInterrupt:
        return writer.run_dir
    writer.summary.update(_test_summary(writer, rng, null_chance=0.0))
    t_end = time.time()
    writer.write_metrics_json(t_end)
    writer.finish("completed", t_end, {"code": 0, "signal": None})
    return writer.run_dir


# -- cleaning ------------------------------------------------------------------------------------


_RUN_MARKERS = (RUN_JSON, METRICS_JSONL, METRICS_JSON, PARAMS_YAML)


def _is_run(entry: Path) -> bool:
    # A run: a real folder (not a symlink) named like a run id or holding one of the run files.
    if entry.is_symlink() or not entry.is_dir():
        return False
    return bool(RUN_ID_RE.match(entry.name)) or any((entry / f).exists() for f in _RUN_MARKERS)


def _clean(root: Path) -> None:
    if not root.exists():
        return
    for entry in sorted(root.iterdir()):
        if not _is_run(entry):
            kind = "symlink" if entry.is_symlink() else "folder" if entry.is_dir() else "file"
            raise FakeRunsError(
                f"refusing to clean {root}: {entry.name!r} is a {kind} that is not a run; "
                "move it away or write to another folder"
            )
    shutil.rmtree(root)


# -- what a run looks like -------------------------------------------------------------------------


def _sig(v: float) -> float:
    """Round to 6 significant digits, as a logger printing floats would."""
    return float(f"{v:.6g}")


@dataclass
class _Curve:
    """The metric history of one setup: smooth learning curves shaped by dataset and quality."""

    classes: int
    acc_max: float  # val/acc the run converges to
    auc_max: float
    loss_final: float  # train/loss the run converges to
    tau: float  # epochs to reach ~63% of the way
    lr: float
    horizon: int  # epochs the lr schedule spans
    noise: float
    gpu_mem_gb: float | None

    @classmethod
    def from_config(cls, config: dict[str, Any], rng: random.Random, *, gpu_mem: bool) -> _Curve:
        data, model, optim = config["data"], config["model"], config["optim"]
        classes, acc_top, auc_top = _DATASETS[data["dataset"]]
        model_q, mem_gb = _MODELS[model["name"]]
        lr_q = math.exp(-0.5 * (math.log10(optim["lr"] / _BEST_LR[optim["name"]]) / 0.8) ** 2)
        hidden_q = 0.88 + 0.03 * math.log2(model["hidden"] / 64)
        q = max(0.35, min(1.0, model_q * hidden_q * (0.55 + 0.45 * lr_q) * rng.uniform(0.97, 1.02)))
        chance = 1.0 / classes
        epochs = int(config["train"]["epochs"])
        mem = mem_gb * data["batch_size"] / 128 * (model["hidden"] / 256) ** 0.3 * rng.uniform(0.95, 1.05)
        return cls(
            classes=classes,
            acc_max=chance + (acc_top - chance) * q,
            auc_max=0.5 + (auc_top - 0.5) * q**0.7,
            loss_final=math.log(classes) * (0.05 + 0.35 * (1 - q)),
            tau=max(1.0, epochs / rng.uniform(3.0, 5.0) * (1.4 - 0.4 * lr_q)),
            lr=optim["lr"],
            horizon=epochs,
            noise=0.004 * (1 + 4 * (1 - lr_q)),
            gpu_mem_gb=min(mem, 78.5) if gpu_mem else None,
        )

    def rows(self, epoch: int, rng: random.Random) -> tuple[dict[str, float | None], dict[str, float | None]]:
        """The train row's and the val row's metrics of ``epoch`` (0-based)."""
        left = math.exp(-(epoch + 1) / self.tau)  # share of the way still to go
        loss0 = math.log(self.classes)
        train_loss = (self.loss_final + (loss0 - self.loss_final) * left) * (1 + rng.gauss(0, self.noise * 3))
        overfit = 0.1 * loss0 * max(0.0, epoch / max(1, self.horizon) - 0.6)  # val/loss turns up late
        val_loss = train_loss * rng.uniform(1.08, 1.16) + overfit
        chance = 1.0 / self.classes
        acc = chance + (self.acc_max - chance) * (1 - left) + rng.gauss(0, self.noise)
        auc = 0.5 + (self.auc_max - 0.5) * (1 - left) ** 0.7 + rng.gauss(0, self.noise / 2)
        # Cosine schedule down to 1% of the initial lr.
        cos = 0.5 * (1 + math.cos(math.pi * min(epoch, self.horizon) / max(1, self.horizon)))
        lr = self.lr * (0.01 + 0.99 * cos)
        train: dict[str, float | None] = {
            "train/loss": _sig(max(train_loss, 1e-4)),
            "lr": _sig(lr),
        }
        if self.gpu_mem_gb is not None:
            train["sys/gpu_mem_gb"] = _sig(self.gpu_mem_gb + rng.uniform(-0.05, 0.05))
        val: dict[str, float | None] = {
            "val/loss": _sig(max(val_loss, 1e-4)),
            "val/auc": _sig(min(max(auc, 0.0), 0.9999)),
            "val/acc": _sig(min(max(acc, 0.0), 0.9999)),
        }
        return train, val


@dataclass
class _Plan:
    """Everything about one historical run before it is written."""

    name: str
    started_at: float
    config: dict[str, Any]
    group: str | None
    tags: list[str]
    notes: str
    curve: _Curve
    epoch_s: float = 60.0
    epochs_logged: int | None = None  # None: the configured train.epochs
    outcome: str = "completed"  # completed | failed | killed | stale | nan
    exit: dict[str, Any] | None = None
    legacy: bool = False
    schema_version: int = SCHEMA_VERSION
    extra_meta: dict[str, Any] = field(default_factory=dict)
    malformed: bool = False
    git: bool = True


def _config(
    dataset: str,
    model: str,
    optim: str,
    lr: float,
    batch_size: int,
    hidden: int,
    epochs: int,
    rng: random.Random,
) -> dict[str, Any]:
    model_cfg: dict[str, Any] = {"name": model, "hidden": hidden, "dropout": rng.choice([0.0, 0.1, 0.2])}
    if model == "vit-tiny":
        model_cfg["patch_size"] = rng.choice([4, 8])
    return {
        "data": {"dataset": dataset, "batch_size": batch_size, "augment": ["flip", "crop"], "num_workers": 8},
        "model": model_cfg,
        "optim": {"name": optim, "lr": _sig(lr), "weight_decay": 0.05 if optim == "adamw" else 5e-4},
        "train": {"epochs": epochs, "amp": rng.random() < 0.7, "seed": rng.randrange(10_000)},
    }


def _start_time(rng: random.Random, now: float) -> float:
    # Finished runs started between 12 h and 14 days ago; the longest one lasts ~5 h.
    return now - rng.uniform(0.5 * _DAY_S, _HISTORY_DAYS * _DAY_S)


def _special_plan(name: str, rng: random.Random, now: float) -> _Plan:
    dataset, model, optim, lr, bs, hidden, epochs = "cifar10", "resnet18", "adamw", 1e-3, 128, 256, 20
    group: str | None = None
    tags = ["cv", "baseline"]
    extra: dict[str, Any] = {}
    if name == "high-lr":
        lr, group, tags = 0.03, "lr-sweep", ["cv", "sweep"]
    elif name == "small-model":
        hidden, group, tags = 64, "arch-sweep", ["cv", "sweep"]
    elif name == "failed-run":
        model, bs, tags = "resnet50", 1024, ["cv", "big-batch"]
    elif name == "nan-loss":
        optim, lr, tags = "sgd", 2.5, ["cv", "debug"]
    elif name == "legacy-run":
        optim, lr, epochs = "sgd", 0.1, 12
    elif name == "future-schema":
        dataset, model, tags = "cifar100", "vit-tiny", ["cv", "new-logger"]
        extra = {"resources": {"accelerator": "H100", "gpus": 8}, "lineage": {"parent": None}}
    config = _config(dataset, model, optim, lr, bs, hidden, epochs, rng)
    curve = _Curve.from_config(config, rng, gpu_mem=name != "legacy-run")
    plan = _Plan(
        name=name,
        started_at=_start_time(rng, now),
        config=config,
        group=group,
        tags=tags,
        notes=_SPECIAL_NOTES[name],
        curve=curve,
        epoch_s=rng.uniform(45, 240),
        extra_meta=extra,
    )
    if name == "failed-run":
        plan.outcome, plan.epochs_logged = "failed", 2
        plan.exit = _failure(*_OOM, code=1)
        curve.gpu_mem_gb = 77.9
    elif name == "nan-loss":
        plan.outcome, plan.epochs_logged = "nan", 5
        plan.exit = _failure(*_NAN, code=1)
    elif name == "killed-run":
        plan.outcome, plan.epochs_logged = "killed", 7
        plan.exit = {"code": 130, "signal": "SIGINT"}
    elif name == "stale-run":
        # Crashed without cleanup hours ago: running, heartbeat 4-10 h old.
        plan.outcome, plan.epochs_logged = "stale", 9
        plan.epoch_s = 300.0
        plan.started_at = now - rng.uniform(4, 10) * 3600 - 9 * plan.epoch_s
    elif name == "legacy-run":
        plan.legacy, plan.git = True, False
    elif name == "future-schema":
        plan.schema_version = 2
    elif name == "malformed-lines":
        plan.malformed = True
    return plan


_SPECIAL_NOTES = {
    "baseline": "Reference setup: resnet18 on cifar10 with AdamW.",
    "high-lr": "Learning rate 30x the baseline: noisy and worse.",
    "small-model": "hidden=64 to see how much capacity matters.",
    "failed-run": "Batch size 1024 on resnet50: does it fit?",
    "nan-loss": "SGD with lr=2.5 diverges.",
    "killed-run": "Stopped by hand with Ctrl+C.",
    "stale-run": "The node went away; the logger never wrote a final status.",
    "legacy-run": "",
    "future-schema": "Written by a newer logger (schema_version 2).",
    "malformed-lines": "metrics.jsonl has a corrupt line and a half-written last line.",
}


def _variant_plan(index: int, rng: random.Random, now: float) -> _Plan:
    group = rng.choice(["lr-sweep", "arch-sweep", "dataset-sweep", None, None])
    dataset = rng.choice(list(_DATASETS))
    model = rng.choice(list(_MODELS))
    optim = rng.choice(["adamw", "adamw", "adam", "sgd"])
    spread = 1.5 if group == "lr-sweep" else 0.6  # decades around the best lr
    lr = _BEST_LR[optim] * 10 ** rng.uniform(-spread, spread * 0.8)
    bs = rng.choice([32, 64, 128, 256])
    hidden = rng.choice([64, 128, 256, 512])
    epochs = rng.randrange(8, 31)
    config = _config(dataset, model, optim, lr, bs, hidden, epochs, rng)
    tags = sorted({"cv", *rng.sample(["sweep", "ablation", "long", "amp", "repro"], rng.randrange(0, 3))})
    plan = _Plan(
        name=f"{model}-{_DATASET_SHORT[dataset]}-{index:02d}",
        started_at=_start_time(rng, now),
        config=config,
        group=group,
        tags=tags,
        notes=rng.choice(["", "", "", "try a longer warmup next", "seed check"]),
        curve=_Curve.from_config(config, rng, gpu_mem=rng.random() < 0.6),
        epoch_s=rng.uniform(30, 300) * bs / 128,
        git=rng.random() < 0.85,
    )
    roll = rng.random()
    if roll < 0.08:
        plan.outcome, plan.epochs_logged = "failed", rng.randrange(1, epochs)
        plan.exit = _failure(*_DATALOADER, code=1)
    elif roll < 0.14:
        plan.outcome, plan.epochs_logged = "killed", rng.randrange(1, epochs)
        plan.exit = {"code": 130, "signal": "SIGINT"}
    return plan


# -- failures ------------------------------------------------------------------------------------

_OOM = (
    "OutOfMemoryError",
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which "
    "1.21 GiB is free. Including non-PyTorch memory, this process has 77.93 GiB memory in use. Of the "
    "allocated memory 74.12 GiB is allocated by PyTorch, and 2.31 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
    "torch.OutOfMemoryError",
    [
        (f"{_PROJECT}/train.py", 212, "<module>", "main()"),
        (
            f"{_PROJECT}/train.py",
            198,
            "main",
            "train_loss = train_one_epoch(model, loader, optimizer, scaler)",
        ),
        (f"{_PROJECT}/train.py", 87, "train_one_epoch", "loss = criterion(model(images), targets)"),
        (
            f"{_SITE}/torch/nn/modules/module.py",
            1736,
            "_wrapped_call_impl",
            "return self._call_impl(*args, **kwargs)",
        ),
        (f"{_SITE}/torch/nn/modules/module.py", 1747, "_call_impl", "return forward_call(*args, **kwargs)"),
        (f"{_SITE}/torchvision/models/resnet.py", 285, "forward", "return self._forward_impl(x)"),
        (f"{_SITE}/torchvision/models/resnet.py", 276, "_forward_impl", "x = self.layer3(x)"),
        (f"{_SITE}/torch/nn/modules/conv.py", 549, "_conv_forward", "return F.conv2d("),
    ],
)
_NAN = (
    "FloatingPointError",
    "loss is nan at step 4; stopping (lower optim.lr or enable gradient clipping)",
    "FloatingPointError",
    [
        (f"{_PROJECT}/train.py", 212, "<module>", "main()"),
        (f"{_PROJECT}/train.py", 201, "main", "check_finite(train_loss, step=epoch)"),
        (f"{_PROJECT}/utils.py", 41, "check_finite", 'raise FloatingPointError(f"loss is {value} at ...")'),
    ],
)
_DATALOADER = (
    "RuntimeError",
    "DataLoader worker (pid 48213) is killed by signal: Killed.",
    "RuntimeError",
    [
        (f"{_PROJECT}/train.py", 212, "<module>", "main()"),
        (
            f"{_PROJECT}/train.py",
            198,
            "main",
            "train_loss = train_one_epoch(model, loader, optimizer, scaler)",
        ),
        (f"{_PROJECT}/train.py", 81, "train_one_epoch", "for images, targets in loader:"),
        (f"{_SITE}/torch/utils/data/dataloader.py", 701, "__next__", "data = self._next_data()"),
        (f"{_SITE}/torch/utils/data/dataloader.py", 1448, "_next_data", "idx, data = self._get_data()"),
        (f"{_SITE}/torch/utils/data/dataloader.py", 1133, "_try_get_data", "raise RuntimeError("),
    ],
)


def _failure(
    error_type: str, message: str, qualified: str, frames: list[tuple[str, int, str, str]], *, code: int
) -> dict[str, Any]:
    """``exit`` of a failed run, with a traceback laid out like Python's."""
    text = "Traceback (most recent call last):\n"
    text += "".join(f'  File "{f}", line {n}, in {fn}\n    {src}\n' for f, n, fn, src in frames)
    text += f"{qualified}: {message}\n"
    return {
        "code": code,
        "signal": None,
        "error_type": error_type,
        "error_message": message,
        "traceback": text,
    }


# -- writing -------------------------------------------------------------------------------------


def _row(epoch: int, t: float, metrics: dict[str, float | None]) -> dict[str, Any]:
    return {"step": epoch, "epoch": epoch, "time": round(t, 3), **metrics}


# allow_nan=False: a NaN slipping through is a bug here, never a token on disk.
_ENCODER = json.JSONEncoder(allow_nan=False)


def _line(row: dict[str, Any]) -> str:
    return _ENCODER.encode(row) + "\n"


class _RunWriter:
    """Writes one run folder the way the reference logger does (003 seed, "Writing runs" §9)."""

    def __init__(self, root: Path, plan: _Plan, rng: random.Random) -> None:
        self.plan = plan
        run_id = make_run_id(plan.name, plan.started_at, f"{rng.getrandbits(16):04x}")
        while (root / run_id).exists():  # never append to a run already there
            run_id = make_run_id(plan.name, plan.started_at, f"{rng.getrandbits(16):04x}")
        self.run_dir = root / run_id
        self.meta: dict[str, Any] | None = None if plan.legacy else self._meta(run_id, rng)
        self.step: int | None = None
        self.last: dict[str, float | None] = {}
        self.best: dict[str, dict[str, Any]] = {}
        self.summary: dict[str, Any] = {}

    def _meta(self, run_id: str, rng: random.Random) -> dict[str, Any]:
        p = self.plan
        meta: dict[str, Any] = {
            "schema_version": p.schema_version,
            "id": run_id,
            "name": p.name,
            "group": p.group,
            "tags": p.tags,
            "notes": p.notes,
            "status": "running",
            "started_at": iso_utc(p.started_at),
            "ended_at": None,
            "heartbeat_at": iso_utc(p.started_at),
            "duration_s": None,
            "exit": None,
            "command": ["python", "train.py", "--config", f"configs/{p.config['data']['dataset']}.yaml"],
            "cwd": _PROJECT,
            "host": {
                "hostname": f"gpu-node-{rng.randrange(1, 17):02d}",
                "pid": rng.randrange(1000, 99999),
                "python": "3.11.7",
                "gpu": "NVIDIA A100-SXM4-80GB",
            },
        }
        if p.git:
            commit = f"{rng.getrandbits(160):040x}"
            meta["git"] = {"commit": commit, "branch": "main", "dirty": rng.random() < 0.3}
        meta.update(p.extra_meta)
        return meta

    def start(self, t: float) -> None:
        """Folders, params.yaml, config.json and run.json (``running``), as a logger does at start."""
        for sub in SUBFOLDERS:
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)
        if self.plan.legacy:
            atomic_write(self.run_dir / PARAMS_YAML, _nested_yaml(self.plan.config))
            return
        atomic_write(self.run_dir / PARAMS_YAML, params_yaml(self.plan.config))
        atomic_write(self.run_dir / CONFIG_JSON, dump_json(self.plan.config))
        self.heartbeat(t)

    def open_jsonl(self) -> IO[str]:
        return open(self.run_dir / METRICS_JSONL, "a", encoding="utf-8", newline="\n")

    def track(self, epoch: int, metrics: dict[str, float | None]) -> None:
        """Update last/best with one logged row."""
        self.step = epoch
        for k, v in metrics.items():
            self.last[k] = v
            mode, b = BEST_MODES.get(k), self.best.get(k)
            if mode and v is not None and (b is None or (v > b["value"] if mode == "max" else v < b["value"])):
                self.best[k] = {"value": v, "step": epoch, "epoch": epoch, "mode": mode}

    def write_metrics_json(self, t: float) -> None:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "updated_at": iso_utc(t),
            "step": self.step,
            "epoch": self.step,
            "last": self.last,
            "best": self.best,
            "summary": self.summary,
        }
        atomic_write(self.run_dir / METRICS_JSON, dump_json(doc))

    def heartbeat(self, t: float) -> None:
        if self.meta is not None:
            self.meta["heartbeat_at"] = iso_utc(t)
            atomic_write(self.run_dir / RUN_JSON, dump_json(self.meta))

    def finish(self, status: str, t: float, exit_info: dict[str, Any]) -> None:
        if self.meta is not None:
            self.meta.update(
                status=status,
                ended_at=iso_utc(t),
                duration_s=round(t - self.plan.started_at, 3),
                exit=exit_info,
            )
            self.heartbeat(t)


def _nested_yaml(value: dict[str, Any], indent: str = "") -> str:
    """Nested block YAML, as older loggers wrote params.yaml (003 seed, params.yaml: accepted, flattened)."""
    out = []
    for k, v in value.items():
        if isinstance(v, dict):
            out.append(f"{indent}{k}:\n{_nested_yaml(v, indent + '  ')}")
        elif isinstance(v, list):
            out.append(f"{indent}{k}: {json.dumps(v)}\n")
        else:
            out.append(f"{indent}{k}: {yaml_scalar(v)}\n")
    return "".join(out)


def _test_summary(writer: _RunWriter, rng: random.Random, *, null_chance: float) -> dict[str, Any]:
    """summary of a finished run: test metrics near the last val ones (sometimes null), best checkpoint."""
    summary: dict[str, Any] = {}
    auc, acc = writer.last.get("val/auc"), writer.last.get("val/acc")
    null = rng.random() < null_chance
    summary["test/auc"] = None if null or auc is None else _sig(auc - rng.uniform(0.0, 0.01))
    summary["test/acc"] = None if null or acc is None else _sig(acc - rng.uniform(0.0, 0.02))
    best = writer.best.get("val/auc")
    if best is not None:
        summary["best_checkpoint"] = f"checkpoints/epoch_{best['epoch']:03d}.pt"
    return summary


def _epoch_lines(plan: _Plan, writer: _RunWriter, rng: random.Random) -> Iterator[tuple[float, str]]:
    """(time, line) of every metrics.jsonl line of a historical run, tracking last/best on the way."""
    planned = int(plan.config["train"]["epochs"])
    logged = planned if plan.epochs_logged is None else plan.epochs_logged
    t = plan.started_at + rng.uniform(5, 30)
    for epoch in range(logged):
        train, val = plan.curve.rows(epoch, rng)
        if plan.outcome == "nan" and epoch >= logged - 2:
            # Diverging: the loss explodes, then becomes NaN, written as null (a gap).
            blowup = _sig(1e4 * rng.uniform(1, 9))
            train["train/loss"] = None if epoch == logged - 1 else blowup
            val.update({"val/loss": blowup, "val/auc": 0.5, "val/acc": _sig(1 / plan.curve.classes)})
        t += plan.epoch_s * rng.uniform(0.95, 1.05)
        writer.track(epoch, train)
        yield t, _line(_row(epoch, t, train))
        if plan.outcome == "nan" and epoch == logged - 1:
            return  # crashed before validating
        if plan.malformed and epoch == 3:
            yield t, '{"step": 3, "train/loss": 0.5\n'
            yield t, "<<<<<<< garbage: this is not JSON >>>>>>>\n"
        t += plan.epoch_s * rng.uniform(0.08, 0.15)
        writer.track(epoch, val)
        yield t, _line(_row(epoch, t, val))
    if plan.malformed:
        yield t, f'{{"step": {logged}, "epoch": {logged}, "time": {round(t + plan.epoch_s, 3)}, "train/lo'


def _write_history(root: Path, plan: _Plan, rng: random.Random) -> Path:
    writer = _RunWriter(root, plan, rng)
    writer.start(plan.started_at)
    t = plan.started_at
    with writer.open_jsonl() as f:
        for line_t, line in _epoch_lines(plan, writer, rng):
            f.write(line)  # one line per write, flushed: what a logger does
            f.flush()
            t = line_t
    t_end = t + rng.uniform(2, 20)
    if plan.outcome == "completed":
        writer.summary.update(_test_summary(writer, rng, null_chance=0.15))
    elif plan.outcome in ("failed", "killed") and "val/auc" in writer.best:
        writer.summary["best_checkpoint"] = f"checkpoints/epoch_{writer.best['val/auc']['epoch']:03d}.pt"
    writer.write_metrics_json(t if plan.outcome == "stale" else t_end)
    if plan.outcome == "stale":
        writer.heartbeat(t)  # the last heartbeat before the node went away
    elif plan.outcome == "completed":
        writer.finish("completed", t_end, {"code": 0, "signal": None})
    elif plan.outcome == "killed":
        writer.finish("killed", t_end, plan.exit or {})
    else:  # failed, nan
        writer.finish("failed", t_end, plan.exit or {})
    return writer.run_dir


def _write_big_run(root: Path, lines: int, rng: random.Random, now: float) -> Path:
    """A completed run with ``lines`` metrics.jsonl lines (train and val rows alternate)."""
    steps = (lines + 1) // 2
    config = _config("cifar100", "resnet50", "adamw", 1e-3, 256, 512, steps, rng)
    started = now - 2 * _DAY_S
    plan = _Plan(
        name="big-run",
        started_at=started,
        config=config,
        group=None,
        tags=["cv", "long"],
        notes=f"{lines} metrics.jsonl lines, to measure history loading.",
        curve=_Curve.from_config(config, rng, gpu_mem=True),
        epoch_s=min(60.0, 1.5 * _DAY_S / max(1, steps)),
    )
    writer = _RunWriter(root, plan, rng)
    writer.start(started)
    text: list[str] = []
    t = started
    for step in range(steps):
        train, val = plan.curve.rows(step, rng)
        for metrics in (train, val):
            if len(text) == lines:
                break
            t += plan.epoch_s / 2
            writer.track(step, metrics)
            text.append(_line(_row(step, t, metrics)))
    with writer.open_jsonl() as f:
        f.write("".join(text))
    writer.summary.update(_test_summary(writer, rng, null_chance=0.0))
    writer.write_metrics_json(t)
    writer.finish("completed", t + 10, {"code": 0, "signal": None})
    return writer.run_dir


class _Sleeper:
    """Waits between live epochs; True when stopped. Refreshes the heartbeat during long waits."""

    def __init__(self, stop: threading.Event | None, writer: _RunWriter) -> None:
        self.stop = stop
        self.writer = writer

    def __call__(self, seconds: float, *, heartbeat: bool = True) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            chunk = min(max(left, 0.0), _HEARTBEAT_S)
            if self.stop is not None:
                if self.stop.wait(chunk):
                    return True
            elif chunk > 0:
                time.sleep(chunk)
            if left <= _HEARTBEAT_S:
                return False
            if heartbeat:
                self.writer.heartbeat(time.time())
