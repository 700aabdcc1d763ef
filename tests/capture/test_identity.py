"""Rank identity from launcher environments (DESIGN §3.1 meta)."""

from __future__ import annotations

import os
import socket

from traceml_ai.capture.identity import detect_identity, identity_meta
from traceml_ai.telemetry.schema import META_FIELDS


def ranks(env: dict[str, str]) -> tuple[int | None, ...]:
    i = detect_identity(env)
    return (i.global_rank, i.local_rank, i.world_size, i.local_world_size, i.node_rank)


def test_single_process_without_launcher() -> None:
    ident = detect_identity({})
    assert ranks({}) == (0, 0, 1, 1, 0) and ident.launcher == "single"
    assert ident.pid == os.getpid() and ident.hostname == socket.gethostname()


def test_torchrun() -> None:
    env = {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "TORCHELASTIC_RUN_ID": "x"}
    assert ranks(env) == (5, 1, 8, 4, 1)
    assert detect_identity(env).launcher == "torchrun"


def test_missing_or_garbled_values_are_none_not_guessed() -> None:
    assert ranks({"RANK": "2", "WORLD_SIZE": "4"}) == (2, None, 4, None, None)
    assert ranks({"RANK": "two", "WORLD_SIZE": "4", "LOCAL_RANK": ""}) == (None, None, 4, None, None)


def test_torchrun_inside_slurm_wins() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3",
           "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "0"}
    assert ranks(env) == (3, 3, 8, 4, 0)


def test_slurm_step_counts_and_compressed_tasks_per_node() -> None:
    env = {"SLURM_PROCID": "6", "SLURM_LOCALID": "0", "SLURM_NODEID": "3", "SLURM_NTASKS": "16",
           "SLURM_STEP_NUM_TASKS": "7", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1", "SLURM_TASKS_PER_NODE": "4(x4)"}
    assert ranks(env) == (6, 0, 7, 1, 3)
    batch = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_NTASKS": "8",
             "SLURM_TASKS_PER_NODE": "4(x2)"}
    assert ranks(batch) == (0, 0, 8, 4, 1)
    assert detect_identity(batch).launcher == "slurm"
    assert ranks({**batch, "SLURM_TASKS_PER_NODE": "weird"}) == (0, 0, 8, None, 1)


def test_open_mpi_has_no_node_rank() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "12",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_NODE_RANK": "1", "SLURM_PROCID": "0"}
    assert ranks(env) == (9, 1, 12, 4, None)
    assert detect_identity(env).launcher == "openmpi"


def test_meta_has_the_envelope_fields() -> None:
    meta = detect_identity({}).meta("sess", "capture")
    assert tuple(meta) == META_FIELDS
    assert set(identity_meta({})) == set(META_FIELDS) - {"session_id", "sampler"}
    assert identity_meta({}, session_id="s")["session_id"] == "s"
