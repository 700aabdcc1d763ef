"""The run envelope of a job that ``traceml run`` launched over several nodes (DESIGN §2.2, §5).

Node 0 holds the run folder: ``aggregator/manifest.json`` (the session, collecting every rank of
every node) and the telemetry database, export folder and final summary beside it. This module
writes ``<run folder>/stormlog_run.json`` grouping them, so that the catalog lists the job as one
explicit run with its artifacts as ``copy`` attachments. Called by the ``traceml run`` command
after the launch returns (the launcher itself may not import the catalog, DESIGN §1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from traceml_ai.catalog.sources import TRACEML_ARTIFACTS
from traceml_ai.catalog.writer import write_envelope
from traceml_ai.runs.safeio import read_regular

MANIFEST = os.path.join("aggregator", "manifest.json")


def write_job_envelope(run_dir: str | os.PathLike[str]) -> Path | None:
    """Write ``stormlog_run.json`` into the run folder of a multi-node job; return its path, or None
    when the manifest says the job ran on one node (nothing to group) or has no session id.

    The envelope: ``run_id`` = the run folder's name (unique, unlike a multi-node job id that a
    rerun with the same address, port and name derives again), ``job_id``, start/end from the
    manifest, one session (``role`` ``job``: one aggregator collected every rank; ``world_size`` =
    nodes × processes per node; its status and times in ``metadata``, as Stormlog's v1 session has no
    such fields), and the artifacts present as ``copy`` attachments with paths
    relative to the run folder.

    Raises:
        OSError: the manifest cannot be read or the envelope cannot be written.
        ValueError: the manifest is not JSON; EnvelopeError (a ValueError) if the result would be invalid.
    """
    folder = Path(run_dir)
    manifest: Any = orjson.loads(read_regular(folder / MANIFEST))
    if not isinstance(manifest, dict) or (manifest.get("nnodes") or 1) <= 1 or not manifest.get("session_id"):
        return None
    session_id = str(manifest["session_id"])
    session: dict[str, Any] = {
        "session_id": session_id,
        "job_id": manifest.get("job_id"),
        "rank": None,
        "local_rank": None,
        "world_size": manifest.get("world_size"),
        "role": "job",
        # Stormlog's v1 session has no lifecycle fields: TraceML's go in metadata (DESIGN §5)
        "metadata": {k: manifest.get(k) for k in ("status", "started_at_ns", "ended_at_ns", "nnodes",
                                                  "nproc_per_node", "node_rank", "hostname")},
    }
    attachments: list[dict[str, Any]] = []
    for name, kind, title in TRACEML_ARTIFACTS:
        if (folder / "aggregator" / name).exists():
            attachments.append({"attachment_id": name.split(".")[0].replace("_", "-"), "title": title, "kind": kind,
                                "storage": "copy", "path": f"aggregator/{name}", "session_id": session_id,
                                "job_id": manifest.get("job_id"), "metadata": {}})
    return write_envelope(
        folder, folder.name, title=folder.name, job_id=manifest.get("job_id"),
        started_at_ns=manifest.get("started_at_ns"), ended_at_ns=manifest.get("ended_at_ns"),
        source_namespace="traceml", source_ref=folder.name, sessions=[session], attachments=attachments,
        metadata={"written_by": "traceml run", "nnodes": manifest.get("nnodes"),
                  "nproc_per_node": manifest.get("nproc_per_node")},
    )
