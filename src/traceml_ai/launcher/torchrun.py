"""``python -m traceml_ai.launcher.torchrun ARGS``: ``torch.distributed.run`` (torchrun) as the
launcher starts several ranks, with a stop that says one line.

Stopped by Ctrl+C or SIGTERM, torchrun raises ``SignalException`` through its agent and prints
some 70 lines of tracebacks and warnings for a 2-rank run. Here its agent's warnings are kept
below ERROR (the ``LOGLEVEL`` torchrun reads when its loggers are made, and the level of the
``torch.distributed.elastic`` logger for its modules that use plain ``logging``, e.g. "Sending
process N closing signal SIGINT"; the ranks get the environment as it was) and a stop by a
signal is one ``[TraceML]`` line and exit status 128 + N, what the shell would report. Each rank
started by the launcher says one line for Ctrl+C too (``capture.bootstrap``).

A rank that fails (the script raised, or exited non-zero) made torchrun print its
``ChildFailedError`` traceback and "Root Cause" block, some 45 lines under the ranks' own output,
and exit 1 whatever the script's code was. Here each failed rank is one ``[TraceML]`` line (its
global rank, exit code or signal) and the exit status is the first failed rank's: the script's
code, or 128 + N for a signal. Everything else (arguments, the ranks' output) is torchrun's own.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, NoReturn


def main(argv: list[str] | None = None) -> NoReturn:
    """Run torchrun with ``argv`` (default ``sys.argv[1:]``) and exit with its status."""
    previous = os.environ.get("LOGLEVEL")
    os.environ["LOGLEVEL"] = "ERROR"
    try:
        from torch.distributed import run
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    finally:
        if previous is None:
            os.environ.pop("LOGLEVEL", None)
        else:
            os.environ["LOGLEVEL"] = previous
    # ERROR too would print "failed (exitcode: 2) local_rank: 0 ..." per rank: the lines below say it.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    sys.argv = ["torchrun", *(sys.argv[1:] if argv is None else argv)]
    try:
        run.main()
    except SignalException as exc:
        print(f"[TraceML] the ranks were stopped by {exc.sigval.name}", file=sys.stderr, flush=True)
        sys.exit(128 + int(exc.sigval))
    except KeyboardInterrupt:
        print("[TraceML] the ranks were stopped by SIGINT", file=sys.stderr, flush=True)
        sys.exit(130)
    except ChildFailedError as exc:
        sys.exit(_report_failed_ranks(exc.failures))
    sys.exit(0)


def _report_failed_ranks(failures: Mapping[int, Any]) -> int:
    """One line per failed rank (``failures``: global rank → torchrun's ``ProcessFailure``); returns
    the exit status for the first one: its exit code, or 128 + N when signal N ended it."""
    status = 1
    for i, (rank, failure) in enumerate(sorted(failures.items())):
        code = int(failure.exitcode)
        if code < 0:
            how, this = f"was ended by {failure.signal_name()}", 128 - code
        else:
            how, this = f"exited with code {code}", code or 1
        print(f"[TraceML] rank {rank} {how} (see its output above)", file=sys.stderr, flush=True)
        if i == 0:
            status = this
    return status


if __name__ == "__main__":
    main()
