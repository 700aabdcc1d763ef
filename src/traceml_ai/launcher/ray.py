"""Ray Train under capture: a ``TorchTrainer`` job recorded like ``traceml run`` (docs/ray.md).

::

    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from traceml_ai.launcher.ray import TraceMLRayConfig, TraceMLRayRun

    scaling = ScalingConfig(num_workers=2)
    with TraceMLRayRun(TraceMLRayConfig(name="resnet", exporter="jsonl"), scaling_config=scaling) as run:
        trainer = TorchTrainer(run.wrap(train_loop), scaling_config=scaling)
        trainer.fit()
    print(run.run_dir)

Three pieces, each doing what ``traceml run`` does in its own place:

- :class:`TraceMLRayConfig`: the run's labels and the export settings. A field left ``None`` comes
  from ``TRACEML_<NAME>`` or ``traceml.yaml`` on the driver, as for ``traceml run`` (DESIGN §6);
  the export settings are checked (form only, 000 seed) before anything starts.
- an aggregator actor (:class:`RayAggregatorHost` as a Ray actor that takes no CPU, placed on the
  driver's node): it creates the run folder, keeps ``run.json`` and ``aggregator/manifest.json``,
  and starts ``python -P -m traceml_ai.aggregator`` as its child process, bound to 127.0.0.1 when
  the cluster has one node and to the actor's node IP when it spans several (DESIGN §3.2).
- :meth:`TraceMLRayRun.wrap`: the train loop each Ray Train worker runs. Before the user's loop it
  puts the ``TRACEML_*`` variables and the worker's rank identity (Ray Train's world rank, local
  rank, world size, local world size, node rank as ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``) in the environment and starts the capture session the
  way the ``traceml run`` bootstrap does; after it, the session is closed (Ray may end the worker
  process without running :mod:`atexit`) and the environment put back.

Layering (DESIGN §1): starting the aggregator and owning the run folder is the launcher's job, and
``traceml_ai.sdk`` may import neither the launcher nor the aggregator, so this module lives in the
launcher and reaches the rank side through ``traceml_ai.capture`` (as the bootstrap does), never
through the SDK. ``ray`` is imported inside functions: importing this module does not need Ray.

Telemetry never changes the training's result: an aggregator that does not start leaves the
training running without capture (``telemetry.status`` ``degraded`` in run.json), and a capture
fault in a worker is one ``[TraceML]`` line.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from traceml_ai.aggregator.finalize import write_summary_after_crash
from traceml_ai.capture import session as jobsecret  # the job secret helpers (DESIGN §1: via capture)
from traceml_ai.capture import steps
from traceml_ai.capture.bootstrap import start_from_env
from traceml_ai.capture.client import warn
from traceml_ai.capture.session import (
    ENV_AGGREGATOR,
    ENV_CAPTURE,
    ENV_INTERVAL,
    ENV_RUN_DIR,
    ENV_SESSION_ID,
    current_session,
)
from traceml_ai.launcher.aggregator_process import AggregatorProcess, AggregatorStartError
from traceml_ai.launcher.launch import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    LaunchError,
    LaunchResult,
    LaunchUsageError,
    check_export,
)
from traceml_ai.launcher.runfolder import RunIdentity, RunJsonKeeper, create_run_folder, write_manifest
from traceml_ai.runs.writer import make_run_id
from traceml_ai.settings import SettingsError, load_settings

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 120.0
"""How long the driver waits for the aggregator actor to be placed and listening (Ray may have to
start a worker process first, which takes seconds on a busy machine)."""
FINISH_TIMEOUT_S = 120.0
"""How long the driver waits for the actor to stop the aggregator (it drains for up to 60 s)."""


@dataclass(frozen=True)
class TraceMLRayConfig:
    """What a Ray Train job records, the ``traceml run`` options that apply to it (DESIGN §6, 000 seed).

    Every field left ``None`` is resolved on the driver like a flag not given: ``TRACEML_<NAME>``,
    then ``traceml.yaml`` (searched from the working directory up), then the default.

    Args:
        logs_dir: where the run folder is created (``<logs_dir>/<YYYYMMDD-HHMMSS>_<name>_<hex4>``,
            on the driver's node); default ``traceml/runs``.
        name: the run name; default the ``run_name`` setting, else the driver script's file stem.
        group, tags: the run's labels (run.json).
        interval: sampling interval of every worker, seconds (0.01 to 3600); default 1.0.
        exporter: ``jsonl``, ``otlp`` or ``module:factory`` (only the form is checked here; the
            aggregator imports the module); default none.
        export_streams: comma separated ``step_time``, ``step_memory``, ``process``, ``system``,
            ``all``; default ``step_time``.
        exporter_hostname: keep the ``hostname`` field in exported records; default off.
        host: the address the aggregator binds; default 127.0.0.1 on a one-node cluster, the
            actor's node IP when the cluster has several nodes.

    Example::

        TraceMLRayConfig(name="bert", tags=("ray",), exporter="my_exporters:make_exporter")
    """

    logs_dir: str | None = None
    name: str | None = None
    group: str | None = None
    tags: Sequence[str] = field(default_factory=tuple)
    interval: float | None = None
    exporter: str | None = None
    export_streams: str | None = None
    exporter_hostname: bool | None = None
    host: str | None = None

    def resolve(self) -> ResolvedRayConfig:
        """The settings this job runs with, checked before anything starts.

        Raises:
            LaunchUsageError: a bad setting (its source named), an interval out of range, an
                unknown ``export_streams`` name, a malformed ``exporter`` (the one-line message
                ``traceml run`` exits 2 with), or a name that cannot name a run folder.
        """
        flags = {"logs_dir": self.logs_dir, "run_name": self.name, "interval": self.interval,
                 "exporter": self.exporter, "export_streams": self.export_streams,
                 "exporter_hostname": self.exporter_hostname}
        try:
            settings = load_settings(flags)
        except SettingsError as exc:
            raise LaunchUsageError(str(exc)) from None
        if not MIN_INTERVAL_S <= settings.interval <= MAX_INTERVAL_S:
            raise LaunchUsageError(f"interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S:g} seconds")
        check_export(settings.exporter, settings.export_streams)
        name = settings.run_name or Path(sys.argv[0] if sys.argv and sys.argv[0] else "ray").stem or "ray"
        try:
            make_run_id(name, 0.0)  # a bad name stops here, before Ray is touched
        except ValueError as exc:
            raise LaunchUsageError(f"name: {exc}") from None
        return ResolvedRayConfig(
            logs_dir=str(Path(settings.logs_dir).resolve()), name=name, group=self.group,
            tags=[str(t) for t in self.tags], interval=settings.interval, exporter=settings.exporter,
            export_streams=settings.export_streams, exporter_hostname=settings.exporter_hostname, host=self.host,
        )


@dataclass(frozen=True)
class ResolvedRayConfig:
    """A :class:`TraceMLRayConfig` after the settings lookup: every value known, ``logs_dir`` absolute."""

    logs_dir: str
    name: str
    group: str | None
    tags: list[str]
    interval: float
    exporter: str | None
    export_streams: str
    exporter_hostname: bool
    host: str | None


@dataclass(frozen=True)
class WorkerPlan:
    """What every Ray Train worker needs to report to the run's aggregator (picklable).

    Attributes:
        session_id: the session the aggregator accepts.
        aggregator: ``host:port``, or None when the aggregator did not start (workers train without
            capture).
        run_dir: the run folder; given only to workers on ``node_id`` (the folder's file system).
        node_id: the Ray node id of the aggregator actor.
        interval: sampling interval, seconds.
        secret: the job secret; it reaches the workers inside this plan (Ray's own channels) and
            goes into their environment, never onto a command line.
    """

    session_id: str
    aggregator: str | None
    run_dir: str
    node_id: str | None
    interval: float
    secret: str = field(default="", repr=False)


class RayAggregatorHost:
    """The run folder and aggregator process of one Ray job; runs as a Ray actor (DESIGN §2.1, §3.2).

    The same steps as ``traceml run`` on node 0: create the run folder, ``run.json`` running with a
    heartbeat, ``aggregator/manifest.json`` running, the aggregator process; at the end stop it (it
    drains, finalizes and writes ``final_summary.json``) and write the final status of both files.
    Used through :class:`TraceMLRayRun`; a plain object here, made an actor there.
    """

    def __init__(self) -> None:
        self._keeper: RunJsonKeeper | None = None
        self._identity: RunIdentity | None = None
        self._aggregator: AggregatorProcess | None = None
        self._run_dir: Path | None = None
        self._started_ns = 0
        self._telemetry: dict[str, Any] = {}

    def start(self, config: ResolvedRayConfig, *, world_size: int | None, multi_node: bool,
              command: list[str]) -> WorkerPlan:
        """Create the run folder and start the aggregator; return what the workers need.

        Args:
            config: the resolved settings.
            world_size: Ray Train workers expected (a rank that never reports is listed as
                missing); None when unknown.
            multi_node: the cluster has several nodes: bind the node IP, not 127.0.0.1.
            command: the driver's command line, for run.json and the manifest.

        Raises:
            LaunchUsageError: the run name cannot be used.
            LaunchError: the run folder cannot be created.
        """
        session_id = uuid.uuid4().hex
        secret = jobsecret.new_job_secret()
        workers = world_size or 1
        identity = RunIdentity(mode="run", command=command, session_id=session_id, nproc_per_node=workers)
        try:
            run_dir = create_run_folder(config.logs_dir, config.name).resolve()
        except ValueError as exc:
            raise LaunchUsageError(f"name: {exc}") from None
        except OSError as exc:
            raise LaunchError(f"cannot create the run folder in {config.logs_dir}: {exc.strerror or exc}") from None
        keeper = RunJsonKeeper(run_dir, config.name, config.group, list(config.tags), identity)
        keeper.start()
        self._started_ns = time.time_ns()
        write_manifest(run_dir, identity, status="running", started_at_ns=self._started_ns)
        self._keeper, self._identity, self._run_dir = keeper, identity, run_dir
        host = config.host or (_node_ip() if multi_node else LOOPBACK)
        address: str | None = None
        try:
            self._aggregator = AggregatorProcess(
                run_dir, session_id, secret=secret, host=host, port=0, world_size=world_size, exporter=config.exporter,
                export_streams=config.export_streams, exporter_hostname=config.exporter_hostname,
            )
            address = self._aggregator.address
        except (AggregatorStartError, OSError) as exc:
            self._telemetry = {"status": "degraded", "reason": f"the telemetry aggregator did not start: {exc}"}
            warn(self._telemetry["reason"] + "; training without telemetry")
        return WorkerPlan(session_id=session_id, aggregator=address, run_dir=str(run_dir), node_id=_node_id(),
                          interval=config.interval, secret=secret)

    def finish(self, exit_code: int, interrupted: bool = False, error: str | None = None) -> LaunchResult:
        """Stop the aggregator and write the final status of ``run.json`` and the manifest.

        Args:
            exit_code: 0 when the training returned, 1 when it raised, 130 when interrupted.
            interrupted: Ctrl+C or a stop from outside (status ``killed``, manifest ``interrupted``).
            error: the formatted traceback of the exception the training ended with; run.json gets
                its type and message.

        Returns:
            The run folder, the status run.json ends with and the telemetry note (empty when all
            was well).

        Raises:
            RuntimeError: :meth:`start` did not run.
        """
        keeper, identity, run_dir = self._keeper, self._identity, self._run_dir
        if keeper is None or identity is None or run_dir is None:
            raise RuntimeError("RayAggregatorHost.finish() before start()")
        telemetry = dict(self._telemetry)
        aggregator = self._aggregator
        if aggregator is not None:
            died = aggregator.exit_code()
            code = aggregator.stop()
            if died not in (None, 0) or code not in (0, None):
                telemetry = {"status": "degraded",
                             "reason": f"the telemetry aggregator exited with code {died if died else code}"}
            if telemetry and not (run_dir / "aggregator" / "final_summary.json").exists():
                # The aggregator died before its own summary: diagnose what it committed, marked partial.
                write_summary_after_crash(run_dir, str(telemetry["reason"]))
        keeper.telemetry = telemetry
        status = keeper.finish(exit_code=exit_code, interrupted=interrupted, stderr_tail=error)
        manifest_status = "interrupted" if interrupted else ("incomplete" if telemetry else "completed")
        write_manifest(run_dir, identity, status=manifest_status, started_at_ns=self._started_ns,
                       ended_at_ns=time.time_ns(), exit_code=exit_code, telemetry=telemetry or None)
        return LaunchResult(exit_code, run_dir, status, telemetry)


def _ray(module: str = "ray") -> Any:
    """A Ray module, imported on first use (Ray's own type hints are partial: it is used as Any)."""
    return importlib.import_module(module)


def _node_ip() -> str:
    return str(_ray("ray.util").get_node_ip_address())


def _node_id() -> str | None:
    try:
        return str(_ray().get_runtime_context().get_node_id())
    except Exception:  # not inside a Ray process
        return None


class TraceMLRayRun:
    """One captured Ray Train job: the aggregator actor around ``trainer.fit()`` (docs/ray.md).

    Args:
        config: the run's settings; default: everything from the environment and ``traceml.yaml``.
        scaling_config: the ``ray.train.ScalingConfig`` the trainer uses; its ``num_workers`` is
            the world size the aggregator expects. None: unknown (missing ranks are not listed).

    Use as a context manager (or :meth:`start` / :meth:`finish`). Leaving the block normally marks
    the run ``completed``; an exception marks it ``failed`` with the exception's type and message
    (the exception propagates); Ctrl+C marks it ``killed``. Either way the aggregator has written
    ``final_summary.json`` when the block ends.

    Raises:
        LaunchUsageError: from :meth:`start`, a bad setting (checked before Ray is touched).
        LaunchError: from :meth:`start`, the run folder cannot be created.
    """

    def __init__(self, config: TraceMLRayConfig | None = None, *, scaling_config: Any = None) -> None:
        self.config = config or TraceMLRayConfig()
        num_workers = getattr(scaling_config, "num_workers", None) if scaling_config is not None else None
        self.world_size: int | None = int(num_workers) if isinstance(num_workers, int) else None
        self._actor: Any = None
        self._plan: WorkerPlan | None = None
        self.result: LaunchResult | None = None

    @property
    def run_dir(self) -> Path:
        """The run folder (on the driver's node). Raises RuntimeError before :meth:`start`."""
        return Path(self._require_plan().run_dir)

    @property
    def session_id(self) -> str:
        return self._require_plan().session_id

    @property
    def address(self) -> str | None:
        """``host:port`` of the aggregator, or None when it did not start."""
        return self._require_plan().aggregator

    def _require_plan(self) -> WorkerPlan:
        if self._plan is None:
            raise RuntimeError("TraceMLRayRun is not started: use `with TraceMLRayRun(...) as run:` or run.start()")
        return self._plan

    def start(self) -> TraceMLRayRun:
        """Check the settings, start the aggregator actor and wait until it listens (≤ 120 s).

        Raises:
            LaunchUsageError, LaunchError: see the class docstring; nothing is left running.
        """
        if self._plan is not None:
            return self
        resolved = self.config.resolve()
        ray = _ray()
        if not ray.is_initialized():
            ray.init()
        alive = [node for node in ray.nodes() if node.get("Alive")]
        # No CPU: the aggregator must never take a slot a training worker needs.
        options: dict[str, Any] = {"num_cpus": 0}
        driver_node = _node_id()
        if driver_node is not None:
            # The run folder belongs on the driver's file system, where the user looks for it.
            strategies = _ray("ray.util.scheduling_strategies")
            options["scheduling_strategy"] = strategies.NodeAffinitySchedulingStrategy(node_id=driver_node, soft=False)
        actor = ray.remote(RayAggregatorHost).options(**options).remote()
        try:
            plan = ray.get(actor.start.remote(resolved, world_size=self.world_size, multi_node=len(alive) > 1,
                                              command=[sys.executable, *sys.argv]), timeout=START_TIMEOUT_S)
        except ray.exceptions.RayTaskError as exc:
            ray.kill(actor)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, LaunchError):  # the run folder could not be made: the user's one line
                raise cause from None
            raise
        except BaseException:
            ray.kill(actor)
            raise
        self._actor, self._plan = actor, plan
        return self

    def wrap(self, train_loop: Callable[..., Any]) -> Callable[..., Any]:
        """The train loop to give the trainer: ``train_loop`` under capture on every worker.

        Args:
            train_loop: the ``train_loop_per_worker`` (no argument, or the ``train_loop_config``
                dict); the wrapper takes the same arguments, so Ray Train passes the config as before.

        Returns:
            A picklable callable; its return value and exceptions are ``train_loop``'s.

        Raises:
            RuntimeError: :meth:`start` has not run (the aggregator's address is not known yet).
        """
        return TracedTrainLoop(train_loop, self._require_plan())

    def finish(self, exc: BaseException | None = None) -> LaunchResult:
        """Stop the aggregator (``final_summary.json`` written) and close the run's files.

        Args:
            exc: the exception the job ended with, if any (KeyboardInterrupt: ``killed``).

        Returns:
            The run folder, run.json's final status and the telemetry note. Idempotent. Never raises
            for a telemetry fault: an actor that is gone gives ``telemetry.status`` ``degraded``.
        """
        if self.result is not None:
            return self.result
        self._require_plan()
        ray = _ray()
        interrupted = isinstance(exc, KeyboardInterrupt)
        exit_code = 0 if exc is None else (130 if interrupted else 1)
        error = None if exc is None or interrupted else "".join(traceback.format_exception(exc))
        try:
            result: LaunchResult = ray.get(self._actor.finish.remote(exit_code, interrupted, error),
                                           timeout=FINISH_TIMEOUT_S)
        except Exception as fault:  # a lost actor must not turn the training's outcome into an error
            reason = f"the TraceML aggregator actor did not finish the run: {fault!r}"
            warn(reason)
            result = LaunchResult(exit_code, self.run_dir, None, {"status": "degraded", "reason": reason})
        finally:
            try:
                ray.kill(self._actor)
            except Exception:
                pass  # already gone
        self.result = result
        return result

    def __enter__(self) -> TraceMLRayRun:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.finish(exc)


# The variables a worker gets: the capture contract (traceml_ai.capture.session) and the rank
# identity that capture.identity reads for torchrun-style ranks.
_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
_CAPTURE_VARS = (ENV_SESSION_ID, jobsecret.ENV_JOB_SECRET, ENV_AGGREGATOR, ENV_RUN_DIR, ENV_INTERVAL, ENV_CAPTURE)


class TracedTrainLoop:
    """A Ray Train ``train_loop_per_worker`` under capture (made by :meth:`TraceMLRayRun.wrap`).

    ``__wrapped__`` is the user's loop, so Ray Train sees its signature and passes
    ``train_loop_config`` exactly when the user's loop takes it.
    """

    def __init__(self, train_loop: Callable[..., Any], plan: WorkerPlan) -> None:
        self.__wrapped__ = train_loop
        self._plan = plan

    def __call__(self, *args: Any) -> Any:
        saved = _start_worker_capture(self._plan)
        try:
            return self.__wrapped__(*args)
        finally:
            _stop_worker_capture(saved)


def _worker_identity() -> dict[str, str]:
    """This worker's rank identity from the Ray Train context, as torchrun variables."""
    context = _ray("ray.train").get_context()
    identity = {
        "RANK": context.get_world_rank(),
        "LOCAL_RANK": context.get_local_rank(),
        "WORLD_SIZE": context.get_world_size(),
        "LOCAL_WORLD_SIZE": context.get_local_world_size(),
        "GROUP_RANK": context.get_node_rank(),
    }
    return {name: str(int(value)) for name, value in identity.items()}


def _start_worker_capture(plan: WorkerPlan) -> dict[str, str | None] | None:
    """Set the worker's environment and start its capture session; return the environment to put
    back. Never raises (a fault is one ``[TraceML]`` line and the training runs uncaptured)."""
    if plan.aggregator is None:
        return None
    saved: dict[str, str | None] = {}
    try:
        values = {ENV_SESSION_ID: plan.session_id, jobsecret.ENV_JOB_SECRET: plan.secret,
                  ENV_AGGREGATOR: plan.aggregator, ENV_INTERVAL: repr(float(plan.interval)), ENV_CAPTURE: "run"}
        if plan.node_id is not None and _node_id() == plan.node_id:
            values[ENV_RUN_DIR] = plan.run_dir  # traceml_ai.Run attaches to it; other nodes cannot see it
        try:
            identity = _worker_identity()
        except Exception as exc:  # outside a Ray Train worker: whatever the environment says
            warn(f"no Ray Train context ({exc!r}); the rank identity comes from the environment")
            identity = {}
        for name, value in identity.items():
            # Ray's torch backend sets the first four already (the same values); GROUP_RANK it does not.
            if name not in os.environ:
                values[name] = value
        for name in (*_CAPTURE_VARS, *_RANK_VARS):
            if name in values:
                saved[name] = os.environ.get(name)
        running = current_session()
        if running is not None and running.config.session_id != plan.session_id:
            running.close()  # a session of an earlier job in this (reused) worker process
        os.environ.update(values)
        start_from_env()
        session = current_session()
        if session is not None:
            steps.prepare(session)  # torch is imported: time the first step's DataLoader fetch too
    except Exception as exc:
        warn(f"telemetry capture is off in this Ray worker: {exc!r}")
    return saved


def _stop_worker_capture(saved: dict[str, str | None] | None) -> None:
    """Close this worker's capture session (last collect, ``rank_finished``) and put the
    environment back. Never raises."""
    if saved is None:
        return
    try:
        session = current_session()
        if session is not None:
            session.close()
    except Exception as exc:
        warn(f"telemetry shutdown failed in this Ray worker: {exc!r}")
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
