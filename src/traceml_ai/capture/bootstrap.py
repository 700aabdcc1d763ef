"""Run a training script under capture: ``python -m traceml_ai.capture.bootstrap SCRIPT [ARGS...]``.

The launcher starts each rank this way (``torchrun ... -m traceml_ai.capture.bootstrap SCRIPT
ARGS`` for several). It starts a capture session from the environment
(:meth:`~traceml_ai.capture.session.CaptureConfig.from_env`; with ``TRACEML_DISABLE=1`` or no
configuration the script simply runs), then runs SCRIPT as ``__main__`` the way ``python SCRIPT
ARGS`` would:

- ``sys.argv`` is ``[SCRIPT, *ARGS]``, ``sys.path[0]`` the script's folder (symlinks resolved),
  ``__file__`` its absolute path; a folder or zip file with ``__main__.py`` works too, and
  ``-m MODULE ARGS`` runs a module like ``python -m MODULE ARGS``;
- the exit status is the script's: 0 at the end, ``sys.exit`` codes passed through (a non-integer
  is printed on stderr and gives 1), an uncaught exception prints its traceback (without this
  module's frames) and gives 1, an uncaught ``KeyboardInterrupt`` ends the process by SIGINT like
  python does (status 130 in a shell); a missing script gives python's message and 2.

Started by ``traceml run`` or ``traceml watch`` (the launcher sets ``TRACEML_CAPTURE``), Ctrl+C
prints one ``[TraceML] rank N stopped by Ctrl+C`` line instead of the ``KeyboardInterrupt``
traceback: every rank of a multi-rank run gets the SIGINT, and a traceback each says nothing the
user does not know. The process still ends by SIGINT, as torchrun and the launcher expect.

Under ``traceml run`` (capture mode ``run``) a Hugging Face or Lightning ``Trainer`` that the script
builds without TraceML's callback gets it, with a one-line note (:mod:`traceml_ai.capture.frameworks`).

The session closes at interpreter exit (its :mod:`atexit` hook was registered before the script's
own hooks, so it runs after them and still captures what they print). A telemetry fault never
changes the script's result: it is one ``[TraceML]`` line on stderr at most.
"""

from __future__ import annotations

import atexit
import builtins
import importlib.util
import os
import runpy
import signal
import sys
import types
from importlib.machinery import SourceFileLoader
from typing import NoReturn

from traceml_ai.capture.client import warn
from traceml_ai.capture.frameworks import install_auto_attach
from traceml_ai.capture.session import ENV_CAPTURE, CaptureConfig, start_session

USAGE = "usage: python -m traceml_ai.capture.bootstrap SCRIPT [ARGS...] | -m MODULE [ARGS...]"

_OUR_FILES = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}


def start_from_env() -> None:
    """Start this process's capture session from the environment, if it says so. Never raises."""
    try:
        config = CaptureConfig.from_env()
    except ValueError as exc:
        warn(f"telemetry capture is off: {exc}")
        return
    if config is None:
        return
    try:
        start_session(config)
    except Exception as exc:
        warn(f"telemetry capture is off: it could not start ({exc!r})")
        return
    if config.mode == "run":
        # Step timing for Hugging Face and Lightning Trainers built without TraceML's callback
        # (capture.frameworks); `traceml watch` times no steps.
        try:
            install_auto_attach()
        except Exception as exc:
            warn(f"automatic step timing for training frameworks is off: {exc!r}")


def _is_zipfile(path: str) -> bool:
    """``zipfile.is_zipfile(path)``, without importing zipfile for a file with no end-of-archive record
    in its last 64 KiB (every script): that record is what ``is_zipfile`` looks for there."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - (1 << 16) - 22))
            tail = handle.read()
    except OSError:
        return False
    if b"PK\x05\x06" not in tail:
        return False
    import zipfile

    return zipfile.is_zipfile(path)


def _run_path(script: str) -> None:
    path = os.path.abspath(script)
    if os.path.isdir(script) or _is_zipfile(script):
        del sys.path[0]  # run_path puts the folder or archive first, as python does
        runpy.run_path(script, run_name="__main__")
        return
    with open(script, "rb") as handle:
        source = handle.read()
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    code = compile(source, path, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(
        __file__=path, __builtins__=builtins, __loader__=SourceFileLoader("__main__", path), __spec__=None,
        __package__=None, __cached__=None,
    )
    # Kept in sys.modules for good, like python's own __main__: pickling and multiprocessing's
    # spawn find the script's classes there.
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def _print_uncaught(exc: BaseException) -> None:
    """What python prints for an uncaught exception, through ``sys.excepthook``, minus our frames."""
    tb = exc.__traceback__
    while tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename) in _OUR_FILES:
        tb = tb.tb_next
    # The default hook prints the exception's own __traceback__, not the one passed to it.
    exc.with_traceback(tb)
    sys.excepthook(type(exc), exc, tb)


def _print_stopped() -> None:
    """The one line a rank started by the launcher prints for Ctrl+C, instead of its traceback."""
    rank = os.environ.get("RANK")
    who = f"rank {rank}" if rank is not None and rank.isdigit() else "the training"
    try:
        print(f"[TraceML] {who} stopped by Ctrl+C (KeyboardInterrupt)", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _exit_on_keyboard_interrupt() -> NoReturn:
    # Python ends an uncaught KeyboardInterrupt by its atexit hooks, then SIGINT to itself, so the
    # shell sees "killed by SIGINT" (130) and stops a surrounding loop.
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(130)


def main(argv: list[str] | None = None) -> NoReturn:
    """Run the script named in ``argv`` (default ``sys.argv[1:]``) under capture and exit with its status."""
    args = list(sys.argv[1:] if argv is None else argv)
    module_name: str | None = None
    if args[:1] == ["-m"] and len(args) > 1:
        module_name, args = args[1], args[2:]
        try:
            found = importlib.util.find_spec(module_name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            print(f"{sys.executable}: No module named {module_name}", file=sys.stderr)
            sys.exit(1)
    elif not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    else:
        script, args = args[0], args[1:]
        if not os.path.exists(script):
            print(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: [Errno 2] No such file or directory",
                  file=sys.stderr)
            sys.exit(2)
    start_from_env()
    try:
        if module_name is not None:
            sys.argv = [module_name, *args]  # run_module replaces [0] with the module's file
            runpy.run_module(module_name, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [script, *args]
            _run_path(script)
    except SystemExit:
        raise  # the interpreter turns its code into the exit status exactly as for `python SCRIPT`
    except KeyboardInterrupt as exc:
        if os.environ.get(ENV_CAPTURE):
            _print_stopped()
        else:
            _print_uncaught(exc)
        _exit_on_keyboard_interrupt()
    except BaseException as exc:
        _print_uncaught(exc)
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
