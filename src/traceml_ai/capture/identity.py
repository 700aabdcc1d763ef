"""Who this rank is, read from the launcher's environment (DESIGN §3.1 envelope ``meta``).

Launchers are recognised in this order; the first whose rank variable is present wins
(fields: global_rank, local_rank, world_size, local_world_size, node_rank):

- torchrun (``RANK`` and ``WORLD_SIZE`` set): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``.
- Open MPI (``OMPI_COMM_WORLD_RANK`` set): ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
  ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_SIZE``, and node_rank None.
- Slurm (``SLURM_PROCID`` set): ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_STEP_NUM_TASKS``
  (else ``SLURM_NTASKS``), this node's entry of ``SLURM_STEP_TASKS_PER_NODE`` (else
  ``SLURM_TASKS_PER_NODE``, e.g. ``"2(x3),1"``), ``SLURM_NODEID``.
- none of these: a single process, 0 / 0 / 1 / 1 / 0.

torchrun comes first because it is often started inside an ``srun`` or ``mpirun`` step whose own
variables describe the launcher process, not the training ranks. A variable that is missing or not
an integer gives None: the identity is never guessed (a rank with ``RANK`` but no ``LOCAL_RANK``
has ``local_rank`` None). Open MPI has no node index of its own (``OMPI_COMM_WORLD_NODE_RANK`` is
the rank's position among the processes of its node), so its ``node_rank`` is None.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TORCHRUN = "torchrun"
OPENMPI = "openmpi"
SLURM = "slurm"
SINGLE = "single"


@dataclass(frozen=True)
class RankIdentity:
    """The identity of one training process (DESIGN §3.1 ``meta`` fields, without session and sampler).

    Attributes:
        global_rank, local_rank, world_size, local_world_size, node_rank: integers from the
            launcher's environment, None where it did not say.
        hostname: ``socket.gethostname()``, None when that fails.
        pid: the process id.
        launcher: which environment told us: ``"torchrun"``, ``"openmpi"``, ``"slurm"`` or
            ``"single"`` (no launcher variables: one process, ranks 0/0/1/1/0).
    """

    global_rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    node_rank: int | None
    hostname: str | None
    pid: int
    launcher: str

    def meta(self, session_id: str | None = None, sampler: str | None = None) -> dict[str, Any]:
        """The envelope ``meta`` dict (keys of :data:`traceml_ai.telemetry.schema.META_FIELDS`).

        ``session_id`` and ``sampler`` are included only when given, so the same dict also serves as
        the identity part of the hello and rank_finished frames.
        """
        out: dict[str, Any] = {}
        if session_id is not None:
            out["session_id"] = session_id
        out.update(
            global_rank=self.global_rank,
            local_rank=self.local_rank,
            world_size=self.world_size,
            local_world_size=self.local_world_size,
            node_rank=self.node_rank,
            hostname=self.hostname,
            pid=self.pid,
        )
        if sampler is not None:
            out["sampler"] = sampler
        return out


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        return None


_TASKS_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _slurm_tasks_on_node(spec: str | None, node_index: int | None) -> int | None:
    """Tasks on node ``node_index`` from Slurm's compressed list, e.g. ``"2(x3),1"`` → 2, 2, 2, 1."""
    if spec is None or node_index is None or node_index < 0:
        return None
    counts: list[int] = []
    for item in spec.split(","):
        match = _TASKS_ITEM.match(item.strip())
        if match is None:
            return None
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts[node_index] if node_index < len(counts) else None


def _hostname() -> str | None:
    try:
        return socket.gethostname() or None
    except OSError:
        return None


def detect_identity(environ: Mapping[str, str] | None = None) -> RankIdentity:
    """Read this process's rank identity from ``environ`` (default ``os.environ``).

    Returns:
        A :class:`RankIdentity`; fields the launcher did not set are None. Never raises.
    """
    env = os.environ if environ is None else environ
    host, pid = _hostname(), os.getpid()
    if "RANK" in env and "WORLD_SIZE" in env:
        return RankIdentity(
            global_rank=_int(env, "RANK"),
            local_rank=_int(env, "LOCAL_RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE"),
            node_rank=_int(env, "GROUP_RANK"),
            hostname=host,
            pid=pid,
            launcher=TORCHRUN,
        )
    if "OMPI_COMM_WORLD_RANK" in env:
        return RankIdentity(
            global_rank=_int(env, "OMPI_COMM_WORLD_RANK"),
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            world_size=_int(env, "OMPI_COMM_WORLD_SIZE"),
            local_world_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
            node_rank=None,
            hostname=host,
            pid=pid,
            launcher=OPENMPI,
        )
    if "SLURM_PROCID" in env:
        node_rank = _int(env, "SLURM_NODEID")
        # The step's own counts describe the processes srun started; the job's (SLURM_NTASKS)
        # only apply when no step variables exist.
        if "SLURM_STEP_NUM_TASKS" in env:
            world_size = _int(env, "SLURM_STEP_NUM_TASKS")
            local_world_size = _slurm_tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE"), node_rank)
        else:
            world_size = _int(env, "SLURM_NTASKS")
            local_world_size = _slurm_tasks_on_node(env.get("SLURM_TASKS_PER_NODE"), node_rank)
        return RankIdentity(
            global_rank=_int(env, "SLURM_PROCID"),
            local_rank=_int(env, "SLURM_LOCALID"),
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=node_rank,
            hostname=host,
            pid=pid,
            launcher=SLURM,
        )
    return RankIdentity(
        global_rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, hostname=host, pid=pid,
        launcher=SINGLE,
    )


def identity_meta(environ: Mapping[str, str] | None = None, *, session_id: str | None = None) -> dict[str, Any]:
    """Shortcut: ``detect_identity(environ).meta(session_id)`` (envelope ``meta`` without ``sampler``)."""
    return detect_identity(environ).meta(session_id)
