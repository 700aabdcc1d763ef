"""``python -m traceml_ai.launcher.torchrun ARGS``: ``torch.distributed.run`` (torchrun) as the
launcher starts several ranks, with a stop that says one line.

Stopped by Ctrl+C or SIGTERM, torchrun raises ``SignalException`` through its agent and prints
some 70 lines of tracebacks and warnings for a 2-rank run. Here its agent's warnings are kept
below ERROR (the ``LOGLEVEL`` torchrun reads when its loggers are made, and the level of the
``torch.distributed.elastic`` logger for its modules that use plain ``logging``, e.g. "Sending
process N closing signal SIGINT"; the ranks get the environment as it was) and a stop by a
signal is one ``[TraceML]`` line and exit status 128 + N, what the shell would report. Each rank
started by the launcher says one line for Ctrl+C too (``capture.bootstrap``). Everything else
(arguments, the ranks' output, their exit codes, a failed rank's report) is torchrun's own.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def main(argv: list[str] | None = None) -> NoReturn:
    """Run torchrun with ``argv`` (default ``sys.argv[1:]``) and exit with its status."""
    previous = os.environ.get("LOGLEVEL")
    os.environ["LOGLEVEL"] = "ERROR"
    try:
        from torch.distributed import run
        from torch.distributed.elastic.multiprocessing.api import SignalException
    finally:
        if previous is None:
            os.environ.pop("LOGLEVEL", None)
        else:
            os.environ["LOGLEVEL"] = previous
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    sys.argv = ["torchrun", *(sys.argv[1:] if argv is None else argv)]
    try:
        run.main()
    except SignalException as exc:
        print(f"[TraceML] the ranks were stopped by {exc.sigval.name}", file=sys.stderr, flush=True)
        sys.exit(128 + int(exc.sigval))
    except KeyboardInterrupt:
        print("[TraceML] the ranks were stopped by SIGINT", file=sys.stderr, flush=True)
        sys.exit(130)
    sys.exit(0)


if __name__ == "__main__":
    main()
