"""``traceml_ai.Run``: the run logger (003 seed, "Writing runs" §8-9, the reference logger's
behaviour; DESIGN §2.1 for attach mode).

Use it as a context manager::

    import traceml_ai

    with traceml_ai.Run("traceml/runs", "baseline", params={"optim": {"lr": 3e-4}},
                        best={"val/auc": "max", "val/loss": "min"}) as run:
        for epoch in range(10):
            run.log(epoch, {"train/loss": 0.5, "lr": 3e-4})
            run.log(epoch, {"val/loss": 0.4, "val/auc": 0.8})
        run.summary["test/auc"] = 0.81

Leaving the block normally marks the run ``completed``; an exception marks it ``failed`` with the
error's type, message and traceback; Ctrl+C marks it ``killed``. The exception is never swallowed.

Attach mode: when the environment variable ``TRACEML_RUN_DIR`` names a folder (``traceml run`` sets
it), the logger writes into that folder instead of creating one, and takes over its run.json.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

import orjson

from traceml_ai.runs.layout import (
    CONFIG_JSON,
    DEFAULT_RUNS_ROOT,
    METRICS_JSON,
    METRICS_JSONL,
    PARAMS_YAML,
    RESERVED_METRIC_KEYS,
    RUN_JSON,
    SCHEMA_VERSION,
    SUBFOLDERS,
)
from traceml_ai.runs.writer import (
    atomic_write,
    dump_json,
    iso_utc,
    make_run_id,
    metric_value,
    params_yaml,
)

RUN_DIR_ENV = "TRACEML_RUN_DIR"
LOGS_DIR_ENV = "TRACEML_LOGS_DIR"


class Run:
    """A training run written as a TraceML run folder.

    Args:
        runs_dir: the runs root to create the run folder in. Default: ``$TRACEML_LOGS_DIR`` or
            ``traceml/runs``. Ignored in attach mode (``$TRACEML_RUN_DIR`` set).
        name: short human name; part of the folder name ``<YYYYMMDD-HHMMSS>_<name>_<hex4>`` (UTC).
        params: hyper-parameters, nested mappings allowed; written flattened to params.yaml.
        config: the full configuration for config.json (default: ``params``).
        group, tags, notes: free-form labels shown in the table.
        best: ``{metric: "max" | "min"}``: metrics whose best value and step are tracked.
        heartbeat_s: seconds between heartbeat refreshes of run.json (a background thread).

    Attributes:
        id, dir: the run's folder name and path.
        summary: final values without history (e.g. ``test/auc``); written on every log and at the end.

    Raises:
        ValueError: a ``best`` mode other than "max"/"min", or a name with a path separator.
        OSError: the run folder cannot be created.
    """

    def __init__(
        self,
        runs_dir: str | os.PathLike[str] | None = None,
        name: str = "run",
        params: Mapping[str, Any] | None = None,
        config: Any = None,
        group: str | None = None,
        tags: Iterable[str] = (),
        notes: str = "",
        best: Mapping[str, str] | None = None,
        heartbeat_s: float = 15.0,
    ) -> None:
        for metric, mode in (best or {}).items():
            if mode not in ("max", "min"):
                raise ValueError(f"best mode for {metric!r} must be 'max' or 'min', got {mode!r}")
        self.t0 = time.time()
        attach = os.environ.get(RUN_DIR_ENV)
        previous: dict[str, Any] = {}
        if attach:
            self.dir = os.path.abspath(attach)
            self.id = os.path.basename(self.dir.rstrip(os.sep))
            previous = _read_json(os.path.join(self.dir, RUN_JSON))
        else:
            root = os.fspath(runs_dir) if runs_dir is not None else os.environ.get(LOGS_DIR_ENV, DEFAULT_RUNS_ROOT)
            self.id = make_run_id(name, self.t0)
            self.dir = os.path.join(root, self.id)
        for sub in SUBFOLDERS:
            os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
        self.best_modes = dict(best or {})
        self.last: dict[str, float | None] = {}
        self.best: dict[str, dict[str, Any]] = {}
        self.summary: dict[str, Any] = {}
        self.step: int | None = None
        self.epoch: int | None = None
        self.status = "running"
        self._lock = threading.Lock()
        started = previous.get("started_at") if isinstance(previous.get("started_at"), str) else iso_utc(self.t0)
        if attach:
            # The launcher named and labelled the folder it created; its choice stays, so the name in
            # the table matches the folder. The logger's group fills a gap, its tags add to the launcher's,
            # and the duration counts from the launch.
            prev_name, prev_group, prev_tags = previous.get("name"), previous.get("group"), previous.get("tags")
            if isinstance(prev_name, str) and prev_name:
                name = prev_name
            if isinstance(prev_group, str) and prev_group:
                group = prev_group
            old_tags = [str(t) for t in prev_tags] if isinstance(prev_tags, list) else []
            tags = [*old_tags, *(t for t in tags if t not in old_tags)]
            self.t0 = min(self.t0, _parse_iso(str(started)) or self.t0)
        self.meta: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "id": self.id,
            "name": name,
            "group": group,
            "tags": list(tags),
            "notes": notes,
            "status": "running",
            "started_at": started,
            "ended_at": None,
            "heartbeat_at": iso_utc(self.t0),
            "duration_s": None,
            "exit": None,
            "command": previous.get("command") or [sys.executable, *sys.argv],
            "cwd": os.getcwd(),
            "host": {"hostname": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0]},
        }
        for key in ("git", "launcher"):
            if key in previous:
                self.meta[key] = previous[key]
        atomic_write(os.path.join(self.dir, PARAMS_YAML), params_yaml(params or {}))
        atomic_write(os.path.join(self.dir, CONFIG_JSON), dump_json(config if config is not None else (params or {})))
        self._jsonl = open(os.path.join(self.dir, METRICS_JSONL), "ab")
        self._write_meta()
        self._write_metrics_json()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._heartbeat, args=(heartbeat_s,), name="traceml-heartbeat", daemon=True
        )
        self._thread.start()
        self._sigterm_installed = _install_sigterm()

    # -- writing -------------------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any], epoch: int | None = None) -> None:
        """Append one row to metrics.jsonl and refresh metrics.json and the heartbeat.

        Args:
            step: the epoch-level step (the x axis); ``epoch`` defaults to it.
            metrics: ``{name: number | None}``; NaN and ±inf are written as null (a gap).
                Prefix names (``train/``, ``val/``, ``test/``, ``sys/``) to group them.

        Raises:
            TypeError, ValueError: a value is not a number, step/epoch is not an integer, or a
                metric is named step, epoch or time.
            RuntimeError: the run has finished.
        """
        row: dict[str, Any] = {
            "step": _as_int("step", step),
            "epoch": _as_int("epoch", step if epoch is None else epoch),
            "time": round(time.time(), 3),
        }
        for k, v in metrics.items():
            if k in RESERVED_METRIC_KEYS:
                raise ValueError(f"{k!r} is not a metric name (step, epoch and time are set by log())")
            try:
                row[str(k)] = metric_value(v)
            except (TypeError, ValueError) as err:
                raise type(err)(f"metric {k!r}: {err}") from None
        line = orjson.dumps(row) + b"\n"
        with self._lock:
            if self._jsonl.closed:
                raise RuntimeError(f"run {self.id} has finished; log() after finish()")
            self._jsonl.write(line)  # one complete line per write
            self._jsonl.flush()
            self.step, self.epoch = row["step"], row["epoch"]
            for k, v in row.items():
                if k in RESERVED_METRIC_KEYS:
                    continue
                self.last[k] = v
                mode = self.best_modes.get(k)
                if mode and v is not None:
                    b = self.best.get(k)
                    if b is None or (v > b["value"] if mode == "max" else v < b["value"]):
                        self.best[k] = {"value": v, "step": row["step"], "epoch": row["epoch"], "mode": mode}
            self._write_metrics_json()
            self.meta["heartbeat_at"] = iso_utc(time.time())
            self._write_meta()

    def finish(
        self,
        status: str = "completed",
        exc: BaseException | None = None,
        *,
        exit_code: int | None = None,
        signal_name: str | None = None,
    ) -> None:
        """Write the final status once: ``completed``, ``failed`` or ``killed``.

        Args:
            status: the final status.
            exc: the exception that ended the run; its type, message and traceback go into
                run.json's ``exit`` for a failed run.
            exit_code: the process exit code to record (default 0 for completed, 130 for killed,
                1 for failed).
            signal_name: the signal that killed the run (default ``SIGINT`` for killed).

        Raises:
            ValueError: an unknown status.
        """
        if status not in ("completed", "failed", "killed"):
            raise ValueError(f"final status must be completed, failed or killed, got {status!r}")
        if self._sigterm_installed:
            _restore_sigterm()
            self._sigterm_installed = False
        self._stop.set()
        now = time.time()
        with self._lock:
            if self.status != "running":
                return
            self.status = status
            if not self._jsonl.closed:
                self._jsonl.close()
            default_code = {"completed": 0, "killed": 130}.get(status, 1)
            exit_info: dict[str, Any] = {
                "code": default_code if exit_code is None else exit_code,
                "signal": (signal_name or "SIGINT") if status == "killed" else None,
            }
            if exc is not None and status == "failed":
                exit_info.update(
                    error_type=type(exc).__name__,
                    error_message=str(exc),
                    traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                )
            self.summary = {k: _summary_value(v) for k, v in self.summary.items()}
            self._write_metrics_json()
            self.meta.update(
                status=status,
                ended_at=iso_utc(now),
                heartbeat_at=iso_utc(now),
                duration_s=round(now - self.t0, 3),
                exit=exit_info,
            )
            self._write_meta()

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc_type is None:
            self.finish("completed")
        elif isinstance(exc, Terminated):
            self.finish("killed", exc, exit_code=exc.code if isinstance(exc.code, int) else 143,
                        signal_name="SIGTERM")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.finish("killed", exc)
        elif issubclass(exc_type, SystemExit) and isinstance(exc, SystemExit):
            # sys.exit(0) inside the block is a normal end, sys.exit(n) a failure with that code.
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            self.finish("completed" if code == 0 else "failed", exc, exit_code=code)
        else:
            self.finish("failed", exc)
        return False  # never swallow the exception

    # -- internals -----------------------------------------------------------------------------

    def _write_meta(self) -> None:
        atomic_write(os.path.join(self.dir, RUN_JSON), dump_json(self.meta))

    def _write_metrics_json(self) -> None:
        atomic_write(
            os.path.join(self.dir, METRICS_JSON),
            dump_json(
                {
                    "schema_version": SCHEMA_VERSION,
                    "updated_at": iso_utc(time.time()),
                    "step": self.step,
                    "epoch": self.epoch,
                    "last": self.last,
                    "best": self.best,
                    "summary": {k: _summary_value(v) for k, v in self.summary.items()},
                }
            ),
        )

    def _heartbeat(self, every: float) -> None:
        # Keeps heartbeat_at fresh during long epochs so the run is not shown as stale.
        while not self._stop.wait(every):
            with self._lock:
                if self._stop.is_set() or self.status != "running":
                    return
                self.meta["heartbeat_at"] = iso_utc(time.time())
                try:
                    self._write_meta()
                except OSError:
                    pass  # a full disk must not kill training; the next beat tries again


def _parse_iso(text: str) -> float | None:
    """Unix seconds of an ISO-8601 UTC time such as ``2026-11-30T10:15:00Z``, or None."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Terminated(SystemExit):
    """Raised in the main thread when SIGTERM arrives during a run (how schedulers such as Slurm,
    Kubernetes and Docker stop a job), so the run is marked ``killed`` on the way out. Its exit
    code is 143 (128 + SIGTERM), what the scheduler would have seen."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated(128 + signum)


def _install_sigterm() -> bool:
    """Handle SIGTERM while a run is open, unless the program has its own handler or this is not
    the main thread (where Python only allows signal handlers). True when installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    try:
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
            return False
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        return False
    return True


def _restore_sigterm() -> None:
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _as_int(what: str, v: Any) -> int:
    """An integer step or epoch; integral floats and numpy integers are accepted, 1.5 or "3" are not."""
    if isinstance(v, bool) or isinstance(v, (str, bytes)):
        raise TypeError(f"{what} must be an integer, got {v!r}")
    if isinstance(v, int):
        return v
    try:
        as_float = float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be an integer, got {v!r}") from None
    if not as_float.is_integer():
        raise ValueError(f"{what} must be an integer, got {v!r}")
    return int(as_float)


def _summary_value(v: Any) -> Any:
    """Summary values are numbers (non-finite → null) or strings; anything else is stored as its
    compact JSON text (non-finite numbers inside become null), never as a Python repr."""
    if v is None or isinstance(v, (str, bool)):
        return v
    try:
        return metric_value(v)
    except (TypeError, ValueError):
        pass
    try:
        return orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY).decode()
    except TypeError:
        return str(v)


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            value = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}
