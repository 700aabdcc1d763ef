"""Where the viewer's cache folder is, without importing what writes into it (issue 16: ``traceml
runs ls`` asks whether a run database exists before it imports the run database's decoder).
:mod:`traceml_ai.ui.cache` re-exports all of it."""

from __future__ import annotations

import hashlib
import os
import re
import unicodedata
from collections.abc import Sequence
from typing import Final

from traceml_ai.runs.layout import DEFAULT_RUNS_ROOT

MAX_SLUG_CHARS: Final = 60
PROJECT_FOLDER: Final = "traceml"
"""The project folder of the default layout (``traceml/runs``, ``traceml/.cache``)."""


def default_cache_dir(roots: Sequence[str | os.PathLike[str]], setting: str | os.PathLike[str] | None) -> str:
    """The cache folder (absolute), keyed by the roots it caches:

    - the ``cache_dir`` setting or flag when given (``~`` expanded, relative to the working
      directory);
    - ``<project>/.cache`` when the one root's parent is the project folder ``traceml/`` (the
      default ``traceml/runs`` gives ``traceml/.cache``: 003 seed, "Exporting the table for an
      agent"; DESIGN §2.1);
    - else ``$XDG_CACHE_HOME/traceml/<first root's name>-<hash of the roots>`` (``~/.cache`` when
      the variable is unset): a root at ``~/runs`` no longer puts TraceML's files into ``~/.cache``
      itself, and sibling roots (``/data/a``, ``/data/b``) or other sets of roots never share a run
      database.

    Without roots the default root ``traceml/runs`` is assumed.
    """
    if setting is not None and os.fspath(setting).strip():
        return os.path.abspath(os.path.expanduser(os.fspath(setting)))
    given = [os.fspath(r) for r in roots] or [DEFAULT_RUNS_ROOT]
    absolute = [os.path.abspath(os.path.expanduser(r)) for r in given]
    parent = os.path.dirname(absolute[0])
    if len(absolute) == 1 and os.path.basename(parent) == PROJECT_FOLDER:
        return os.path.join(parent, ".cache")
    key = hashlib.sha256("\n".join(os.path.realpath(r) for r in absolute).encode("utf-8")).hexdigest()[:12]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = slugify(os.path.basename(absolute[0].rstrip(os.sep)) or "root", 40)
    return os.path.join(os.path.abspath(base), "traceml", f"{name}-{key}")


def slugify(text: str, max_chars: int = MAX_SLUG_CHARS) -> str:
    """A safe ASCII file-name part: accents folded (``ü`` → ``u``), lower case, every other run of
    characters (``/``, spaces, dots, non-Latin letters) a single ``-``, at most ``max_chars``;
    ``chart`` when nothing is left. ``val/auc`` → ``val-auc``."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    slug = re.sub(r"[^a-z0-9]+", "-", folded).strip("-")[:max_chars].strip("-")
    return slug or "chart"



__all__ = ["MAX_SLUG_CHARS", "PROJECT_FOLDER", "default_cache_dir", "slugify"]
