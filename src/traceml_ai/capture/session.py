"""The capture session of one rank: configuration, row sources, the sampler thread (DESIGN §3).

A :class:`CaptureSession` owns a daemon *sampler thread* that, every ``interval`` seconds, calls
``collect(seq, now_ns)`` on each registered :class:`~traceml_ai.capture.sources.RowSource` and sends
ONE envelope per tick (``{"meta": identity + session_id + sampler, "tables": {stream: rows}}``)
through the :class:`~traceml_ai.capture.client.TransportClient`. A tick with no rows sends nothing.

Built-in sources, registered on :meth:`CaptureSession.start`: ``process`` (every rank), ``system``
(node-local rank 0 only, one host snapshot per node), ``runtime_environment``, and
``stdout_stderr`` when ``capture_output`` is on. Other parts (step timing) add theirs with
:meth:`CaptureSession.add_source`, before or after start.

Faults stay inside: a source that raises is counted, named in one ``[TraceML]`` stderr line and
disabled; the thread goes on. :meth:`CaptureSession.close` collects once more (a source may offer
``collect_final(seq, now_ns)`` for that last look), flushes, sends ``rank_finished``, and is
registered with :mod:`atexit` so a normal interpreter exit does it. A forked child (DataLoader
workers) does not inherit a running session: its copy stops capturing and never sends.

Environment (read by :meth:`CaptureConfig.from_env`, set by the launcher):

========================  ==========================================================
``TRACEML_SESSION_ID``    the session id the aggregator accepts
``TRACEML_JOB_SECRET``    the job secret the hello proves this rank holds (never on a command line)
``TRACEML_AGGREGATOR``    ``host:port`` of the aggregator (``[v6addr]:port`` works too)
``TRACEML_RUN_DIR``       the run folder (carried for the SDK; capture writes there only the losses
                          its aggregator never heard of, see :data:`RANK_LOSSES_DIR`)
``TRACEML_INTERVAL``      sampler interval in seconds, > 0 (default 1.0)
``TRACEML_CAPTURE``       ``run`` (default) or ``watch``
``TRACEML_CAPTURE_OUTPUT`` ``0`` turns the stdout/stderr copy off (default on)
``TRACEML_DISABLE``       ``1`` turns capture off altogether
``TRACEML_AGGREGATOR_STARTING`` ``1``: the launcher started the training before the aggregator
                          listens (it bound the socket itself); the first connection may wait
                          :data:`FIRST_WELCOME_WAIT_S` for its welcome, even past the close deadline
========================  ==========================================================
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from traceml_ai.capture.client import TransportClient, warn
from traceml_ai.capture.identity import RankIdentity, detect_identity
from traceml_ai.capture.samplers.process import ProcessSampler
from traceml_ai.capture.samplers.runtime_environment import RuntimeEnvironmentSampler
from traceml_ai.capture.samplers.stdout_stderr import OutputCapture
from traceml_ai.capture.samplers.system import SystemSampler
from traceml_ai.capture.sources import RowSource
from traceml_ai.telemetry import jobsecret
from traceml_ai.telemetry.envelope import make_envelope

Mode = Literal["run", "watch"]
MODES: tuple[str, ...] = ("run", "watch")

SAMPLER_NAME = "capture"
"""``meta.sampler`` of every envelope a session sends (one envelope carries all its sources' rows)."""

DEFAULT_INTERVAL_S = 1.0
CLOSE_TIMEOUT_S = 2.0
FIRST_WELCOME_WAIT_S = 60.0
"""Seconds after the rank's start that its first connection may wait for the aggregator's welcome
when the launcher says the aggregator is still starting (``TRACEML_AGGREGATOR_STARTING=1``): a
short training on a loaded machine can end before the aggregator has imported its modules, and
its rows wait in the socket's queue instead of being dropped at the close deadline."""

RANK_LOSSES_DIR = "aggregator/rank_losses"
"""Where a rank whose ``rank_finished`` never reached the aggregator (it died) writes its own loss
counts, ``rank_<global_rank>.json``; the launcher lists them in ``finalization_warning.json``."""

ENV_JOB_SECRET = jobsecret.ENV_JOB_SECRET
new_job_secret = jobsecret.new_secret
"""A fresh random job secret (for the launchers, which reach the wire contract through capture)."""
MIN_JOB_SECRET_CHARS = jobsecret.MIN_SECRET_CHARS
check_job_secret = jobsecret.check_secret
"""A job secret given by the user, checked (raises ValueError naming ``TRACEML_JOB_SECRET``)."""

ENV_SESSION_ID = "TRACEML_SESSION_ID"
ENV_AGGREGATOR = "TRACEML_AGGREGATOR"
ENV_RUN_DIR = "TRACEML_RUN_DIR"
ENV_INTERVAL = "TRACEML_INTERVAL"
ENV_CAPTURE = "TRACEML_CAPTURE"
ENV_CAPTURE_OUTPUT = "TRACEML_CAPTURE_OUTPUT"
ENV_DISABLE = "TRACEML_DISABLE"
ENV_AGGREGATOR_STARTING = "TRACEML_AGGREGATOR_STARTING"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_address(value: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[::1]:port"``) → ``(host, port)``.

    Raises:
        ValueError: no port, a port that is not an integer in 1..65535, or an empty host.
    """
    host, sep, port_text = value.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not sep or not host or not 0 < port < 65536:
        raise ValueError(f"{value!r} is not host:port (for example 127.0.0.1:7071)")
    return host, port


def parse_interval(value: str | float) -> float:
    """A sampler interval in seconds: a finite number > 0.

    Raises:
        ValueError: anything else.
    """
    try:
        interval = float(value)
    except (TypeError, ValueError):
        interval = float("nan")
    if not interval > 0 or interval == float("inf"):
        raise ValueError(f"interval {value!r} is not a number of seconds > 0")
    return interval


def capture_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``TRACEML_DISABLE`` is ``1``/``true``/``yes``/``on``."""
    env = os.environ if environ is None else environ
    return env.get(ENV_DISABLE, "").strip().lower() in _TRUE


def capture_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The capture settings present in the environment, parsed (keys as :class:`CaptureConfig` fields).

    Raises:
        ValueError: a variable holds a bad value; the message names the variable and what it accepts.
    """
    env = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    if env.get(ENV_SESSION_ID):
        out["session_id"] = env[ENV_SESSION_ID]
    if env.get(jobsecret.ENV_JOB_SECRET):
        out["secret"] = jobsecret.check_secret(env[jobsecret.ENV_JOB_SECRET])
    if env.get(ENV_AGGREGATOR):
        try:
            out["aggregator"] = parse_address(env[ENV_AGGREGATOR])
        except ValueError as exc:
            raise ValueError(f"{ENV_AGGREGATOR}: {exc}") from None
    if env.get(ENV_RUN_DIR):
        out["run_dir"] = env[ENV_RUN_DIR]
    if env.get(ENV_INTERVAL):
        try:
            out["interval"] = parse_interval(env[ENV_INTERVAL])
        except ValueError as exc:
            raise ValueError(f"{ENV_INTERVAL}: {exc}") from None
    if env.get(ENV_CAPTURE):
        mode = env[ENV_CAPTURE].strip().lower()
        if mode not in MODES:
            raise ValueError(f"{ENV_CAPTURE}: {env[ENV_CAPTURE]!r} is not one of run, watch")
        out["mode"] = mode
    if env.get(ENV_CAPTURE_OUTPUT):
        flag = env[ENV_CAPTURE_OUTPUT].strip().lower()
        if flag not in _TRUE + _FALSE:
            raise ValueError(f"{ENV_CAPTURE_OUTPUT}: {env[ENV_CAPTURE_OUTPUT]!r} is not 1 or 0")
        out["capture_output"] = flag in _TRUE
    if env.get(ENV_AGGREGATOR_STARTING, "").strip() == "1":
        out["aggregator_starting"] = True
    return out


@dataclass(frozen=True)
class CaptureConfig:
    """How a rank captures (DESIGN §3).

    Attributes:
        session_id: the session the aggregator accepts; sent in the hello and every envelope.
        aggregator: ``(host, port)``; None sends nothing (rows are collected and counted as dropped).
        run_dir: the run folder, when the launcher made one.
        interval: seconds between sampler ticks (> 0).
        mode: ``"run"`` or ``"watch"`` (the launcher's command; carried for the other sources).
        capture_output: copy the rank's stdout/stderr lines into the ``stdout_stderr`` stream.
        secret: the job secret (``TRACEML_JOB_SECRET``); without it the aggregator refuses the rank.
        aggregator_starting: the aggregator may not listen yet (``TRACEML_AGGREGATOR_STARTING``):
            the first connection waits up to :data:`FIRST_WELCOME_WAIT_S` for its welcome.

    Raises (on construction):
        ValueError: an interval that is not > 0, or an unknown mode.
    """

    session_id: str
    aggregator: tuple[str, int] | None = None
    run_dir: str | None = None
    interval: float = DEFAULT_INTERVAL_S
    mode: Mode = "run"
    capture_output: bool = True
    secret: str = field(default="", repr=False)
    aggregator_starting: bool = False

    def __post_init__(self) -> None:
        parse_interval(self.interval)
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of run, watch")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CaptureConfig | None:
        """The configuration the launcher put in the environment (see the module docstring).

        Returns:
            None when capture is disabled (``TRACEML_DISABLE=1``) or ``TRACEML_SESSION_ID`` or
            ``TRACEML_AGGREGATOR`` is missing.

        Raises:
            ValueError: a variable holds a bad value (one line naming it).
        """
        if capture_disabled(environ):
            return None
        values = capture_env(environ)
        if "session_id" not in values or "aggregator" not in values:
            return None
        return cls(**values)


class CaptureSession:
    """The capture of one rank (see the module docstring).

    Args:
        config: what to capture and where to send it.
        identity: the rank's identity; default: read from the environment.

    Example::

        session = CaptureSession(CaptureConfig("sess-1", ("127.0.0.1", 7071)))
        session.add_source(my_step_time_source)
        session.start()
        ...
        session.close()
    """

    def __init__(self, config: CaptureConfig, *, identity: RankIdentity | None = None) -> None:
        self.config = config
        self.identity = identity if identity is not None else detect_identity()
        self.client: TransportClient | None = None
        self.source_errors: dict[str, str] = {}
        self.seq = 0
        self.envelopes = 0
        self.unsent_envelopes = 0
        self._sources: list[RowSource] = []
        self._builtin: list[RowSource] = []
        self._disabled: set[int] = set()
        self._output: OutputCapture | None = None
        self._stop = threading.Event()
        self._tick_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._pid = os.getpid()
        self._meta = self.identity.meta(config.session_id, SAMPLER_NAME)

    @property
    def mode(self) -> Mode:
        """``"run"`` or ``"watch"``."""
        return self.config.mode

    @property
    def running(self) -> bool:
        """True between :meth:`start` and :meth:`close`."""
        return self._started and not self._closed

    @property
    def sources(self) -> list[RowSource]:
        """Every registered source (built-in first), disabled ones included."""
        return list(self._builtin) + list(self._sources)

    @property
    def dropped_output_lines(self) -> int:
        """stdout/stderr lines lost because the buffer was full between two ticks."""
        return self._output.dropped_lines if self._output is not None else 0

    def lost_rows(self) -> dict[str, int]:
        """{stream: rows} the row sources lost before they reached a batch (only streams with > 0)."""
        lost: dict[str, int] = {}
        for source in self.sources:
            counter = getattr(source, "lost_rows", None)
            if not callable(counter):
                continue
            try:
                n = int(counter())
            except Exception:
                continue
            if n > 0:
                stream = str(getattr(source, "stream", type(source).__name__))
                lost[stream] = lost.get(stream, 0) + n
        return lost

    def step_counts(self) -> dict[str, int]:
        """{counter: n} of steps left without a row by design (a block that raised, an incomplete
        update at the end), summed over the sources that count them (``StepTracer.step_counts``);
        empty when no source does. Never raises."""
        counts: dict[str, int] = {}
        for source in self.sources:
            counter = getattr(source, "step_counts", None)
            if not callable(counter):
                continue
            try:
                got = counter()
                for key, value in got.items():
                    counts[str(key)] = counts.get(str(key), 0) + int(value)
            except Exception:
                continue
        return counts

    def add_source(self, source: RowSource) -> None:
        """Register a row source; collected from the next tick on. Thread-safe."""
        with self._state_lock:
            self._sources = [*self._sources, source]

    def start(self) -> None:
        """Register the built-in sources, connect, and start the sampler thread. Idempotent.

        Never raises for a telemetry fault: a built-in source that cannot start is left out and
        named in one ``[TraceML]`` line.
        """
        with self._state_lock:
            if self._started:
                return
            self._started = True
        _watch_forks()
        self._builtin = self._make_builtin_sources()
        if self.config.aggregator is not None:
            self.client = TransportClient(self.config.aggregator, self.config.session_id, self.identity.meta(),
                                          secret=self.config.secret,
                                          first_welcome_wait_s=FIRST_WELCOME_WAIT_S
                                          if self.config.aggregator_starting else 0.0)
            self.client.start()
        self._thread = threading.Thread(target=self._run, name="traceml-sampler", daemon=True)
        self._thread.start()
        atexit.register(self._close_at_exit)

    def _make_builtin_sources(self) -> list[RowSource]:
        sources: list[RowSource] = []
        makers: list[tuple[str, Any]] = [("process", lambda: ProcessSampler(self.identity.local_rank))]
        # One host snapshot per node: node-local rank 0 (or a rank that does not know its local rank).
        if self.identity.local_rank in (0, None):
            makers.append(("system", SystemSampler))
        makers.append(("runtime_environment", lambda: RuntimeEnvironmentSampler(self.identity)))
        for name, make in makers:
            try:
                sources.append(make())
            except Exception as exc:
                self.source_errors[name] = repr(exc)
                warn(f"telemetry source {name} could not start ({exc!r}); it is left out")
        if self.config.capture_output:
            try:
                output = OutputCapture()
                output.install()
                self._output = output
                sources.append(output)
            except Exception as exc:
                self.source_errors["stdout_stderr"] = repr(exc)
                warn(f"stdout/stderr capture could not start ({exc!r}); it is left out")
        return sources

    def _run(self) -> None:
        interval = self.config.interval
        next_at = time.monotonic() + interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            with self._tick_lock:
                if self._stop.is_set():
                    break
                self._tick(final=False)
            next_at += interval
            now = time.monotonic()
            if next_at < now:  # a slow tick: skip the missed ones rather than bunch them up
                next_at = now + interval

    def _tick(self, *, final: bool) -> None:
        """Collect every enabled source once and send one envelope (caller holds the tick lock)."""
        try:
            self.seq += 1
            seq, now_ns = self.seq, time.time_ns()
            tables: dict[str, list[dict[str, Any]]] = {}
            for source in self.sources:
                if id(source) in self._disabled:
                    continue
                collect = getattr(source, "collect_final", None) if final else None
                try:
                    rows = (collect or source.collect)(seq, now_ns)
                except Exception as exc:
                    self._disable(source, exc)
                    continue
                if rows:
                    tables.setdefault(source.stream, []).extend(rows)
            if not tables:
                return
            envelope = make_envelope(self._meta, tables)
            self.envelopes += 1
            if self.client is not None:
                self.client.submit(envelope)
            else:
                self.unsent_envelopes += 1
        except Exception as exc:  # the sampler thread must outlive anything a tick does
            self.source_errors.setdefault("sampler", repr(exc))

    def _disable(self, source: RowSource, exc: Exception) -> None:
        self._disabled.add(id(source))
        name = getattr(source, "stream", type(source).__name__)
        label = f"{type(source).__name__}({name})"
        self.source_errors[label] = repr(exc)
        warn(f"telemetry source {label} failed and is switched off: {exc!r}")

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Last collect, flush, ``rank_finished``; at most about ``timeout_s`` s of sending. Idempotent.

        Prints one ``[TraceML]`` line on stderr when batches or output lines were lost. Never raises.
        """
        with self._state_lock:
            if self._closed or not self._started:
                self._closed = True
                return
            self._closed = True
        try:
            atexit.unregister(self._close_at_exit)
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout_s + 1.0)
            if self._output is not None:
                self._output.uninstall()  # partial lines become lines before the last collect
            if self._tick_lock.acquire(timeout=timeout_s):
                try:
                    self._tick(final=True)
                finally:
                    self._tick_lock.release()
            for source in self.sources:
                closer = getattr(source, "close", None)
                if callable(closer):
                    try:
                        closer()
                    except Exception:
                        pass
            if self.client is not None:
                self.client.close(timeout_s, dropped_output_lines=self.dropped_output_lines,
                                  lost_rows=self.lost_rows(), step_counts=self.step_counts())
            self._report_losses()
        except Exception as exc:
            warn(f"telemetry shutdown failed: {exc!r}")
        finally:
            _forget(self)

    def _report_losses(self) -> None:
        client = self.client
        parts = []
        if client is not None and client.refused_reason is None:
            if client.dropped_batches or not client.finished_delivered:
                host, port = client.address
                why = f" ({client.last_error})" if client.last_error else ""
                parts.append(
                    f"{client.dropped_batches} of {client.submitted_batches} telemetry batches were not delivered "
                    f"to the aggregator at {host}:{port}{why}"
                )
        if self.dropped_output_lines:
            parts.append(f"{self.dropped_output_lines} stdout/stderr lines were dropped")
        for stream, n in self.lost_rows().items():
            parts.append(f"{n} {stream} rows were dropped before sending (the hand-off queue was full)")
        if parts:
            warn("; ".join(parts))
            if client is not None and not client.finished_delivered and client.refused_reason is None:
                self._record_losses(client, "; ".join(parts))

    def _record_losses(self, client: TransportClient, line: str) -> None:
        """The counts the aggregator will never report (it did not get ``rank_finished``), as a file of
        the run folder on this node; nothing when there is no run folder. Never raises."""
        if not self.config.run_dir:
            return
        rank = self.identity.global_rank
        folder = os.path.join(self.config.run_dir, RANK_LOSSES_DIR)
        record = {"global_rank": rank, "submitted_batches": client.submitted_batches,
                  "sent_batches": client.sent_batches, "dropped_batches": client.dropped_batches,
                  "dropped_output_lines": self.dropped_output_lines, "lost_rows": self.lost_rows(),
                  "last_error": client.last_error, "message": line}
        try:
            import json
            import secrets

            os.makedirs(folder, exist_ok=True)
            # 0666 less the umask, like every other run file (tempfile.mkstemp's 0600 would lock a
            # teammate out of it).
            tmp = os.path.join(folder, f".rank_{os.getpid()}.{secrets.token_hex(4)}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(record, handle)
            os.replace(tmp, os.path.join(folder, f"rank_{rank if rank is not None else 'unknown'}.json"))
        except (OSError, ValueError, TypeError):
            pass

    def stats(self) -> dict[str, Any]:
        """Counters: ticks, envelopes, transport batches, dropped output lines, failed sources."""
        client = self.client
        return {
            "ticks": self.seq,
            "envelopes": self.envelopes,
            "unsent_envelopes": self.unsent_envelopes,
            "submitted_batches": client.submitted_batches if client else 0,
            "sent_batches": client.sent_batches if client else 0,
            "dropped_batches": client.dropped_batches if client else 0,
            "connected": client.connected if client else False,
            "dropped_output_lines": self.dropped_output_lines,
            "lost_rows": self.lost_rows(),
            "source_errors": dict(self.source_errors),
        }

    def _close_at_exit(self) -> None:
        if os.getpid() == self._pid:
            self.close()

    def _abandon_in_child(self) -> None:
        """In a forked child: stop capturing, never send, never touch the parent's locks or threads."""
        self._closed = True
        if self._output is not None:
            self._output.detach_in_child()
        if self.client is not None:
            self.client.abandon()


# -- the process's session ---------------------------------------------------------------------------

_current: CaptureSession | None = None
_current_lock = threading.Lock()
_fork_hook_installed = False


def start_session(config: CaptureConfig) -> CaptureSession:
    """Start this process's capture session, or return the one already running (idempotent).

    A second call while a session runs returns that session unchanged, whatever ``config`` says.
    """
    global _current
    with _current_lock:
        if _current is not None and _current.running:
            return _current
        session = CaptureSession(config)
        _current = session
    session.start()
    return session


def current_session() -> CaptureSession | None:
    """The running session of this process, or None."""
    session = _current
    return session if session is not None and session.running else None


def _forget(session: CaptureSession) -> None:
    global _current
    with _current_lock:
        if _current is session:
            _current = None


def _after_fork_in_child() -> None:
    global _current, _current_lock
    session = _current
    _current = None
    # The parent's lock may have been held by another thread at the fork: the child gets a fresh one.
    _current_lock = threading.Lock()
    if session is not None:
        session._abandon_in_child()


def _watch_forks() -> None:
    global _fork_hook_installed
    if not _fork_hook_installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook_installed = True
