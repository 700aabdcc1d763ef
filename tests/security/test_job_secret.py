"""Where the job secret comes from (issue 12 points 1-2): the environment, a fresh one per
single-node job, or derived from the user's own key for every node of a multi-node job."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from traceml_ai.launcher.launch import (
    LaunchError,
    LaunchOptions,
    LaunchUsageError,
    job_secret_for,
    session_id_for,
    user_key_path,
)
from traceml_ai.telemetry import jobsecret


def options(nnodes: int = 1) -> LaunchOptions:
    return LaunchOptions(script="train.py", nnodes=nnodes, master_addr="10.0.0.1", master_port=29500)


def test_a_single_node_job_gets_a_fresh_random_secret() -> None:
    first = job_secret_for(options(), "s1", {})
    assert len(first) == 64 and first != job_secret_for(options(), "s1", {})


def test_a_secret_from_the_environment_wins_and_must_be_long_enough() -> None:
    given = "x" * 32
    assert job_secret_for(options(nnodes=2), "s", {"TRACEML_JOB_SECRET": given}) == given
    with pytest.raises(LaunchUsageError, match="TRACEML_JOB_SECRET"):
        job_secret_for(options(), "s", {"TRACEML_JOB_SECRET": "short"})


def test_every_node_derives_the_same_secret_from_the_users_key_and_other_users_cannot(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    session = session_id_for(options(nnodes=2))
    node0 = job_secret_for(options(nnodes=2), session, env)
    node1 = job_secret_for(options(nnodes=2), session, env)  # another node, the same home folder
    assert node0 == node1 and len(node0) == 64
    key = user_key_path(env)
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o077 == 0
    assert node0 not in key.read_text()  # the key is not the secret: each job gets its own
    assert job_secret_for(options(nnodes=2), "another-job", env) != node0
    # Someone else's key (a different home) derives a different secret: its hellos are refused.
    assert job_secret_for(options(nnodes=2), session, {"XDG_CONFIG_HOME": str(tmp_path / "other")}) != node0


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    job_secret_for(options(nnodes=2), "s", env)
    key = user_key_path(env)
    os.chmod(key, 0o644)
    with pytest.raises(LaunchError, match="chmod 600"):
        job_secret_for(options(nnodes=2), "s", env)


def test_the_proofs_are_bound_to_secret_challenge_every_hello_field_and_role() -> None:
    secret, challenge = jobsecret.new_secret(), jobsecret.new_nonce()
    fields = {"control": "hello", "protocol": 2, "session_id": "s", "nonce": jobsecret.new_nonce(),
              "global_rank": 1, "hostname": "node-a", "pid": 7, "ratio": 0.5, "flag": True, "none": None}
    proof = jobsecret.hello_proof(secret, challenge, fields)
    assert jobsecret.proof_matches(proof, proof)
    # Field order and a stale proof field do not matter; the canonical bytes are sorted.
    assert proof == jobsecret.hello_proof(secret, challenge, dict(reversed(list(fields.items()))) | {"proof": "x"})
    assert proof != jobsecret.hello_proof(jobsecret.new_secret(), challenge, fields)
    assert proof != jobsecret.hello_proof(secret, jobsecret.new_nonce(), fields)
    for key, value in [("hostname", "EVIL-HOST"), ("global_rank", 0), ("session_id", "t"), ("pid", 8),
                       ("flag", 1), ("none", ""), ("extra", 1)]:
        assert proof != jobsecret.hello_proof(secret, challenge, {**fields, key: value}), key
    assert proof != jobsecret.hello_proof(secret, challenge, {k: v for k, v in fields.items() if k != "pid"})
    welcome = jobsecret.welcome_proof(secret, "s", challenge, fields["nonce"])
    assert welcome != jobsecret.welcome_proof(secret, "s", jobsecret.new_nonce(), fields["nonce"])
    assert welcome != jobsecret.welcome_proof(secret, "s", challenge, jobsecret.new_nonce())
    assert welcome != jobsecret.welcome_proof(secret, "t", challenge, fields["nonce"])
    assert not jobsecret.proof_matches(proof, proof[:-1]) and not jobsecret.proof_matches(proof, None)



def _start_node_together(
    barrier: threading.Barrier, env: dict[str, str], secrets: list[str], errors: list[Exception]
) -> None:
    barrier.wait()
    try:
        secrets.append(job_secret_for(options(nnodes=2), "job-s", env))
    except LaunchError as exc:
        errors.append(exc)


def test_nodes_that_create_the_users_key_at_the_same_moment_all_read_the_same_whole_key(tmp_path: Path) -> None:
    """Two launchers of one job started together on a shared home folder (the multi-node end-to-end
    test does this): one creates the key while the other reads it. A reader must never see the
    file half written (an empty key fails node 0 and leaves node 1 waiting at the rendezvous)."""

    for round_ in range(40):
        env = {"XDG_CONFIG_HOME": str(tmp_path / f"config{round_}")}
        barrier = threading.Barrier(8)
        secrets: list[str] = []
        errors: list[Exception] = []
        threads = [threading.Thread(target=_start_node_together, args=(barrier, env, secrets, errors))
                   for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not errors, f"round {round_}: {errors[0]}"
        assert len(secrets) == 8 and len(set(secrets)) == 1, round_
        assert sorted(p.name for p in user_key_path(env).parent.iterdir()) == ["job.key"]  # no temporary left
