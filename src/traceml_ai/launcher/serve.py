"""``traceml serve``: an aggregator and a run folder for trainings started by the user (DESIGN §7).

The user's processes call ``traceml_ai.init()`` with ``TRACEML_AGGREGATOR``, ``TRACEML_SESSION_ID``,
``TRACEML_JOB_SECRET`` and ``TRACEML_RUN_DIR`` set to what :meth:`ServedRun.environment` returns. The served run is
``running`` until :meth:`ServedRun.finish` (Ctrl+C in the command), then ``completed``.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from traceml_ai.aggregator.export.streams import DEFAULT_EXPORT_STREAMS
from traceml_ai.aggregator.finalize import write_summary_after_crash
from traceml_ai.capture import session as jobsecret  # the job secret helpers (DESIGN §1: via capture)
from traceml_ai.launcher.aggregator_process import AggregatorProcess, AggregatorStartError
from traceml_ai.launcher.launch import LaunchError, LaunchResult, LaunchUsageError, check_export
from traceml_ai.launcher.runfolder import RunIdentity, RunJsonKeeper, create_run_folder, write_manifest


def _served_secret() -> str:
    """``TRACEML_JOB_SECRET`` when the user set one, else a fresh random secret.

    Raises:
        LaunchUsageError: the variable is set but too short.
    """
    import os

    given = os.environ.get(jobsecret.ENV_JOB_SECRET)
    if not given:
        return jobsecret.new_job_secret()
    try:
        return jobsecret.check_job_secret(given)
    except ValueError as exc:
        raise LaunchUsageError(str(exc)) from None


@dataclass
class ServedRun:
    """A run folder with its aggregator, waiting for ranks that call ``init()``."""

    run_dir: Path
    identity: RunIdentity
    keeper: RunJsonKeeper
    aggregator: AggregatorProcess
    started_ns: int
    secret: str = field(default="", repr=False)

    @classmethod
    def start(
        cls,
        logs_dir: str,
        name: str,
        *,
        group: str | None = None,
        tags: list[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        world_size: int | None = None,
        exporter: str | None = None,
        export_streams: str = DEFAULT_EXPORT_STREAMS,
        exporter_hostname: bool = False,
    ) -> ServedRun:
        """Create the run folder and start its aggregator (with the exporter, when one is set).

        Raises:
            LaunchUsageError: a bad ``exporter`` form or ``export_streams`` value (checked first,
                before anything is created).
            LaunchError: a bad name, an unwritable logs folder, or an aggregator that did not start
                (e.g. the port is in use).
        """
        check_export(exporter, export_streams)
        session_id = uuid.uuid4().hex
        secret = _served_secret()
        identity = RunIdentity(mode="serve", command=[sys.executable, "-m", "traceml_ai", "serve"],
                               session_id=session_id, nproc_per_node=world_size or 1)
        try:
            run_dir = create_run_folder(logs_dir, name).resolve()
        except ValueError as exc:  # a bad --name
            raise LaunchUsageError(f"--name: {exc}") from None
        except OSError as exc:
            raise LaunchError(f"cannot create the run folder in {logs_dir}: {exc.strerror or exc}") from None
        keeper = RunJsonKeeper(run_dir, name, group, list(tags or []), identity)
        keeper.start()
        started = time.time_ns()
        write_manifest(run_dir, identity, status="running", started_at_ns=started)
        try:
            aggregator = AggregatorProcess(run_dir, session_id, secret=secret, host=host, port=port,
                                           world_size=world_size, exporter=exporter, export_streams=export_streams,
                                           exporter_hostname=exporter_hostname)
        except AggregatorStartError as exc:
            keeper.finish(exit_code=1)
            write_manifest(run_dir, identity, status="incomplete", started_at_ns=started,
                           ended_at_ns=time.time_ns(), exit_code=1)
            raise LaunchError(f"{exc} (is port {port} free?)") from None
        return cls(run_dir, identity, keeper, aggregator, started, secret)

    @property
    def address(self) -> str:
        return self.aggregator.address

    def environment(self) -> dict[str, str]:
        """The variables a training process needs so that ``traceml_ai.init()`` reports here."""
        return {
            "TRACEML_AGGREGATOR": self.aggregator.address,
            "TRACEML_SESSION_ID": self.identity.session_id,
            jobsecret.ENV_JOB_SECRET: self.secret,
            "TRACEML_RUN_DIR": str(self.run_dir),
        }

    def finish(self) -> LaunchResult:
        """Stop the aggregator (it finalizes and writes the final summary) and close the run."""
        died = self.aggregator.exit_code()
        code = self.aggregator.stop()
        telemetry = {}
        if died not in (None, 0) or code not in (0, None):
            telemetry = {"status": "degraded", "reason": f"the telemetry aggregator exited with code {died or code}"}
            if not (self.run_dir / "aggregator" / "final_summary.json").exists():
                write_summary_after_crash(self.run_dir, telemetry["reason"])
        self.keeper.telemetry = telemetry
        status = self.keeper.finish(exit_code=0)
        write_manifest(self.run_dir, self.identity, status="incomplete" if telemetry else "completed",
                       started_at_ns=self.started_ns, ended_at_ns=time.time_ns(), exit_code=0,
                       telemetry=telemetry or None)
        return LaunchResult(0, self.run_dir, status, telemetry)
