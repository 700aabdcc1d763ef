"""``python -m traceml_ai.aggregator``: the aggregator process of one job (DESIGN §1, §3).

    python -m traceml_ai.aggregator --run-dir DIR --session-id ID [--host 127.0.0.1] [--port 0 | --listen-fd FD]
                                    [--world-size N] [--exporter jsonl|otlp|module:factory]
                                    [--export-streams step_time,...] [--exporter-hostname]

The job secret comes only from the environment, ``TRACEML_JOB_SECRET`` (never from the command
line, which every local user can read with ``ps``); without it the aggregator does not start
(exit 2). Every rank's hello must prove it holds the same secret.

With ``--listen-fd`` it serves a TCP socket its parent bound and put in listening state (``traceml
run`` does, so it can start the training at once: the ranks' connections wait in that socket's
queue until the aggregator accepts them).

Once listening it prints exactly one line ``TRACEML_AGGREGATOR_LISTENING <host> <port>`` on stdout
(the launcher reads it). It runs until SIGTERM or SIGINT, then stops accepting, gives connected
ranks up to 2 s to finish sending, flushes the store, writes ``finalization_warning.json`` when
something was lost, and exits 0. Errors are one ``[TraceML]`` line on stderr: exit 1 for a failure
(e.g. the port is taken), 2 for bad usage (including a missing or too short
``TRACEML_JOB_SECRET``, an ``--exporter`` of the wrong form or an
unknown ``--export-streams`` name when an exporter is set).

With ``--exporter`` the exporter is made on the main thread before the export worker thread starts
(000 seed, "Custom exporters"); every admitted payload also goes to that worker, and at the end
``finalization_warning.json`` gets its ``export`` block when the export lost something.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from traceml_ai.aggregator.export.factory import make_export_worker
from traceml_ai.aggregator.export.worker import ExportWorker
from traceml_ai.aggregator.finalize import finalize, write_json_atomic
from traceml_ai.aggregator.server import Aggregator, PayloadSink
from traceml_ai.aggregator.stats import IngestStats
from traceml_ai.telemetry import jobsecret

LISTENING = "TRACEML_AGGREGATOR_LISTENING"
GRACE_S = 2.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"[TraceML] aggregator: {message} (see --help)", file=sys.stderr, flush=True)
        raise SystemExit(2)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535, 0 picks a free one)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m traceml_ai.aggregator",
        description="Receive TraceML telemetry frames of one job and write <run-dir>/aggregator/telemetry.sqlite.",
        epilog="example: python -m traceml_ai.aggregator --run-dir traceml/runs/20261130-101500_demo_a3f9 "
        "--session-id 3f2a9c --world-size 2",
    )
    parser.add_argument("--run-dir", required=True, type=Path, help="the run folder (must exist)")
    parser.add_argument("--session-id", required=True, help="the session id every rank's hello must carry")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", default=0, type=_port, help="TCP port (default 0: a free one)")
    parser.add_argument("--listen-fd", type=int, default=None,
                        help="serve this inherited listening TCP socket instead of binding --host/--port")
    parser.add_argument("--world-size", type=_positive, default=None, help="expected number of ranks")
    parser.add_argument("--exporter", default=None, help="export records with jsonl, otlp or module:factory")
    parser.add_argument("--export-streams", default="step_time",
                        help="exported streams, comma separated: step_time, step_memory, process, system, all")
    parser.add_argument("--exporter-hostname", action="store_true", help="keep the hostname field in exports")
    return parser


async def serve(
    run_dir: Path,
    session_id: str,
    *,
    secret: str,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    world_size: int | None = None,
    payload_sinks: Sequence[PayloadSink] = (),
    export: ExportWorker | None = None,
    on_finalized: Callable[[Path, IngestStats], None] | None = None,
    stop: asyncio.Event | None = None,
    grace_s: float = GRACE_S,
) -> Path | None:
    """Run one aggregator until ``stop`` is set (default: SIGTERM or SIGINT), then finalize.

    Prints the ``TRACEML_AGGREGATOR_LISTENING <host> <port>`` line once listening. Returns the
    path of ``finalization_warning.json`` when one was written, else None. ``export`` (not yet
    started) is started here, given every admitted payload, and closed after the last one.

    Raises:
        OSError: ``aggregator/`` cannot be created or the address cannot be bound.
    """
    agg = Aggregator(run_dir, session_id, secret=secret, host=host, port=port, sock=sock, world_size=world_size,
                     payload_sinks=payload_sinks, frame_sinks=[export.submit_frame] if export is not None else [])
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    if export is not None:
        export.set_busy(lambda: agg.store.backlog() > 0)  # ingest first (export worker module doc)
        export.start()
    try:
        bound_host, bound_port = await agg.start()
    except BaseException:
        if export is not None:
            await asyncio.to_thread(export.close)
        raise
    try:
        print(f"{LISTENING} {bound_host} {bound_port}", flush=True)
    except OSError:
        # The launcher died while this aggregator was starting on the socket it bound (--listen-fd):
        # nobody reads the line, but its ranks still send. Serve them; stdout goes nowhere from now.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    orphan: dict[str, Any] = {}
    watcher = asyncio.ensure_future(_stop_when_orphaned(stop, agg, orphan))
    await stop.wait()
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    await agg.stop(grace_s=grace_s)
    if export is not None:
        await asyncio.to_thread(export.close)  # after the store: every admitted payload was submitted
    source = "argument" if world_size is not None else ("hello" if agg.expected_world_size is not None else None)
    extra: dict[str, dict[str, Any]] = {}
    if export is not None:
        extra["export"] = export.report()
    if orphan:
        orphan["finalized_at_unix_ns"] = time.time_ns()
        extra["launcher"] = orphan
    if agg.stats.refused_connections:
        # Someone tried to send telemetry without the job secret: say so where the user looks.
        print(f"[TraceML] aggregator: refused {agg.stats.refused_connections} connections that could not prove they "
              "belong to this job (see aggregator/finalization_warning.json)", file=sys.stderr, flush=True)
    written = finalize(
        run_dir,
        agg.stats,
        agg.store_stats,
        session_id=session_id,
        world_size=agg.expected_world_size,
        world_size_source=source,
        extra=extra or None,
        extra_lost=(export is not None and export.lost) or bool(orphan),
        on_finalized=None if on_finalized is None else (lambda folder: on_finalized(folder, agg.stats)),
    )
    if orphan:
        _close_manifest_of_dead_launcher(run_dir)
    return written


def _close_manifest_of_dead_launcher(run_dir: Path) -> None:
    """The launcher died, so nobody else will end ``aggregator/manifest.json``: mark a ``running``
    manifest ``incomplete`` with the time and why (never raises; one line on failure)."""
    path = run_dir / "aggregator" / "manifest.json"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return
            manifest = json.loads(handle.read(1 << 20))
        if not isinstance(manifest, dict) or manifest.get("status") != "running":
            return
        manifest.update(status="incomplete", ended_at_ns=time.time_ns(),
                        telemetry={"status": "degraded", "reason": "the launcher died during the run; the "
                                   "aggregator collected telemetry until the ranks finished"})
        write_json_atomic(path, manifest)
    except (OSError, ValueError) as exc:
        print(f"[TraceML] aggregator: cannot close {path}: {exc}", file=sys.stderr, flush=True)


ORPHAN_CHECK_S = 1.0
ORPHAN_IDLE_S = 5.0
"""After the launcher died: how long no rank may be connected before the aggregator finalizes
(a rank between two connections reconnects well within it)."""
ORPHAN_NO_RANK_S = 60.0
"""After the launcher died: how long to wait for a first rank when none has connected yet."""


async def _stop_when_orphaned(stop: asyncio.Event, agg: Aggregator, record: dict[str, Any]) -> None:
    """Once the process that started this aggregator is gone, stop (and finalize) when its ranks
    are done: no rank connected for :data:`ORPHAN_IDLE_S` seconds (all finished or disconnected).

    The launcher starts the aggregator in its own session so that Ctrl+C reaches the training
    only; if the launcher itself is killed (SIGKILL, OOM, a scheduler), nobody would send SIGTERM.
    Its parent changing (re-parented to init or a subreaper) means the launcher died; the training
    it started usually goes on, so the aggregator keeps collecting until the ranks end, and
    ``record`` (the ``launcher`` block of ``finalization_warning.json``) says what happened.
    """
    # The launcher says who it is: started early (--listen-fd), this process may only now look, after
    # the launcher already died and it was re-parented.
    given = os.environ.get("TRACEML_LAUNCHER_PID", "")
    parent = int(given) if given.isdigit() else os.getppid()
    while not stop.is_set():
        await asyncio.sleep(ORPHAN_CHECK_S)
        if os.getppid() != parent:
            break
    else:
        return
    gone = time.monotonic()
    connected_then = agg.open_ranks
    record.update(launcher_gone_at_unix_ns=time.time_ns(), ranks_connected_then=connected_then,
                  summary_line="the launcher died during the run; the aggregator collected telemetry until "
                               "the ranks finished, but run.json and the manifest were not closed by it")
    print("[TraceML] aggregator: the launcher is gone; collecting telemetry until the ranks finish", file=sys.stderr,
          flush=True)
    idle_since: float | None = None
    while not stop.is_set():
        now = time.monotonic()
        if agg.open_ranks > 0:
            idle_since = None
        elif not any(r.hellos for r in agg.stats.ranks.values()):
            if now - gone >= ORPHAN_NO_RANK_S:
                break  # no rank ever came
        else:
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= ORPHAN_IDLE_S:
                break
        await asyncio.sleep(ORPHAN_CHECK_S / 4)
    record["waited_for_ranks_s"] = round(time.monotonic() - gone, 3)
    stop.set()


def _write_final_summary(run_dir: Path, ingest: IngestStats) -> None:
    """The diagnosis of every run: ``aggregator/final_summary.json`` from the finished tables (DESIGN §3.5),
    with the step counts the ranks sent in ``rank_finished`` (steps discarded because they raised,
    incomplete updates dropped), summed."""
    from traceml_ai.diagnose.summary import write_final_summary

    write_final_summary(run_dir, step_counts=step_counts(ingest))


def step_counts(ingest: IngestStats) -> dict[str, int] | None:
    """{counter: n} summed over the ranks whose ``rank_finished`` carried step counts; None when none did."""
    reported = [r.step_counts for r in ingest.ranks.values() if r.step_counts]
    if not reported:
        return None
    total: dict[str, int] = {}
    for counts in reported:
        for key, n in counts.items():
            total[key] = total.get(key, 0) + n
    return total


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: parse ``argv`` (default ``sys.argv[1:]``), serve, return the exit code."""
    args = build_parser().parse_args(argv)
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        print(f"[TraceML] aggregator: run folder {run_dir} does not exist", file=sys.stderr, flush=True)
        return 1
    if not args.session_id.strip():
        print("[TraceML] aggregator: --session-id is empty", file=sys.stderr, flush=True)
        return 2
    try:
        secret = jobsecret.check_secret(os.environ.get(jobsecret.ENV_JOB_SECRET, ""))
    except ValueError as exc:
        print(f"[TraceML] aggregator: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        (run_dir / "aggregator").mkdir(exist_ok=True)
    except OSError as exc:
        print(f"[TraceML] aggregator: cannot create {run_dir / 'aggregator'}: {exc.strerror or exc}",
              file=sys.stderr, flush=True)
        return 1
    export: ExportWorker | None = None
    if args.exporter is not None:
        try:
            # The factory runs here, on the main thread, before the worker thread exists (000 seed).
            export = make_export_worker(args.exporter, run_dir.resolve(), export_streams=args.export_streams,
                                        include_hostname=args.exporter_hostname)
        except ValueError as exc:
            print(f"[TraceML] aggregator: {exc}", file=sys.stderr, flush=True)
            return 2
    sock: socket.socket | None = None
    if args.listen_fd is not None:
        try:
            sock = socket.socket(fileno=args.listen_fd)
            if sock.type != socket.SOCK_STREAM:
                raise OSError(f"descriptor {args.listen_fd} is not a TCP socket")
        except OSError as exc:
            print(f"[TraceML] aggregator: --listen-fd {args.listen_fd}: {exc.strerror or exc}", file=sys.stderr,
                  flush=True)
            return 2
    try:
        asyncio.run(
            serve(run_dir, args.session_id, secret=secret, host=args.host, port=args.port, sock=sock,
                  world_size=args.world_size, export=export, on_finalized=_write_final_summary)
        )
    except OSError as exc:
        print(f"[TraceML] aggregator: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}",
              file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # a bug: still one line, as DESIGN §7 asks of every command
        print(f"[TraceML] aggregator: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
