"""The run folder of a launched run: run.json and aggregator/manifest.json (DESIGN §2.1, §5).

One writer per file. The launcher writes ``run.json`` as ``running`` with a heartbeat while the
process tree lives. When the training script opens ``traceml_ai.Run`` under the launcher
(``TRACEML_RUN_DIR`` is set) the logger writes that same file; the launcher notices that the file
is no longer the one it wrote (its size and mtime changed) and stops writing it. At the end it
writes the final status only if nobody else did (SIGKILL, OOM kill, a script without the logger),
so a launched run is never left "running" forever.

``aggregator/manifest.json`` is the session ledger the catalog reads: session_id, job_id, rank
identity, status ``running`` / ``completed`` / ``interrupted`` / ``incomplete``, started/ended ns.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from traceml_ai.runs.layout import CONFIG_JSON, METRICS_JSON, PARAMS_YAML, RUN_JSON, SCHEMA_VERSION, SUBFOLDERS
from traceml_ai.runs.writer import atomic_write, dump_json, iso_utc, make_run_id

AGGREGATOR_DIR = "aggregator"
MANIFEST_JSON = "aggregator/manifest.json"
MANIFEST_FORMAT = "traceml.session_manifest"

HEARTBEAT_S = 10.0
"""Seconds between the launcher's run.json heartbeats (well under the 60 s stale threshold)."""


# Signals a process raises on itself when it crashes (bad memory access, abort(), a failed assertion in
# native code): such a run failed; any other signal was sent from outside to stop it (killed).
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGSYS", "SIGTRAP"})


@dataclass
class RunIdentity:
    """What the launcher knows about the job it starts (written into run.json and the manifest)."""

    mode: str  # "run", "watch" or "serve"
    command: list[str]
    session_id: str
    job_id: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    nproc_per_node: int = 1

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def create_run_folder(logs_dir: str | os.PathLike[str], name: str, *, t: float | None = None) -> Path:
    """Create ``<logs_dir>/<YYYYMMDD-HHMMSS>_<name>_<hex4>`` with its sub-folders and ``aggregator/``.

    Raises:
        ValueError: a bad run name (see :func:`traceml_ai.runs.writer.make_run_id`).
        OSError: the folder cannot be created.
    """
    run_id = make_run_id(name, time.time() if t is None else t)
    folder = Path(logs_dir) / run_id
    folder.mkdir(parents=True, exist_ok=False)
    for sub in (*SUBFOLDERS, AGGREGATOR_DIR):
        (folder / sub).mkdir(exist_ok=True)
    return folder


@dataclass
class RunJsonKeeper:
    """Writes run.json of a launched run until the script's own logger takes it over.

    Args:
        folder: the run folder.
        name, group, tags: the run's labels.
        identity: the launched job.

    Example::

        keeper = RunJsonKeeper(folder, "baseline", None, [], identity)
        keeper.start()           # running + heartbeat thread
        ...
        keeper.finish(exit_code=0)  # completed, unless the logger already wrote a final status
    """

    folder: Path
    name: str
    group: str | None
    tags: list[str]
    identity: RunIdentity
    t0: float = field(default_factory=time.time)
    telemetry: dict[str, Any] = field(default_factory=dict)
    write_errors: int = 0
    last_error: str | None = None
    _written: tuple[int, int] | None = None
    _taken_over: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def path(self) -> Path:
        return self.folder / RUN_JSON

    def guard(self, write: Any, *args: Any, **kwargs: Any) -> bool:
        """Run one write into the run folder; a failure (disk full, read-only folder) is counted in
        ``write_errors``, warned once on stderr and never raised: the training's result stands."""
        try:
            write(*args, **kwargs)
            return True
        except OSError as exc:
            self.write_errors += 1
            if self.last_error is None:
                print(f"[TraceML] cannot write the run folder {self.folder}: {exc.strerror or exc}; the training "
                      "goes on, its exit code stands", file=sys.stderr, flush=True)
            self.last_error = str(exc.strerror or exc)
            return False

    def start(self) -> None:
        """Write the small files of a fresh run and run.json ``running``; start the heartbeat.
        A write that fails is counted (:meth:`guard`), never raised."""
        for name, content in ((PARAMS_YAML, "{}\n"), (CONFIG_JSON, "{}\n")):
            if not (self.folder / name).exists():
                self.guard(atomic_write, self.folder / name, content)
        if not (self.folder / METRICS_JSON).exists():
            self.guard(
                atomic_write,
                self.folder / METRICS_JSON,
                dump_json({"schema_version": SCHEMA_VERSION, "updated_at": iso_utc(self.t0), "step": None,
                           "epoch": None, "last": {}, "best": {}, "summary": {}}),
            )
        self.guard(self._write, self._meta("running", time.time()))
        self._thread = threading.Thread(target=self._beat, name="traceml-launcher-heartbeat", daemon=True)
        self._thread.start()

    @property
    def taken_over(self) -> bool:
        """True once the script's logger has written run.json."""
        with self._lock:
            self._check_takeover()
            return self._taken_over

    def finish(
        self,
        *,
        exit_code: int | None,
        signal_name: str | None = None,
        interrupted: bool = False,
        stderr_tail: str | None = None,
    ) -> str:
        """Write the final status unless run.json already holds one; return the status run.json ends with.

        ``completed`` for exit code 0, ``killed`` when ``interrupted`` or a stopping signal (SIGINT,
        SIGTERM, SIGKILL, ...) ended the process, ``failed`` otherwise — a crash signal such as
        SIGSEGV or SIGABRT included (:data:`CRASH_SIGNALS`) — with ``stderr_tail`` as the traceback.
        ``self.telemetry`` (e.g. a degraded-telemetry note) is merged into run.json either way.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            current = _read_json(self.path)
            status = current.get("status") if isinstance(current, dict) else None
            now = time.time()
            if status in ("completed", "failed", "killed"):
                # The logger wrote the final status; only add what the launcher knows.
                if self.telemetry and isinstance(current, dict):
                    current["telemetry"] = self.telemetry
                    current.setdefault("launcher", self._launcher_block())
                    self.guard(atomic_write, self.path, dump_json(current))
                return str(status)
            if interrupted or (signal_name is not None and signal_name not in CRASH_SIGNALS):
                final = "killed"
            elif exit_code == 0:
                final = "completed"
            else:
                final = "failed"
            running = isinstance(current, dict) and current.get("status") == "running"
            meta = current if running else self._meta(final, now)
            exit_info: dict[str, Any] = {"code": exit_code, "signal": signal_name}
            if final == "killed" and exit_info["signal"] is None:
                exit_info["signal"] = "SIGINT"
            if final == "failed":
                exit_info["error_type"] = "ExitCode" if signal_name is None else "Signal"
                exit_info["error_message"] = (
                    f"the training exited with code {exit_code}" if signal_name is None
                    else f"the training crashed with {signal_name}"
                )
                if stderr_tail:
                    exit_info["traceback"] = stderr_tail
                    raised = _last_exception(stderr_tail)
                    if raised is not None:  # the script's own exception says more than its exit code
                        exit_info["error_type"], exit_info["error_message"] = raised
            meta.update(status=final, ended_at=iso_utc(now), heartbeat_at=iso_utc(now),
                        duration_s=round(now - self.t0, 3), exit=exit_info)
            meta.setdefault("launcher", self._launcher_block())
            if self.telemetry:
                meta["telemetry"] = self.telemetry
            self.guard(self._write, meta, final=True)
            return final

    # -- internals -----------------------------------------------------------------------------

    def _launcher_block(self) -> dict[str, Any]:
        ident = self.identity
        return {
            "mode": ident.mode,
            "pid": os.getpid(),
            "session_id": ident.session_id,
            "nnodes": ident.nnodes,
            "nproc_per_node": ident.nproc_per_node,
            "world_size": ident.world_size,
        }

    def _meta(self, status: str, now: float) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "id": self.folder.name,
            "name": self.name,
            "group": self.group,
            "tags": list(self.tags),
            "notes": "",
            "status": status,
            "started_at": iso_utc(self.t0),
            "ended_at": None,
            "heartbeat_at": iso_utc(now),
            "duration_s": None,
            "exit": None,
            "command": list(self.identity.command),
            "cwd": os.getcwd(),
            "host": {"hostname": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0]},
            "launcher": self._launcher_block(),
        }

    def _write(self, meta: dict[str, Any], *, final: bool = False) -> None:
        if final:
            write_final(self.path, dump_json(meta))
        else:
            atomic_write(self.path, dump_json(meta))
        st = self.path.stat()
        self._written = (st.st_mtime_ns, st.st_size)

    def _check_takeover(self) -> None:
        if self._taken_over or self._written is None:
            return
        try:
            st = self.path.stat()
        except OSError:
            return
        if (st.st_mtime_ns, st.st_size) != self._written:
            self._taken_over = True

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                self._check_takeover()
                if self._taken_over:
                    return  # the logger keeps its own heartbeat
                meta = _read_json(self.path)
                if not isinstance(meta, dict) or meta.get("status") != "running":
                    return
                meta["heartbeat_at"] = iso_utc(time.time())
                self.guard(self._write, meta)  # a full disk must not stop the training; the next beat tries again


def write_manifest(
    folder: Path,
    identity: RunIdentity,
    *,
    status: str,
    started_at_ns: int,
    ended_at_ns: int | None = None,
    exit_code: int | None = None,
    telemetry: dict[str, Any] | None = None,
) -> None:
    """Write ``aggregator/manifest.json``: the session's identity and lifecycle (DESIGN §5).

    ``status`` is ``running``, ``completed`` (the training ran to its end with exit code 0 and
    telemetry was finalized), ``interrupted`` (Ctrl+C or a signal stopped it, or the training failed
    or crashed: it did not run to its end) or ``incomplete`` (telemetry was lost, e.g. the
    aggregator died). The training's own outcome is in ``run.json`` and ``exit_code``.
    """
    if status not in ("running", "completed", "interrupted", "incomplete"):
        raise ValueError(f"manifest status must be running, completed, interrupted or incomplete, not {status!r}")
    body: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "schema_version": 1,
        "session_id": identity.session_id,
        "job_id": identity.job_id,
        "run_id": folder.name,
        "mode": identity.mode,
        "status": status,
        "started_at_ns": started_at_ns,
        "ended_at_ns": ended_at_ns,
        "world_size": identity.world_size,
        "nnodes": identity.nnodes,
        "nproc_per_node": identity.nproc_per_node,
        "node_rank": identity.node_rank,
        "rank": None if identity.world_size > 1 else 0,
        "local_rank": None if identity.world_size > 1 else 0,
        "role": "job" if identity.world_size > 1 else "rank",  # one aggregator collects every rank of a job
        "hostname": socket.gethostname(),
        "command": list(identity.command),
        "exit_code": exit_code,
    }
    if telemetry:
        body["telemetry"] = telemetry
    (folder / AGGREGATOR_DIR).mkdir(exist_ok=True)
    if status == "running":
        atomic_write(folder / MANIFEST_JSON, dump_json(body))
    else:
        write_final(folder / MANIFEST_JSON, dump_json(body))


def write_final(path: Path, data: bytes) -> None:
    """Write a run's last word on itself (final run.json, final manifest) atomically; when that
    fails (a full disk has no room for the temp file) overwrite the old file in place, whose own
    blocks usually hold the new text, so the run does not stay "running" forever.

    Raises:
        OSError: the atomic write failed (raised even when the in-place overwrite then worked, so
            the failure is counted).
    """
    try:
        atomic_write(path, data)
    except OSError:
        try:
            with open(path, "r+b") as f:
                f.write(data)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass
        raise


_EXCEPTION_LINE = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)\w*)(?:: (?P<msg>.*))?$"
)


def _last_exception(stderr_tail: str) -> tuple[str, str] | None:
    """(type, message) of the exception a Python traceback in ``stderr_tail`` ends with, or None."""
    lines = stderr_tail.rstrip("\n").splitlines()
    if not any(line.startswith("Traceback (most recent call last):") for line in lines):
        return None
    match = _EXCEPTION_LINE.match(lines[-1]) if lines else None
    if match is None:
        return None
    return match.group("type").rsplit(".", 1)[-1], match.group("msg") or ""


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
