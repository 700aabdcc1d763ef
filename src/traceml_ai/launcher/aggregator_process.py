"""The aggregator process of a launched run (DESIGN §3.2).

The launcher starts ``python -m traceml_ai.aggregator`` as its own process (so a crash of either
side never takes the other down), waits for its ``TRACEML_AGGREGATOR_LISTENING <host> <port>``
line, hands the address to the ranks, and at the end sends SIGTERM so it drains, flushes SQLite,
finalizes and writes the final summary.

With ``listen_early`` the launcher binds the listening socket itself and hands it to the process
(``--listen-fd``), so the address is known at once and the training starts while the aggregator
is still starting: the ranks' connections wait in the socket's queue until it accepts them. That
takes the aggregator's start (a Python process and its imports, 0.2-0.3 s) off the training's
start (issue 14, item 1). A start that fails then is reported through ``on_start_failure`` and
:attr:`AggregatorProcess.start_failure` instead of raising.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from traceml_ai.capture import jobsecret  # the job secret helpers (DESIGN §1: via capture)

LISTENING = "TRACEML_AGGREGATOR_LISTENING"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0


class AggregatorStartError(RuntimeError):
    """The aggregator process exited or said nothing before it was listening."""


class AggregatorProcess:
    """A running aggregator: its process, host and port.

    Args:
        run_dir: the run folder; the aggregator writes ``aggregator/`` inside it.
        session_id: frames of any other session are refused.
        secret: the job secret; given to the process in its environment (``TRACEML_JOB_SECRET``),
            never on its command line (which every local user can read).
        host: the address to bind (127.0.0.1 unless the job spans nodes).
        port: 0 picks a free port.
        world_size: ranks expected; a rank that never reports is listed as missing.
        exporter, export_streams, exporter_hostname: the export settings (000 seed), passed on as
            they are; the aggregator makes the exporter (the launcher never imports it).
        listen_early: bind ``host:port`` here and return at once (module docstring); a start that
            fails later calls ``on_start_failure`` with the reason, from another thread.

    Raises:
        AggregatorStartError: the process did not report a listening address within 30 s (not
            with ``listen_early``).
        OSError: with ``listen_early``, the address cannot be bound.
    """

    def __init__(self, run_dir: Path, session_id: str, *, secret: str, host: str = "127.0.0.1", port: int = 0,
                 world_size: int | None = None, exporter: str | None = None, export_streams: str = "step_time",
                 exporter_hostname: bool = False, listen_early: bool = False,
                 on_start_failure: Callable[[str], None] | None = None) -> None:
        # -P (Python 3.11+): the working directory is not on the aggregator's import path, so an
        # exporter module is found only when installed or on PYTHONPATH (000 seed, "Custom exporters").
        safe_path = ["-P"] if sys.version_info >= (3, 11) else []
        cmd = [sys.executable, *safe_path, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir),
               "--session-id", session_id, "--host", host, "--port", str(port)]
        if world_size is not None:
            cmd += ["--world-size", str(world_size)]
        if exporter is not None:
            cmd += ["--exporter", exporter, "--export-streams", export_streams]
            if exporter_hostname:
                cmd.append("--exporter-hostname")
        env = dict(os.environ)
        env.pop("TRACEML_RUN_DIR", None)
        env[jobsecret.ENV_JOB_SECRET] = secret
        env["TRACEML_LAUNCHER_PID"] = str(os.getpid())  # its orphan check (aggregator/__main__.py)
        self._exporter = exporter
        self._started = threading.Event()  # listening, or known never to listen
        self.start_failure: str | None = None
        """Why the process never listened (``listen_early`` only), else None."""
        self.stopped_at: float | None = None
        listener = socket.create_server((host, port)) if listen_early else None
        try:
            if listener is not None:
                self.host, self.port = listener.getsockname()[:2]
                cmd[cmd.index("--port") + 1] = str(self.port)
                cmd += ["--listen-fd", str(listener.fileno())]
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
                start_new_session=True,  # Ctrl+C in the terminal reaches the training, not the aggregator
                pass_fds=() if listener is None else (listener.fileno(),),
            )
        finally:
            if listener is not None:
                listener.close()  # the aggregator has its own copy; the training must not inherit one
        if listener is not None:
            threading.Thread(target=self._watch_start, args=(on_start_failure,), name="traceml-aggregator-start",
                             daemon=True).start()
            return
        try:
            self.host, self.port = self._wait_listening()
        except BaseException:  # Ctrl+C while it starts: leave no aggregator behind
            self.kill()
            raise
        self._started.set()

    def _watch_start(self, on_start_failure: Callable[[str], None] | None) -> None:
        try:
            self._wait_listening()
        except AggregatorStartError as exc:
            self.start_failure = str(exc)
            if on_start_failure is not None:
                on_start_failure(str(exc))
        finally:
            self._started.set()

    def _wait_listening(self) -> tuple[str, int]:
        lines: queue.Queue[str | None] = queue.Queue()
        stdout = self.proc.stdout
        assert stdout is not None

        def pump() -> None:
            # The listening line goes to the launcher; anything else the aggregator process prints
            # (an exporter's own output) is passed on to stderr, never held, never lost.
            for line in stdout:
                if line.startswith(LISTENING):
                    lines.put(line)
                else:
                    try:
                        sys.stderr.write(line)
                        sys.stderr.flush()
                    except (OSError, ValueError):
                        pass
            lines.put(None)

        threading.Thread(target=pump, name="traceml-aggregator-stdout", daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = lines.get(timeout=max(0.05, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                why = "the telemetry aggregator did not start within 30 s"
                if self._exporter is not None:
                    why += (f" (the exporter factory {self._exporter!r} runs before it listens: does it block? "
                            "Connect in the exporter's open(), not in the factory)")
                raise AggregatorStartError(why) from None
            if line is None:
                code = self.proc.wait()
                raise AggregatorStartError(f"the telemetry aggregator exited with code {code} before listening")
            parts = line.split()
            if len(parts) == 3 and parts[0] == LISTENING:
                return parts[1], int(parts[2])

    @property
    def address(self) -> str:
        """``host:port`` for ``TRACEML_AGGREGATOR``."""
        return f"{self.host}:{self.port}"

    def exit_code(self) -> int | None:
        """The process's exit code, or None while it runs."""
        return self.proc.poll()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then wait up to ``timeout`` s for it to drain and finalize; SIGKILL after that.

        An aggregator started with ``listen_early`` that is still starting (the training may end
        before it listens) is first given up to 30 s to listen: until then SIGTERM would end it
        before it can drain and finalize.

        Returns the exit code (negative for a signal), or None if it could not be reaped.
        """
        self._started.wait(START_TIMEOUT_S + 1.0)
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
