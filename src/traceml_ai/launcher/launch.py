"""Start a training under capture and return its exit code (DESIGN §2.1, §3; issue: capture).

``traceml run SCRIPT`` and ``traceml watch SCRIPT`` call :func:`launch`; ``traceml serve`` calls
:func:`serve`. The training runs as ``python -m traceml_ai.capture.bootstrap SCRIPT ARGS`` (one
process) or under ``torch.distributed.run -m traceml_ai.capture.bootstrap`` (several), with the
environment that tells each rank where the aggregator listens:

==========================  ===========================================================
``TRACEML_SESSION_ID``      frames of any other session are refused by the aggregator
``TRACEML_JOB_SECRET``      the job secret every rank's hello proves it holds (:func:`job_secret_for`)
``TRACEML_AGGREGATOR``      ``host:port`` of the aggregator
``TRACEML_AGGREGATOR_STARTING`` ``1`` when the training starts before the aggregator listens (one
                            node, no exporter: the launcher bound the socket); a rank's first
                            connection then waits for the welcome even past its close deadline
``TRACEML_RUN_DIR``         the run folder (``traceml_ai.Run`` attaches to it; node 0 only)
``TRACEML_INTERVAL``        sampling interval in seconds
``TRACEML_CAPTURE``         ``run`` (step timing + samplers) or ``watch`` (samplers and output only)
==========================  ===========================================================

Telemetry never changes the training's result: if the aggregator cannot start or dies, the
training still runs to its own end and exit code, and the run says telemetry was degraded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from traceml_ai.capture import jobsecret  # the job secret helpers (DESIGN §1: via capture)
from traceml_ai.launcher.aggregator_process import AggregatorProcess, AggregatorStartError
from traceml_ai.launcher.runfolder import (
    CRASH_SIGNALS,
    RunIdentity,
    RunJsonKeeper,
    create_run_folder,
    write_manifest,
)
from traceml_ai.runs.safeio import read_regular

Mode = Literal["run", "watch"]

DEFAULT_EXPORT_STREAMS = "step_time"
"""``traceml_ai.aggregator.export.streams.DEFAULT_EXPORT_STREAMS`` (a test keeps them equal). The
export and finalize modules are imported only where used: ``traceml run`` starts the training sooner
without them (issue 14, item 1)."""

INTERRUPT_GRACE_S = 2.0
"""After Ctrl+C, how long the training gets to stop on its own before SIGINT is forwarded to it."""
TERMINATE_GRACE_S = 15.0
"""After the forwarded signal, how long before SIGTERM and then SIGKILL."""
STDERR_TAIL_LINES = 40
MIN_INTERVAL_S = 0.01
"""Shorter sampling intervals turn the sampler thread into a busy loop that slows the training."""
MAX_INTERVAL_S = 3600.0


class LaunchError(Exception):
    """A launch cannot start (bad script path, bad option); ``str()`` is one line for the user."""


class LaunchUsageError(LaunchError):
    """A bad option value (count, rank, port, interval): the command exits 2, as for any bad flag."""


@dataclass
class LaunchOptions:
    """What ``traceml run`` / ``traceml watch`` start.

    Args:
        script: the training script's path; ``args`` its arguments.
        module: run this module instead (``python -m MODULE ARGS``); ``script`` is then ignored.
        mode: ``run`` (full capture) or ``watch`` (no step timing: system, process, environment, output).
        logs_dir: where the run folder is created (``<logs_dir>/<YYYYMMDD-HHMMSS>_<name>_<hex4>``).
        name, group, tags: the run's labels (name defaults to the script's file stem).
        interval: sampling interval in seconds.
        nproc_per_node: processes per node (> 1 uses ``torch.distributed.run``).
        nnodes, node_rank, master_addr, master_port: several nodes; the aggregator runs on node 0
            and listens on ``master_addr:aggregator_port`` (default ``master_port + 1``).
        session_id: shared by every node of a job (default: derived from master address, port and
            name for several nodes, random for one).
        disable: run the training plainly, no TraceML at all.
        exporter, export_streams, exporter_hostname: the export settings (000 seed, DESIGN §3.4) for
            ``run``; ``watch`` has no exporter and ignores them.
    """

    script: str
    args: list[str] = field(default_factory=list)
    mode: Mode = "run"
    module: str | None = None
    logs_dir: str = "traceml/runs"
    name: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    interval: float = 1.0
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    aggregator_port: int | None = None
    session_id: str | None = None
    disable: bool = False
    exporter: str | None = None
    export_streams: str = DEFAULT_EXPORT_STREAMS
    exporter_hostname: bool = False

    @property
    def distributed(self) -> bool:
        return self.nproc_per_node > 1 or self.nnodes > 1

    @property
    def run_name(self) -> str:
        if self.module:
            return self.name or self.module.rsplit(".", 1)[-1] or "run"
        return self.name or Path(self.script).stem or "run"

    @property
    def target(self) -> list[str]:
        """What follows the interpreter: ``[SCRIPT, *ARGS]`` or ``["-m", MODULE, *ARGS]``."""
        return ["-m", self.module, *self.args] if self.module else [self.script, *self.args]


@dataclass
class Tick:
    """What a live view is given every half second while the training runs."""

    run_dir: Path | None
    started: float
    aggregator_alive: bool


@dataclass
class LaunchResult:
    """How a launched training ended.

    Attributes:
        exit_code: the training's exit code (128 + N when signal N ended it).
        run_dir: the run folder (None on nodes other than 0 and with ``disable``).
        status: the status run.json ended with (completed / failed / killed), or None.
        telemetry: a note when telemetry was degraded (empty when all was well).
    """

    exit_code: int
    run_dir: Path | None
    status: str | None
    telemetry: dict[str, Any]


def _submodule(name: str, folders: list[str]) -> tuple[list[str] | None, str | None] | None:
    """Where ``import parent.name`` finds ``name`` in its parent's ``folders``, as the path finder
    does (a package folder with an ``__init__``, else a module file, in folder order; else the
    folders without ``__init__`` together, a namespace package): ``(its folders, None for a
    module; its file, None for a namespace)``, or None when it is not there."""
    import importlib.machinery

    suffixes = importlib.machinery.all_suffixes()
    portions: list[str] = []
    for folder in folders:
        base = os.path.join(folder, name)
        if os.path.isdir(base):
            init = next((os.path.join(base, "__init__" + s) for s in suffixes
                         if os.path.isfile(os.path.join(base, "__init__" + s))), None)
            if init is not None:
                return [base], init
            portions.append(base)
            continue
        module = next((base + s for s in suffixes if os.path.isfile(base + s)), None)
        if module is not None:
            return None, module
    return (portions, None) if portions else None


def _may_extend_path(origin: str | None) -> bool:
    """Whether a package's ``__init__`` at ``origin`` may change where its submodules are: it is
    not Python source, or it mentions ``__path__``."""
    if origin is None:
        return False  # a namespace package has no code
    if not origin.endswith(".py"):
        return True
    return "__path__" in Path(origin).read_text(errors="replace")


def missing_module(module: str, cwd: str | None = None) -> str | None:
    """The first dotted part of ``module`` that ``python -m module``, started in ``cwd`` (default: the
    current folder) with this interpreter and environment, certainly cannot find, e.g. ``pkg`` for
    ``pkg.nosuch`` without a ``pkg``, or ``pkg.__main__`` for a package that has none (``python -m``
    cannot run it); None when it is found, or when that cannot be told for sure.

    Nothing is imported or run: the top-level name is looked up with this process's import finders
    (``sys.meta_path``, so editable installs count) over the child's path (its folder first, as
    ``python -m`` puts it, then this process's path), each submodule in its parent package's folders.
    A parent whose ``__init__`` mentions ``__path__`` (it may extend where its submodules are), or is
    not Python source, is not searched: its submodules are left to the child to find.
    """
    import importlib.machinery

    search = [cwd or os.getcwd(), *sys.path[1:]]
    parts = [*module.split("."), "__main__"]  # a package runs its __main__; a module stops before it
    try:
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is not None:
                spec = find(parts[0], search if finder is importlib.machinery.PathFinder else None)
                if spec is not None:
                    break
        if spec is None:
            return parts[0]
        found = spec.submodule_search_locations
        # A namespace package's path lists its folders without importing it (iterating the path
        # itself would look its parent up in sys.modules).
        folders = None if found is None else list(getattr(found, "_path", None) or found)
        origin = spec.origin if spec.has_location else None
        if folders is not None and spec.origin is not None and not spec.has_location:
            return None  # a package from a custom finder: its submodules are its own
        for i in range(1, len(parts)):
            if folders is None:
                # A plain module has no submodules; it is what runs when nothing is asked of it.
                return None if parts[i] == "__main__" else ".".join(parts[: i + 1])
            if _may_extend_path(origin):
                return None
            where = _submodule(parts[i], folders)
            if where is None:
                return ".".join(parts[: i + 1])
            folders, origin = where
    except Exception:  # a finder that fails, an unreadable __init__: the child will tell
        return None
    return None


def validate(options: LaunchOptions) -> None:
    """Check options before anything starts.

    Raises:
        LaunchError: the script, or the module of ``-m``, is missing, or a count/rank/port/interval
            is out of range.
    """
    script = Path(options.script)
    if options.module is not None:
        if not options.module or options.module.startswith("-"):
            raise LaunchUsageError(f"-m needs a module name, not {options.module!r}")
        missing = missing_module(options.module)
        if missing == f"{options.module}.__main__":
            raise LaunchError(f"{options.module} is a package without __main__.py: name its module to run "
                              f"(traceml run -m {options.module}.train, say)")
        if missing is not None:
            raise LaunchError(f"no such training module: {options.module} (no module named {missing!r} in "
                              "the current folder or on the Python path)")
    elif script.is_dir():
        raise LaunchError(f"{options.script} is a folder, not a training script")
    elif not script.is_file():
        raise LaunchError(f"no such training script: {options.script}")
    if options.nproc_per_node < 1 or options.nnodes < 1:
        raise LaunchUsageError("--nproc-per-node and --nnodes must be 1 or more")
    if not 0 <= options.node_rank < options.nnodes:
        raise LaunchUsageError(f"--node-rank must be between 0 and {options.nnodes - 1}")
    if not 0 < options.master_port < 65535:
        raise LaunchUsageError("--master-port must be between 1 and 65534")
    if not MIN_INTERVAL_S <= options.interval <= MAX_INTERVAL_S:
        raise LaunchUsageError(f"--interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S:g} seconds")
    if options.mode == "run" and not options.disable:
        check_export(options.exporter, options.export_streams)


def check_export(exporter: str | None, export_streams: str) -> None:
    """Check the export settings before anything starts (000 seed): ``export_streams`` names only
    known streams, and ``exporter`` has the form ``jsonl``, ``otlp`` or ``module:factory``. Only
    the form: the module is never imported here (the aggregator imports it).

    Raises:
        LaunchUsageError: the same one-line message the aggregator would give (exit 2).
    """
    if exporter is None and export_streams == DEFAULT_EXPORT_STREAMS:
        return  # nothing to export, and the default names a known stream
    from traceml_ai.aggregator.export.factory import check_exporter_form
    from traceml_ai.aggregator.export.streams import parse_export_streams

    try:
        parse_export_streams(export_streams)
        if exporter is not None:
            check_exporter_form(exporter)
    except ValueError as exc:
        raise LaunchUsageError(str(exc)) from None


def session_id_for(options: LaunchOptions) -> str:
    """The session id: given, derived (several nodes: every node must agree) or random."""
    if options.session_id:
        return options.session_id
    if options.nnodes > 1:
        key = f"{options.master_addr}:{options.master_port}:{options.run_name}"
        return "job-" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return uuid.uuid4().hex


USER_KEY_NAME = "job.key"


def user_key_path(environ: dict[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME/traceml/job.key`` (default ``~/.config/traceml/job.key``): the user's
    own key from which a multi-node job's secret is derived when ``TRACEML_JOB_SECRET`` is unset."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "traceml" / USER_KEY_NAME


def _user_key(path: Path) -> bytes:
    """The user key at ``path``, created (mode 0600, in a 0700 folder) when missing.

    Raises:
        LaunchError: the key cannot be read or created, or others can read it (a key any local
            user can read proves nothing).
    """
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():
            _publish_new_key(path)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat_is_private(info):
                raise LaunchError(f"{path} can be read by other users or is not a regular file of yours; "
                                  "run `chmod 600` on it, or set TRACEML_JOB_SECRET")
            key = handle.read(4096).strip()
    except OSError as exc:
        raise LaunchError(f"cannot use the job key {path}: {exc.strerror or exc}; set TRACEML_JOB_SECRET") from None
    if len(key) < jobsecret.MIN_JOB_SECRET_CHARS:
        raise LaunchError(f"the job key {path} is too short; delete it (a new one is made) or set TRACEML_JOB_SECRET")
    return key


def _publish_new_key(path: Path) -> None:
    """Create the key at ``path`` whole, or leave the one another launcher made first.

    The key is written to a private temporary file beside it and hard-linked into place: the link
    fails when the name exists, so two nodes starting at once on a shared home folder agree on one
    key, and neither ever reads a key that is still being written (an empty read failed node 0
    while node 1 waited at the rendezvous).
    """
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(jobsecret.new_job_secret() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)


def stat_is_private(info: os.stat_result) -> bool:
    """True for a regular file owned by this user that neither group nor others can read or write."""
    import stat

    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def job_secret_for(options: LaunchOptions, session_id: str, environ: dict[str, str] | None = None) -> str:
    """The job secret (DESIGN §3.1; :mod:`traceml_ai.telemetry.jobsecret`), in this order:

    1. ``TRACEML_JOB_SECRET`` from the environment (set by the user or the scheduler; every node
       of a multi-node job must get the same value);
    2. one node: a fresh random secret;
    3. several nodes: ``HMAC-SHA256(user key, session id)`` with the user's own key file
       (:func:`user_key_path`, mode 0600): every node that shares the home folder (as cluster
       nodes usually do) derives the same secret, and no other user can.

    Raises:
        LaunchUsageError: ``TRACEML_JOB_SECRET`` is set but too short.
        LaunchError: the user key cannot be used (multi-node without ``TRACEML_JOB_SECRET``).
    """
    env = os.environ if environ is None else environ
    given = env.get(jobsecret.ENV_JOB_SECRET)
    if given:
        try:
            return jobsecret.check_job_secret(given)
        except ValueError as exc:
            raise LaunchUsageError(str(exc)) from None
    if options.nnodes == 1:
        return jobsecret.new_job_secret()
    key = _user_key(user_key_path(dict(env)))
    return hmac.new(key, b"traceml-job-secret\0" + session_id.encode(), hashlib.sha256).hexdigest()


def training_command(options: LaunchOptions) -> list[str]:
    """The command line of the training (under the capture bootstrap unless ``disable``)."""
    target = options.target
    if not options.distributed:
        if options.disable:
            return [sys.executable, *target]
        return [sys.executable, "-m", "traceml_ai.capture.bootstrap", *target]
    # Under TraceML, torchrun through a wrapper whose stop by Ctrl+C is one line, not 70 lines of tracebacks.
    runner = "torch.distributed.run" if options.disable else "traceml_ai.launcher.torchrun"
    cmd = [sys.executable, "-m", runner, "--nproc-per-node", str(options.nproc_per_node)]
    if options.nnodes == 1:
        cmd.append("--standalone")  # a free rendezvous port: two jobs on one machine never collide
    else:
        cmd += ["--nnodes", str(options.nnodes), "--node-rank", str(options.node_rank),
                "--master-addr", options.master_addr, "--master-port", str(options.master_port)]
    if options.disable:
        return [*cmd, *target]
    return [*cmd, "-m", "traceml_ai.capture.bootstrap", *target]


OutputHandler = Callable[[str, str], None]
"""Called with (``"stdout"`` | ``"stderr"``, line without its newline) for each line of the training."""


def launch(
    options: LaunchOptions,
    on_tick: Callable[[Tick], None] | None = None,
    on_output: OutputHandler | None = None,
) -> LaunchResult:
    """Run the training under capture; return when it and the aggregator have finished.

    With ``on_output`` the training's stdout and stderr are pipes whose lines go to that callback
    (the live terminal view prints them above itself), and ``PYTHONUNBUFFERED=1`` keeps them live;
    without it the training writes straight to the terminal.

    Raises:
        LaunchError: see :func:`validate`, or the run folder cannot be created.
    """
    validate(options)
    command = training_command(options)
    if options.disable:
        code = _run_plain(command)
        return LaunchResult(code, None, None, {})

    session_id = session_id_for(options)
    secret = job_secret_for(options, session_id)
    identity = RunIdentity(
        mode=options.mode, command=[sys.executable, *options.target], session_id=session_id,
        job_id=session_id if options.nnodes > 1 else None, nnodes=options.nnodes, node_rank=options.node_rank,
        nproc_per_node=options.nproc_per_node,
    )
    env = dict(os.environ)
    env.update(TRACEML_SESSION_ID=session_id, TRACEML_JOB_SECRET=secret, TRACEML_INTERVAL=repr(float(options.interval)),
               TRACEML_CAPTURE=options.mode)
    env.pop("TRACEML_DISABLE", None)
    agg_port = options.aggregator_port if options.aggregator_port is not None else options.master_port + 1
    telemetry: dict[str, Any] = {}

    if options.node_rank > 0:
        # Other nodes only train; their ranks report to the aggregator on node 0.
        env["TRACEML_AGGREGATOR"] = f"{options.master_addr}:{agg_port}"
        env.pop("TRACEML_RUN_DIR", None)
        code, _ = _supervise(command, env, None, None, on_tick, on_output, telemetry)
        return LaunchResult(code, None, None, telemetry)

    try:
        run_dir = create_run_folder(options.logs_dir, options.run_name).resolve()
    except ValueError as exc:  # the run name (--name, or the script's stem) is not usable
        raise LaunchUsageError(f"--name: {exc}") from None
    except OSError as exc:
        raise LaunchError(f"cannot create the run folder in {options.logs_dir}: {exc.strerror or exc}") from None
    keeper = RunJsonKeeper(run_dir, options.run_name, options.group, list(options.tags), identity)
    keeper.start()
    started_ns = time.time_ns()
    keeper.guard(write_manifest, run_dir, identity, status="running", started_at_ns=started_ns)
    env["TRACEML_RUN_DIR"] = str(run_dir)

    aggregator: AggregatorProcess | None = None
    host = "127.0.0.1" if options.nnodes == 1 else options.master_addr
    try:
        try:
            export = options.mode == "run" and options.exporter is not None
            # One node, no exporter: the training starts while the aggregator starts, on a socket
            # bound here. An exporter's factory runs before the aggregator listens and may fail or
            # hang, and other nodes' ranks connect by name: then the training waits for it, as before.
            early = options.nnodes == 1 and not export
            aggregator = AggregatorProcess(run_dir, session_id, secret=secret, host=host,
                                           port=0 if options.nnodes == 1 else agg_port,
                                           world_size=identity.world_size,
                                           exporter=options.exporter if export else None,
                                           export_streams=options.export_streams,
                                           exporter_hostname=options.exporter_hostname,
                                           listen_early=early,
                                           on_start_failure=lambda why: _warn(
                                               f"the telemetry aggregator did not start: {why}; "
                                               "the training runs on without telemetry"))
            env["TRACEML_AGGREGATOR"] = aggregator.address
            if early:  # the ranks' first connection waits for it (capture.session.FIRST_WELCOME_WAIT_S)
                env["TRACEML_AGGREGATOR_STARTING"] = "1"
        except (AggregatorStartError, OSError) as exc:
            telemetry = {"status": "degraded", "reason": f"the telemetry aggregator did not start: {exc}"}
            _warn(telemetry["reason"] + "; training without telemetry")
            env.pop("TRACEML_AGGREGATOR", None)
            env.pop("TRACEML_AGGREGATOR_STARTING", None)
        code, interrupted = _supervise(command, env, run_dir, aggregator, on_tick, on_output, telemetry)
    except KeyboardInterrupt:
        # Ctrl+C while the aggregator or the training was starting: nothing may be left behind.
        code, interrupted = 130, True

    if aggregator is not None and aggregator.start_failure is not None:
        # Started early but never listened: as if it had not started (nothing of it to finalize).
        aggregator.stop(timeout=5)
        telemetry = {"status": "degraded", "reason": f"the telemetry aggregator did not start: "
                                                     f"{aggregator.start_failure}"}
        aggregator = None
    if aggregator is not None:
        died = aggregator.exit_code()
        agg_code = aggregator.stop()
        if died is not None and died != 0:
            telemetry.setdefault("status", "degraded")
            telemetry.setdefault("reason", f"the telemetry aggregator exited with code {died} during the run")
        elif agg_code not in (0, None) and not telemetry:
            telemetry = {"status": "degraded", "reason": f"the telemetry aggregator exited with code {agg_code}"}
        if telemetry.get("status") == "degraded" and not (run_dir / "aggregator" / "final_summary.json").exists():
            from traceml_ai.aggregator.finalize import write_summary_after_crash

            # The aggregator died before its own summary: diagnose what it committed, marked partial.
            keeper.guard(write_summary_after_crash, run_dir,
                         str(telemetry.get("reason", "the telemetry aggregator died")))
        if telemetry.get("status") == "degraded":
            keeper.guard(record_losses_after_crash, run_dir,
                         str(telemetry.get("reason", "the telemetry aggregator died")), session_id=session_id)
    signal_name = _signal_name(code)
    keeper.telemetry = telemetry
    status = keeper.finish(exit_code=code, signal_name=signal_name, interrupted=interrupted,
                           stderr_tail=_stderr_tail(run_dir))
    if keeper.write_errors:
        # A full disk or read-only folder: recorded wherever it can still be written, and printed.
        telemetry.setdefault("status", "degraded")
        telemetry.setdefault("reason", f"{keeper.write_errors} write(s) to the run folder failed: {keeper.last_error}")
        telemetry["run_folder_write_errors"] = keeper.write_errors
    # The session's lifecycle (004 seed): stopped from outside → interrupted; telemetry lost →
    # incomplete; a training that failed or crashed did not run to its end either → interrupted.
    stopped = interrupted or (signal_name is not None and signal_name not in CRASH_SIGNALS)
    if stopped:
        manifest_status = "interrupted"
    elif telemetry:
        manifest_status = "incomplete"
    else:
        manifest_status = "completed" if code == 0 else "interrupted"
    keeper.guard(write_manifest, run_dir, identity, status=manifest_status, started_at_ns=started_ns,
                 ended_at_ns=time.time_ns(), exit_code=code, telemetry=telemetry or None)
    return LaunchResult(code, run_dir, status, telemetry)


def _run_plain(command: list[str]) -> int:
    proc = subprocess.Popen(command)
    code, _ = _wait(proc, None, None, None, {})
    return code


def _supervise(
    command: list[str],
    env: dict[str, str],
    run_dir: Path | None,
    aggregator: AggregatorProcess | None,
    on_tick: Callable[[Tick], None] | None,
    on_output: OutputHandler | None,
    telemetry: dict[str, Any],
) -> tuple[int, bool]:
    pipes: dict[str, Any] = {}
    if on_output is not None:
        env = {**env, "PYTHONUNBUFFERED": "1"}
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    try:
        proc = subprocess.Popen(command, env=env, **pipes)
    except OSError as exc:
        raise LaunchError(f"cannot start the training: {exc}") from None
    pumps = []
    if on_output is not None:
        for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            t = threading.Thread(target=_pump, args=(stream, name, on_output), name=f"traceml-{name}", daemon=True)
            t.start()
            pumps.append(t)
    result = _wait(proc, run_dir, aggregator, on_tick, telemetry)
    for t in pumps:
        t.join()  # the pipes end when every process holding them has exited: every line is shown
    return result


def _pump(stream: Any, name: str, on_output: OutputHandler) -> None:
    """Hand each line of one of the training's pipes to ``on_output``; never stop reading (a full
    pipe would block the training), whatever the handler does."""
    for raw in iter(stream.readline, b""):
        try:
            on_output(name, raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        except Exception:
            pass
    stream.close()


def _wait(
    proc: subprocess.Popen[bytes],
    run_dir: Path | None,
    aggregator: AggregatorProcess | None,
    on_tick: Callable[[Tick], None] | None,
    telemetry: dict[str, Any],
) -> tuple[int, bool]:
    """Wait for the training; forward Ctrl+C / SIGTERM; return (exit code, interrupted)."""
    started = time.time()
    interrupted = False
    previous_term = _catch_sigterm()
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
            except KeyboardInterrupt:
                interrupted = True
                code = _stop_training(proc, signal.SIGINT)
                break
            except _Terminated:
                interrupted = True
                code = _stop_training(proc, signal.SIGTERM, grace=0.0)
                break
            if aggregator is not None and aggregator.exit_code() is not None and "status" not in telemetry:
                telemetry.update(status="degraded",
                                 reason=f"the telemetry aggregator exited with code {aggregator.exit_code()} "
                                        "during the run")
                _warn(telemetry["reason"] + "; the training goes on")
            if on_tick is not None:
                try:
                    on_tick(Tick(run_dir, started, aggregator is not None and aggregator.exit_code() is None))
                except Exception as exc:  # a broken live view must not stop the training
                    _warn(f"live view stopped: {exc}")
                    on_tick = None
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    return (128 - code if code < 0 else code), interrupted


class _Terminated(Exception):
    pass


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def _catch_sigterm() -> Any:
    try:
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread
        return signal.getsignal(signal.SIGTERM)


def _stop_training(proc: subprocess.Popen[bytes], sig: signal.Signals, grace: float = INTERRUPT_GRACE_S) -> int:
    """Stop the training after Ctrl+C (which usually reached it too) or SIGTERM (which did not)."""
    steps: list[tuple[signal.Signals | None, float]] = [
        (None, grace), (sig, TERMINATE_GRACE_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)
    ]
    for to_send, wait_s in steps:
        if to_send is not None:
            try:
                proc.send_signal(to_send)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                return proc.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
            except KeyboardInterrupt:
                continue  # a second Ctrl+C: go on with the next, firmer step
    return proc.wait()


def _signal_name(code: int) -> str | None:
    if code > 128:
        try:
            return signal.Signals(code - 128).name
        except ValueError:
            return None
    return None


def _stderr_tail(run_dir: Path) -> str | None:
    """The last stderr lines of rank 0 from its captured log (``stderr | text`` lines)."""
    log = run_dir / "aggregator" / "rank_0.log"
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 256 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    lines = [ln[len("stderr | "):] for ln in text.splitlines() if ln.startswith("stderr | ")]
    return "\n".join(lines[-STDERR_TAIL_LINES:]) + "\n" if lines else None


def _warn(message: str) -> None:
    print(f"[TraceML] {message}", file=sys.stderr, flush=True)


RANK_LOSSES_DIR = os.path.join("aggregator", "rank_losses")
"""Where ranks write the losses their aggregator never heard of (``capture.session.RANK_LOSSES_DIR``)."""


def record_losses_after_crash(run_dir: str | Path, reason: str, *, session_id: str | None = None) -> Path | None:
    """After the aggregator died: put in ``finalization_warning.json`` what only the ranks know (issue
    12 point 12), the batches each rank could not deliver, from the ``rank_<g>.json`` files they
    wrote, and ``reason``. Merged into the file when the aggregator wrote one.

    Returns the file's path, or None when there is nothing to add or it cannot be written (one
    ``[TraceML]`` line on stderr; never raises).
    """
    from traceml_ai.aggregator.finalize import WARNING_NAME, WARNING_SCHEMA_VERSION, write_json_atomic

    folder = Path(run_dir)
    reports: dict[str, dict[str, Any]] = {}
    try:
        names = sorted(os.listdir(folder / RANK_LOSSES_DIR))
    except OSError:
        names = []
    for name in names[:4096]:
        if not (name.startswith("rank_") and name.endswith(".json")):
            continue
        try:
            record = json.loads(read_regular(folder / RANK_LOSSES_DIR / name, 64 * 1024))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            reports[name[len("rank_"):-len(".json")]] = record
    target = folder / "aggregator" / WARNING_NAME
    report: dict[str, Any]
    try:
        existing = json.loads(read_regular(target))
        report = existing if isinstance(existing, dict) else {}
    except (OSError, ValueError):
        report = {}
    if not report:
        report = {"schema_version": WARNING_SCHEMA_VERSION, "session_id": session_id, "summary": []}
    summary = report.setdefault("summary", [])
    if not isinstance(summary, list):
        summary = report["summary"] = []
    summary.append(f"the telemetry aggregator died: {reason}")
    undelivered = report.setdefault("undelivered_batches", {})
    for rank, record in reports.items():
        dropped = record.get("dropped_batches")
        submitted = record.get("submitted_batches")
        if isinstance(dropped, int) and dropped > 0 and isinstance(undelivered, dict):
            undelivered[rank] = dropped
            summary.append(f"rank {rank}: {dropped} of {submitted} batches were not delivered (the rank's own count)")
    report["aggregator_died"] = {"reason": reason, "rank_reports": reports}
    report["written_at_unix_ns"] = time.time_ns()
    try:
        write_json_atomic(target, report)
    except (OSError, ValueError) as exc:
        print(f"[TraceML] cannot write {target}: {exc}", file=sys.stderr, flush=True)
        return None
    return target
