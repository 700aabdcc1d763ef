"""Telemetry only from the job's own ranks (issue 12 points 1-3): a second local user with
everything it can read, a squatting listener, replays, and peers that try to make the aggregator
hold memory. Real processes and sockets."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from tests.aggregator.wire import SECRET, SESSION, AggregatorThread, RankClient, step_time_rows
from tests.capture.frame_server import TEST_SECRET
from traceml_ai.capture.client import TransportClient
from traceml_ai.telemetry import frames
from traceml_ai.telemetry.envelope import make_envelope

ATTACKER = Path(__file__).with_name("attacker.py")
SYSTEM_PYTHON = "/usr/bin/python3"


def _as_nobody() -> Any:
    if os.getuid() != 0:
        pytest.skip("simulating a second local user needs root (to run a child as `nobody`)")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"no {SYSTEM_PYTHON} for the second user")
    nobody = pwd.getpwnam("nobody")

    def drop() -> None:
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    return drop


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.fixture()
def shared_dir() -> Iterator[Path]:
    """A logs folder other local users can read, as on a shared machine (pytest's tmp is 0700)."""
    base = Path(tempfile.mkdtemp(prefix="traceml-shared-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _aggregator_of(run_dir: Path, deadline: float) -> tuple[int, int]:
    """(pid, port) of the aggregator process serving ``run_dir``."""
    while time.monotonic() < deadline:
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmd = proc.info["cmdline"] or []
            if "traceml_ai.aggregator" in cmd and str(run_dir) in cmd:
                listening = [c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN]
                if listening:
                    return proc.pid, listening[0]
        time.sleep(0.1)
    raise AssertionError("no aggregator process found")


def test_a_second_local_user_with_everything_it_can_read_cannot_forge_telemetry(shared_dir: Path) -> None:
    drop = _as_nobody()
    script = shared_dir / "train.py"
    go = shared_dir / "go"
    script.write_text(
        "import os, sys, time\n"
        f"deadline = time.time() + 120\n"
        f"while not os.path.exists({str(go)!r}) and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print('trained')\n"
    )
    logs = shared_dir / "runs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--name", "victim", "--logs-dir", str(logs),
         "--interval", "0.2", str(script)],
        cwd=shared_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list(logs.glob("*/aggregator/manifest.json")):
            time.sleep(0.05)
        (run_dir,) = [p for p in logs.iterdir() if p.is_dir()]
        for folder in (logs, run_dir, run_dir / "aggregator"):
            folder.chmod(0o755)  # readable by others, as a default umask leaves them on many machines
        pid, port = _aggregator_of(run_dir, deadline)
        attack = subprocess.run([SYSTEM_PYTHON, str(ATTACKER), str(pid), str(port), str(run_dir)],
                                preexec_fn=drop, capture_output=True, text=True, timeout=120)
        assert attack.returncode == 0, attack.stderr
        seen = json.loads(attack.stdout)
    finally:
        go.write_text("")
        _out, err = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, err
    assert "refused 3 connections that could not prove they belong to this job" in err  # it warned
    assert seen["uid"] != 0
    # What the other user could read: the session id (command line, manifest) but not the secret.
    assert seen["session_from_cmdline"] in seen["files"]["aggregator/manifest.json"]
    assert not any("TRACEML_JOB_SECRET" in a for a in seen["cmdline"])
    assert all("TRACEML_JOB_SECRET" not in text for text in seen["files"].values())
    assert seen["environ_with_secret_read"] == {}
    # Every attempt was refused before anything was stored.
    assert len(seen["answers"]) == 3 and all("refused" in a and "secret" in a for a in seen["answers"]), seen
    db = run_dir / "aggregator" / "telemetry.sqlite"
    assert rows(db, "SELECT count(*) FROM step_time_samples") == [(0,)]
    assert rows(db, "SELECT count(*) FROM process_samples WHERE hostname = 'forged'") == [(0,)]
    assert "FORGED" not in (run_dir / "aggregator" / "rank_0.log").read_text()
    # ... and reported.
    warning = json.loads((run_dir / "aggregator" / "finalization_warning.json").read_text())
    assert warning["refused_connections"]["total"] == 3
    assert any("refused before a valid hello" in line for line in warning["summary"])
    assert "forged" not in json.dumps(warning["ranks"])


def _forge_after(sock: socket.socket) -> None:
    """What the squatter of issue 12 sent once its replayed hello was welcomed."""
    try:
        sock.sendall(frames.encode_frame(frames.rank_finished({"global_rank": 0, "hostname": "EVIL-HOST"}, 1, 424242)))
        sock.sendall(frames.encode_frame(make_envelope({"session_id": SESSION, "global_rank": 0},
                                                       {"step_time": step_time_rows(0, 5)})))
    except OSError:
        pass  # closed by the aggregator: the point


def _replay(port: int, hello: bytes) -> Any:
    """Open a new connection to ``port``, send the captured ``hello`` bytes as they are, then the
    forged frames; the aggregator's answer to the hello."""
    thief = RankClient(port, 0)
    thief.read_challenge()  # a fresh challenge for this connection, which the captured proof does not cover
    thief.send_raw(hello)
    answer = thief.receive()
    _forge_after(thief.sock)
    thief.close()
    return answer


def _assert_nothing_forged_landed(agg: AggregatorThread) -> None:
    stats = agg.agg.stats
    assert all(r.dropped_batches != 424242 and r.hostname != "EVIL-HOST" for r in stats.ranks.values())
    assert all(r.rows == 0 for r in stats.ranks.values() if r.global_rank == 0)


def test_a_hello_caught_by_a_squatter_is_refused_by_the_real_aggregator(
        aggregator_process: tuple[subprocess.Popen[str], int, Path]) -> None:
    """Issue 12 (a): a listener on a port the rank was pointed at catches its hello and replays it
    to the real aggregator of the same session, which has never seen it."""
    caught: list[bytes] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def squat() -> None:
        conn, _ = listener.accept()
        conn.sendall(frames.encode_frame(frames.challenge()))  # as a real aggregator would
        conn.settimeout(10)
        data = b""
        while len(data) < 4 or len(data) < 4 + frames.HEADER.unpack_from(data)[0]:
            data += conn.recv(65536)
        caught.append(data)
        conn.close()

    thread = threading.Thread(target=squat, daemon=True)
    thread.start()
    rank = TransportClient(("127.0.0.1", listener.getsockname()[1]), SESSION,
                           {"global_rank": 0, "world_size": 1, "hostname": "node-a"}, secret=SECRET,
                           backoff_initial_s=5, welcome_timeout_s=1)
    rank.start()
    rank.submit({"meta": {"global_rank": 0}, "tables": {"step_time": step_time_rows(0, 1)}})
    thread.join(30)
    rank.close(timeout_s=0.5)
    listener.close()
    assert caught and frames.control_kind(frames.decode_body(caught[0][4:])) == frames.HELLO
    assert rank.sent_batches == 0 and rank.dropped_batches == 1

    proc, port, run_dir = aggregator_process  # the real aggregator of that session, as a process
    answer = _replay(port, caught[0])
    assert answer["control"] == frames.REFUSED and "challenge" in answer["reason"]
    _stop(proc)
    report = (run_dir / "aggregator" / "finalization_warning.json").read_text()
    assert json.loads(report)["refused_connections"]["total"] == 1
    # Nothing forged is anywhere in the run folder (report, logs, SQLite).
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"424242" not in data and b"EVIL-HOST" not in data, path


def test_a_hello_the_aggregator_accepted_is_refused_on_a_new_connection_and_in_a_rerun(tmp_path: Path) -> None:
    """Issue 12 (a) and (b): the same session and secret (a rerun of a multi-node job derives both
    again), a genuine hello captured off the wire and sent again."""
    agg = AggregatorThread(tmp_path / "run")
    try:
        real = RankClient(agg.port, 0)
        hello = frames.encode_frame(real.signed_hello())
        real.send_raw(hello)
        assert real.receive()["control"] == frames.WELCOME
        answer = _replay(agg.port, hello)
        assert answer["control"] == frames.REFUSED and "TRACEML_JOB_SECRET" in answer["reason"]
        real.finish()
        real.close()
        time.sleep(0.2)
    finally:
        agg.stop()
    assert agg.agg.stats.refused_connections == 1
    assert agg.agg.stats.ranks[0].dropped_batches == 0 and agg.agg.stats.ranks[0].hostname == "node-a"
    rerun = AggregatorThread(tmp_path / "rerun")
    try:
        answer = _replay(rerun.port, hello)
        assert answer["control"] == frames.REFUSED
        time.sleep(0.2)
    finally:
        rerun.stop()
    assert rerun.agg.stats.refused_connections == 1
    _assert_nothing_forged_landed(rerun)


@pytest.mark.parametrize("changed", [{"hostname": "EVIL-HOST"}, {"global_rank": 1}, {"world_size": 64},
                                     {"pid": 1}, {"extra": "added"}])
def test_a_hello_with_a_field_changed_after_signing_is_refused(tmp_path: Path, changed: dict[str, Any]) -> None:
    agg = AggregatorThread(tmp_path / "run")
    try:
        client = RankClient(agg.port, 0)
        answer = client.hello(**changed)  # signed first, then changed
        assert answer["control"] == frames.REFUSED and "changed after signing" in answer["reason"]
        _forge_after(client.sock)
        client.close()
        honest = RankClient(agg.port, 0)
        assert honest.hello()["control"] == frames.WELCOME  # the same fields, signed as they are
        honest.close()
        time.sleep(0.2)
    finally:
        agg.stop()
    assert agg.agg.stats.refused_connections == 1
    _assert_nothing_forged_landed(agg)
    assert agg.agg.expected_world_size != 64 and 1 not in agg.agg.stats.ranks


def test_a_hello_of_another_jobs_secret_is_refused(tmp_path: Path) -> None:
    agg = AggregatorThread(tmp_path / "run")
    try:
        client = RankClient(agg.port, 0, secret="another-jobs-secret-0123456789")
        answer = client.hello()
        assert answer["control"] == frames.REFUSED and "TRACEML_JOB_SECRET" in answer["reason"]
        assert client.receive() is None
    finally:
        agg.stop()


# -- the aggregator proves itself (issue 12 point 2) --------------------------------------------------


class Squatter:
    """A listener on the aggregator's port that welcomes every hello, as the squatter of issue 12
    did (after a challenge of its own when ``challenge``, else at once), and records what it receives."""

    def __init__(self, welcome: dict[str, Any], challenge: bool) -> None:
        self.challenge = challenge
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.received: list[Any] = []
        self.welcome = welcome
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self.challenge:
                conn.sendall(frames.encode_frame(frames.challenge()))
            else:
                conn.sendall(frames.encode_frame(self.welcome))
            conn.settimeout(2)
            reader = frames.FrameReader()
            try:
                while chunk := conn.recv(65536):
                    reader.feed(chunk)
                    for body in reader.bodies():
                        self.received.append(body)
                        if self.challenge and frames.control_kind(body) == frames.HELLO:
                            conn.sendall(frames.encode_frame(self.welcome))
            except OSError:
                pass


@pytest.mark.parametrize(("welcome", "challenge"), [
    ({"control": "welcome", "protocol": 1}, False),                                  # protocol 1, no challenge
    ({"control": "welcome", "protocol": frames.PROTOCOL_VERSION}, False),            # a welcome, no challenge
    ({"control": "welcome", "protocol": frames.PROTOCOL_VERSION}, True),             # no proof
    ({"control": "welcome", "protocol": frames.PROTOCOL_VERSION, "proof": "0" * 64}, True),  # a made-up proof
], ids=["old-welcome", "no-challenge", "no-proof", "wrong-proof"])
def test_a_rank_sends_nothing_to_a_listener_that_cannot_prove_it_is_the_aggregator(
        capfd: pytest.CaptureFixture[str], welcome: dict[str, Any], challenge: bool) -> None:
    squatter = Squatter(welcome, challenge)
    client = TransportClient(("127.0.0.1", squatter.port), "job-1234", {"global_rank": 1}, secret=TEST_SECRET,
                             backoff_initial_s=0.01)
    client.start()
    for n in range(5):
        client.submit({"meta": {"global_rank": 1}, "tables": {"step_time": step_time_rows(n, 1)}})
    deadline = time.monotonic() + 30
    while not client.unverified and time.monotonic() < deadline:
        time.sleep(0.02)
    client.close(timeout_s=1)
    assert client.unverified and client.sent_batches == 0
    assert client.dropped_batches == client.submitted_batches == 5
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[TraceML]")]
    assert len(lines) == 1 and "could not be verified" in lines[0] and str(squatter.port) in lines[0]
    # The squatter got at most the hello (signed for the squatter's own challenge: of no use on any
    # other connection) and no payload.
    time.sleep(0.2)
    assert [frames.control_kind(body) for body in squatter.received] == ([frames.HELLO] if challenge else [])
    assert TEST_SECRET not in repr(squatter.received)


def test_the_real_aggregator_verifies(tmp_path: Path) -> None:
    agg = AggregatorThread(tmp_path / "run", session_id="job-1234", secret=TEST_SECRET)
    try:
        client = TransportClient(("127.0.0.1", agg.port), "job-1234", {"global_rank": 0}, secret=TEST_SECRET)
        client.start()
        client.submit({"meta": {"global_rank": 0, "session_id": "job-1234"},
                       "tables": {"step_time": step_time_rows(0, 3)}})
        client.close(timeout_s=5)
        assert not client.unverified and client.sent_batches == 1 and client.finished_delivered
    finally:
        agg.stop()


# -- bounded memory (issue 12 point 3) ----------------------------------------------------------------


@pytest.fixture()
def aggregator_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, Path]]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "traceml_ai.aggregator", "--run-dir", str(run_dir), "--session-id", SESSION,
         "--world-size", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "TRACEML_JOB_SECRET": SECRET},
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline().split()[2])
    try:
        yield proc, port, run_dir
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return err


def test_unauthenticated_peers_cannot_make_the_aggregator_hold_memory(
        aggregator_process: tuple[subprocess.Popen[str], int, Path]) -> None:
    proc, port, run_dir = aggregator_process
    rss_before = psutil.Process(proc.pid).memory_info().rss
    # 16 connections that announce 64 MB frames and start sending them; 25 hellos with a 3 MB
    # session id; one frame of 1 M empty arrays.
    socks = []
    chunk = b"\x90" * (1 << 20)
    for _ in range(16):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall((64 << 20).to_bytes(4, "big"))
        try:
            for _ in range(8):
                sock.sendall(chunk)
        except OSError:
            pass  # closed by the aggregator at once: the point
        socks.append(sock)
    for _ in range(25):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            try:
                sock.sendall(frames.encode_frame(frames.hello("x" * (3 << 20), {}, "not-the-secret-0123456", "0" * 32)))
            except OSError:
                pass
    bomb = b"\xdd" + (1 << 20).to_bytes(4, "big") + b"\x90" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        try:
            sock.sendall(len(bomb).to_bytes(4, "big") + bomb)
        except OSError:
            pass
    time.sleep(0.5)
    rss_after = psutil.Process(proc.pid).memory_info().rss
    for sock in socks:
        sock.close()
    # A rank of the job is still welcomed.
    client = RankClient(port, 0, world_size=1)
    assert client.hello()["control"] == frames.WELCOME
    client.send({"step_time": step_time_rows(0, 5)})
    client.finish()
    client.close()
    _stop(proc)
    assert rss_after - rss_before < 64 << 20, (rss_before, rss_after)  # was 719 MB
    report_path = run_dir / "aggregator" / "finalization_warning.json"
    assert report_path.stat().st_size < 64 * 1024  # was 66 MB
    report = json.loads(report_path.read_text())
    assert report["refused_connections"]["total"] == 16 + 25 + 1
    assert all(len(reason) <= 300 for reason in report["refused_connections"]["reasons"])
    assert rows(run_dir / "aggregator" / "telemetry.sqlite", "SELECT count(*) FROM step_time_samples") == [(5,)]


def test_connections_waiting_for_a_hello_are_bounded_and_cannot_keep_a_rank_out(tmp_path: Path) -> None:
    """Another local user holding every waiting slot open (a reviewer's 300 idle connections kept a
    real rank from delivering anything): a new connection closes the one that waited longest, so at
    most ``max_pending`` are held and a rank's hello still gets through."""
    agg = AggregatorThread(tmp_path / "run", max_pending=4, hello_timeout_s=30)
    try:
        idle = [socket.create_connection(("127.0.0.1", agg.port)) for _ in range(4)]
        time.sleep(0.3)
        client = RankClient(agg.port, 0)
        assert client.hello()["control"] == frames.WELCOME  # was: refused while the slots were held
        client.close()
        oldest = idle[0]
        oldest.settimeout(10)
        received = b""
        while chunk := oldest.recv(65536):  # its challenge, then the close that made room
            received += chunk
        assert received  # it had its challenge before it was closed
        for sock in idle:
            sock.close()
    finally:
        agg.stop()
    assert agg.agg.stats.refused_connections >= 1
    assert any("waiting for their hello" in r for r in agg.agg.stats.refusal_reasons)


def test_a_deeply_nested_frame_of_a_rank_is_rejected_and_counted(tmp_path: Path) -> None:
    agg = AggregatorThread(tmp_path / "run")
    try:
        client = RankClient(agg.port, 0)
        assert client.hello()["control"] == frames.WELCOME
        client.send_raw(frames.HEADER.pack(100_001) + b"\x91" * 100_000 + b"\x90")
        # A step_time envelope the typed fast path takes, with one field nested 5,000 levels deep.
        row = {**step_time_rows(0, 1)[0], "extra": 0}
        body = msgspec.msgpack.encode(make_envelope(client.meta, {"step_time": [row]}))
        cut = body.rindex(msgspec.msgpack.encode("extra")) + len(msgspec.msgpack.encode("extra"))
        body = body[:cut] + b"\x91" * 5000 + b"\x90" + body[cut + 1:]
        client.send_raw(frames.HEADER.pack(len(body)) + body)
        client.send({"step_time": step_time_rows(1, 3)})
        client.finish()
        client.close()
    finally:
        agg.stop()
    assert agg.agg.stats.ranks[0].rejected_batches == 2
    assert sum("nests too deep" in r for r in agg.agg.stats.rejection_reasons) == 2
    assert agg.agg.stats.ranks[0].rows == 3 and agg.agg.store_stats.errors == 0


def test_the_inbound_queue_holds_at_most_its_byte_budget_and_loses_nothing(tmp_path: Path) -> None:
    budget = 2 << 20

    def slow_sink(payload: Any) -> None:  # the writer thread falls behind, as under a flood
        time.sleep(0.02)

    agg = AggregatorThread(tmp_path / "run", inbound_max_bytes=budget, payload_sinks=[slow_sink])
    peak = 0
    sending = True

    def watch() -> None:
        nonlocal peak
        while sending:
            peak = max(peak, agg.agg.queued_bytes)
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        client = RankClient(agg.port, 0)
        assert client.hello()["control"] == frames.WELCOME
        big_line = "x" * 200_000
        for n in range(60):
            client.send({"step_time": step_time_rows(n, 1),
                         "stdout_stderr": [{"seq": n, "timestamp_unix_ns": time.time_ns(), "stream": "stdout",
                                            "line": big_line}]})
        client.finish()
        client.close()
        agg.stop(grace_s=60)
    finally:
        sending = False
        watcher.join()
    assert budget // 2 < peak <= budget  # the budget was reached and held
    assert agg.agg.stats.ranks[0].batches == 60 and agg.agg.stats.rejected_frames == 0
