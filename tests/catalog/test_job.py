"""The envelope of a multi-node ``traceml run`` (DESIGN §2.2): written by the command after the launch,
grouping the job's session with its telemetry database, exports and final summary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import traceml_ai.catalog as catalog
from tests.conftest import run_traceml
from traceml_ai.catalog.job import write_job_envelope
from traceml_ai.launcher.runfolder import RunIdentity, create_run_folder, write_manifest


def launched_folder(tmp_path: Path, nnodes: int) -> Path:
    folder = create_run_folder(tmp_path / "runs", "job", t=0)
    ident = RunIdentity(mode="run", command=["python", "train.py"], session_id="job-abc",
                        job_id="job-abc" if nnodes > 1 else None, nnodes=nnodes, nproc_per_node=2)
    write_manifest(folder, ident, status="completed", started_at_ns=100, ended_at_ns=900, exit_code=0)
    (folder / "aggregator" / "telemetry.sqlite").write_bytes(b"")
    (folder / "aggregator" / "final_summary.json").write_text('{"findings": []}', encoding="utf-8")
    return folder


def test_a_multi_node_run_folder_gets_an_envelope_the_catalog_reads(tmp_path: Path) -> None:
    folder = launched_folder(tmp_path, nnodes=2)
    path = write_job_envelope(folder)
    assert path == folder / "stormlog_run.json"
    store = catalog.open([tmp_path / "runs"])
    (run,) = store.list_runs()
    assert (run.run_id, run.explicit, run.job_id, run.sessions, run.status) == (
        folder.name, True, "job-abc", ("job-abc",), "completed")
    assert (run.started_at_ns, run.ended_at_ns, run.source_namespace) == (100, 900, "traceml")
    (session,) = store.list_sessions()
    assert (session.kind, session.world_size, session.role, session.rank) == ("traceml_session", 4, "job", None)
    got = {(a.kind, a.storage, a.path) for a in store.list_run_attachments()}
    assert got == {("telemetry_database", "copy", str(folder / "aggregator" / "telemetry.sqlite")),
                   ("final_summary", "copy", str(folder / "aggregator" / "final_summary.json"))}
    assert store.warnings == []


def test_real_stormlog_reads_the_multi_node_envelope(tmp_path: Path) -> None:
    from tests.catalog.stormlog_real import require_stormlog, stormlog_query, stormlog_warnings

    require_stormlog()
    folder = launched_folder(tmp_path, nnodes=2)
    write_job_envelope(folder)
    (run,) = stormlog_query("runs", tmp_path / "runs")
    assert (run["run_id"], run["explicit"], run["job_id"], run["source_namespace"]) == (
        folder.name, True, "job-abc", "traceml")
    assert (run["started_at_ns"], run["ended_at_ns"], run["attachment_count"]) == (100, 900, 2)
    ours = catalog.open([tmp_path / "runs"]).list_run_attachments()
    assert [(a["kind"], a["path"], a["storage"]) for a in stormlog_query("attachments", tmp_path / "runs")] == [
        (a.kind, a.path, a.storage) for a in ours]
    assert stormlog_warnings(tmp_path / "runs") == []


def test_a_single_node_run_gets_no_envelope(tmp_path: Path) -> None:
    folder = launched_folder(tmp_path, nnodes=1)
    assert write_job_envelope(folder) is None
    assert not (folder / "stormlog_run.json").exists()
    manifest = json.loads((folder / "aggregator" / "manifest.json").read_text())
    assert (manifest["session_id"], manifest["rank"], manifest["world_size"], manifest["role"]) == (
        "job-abc", None, 2, "job")


@pytest.mark.timeout(900)  # two real trainings, each under a 600 s limit
def test_traceml_run_over_two_nodes_writes_the_envelope(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    from traceml_ai.examples import TRAIN_DIGITS

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["run", "--mode", "quiet", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--interval", "0.2", "--name", "two nodes"]
    env = {k: v for k, v in os.environ.items() if k != "TRACEML_RUN_DIR"}
    node1 = subprocess.Popen([sys.executable, "-m", "traceml_ai", *common, "--node-rank", "1", "--logs-dir",
                              str(tmp_path / "node1"), str(TRAIN_DIGITS), "--epochs", "1"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    node0 = run_traceml(*common, "--node-rank", "0", "--logs-dir", str(tmp_path / "node0"), str(TRAIN_DIGITS),
                        "--epochs", "1", cwd=tmp_path, timeout=600)
    _, err1 = node1.communicate(timeout=600)
    assert node0.returncode == 0, node0.stderr[-3000:]
    assert node1.returncode == 0, err1[-3000:]
    (run_dir,) = (tmp_path / "node0").iterdir()
    assert (run_dir / "stormlog_run.json").is_file()
    proc = run_traceml("query", "attachments", str(tmp_path / "node0"), "--run-id", run_dir.name, "--json",
                       "--no-cache")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    ours = json.loads(proc.stdout)
    kinds = {a["kind"] for a in ours}
    assert {"telemetry_database", "final_summary"} <= kinds
    runs = run_traceml("query", "runs", str(tmp_path / "node0"), "--json", "--no-cache")
    (row,) = json.loads(runs.stdout)
    assert row["explicit"] is True and row["status"] == "completed" and row["session_count"] == 1
    # real Stormlog accepts the envelope: the same run and the same attachments (it cannot see the
    # TraceML session itself; its status and times are in the session's metadata)
    from tests.catalog.stormlog_real import require_stormlog, stormlog_query, stormlog_warnings

    require_stormlog()
    (theirs,) = stormlog_query("runs", tmp_path / "node0")
    assert (theirs["run_id"], theirs["explicit"], theirs["attachment_count"]) == (run_dir.name, True, len(ours))
    assert [(a["kind"], a["path"]) for a in stormlog_query("attachments", tmp_path / "node0")] == [
        (a["kind"], a["path"]) for a in ours]
    assert not any("run envelope" in message for _, message in stormlog_warnings(tmp_path / "node0"))
    doc = json.loads((run_dir / "stormlog_run.json").read_text())
    assert doc["sessions"][0]["metadata"]["status"] == "completed"
