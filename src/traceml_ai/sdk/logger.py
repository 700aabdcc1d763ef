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

import atexit
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
from typing import Any, Literal, NoReturn

import orjson

try:
    import fcntl
except ImportError:  # Windows: no flock; the check that two processes share a file is skipped
    fcntl = None  # type: ignore[assignment]

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
    rank_metrics_jsonl,
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
ALL_RANKS_ENV = "TRACEML_LOG_ALL_RANKS"
"""``1`` lets every rank's Run write (as ``all_ranks=True``); see :class:`Run`."""

METRICS_JSON_EVERY_S = 1.0
"""At most this often the background thread rewrites metrics.json (and once at the end)."""


class Run:
    """A training run written as a TraceML run folder.

    Args:
        runs_dir: the runs root to create the run folder in. Default: ``$TRACEML_LOGS_DIR`` or
            ``traceml/runs``. Ignored in attach mode (``$TRACEML_RUN_DIR`` set).
        name: short human name, kept as is in run.json; the folder is
            ``<YYYYMMDD-HHMMSS>_<slug>_<hex4>`` (UTC) where the slug keeps letters, digits and
            ``. _ -`` and turns every other run of characters (spaces, ...) into one ``-``.
        params: hyper-parameters, nested mappings allowed; written flattened to params.yaml.
        config: the full configuration for config.json (default: ``params``).
        group, tags, notes: free-form labels shown in the table.
        best: ``{metric: "max" | "min"}``: metrics whose best value and step are tracked.
        heartbeat_s: seconds between heartbeat refreshes of run.json (a background thread).
        all_ranks: in a distributed job (``RANK`` set, as torchrun and ``traceml run`` do) only
            global rank 0 writes by default and the Run of every other rank is a no-op (its
            ``active`` is False; ``log()`` still checks its arguments). With ``all_ranks=True`` (or
            ``TRACEML_LOG_ALL_RANKS=1``) rank N > 0 writes too: into ``metrics.rank<N>.jsonl`` of
            the shared folder in attach mode, else a run folder of its own.

    Attributes:
        id, dir: the run's folder name and path.
        summary: final values without history (e.g. ``test/auc``); written with metrics.json.
        active: False for a no-op Run (a rank other than 0, see ``all_ranks``).
        write_errors: how many writes to the run folder failed (disk full, folder not writable);
            the first one is warned on stderr, and writing goes on being tried.

    Cost: ``log()`` appends one complete line to metrics.jsonl (one ``write``, no fsync) and updates
    the values in memory; the background thread rewrites metrics.json at most every second when
    something changed and refreshes the heartbeat every ``heartbeat_s`` (with fsync); the end of
    the run writes and fsyncs everything. Nothing logged is lost on a normal exit, an exception,
    Ctrl+C or SIGTERM; an interpreter exit without ``finish()`` still writes metrics.json, and marks
    the run failed after an uncaught exception, killed after Ctrl+C or SIGTERM (an excepthook),
    completed or failed with the code after ``sys.exit(code)`` (a hook in front of ``sys.exit``).

    Raises:
        ValueError: a ``best`` mode other than "max"/"min", or a name with a path separator.
        (Writing never raises: a failed write is counted in ``write_errors`` and training goes on.)
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
        all_ranks: bool | None = None,
    ) -> None:
        for metric, mode in (best or {}).items():
            if mode not in ("max", "min"):
                raise ValueError(f"best mode for {metric!r} must be 'max' or 'min', got {mode!r}")
        self.t0 = time.time()
        self.best_modes = dict(best or {})
        self.last: dict[str, float | None] = {}
        self.best: dict[str, dict[str, Any]] = {}
        self.summary: dict[str, Any] = {}
        self.step: int | None = None
        self.epoch: int | None = None
        self.status = "running"
        self.write_errors = 0
        self._warned = False
        self._lock = threading.Lock()
        self._pending: tuple[dict[str, Any], bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sigterm_installed = False
        self._fd: int | None = None
        self._dirty = False
        self._written_summary: dict[str, Any] | None = None
        rank = _global_rank()
        if all_ranks is None:
            all_ranks = os.environ.get(ALL_RANKS_ENV, "").strip().lower() in ("1", "true", "yes")
        attach = os.environ.get(RUN_DIR_ENV)
        self.rank = rank
        self.active = rank in (None, 0) or all_ranks
        self._rank_file = attach is not None and attach != "" and rank not in (None, 0)
        if not self.active:
            self.id, self.dir, self.meta = "", "", {}
            return
        previous: dict[str, Any] = {}
        if attach:
            self.dir = os.path.abspath(attach)
            self.id = os.path.basename(self.dir.rstrip(os.sep))
            if not self._rank_file:
                previous = _read_json(os.path.join(self.dir, RUN_JSON))
        else:
            root = os.fspath(runs_dir) if runs_dir is not None else os.environ.get(LOGS_DIR_ENV, DEFAULT_RUNS_ROOT)
            self.id = make_run_id(name, self.t0)
            self.dir = os.path.join(root, self.id)
        self._jsonl_path = os.path.join(self.dir, rank_metrics_jsonl(rank) if self._rank_file and rank is not None
                                        else METRICS_JSONL)
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
        self.meta = {
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
        self._open_jsonl()
        if not self._rank_file:
            self._try(atomic_write, os.path.join(self.dir, PARAMS_YAML), params_yaml(params or {}))
            self._try(atomic_write, os.path.join(self.dir, CONFIG_JSON),
                      dump_json(config if config is not None else (params or {})))
            self._write_meta()
            self._write_metrics_json(durable=True)
        self._thread = threading.Thread(
            target=self._background, args=(heartbeat_s,), name="traceml-run-writer", daemon=True
        )
        self._thread.start()
        atexit.register(self._at_exit)
        _install_excepthook()
        _install_exit_hook()
        _exit_request.clear()  # a sys.exit() caught before this run began says nothing about it
        self._sigterm_installed = _install_sigterm()

    # -- writing -------------------------------------------------------------------------------

    def log(self, step: int, metrics: Mapping[str, Any], epoch: int | None = None) -> None:
        """Append one row to metrics.jsonl; metrics.json follows within a second (background).

        Args:
            step: the epoch-level step (the x axis); ``epoch`` defaults to it.
            metrics: ``{name: number | bool | None}``; NaN and ±inf are written as null (a gap),
                a bool as 1.0 or 0.0.
                Prefix names (``train/``, ``val/``, ``test/``, ``sys/``) to group them.

        Raises:
            TypeError, ValueError: a value is not a number, step/epoch is not an integer, or a
                metric is named step, epoch or time.
            RuntimeError: the run has finished.
        """
        if _exit_request:
            _exit_request.clear()  # a sys.exit() the program caught: it went on training
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
        if not self.active:
            return
        line = orjson.dumps(row) + b"\n"
        with self._lock:
            if self.status != "running":
                raise RuntimeError(f"run {self.id} has finished; log() after finish()")
            # Ctrl+C or SIGTERM lands in the main thread, most often just after the write returns:
            # the row is in metrics.jsonl but not yet in memory. The end of the run settles it, or
            # the next log() when the program caught the interrupt and went on.
            if self._pending is not None:
                self._settle_pending()
            self._pending = (row, line)
            self._append(line)
            self._take(row)
            self._pending = None

    def _take(self, row: dict[str, Any]) -> None:
        """Fold one written row into step, epoch, last and best (idempotent: a row settled twice
        changes nothing)."""
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
        self._dirty = True

    def _settle_pending(self) -> None:
        """Fold in the row a signal interrupted log() on, when it reached metrics.jsonl (the file ends
        with it), so metrics.json reflects every row written. Called under the lock at the end."""
        pending, self._pending = self._pending, None
        fd = self._fd
        if pending is None or fd is None:
            return
        row, line = pending
        try:  # the writing descriptor is append-only: read the file's end through its path
            with open(self._jsonl_path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                written = size >= len(line) and os.pread(f.fileno(), len(line), size - len(line)) == line
        except OSError:
            written = False
        if written:
            self._take(row)

    def finish(
        self,
        status: str = "completed",
        exc: BaseException | None = None,
        *,
        exit_code: int | None = None,
        signal_name: str | None = None,
    ) -> None:
        """Write the final status once: ``completed``, ``failed`` or ``killed``; fsync every file.

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
        if not self.active:
            self.status = status
            return
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        atexit.unregister(self._at_exit)
        now = time.time()
        with self._lock:
            if self.status != "running":
                return
            self._settle_pending()
            self.status = status
            self._close_jsonl()
            if self._rank_file:
                return
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
            self._write_metrics_json(durable=True)
            self.meta.update(
                status=status,
                ended_at=iso_utc(now),
                heartbeat_at=iso_utc(now),
                duration_s=round(now - self.t0, 3),
                exit=exit_info,
            )
            self._write_meta()
            if self.write_errors:
                # Recorded where it can still be: the final run.json says how many writes were lost.
                self.meta["logger"] = {"write_errors": self.write_errors}
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

    def _try(self, fn: Any, *args: Any, **kwargs: Any) -> bool:
        """Run one write; a failure is counted and warned once, never raised (training goes on)."""
        try:
            fn(*args, **kwargs)
            return True
        except OSError as err:
            self._failed(err)
            return False

    def _failed(self, err: OSError) -> None:
        self.write_errors += 1
        if not self._warned:
            self._warned = True
            print(f"[TraceML] cannot write the run folder {self.dir}: {err.strerror or err}; the training goes "
                  "on, failed writes are counted and retried (see run.json 'logger' at the end)",
                  file=sys.stderr, flush=True)

    def _open_jsonl(self) -> None:
        try:
            for sub in () if self._rank_file else SUBFOLDERS:
                os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
            os.makedirs(self.dir, exist_ok=True)
            fd = os.open(self._jsonl_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0),
                         0o666)
        except OSError as err:
            self._failed(err)
            return
        self._fd = fd
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held until the file is closed
            except BlockingIOError:
                print(f"[TraceML] another process is already writing {self._jsonl_path}: its rows and this "
                      "process's mix in one file (a traceml_ai.Run in every DDP rank with all_ranks=True but "
                      "no RANK set?); give each process its own run or RANK", file=sys.stderr, flush=True)
            except OSError:
                pass  # a file system without locks: nothing to learn

    def _append(self, line: bytes) -> None:
        """One complete line at the end of metrics.jsonl, or nothing: a write cut short (disk full)
        is taken back, so a reader never sees half a row."""
        if self._fd is None:
            self._open_jsonl()
            if self._fd is None:
                return
        fd = self._fd
        try:
            view = memoryview(line)
            start: int | None = None
            while view:
                n = os.write(fd, view)
                if start is None and n < len(view):
                    start = os.lseek(fd, 0, os.SEEK_END) - n  # a short write: remember where the row began
                view = view[n:]
        except OSError as err:
            self._failed(err)
            if start is not None:
                try:
                    os.ftruncate(fd, start)
                except OSError:
                    pass

    def _close_jsonl(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        self._try(os.fsync, fd)
        try:
            os.close(fd)
        except OSError:
            pass

    def _write_meta(self) -> None:
        self._try(atomic_write, os.path.join(self.dir, RUN_JSON), dump_json(self.meta))

    def _metrics_doc(self) -> tuple[bytes, dict[str, Any]]:
        summary = {k: _summary_value(v) for k, v in self.summary.items()}
        return dump_json(
            {
                "schema_version": SCHEMA_VERSION,
                "updated_at": iso_utc(time.time()),
                "step": self.step,
                "epoch": self.epoch,
                "last": self.last,
                "best": self.best,
                "summary": summary,
            }
        ), summary

    def _write_metrics_json(self, *, durable: bool) -> None:
        data, summary = self._metrics_doc()
        if self._try(atomic_write, os.path.join(self.dir, METRICS_JSON), data, durable=durable):
            self._dirty = False
            self._written_summary = summary

    def _background(self, heartbeat_s: float) -> None:
        # metrics.json at most every second when something changed; the heartbeat (with fsync, so a
        # crash of the machine loses at most one beat) every heartbeat_s. The documents are built
        # under the lock (microseconds) and written outside it, so log() never waits for the disk.
        next_beat = time.monotonic() + heartbeat_s
        while not self._stop.wait(min(METRICS_JSON_EVERY_S, heartbeat_s)):
            if self._rank_file:
                continue
            metrics: tuple[bytes, dict[str, Any]] | None = None
            meta: bytes | None = None
            fd: int | None = None
            with self._lock:
                if self._stop.is_set() or self.status != "running":
                    return
                if self._dirty or self._summary_changed():
                    metrics = self._metrics_doc()
                    self._dirty = False
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + heartbeat_s
                    self.meta["heartbeat_at"] = iso_utc(time.time())
                    meta, fd = dump_json(self.meta), self._fd
            if metrics is not None:
                if self._try(atomic_write, os.path.join(self.dir, METRICS_JSON), metrics[0], durable=False):
                    self._written_summary = metrics[1]
                else:
                    self._dirty = True  # tried again next second
            if meta is not None:
                if fd is not None:
                    self._try(os.fsync, fd)
                self._try(atomic_write, os.path.join(self.dir, RUN_JSON), meta)

    def _summary_changed(self) -> bool:
        try:
            return {k: _summary_value(v) for k, v in self.summary.items()} != self._written_summary
        except Exception:  # the user's summary dict changed size while being read; next second
            return False

    def _at_exit(self) -> None:
        # The interpreter is exiting without finish(). An uncaught exception (seen by the
        # excepthook) ends the run failed, Ctrl+C or SIGTERM killed, as W&B and MLflow do, and so
        # does sys.exit(n) (seen by the exit hook, as W&B's): completed for 0, failed with code n.
        # A plain exit keeps the status running (readers show it stale): it cannot be told apart
        # from a `raise SystemExit(n)`, whose code is not known here.
        self._stop.set()
        uncaught = _uncaught[-1] if _uncaught else None
        if self.status == "running" and self.active and (uncaught is not None or _terminated):
            if isinstance(uncaught, Terminated) or (uncaught is None and _terminated):
                self.finish("killed", exit_code=143, signal_name="SIGTERM")
            elif isinstance(uncaught, KeyboardInterrupt):
                self.finish("killed", uncaught)
            else:
                self.finish("failed", uncaught)
            return
        if self.status == "running" and self.active and _exit_request:
            code = _exit_code(_exit_request[-1])
            self.finish("completed" if code == 0 else "failed", SystemExit(_exit_request[-1]), exit_code=code)
            return
        with self._lock:
            if self.status != "running" or not self.active:
                return
            self._settle_pending()
            if self._fd is not None:
                self._try(os.fsync, self._fd)
            if not self._rank_file:
                self._write_metrics_json(durable=True)


def _global_rank() -> int | None:
    """The global rank from ``RANK`` (torchrun, ``traceml run``), or None outside a distributed job."""
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None


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


_uncaught: list[BaseException] = []
"""The exception that ended the main thread, seen by :func:`_excepthook` (read at exit)."""
_terminated = False
"""True once SIGTERM arrived while a run was open (Terminated is a SystemExit: no excepthook)."""
_previous_excepthook: list[Any] = []


_exit_request: list[object] = []
"""The argument of the last ``sys.exit()`` called in the main thread while a run was open (cleared
by a later ``log()``: the program caught it and went on), read at exit by the runs still open."""
_previous_exit: list[Any] = []


def _exit_code(arg: object) -> int:
    """The process exit code of ``sys.exit(arg)``: None is 0, an int itself, anything else 1 (Python
    prints it on stderr)."""
    if arg is None:
        return 0
    return arg if isinstance(arg, int) else 1


def _exit(status: object = None, /) -> NoReturn:
    """``sys.exit`` while a run is open: remember the code for the exit, then exit as before."""
    if threading.current_thread() is threading.main_thread():
        _exit_request[:] = [status]
    if _previous_exit:
        _previous_exit[0](status)
    raise SystemExit(status)  # the previous sys.exit returned (a program's own stand-in)


def _install_exit_hook() -> None:
    """Put :func:`_exit` in front of ``sys.exit``, once per process."""
    if sys.exit is not _exit:
        _previous_exit[:] = [sys.exit]
        sys.exit = _exit


def _on_sigterm(signum: int, frame: Any) -> None:
    global _terminated
    _terminated = True
    raise Terminated(128 + signum)


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """Remember the uncaught exception for the runs still open at exit, then print it as before."""
    _uncaught.append(exc)
    previous = _previous_excepthook[0] if _previous_excepthook else sys.__excepthook__
    previous(exc_type, exc, tb)


def _install_excepthook() -> None:
    """Chain :func:`_excepthook` before the program's hook, once per process."""
    if sys.excepthook is not _excepthook:
        _previous_excepthook[:] = [sys.excepthook]
        sys.excepthook = _excepthook


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
        if not -(2**63) <= v < 2**63:
            raise ValueError(f"{what} must fit in 64 bits (metrics.jsonl readers hold it as one), got {v}")
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
