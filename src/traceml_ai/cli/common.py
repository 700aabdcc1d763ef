"""Shared pieces of the commands: consoles, the one-line error rule (DESIGN §7), value formatting."""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

import typer

from traceml_ai.runs.store import NotFoundError
from traceml_ai.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from rich.console import Console

    out: Console
    """The console of stdout (made, and Rich imported, on first use: ``traceml run`` starts the
    training before it prints anything)."""
    err: Console
    """The console of stderr (on first use, like ``out``)."""


def __getattr__(name: str) -> Any:
    if name in ("out", "err"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _console(name: str) -> Console:
    made = globals()
    if "out" not in made:
        from rich.console import Console

        stdout = Console(highlight=False, soft_wrap=False)
        stdout.on_broken_pipe = _on_broken_pipe  # type: ignore[method-assign]  # Rich's exits 1
        if not stdout.is_terminal and "COLUMNS" not in os.environ:
            stdout.width = 200  # logs and pipes: no need to squeeze tables into 80 columns
        made["out"] = stdout
        made["err"] = Console(stderr=True, highlight=False, soft_wrap=True)
    console: Console = made[name]
    return console

CACHE_DIR_HELP: Final = ("Cache folder (default: traceml/.cache for the root traceml/runs, else "
                         "~/.cache/traceml/<root name>-<hash of the roots>).")
"""The ``--cache-dir`` help of the commands that write into it (ui.cache_paths.default_cache_dir)."""

def scan_note(read: int, listed: int) -> None:
    """One line on stderr while a first scan (no run database yet) lasts: how far it is."""
    _console("err").print(f"[dim]scanning the runs folders (no run database yet; the next start reads it): "
                          f"{read:,} of {listed:,} runs read…[/]")


P = ParamSpec("P")
R = TypeVar("R")

STATUS_STYLE = {
    "running": "bold green",
    "running?": "green",
    "stale": "bold yellow",
    "completed": "cyan",
    "failed": "bold red",
    "killed": "magenta",
    "legacy": "dim",
    "unknown": "red",
}

DEBUG = {"on": False}


class UserError(Exception):
    """An error the user can fix: printed as one line, exit code 1."""


class UsageError(UserError):
    """A bad flag or argument value: printed as one line, exit code 2 (DESIGN §7)."""


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters (ESC, newline, ...) shown as ``\\xNN``
    escapes, so a run name cannot move the cursor, recolour the screen or split a table row."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on stderr and return the Exit to raise."""
    _console("err").print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    return typer.Exit(code)


def _on_broken_pipe() -> None:
    raise reader_gone()


def reader_gone() -> typer.Exit:
    """The Exit for a reader that stopped reading (``traceml runs ls --json | head -1``): exit code
    0 and no "Broken pipe" line, as ``git log | head`` ends. stdout is pointed at /dev/null first,
    so the flush at exit has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return typer.Exit(0)


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn user-causable errors into one stderr line and exit code 1, or 2 for a bad flag or setting
    value (DESIGN §7; a traceback with --debug).

    Only the project's own not-found error (:class:`traceml_ai.runs.store.NotFoundError`) counts among
    the KeyErrors: a bare ``KeyError`` is a lookup bug in our code and prints as an ``internal error``
    line (exit 1), with the traceback under ``--debug``."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            raise reader_gone() from None
        except (UserError, SettingsError, ValueError, NotFoundError, OSError) as e:
            if DEBUG["on"]:
                raise
            text = e.args[0] if isinstance(e, NotFoundError) and e.args else str(e)
            raise fail(printable(str(text)), code=2 if isinstance(e, (UsageError, SettingsError)) else 1) from None
        except Exception as e:
            if DEBUG["on"]:
                raise
            detail = f"{type(e).__name__}: {printable(str(e))}"
            raise fail(f"internal error: {detail} (run with --debug for the traceback)") from None

    return wrapper


def settings(**flags: Any) -> Settings:
    """Settings with the given flags on top (None = flag not given)."""
    return load_settings(flags)


def roots_or_default(roots: Sequence[str] | None, st: Settings) -> list[str]:
    """Roots from the arguments, else from settings; glob patterns (``**/runs``) expanded as a shell
    would (:func:`traceml_ai.runs.discovery.expand_root_patterns`: a quoted pattern, or one from
    the settings, works too)."""
    from traceml_ai.runs.discovery import expand_root_patterns

    return expand_root_patterns(roots if roots else st.roots)


def fmt_value(v: Any) -> str:
    """A cell as shown in a terminal table: 4 significant digits for floats, '' for missing."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.4g}"
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    return str(v)


def fmt_bytes(v: float | None, *, missing: str = "") -> str:
    """A size in bytes as the terminal shows it, in binary units as GPU tools print memory
    (``1.50 GiB``, ``640.0 KiB``, ``12 bytes``; Rich's unit picker with base 1024); ``missing`` for
    None or a negative size."""
    if v is None or not v >= 0:
        return missing
    from rich.filesize import pick_unit_and_suffix

    size = int(v)
    if size < 1024:
        return f"{size} bytes"
    unit, suffix = pick_unit_and_suffix(
        size, ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"], 1024
    )
    return f"{size / unit:.2f} {suffix}" if unit >= 1024**3 else f"{size / unit:.1f} {suffix}"


def fmt_duration(seconds: float | None) -> str:
    """``3725.0`` → ``1h 02m``; ``42.5`` → ``42s``."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {(s % 3600) // 60:02d}m"
    return f"{s // 86400}d {(s % 86400) // 3600:02d}h"


def fmt_time(iso: str | None) -> str:
    """``2026-11-30T10:15:00Z`` → ``2026-11-30 10:15``."""
    if not iso:
        return ""
    return iso.replace("T", " ")[:16]
