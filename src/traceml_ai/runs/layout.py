"""File names and limits of the run-folder format (003 seed, "Writing runs"; DESIGN §2.1).

A run folder holds five core files written by the training script's logger, three sub-folders, and,
when TraceML captured the run, an ``aggregator/`` folder.
"""

from __future__ import annotations

import re
from typing import Final

SCHEMA_VERSION: Final = 1
"""The run-folder schema this TraceML writes and fully understands."""

RUN_JSON: Final = "run.json"
PARAMS_YAML: Final = "params.yaml"
CONFIG_JSON: Final = "config.json"
METRICS_JSONL: Final = "metrics.jsonl"
METRICS_JSON: Final = "metrics.json"
RANK_METRICS_JSONL: Final = re.compile(r"metrics\.rank([1-9][0-9]*)\.jsonl")
"""The history of one more rank, ``metrics.rank<N>.jsonl`` (N > 0), which the logger writes when
every rank logs (``all_ranks=True`` or ``TRACEML_LOG_ALL_RANKS=1``; DESIGN §2.1)."""


def rank_metrics_jsonl(rank: int) -> str:
    """The history file of global rank ``rank``: ``metrics.jsonl`` for rank 0, else
    ``metrics.rank<N>.jsonl`` (:data:`RANK_METRICS_JSONL`)."""
    return METRICS_JSONL if rank == 0 else f"metrics.rank{rank}.jsonl"


def is_metrics_history(name: str) -> bool:
    """True for a file name the logger writes a metric history into (``metrics.jsonl`` or a rank's
    ``metrics.rank<N>.jsonl``)."""
    return name == METRICS_JSONL or RANK_METRICS_JSONL.fullmatch(name) is not None

SMALL_FILES: Final = (RUN_JSON, PARAMS_YAML, CONFIG_JSON, METRICS_JSON)
"""The four small files, parsed whole (never above :data:`MAX_SMALL_FILE_BYTES`)."""

CORE_FILES: Final = (*SMALL_FILES, METRICS_JSONL)
"""The files polled for a running run."""

FINAL_SUMMARY_JSON: Final = "aggregator/final_summary.json"

RUN_LOG: Final = "logs/run.log"
"""The run's console log (the reference reader shows it, tail first)."""

VIEWABLE_FILES: Final = (
    RUN_JSON, PARAMS_YAML, CONFIG_JSON, METRICS_JSONL, METRICS_JSON, FINAL_SUMMARY_JSON, RUN_LOG
)
"""The seven files a viewer may show of a run (003 seed, security: "a known run plus one of a few
fixed file names"): the five core files, TraceML's verdict (DESIGN §2.1, §3.5) and ``logs/run.log``."""

TAIL_FIRST_FILES: Final = frozenset({RUN_LOG})
"""Viewable files shown from their end when they are larger than the viewer shows (a log's news is
at its end)."""

SUBFOLDERS: Final = ("logs", "checkpoints", "artifacts")

MAX_SMALL_FILE_BYTES: Final = 16 * 1024 * 1024
"""run.json, params.yaml, config.json and metrics.json above 16 MB are not parsed (003 seed, security)."""

METRICS_HEAD_BYTES: Final = 64 * 1024
"""metrics.jsonl is read up to this many bytes for each metric's start value (003 seed, architecture)."""

DEFAULT_MAX_METRICS_FILE_MB: Final = 64.0
DEFAULT_STALE_AFTER_SECONDS: Final = 60.0
DEFAULT_RUNS_ROOT: Final = "traceml/runs"

STATUSES: Final = ("running", "completed", "failed", "killed")
"""Statuses a writer may put in run.json. ``stale`` is derived and never written."""

DISPLAY_STATUSES: Final = ("running", "running?", "stale", "completed", "failed", "killed", "legacy", "unknown")
"""What readers show: the written status, plus ``stale`` and ``running?`` (003 seed, "Status and
stale"), ``legacy`` for a folder without run.json, and ``unknown`` for a run.json that could never be
parsed or names a status outside :data:`STATUSES`."""

RUN_ID_RE: Final = re.compile(r"^(?P<stamp>\d{8}-\d{6})_(?P<name>.+)_(?P<hex>[0-9a-f]{4})$")
"""``<YYYYMMDD-HHMMSS>_<name>_<hex4>``, the stamp in UTC."""

RESERVED_METRIC_KEYS: Final = frozenset({"step", "epoch", "time"})
"""Keys of a metrics.jsonl row that are not metrics."""

RUN_FOLDER_STAMP: Final = "."
"""The name under which the run database's file stamps hold the run folder's own ``(mtime_ns,
inode)``, taken before its files were stat'ed: while it holds, no file was created, renamed or
removed in the folder since (every writer of the run format replaces files by rename; issue 16)."""
